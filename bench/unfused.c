/* unfused.c — the baselines: attention with materialised N×N scores through cblas_sgemm,
 * one head at a time, as a framework's "math" path computes it; its decode form (a few
 * query rows per head, the group's heads in one GEMM); and a plain read of an array, the
 * memory floor of decode.
 *
 * Forward: S = scale·Q Kᵀ, P = softmax(mask(S)), O = P V. Backward recomputes P from the
 * LSE (as flash does, so its FLOPs follow the same 2.5× rule): dV = Pᵀ dO, dP = dO Vᵀ,
 * dS = P∘(dP − rowsum(dO∘O)), dQ = scale·dS K, dK = scale·dSᵀ Q. The causal mask zeroes
 * the upper triangle of the full product; no tile is skipped. The row passes run on
 * OpenMP threads; this file is built with -ffast-math so that expf vectorises (libmvec),
 * which keeps the baseline honest rather than bound by scalar expf. */
#include "bench.h"

#include <cblas.h>
#include <float.h>
#include <math.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define BENCH_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define BENCH_CLONES
#endif

/* Scores row [n] -> probabilities in place; keys j >= len are masked (-> 0).
 * Returns the row's natural-log LSE. len >= 1. */
BENCH_CLONES static float softmax_row(float *s, int64_t len, int64_t n) {
  float m = -FLT_MAX, sum = 0.0f;
  for (int64_t j = 0; j < len; j++) m = s[j] > m ? s[j] : m;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < len; j++) {
    s[j] = expf(s[j] - m);
    sum += s[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < len; j++) s[j] *= inv;
  for (int64_t j = len; j < n; j++) s[j] = 0.0f;
  return m + logf(sum);
}

/* Scores row -> P (from the LSE) in s; dP row -> dS = P∘(dP − delta) in ds. */
BENCH_CLONES static void grad_row(float *s, float *ds, int64_t len, int64_t n, float lse,
                                  float delta) {
#pragma omp simd
  for (int64_t j = 0; j < len; j++) {
    s[j] = expf(s[j] - lse);
    ds[j] = s[j] * (ds[j] - delta);
  }
  for (int64_t j = len; j < n; j++) s[j] = ds[j] = 0.0f;
}

void unfused_fwd(const bench_problem *p, float *s /* [n, n] */) {
  const int n = (int)p->n, d = (int)p->d, ld = (int)(p->h * p->d);
  const float scale = 1.0f / sqrtf((float)p->d);
  for (int64_t h = 0; h < p->h; h++) {
    const int64_t off = h * p->d;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, d, scale, p->q + off, ld,
                p->k + off, ld, 0.0f, s, n);
    float *lse = p->lse + h * p->n; /* [n] */
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t i = 0; i < n; i++)
      lse[i] = softmax_row(s + i * (int64_t)n, p->causal ? i + 1 : n, n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, n, 1.0f, s, n, p->v + off,
                ld, 0.0f, p->o + off, ld);
  }
}

void unfused_bwd(const bench_problem *p, float *s /* [n, n] */, float *ds /* [n, n] */) {
  const int n = (int)p->n, d = (int)p->d, ld = (int)(p->h * p->d);
  const float scale = 1.0f / sqrtf((float)p->d);
  for (int64_t h = 0; h < p->h; h++) {
    const int64_t off = h * p->d;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, d, scale, p->q + off, ld,
                p->k + off, ld, 0.0f, s, n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, d, 1.0f, p->dout + off, ld,
                p->v + off, ld, 0.0f, ds, n);
    const float *lse = p->lse + h * p->n; /* [n] */
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t i = 0; i < n; i++) {
      const float *o = p->o + i * ld + off, *g = p->dout + i * ld + off;
      float delta = 0.0f;
      for (int64_t c = 0; c < d; c++) delta += o[c] * g[c];
      grad_row(s + i * (int64_t)n, ds + i * (int64_t)n, p->causal ? i + 1 : n, n, lse[i],
               delta);
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, d, n, 1.0f, s, n, p->dout + off,
                ld, 0.0f, p->dv + off, ld);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, n, scale, ds, n, p->k + off,
                ld, 0.0f, p->dq + off, ld);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, d, n, scale, ds, n, p->q + off,
                ld, 0.0f, p->dk + off, ld);
  }
}

void unfused_decode(const float *q, const float *k, const float *v, float *o, int64_t sq,
                    int64_t skv, int64_t hq, int64_t hkv, int64_t d, float *s /* [hq*sq, skv + d] */) {
  const int64_t G = hq / hkv, rows = G * sq, n = hq * sq;
  const float scale = 1.0f / sqrtf((float)d);
  float *qg = s + n * skv; /* [hkv][G*sq][d] Q rows of each group, then O rows */
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t i = 0; i < sq; i++)
    for (int64_t h = 0; h < hq; h++) {
      float *dst = qg + ((h / G) * rows + (h % G) * sq + i) * d; /* [d] */
      for (int64_t c = 0; c < d; c++) dst[c] = q[(i * hq + h) * d + c];
    }
  for (int64_t g = 0; g < hkv; g++)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)skv, (int)d, scale,
                qg + g * rows * d, (int)d, k + g * d, (int)(hkv * d), 0.0f, s + g * rows * skv,
                (int)skv);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t r = 0; r < n; r++) softmax_row(s + r * skv, skv, skv);
  for (int64_t g = 0; g < hkv; g++)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)d, (int)skv, 1.0f,
                s + g * rows * skv, (int)skv, v + g * d, (int)(hkv * d), 0.0f, qg + g * rows * d,
                (int)d);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t i = 0; i < sq; i++)
    for (int64_t h = 0; h < hq; h++) {
      const float *src = qg + ((h / G) * rows + (h % G) * sq + i) * d; /* [d] */
      for (int64_t c = 0; c < d; c++) o[(i * hq + h) * d + c] = src[c];
    }
}

BENCH_CLONES float bench_read_sum(const float *x, int64_t n) {
  float sum = 0.0f;
#pragma omp parallel for simd reduction(+ : sum) schedule(static)
  for (int64_t i = 0; i < n; i++) sum += x[i];
  return sum;
}
