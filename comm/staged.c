/* staged.c — the MPI-staged transport of comm.h for device buffers: device memory goes
 * through pinned host copies over an MPI communicator. For ranks that share one GPU (NCCL
 * refuses duplicate devices) and for builds without NCCL; needs only the CUDA runtime.
 *
 * Collectives synchronise the caller's stream (their results are needed at once). The ring
 * exchange does not: exchange_start records an event on the caller's stream (after the
 * pack) and queues the copy of the outgoing block into pinned memory on our copy stream
 * behind it; exchange_wait waits (timed) for that copy, posts the MPI exchange, waits for
 * it (timed, by the MPI transport), queues the copy of the incoming block into the device
 * buffer and makes the caller's stream wait for it — so the kernels queued between the two
 * calls run while the block travels, and those queued after see it. The pinned buffers are
 * slots kept by the communicator (grown on demand, freed with it): no allocation per
 * exchange once they have grown. */
#include "comm.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int my_world_rank(const attn__comm *c) { return c->world_ranks[c->rank]; }

static attn_status elem_size(attn__comm_type type, size_t *bytes) {
  switch (type) {
    case ATTN_COMM_F32: *bytes = 4; return ATTN_OK;
    case ATTN_COMM_F64: *bytes = 8; return ATTN_OK;
    case ATTN_COMM_I64: *bytes = 8; return ATTN_OK;
  }
  return attn__fail(ATTN_ERR_INVALID_ARG, "comm type=%d is not f32 (0), f64 (1) or i64 (2)",
                    (int)type);
}

/* Pinned staging of one exchange in flight; reused once that exchange has completed. */
typedef struct stage_slot {
  void *sh, *rh;         /* pinned send / receive staging */
  size_t scap, rcap;
  cudaEvent_t ready;     /* on the caller's stream: what the outgoing copy waits for */
  cudaEvent_t out_done;  /* on the copy stream: the outgoing block is in sh */
  cudaEvent_t in_done;   /* on the copy stream: the incoming block is in the device buffer */
  int busy;
  int lost;              /* its exchange failed: a late MPI receive may land in rh */
  struct stage_slot *next;
} stage_slot;

typedef struct staged_req {
  attn__comm_req *inner; /* the MPI exchange, once posted */
  stage_slot *slot;
  const void *sbuf;
  void *rbuf;
  int64_t sbytes, rbytes;
  int to, from;
  struct staged_req *next; /* pending list, in start order */
} staged_req;

typedef struct {
  attn__comm *mpi;
  int own_mpi;
  cudaStream_t stream; /* the caller's */
  cudaStream_t cs;     /* ours: the staging copies of exchanges */
  void *stage;         /* pinned staging for collectives */
  size_t cap;
  stage_slot *slots;
  staged_req *pending;
  attn_status dead_status; /* the first failure's status */
} staged_impl;

static const attn__comm_ops staged_ops;
static staged_impl *simpl(attn__comm *c) { return (staged_impl *)c->impl; }

static attn_status staged_cuda(attn__comm *c, cudaError_t e, const char *what) {
  attn_status st = attn__fail(ATTN_ERR_CUDA, "staged %s failed on world rank %d: %s", what,
                              my_world_rank(c), cudaGetErrorString(e));
  simpl(c)->mpi->ops->abort(simpl(c)->mpi, attn_last_error());
  if (!c->dead) simpl(c)->dead_status = st;
  c->dead = 1;
  return st;
}

static attn_status cuda_ok(attn__comm *c, cudaError_t e, const char *what) {
  return e == cudaSuccess ? ATTN_OK : staged_cuda(c, e, what);
}

/* *p grows to at least bytes of pinned memory (freeing the old one waits for the device). */
static attn_status pinned_grow(attn__comm *c, void **p, size_t *cap, size_t bytes) {
  if (*p && bytes <= *cap) return ATTN_OK;
  if (*p) cudaFreeHost(*p);
  *p = NULL;
  *cap = 0;
  cudaError_t e = cudaHostAlloc(p, bytes ? bytes : 1, cudaHostAllocDefault);
  if (e != cudaSuccess) *p = NULL;
  else *cap = bytes;
  return cuda_ok(c, e, "cudaHostAlloc");
}

/* Async copy on the caller's stream, then wait for the stream. */
static attn_status copy_sync(attn__comm *c, void *dst, const void *src, size_t bytes,
                             enum cudaMemcpyKind kind) {
  if (!bytes) return ATTN_OK;
  cudaStream_t s = simpl(c)->stream;
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  return cuda_ok(c, e, "cudaMemcpyAsync");
}

