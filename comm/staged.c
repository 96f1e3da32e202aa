/* staged.c — the MPI-staged transport of comm.h for device buffers: device memory goes
 * through pinned host copies over an MPI communicator. For ranks that share one GPU (NCCL
 * refuses duplicate devices) and for builds without NCCL; needs only the CUDA runtime.
 * Every operation synchronises the caller's stream, so it is ordered after the kernels
 * queued before it, and the kernels queued after it see its results. */
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

typedef struct staged_req {
  attn__comm_req *inner; /* the MPI exchange */
  void *sh, *rh;         /* pinned staging of this exchange */
  void *rbuf;
  int64_t rbytes;
  struct staged_req *next; /* pending list */
} staged_req;

typedef struct {
  attn__comm *mpi;
  int own_mpi;
  cudaStream_t stream;
  void *stage; /* pinned staging for collectives */
  size_t cap;
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

static attn_status pinned(attn__comm *c, void **p, size_t bytes) {
  cudaError_t e = cudaMallocHost(p, bytes ? bytes : 1);
  if (e != cudaSuccess) *p = NULL;
  return e == cudaSuccess ? ATTN_OK : staged_cuda(c, e, "cudaMallocHost");
}

/* Async copy on the caller's stream, then wait for the stream. */
static attn_status copy_sync(attn__comm *c, void *dst, const void *src, size_t bytes,
                             enum cudaMemcpyKind kind) {
  if (!bytes) return ATTN_OK;
  cudaStream_t s = simpl(c)->stream;
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  return e == cudaSuccess ? ATTN_OK : staged_cuda(c, e, "cudaMemcpyAsync");
}

static attn_status stage_get2(attn__comm *c, size_t bytes, char **out) {
  staged_impl *s = simpl(c);
  if (bytes > s->cap) {
    if (s->stage) cudaFreeHost(s->stage);
    s->stage = NULL;
    s->cap = 0;
    ATTN_CHECK(pinned(c, &s->stage, bytes));
    s->cap = bytes;
  }
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

static void sreq_free(staged_req *q, int keep_recv) {
  if (q->sh) cudaFreeHost(q->sh);
  if (q->rh && !keep_recv) cudaFreeHost(q->rh); /* kept: a late MPI receive may land there */
  free(q);
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
  q->rbuf = rbuf;
  q->rbytes = from >= 0 ? rbytes : 0;
  size_t sb = to >= 0 && sbuf ? (size_t)sbytes : 0;
  attn_status st = pinned(c, &q->sh, sb);
  if (st == ATTN_OK) st = pinned(c, &q->rh, (size_t)q->rbytes);
  if (st == ATTN_OK) st = copy_sync(c, q->sh, sbuf, sb, cudaMemcpyDeviceToHost);
  if (st == ATTN_OK)
    st = s->mpi->ops->exchange_start(s->mpi, sbuf ? q->sh : NULL, sbytes, to,
                                     rbuf ? q->rh : NULL, rbytes, from, &q->inner);
  if (st != ATTN_OK) {
    sreq_free(q, 0);
    return st;
  }
  q->next = s->pending;
  s->pending = q;
  *req = (attn__comm_req *)q;
  return ATTN_OK;
}

static attn_status staged_exchange_wait(attn__comm *c, attn__comm_req *req) {
  staged_req *q = (staged_req *)req;
  if (!q) return attn__fail(ATTN_ERR_INVALID_ARG, "exchange_wait: req is NULL");
  staged_impl *s = simpl(c);
  for (staged_req **p = &s->pending; *p; p = &(*p)->next)
    if (*p == q) {
      *p = q->next;
      break;
    }
  attn_status st = s->mpi->ops->exchange_wait(s->mpi, q->inner);
  if (st == ATTN_OK && q->rbuf)
    st = copy_sync(c, q->rbuf, q->rh, (size_t)q->rbytes, cudaMemcpyHostToDevice);
  if (st != ATTN_OK && !c->dead) s->dead_status = st;
  if (st != ATTN_OK) c->dead = 1;
  sreq_free(q, st != ATTN_OK);
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
  while (s->pending) { /* the MPI destroy cancels their requests; keep their buffers */
    staged_req *q = s->pending;
    s->pending = q->next;
    if (q->sh) cudaFreeHost(q->sh);
    free(q);
  }
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
