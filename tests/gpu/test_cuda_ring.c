/* test_cuda_ring.c — ring attention (attn_ring_fwd / attn_ring_bwd) on a CUDA context, with
 * bf16 inputs, under mpiexec: ranks sharing one GPU (the MPI-staged transport) or one GPU
 * per rank (NCCL, ATTN_COMM=nccl). Each rank regenerates the full problem, rounds it to
 * bf16, and compares its shard of the CUDA ring's O, LSE, dQ, dK, dV and d(sinks) against
 *   (a) single-rank attn_fwd / attn_bwd on the same CUDA context over the full problem, and
 *   (b) the CPU backend's ring on the same bf16-rounded inputs (float32),
 * counting wrong elements per rank; the verdict is agreed with an allreduce. Cases: causal
 * zigzag and contiguous, windows (one shorter than a chunk: blocks not sent), GQA / MQA,
 * sinks on and off, varlen (device cu_seqlens); the step record must have one entry per
 * step.
 *
 * Built twice: against libattnrun (label gpu; exits 77 when no CUDA device is visible, or
 * when ATTN_COMM=nccl is forced on ranks that share a GPU) and against the emulated library
 * variant (ATTN_TEST_EMULATED, label emu: small shapes). Parts: ring (the comparison) and
 * refuse (group creation must fail with UNSUPPORTED on every rank: ATTN_COMM=nccl where the
 * build has no NCCL). Inputs and outputs move through attn_ctx_alloc / attn_ctx_copy only. */
#include "attnrun.h"
#include "test_util.h"

#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#ifdef ATTN_TEST_EMULATED
enum { EMULATED = 1 };
#else
enum { EMULATED = 0 };
#endif

/* Tolerances relative to max |ref| of each tensor (those of test_cuda_runtime: bf16 output
 * rounding is 2^-9 relative and P is rounded to bf16 inside the kernels). */
#define TOL_O 1.6e-2
#define TOL_LSE 1e-3
#define TOL_GRAD 3e-2

static int g_rank, g_size;
static attn_ctx_t g_gpu, g_cpu;
static attn_group_t g_ggrp, g_cgrp;

typedef struct {
  const char *name;
  attn_cp_layout layout;
  int64_t B, S;
  int Hq, Hkv, D;
  int causal;
  int64_t wl, wr;
  int sinks;
  uint64_t seed;
  int nseq;            /* varlen (B = 1): sequence lengths in lens, summing to S */
  const int32_t *lens;
} rcase;

/* ---- bf16 and context memory ---------------------------------------------------------- */
static uint16_t to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}

