/* test_nccl.c — comm/nccl.c on one GPU: NCCL on a one-rank communicator per rank
 * (allreduce, allgather, alltoall, split, exchange to self, the watchdog on a receive that
 * never comes) and the MPI-staged transport across all ranks (allreduce, allgather,
 * alltoall, a ring exchange, split). Run under mpiexec -np 1 or 2; exits 77 without a GPU. */
#include "comm.h"
#include "../mpi/rank_check.h"

#include <cuda_runtime.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Declared in comm.h once nccl.c is in the build; repeated here (compatible). */
attn_status attn__comm_nccl_create(attn__comm *mpi_parent, int device, void *stream,
                                   double timeout_s, attn__comm **out);
attn_status attn__comm_staged_create(attn__comm *mpi, void *stream, attn__comm **out);

static int wrank, wsize, nfail;
static cudaStream_t stream;

#define CUDA_OK(expr)                                                                     \
  do {                                                                                    \
    cudaError_t e_ = (expr);                                                              \
    CHECK(e_ == cudaSuccess, "%s -> %s", #expr, cudaGetErrorString(e_));                  \
  } while (0)

/* On the test's stream, then waited for: the transports run on non-blocking streams, which
 * a legacy-stream cudaMemset (asynchronous to the host) would race — it zeroed received
 * blocks on the H200. */
static void *dev_from(const void *host, size_t bytes) {
  void *d = NULL;
  CUDA_OK(cudaMalloc(&d, bytes ? bytes : 1));
  if (host && bytes) CUDA_OK(cudaMemcpyAsync(d, host, bytes, cudaMemcpyHostToDevice, stream));
  else CUDA_OK(cudaMemsetAsync(d, 0, bytes ? bytes : 1, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  return d;
}

static void to_host(void *host, const void *dev, size_t bytes) {
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
}

static unsigned char byte_of(int a, int b, int64_t i) {
  return (unsigned char)(a * 31 + b * 7 + i * 13 + (i >> 8));
}

/* Integer-valued floats / doubles / int64: every sum is exact. */
static void allreduce_case(attn__comm *c, const char *name, int64_t n) {
  float *hf = malloc((size_t)n * sizeof *hf);
  double *hd = malloc((size_t)n * sizeof *hd);
  int64_t *hi = malloc((size_t)n * sizeof *hi);
  for (int64_t i = 0; i < n; i++) {
    hf[i] = (float)((c->rank + 1) * (i % 1000) - 7);
    hd[i] = (double)((c->rank + 2) * (i % 777) + 3);
    hi[i] = (int64_t)(c->rank + 1) * (i + ((int64_t)1 << 40));
  }
  void *df = dev_from(hf, (size_t)n * 4), *dd = dev_from(hd, (size_t)n * 8), *di = dev_from(hi, (size_t)n * 8);
  CHECK_OK(c->ops->allreduce_sum(c, df, n, ATTN_COMM_F32));
  CHECK_OK(c->ops->allreduce_sum(c, dd, n, ATTN_COMM_F64));
  CHECK_OK(c->ops->allreduce_sum(c, di, n, ATTN_COMM_I64));
  to_host(hf, df, (size_t)n * 4);
  to_host(hd, dd, (size_t)n * 8);
  to_host(hi, di, (size_t)n * 8);
  int64_t P = c->size, s1 = P * (P + 1) / 2, bad = 0;
  for (int64_t i = 0; i < n; i++) {
    bad += hf[i] != (float)(s1 * (i % 1000) - 7 * P);
    bad += hd[i] != (double)((s1 + P) * (i % 777) + 3 * P);
    bad += hi[i] != s1 * (i + ((int64_t)1 << 40));
  }
  CHECK(bad == 0, "%s allreduce on %lld ranks: %lld wrong values", name, (long long)P, (long long)bad);
  cudaFree(df), cudaFree(dd), cudaFree(di);
  free(hf), free(hd), free(hi);
}

static void gather_case(attn__comm *c, const char *name, int64_t bytes) {
  size_t P = (size_t)c->size, b = (size_t)bytes;
  unsigned char *hs = malloc(P * b), *hr = malloc(P * b);
  for (size_t i = 0; i < P * b; i++) hs[i] = byte_of(c->rank, (int)(i / b), (int64_t)(i % b));
  void *ds = dev_from(hs, P * b), *dr = dev_from(NULL, P * b);
  CHECK_OK(c->ops->allgather(c, ds, dr, bytes)); /* block 0 of send from every rank */
  to_host(hr, dr, P * b);
  int64_t bad = 0;
  for (size_t i = 0; i < P * b; i++) bad += hr[i] != byte_of((int)(i / b), 0, (int64_t)(i % b));
  CHECK(bad == 0, "%s allgather: %lld wrong bytes", name, (long long)bad);
  CHECK_OK(c->ops->alltoall(c, ds, dr, bytes));
  to_host(hr, dr, P * b);
  bad = 0;
  for (size_t i = 0; i < P * b; i++) bad += hr[i] != byte_of((int)(i / b), c->rank, (int64_t)(i % b));
  CHECK(bad == 0, "%s alltoall: %lld wrong bytes", name, (long long)bad);
  cudaFree(ds), cudaFree(dr);
  free(hs), free(hr);
}

/* Two ring steps in flight: send to rank+1, receive from rank-1 (self on one rank). */
static void ring_case(attn__comm *c, const char *name, int64_t bytes) {
  int P = c->size, to = (c->rank + 1) % P, from = (c->rank + P - 1) % P;
  unsigned char *h = malloc((size_t)bytes);
  void *ds[2], *dr[2];
  attn__comm_req *rq[2] = {NULL, NULL};
  for (int k = 0; k < 2; k++) {
    for (int64_t i = 0; i < bytes; i++) h[i] = byte_of(c->rank, k, i);
    ds[k] = dev_from(h, (size_t)bytes);
    dr[k] = dev_from(NULL, (size_t)bytes);
    CHECK_OK(c->ops->exchange_start(c, ds[k], bytes, to, dr[k], bytes, from, &rq[k]));
  }
  for (int k = 0; k < 2; k++) {
    if (rq[k]) CHECK_OK(c->ops->exchange_wait(c, rq[k]));
    to_host(h, dr[k], (size_t)bytes);
    int64_t bad = 0;
    for (int64_t i = 0; i < bytes; i++) bad += h[i] != byte_of(from, k, i);
    CHECK(bad == 0, "%s ring exchange %d: %lld wrong bytes", name, k, (long long)bad);
    cudaFree(ds[k]), cudaFree(dr[k]);
  }
  free(h);
}

static void run_all(attn__comm *c, const char *name) {
  allreduce_case(c, name, 1000);
  allreduce_case(c, name, (int64_t)3 << 20);
  gather_case(c, name, 4096 + 3);
  ring_case(c, name, 1 << 20);
  attn__comm *sub = NULL;
  CHECK_OK(c->ops->split(c, 0, -c->rank, &sub)); /* reversed order */
  if (sub) {
    CHECK(sub->size == c->size && sub->rank == c->size - 1 - c->rank, "%s split: rank %d of %d",
          name, sub->rank, sub->size);
    allreduce_case(sub, name, 1000);
    ring_case(sub, name, 12345);
    CHECK_OK(sub->ops->destroy(sub));
  }
}

/* A receive from self with no matching send: the watchdog aborts after ~1 s. */
static void timeout_case(attn__comm *self) {
  attn__comm *n = NULL;
  CHECK_OK(attn__comm_nccl_create(self, 0, stream, 1.0, &n));
  if (!n) return;
  void *d = dev_from(NULL, 256);
  attn__comm_req *rq = NULL;
  double t0 = MPI_Wtime();
  attn_status st = n->ops->exchange_start(n, NULL, 0, -1, d, 256, 0, &rq);
  if (st == ATTN_OK) st = n->ops->exchange_wait(n, rq);
  double dt = MPI_Wtime() - t0;
  CHECK(st == ATTN_ERR_TIMEOUT || st == ATTN_ERR_NCCL, "unmatched receive -> %s: %s",
        attn_status_string(st), attn_last_error());
  CHECK(dt < 20, "the watchdog took %.1f s", dt);
  if (wrank == 0) printf("timeout case: %s after %.2f s: %s\n", attn_status_string(st), dt, attn_last_error());
  CHECK(n->dead, "the communicator is not marked dead");
  CHECK(n->ops->allreduce_sum(n, d, 4, ATTN_COMM_F32) != ATTN_OK, "a dead communicator answered");
  CHECK_OK(n->ops->destroy(n));
  cudaFree(d);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
  MPI_Comm_size(MPI_COMM_WORLD, &wsize);
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    if (wrank == 0) printf("test_nccl: no CUDA device, skipped\n");
    MPI_Finalize();
    return 77;
  }
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  attn__comm *world = NULL, *self = NULL, *nccl = NULL, *staged = NULL;
  CHECK_OK(attn__comm_mpi_create(&(MPI_Comm){MPI_COMM_WORLD}, 60, &world));
  if (!world) return 1;
  /* NCCL on a one-rank communicator per rank (NCCL refuses two ranks on one GPU). */
  CHECK_OK(world->ops->split(world, wrank, 0, &self));
  if (self) CHECK_OK(attn__comm_nccl_create(self, 0, stream, 60, &nccl));
  if (nccl) {
    run_all(nccl, "nccl");
    CHECK_OK(nccl->ops->destroy(nccl));
  }
  /* All ranks over MPI through pinned host copies. */
  CHECK_OK(attn__comm_staged_create(world, stream, &staged));
  if (staged) {
    run_all(staged, "staged");
    CHECK_OK(staged->ops->destroy(staged));
  }
  /* Last: an aborted NCCL kernel is the likeliest thing to hang the process. */
  if (self && (argc < 2 || strcmp(argv[1], "--no-timeout") != 0)) timeout_case(self);
  if (self) self->ops->destroy(self);
  world->ops->destroy(world);
  int local = nfail, total = 0;
  MPI_Allreduce(&local, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (wrank == 0) printf("test_nccl on %d rank(s): %s (%d failures)\n", wsize, total ? "FAIL" : "PASS", total);
  cudaStreamDestroy(stream);
  MPI_Finalize();
  return total ? 1 : 0;
}
