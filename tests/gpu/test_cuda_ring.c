/* test_cuda_ring.c — ring attention (attn_ring_fwd / attn_ring_bwd) on a CUDA context, with
 * bf16 or fp16 inputs, under mpiexec: ranks sharing one GPU (the MPI-staged transport) or
 * one GPU per rank (NCCL, ATTN_COMM=nccl). Each rank regenerates the full problem, rounds it
 * to the case's dtype, and compares its shard of the CUDA ring's O, LSE, dQ, dK, dV and
 * d(sinks) against
 *   (a) single-rank attn_fwd / attn_bwd on the same CUDA context over the full problem, and
 *   (b) the CPU backend's ring on the same rounded inputs (float32),
 * counting wrong elements per rank; the verdict is agreed with an allreduce. Cases: causal
 * zigzag and contiguous, windows (one shorter than a chunk: blocks not sent), GQA / MQA,
 * sinks on and off, varlen (device cu_seqlens), block masks (device mask; block sizes that
 * are no multiple of a tile), ALiBi with softcap, fp16; the step record must have one entry
 * per step.
 *
 * Built twice: against libattnrun (label gpu; exits 77 when no CUDA device is visible, or
 * when ATTN_COMM=nccl is forced on ranks that share a GPU) and against the emulated library
 * variant (ATTN_TEST_EMULATED, label emu: small shapes). Parts: ring (the comparison) and
 * refuse (group creation must fail with UNSUPPORTED on every rank: ATTN_COMM=nccl where the
 * build has no NCCL). Inputs and outputs move through attn_ctx_alloc / attn_ctx_copy only. */
#include "attnrun.h"
#include "gpu_test.h"
#include "test_util.h"

#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

/* Tolerances relative to max |ref| of each tensor (those of test_cuda_runtime: bf16 output
 * rounding is 2^-9 relative and P is rounded to bf16 inside the kernels; fp16 is finer). */
#define TOL_O 1.6e-2
#define TOL_LSE 1e-3
#define TOL_GRAD 3e-2

static int g_rank, g_size;
static attn_ctx_t g_gpu, g_cpu;
static attn_group_t g_ggrp, g_cgrp;

enum { F_F16 = 1, F_ALIBI = 2, F_SOFTCAP = 4, F_BMASK = 8 }; /* rcase.feat */

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
  int feat;            /* F_*: fp16 instead of bf16, ALiBi, softcap 5, a block mask */
} rcase;

static attn_dtype case_dt(const rcase *c) { return c->feat & F_F16 ? ATTN_F16 : ATTN_BF16; }