static attn_status stage_get2(attn__comm *c, size_t bytes, char **out) {
  staged_impl *s = simpl(c);
  ATTN_CHECK(pinned_grow(c, &s->stage, &s->cap, bytes));
  *out = s->stage;
  return ATTN_OK;
}

static attn_status staged_dead(attn__comm *c, const char *what) {
  return attn__fail(simpl(c)->dead_status, "staged %s on world rank %d: the communicator is "
                    "no longer usable after an earlier failure; destroy the group", what,
                    my_world_rank(c));
}

static attn_status staged_allreduce_sum(attn__comm *c, void *buf, int64_t count,
                                        attn__comm_type type) {
  size_t es = 4;
  if (c->dead) return staged_dead(c, "allreduce");
  ATTN_CHECK(elem_size(type, &es));
  if (count <= 0 || !buf) return simpl(c)->mpi->ops->allreduce_sum(simpl(c)->mpi, buf, count, type);
  size_t bytes = (size_t)count * es;
  char *h = NULL;
  ATTN_CHECK(stage_get2(c, bytes, &h));
  ATTN_CHECK(copy_sync(c, h, buf, bytes, cudaMemcpyDeviceToHost));
  ATTN_CHECK(simpl(c)->mpi->ops->allreduce_sum(simpl(c)->mpi, h, count, type));
  return copy_sync(c, buf, h, bytes, cudaMemcpyHostToDevice);
}

typedef attn_status (*bytes_op)(attn__comm *, const void *, void *, int64_t);

/* allgather / alltoall: send [in_blocks][bytes] staged, recv [size][bytes] staged. */
static attn_status staged_bytes(attn__comm *c, bytes_op op, int in_blocks, const void *send,
                                void *recv, int64_t bytes) {
  if (c->dead) return staged_dead(c, "collective");
  if (bytes <= 0 || !send || !recv) return op(simpl(c)->mpi, send, recv, bytes);
  size_t in = (size_t)in_blocks * (size_t)bytes, outb = (size_t)c->size * (size_t)bytes;
  char *h = NULL;
  ATTN_CHECK(stage_get2(c, in + outb, &h));
  ATTN_CHECK(copy_sync(c, h, send, in, cudaMemcpyDeviceToHost));
  ATTN_CHECK(op(simpl(c)->mpi, h, h + in, bytes));
  return copy_sync(c, recv, h + in, outb, cudaMemcpyHostToDevice);
}

static attn_status staged_allgather(attn__comm *c, const void *send, void *recv, int64_t bytes) {
  return staged_bytes(c, simpl(c)->mpi->ops->allgather, 1, send, recv, bytes);
}

static attn_status staged_alltoall(attn__comm *c, const void *send, void *recv, int64_t bytes) {
  return staged_bytes(c, simpl(c)->mpi->ops->alltoall, c->size, send, recv, bytes);
}

/* ---- the ring exchange ---------------------------------------------------------------- */
static void slot_free(stage_slot *t) {
  if (!t->lost) { /* lost: MPI may still read sh or write rh; leave both */
    if (t->sh) cudaFreeHost(t->sh);
    if (t->rh) cudaFreeHost(t->rh);
  }
  if (t->ready) cudaEventDestroy(t->ready);
  if (t->out_done) cudaEventDestroy(t->out_done);
  if (t->in_done) cudaEventDestroy(t->in_done);
  free(t);
}

/* A free slot with room for sb / rb bytes (grown, or a new one). */
static attn_status slot_get(attn__comm *c, size_t sb, size_t rb, stage_slot **out) {
  staged_impl *s = simpl(c);
  stage_slot *t = s->slots;
  while (t && t->busy) t = t->next;
  if (!t) {
    t = calloc(1, sizeof *t);
    if (!t) return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "staged exchange: slot allocation");
    cudaError_t e = cudaEventCreateWithFlags(&t->ready, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&t->out_done, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&t->in_done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      slot_free(t);
      return staged_cuda(c, e, "cudaEventCreate");
    }
    t->next = s->slots;
    s->slots = t;
  }
  ATTN_CHECK(pinned_grow(c, &t->sh, &t->scap, sb));
  ATTN_CHECK(pinned_grow(c, &t->rh, &t->rcap, rb));
  t->busy = 1;
  *out = t;
  return ATTN_OK;
}

