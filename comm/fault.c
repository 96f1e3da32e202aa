/* fault.c — the fault-injection test hook: ATTN_FAULT="rank:where:step:action" makes
 * world rank `rank` exit(1), SIGKILL itself or stall when it reaches `where` (allreduce |
 * ring) at step `step`. The only place in the library that may end the process, and only
 * when a test asks for it. */
#include "comm.h"

#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef enum { FAULT_NONE = 0, FAULT_EXIT, FAULT_KILL, FAULT_STALL } fault_action;

static struct {
  fault_action action;
  int rank, step;
  char where[32];
} fault;

static pthread_once_t fault_once = PTHREAD_ONCE_INIT;

static void fault_parse(void) {
  const char *s = getenv("ATTN_FAULT");
  if (!s || !*s) return;
  char where[32], action[16], tail;
  int rank, step;
  int n = sscanf(s, "%d:%31[^:]:%d:%15[a-z]%c", &rank, where, &step, action, &tail);
  fault_action a = n != 4                   ? FAULT_NONE
                   : !strcmp(action, "exit")  ? FAULT_EXIT
                   : !strcmp(action, "kill")  ? FAULT_KILL
                   : !strcmp(action, "stall") ? FAULT_STALL
                                              : FAULT_NONE;
  if (a == FAULT_NONE) {
    attn__log(ATTN_LOG_WARN,
              "ATTN_FAULT=%s is not rank:where:step:action (where allreduce|ring, action "
              "exit|kill|stall); ignored", s);
    return;
  }
  fault.rank = rank;
  fault.step = step;
  snprintf(fault.where, sizeof fault.where, "%s", where);
  fault.action = a;
}

static int world_rank(void) {
  int init = 0, fin = 0, r = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin && MPI_Comm_rank(MPI_COMM_WORLD, &r) == MPI_SUCCESS) return r;
  const char *e = getenv("OMPI_COMM_WORLD_RANK");
  if (!e) e = getenv("PMI_RANK");
  return e ? atoi(e) : 0;
}

void attn__fault_point(const char *where, int step) {
  pthread_once(&fault_once, fault_parse);
  if (fault.action == FAULT_NONE || step != fault.step || strcmp(where, fault.where)) return;
  int rank = world_rank();
  if (rank != fault.rank) return;
  static const char *verb[] = {"", "exits", "kills itself (SIGKILL)", "stalls"};
  fprintf(stderr, "attnrun: fault injection (ATTN_FAULT): world rank %d %s at %s step %d\n",
          rank, verb[fault.action], where, step);
  fflush(stderr);
  if (fault.action == FAULT_EXIT) exit(1);
  if (fault.action == FAULT_KILL) raise(SIGKILL);
  /* Stall: long enough for every peer's watchdog to fire and the launcher to end us. */
  for (unsigned left = (unsigned)ATTN_PARAM("FAULT_STALL_S", 3600); left;) left = sleep(left);
}