/* ---- context memory ------------------------------------------------------------------- */
static void die(const char *what) {
  fprintf(stderr, "rank %d: %s: %s\n", g_rank, what, attn_last_error());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Raw bytes into fresh context memory. */
static void *up_bytes(const void *h, size_t bytes) {
  void *d = NULL;
  if (attn_ctx_alloc(g_gpu, bytes ? bytes : 1, &d) != ATTN_OK) die("attn_ctx_alloc");
  if (bytes && attn_ctx_copy(g_gpu, d, h, bytes, ATTN_COPY_HOST_TO_CTX) != ATTN_OK) die("upload");
  return d;
}

/* n elements of dtype dt in context memory, converted from host floats, or poisoned (0xFF
 * bytes: NaN in every dtype) when x is NULL. */
static void *up(const float *x, int64_t n, attn_dtype dt) {
  const size_t es = attn_dtype_size(dt), bytes = (size_t)n * es;
  void *h = tu_alloc(bytes ? bytes : 1);
  if (!x) memset(h, 0xFF, bytes);
  else if (dt == ATTN_F32) memcpy(h, x, bytes);
  else
    for (int64_t i = 0; i < n; i++)
      ((uint16_t *)h)[i] = dt == ATTN_BF16 ? gt_to_bf16(x[i]) : gt_to_f16(x[i]);
  void *d = up_bytes(h, bytes);
  free(h);
  return d;
}

/* n elements of dtype dt of context memory back to host floats. */
static float *down(const void *d, int64_t n, attn_dtype dt) {
  float *x = tu_falloc(n > 0 ? n : 1);
  if (dt == ATTN_F32) {
    if (attn_ctx_copy(g_gpu, x, d, (size_t)n * 4, ATTN_COPY_CTX_TO_HOST) != ATTN_OK) die("download");
    return x;
  }
  uint16_t *h = tu_alloc((size_t)n * 2 + 2);
  if (attn_ctx_copy(g_gpu, h, d, (size_t)n * 2, ATTN_COPY_CTX_TO_HOST) != ATTN_OK) die("download");
  for (int64_t i = 0; i < n; i++) x[i] = dt == ATTN_BF16 ? gt_from_bf16(h[i]) : gt_from_f16(h[i]);
  free(h);
  return x;
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

/* The spec's arrays of a case in host memory (one case at a time). */
typedef struct {
  float sinks[64], alibi[64];
  int32_t cu[65];       /* varlen prefix sums */
  attn_block_mask bm;   /* bm.mask = mask (NULL without F_BMASK) */
  uint8_t *mask;
} host_arrays;

static void host_arrays_init(const rcase *c, host_arrays *h) {
  memset(h, 0, sizeof *h);
  tu_fill(h->sinks, c->Hq, -1, 2.5, c->seed + 9);
  tu_fill(h->alibi, c->Hq, 0.002, 0.05, c->seed + 10);
  for (int i = 0; i < c->nseq; i++) h->cu[i + 1] = h->cu[i] + c->lens[i];
  if (!(c->feat & F_BMASK)) return;
  const int32_t blk = EMULATED ? 20 : 72; /* no multiple of any kernel tile */
  const int64_t nb = (c->S + blk - 1) / blk; /* global positions (not varlen here) */
  h->bm = (attn_block_mask){blk, blk, nb, nb, NULL};
  h->mask = tu_alloc((size_t)(nb * nb));
  const attn_sparse_pattern pat = {1, 3, 1, 1, c->seed + 11}; /* local, strided, global, random */
  if (attn_block_mask_fill(&h->bm, h->mask, &pat) != ATTN_OK) die("attn_block_mask_fill");
}

/* The case's spec over arrays where the context wants them (host for cpu, device for cuda):
 * sinks, alibi, cu, mask may be NULL when the case does not use them. */
static attn_spec make_spec(const rcase *c, const float *sinks, const float *alibi,
                           const int32_t *cu, attn_block_mask *bm, const uint8_t *mask) {
  attn_spec s = ATTN_SPEC_INIT;
  s.num_heads_q = c->Hq;
  s.num_heads_kv = c->Hkv;
  s.head_dim_qk = c->D;
  s.causal = c->causal;
  s.window_left = c->wl;
  s.window_right = c->wr;
  s.sinks = c->sinks ? sinks : NULL;
  s.alibi_slopes = c->feat & F_ALIBI ? alibi : NULL;
  s.softcap = c->feat & F_SOFTCAP ? 5.0f : 0.0f;
  if (c->nseq) {
    s.cu_seqlens_q = s.cu_seqlens_kv = cu;
    s.num_seqs = c->nseq;
  }
  if (mask) {
    bm->mask = mask;
    s.block_mask = bm;
  }
  return s;
}

/* One problem on the CUDA context: inputs in the case's dtype, outputs poisoned, spec
 * arrays in device memory. */
typedef struct {
  void *buf[14]; /* q k v dout o lse dq dk dv ds sinks alibi cu mask */
  attn_block_mask bm;
  attn_spec spec;
  attn_tensor q, k, v, dout, o, dq, dk, dv;
  int64_t nq, nk, nl;
  attn_dtype dt;
} dev_prob;

/* x: q, k, v, dout of B x n rows. */
static void dev_setup(const rcase *c, float *const x[4], int64_t n, const host_arrays *h,
                      dev_prob *d) {
  const int64_t B = c->B, Hq = c->Hq, Hkv = c->Hkv, D = c->D;
  const attn_dtype dt = case_dt(c);
  const attn_device dev = ATTN_DEVICE_CUDA;
  d->dt = dt, d->nq = B * n * Hq * D, d->nk = B * n * Hkv * D, d->nl = B * Hq * n;
  void **p = d->buf;
  p[0] = up(x[0], d->nq, dt), p[1] = up(x[1], d->nk, dt), p[2] = up(x[2], d->nk, dt);
  p[3] = up(x[3], d->nq, dt), p[4] = up(NULL, d->nq, dt), p[5] = up(NULL, d->nl, ATTN_F32);
  p[6] = up(NULL, d->nq, ATTN_F32), p[7] = up(NULL, d->nk, ATTN_F32);
  p[8] = up(NULL, d->nk, ATTN_F32), p[9] = up(NULL, Hq, ATTN_F32);
  p[10] = c->sinks ? up(h->sinks, Hq, ATTN_F32) : NULL;
  p[11] = c->feat & F_ALIBI ? up(h->alibi, Hq, ATTN_F32) : NULL;
  p[12] = c->nseq ? up_bytes(h->cu, (size_t)(c->nseq + 1) * 4) : NULL;
  p[13] = h->mask ? up_bytes(h->mask, (size_t)(h->bm.num_q_blocks * h->bm.num_k_blocks)) : NULL;
  d->bm = h->bm;
  d->spec = make_spec(c, p[10], p[11], p[12], &d->bm, p[13]);
  d->q = attn_tensor_contig(p[0], dt, dev, B, n, Hq, D);
  d->k = attn_tensor_contig(p[1], dt, dev, B, n, Hkv, D);
  d->v = attn_tensor_contig(p[2], dt, dev, B, n, Hkv, D);
  d->dout = attn_tensor_contig(p[3], dt, dev, B, n, Hq, D);
  d->o = attn_tensor_contig(p[4], dt, dev, B, n, Hq, D);
  d->dq = attn_tensor_contig(p[6], ATTN_F32, dev, B, n, Hq, D);
  d->dk = attn_tensor_contig(p[7], ATTN_F32, dev, B, n, Hkv, D);
  d->dv = attn_tensor_contig(p[8], ATTN_F32, dev, B, n, Hkv, D);
}

/* Downloads the outputs and frees every buffer. */
static void dev_finish(const rcase *c, dev_prob *d, result *r) {
  void **p = d->buf;
  *r = (result){down(p[4], d->nq, d->dt), down(p[5], d->nl, ATTN_F32), down(p[6], d->nq, ATTN_F32),
                down(p[7], d->nk, ATTN_F32), down(p[8], d->nk, ATTN_F32), down(p[9], c->Hq, ATTN_F32)};
  for (int i = 0; i < 14; i++) attn_ctx_free(g_gpu, p[i]);
}

/* attn_fwd + attn_bwd on the CUDA context over the full problem (x: q, k, v, dout). */
static void single_gpu(const rcase *c, float *const x[4], const host_arrays *h, result *r) {
  dev_prob d;
  dev_setup(c, x, c->S, h, &d);
  if (attn_fwd(g_gpu, &d.spec, &d.q, &d.k, &d.v, &d.o, d.buf[5]) != ATTN_OK)
    die("single-rank cuda attn_fwd");
  if (attn_bwd(g_gpu, &d.spec, &d.q, &d.k, &d.v, &d.o, d.buf[5], &d.dout, &d.dq, &d.dk, &d.dv,
               d.buf[9]) != ATTN_OK)
    die("single-rank cuda attn_bwd");
  dev_finish(c, &d, r);
}

/* The ring on the CUDA context (shards in the case's dtype, device spec). Returns the status. */
static attn_status ring_gpu(const rcase *c, float *const xl[4], const host_arrays *h,
                            const attn_cp_shard *sh, result *r) {
  dev_prob d;
  dev_setup(c, xl, sh->rows, h, &d);
  attn_status st = attn_ring_fwd(g_ggrp, &d.spec, c->layout, c->S, c->S, &d.q, &d.k, &d.v, &d.o,
                                 d.buf[5]);
  if (st == ATTN_OK)
    st = attn_ring_bwd(g_ggrp, &d.spec, c->layout, c->S, c->S, &d.q, &d.k, &d.v, &d.o, d.buf[5],
                       &d.dout, &d.dq, &d.dk, &d.dv, d.buf[9]);
  if (st != ATTN_OK)
    fprintf(stderr, "rank %d: %s: cuda ring: %s: %s\n", g_rank, c->name, attn_status_string(st),
            attn_last_error());
  dev_finish(c, &d, r);
  return st;
}

/* The ring on the CPU backend (float32 shards, host spec). */
static void ring_cpu(const rcase *c, float *const xl[4], host_arrays *h,
                     const attn_cp_shard *sh, result *r) {
  const int64_t B = c->B, n = sh->rows, nq = B * n * c->Hq * c->D, nk = B * n * c->Hkv * c->D;
  attn_spec s = make_spec(c, h->sinks, h->alibi, h->cu, &h->bm, h->mask);
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

/* The step record of the last ring call: one entry per step, sane times, and a step that
 * computed a block took some time (its events were read). */
static int64_t check_steps(const rcase *c) {
  attn_ring_step st[64];
  int32_t n = 0;
  if (attn_group_last_steps(g_ggrp, st, 64, &n) != ATTN_OK || n != g_size) {
    fprintf(stderr, "rank %d: %s: %d steps recorded, %d expected\n", g_rank, c->name, n, g_size);
    return 1;
  }
  int64_t bad = 0;
  for (int s = 0; s < n; s++)
    if (!(st[s].compute_s >= 0 && st[s].wait_s >= 0 && st[s].bytes >= 0) ||
        (st[s].computed && !(st[s].compute_s > 0))) {
      fprintf(stderr, "rank %d: %s: step %d: compute %g s, wait %g s, %lld bytes, computed %d\n",
              g_rank, c->name, s, st[s].compute_s, st[s].wait_s, (long long)st[s].bytes,
              st[s].computed);
      bad++;
    }
  return bad;
}

/* Wrong elements of this rank's ring shard vs the single-rank result (one, full rows) and
 * the cpu ring; rel gets the worst relative errors of each comparison. */
static int64_t compare(const rcase *c, const attn_cp_shard *sh, const result *gpu,
                       const result *one, const result *cpu, double rel[2]) {
  const int64_t B = c->B, S = c->S, n = sh->rows, lq = B * n * c->Hq * c->D, lk = B * n * c->Hkv * c->D;
  float *ref1[5] = {gather(one->o, B, S, c->Hq, c->D, sh), gather_lse(one->lse, B * c->Hq, S, sh),
                    gather(one->dq, B, S, c->Hq, c->D, sh), gather(one->dk, B, S, c->Hkv, c->D, sh),
                    gather(one->dv, B, S, c->Hkv, c->D, sh)};
  float *got[5] = {gpu->o, gpu->lse, gpu->dq, gpu->dk, gpu->dv};
  float *ref2[5] = {cpu->o, cpu->lse, cpu->dq, cpu->dk, cpu->dv};
  const char *what[5] = {"o", "lse", "dq", "dk", "dv"};
  const int64_t len[5] = {lq, B * c->Hq * n, lq, lk, lk};
  const double tol[5] = {TOL_O, TOL_LSE, TOL_GRAD, TOL_GRAD, TOL_GRAD};
  int64_t wrong = 0;
  for (int i = 0; i < 5; i++) {
    wrong += count_wrong(what[i], "single-rank cuda", c->name, got[i], ref1[i], len[i], tol[i], &rel[0]);
    wrong += count_wrong(what[i], "cpu ring", c->name, got[i], ref2[i], len[i], tol[i], &rel[1]);
    free(ref1[i]);
  }
  if (!c->sinks) return wrong;
  wrong += count_wrong("dsinks", "single-rank cuda", c->name, gpu->ds, one->ds, c->Hq, TOL_GRAD, &rel[0]);
  wrong += count_wrong("dsinks", "cpu ring", c->name, gpu->ds, cpu->ds, c->Hq, TOL_GRAD, &rel[1]);
  float *all = tu_alloc((size_t)g_size * (size_t)c->Hq * sizeof(float));
  MPI_Allgather(gpu->ds, c->Hq, MPI_FLOAT, all, c->Hq, MPI_FLOAT, MPI_COMM_WORLD);
  for (int p = 1; p < g_size; p++)
    if (memcmp(all, all + (size_t)p * c->Hq, (size_t)c->Hq * sizeof(float))) {
      fprintf(stderr, "rank %d: %s: dsinks differ between ranks 0 and %d\n", g_rank, c->name, p);
      wrong++;
    }
  free(all);
  return wrong;
}

static int run_case(const rcase *c) {
  const int64_t B = c->B, S = c->S, nq = B * S * c->Hq * c->D, nk = B * S * c->Hkv * c->D;
  float *x[4] = {tu_falloc(nq), tu_falloc(nk), tu_falloc(nk), tu_falloc(nq)};
  const int64_t nx[4] = {nq, nk, nk, nq};
  for (int i = 0; i < 4; i++) { /* random, then rounded to the dtype: both backends see the same */
    tu_fill(x[i], nx[i], -1.5, 1.5, c->seed + (uint64_t)i);
    for (int64_t j = 0; j < nx[i]; j++) x[i][j] = gt_round(x[i][j], case_dt(c));
  }
  host_arrays h;
  host_arrays_init(c, &h);
  attn_cp_shard sh;
  attn_cp_shard_rows(c->layout, g_size, g_rank, S, &sh);
  const int64_t Hs[4] = {c->Hq, c->Hkv, c->Hkv, c->Hq};
  float *xl[4];
  for (int i = 0; i < 4; i++) xl[i] = gather(x[i], B, S, Hs[i], c->D, &sh);

  result one, cpu, gpu;
  single_gpu(c, x, &h, &one);
  ring_cpu(c, xl, &h, &sh, &cpu);
  int64_t failed = ring_gpu(c, xl, &h, &sh, &gpu) != ATTN_OK, wrong = 0, steps_bad = 0;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  double rel[2] = {0, 0}; /* worst vs single-rank cuda, vs cpu ring */
  if (!failed) {
    steps_bad = check_steps(c);
    wrong = compare(c, &sh, &gpu, &one, &cpu, rel);
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
  free(h.mask);
  for (int i = 0; i < 4; i++) free(x[i]), free(xl[i]);
  return !total[0] && !total[1];
}

static int part_ring(void) {
  const int64_t S = EMULATED ? 96 : 1030, B = EMULATED ? 1 : 2;
  const int D = EMULATED ? 64 : 128;
  const int32_t lens[4] = {(int32_t)(S / 3), 1, (int32_t)(S / 2), (int32_t)(S - S / 3 - 1 - S / 2)};
  const rcase cases[] = {
      {"zigzag causal GQA 4/2", ATTN_LAYOUT_ZIGZAG, B, S, 4, 2, D, 1, -1, -1, 0, 11, 0, NULL, 0},
      {"zigzag causal GQA 4/2 + sinks", ATTN_LAYOUT_ZIGZAG, B, S, 4, 2, D, 1, -1, -1, 1, 12, 0, NULL, 0},
      {"zigzag causal window 40 (< chunk) + sinks", ATTN_LAYOUT_ZIGZAG, B, S, 4, 2, D, 1, 40, -1, 1, 13, 0, NULL, 0},
      {"contiguous causal window (30, 0), MQA 4/1", ATTN_LAYOUT_CONTIGUOUS, B, S, 4, 1, D, 1, 30, 0, 0, 14, 0, NULL, 0},
      {"contiguous full, two-sided window (50, 20)", ATTN_LAYOUT_CONTIGUOUS, B, S, 4, 2, D, 0, 50, 20, 1, 15, 0, NULL, 0},
      {"zigzag full (no mask), MQA 2/1", ATTN_LAYOUT_ZIGZAG, B, S, 2, 1, D, 0, -1, -1, 0, 16, 0, NULL, 0},
      {"varlen zigzag causal + sinks", ATTN_LAYOUT_ZIGZAG, 1, S, 4, 2, D, 1, -1, -1, 1, 17, 4, lens, 0},
      {"varlen contiguous causal window 20", ATTN_LAYOUT_CONTIGUOUS, 1, S, 4, 2, D, 1, 20, -1, 0, 18, 4, lens, 0},
      {"zigzag causal block mask + sinks", ATTN_LAYOUT_ZIGZAG, B, S, 4, 2, D, 1, -1, -1, 1, 19, 0, NULL, F_BMASK},
      {"contiguous full block mask, MQA 2/1", ATTN_LAYOUT_CONTIGUOUS, B, S, 2, 1, D, 0, -1, -1, 0, 20, 0, NULL, F_BMASK},
      {"zigzag causal ALiBi + softcap 5 + sinks", ATTN_LAYOUT_ZIGZAG, B, S, 4, 2, D, 1, -1, -1, 1, 21, 0, NULL, F_ALIBI | F_SOFTCAP},
      {"fp16 zigzag causal window 40 + sinks", ATTN_LAYOUT_ZIGZAG, B, S, 4, 2, D, 1, 40, -1, 1, 22, 0, NULL, F_F16},
      {"fp16 varlen contiguous ALiBi + block mask", ATTN_LAYOUT_CONTIGUOUS, 1, S, 4, 2, D, 1, -1, -1, 0, 23, 4, lens, F_F16 | F_ALIBI | F_BMASK},
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
