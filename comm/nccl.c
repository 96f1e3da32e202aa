/* nccl.c — the NCCL transport of comm.h for device buffers: a non-blocking communicator,
 * our own comm stream ordered after the caller's by events, and a timed watchdog. (Ranks
 * that share one GPU use the MPI-staged transport, comm/staged.c.) */
#include "comm.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One exchange in flight on the comm stream; done is recorded after its group. Requests
 * and their events are the transport's: made when none is spare, kept on the spare list
 * once exchange_wait has waited for done (host and compute stream), recorded again by a
 * later exchange, destroyed with the communicator. */
struct attn__comm_req {
  attn__comm_req *next;
  int to, from;
  int64_t sbytes, rbytes;
  cudaEvent_t done;
};

typedef struct {
  attn__comm *mpi;      /* the MPI communicator with the same members (ids, splits) */
  int own_mpi;          /* 1 for children of split: destroyed with this one */
  ncclComm_t comm;      /* NULL once aborted */
  int device;
  cudaStream_t compute; /* the caller's stream */
  cudaStream_t cs;      /* our comm stream */
  cudaEvent_t ready;    /* recorded on compute before each operation */
  cudaEvent_t coll;     /* recorded on cs after each collective, waited for in it */
  attn__comm_req *pending;
  attn__comm_req *spare; /* waited-for requests, their events free to record again */
  int64_t nallreduce;   /* allreduce calls so far: the fault-injection step */
  attn_status dead_status;
  char why[512];
} nccl_impl;

static const attn__comm_ops nccl_ops;

/* ---- small helpers ------------------------------------------------------------------ */
static nccl_impl *impl_of(attn__comm *c) { return (nccl_impl *)c->impl; }
static int my_world_rank(const attn__comm *c) { return c->world_ranks[c->rank]; }
static int world_of(const attn__comm *c, int r) {
  return r >= 0 && r < c->size ? c->world_ranks[r] : -1;
}

static void kill_comm(nccl_impl *m) {
  if (m->comm) ncclCommAbort(m->comm);
  m->comm = NULL;
}

static void mark_dead(attn__comm *c, attn_status status, const char *why) {
  nccl_impl *m = impl_of(c);
  kill_comm(m);
  if (c->dead) return; /* keep the first reason */
  c->dead = 1;
  m->dead_status = status;
  snprintf(m->why, sizeof m->why, "%s", why);
}

static attn_status dead_fail(attn__comm *c, const char *what) {
  nccl_impl *m = impl_of(c);
  return attn__fail(m->dead_status,
                    "%s on world rank %d: the NCCL communicator is no longer usable (%s); "
                    "destroy the group and end the job or create a new one",
                    what, my_world_rank(c), m->why);
}

static attn_status nccl_fail(attn__comm *c, ncclResult_t r, const char *what) {
  nccl_impl *m = c ? impl_of(c) : NULL;
  const char *last = m && m->comm ? ncclGetLastError(m->comm) : ncclGetLastError(NULL);
  attn_status st = attn__fail(ATTN_ERR_NCCL, "%s failed on world rank %d: %s%s%s", what,
                              c ? my_world_rank(c) : -1, ncclGetErrorString(r),
                              last && *last ? ": " : "", last ? last : "");
  if (c) mark_dead(c, ATTN_ERR_NCCL, attn_last_error());
  return st;
}

static attn_status cuda_fail(attn__comm *c, cudaError_t e, const char *what) {
  attn_status st = attn__fail(ATTN_ERR_CUDA, "%s failed on world rank %d: %s", what,
                              c ? my_world_rank(c) : -1, cudaGetErrorString(e));
  if (c) mark_dead(c, ATTN_ERR_CUDA, attn_last_error());
  return st;
}

static attn_status type_info(attn__comm_type type, ncclDataType_t *dt, size_t *bytes) {
  switch (type) {
    case ATTN_COMM_F32: *dt = ncclFloat32; *bytes = 4; return ATTN_OK;
    case ATTN_COMM_F64: *dt = ncclFloat64; *bytes = 8; return ATTN_OK;
    case ATTN_COMM_I64: *dt = ncclInt64; *bytes = 8; return ATTN_OK;
  }
  return attn__fail(ATTN_ERR_INVALID_ARG, "comm type=%d is not f32 (0), f64 (1) or i64 (2)",
                    (int)type);
}