/* Host waits for ev (our copy stream's work) with the communicator's timeout. */
static attn_status copy_wait(attn__comm *c, cudaEvent_t ev, const staged_req *q, const char *what) {
  const double deadline = attn__now_s() + c->timeout_s;
  attn__backoff b = ATTN__BACKOFF_INIT;
  for (;;) {
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) return ATTN_OK;
    if (e != cudaErrorNotReady) return staged_cuda(c, e, what);
    if (attn__now_s() >= deadline) break;
    attn__backoff_wait(&b);
  }
  attn_status st = attn__fail(ATTN_ERR_TIMEOUT,
                              "staged exchange (send to world rank %d, receive from world rank "
                              "%d): the %s did not complete within %g s on world rank %d; the "
                              "device is stuck or far behind",
                              q->to >= 0 ? c->world_ranks[q->to] : -1,
                              q->from >= 0 ? c->world_ranks[q->from] : -1, what, c->timeout_s,
                              my_world_rank(c));
  simpl(c)->mpi->ops->abort(simpl(c)->mpi, attn_last_error());
  if (!c->dead) simpl(c)->dead_status = st;
  c->dead = 1;
  return st;
}

static void pending_unlink(staged_impl *s, staged_req *q) {
  for (staged_req **p = &s->pending; *p; p = &(*p)->next)
    if (*p == q) {
      *p = q->next;
      return;
    }
}

/* Queues the outgoing copy behind everything queued so far on the caller's stream. */
static attn_status stage_out(attn__comm *c, staged_req *q, size_t sb) {
  staged_impl *s = simpl(c);
  stage_slot *t = q->slot;
  cudaError_t e = cudaEventRecord(t->ready, s->stream);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(s->cs, t->ready, 0);
  if (e == cudaSuccess && sb)
    e = cudaMemcpyAsync(t->sh, q->sbuf, sb, cudaMemcpyDeviceToHost, s->cs);
  if (e == cudaSuccess) e = cudaEventRecord(t->out_done, s->cs);
  return cuda_ok(c, e, "exchange: staging the outgoing block");
}

static attn_status staged_exchange_start(attn__comm *c, const void *sbuf, int64_t sbytes, int to,
                                         void *rbuf, int64_t rbytes, int from,
                                         attn__comm_req **req) {
  if (req) *req = NULL;
  if (c->dead) return staged_dead(c, "exchange");
  if (!req || (to >= 0 && sbytes < 0) || (from >= 0 && rbytes < 0))
    return attn__fail(ATTN_ERR_INVALID_ARG, "staged exchange: sbytes=%lld rbytes=%lld req=%p "
                      "is not valid", (long long)sbytes, (long long)rbytes, (void *)req);
  staged_impl *s = simpl(c);
  staged_req *q = calloc(1, sizeof *q);
  if (!q) return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "staged exchange: request allocation");
  *q = (staged_req){NULL, NULL, sbuf, rbuf, sbytes, from >= 0 ? rbytes : 0, to, from, NULL};
  const size_t sb = to >= 0 && sbuf ? (size_t)sbytes : 0;
  attn_status st = slot_get(c, sb, (size_t)q->rbytes, &q->slot);
  if (st == ATTN_OK) st = stage_out(c, q, sb);
  if (st != ATTN_OK) {
    if (q->slot) q->slot->busy = 0;
    free(q);
    return st;
  }
  staged_req **tail = &s->pending; /* MPI exchanges are posted in start order */
  while (*tail) tail = &(*tail)->next;
  *tail = q;
  *req = (attn__comm_req *)q;
  return ATTN_OK;
}

/* Posts the MPI exchanges of the pending requests up to q, in start order, each once its
 * outgoing block has reached pinned memory. */
static attn_status post_until(attn__comm *c, staged_req *q) {
  staged_impl *s = simpl(c);
  for (staged_req *p = s->pending; p; p = p->next) {
    if (!p->inner) {
      ATTN_CHECK(copy_wait(c, p->slot->out_done, p, "copy of the outgoing block to the host"));
      ATTN_CHECK(s->mpi->ops->exchange_start(s->mpi, p->sbuf ? p->slot->sh : NULL, p->sbytes,
                                             p->to, p->rbuf ? p->slot->rh : NULL, p->rbytes,
                                             p->from, &p->inner));
    }
    if (p == q) break;
  }
  return ATTN_OK;
}

/* After the MPI exchange: the incoming copy, and the caller's stream waits for it (and so
 * for the outgoing copy before it: the caller may then overwrite sbuf). */
static attn_status stage_in(attn__comm *c, staged_req *q) {
  staged_impl *s = simpl(c);
  stage_slot *t = q->slot;
  cudaError_t e = cudaSuccess;
  if (q->rbuf && q->rbytes)
    e = cudaMemcpyAsync(q->rbuf, t->rh, (size_t)q->rbytes, cudaMemcpyHostToDevice, s->cs);
  if (e == cudaSuccess) e = cudaEventRecord(t->in_done, s->cs);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(s->stream, t->in_done, 0);
  return cuda_ok(c, e, "exchange: staging the incoming block");
}

