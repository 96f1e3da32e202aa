/* bench.h — what the CPU benchmark's files share: one attention problem, its check
 * against the float64 oracle, and the BLAS-based unfused attention it is compared with. */
#ifndef ATTN_BENCH_H
#define ATTN_BENCH_H

#include <stdint.h>

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

#endif