/* ---- the watchdog --------------------------------------------------------------------- */
/* Polls comm's async state until it leaves ncclInProgress (non-blocking init, split,
 * enqueue, group end). 0 done, 1 timeout, 2 NCCL error (*res). */
static int settle(ncclComm_t comm, double deadline, ncclResult_t *res) {
  attn__backoff b = ATTN__BACKOFF_INIT;
  for (;;) {
    ncclResult_t r = ncclSuccess, e = ncclCommGetAsyncError(comm, &r);
    if (e != ncclSuccess) r = e;
    if (r == ncclSuccess) return 0;
    if (r != ncclInProgress) return *res = r, 2;
    if (attn__now_s() >= deadline) return 1;
    attn__backoff_wait(&b);
  }
}

/* A call's result on the non-blocking communicator: in progress → wait for it. */
static attn_status call_done(attn__comm *c, ncclResult_t r, const char *what) {
  if (r == ncclSuccess) return ATTN_OK;
  if (r != ncclInProgress) return nccl_fail(c, r, what);
  int w = settle(impl_of(c)->comm, attn__now_s() + c->timeout_s, &r);
  if (w == 2) return nccl_fail(c, r, what);
  if (w == 0) return ATTN_OK;
  attn_status st = attn__fail(ATTN_ERR_TIMEOUT,
                              "%s did not get enqueued within %g s on world rank %d (a peer "
                              "of this %d-rank NCCL communicator is missing or stuck)",
                              what, c->timeout_s, my_world_rank(c), c->size);
  mark_dead(c, ATTN_ERR_TIMEOUT, attn_last_error());
  return st;
}

/* Host waits for ev (recorded on the comm stream) with the timeout; peers names who. */
static attn_status event_wait(attn__comm *c, cudaEvent_t ev, const char *what, const char *peers) {
  nccl_impl *m = impl_of(c);
  double deadline = attn__now_s() + c->timeout_s;
  attn__backoff b = ATTN__BACKOFF_INIT;
  for (;;) {
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) return ATTN_OK;
    if (e != cudaErrorNotReady) return cuda_fail(c, e, what);
    ncclResult_t r = ncclSuccess;
    if (ncclCommGetAsyncError(m->comm, &r) == ncclSuccess && r != ncclSuccess &&
        r != ncclInProgress)
      return nccl_fail(c, r, what);
    if (attn__now_s() >= deadline) break;
    attn__backoff_wait(&b);
  }
  attn_status st = attn__fail(ATTN_ERR_TIMEOUT,
                              "%s timed out after %g s on world rank %d: %s; the NCCL "
                              "communicator was aborted; raise ATTN_TIMEOUT if the peer is "
                              "only slow",
                              what, c->timeout_s, my_world_rank(c), peers);
  mark_dead(c, ATTN_ERR_TIMEOUT, attn_last_error());
  return st;
}

/* The comm stream waits for everything queued so far on the compute stream. */
static attn_status stream_enter(attn__comm *c, const char *what) {
  nccl_impl *m = impl_of(c);
  cudaError_t e = cudaSetDevice(m->device);
  if (e == cudaSuccess) e = cudaEventRecord(m->ready, m->compute);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(m->cs, m->ready, 0);
  return e == cudaSuccess ? ATTN_OK : cuda_fail(c, e, what);
}

/* Records m->coll on the comm stream, waits for it with the watchdog, and orders the
 * compute stream after it. The next collective records it again only after this wait
 * (a failed one leaves the communicator dead: no next one). */
static attn_status coll_finish(attn__comm *c, const char *what) {
  nccl_impl *m = impl_of(c);
  cudaError_t e = cudaEventRecord(m->coll, m->cs);
  attn_status st = e == cudaSuccess ? ATTN_OK : cuda_fail(c, e, what);
  char who[64];
  snprintf(who, sizeof who, "some of the %d ranks did not join", c->size);
  if (st == ATTN_OK) st = event_wait(c, m->coll, what, who);
  if (st == ATTN_OK && (e = cudaStreamWaitEvent(m->compute, m->coll, 0)) != cudaSuccess)
    st = cuda_fail(c, e, what);
  return st;
}