static void die(const char *what) {
  fprintf(stderr, "rank %d: %s: %s\n", g_rank, what, attn_last_error());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

/* n elements of context memory, filled from host (bf16 = 1: x converted), or poisoned
 * (0xFF bytes: NaN in both dtypes) when x is NULL. */
static void *up(const float *x, int64_t n, int bf16) {
  const size_t es = bf16 ? 2 : 4, bytes = (size_t)n * es;
  void *d = NULL, *h = tu_alloc(bytes ? bytes : 1);
  if (attn_ctx_alloc(g_gpu, bytes, &d) != ATTN_OK) die("attn_ctx_alloc");
  if (!x) memset(h, 0xFF, bytes);
  else if (bf16)
    for (int64_t i = 0; i < n; i++) ((uint16_t *)h)[i] = to_bf16(x[i]);
  else memcpy(h, x, bytes);
  if (attn_ctx_copy(g_gpu, d, h, bytes, ATTN_COPY_HOST_TO_CTX) != ATTN_OK) die("upload");
  free(h);
  return d;
}

/* n elements of context memory back to host floats. */
static float *down(const void *d, int64_t n, int bf16) {
  float *x = tu_falloc(n > 0 ? n : 1);
  if (bf16) {
    uint16_t *h = tu_alloc((size_t)n * 2 + 2);
    if (attn_ctx_copy(g_gpu, h, d, (size_t)n * 2, ATTN_COPY_CTX_TO_HOST) != ATTN_OK) die("download");
    for (int64_t i = 0; i < n; i++) x[i] = from_bf16(h[i]);
    free(h);
  } else if (attn_ctx_copy(g_gpu, x, d, (size_t)n * 4, ATTN_COPY_CTX_TO_HOST) != ATTN_OK) {
    die("download");
  }
  return x;
}

static attn_tensor tens(void *p, attn_dtype t, attn_device dev, int64_t b, int64_t s, int64_t h,
                        int64_t d) {
  return attn_tensor_contig(p, t, dev, b, s, h, d);
}

/* ---- shards ------------------------------------------------------------------------------ */
static int64_t global_row(const attn_cp_shard *sh, int64_t i) {
  return i < sh->len[0] ? sh->start[0] + i : sh->start[1] + (i - sh->len[0]);
}

/* [B, rows, H, D] <- the shard's rows of full [B, S, H, D]. */
static float *gather(const float *full, int64_t B, int64_t S, int64_t H, int64_t D,
                     const attn_cp_shard *sh) {
  float *x = tu_falloc(B * sh->rows * H * D);
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = 0; i < sh->rows; i++)
      memcpy(x + (b * sh->rows + i) * H * D, full + (b * S + global_row(sh, i)) * H * D,
             (size_t)(H * D) * sizeof(float));
  return x;
}

/* [B, H, rows] <- the shard's rows of full LSE [B, H, S]. */
static float *gather_lse(const float *full, int64_t BH, int64_t S, const attn_cp_shard *sh) {
  float *x = tu_falloc(BH * sh->rows);
  for (int64_t bh = 0; bh < BH; bh++)
    for (int64_t i = 0; i < sh->rows; i++) x[bh * sh->rows + i] = full[bh * S + global_row(sh, i)];
  return x;
}

/* Wrong elements of got vs ref: |got - ref| > tol * max|ref| (non-finite got is wrong
 * where ref is finite; -inf must match -inf). Prints the worst. */
static int64_t count_wrong(const char *what, const char *vs, const char *name, const float *got,
                           const float *ref, int64_t n, double tol, double *rel_out) {
  double mx = 0, worst = 0;
  int64_t wrong = 0, at = -1;
  for (int64_t i = 0; i < n; i++)
    if (isfinite(ref[i]) && fabs(ref[i]) > mx) mx = fabs(ref[i]);
  const double thr = tol * (mx > 0 ? mx : 1);
  for (int64_t i = 0; i < n; i++) {
    double d = isfinite(ref[i]) ? (isfinite(got[i]) ? fabs((double)got[i] - ref[i]) : INFINITY)
                                : (got[i] == ref[i] ? 0.0 : INFINITY);
    if (d > thr) wrong++;
    if (d > worst || (at < 0 && d > thr)) worst = d, at = i;
  }
  if (rel_out && worst / (mx > 0 ? mx : 1) > *rel_out) *rel_out = worst / (mx > 0 ? mx : 1);
  if (wrong)
    fprintf(stderr, "rank %d: %s: %s vs %s: %lld of %lld wrong (tol %.2g x max %.3g); worst at "
            "%lld: got %.7g ref %.7g\n", g_rank, name, what, vs, (long long)wrong, (long long)n,
            tol, mx, (long long)at, at >= 0 ? got[at] : 0.0, at >= 0 ? ref[at] : 0.0);
  return wrong;
}

/* ---- one case ----------------------------------------------------------------------------- */
typedef struct {
  float *o, *lse, *dq, *dk, *dv, *ds; /* host copies, local rows (or full for single rank) */
} result;

static void free_result(result *r) {
  float *p[] = {r->o, r->lse, r->dq, r->dk, r->dv, r->ds};
  for (int i = 0; i < 6; i++) free(p[i]);
}

