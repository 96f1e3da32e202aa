/* bench.h — what the CPU benchmark's files share: one attention problem, its check
 * against the float64 oracle, and the BLAS-based unfused attention it is compared with. */
#ifndef ATTN_BENCH_H
#define ATTN_BENCH_H

#include <stdint.h>
#include <stdio.h>

#include "attnrun.h"

/* One self-attention problem, B = 1, Sq = Skv = n, Hq = Hkv = h, Dqk = Dv = d. */
typedef struct {
  int64_t n, h, d;
  int causal;
  float *q, *k, *v, *dout;  /* [1, n, h, d] inputs */
  float *o, *dq, *dk, *dv;  /* [1, n, h, d] outputs */
  float *lse;               /* [1, h, n] */
} bench_problem;

/* Max |out - ref| / max|ref| of O over a few sampled query rows, the reference computed
 * in float64 by kernels/ref. */
double bench_check_fwd(const bench_problem *p);
/* The same for dQ over sampled query rows and, when the float64 cost is small
 * (*with_k set to 1 on return), dK and dV over sampled key rows. */
double bench_check_bwd(const bench_problem *p, int *with_k);

/* Unfused attention with materialised [n, n] scores, one head at a time, through
 * cblas_sgemm; the causal mask is applied to the full product. Forward writes o and lse;
 * backward (needs o, lse, dout) writes dq, dk, dv. Scratch: s (fwd) and s, ds (bwd),
 * each n*n floats. */
void unfused_fwd(const bench_problem *p, float *s);
void unfused_bwd(const bench_problem *p, float *s, float *ds);

/* Unfused decode: for each KV head, S = scale·Q_g Kᵀ over its query heads' rows through
 * cblas_sgemm (K strided in place), one softmax pass over every row, O_g = P V. q, o
 * [1, sq, hq, d]; k, v [1, skv, hkv, d]; s [hq*sq, skv + d] scratch. */
void unfused_decode(const float *q, const float *k, const float *v, float *o, int64_t sq,
                    int64_t skv, int64_t hq, int64_t hkv, int64_t d, float *s);
/* Sum of x [n] (vectorised, OpenMP threads): reading n floats once, the memory floor. */
float bench_read_sum(const float *x, int64_t n);

/* ---- timing (timing.c) ------------------------------------------------------------------ */
typedef struct {
  double med, min;
  int reps;
} bench_timing;
typedef void (*bench_run_fn)(void *arg);
double bench_now_s(void); /* CLOCK_MONOTONIC */
/* One warm-up, then at least min_reps timed runs (at most BENCH_MAX_REPS), more while
 * within budget_s. The caller has already run and validated once. */
#define BENCH_MAX_REPS 25
bench_timing bench_time(bench_run_fn fn, void *arg, double budget_s, int min_reps);
/* count floats uniform in [-amp, amp) from a counter-based hash of (seed, index). */
void bench_fill(float *x, int64_t count, uint64_t seed, float amp);
/* bf16 / f16 bits of a finite float, nearest even, and back (the benchmark's own). */
uint16_t bench_half_bits(float x, attn_dtype t);
float bench_half_value(uint16_t b, attn_dtype t);

/* ---- decode (decode.c) ------------------------------------------------------------------ */
/* Short queries against a long K/V (decode, speculative steps): attnrun against the
 * unfused BLAS decode and the time to read K and V once, side by side; a table on stdout,
 * JSON lines to json (may be NULL). Returns 1 when a run failed its check. */
int bench_decode(attn_ctx_t ctx, int64_t skv, int threads, double budget_s, int min_reps,
                 FILE *json, const char *git);

#endif