/* ---- collectives ------------------------------------------------------------------------ */
static attn_status nccl_allreduce_sum(attn__comm *c, void *buf, int64_t count,
                                      attn__comm_type type) {
  attn__fault_point("allreduce", (int)impl_of(c)->nallreduce++);
  if (c->dead) return dead_fail(c, "allreduce");
  ncclDataType_t dt = ncclFloat32;
  size_t es = 4;
  ATTN_CHECK(type_info(type, &dt, &es));
  if (count < 0 || (count > 0 && !buf))
    return attn__fail(ATTN_ERR_INVALID_ARG, "allreduce: count=%lld buf=%p is not valid",
                      (long long)count, buf);
  if (count == 0) return ATTN_OK;
  ATTN_CHECK(stream_enter(c, "allreduce"));
  nccl_impl *m = impl_of(c);
  ATTN_CHECK(call_done(c, ncclAllReduce(buf, buf, (size_t)count, dt, ncclSum, m->comm, m->cs),
                       "ncclAllReduce"));
  return coll_finish(c, "allreduce");
}

static attn_status bytes_check(attn__comm *c, const char *what, const void *send, void *recv,
                               int64_t bytes) {
  if (c->dead) return dead_fail(c, what);
  if (bytes < 0 || (bytes > 0 && (!send || !recv)))
    return attn__fail(ATTN_ERR_INVALID_ARG, "%s: send=%p recv=%p bytes=%lld is not valid", what,
                      send, recv, (long long)bytes);
  return ATTN_OK;
}

static attn_status nccl_allgather(attn__comm *c, const void *send, void *recv, int64_t bytes) {
  ATTN_CHECK(bytes_check(c, "allgather", send, recv, bytes));
  if (bytes == 0) return ATTN_OK;
  ATTN_CHECK(stream_enter(c, "allgather"));
  nccl_impl *m = impl_of(c);
  ATTN_CHECK(call_done(c, ncclAllGather(send, recv, (size_t)bytes, ncclUint8, m->comm, m->cs),
                       "ncclAllGather"));
  return coll_finish(c, "allgather");
}

static attn_status nccl_alltoall(attn__comm *c, const void *send, void *recv, int64_t bytes) {
  ATTN_CHECK(bytes_check(c, "alltoall", send, recv, bytes));
  if (bytes == 0) return ATTN_OK;
  ATTN_CHECK(stream_enter(c, "alltoall"));
  nccl_impl *m = impl_of(c);
  ncclResult_t r = ncclGroupStart();
  for (int p = 0; p < c->size && (r == ncclSuccess || r == ncclInProgress); p++) {
    r = ncclSend((const char *)send + (size_t)p * (size_t)bytes, (size_t)bytes, ncclUint8, p,
                 m->comm, m->cs);
    if (r == ncclSuccess || r == ncclInProgress)
      r = ncclRecv((char *)recv + (size_t)p * (size_t)bytes, (size_t)bytes, ncclUint8, p,
                   m->comm, m->cs);
  }
  ncclResult_t g = ncclGroupEnd();
  if (r != ncclSuccess && r != ncclInProgress) return nccl_fail(c, r, "alltoall: ncclSend/ncclRecv");
  ATTN_CHECK(call_done(c, g, "alltoall: ncclGroupEnd"));
  return coll_finish(c, "alltoall");
}

/* ---- the ring exchange ---------------------------------------------------------------- */
static void pending_unlink(nccl_impl *m, attn__comm_req *q) {
  for (attn__comm_req **p = &m->pending; *p; p = &(*p)->next)
    if (*p == q) {
      *p = q->next;
      return;
    }
}

