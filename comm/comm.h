/* comm.h — the transport interface runtime/ talks through: one table of operations, two
 * transports (comm/mpi.c: host buffers over MPI; comm/nccl.c later: device buffers).
 * comm/ knows transports, not attention. Every blocking wait honours c->timeout_s; on
 * expiry the communicator is marked dead and the call returns ATTN_ERR_TIMEOUT with a
 * message naming the peer(s) that did not answer. Nothing here exits or aborts. */
#ifndef ATTN_COMM_H
#define ATTN_COMM_H

#include "../runtime/internal.h"

typedef struct attn__comm attn__comm;
typedef struct attn__comm_req attn__comm_req; /* an exchange in flight */

typedef enum { ATTN_COMM_F32 = 0, ATTN_COMM_F64 = 1, ATTN_COMM_I64 = 2 } attn__comm_type;

typedef struct {
  const char *name; /* "mpi", "nccl" */
  /* Sub-communicator of the ranks with the same color, ordered by key (MPI_Comm_split). */
  attn_status (*split)(attn__comm *c, int color, int key, attn__comm **out);
  attn_status (*destroy)(attn__comm *c);
  /* In-place sum over the communicator; every rank gets bitwise the same result. */
  attn_status (*allreduce_sum)(attn__comm *c, void *buf, int64_t count, attn__comm_type type);
  /* recv [size][bytes] gets every rank's send [bytes]. */
  attn_status (*allgather)(attn__comm *c, const void *send, void *recv, int64_t bytes);
  /* send/recv [size][bytes]: block r of send goes to rank r. */
  attn_status (*alltoall)(attn__comm *c, const void *send, void *recv, int64_t bytes);
  /* The ring step: post the send of sbuf to rank `to` and the receive into rbuf from rank
   * `from` (either may be skipped with a negative rank); returns at once. rbytes may exceed
   * the incoming size only for messages up to ATTN_COMM_CHUNK (1 GiB): larger ones travel
   * in pieces, so both sides must pass the same size. Several exchanges may be in flight;
   * both sides start them in the same order. After a timeout a receive that MPI could not
   * cancel may still land in rbuf: end the job (collectives use internal copies). */
  attn_status (*exchange_start)(attn__comm *c, const void *sbuf, int64_t sbytes, int to,
                                void *rbuf, int64_t rbytes, int from, attn__comm_req **req);
  /* Completes and frees req (also on failure). */
  attn_status (*exchange_wait)(attn__comm *c, attn__comm_req *req);
  /* Cancels what is pending and marks c dead; later calls return at once. */
  attn_status (*abort)(attn__comm *c, const char *why);
} attn__comm_ops;

struct attn__comm {
  const attn__comm_ops *ops;
  int rank, size;
  double timeout_s;
  int dead;           /* set by abort or a timeout */
  int world_rank_of0; /* world rank of this communicator's rank 0 (for messages) */
  int *world_ranks;   /* [size]: world rank of each member (for messages naming peers) */
  void *impl;
};

/* Wraps a duplicate of *(MPI_Comm *)mpi_comm. timeout_s <= 0 → ATTN_TIMEOUT or 300. */
attn_status attn__comm_mpi_create(const void *mpi_comm, double timeout_s, attn__comm **out);

/* NCCL on device buffers (comm/nccl.c, built with CUDA and NCCL): rank 0's unique id goes
 * out over mpi_parent (timed allgather); a non-blocking communicator on `device`; work
 * runs on our own comm stream, ordered after `stream` (a cudaStream_t) by events.
 * mpi_parent is borrowed and must outlive the result; split also splits it.
 * timeout_s <= 0 → mpi_parent->timeout_s. Not yet run on a GPU. */
attn_status attn__comm_nccl_create(attn__comm *mpi_parent, int device, void *stream,
                                   double timeout_s, attn__comm **out);
/* Device buffers over MPI through pinned host copies (comm/staged.c, built with CUDA:
 * several ranks on one GPU, or no NCCL); collectives synchronise `stream`, the ring
 * exchange is ordered with it by events (a copy stream of its own). mpi is borrowed. */
attn_status attn__comm_staged_create(attn__comm *mpi, void *stream, attn__comm **out);

/* Pre-flight: every rank contributes what it believes (fields named); if any rank
 * disagrees, all return ATTN_ERR_MISMATCH with one message naming the first differing
 * field, the values and the ranks. */
#define ATTN_FP_FIELDS 32
typedef struct {
  int32_t count;
  const char *names[ATTN_FP_FIELDS];
  int64_t values[ATTN_FP_FIELDS];
} attn__fingerprint;
void attn__fp_add(attn__fingerprint *fp, const char *name, int64_t value);
attn_status attn__comm_agree(attn__comm *c, const attn__fingerprint *fp);

/* Writes "rank 3" or "ranks 0..2, 5" for n world ranks (any order; -1 prints as "?"). */
void attn__rank_list(char *buf, size_t cap, const int *ranks, int n);

/* The waiting policy of every transport (comm/wait.c): test, then back off — up to 64
 * yields for quick completions, then sleeps growing from 1 us to 1 ms, so a waiting rank
 * does not take a core from a computing one. */
typedef struct {
  int spins;
  long sleep_ns;
} attn__backoff;
#define ATTN__BACKOFF_INIT {0, 1000}
double attn__now_s(void); /* monotonic clock, seconds */
void attn__backoff_wait(attn__backoff *b);

/* Test hooks: ATTN_FAULT="rank:where:step:action" makes that world rank exit, SIGKILL
 * itself or stall (sleep) when it reaches `where` (allreduce | ring) at step `step`. */
void attn__fault_point(const char *where, int step);

#endif
