/* wait.c — the waiting policy every transport shares: a monotonic clock and the back-off
 * between tests of a pending operation. */
#include "comm.h"

#include <sched.h>
#include <time.h>

double attn__now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void attn__backoff_wait(attn__backoff *b) {
  if (b->spins < 64) {
    b->spins++;
    sched_yield();
    return;
  }
  struct timespec ts = {0, b->sleep_ns};
  nanosleep(&ts, NULL);
  if (b->sleep_ns < 1000000) b->sleep_ns *= 2;
}
