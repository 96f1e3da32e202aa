/* mpienv.h — the MPI side of the attnrun launcher: init (under mpirun or as a singleton),
 * who this rank is and on which host, collectives that give up after a deadline instead of
 * hanging, and ending the job (every rank the same exit code, or MPI_Abort). */
#ifndef ATTNRUN_LAUNCH_MPIENV_H
#define ATTNRUN_LAUNCH_MPIENV_H

#include <mpi.h>
#include <stdint.h>

#define MPIENV_DEFAULT_TIMEOUT 300.0

typedef struct {
  int rank, size;             /* in MPI_COMM_WORLD */
  int local_rank, local_size; /* among the ranks on this host */
  char host[64];
  double timeout_s; /* launcher waits give up after this (plus the caller's slack) */
  MPI_Comm node;    /* the ranks on this host (MPI_COMM_TYPE_SHARED) */
} mpienv;

/* MPI_Init_thread (FUNNELED: only the main thread calls MPI) and the fields above. */
void mpienv_init(mpienv *e, int *argc, char ***argv);

/* --timeout, else env ATTN_TIMEOUT, else MPIENV_DEFAULT_TIMEOUT. */
void mpienv_set_timeout(mpienv *e, double flag_s);

/* Collectives over MPI_COMM_WORLD that end the job (mpienv_abort) when a peer has not
 * joined after timeout_s + slack_s; `what` names the phase in the message. */
void mpienv_barrier(const mpienv *e, double slack_s, const char *what);
/* The same over the ranks of this host. */
void mpienv_node_barrier(const mpienv *e, const char *what);
/* out[local_size] gets v of every rank of this host, in local rank order. */
void mpienv_node_allgather_int(const mpienv *e, int32_t v, int32_t *out, const char *what);
int mpienv_max_int(const mpienv *e, int v, double slack_s, const char *what);
int64_t mpienv_sum_i64(const mpienv *e, int64_t v, double slack_s, const char *what);
double mpienv_max_double(const mpienv *e, double v, double slack_s, const char *what);
/* Element-wise max of n doubles, in place, on every rank. */
void mpienv_max_doubles(const mpienv *e, double *v, int n, double slack_s, const char *what);
/* recv (rank 0 only; size * bytes) gets every rank's send (bytes). */
void mpienv_gather(const mpienv *e, const void *send, void *recv, int bytes, double slack_s,
                   const char *what);

/* Prints "attnrun: rank R (host): message" on stderr and ends the whole job with code
 * (MPI_Abort; a plain exit on a single rank). Never returns. */
_Noreturn void mpienv_abort(const mpienv *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* MPI_Finalize and the exit code (the same on every rank). */
int mpienv_finish(mpienv *e, int code);

double mpienv_now(void);

#endif
