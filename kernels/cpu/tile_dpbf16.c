/* tile_dpbf16.c — the bf16 tile products on AVX512-BF16 dot products (vdpbf16ps: AMD Zen 4
 * and later, Intel Cooper Lake and Sapphire Rapids), for CPUs without AMX: the same
 * operands as the AMX tiles (B as bf16 pairs, [K/2][N][2]) and the same roundings (P and
 * dS in bf16, float32 accumulation), so the forward and backward of tile_bf16.c run on
 * them unchanged. A vdpbf16ps does 32 multiply-adds, twice an FMA's 16 (measured on the
 * 2-core AMD EPYC dev VM: 232 vs 115 GFLOP/s a core in a register-only loop).
 *
 * A micro-tile is MR rows x NV vectors of 16 columns (6 x 4: 24 accumulators, 4 B
 * vectors, A pairs broadcast as 32-bit words); one step takes a pair of K. Compiled with
 * -mavx512bf16 in this unit only; picked at run time by CPUID. */
#include "bf16_tiles.h"

#include <cpuid.h>
#include <string.h>

enum { DP_SET = 0, DP_ADD = 1 };

/* C [MR][16 NV] (=, +=) sum over pairs p < K2 of A rows (stride lda) · B pair rows (stride
 * ldb elements): A[r][2p..2p+1] against B[p][n][0..1]. */
#define DP_KERNEL(MR, NV)                                                                     \
  static void dp_##MR##x##NV(float *C, int64_t ldc, const uint16_t *A, int64_t lda,           \
                             const uint16_t *B, int64_t ldb, int K2, int mode) {              \
    __m512 c[MR][NV];                                                                         \
    _Pragma("GCC unroll 6") for (int r = 0; r < MR; r++)                                      \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) c[r][v] = _mm512_setzero_ps();   \
    for (int p = 0; p < K2; p++) {                                                            \
      __m512bh b[NV];                                                                         \
      _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) b[v] =                             \
          (__m512bh)_mm512_loadu_si512(B + (size_t)p * ldb + 32 * v);                         \
      _Pragma("GCC unroll 6") for (int r = 0; r < MR; r++) {                                  \
        int32_t w;                                                                            \
        memcpy(&w, A + r * lda + 2 * p, 4);                                                   \
        const __m512bh a = (__m512bh)_mm512_set1_epi32(w);                                    \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) c[r][v] =                        \
            _mm512_dpbf16_ps(c[r][v], a, b[v]);                                               \
      }                                                                                       \
    }                                                                                         \
    _Pragma("GCC unroll 6") for (int r = 0; r < MR; r++)                                      \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) {                                \
      float *cp = C + r * ldc + 16 * v;                                                       \
      _mm512_storeu_ps(cp, mode == DP_ADD ? _mm512_add_ps(_mm512_loadu_ps(cp), c[r][v])      \
                                          : c[r][v]);                                         \
    }                                                                                         \
  }

#define DP_KERNELS(NV) DP_KERNEL(6, NV) DP_KERNEL(4, NV) DP_KERNEL(2, NV) DP_KERNEL(1, NV)
DP_KERNELS(1)
DP_KERNELS(2)
DP_KERNELS(3)
DP_KERNELS(4)

typedef void (*dp_fn)(float *, int64_t, const uint16_t *, int64_t, const uint16_t *, int64_t,
                      int, int);

/* C [M][N] (=, +=) A [M][K] · B [K/2][N][2] (pair rows ldb elements apart); N a multiple
 * of 16, K even. */
static void dp_product(float *C, int64_t ldc, const uint16_t *A, int64_t lda, const uint16_t *B,
                       int64_t ldb, int M, int N, int K, int mode) {
#define DROW(NV) {dp_6x##NV, dp_4x##NV, dp_2x##NV, dp_1x##NV}
  static const dp_fn tab[4][4] = {DROW(1), DROW(2), DROW(3), DROW(4)};
#undef DROW
  static const int rows[4] = {6, 4, 2, 1};
  for (int n = 0; n < N; n += 64) {
    const int nv = N - n >= 64 ? 4 : (N - n) / 16;
    int m = 0;
    for (int t = 0; t < 4; t++)
      for (; M - m >= rows[t]; m += rows[t])
        tab[nv - 1][t](C + (size_t)m * ldc + n, ldc, A + (size_t)m * lda, lda, B + 2 * n, ldb,
                       K / 2, mode);
  }
}

static void dp_begin(void) {}

static void dp_end(void) {}

static void dp_scores(float *S, const uint16_t *k, int64_t ldk, int nj, const uint16_t *qv,
                      int lanes, int D, uint16_t *kpad) {
  (void)kpad; /* rows are read one at a time: no padded copy of a short last tile */
  dp_product(S, CPU_BR, k, ldk, qv, 2 * CPU_BR, nj, lanes, D, DP_SET);
}

static void dp_gemm(float *C, int64_t ldc, const uint16_t *A, int64_t lda, const uint16_t *B,
                    int M, int N, int K) {
  dp_product(C, ldc, A, lda, B, 2 * (int64_t)N, M, N, K, DP_ADD);
}

static void dp_pv(float *O, int D, const uint16_t *P, const uint16_t *vv, const uint16_t *v,
                  int64_t ldv, int nj, int lanes, const float *alpha, int safe) {
  attn__bf16_pv(O, D, P, vv, v, ldv, nj, lanes, alpha, safe, dp_gemm);
}

static const cpu_bf16_ops dp_ops = {
    "avx512-bf16",      16,       dp_begin, dp_end, attn__bf16_pack_q,     dp_scores,
    attn__bf16_softmax, dp_pv,    attn__bf16_pack_lanes, attn__bf16_pack_pairs, dp_gemm,
    attn__bf16_probs,   attn__bf16_dscores};

const cpu_bf16_ops *attn__cpu_dpbf16(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return NULL;
  return (a >> 5) & 1 ? &dp_ops : NULL; /* AVX512-BF16 */
}