/* cu_seqlens of a varlen case in host memory ([nseq + 1], static: one case at a time). */
static const int32_t *host_cu(const rcase *c) {
  static int32_t cu[65];
  cu[0] = 0;
  for (int i = 0; i < c->nseq; i++) cu[i + 1] = cu[i] + c->lens[i];
  return cu;
}

/* cu is where the context wants it (host for cpu, device for cuda), or NULL. */
static attn_spec make_spec(const rcase *c, const float *sinks, const int32_t *cu) {
  attn_spec s = ATTN_SPEC_INIT;
  s.num_heads_q = c->Hq;
  s.num_heads_kv = c->Hkv;
  s.head_dim_qk = c->D;
  s.causal = c->causal;
  s.window_left = c->wl;
  s.window_right = c->wr;
  s.sinks = c->sinks ? sinks : NULL;
  if (c->nseq) {
    s.cu_seqlens_q = s.cu_seqlens_kv = cu;
    s.num_seqs = c->nseq;
  }
  return s;
}

/* The case's cu_seqlens in device memory (NULL without varlen). */
static void *device_cu(const rcase *c) {
  if (!c->nseq) return NULL;
  float tmp[65];
  memcpy(tmp, host_cu(c), (size_t)(c->nseq + 1) * 4); /* 4-byte elements, copied as bits */
  return up(tmp, c->nseq + 1, 0);
}

/* attn_fwd + attn_bwd on the CUDA context over the full problem (x: q, k, v, dout). */
static void single_gpu(const rcase *c, float *const x[4], const float *sinks, result *r) {
  const int64_t B = c->B, S = c->S, nq = B * S * c->Hq * c->D, nk = B * S * c->Hkv * c->D;
  void *q = up(x[0], nq, 1), *k = up(x[1], nk, 1), *v = up(x[2], nk, 1), *dout = up(x[3], nq, 1);
  void *o = up(NULL, nq, 1), *lse = up(NULL, B * c->Hq * S, 0), *dq = up(NULL, nq, 0);
  void *dk = up(NULL, nk, 0), *dv = up(NULL, nk, 0), *ds = up(NULL, c->Hq, 0);
  void *dsinks = c->sinks ? up(sinks, c->Hq, 0) : NULL, *cu = device_cu(c);
  attn_spec s = make_spec(c, dsinks, cu);
  attn_tensor tq = tens(q, ATTN_BF16, ATTN_DEVICE_CUDA, B, S, c->Hq, c->D);
  attn_tensor tk = tens(k, ATTN_BF16, ATTN_DEVICE_CUDA, B, S, c->Hkv, c->D);
  attn_tensor tv = tens(v, ATTN_BF16, ATTN_DEVICE_CUDA, B, S, c->Hkv, c->D);
  attn_tensor tdo = tens(dout, ATTN_BF16, ATTN_DEVICE_CUDA, B, S, c->Hq, c->D);
  attn_tensor to = tens(o, ATTN_BF16, ATTN_DEVICE_CUDA, B, S, c->Hq, c->D);
  attn_tensor tdq = tens(dq, ATTN_F32, ATTN_DEVICE_CUDA, B, S, c->Hq, c->D);
  attn_tensor tdk = tens(dk, ATTN_F32, ATTN_DEVICE_CUDA, B, S, c->Hkv, c->D);
  attn_tensor tdv = tens(dv, ATTN_F32, ATTN_DEVICE_CUDA, B, S, c->Hkv, c->D);
  if (attn_fwd(g_gpu, &s, &tq, &tk, &tv, &to, lse) != ATTN_OK) die("single-rank cuda attn_fwd");
  if (attn_bwd(g_gpu, &s, &tq, &tk, &tv, &to, lse, &tdo, &tdq, &tdk, &tdv, ds) != ATTN_OK)
    die("single-rank cuda attn_bwd");
  *r = (result){down(o, nq, 1), down(lse, B * c->Hq * S, 0), down(dq, nq, 0), down(dk, nk, 0),
                down(dv, nk, 0), down(ds, c->Hq, 0)};
  void *all[] = {q, k, v, dout, o, lse, dq, dk, dv, ds, dsinks, cu};
  for (int i = 0; i < 12; i++) attn_ctx_free(g_gpu, all[i]);
}

