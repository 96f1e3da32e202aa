/* mpienv.c — MPI for the attnrun launcher. Its own collectives are non-blocking requests
 * polled against a deadline: a peer that died or stalled outside the library ends the job
 * with a message naming the phase, instead of leaving ranks waiting forever. */
#include "mpienv.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double mpienv_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void mpienv_init(mpienv *e, int *argc, char ***argv) {
  memset(e, 0, sizeof *e);
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &e->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &e->size);
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, e->rank, MPI_INFO_NULL, &e->node);
  MPI_Comm_rank(e->node, &e->local_rank);
  MPI_Comm_size(e->node, &e->local_size);
  if (gethostname(e->host, sizeof e->host - 1) != 0) snprintf(e->host, sizeof e->host, "?");
  e->timeout_s = MPIENV_DEFAULT_TIMEOUT;
}

void mpienv_set_timeout(mpienv *e, double flag_s) {
  const char *env = getenv("ATTN_TIMEOUT");
  double v = flag_s > 0 ? flag_s : env ? atof(env) : 0.0;
  e->timeout_s = v > 0 ? v : MPIENV_DEFAULT_TIMEOUT;
}

_Noreturn void mpienv_abort(const mpienv *e, int code, const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (e->size > 1)
    fprintf(stderr, "attnrun: rank %d (%s): %s\n", e->rank, e->host, msg);
  else
    fprintf(stderr, "attnrun: %s\n", msg);
  fflush(NULL);
  if (e->size > 1) MPI_Abort(MPI_COMM_WORLD, code);
  MPI_Finalize();
  exit(code);
}

/* Polls req until it completes; past the deadline, ends the job. */
static void wait_deadline(const mpienv *e, MPI_Request *req, double slack_s, const char *what) {
  double deadline = mpienv_now() + e->timeout_s + slack_s;
  struct timespec nap = {0, 200000};
  for (int spins = 0;; spins++) {
    int done = 0;
    MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (mpienv_now() > deadline)
      mpienv_abort(e, 1, "timed out after %.0f s waiting for the other ranks (%s); ending the job",
                   e->timeout_s + slack_s, what);
    if (spins > 100) nanosleep(&nap, NULL); /* ranks may share cores: do not spin */
  }
}

void mpienv_barrier(const mpienv *e, double slack_s, const char *what) {
  if (e->size == 1) return;
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  wait_deadline(e, &req, slack_s, what);
}

void mpienv_node_barrier(const mpienv *e, const char *what) {
  if (e->local_size == 1) return;
  MPI_Request req;
  MPI_Ibarrier(e->node, &req);
  wait_deadline(e, &req, 0, what);
}

void mpienv_node_allgather_int(const mpienv *e, int32_t v, int32_t *out, const char *what) {
  if (e->local_size == 1) {
    out[0] = v;
    return;
  }
  MPI_Request req;
  MPI_Iallgather(&v, 1, MPI_INT32_T, out, 1, MPI_INT32_T, e->node, &req);
  wait_deadline(e, &req, 0, what);
}

static void allreduce(const mpienv *e, void *buf, int n, MPI_Datatype t, MPI_Op op,
                      double slack_s, const char *what) {
  if (e->size == 1) return;
  MPI_Request req;
  MPI_Iallreduce(MPI_IN_PLACE, buf, n, t, op, MPI_COMM_WORLD, &req);
  wait_deadline(e, &req, slack_s, what);
}

int mpienv_max_int(const mpienv *e, int v, double slack_s, const char *what) {
  allreduce(e, &v, 1, MPI_INT, MPI_MAX, slack_s, what);
  return v;
}

int64_t mpienv_sum_i64(const mpienv *e, int64_t v, double slack_s, const char *what) {
  allreduce(e, &v, 1, MPI_INT64_T, MPI_SUM, slack_s, what);
  return v;
}

double mpienv_max_double(const mpienv *e, double v, double slack_s, const char *what) {
  allreduce(e, &v, 1, MPI_DOUBLE, MPI_MAX, slack_s, what);
  return v;
}

void mpienv_max_doubles(const mpienv *e, double *v, int n, double slack_s, const char *what) {
  allreduce(e, v, n, MPI_DOUBLE, MPI_MAX, slack_s, what);
}

void mpienv_gather(const mpienv *e, const void *send, void *recv, int bytes, double slack_s,
                   const char *what) {
  if (e->size == 1) {
    memcpy(recv, send, (size_t)bytes);
    return;
  }
  MPI_Request req;
  MPI_Igather(send, bytes, MPI_BYTE, recv, bytes, MPI_BYTE, 0, MPI_COMM_WORLD, &req);
  wait_deadline(e, &req, slack_s, what);
}

int mpienv_finish(mpienv *e, int code) {
  fflush(NULL);
  MPI_Comm_free(&e->node);
  MPI_Finalize();
  return code;
}
