/* test_comm_fault.c — the watchdog and fault injection.
 *   timeout-allreduce | -exchange | -create: the last rank does not join for a while; the
 *     others must return ATTN_ERR_TIMEOUT within the timeout (2 s) plus a little, naming
 *     it. The late rank then joins, so the job ends cleanly and the test passes.
 *   fault <tag>: allreduces in a loop, as the CLI would run them; ATTN_FAULT (set by the
 *     test) makes a rank exit, die or stall, and a rank that gets an error prints it and
 *     calls MPI_Abort — so the job must end non-zero (tests/mpi/expect_fail.cmake checks). */
#include "../../comm/comm.h"
#include "rank_check.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int wrank, wsize, nfail;

enum { TIMEOUT_S = 2 };
/* Grace for the ranks that time out: the diagnosis round (0.5 s at a 2 s timeout) and
 * scheduling on an oversubscribed machine. */
static const double SLACK_S = 2.5;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static attn_status one_allreduce(attn__comm *c) {
  int64_t v[4] = {wrank, 1, 2, 3};
  return c->ops->allreduce_sum(c, v, 4, ATTN_COMM_I64);
}

static attn_status one_exchange(attn__comm *c) {
  char s[1024], r[1024];
  memset(s, wrank, sizeof s);
  attn__comm_req *req = NULL;
  attn_status st = c->ops->exchange_start(c, s, sizeof s, (wrank + 1) % wsize, r, sizeof r,
                                          (wrank + wsize - 1) % wsize, &req);
  return st == ATTN_OK ? c->ops->exchange_wait(c, req) : st;
}

/* Checks what a rank that waited on the late one got. must: it has to time out (a rank
 * whose own peers all answered may finish). */
static void check_timeout(attn_status st, double elapsed, int must) {
  char want[64];
  snprintf(want, sizeof want, "world rank %d", wsize - 1);
  if (st == ATTN_OK && !must) return;
  CHECK(st == ATTN_ERR_TIMEOUT && strstr(attn_last_error(), want),
        "got %s: '%s' (want a timeout naming %s)", attn_status_string(st), attn_last_error(), want);
  CHECK(elapsed >= TIMEOUT_S - 0.05 && elapsed <= TIMEOUT_S + SLACK_S,
        "timed out after %.2f s; want %d..%.1f s", elapsed, TIMEOUT_S, TIMEOUT_S + SLACK_S);
  if (st == ATTN_ERR_TIMEOUT) printf("[rank %d] %.2f s: %s\n", wrank, elapsed, attn_last_error());
}

/* The late rank does not come to create the communicator: the others time out. */
static void run_timeout_create(void) {
  attn__comm *c = NULL;
  if (wrank == wsize - 1) {
    usleep((TIMEOUT_S + 1.5) * 1e6);
    CHECK(attn__comm_mpi_create(&(MPI_Comm){MPI_COMM_WORLD}, TIMEOUT_S, &c) == ATTN_OK,
          "the late rank's create: %s", attn_last_error());
  } else {
    double t0 = now_s();
    attn_status st = attn__comm_mpi_create(&(MPI_Comm){MPI_COMM_WORLD}, TIMEOUT_S, &c);
    double dt = now_s() - t0;
    CHECK(st == ATTN_ERR_TIMEOUT && c == NULL && strstr(attn_last_error(), "attn_group_create"),
          "got %s: %s", attn_status_string(st), attn_last_error());
    CHECK(dt >= TIMEOUT_S - 0.05 && dt <= TIMEOUT_S + SLACK_S, "timed out after %.2f s", dt);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (c) c->ops->destroy(c);
}

static int run_timeout(const char *what) {
  if (!strcmp(what, "timeout-create")) {
    run_timeout_create();
    return 0;
  }
  int exchange = !strcmp(what, "timeout-exchange");
  attn__comm *c = NULL;
  if (attn__comm_mpi_create(&(MPI_Comm){MPI_COMM_WORLD}, TIMEOUT_S, &c) != ATTN_OK) {
    fprintf(stderr, "[rank %d] create: %s\n", wrank, attn_last_error());
    return 1;
  }
  if (wrank == wsize - 1) {
    usleep((TIMEOUT_S + 1.5) * 1e6); /* late: everybody else has given up by now */
    attn_status st = exchange ? ATTN_OK : one_allreduce(c); /* lets their collective finish */
    CHECK(st == ATTN_OK, "the late rank's own call: %s", attn_last_error());
  } else {
    double t0 = now_s();
    attn_status st = exchange ? one_exchange(c) : one_allreduce(c);
    check_timeout(st, now_s() - t0, !exchange || wrank == 0);
    if (st == ATTN_ERR_TIMEOUT) {
      CHECK(c->dead, "a timed-out communicator must be dead");
      double t1 = now_s();
      st = one_allreduce(c);
      CHECK(st == ATTN_ERR_TIMEOUT && now_s() - t1 < 0.5,
            "a dead communicator must fail at once with the first reason: %s", attn_last_error());
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  c->ops->destroy(c);
  return 0;
}

/* The loop a CLI runs: stop the whole job on the first error. */
static int run_fault(void) {
  attn__comm *c = NULL;
  attn_status st = attn__comm_mpi_create(&(MPI_Comm){MPI_COMM_WORLD}, 0, &c);
  for (int step = 0; st == ATTN_OK && step < 8; step++) st = one_allreduce(c);
  if (st != ATTN_OK) {
    fprintf(stderr, "[rank %d] %s: %s\n", wrank, attn_status_string(st), attn_last_error());
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  c->ops->destroy(c);
  if (wrank == 0) printf("all allreduce steps completed (no fault fired)\n");
  return 0;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
  MPI_Comm_size(MPI_COMM_WORLD, &wsize);
  const char *mode = argc > 1 ? argv[1] : "";
  int skip = 0;
  if (!strcmp(mode, "fault")) {
    run_fault();
  } else if (!strncmp(mode, "timeout-", 8) && wsize >= 2) {
    run_timeout(mode);
  } else if (!strncmp(mode, "timeout-", 8)) {
    skip = 1; /* needs a peer */
  } else {
    if (wrank == 0) fprintf(stderr, "usage: test_comm_fault timeout-allreduce|timeout-exchange|timeout-create|fault [tag]\n");
    nfail = 1;
  }
  int total = 0;
  MPI_Allreduce(&nfail, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (wrank == 0) printf("test_comm_fault %s on %d ranks: %s\n", mode, wsize, total ? "FAILED" : skip ? "SKIPPED" : "OK");
  MPI_Finalize();
  return total ? 1 : skip ? 77 : 0;
}