/* The ring on the CPU backend (float32 shards, host spec). */
static void ring_cpu(const rcase *c, float *const xl[4], const float *sinks,
                     const attn_cp_shard *sh, result *r) {
  const int64_t B = c->B, n = sh->rows, nq = B * n * c->Hq * c->D, nk = B * n * c->Hkv * c->D;
  attn_spec s = make_spec(c, sinks, host_cu(c));
  *r = (result){tu_falloc(nq), tu_falloc(B * c->Hq * n), tu_falloc(nq), tu_falloc(nk),
                tu_falloc(nk), tu_falloc(c->Hq)};
  attn_tensor tq = attn_tensor_f32(xl[0], B, n, c->Hq, c->D), tk = attn_tensor_f32(xl[1], B, n, c->Hkv, c->D);
  attn_tensor tv = attn_tensor_f32(xl[2], B, n, c->Hkv, c->D), tdo = attn_tensor_f32(xl[3], B, n, c->Hq, c->D);
  attn_tensor to = attn_tensor_f32(r->o, B, n, c->Hq, c->D), tdq = attn_tensor_f32(r->dq, B, n, c->Hq, c->D);
  attn_tensor tdk = attn_tensor_f32(r->dk, B, n, c->Hkv, c->D), tdv = attn_tensor_f32(r->dv, B, n, c->Hkv, c->D);
  if (attn_ring_fwd(g_cgrp, &s, c->layout, c->S, c->S, &tq, &tk, &tv, &to, r->lse) != ATTN_OK ||
      attn_ring_bwd(g_cgrp, &s, c->layout, c->S, c->S, &tq, &tk, &tv, &to, r->lse, &tdo, &tdq,
                    &tdk, &tdv, r->ds) != ATTN_OK)
    die("cpu ring");
}

/* The ring on the CUDA context (bf16 shards, device spec). Returns the status. */
static attn_status ring_gpu(const rcase *c, float *const xl[4], const float *sinks,
                            const attn_cp_shard *sh, result *r) {
  const int64_t B = c->B, n = sh->rows, nq = B * n * c->Hq * c->D, nk = B * n * c->Hkv * c->D;
  void *q = up(xl[0], nq, 1), *k = up(xl[1], nk, 1), *v = up(xl[2], nk, 1), *dout = up(xl[3], nq, 1);
  void *o = up(NULL, nq, 1), *lse = up(NULL, B * c->Hq * n, 0), *dq = up(NULL, nq, 0);
  void *dk = up(NULL, nk, 0), *dv = up(NULL, nk, 0), *ds = up(NULL, c->Hq, 0);
  void *dsinks = c->sinks ? up(sinks, c->Hq, 0) : NULL, *cu = device_cu(c);
  attn_spec s = make_spec(c, dsinks, cu);
  attn_tensor tq = tens(q, ATTN_BF16, ATTN_DEVICE_CUDA, B, n, c->Hq, c->D);
  attn_tensor tk = tens(k, ATTN_BF16, ATTN_DEVICE_CUDA, B, n, c->Hkv, c->D);
  attn_tensor tv = tens(v, ATTN_BF16, ATTN_DEVICE_CUDA, B, n, c->Hkv, c->D);
  attn_tensor tdo = tens(dout, ATTN_BF16, ATTN_DEVICE_CUDA, B, n, c->Hq, c->D);
  attn_tensor to = tens(o, ATTN_BF16, ATTN_DEVICE_CUDA, B, n, c->Hq, c->D);
  attn_tensor tdq = tens(dq, ATTN_F32, ATTN_DEVICE_CUDA, B, n, c->Hq, c->D);
  attn_tensor tdk = tens(dk, ATTN_F32, ATTN_DEVICE_CUDA, B, n, c->Hkv, c->D);
  attn_tensor tdv = tens(dv, ATTN_F32, ATTN_DEVICE_CUDA, B, n, c->Hkv, c->D);
  attn_status st = attn_ring_fwd(g_ggrp, &s, c->layout, c->S, c->S, &tq, &tk, &tv, &to, lse);
  if (st == ATTN_OK)
    st = attn_ring_bwd(g_ggrp, &s, c->layout, c->S, c->S, &tq, &tk, &tv, &to, lse, &tdo, &tdq,
                       &tdk, &tdv, ds);
  if (st != ATTN_OK)
    fprintf(stderr, "rank %d: %s: cuda ring: %s: %s\n", g_rank, c->name, attn_status_string(st),
            attn_last_error());
  *r = (result){down(o, nq, 1), down(lse, B * c->Hq * n, 0), down(dq, nq, 0), down(dk, nk, 0),
                down(dv, nk, 0), down(ds, c->Hq, 0)};
  void *all[] = {q, k, v, dout, o, lse, dq, dk, dv, ds, dsinks, cu};
  for (int i = 0; i < 12; i++) attn_ctx_free(g_gpu, all[i]);
  return st;
}