/* A spare request, or a new one with its event. */
static attn_status req_get(attn__comm *c, attn__comm_req **out) {
  nccl_impl *m = impl_of(c);
  attn__comm_req *q = m->spare;
  if (q) {
    m->spare = q->next;
  } else {
    q = calloc(1, sizeof *q);
    if (!q) return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "exchange: request allocation failed");
    cudaError_t e = cudaEventCreateWithFlags(&q->done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      free(q);
      return cuda_fail(c, e, "exchange: cudaEventCreate");
    }
  }
  q->next = NULL;
  *out = q;
  return ATTN_OK;
}

/* q's event has been waited for (or the communicator is dead, and records nothing more). */
static void req_put(nccl_impl *m, attn__comm_req *q) {
  q->next = m->spare;
  m->spare = q;
}

static void req_list_free(attn__comm_req *q) {
  while (q) {
    attn__comm_req *n = q->next;
    cudaEventDestroy(q->done);
    free(q);
    q = n;
  }
}

static attn_status nccl_exchange_start(attn__comm *c, const void *sbuf, int64_t sbytes, int to,
                                       void *rbuf, int64_t rbytes, int from,
                                       attn__comm_req **req) {
  if (req) *req = NULL;
  if (c->dead) return dead_fail(c, "exchange");
  if (!req || to >= c->size || from >= c->size || (to >= 0 && (sbytes < 0 || (sbytes > 0 && !sbuf))) ||
      (from >= 0 && (rbytes < 0 || (rbytes > 0 && !rbuf))))
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "exchange: to=%d from=%d sbuf=%p sbytes=%lld rbuf=%p rbytes=%lld req=%p "
                      "is not valid on a %d-rank communicator",
                      to, from, sbuf, (long long)sbytes, rbuf, (long long)rbytes, (void *)req,
                      c->size);
  nccl_impl *m = impl_of(c);
  attn__comm_req *q = NULL;
  ATTN_CHECK(req_get(c, &q));
  q->to = to, q->from = from, q->sbytes = sbytes, q->rbytes = rbytes;
  attn_status st = stream_enter(c, "exchange");
  cudaError_t e = cudaSuccess;
  if (st == ATTN_OK) {
    ncclResult_t r = ncclGroupStart();
    if (to >= 0 && (r == ncclSuccess || r == ncclInProgress))
      r = ncclSend(sbuf, (size_t)sbytes, ncclUint8, to, m->comm, m->cs);
    if (from >= 0 && (r == ncclSuccess || r == ncclInProgress))
      r = ncclRecv(rbuf, (size_t)rbytes, ncclUint8, from, m->comm, m->cs);
    ncclResult_t g = ncclGroupEnd();
    st = r != ncclSuccess && r != ncclInProgress ? nccl_fail(c, r, "exchange: ncclSend/ncclRecv")
                                                 : call_done(c, g, "exchange: ncclGroupEnd");
  }
  if (st == ATTN_OK && (e = cudaEventRecord(q->done, m->cs)) != cudaSuccess)
    st = cuda_fail(c, e, "exchange: cudaEventRecord");
  if (st != ATTN_OK) { /* the failure left the communicator dead: the event stays spare */
    req_put(m, q);
    return st;
  }
  q->next = m->pending;
  m->pending = q;
  *req = q;
  return ATTN_OK;
}

static attn_status nccl_exchange_wait(attn__comm *c, attn__comm_req *q) {
  if (!q) return attn__fail(ATTN_ERR_INVALID_ARG, "exchange_wait: req is NULL");
  nccl_impl *m = impl_of(c);
  pending_unlink(m, q);
  attn_status st;
  if (c->dead) {
    st = dead_fail(c, "exchange");
  } else {
    char who[200];
    int n = 0;
    who[0] = '\0';
    if (q->from >= 0)
      n = snprintf(who, sizeof who, "receive of %lld bytes from world rank %d",
                   (long long)q->rbytes, world_of(c, q->from));
    if (q->to >= 0)
      snprintf(who + n, sizeof who - (size_t)n, "%ssend of %lld bytes to world rank %d",
               n ? ", " : "", (long long)q->sbytes, world_of(c, q->to));
    st = event_wait(c, q->done, "ring exchange", who);
    cudaError_t e;
    if (st == ATTN_OK && (e = cudaStreamWaitEvent(m->compute, q->done, 0)) != cudaSuccess)
      st = cuda_fail(c, e, "exchange: cudaStreamWaitEvent");
  }
  req_put(m, q); /* waited for, or the communicator is dead */
  return st;
}