static attn_status staged_exchange_wait(attn__comm *c, attn__comm_req *req) {
  staged_req *q = (staged_req *)req;
  if (!q) return attn__fail(ATTN_ERR_INVALID_ARG, "exchange_wait: req is NULL");
  staged_impl *s = simpl(c);
  attn_status st = c->dead ? staged_dead(c, "exchange") : post_until(c, q);
  pending_unlink(s, q);
  if (st == ATTN_OK) st = s->mpi->ops->exchange_wait(s->mpi, q->inner);
  else if (q->inner) s->mpi->ops->exchange_wait(s->mpi, q->inner); /* frees it (dead: fails) */
  if (st == ATTN_OK) st = stage_in(c, q);
  if (st != ATTN_OK && !c->dead) s->dead_status = st;
  if (st != ATTN_OK) c->dead = 1, q->slot->lost = 1;
  else q->slot->busy = 0;
  free(q);
  return st;
}

static attn_status staged_abort(attn__comm *c, const char *why) {
  if (!c) return ATTN_OK;
  c->dead = 1;
  return simpl(c)->mpi->ops->abort(simpl(c)->mpi, why);
}

static attn_status staged_destroy(attn__comm *c) {
  if (!c) return ATTN_OK;
  staged_impl *s = simpl(c);
  while (s->pending) { /* never waited: destroying the MPI communicator cancels them */
    staged_req *q = s->pending;
    s->pending = q->next;
    q->slot->lost = 1;
    free(q);
  }
  if (s->cs) cudaStreamSynchronize(s->cs);
  while (s->slots) {
    stage_slot *t = s->slots;
    s->slots = t->next;
    slot_free(t);
  }
  if (s->cs) cudaStreamDestroy(s->cs);
  if (s->own_mpi) s->mpi->ops->destroy(s->mpi);
  if (s->stage) cudaFreeHost(s->stage);
  free(c->world_ranks);
  free(s);
  free(c);
  return ATTN_OK;
}

static attn_status staged_wrap(attn__comm *mpi, int own, void *stream, attn__comm **out) {
  attn__comm *c = calloc(1, sizeof *c);
  staged_impl *s = calloc(1, sizeof *s);
  int *wr = malloc((size_t)mpi->size * sizeof *wr);
  if (!c || !s || !wr) {
    free(c), free(s), free(wr);
    if (own) mpi->ops->destroy(mpi);
    return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "staged communicator allocation failed");
  }
  memcpy(wr, mpi->world_ranks, (size_t)mpi->size * sizeof *wr);
  *c = (attn__comm){&staged_ops, mpi->rank, mpi->size, mpi->timeout_s, 0, wr[0], wr, s};
  s->mpi = mpi;
  s->own_mpi = own;
  s->stream = (cudaStream_t)stream;
  cudaError_t e = cudaStreamCreateWithFlags(&s->cs, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    s->cs = NULL;
    attn_status st = attn__fail(ATTN_ERR_CUDA, "staged communicator: copy stream creation: %s",
                                cudaGetErrorString(e));
    staged_destroy(c);
    return st;
  }
  *out = c;
  return ATTN_OK;
}

static attn_status staged_split(attn__comm *c, int color, int key, attn__comm **out) {
  if (!out) return attn__fail(ATTN_ERR_INVALID_ARG, "split: out (attn__comm **) is NULL");
  *out = NULL;
  if (c->dead) return staged_dead(c, "split");
  attn__comm *child = NULL;
  ATTN_CHECK(simpl(c)->mpi->ops->split(simpl(c)->mpi, color, key, &child));
  return staged_wrap(child, 1, simpl(c)->stream, out);
}

attn_status attn__comm_staged_create(attn__comm *mpi, void *stream, attn__comm **out) {
  if (!out) return attn__fail(ATTN_ERR_INVALID_ARG, "out (attn__comm **) is NULL");
  *out = NULL;
  if (!mpi || mpi->dead)
    return attn__fail(ATTN_ERR_INVALID_ARG, "staged create: the MPI communicator is %s",
                      mpi ? "dead" : "NULL");
  return staged_wrap(mpi, 0, stream, out);
}

static const attn__comm_ops staged_ops = {
    .name = "staged",
    .split = staged_split,
    .destroy = staged_destroy,
    .allreduce_sum = staged_allreduce_sum,
    .allgather = staged_allgather,
    .alltoall = staged_alltoall,
    .exchange_start = staged_exchange_start,
    .exchange_wait = staged_exchange_wait,
    .abort = staged_abort,
};
