/* bf16_tiles.h — the parts of the bf16 tile products that the AMX and the AVX512-BF16
 * tables share (tile_bf16.c): packing, the online softmax into bf16 P, the backward's P
 * and dS, P·V around a table's own product. Include only from units compiled with
 * -mavx512bf16; each function is the cpu_bf16_ops entry of the same name. */
#ifndef ATTN_BF16_TILES_H
#define ATTN_BF16_TILES_H

#include "avx512_math.h"

/* A table's product: C [M][N] += A [M][K] (bf16 rows) · B (pairs [K/2][N][2]). */
typedef void (*attn__bf16_gemm_fn)(float *C, int64_t ldc, const uint16_t *A, int64_t lda,
                                   const uint16_t *B, int M, int N, int K);

void attn__bf16_pack_q(uint16_t *qv, const float *q, int64_t ld, int u, int D);
void attn__bf16_softmax(float *S, int nj, const cpu_tile_info *ti, float sscale, float *m,
                        float *l, float *alpha, uint16_t *P);
void attn__bf16_pack_pairs(uint16_t *dst, const uint16_t *src, int64_t ld, int n, int D);
void attn__bf16_pack_lanes(uint16_t *dst, const uint16_t *src, int64_t ld, int rows, int D);
/* cpu_bf16_ops.pv with gemm for the product: O = alpha O, then P·V by gemm on V's pairs
 * vv, or (safe) by the float32 pass over V's rows that skips zero probabilities. */
void attn__bf16_pv(float *O, int D, const uint16_t *P, const uint16_t *vv, const uint16_t *v,
                   int64_t ldv, int nj, int lanes, const float *alpha, int safe,
                   attn__bf16_gemm_fn gemm);
void attn__bf16_probs(float *S, int nj, const cpu_tile_info *ti, float sscale,
                      const float *lse2, float *T, uint16_t *Pt);
void attn__bf16_dscores(float *dP, const float *P, const float *T, int nj, int lanes,
                        const float *delta, float factor, int keep, uint16_t *dSt, uint16_t *dS);

#endif