/* ---- lifetime ------------------------------------------------------------------------- */
static attn_status nccl_abort(attn__comm *c, const char *why) {
  if (!c) return ATTN_OK;
  mark_dead(c, ATTN_ERR_NCCL, why && *why ? why : "aborted");
  return ATTN_OK;
}

static attn_status nccl_destroy(attn__comm *c) {
  if (!c) return ATTN_OK;
  nccl_impl *m = impl_of(c);
  attn_status st = ATTN_OK;
  cudaSetDevice(m->device);
  if (m->comm && !c->dead) {
    ncclResult_t r = ncclCommFinalize(m->comm);
    if (r == ncclInProgress && settle(m->comm, attn__now_s() + c->timeout_s, &r) == 0) r = ncclSuccess;
    if (r == ncclSuccess) {
      ncclCommDestroy(m->comm);
      m->comm = NULL;
    } else {
      st = attn__fail(ATTN_ERR_NCCL, "destroy: ncclCommFinalize did not finish on world rank %d; "
                      "the communicator was aborted", my_world_rank(c));
    }
  }
  kill_comm(m);
  req_list_free(m->pending); /* never waited for: their events may still be recorded */
  req_list_free(m->spare);
  m->pending = m->spare = NULL;
  if (m->ready) cudaEventDestroy(m->ready);
  if (m->coll) cudaEventDestroy(m->coll);
  if (m->cs) cudaStreamDestroy(m->cs);
  if (m->own_mpi && m->mpi) m->mpi->ops->destroy(m->mpi);
  free(c->world_ranks);
  free(m);
  free(c);
  return st;
}

static ncclConfig_t nonblocking_config(void) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  return cfg;
}

/* Wraps an initialised (or initialising) NCCL comm; mpi gives the members' world ranks. */
static attn_status wrap(attn__comm *mpi, int own_mpi, int device, cudaStream_t compute,
                        double timeout_s, attn__comm **out) {
  attn__comm *c = calloc(1, sizeof *c);
  nccl_impl *m = calloc(1, sizeof *m);
  int *wr = malloc((size_t)mpi->size * sizeof *wr);
  if (!c || !m || !wr) {
    free(c), free(m), free(wr);
    if (own_mpi) mpi->ops->destroy(mpi);
    return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "NCCL communicator allocation failed");
  }
  memcpy(wr, mpi->world_ranks, (size_t)mpi->size * sizeof *wr);
  *c = (attn__comm){&nccl_ops, mpi->rank, mpi->size, timeout_s, 0, wr[0], wr, m};
  m->mpi = mpi;
  m->own_mpi = own_mpi;
  m->device = device;
  m->compute = compute;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&m->cs, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&m->ready, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&m->coll, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    attn_status st = cuda_fail(c, e, "NCCL communicator: stream/event creation");
    nccl_destroy(c);
    return st;
  }
  *out = c;
  return ATTN_OK;
}

/* Waits for a non-blocking init/split of c's comm; on failure destroys c. */
static attn_status init_wait(attn__comm *c, ncclResult_t r, const char *what) {
  nccl_impl *m = impl_of(c);
  int w = 0;
  if (r == ncclInProgress) w = settle(m->comm, attn__now_s() + c->timeout_s, &r);
  else if (r != ncclSuccess) w = 2;
  attn_status st = ATTN_OK;
  if (w == 2) st = nccl_fail(c, r, what);
  if (w == 1) {
    st = attn__fail(ATTN_ERR_TIMEOUT,
                    "%s timed out after %g s on world rank %d: not every one of the %d ranks "
                    "joined (or one is stuck); raise ATTN_TIMEOUT if they are only slow",
                    what, c->timeout_s, my_world_rank(c), c->size);
    mark_dead(c, ATTN_ERR_TIMEOUT, attn_last_error());
  }
  if (st != ATTN_OK) nccl_destroy(c);
  return st;
}