/* The step record of the last ring call: one entry per step, sane times. */
static int64_t check_steps(const rcase *c) {
  attn_ring_step st[64];
  int32_t n = 0;
  if (attn_group_last_steps(g_ggrp, st, 64, &n) != ATTN_OK || n != g_size) {
    fprintf(stderr, "rank %d: %s: %d steps recorded, %d expected\n", g_rank, c->name, n, g_size);
    return 1;
  }
  int64_t bad = 0;
  for (int s = 0; s < n; s++)
    if (!(st[s].compute_s >= 0 && st[s].wait_s >= 0 && st[s].bytes >= 0)) bad++;
  return bad;
}

static int run_case(const rcase *c) {
  const int64_t B = c->B, S = c->S, nq = B * S * c->Hq * c->D, nk = B * S * c->Hkv * c->D;
  float *x[4] = {tu_falloc(nq), tu_falloc(nk), tu_falloc(nk), tu_falloc(nq)};
  const int64_t nx[4] = {nq, nk, nk, nq};
  for (int i = 0; i < 4; i++) { /* random, then rounded to bf16: both backends see the same */
    tu_fill(x[i], nx[i], -1.5, 1.5, c->seed + (uint64_t)i);
    for (int64_t j = 0; j < nx[i]; j++) x[i][j] = from_bf16(to_bf16(x[i][j]));
  }
  float sinks[64];
  tu_fill(sinks, c->Hq, -1, 2.5, c->seed + 9);
  attn_cp_shard sh;
  attn_cp_shard_rows(c->layout, g_size, g_rank, S, &sh);
  const int64_t Hs[4] = {c->Hq, c->Hkv, c->Hkv, c->Hq};
  float *xl[4];
  for (int i = 0; i < 4; i++) xl[i] = gather(x[i], B, S, Hs[i], c->D, &sh);

  result one, cpu, gpu;
  single_gpu(c, x, sinks, &one);
  ring_cpu(c, xl, sinks, &sh, &cpu);
  int64_t failed = ring_gpu(c, xl, sinks, &sh, &gpu) != ATTN_OK, wrong = 0, steps_bad = 0;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  double rel[2] = {0, 0}; /* worst vs single-rank cuda, vs cpu ring */
  if (!failed) {
    steps_bad = check_steps(c);
    const int64_t n = sh.rows, lq = B * n * c->Hq * c->D, lk = B * n * c->Hkv * c->D;
    float *ref1[5] = {gather(one.o, B, S, c->Hq, c->D, &sh), gather_lse(one.lse, B * c->Hq, S, &sh),
                      gather(one.dq, B, S, c->Hq, c->D, &sh), gather(one.dk, B, S, c->Hkv, c->D, &sh),
                      gather(one.dv, B, S, c->Hkv, c->D, &sh)};
    float *got[5] = {gpu.o, gpu.lse, gpu.dq, gpu.dk, gpu.dv};
    float *ref2[5] = {cpu.o, cpu.lse, cpu.dq, cpu.dk, cpu.dv};
    const char *what[5] = {"o", "lse", "dq", "dk", "dv"};
    const int64_t len[5] = {lq, B * c->Hq * n, lq, lk, lk};
    const double tol[5] = {TOL_O, TOL_LSE, TOL_GRAD, TOL_GRAD, TOL_GRAD};
    for (int i = 0; i < 5; i++) {
      wrong += count_wrong(what[i], "single-rank cuda", c->name, got[i], ref1[i], len[i], tol[i], &rel[0]);
      wrong += count_wrong(what[i], "cpu ring", c->name, got[i], ref2[i], len[i], tol[i], &rel[1]);
      free(ref1[i]);
    }
    if (c->sinks) {
      wrong += count_wrong("dsinks", "single-rank cuda", c->name, gpu.ds, one.ds, c->Hq, TOL_GRAD, &rel[0]);
      wrong += count_wrong("dsinks", "cpu ring", c->name, gpu.ds, cpu.ds, c->Hq, TOL_GRAD, &rel[1]);
      float *all = tu_alloc((size_t)g_size * (size_t)c->Hq * sizeof(float));
      MPI_Allgather(gpu.ds, c->Hq, MPI_FLOAT, all, c->Hq, MPI_FLOAT, MPI_COMM_WORLD);
      for (int p = 1; p < g_size; p++)
        if (memcmp(all, all + (size_t)p * c->Hq, (size_t)c->Hq * sizeof(float))) {
          fprintf(stderr, "rank %d: %s: dsinks differ between ranks 0 and %d\n", g_rank, c->name, p);
          wrong++;
        }
      free(all);
    }
  }
  int64_t local[2] = {wrong + (g_rank == 0 ? failed : 0), steps_bad}, total[2];
  double worst[2];
  MPI_Allreduce(local, total, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(rel, worst, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (g_rank == 0)
    printf("%-4s %-44s np=%d wrong=%lld steps-bad=%lld  max rel err vs single-rank cuda %.1e, "
           "vs cpu ring %.1e\n", total[0] || total[1] ? "FAIL" : "ok", c->name, g_size,
           (long long)total[0], (long long)total[1], worst[0], worst[1]);
  free_result(&one);
  free_result(&cpu);
  free_result(&gpu);
  for (int i = 0; i < 4; i++) free(x[i]), free(xl[i]);
  return !total[0] && !total[1];
}

static int part_ring(void) {
  const int64_t S = EMULATED ? 96 : 1030, B = EMULATED ? 1 : 2;
  const int D = EMULATED ? 64 : 128;
  const int32_t lens[4] = {(int32_t)(S / 3), 1, (int32_t)(S / 2), (int32_t)(S - S / 3 - 1 - S / 2)};
  const rcase cases[] = {
      {"zigzag causal GQA 4/2", ATTN_LAYOUT_ZIGZAG, B, S, 4, 2, D, 1, -1, -1, 0, 11, 0, NULL},
      {"zigzag causal GQA 4/2 + sinks", ATTN_LAYOUT_ZIGZAG, B, S, 4, 2, D, 1, -1, -1, 1, 12, 0, NULL},
      {"zigzag causal window 40 (< chunk) + sinks", ATTN_LAYOUT_ZIGZAG, B, S, 4, 2, D, 1, 40, -1, 1, 13, 0, NULL},
      {"contiguous causal window (30, 0), MQA 4/1", ATTN_LAYOUT_CONTIGUOUS, B, S, 4, 1, D, 1, 30, 0, 0, 14, 0, NULL},
      {"contiguous full, two-sided window (50, 20)", ATTN_LAYOUT_CONTIGUOUS, B, S, 4, 2, D, 0, 50, 20, 1, 15, 0, NULL},
      {"zigzag full (no mask), MQA 2/1", ATTN_LAYOUT_ZIGZAG, B, S, 2, 1, D, 0, -1, -1, 0, 16, 0, NULL},
      {"varlen zigzag causal + sinks", ATTN_LAYOUT_ZIGZAG, 1, S, 4, 2, D, 1, -1, -1, 1, 17, 4, lens},
      {"varlen contiguous causal window 20", ATTN_LAYOUT_CONTIGUOUS, 1, S, 4, 2, D, 1, 20, -1, 0, 18, 4, lens},
  };
  int ok = 1;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) ok &= run_case(&cases[i]);
  return ok;
}

/* ---- set-up ----------------------------------------------------------------------------- */
/* 1 when every rank has a CUDA context; else all skip together (exit 77). */
static int gpu_everywhere(void) {
  attn_ctx_config cc = ATTN_CTX_CONFIG_INIT;
  cc.backend = ATTN_BACKEND_CUDA;
  int mine = attn_ctx_create(&g_gpu, &cc) == ATTN_OK, all = 0;
  if (!mine) printf("rank %d: no CUDA context: %s\n", g_rank, attn_last_error());
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  const char *part = argc > 1 ? argv[1] : "ring";
  if (!gpu_everywhere()) {
    attn_ctx_destroy(g_gpu);
    MPI_Finalize();
    return 77;
  }
  attn_group_config gc = ATTN_GROUP_CONFIG_INIT;
  gc.cp = g_size;
  gc.timeout_s = 120;
  MPI_Comm world = MPI_COMM_WORLD;
  attn_status st = attn_group_create(&g_ggrp, g_gpu, &world, &gc);
  const char *forced = getenv("ATTN_COMM");
  int ok;
  if (!strcmp(part, "refuse")) { /* every rank must refuse, with the reason */
    int mine = st == ATTN_ERR_UNSUPPORTED, all = 0;
    printf("rank %d: attn_group_create: %s: %s\n", g_rank, attn_status_string(st), attn_last_error());
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    ok = all;
  } else if (st != ATTN_OK) {
    int skip = st == ATTN_ERR_UNSUPPORTED && forced && !strcmp(forced, "nccl");
    fprintf(stderr, "rank %d: attn_group_create on the cuda context: %s: %s%s\n", g_rank,
            attn_status_string(st), attn_last_error(), skip ? " (skipped)" : "");
    attn_ctx_destroy(g_gpu);
    MPI_Finalize();
    return skip ? 77 : 1;
  } else {
    attn_ctx_config cc = ATTN_CTX_CONFIG_INIT;
    cc.backend = ATTN_BACKEND_CPU;
    cc.num_threads = 1;
    if (attn_ctx_create(&g_cpu, &cc) != ATTN_OK || attn_group_create(&g_cgrp, g_cpu, &world, &gc) != ATTN_OK)
      die("cpu set-up");
    if (g_rank == 0) printf("cuda ring on %d rank(s)%s%s\n", g_size, forced ? ", ATTN_COMM=" : "", forced ? forced : "");
    ok = !strcmp(part, "ring") ? part_ring() : -1;
    if (ok < 0 && g_rank == 0) fprintf(stderr, "usage: test_cuda_ring ring|refuse\n");
  }
  attn_group_destroy(g_cgrp);
  attn_group_destroy(g_ggrp);
  attn_ctx_destroy(g_cpu);
  attn_ctx_destroy(g_gpu);
  MPI_Finalize();
  if (g_rank == 0) printf("test_cuda_ring %s: %s\n", part, ok == 1 ? "passed" : "FAILED");
  return ok == 1 ? 0 : 1;
}
