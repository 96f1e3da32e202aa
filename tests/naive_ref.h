/* naive_ref.h — a naive attention kernel in the storage precision (float arithmetic, P and
 * dS rounded to the dtype before their products, O rounded to it) and FlashAttention's
 * judging rule against it: a kernel's error vs the float64 oracle at most 2x the naive
 * kernel's, plus a tiny atol. For kernels whose products run in bf16/f16 (CUDA, AMX). */
#ifndef ATTN_NAIVE_REF_H
#define ATTN_NAIVE_REF_H

#include <stdint.h>

typedef struct {
  int64_t B, Sq, Skv, Hq, Hkv, D, Dv; /* D = Dqk */
  int dtype;                          /* ATTN_BF16, ATTN_F16 (or ATTN_F32: no rounding) */
  const float *q, *k, *v, *dout;      /* [B,S,H,D] contiguous, values exact in the dtype */
  const uint8_t *vis;                 /* [Sq][Skv] the mask (the same for every b and h) */
  float scale, softcap;               /* scale resolved (not 0); softcap 0: off */
  const float *sinks, *alibi;         /* [Hq] or NULL */
  int nseq;                           /* varlen (B = 1): cu_q / cu_kv [nseq + 1] */
  const int32_t *cu_q, *cu_kv;
} naive_problem;

typedef struct {
  float *o, *lse;        /* [B,Sq,Hq,Dv], [B,Hq,Sq] */
  float *dq, *dk, *dv, *ds; /* with bwd (needs dout): [.., D], [.., D], [.., Dv], [Hq] */
} naive_out;

/* Runs the naive kernel; allocates out's arrays (free() each). */
void naive_run(const naive_problem *p, int bwd, naive_out *out);

/* got vs the oracle ref with naive the same-precision result, n elements ([4] dims to
 * print the worst index, or NULL): fails (tu_failures++, a message naming what) when the
 * max error exceeds 2 x the naive max error + 1e-4 max|ref| + 1e-6 + extra. */
int naive_judge(const char *what, const float *got, const double *ref, const float *naive,
                int64_t n, const int64_t *dims, double extra);

/* The extra a gradient's judge allows for float32 accumulation noise: gradients can cancel
 * to exactly 0 (one key: dP == delta) where a same-order naive sum is exact too, while the
 * kernels sum in other orders. 16 x 2^-24 x sqrt(terms) x the scale of a dS*q product. */
double naive_grad_noise(int64_t Sq, int64_t Skv, int64_t D, int64_t Dv, double scale,
                        double amp);

#endif