static attn_status nccl_split(attn__comm *c, int color, int key, attn__comm **out) {
  if (!out) return attn__fail(ATTN_ERR_INVALID_ARG, "split: out (attn__comm **) is NULL");
  *out = NULL;
  if (c->dead) return dead_fail(c, "split");
  if (color < 0) return attn__fail(ATTN_ERR_INVALID_ARG, "split: color=%d must be >= 0", color);
  nccl_impl *m = impl_of(c);
  /* The timed MPI split first: a missing rank times out there, and the MPI child (same
   * members, same order: key, then parent rank) names the members in messages. */
  attn__comm *mchild = NULL;
  ATTN_CHECK(m->mpi->ops->split(m->mpi, color, key, &mchild));
  attn__comm *nc = NULL;
  ATTN_CHECK(wrap(mchild, 1, m->device, m->compute, c->timeout_s, &nc));
  ncclConfig_t cfg = nonblocking_config();
  ncclComm_t newcomm = NULL;
  /* On a non-blocking parent the split runs like a collective of the parent: newcomm is
   * written only once the parent's state leaves ncclInProgress (NVIDIA/nccl#1472), so the
   * parent settles first (timed; a failure or timeout leaves the parent dead), then the
   * child's own initialisation. */
  attn_status st = call_done(c, ncclCommSplit(m->comm, color, key, &newcomm, &cfg), "ncclCommSplit");
  impl_of(nc)->comm = newcomm;
  if (st == ATTN_OK && !newcomm)
    st = attn__fail(ATTN_ERR_NCCL, "ncclCommSplit succeeded on world rank %d but gave no "
                    "communicator (color=%d key=%d)", my_world_rank(c), color, key);
  if (st != ATTN_OK) {
    nccl_destroy(nc);
    return st;
  }
  ATTN_CHECK(init_wait(nc, ncclInProgress, "ncclCommSplit"));
  *out = nc;
  return ATTN_OK;
}

attn_status attn__comm_nccl_create(attn__comm *mpi_parent, int device, void *stream,
                                   double timeout_s, attn__comm **out) {
  if (!out) return attn__fail(ATTN_ERR_INVALID_ARG, "out (attn__comm **) is NULL");
  *out = NULL;
  if (!mpi_parent || mpi_parent->dead)
    return attn__fail(ATTN_ERR_INVALID_ARG, "NCCL create: the MPI parent is %s",
                      mpi_parent ? "dead" : "NULL");
  if (timeout_s <= 0) timeout_s = mpi_parent->timeout_s;
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return cuda_fail(NULL, e, "NCCL create: cudaSetDevice");
  /* Rank 0's unique id reaches every rank through a (timed) MPI allgather. */
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (mpi_parent->rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return nccl_fail(NULL, r, "ncclGetUniqueId");
  }
  ncclUniqueId *all = malloc((size_t)mpi_parent->size * sizeof *all);
  if (!all) return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "NCCL create: id buffer");
  attn_status st = mpi_parent->ops->allgather(mpi_parent, &id, all, sizeof id);
  if (st == ATTN_OK) id = all[0];
  free(all);
  ATTN_CHECK(st);
  attn__comm *c = NULL;
  ATTN_CHECK(wrap(mpi_parent, 0, device, (cudaStream_t)stream, timeout_s, &c));
  ncclConfig_t cfg = nonblocking_config();
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&comm, c->size, id, c->rank, &cfg);
  impl_of(c)->comm = comm;
  if (!comm) {
    st = nccl_fail(c, r == ncclSuccess ? ncclInternalError : r, "ncclCommInitRankConfig");
    nccl_destroy(c);
    return st;
  }
  ATTN_CHECK(init_wait(c, r, "ncclCommInitRankConfig"));
  *out = c;
  return ATTN_OK;
}

static const attn__comm_ops nccl_ops = {
    .name = "nccl",
    .split = nccl_split,
    .destroy = nccl_destroy,
    .allreduce_sum = nccl_allreduce_sum,
    .allgather = nccl_allgather,
    .alltoall = nccl_alltoall,
    .exchange_start = nccl_exchange_start,
    .exchange_wait = nccl_exchange_wait,
    .abort = nccl_abort,
};
