/* tile_avx512.c — AVX-512 tile primitives (compiled with -mavx512f etc. in this translation
 * unit only; picked at run time by CPUID in backend.c). Same results as tile_scalar.c up
 * to float32 rounding. */
#include "cpu.h"

#include "avx512_math.h"

#include <string.h>

/* ---- the register-blocked GEMM ------------------------------------------------------
 * A micro-tile is MR rows x NV vectors of 16 lanes (6 x 4 = 24 accumulators measured
 * fastest here: ~185 GFLOP/s a core vs ~150 for 8 x 2); A is broadcast (any strides),
 * B is loaded by rows; only the last vector is masked (N tails). Instantiated for
 * MR in {6, 4, 2, 1} and NV in {1..4}. */
#define GEMM_KERNEL(MR, NV)                                                                 \
  static void kern_##MR##x##NV(float *C, int64_t ldc, const float *A, int64_t ak,         \
                               int64_t am, const float *B, int64_t ldb, int K, __mmask16 kl, \
                               const float *alpha, int mode, int safe) {                  \
    __m512 c[MR][NV];                                                                     \
    _Pragma("GCC unroll 6") for (int r = 0; r < MR; r++)                                  \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) c[r][v] = _mm512_setzero_ps(); \
    if (!safe) {                                                                          \
      for (int k = 0; k < K; k++) {                                                       \
        __m512 b[NV];                                                                     \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV - 1; v++) b[v] =                   \
            _mm512_loadu_ps(B + 16 * v);                                                  \
        b[NV - 1] = _mm512_maskz_loadu_ps(kl, B + 16 * (NV - 1));                         \
        _Pragma("GCC unroll 6") for (int r = 0; r < MR; r++) {                            \
          __m512 a = _mm512_set1_ps(A[r * am]);                                           \
          _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) c[r][v] =                  \
              _mm512_fmadd_ps(a, b[v], c[r][v]);                                          \
        }                                                                                 \
        A += ak;                                                                          \
        B += ldb;                                                                         \
      }                                                                                   \
    } else {                                                                              \
      const __m512 z = _mm512_setzero_ps();                                               \
      for (int k = 0; k < K; k++) {                                                       \
        __m512 b[NV];                                                                     \
        __mmask16 nz[NV];                                                                 \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) {                            \
          b[v] = _mm512_maskz_loadu_ps(v == NV - 1 ? kl : (__mmask16)0xffff, B + 16 * v);  \
          nz[v] = _mm512_cmp_ps_mask(b[v], z, _CMP_NEQ_UQ);                               \
        }                                                                                 \
        _Pragma("GCC unroll 6") for (int r = 0; r < MR; r++) {                            \
          float as = A[r * am];                                                           \
          if (as == 0.0f) continue;                                                       \
          __m512 a = _mm512_set1_ps(as);                                                  \
          _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) c[r][v] =                  \
              _mm512_mask3_fmadd_ps(a, b[v], c[r][v], nz[v]);                             \
        }                                                                                 \
        A += ak;                                                                          \
        B += ldb;                                                                         \
      }                                                                                   \
    }                                                                                     \
    _Pragma("GCC unroll 6") for (int r = 0; r < MR; r++) {                                \
      _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) {                              \
        __mmask16 km = v == NV - 1 ? kl : (__mmask16)0xffff;                              \
        float *cp = C + r * ldc + 16 * v;                                                 \
        __m512 x = c[r][v];                                                               \
        if (mode == CPU_GEMM_ADD)                                                         \
          x = _mm512_add_ps(_mm512_maskz_loadu_ps(km, cp), x);                            \
        else if (mode == CPU_GEMM_SCALE_ADD)                                              \
          x = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(km, alpha + 16 * v),                  \
                              _mm512_maskz_loadu_ps(km, cp), x);                          \
        _mm512_mask_storeu_ps(cp, km, x);                                                 \
      }                                                                                   \
    }                                                                                     \
  }

#define GEMM_KERNELS(NV) \
  GEMM_KERNEL(6, NV) GEMM_KERNEL(4, NV) GEMM_KERNEL(2, NV) GEMM_KERNEL(1, NV)
GEMM_KERNELS(1)
GEMM_KERNELS(2)
GEMM_KERNELS(3)
GEMM_KERNELS(4)

typedef void (*kern_fn)(float *, int64_t, const float *, int64_t, int64_t, const float *,
                        int64_t, int, __mmask16, const float *, int, int);

static void gemm_avx512(float *C, int64_t ldc, const float *A, int64_t ak, int64_t am,
                        const float *B, int64_t ldb, int M, int N, int K, const float *alpha,
                        int mode, int safe) {
#define KROW(NV) {kern_6x##NV, kern_4x##NV, kern_2x##NV, kern_1x##NV}
  static const kern_fn tab[4][4] = {KROW(1), KROW(2), KROW(3), KROW(4)};
#undef KROW
  static const int rows[4] = {6, 4, 2, 1};
  for (int n = 0; n < N; n += 64) {
    int nn = N - n < 64 ? N - n : 64, nv = (nn + 15) / 16, tail = nn - 16 * (nv - 1);
    __mmask16 kl = tail >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << tail) - 1u);
    const float *al = alpha ? alpha + n : NULL;
    int m = 0;
    for (int t = 0; t < 4; t++)
      for (; M - m >= rows[t]; m += rows[t])
        tab[nv - 1][t](C + m * ldc + n, ldc, A + m * am, ak, am, B + n, ldb, K, kl, al, mode,
                       safe);
  }
}

static void softmax_fwd_avx512(float *S, int nj, const cpu_tile_info *ti, float *m, float *l,
                               float *alpha) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  for (int i0 = 0; i0 < ti->lanes; i0 += 16) {
    __m512 mold = _mm512_loadu_ps(m + i0), mx = mold;
    for (int j = 0; j < nj; j++) {
      float *row = S + j * CPU_BR + i0;
      __m512 x = transform16(_mm512_loadu_ps(row), j, i0, ti, NULL);
      _mm512_storeu_ps(row, x);
      mx = _mm512_max_ps(mx, x);
    }
    __m512 mu = _mm512_mask_mov_ps(mx, _mm512_cmpeq_ps_mask(mx, ninf), _mm512_setzero_ps());
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int j = 0;
    for (; j + 1 < nj; j += 2) {
      float *r0 = S + j * CPU_BR + i0, *r1 = r0 + CPU_BR;
      __m512 p0 = exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(r0), mu));
      __m512 p1 = exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(r1), mu));
      _mm512_storeu_ps(r0, p0);
      _mm512_storeu_ps(r1, p1);
      s0 = _mm512_add_ps(s0, p0);
      s1 = _mm512_add_ps(s1, p1);
    }
    if (j < nj) {
      float *r0 = S + j * CPU_BR + i0;
      __m512 p0 = exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(r0), mu));
      _mm512_storeu_ps(r0, p0);
      s0 = _mm512_add_ps(s0, p0);
    }
    __m512 a = exp2_ps(_mm512_sub_ps(mold, mu));
    _mm512_storeu_ps(alpha + i0, a);
    _mm512_storeu_ps(l + i0, _mm512_fmadd_ps(_mm512_loadu_ps(l + i0), a, _mm512_add_ps(s0, s1)));
    _mm512_storeu_ps(m + i0, mx);
  }
}

static void probs_bwd_avx512(float *S, int nj, const cpu_tile_info *ti, const float *lse2,
                             float *T) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  for (int j = 0; j < nj; j++)
    for (int i0 = 0; i0 < ti->lanes; i0 += 16) {
      float *row = S + j * CPU_BR + i0;
      __m512 t = _mm512_setzero_ps();
      __m512 x = transform16(_mm512_loadu_ps(row), j, i0, ti, &t);
      if (T) _mm512_storeu_ps(T + j * CPU_BR + i0, t);
      __m512 p = exp2_ps(_mm512_sub_ps(x, _mm512_loadu_ps(lse2 + i0)));
      p = _mm512_mask_mov_ps(p, _mm512_cmpeq_ps_mask(x, ninf), _mm512_setzero_ps());
      _mm512_storeu_ps(row, p);
    }
}

static void dscores_avx512(float *dP, const float *P, const float *T, int nj, int lanes,
                           const float *delta, float factor) {
  const __m512 f = _mm512_set1_ps(factor), one = _mm512_set1_ps(1.0f);
  for (int j = 0; j < nj; j++)
    for (int i0 = 0; i0 < lanes; i0 += 16) {
      int e = j * CPU_BR + i0;
      __m512 p = _mm512_loadu_ps(P + e);
      __m512 ds = _mm512_mul_ps(_mm512_mul_ps(f, p),
                                _mm512_sub_ps(_mm512_loadu_ps(dP + e), _mm512_loadu_ps(delta + i0)));
      if (T) {
        __m512 t = _mm512_loadu_ps(T + e);
        ds = _mm512_mul_ps(ds, _mm512_fnmadd_ps(t, t, one));
      }
      ds = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(p, _mm512_setzero_ps(), _CMP_NEQ_UQ), ds);
      _mm512_storeu_ps(dP + e, ds);
    }
}

static void pack_t_avx512(float *dst, const float *src, int64_t ss, int rows, int D,
                          float scale) {
  const __m512 sc = _mm512_set1_ps(scale);
  for (int i0 = 0; i0 < CPU_BR; i0 += 16)
    for (int d0 = 0; d0 < D; d0 += 16) {
      __mmask16 dm = first_n(D - d0);
      __m512 r[16];
      for (int i = 0; i < 16; i++)
        r[i] = i0 + i < rows
                   ? _mm512_mul_ps(_mm512_maskz_loadu_ps(dm, src + (i0 + i) * ss + d0), sc)
                   : _mm512_setzero_ps();
      transpose16(r);
      for (int d = 0; d < 16 && d0 + d < D; d++) _mm512_storeu_ps(dst + (d0 + d) * CPU_BR + i0, r[d]);
    }
}

static void unpack_t_avx512(float *dst, int64_t ds, const float *src, int rows, int D,
                            const float *scale) {
  for (int i0 = 0; i0 < rows; i0 += 16) {
    const __m512 sc = scale ? _mm512_loadu_ps(scale + i0) : _mm512_set1_ps(1.0f);
    for (int d0 = 0; d0 < D; d0 += 16) {
      __mmask16 dm = first_n(D - d0);
      __m512 r[16];
      for (int d = 0; d < 16; d++)
        r[d] = d0 + d < D ? _mm512_mul_ps(_mm512_loadu_ps(src + (d0 + d) * CPU_BR + i0), sc)
                          : _mm512_setzero_ps();
      transpose16(r);
      for (int i = 0; i < 16 && i0 + i < rows; i++)
        _mm512_mask_storeu_ps(dst + (i0 + i) * ds + d0, dm, r[i]);
    }
  }
}

/* 16 bf16/f16 values (the low n lanes; the rest 0) to float32. */
static inline __m512 load16_lp(const uint16_t *p, int n, attn_dtype t) {
  __m256i h = _mm256_maskz_loadu_epi16(first_n(n), p);
  if (t == ATTN_F16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 16 floats to bf16/f16, nearest even (bf16: NaN kept quiet, as attn__cpu_store). */
static inline void store16_lp(uint16_t *p, int n, attn_dtype t, __m512 x) {
  __m256i h;
  if (t == ATTN_F16) {
    h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  } else {
    const __m512i u = _mm512_castps_si512(x), one = _mm512_set1_epi32(1);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                            _mm512_set1_epi32(0x7F800000));
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    h = _mm512_cvtepi32_epi16(r);
  }
  _mm256_mask_storeu_epi16(p, first_n(n), h);
}

static void rows_in_avx512(float *dst, int64_t ld, const void *src, int64_t ss, attn_dtype t,
                           int rows, int D) {
  const uint16_t *h = src;
  for (int r = 0; r < rows; r++)
    for (int d0 = 0; d0 < D; d0 += 16)
      _mm512_mask_storeu_ps(dst + r * ld + d0, first_n(D - d0), load16_lp(h + r * ss + d0, D - d0, t));
}

static void rows_out_avx512(void *dst, int64_t ds, attn_dtype t, const float *src, int64_t ld,
                            int rows, int D) {
  uint16_t *h = dst;
  for (int r = 0; r < rows; r++)
    for (int d0 = 0; d0 < D; d0 += 16)
      store16_lp(h + r * ds + d0, D - d0, t, _mm512_maskz_loadu_ps(first_n(D - d0), src + r * ld + d0));
}

static int nonfinite_avx512(const void *src, int64_t ss, attn_dtype t, int rows, int D) {
  const int wide = t == ATTN_F32; /* 16 floats or 32 halves a vector */
  const __m512i e = wide ? _mm512_set1_epi32(0x7F800000)
                         : _mm512_set1_epi16(t == ATTN_BF16 ? 0x7F80 : 0x7C00);
  __mmask64 bad = 0;
  for (int r = 0; r < rows; r++) {
    if (wide) {
      const float *x = (const float *)src + r * ss;
      for (int d0 = 0; d0 < D; d0 += 16) {
        __m512i v = _mm512_and_si512(_mm512_castps_si512(_mm512_maskz_loadu_ps(first_n(D - d0), x + d0)), e);
        bad |= _mm512_cmpeq_epi32_mask(v, e);
      }
    } else {
      const uint16_t *h = (const uint16_t *)src + r * ss;
      for (int d0 = 0; d0 < D; d0 += 32) {
        int n = D - d0;
        __mmask32 m = n >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << n) - 1u);
        __m512i v = _mm512_and_si512(_mm512_maskz_loadu_epi16(m, h + d0), e);
        bad |= _mm512_cmpeq_epi16_mask(v, e);
      }
    }
  }
  return bad != 0;
}

/* ---- row kernels: a few query lanes (decode) -----------------------------------------
 * Layouts: S / P [u][CPU_BC] (lane L's scores over the tile's keys), Q [u][ldq] scaled,
 * O [u][ldo] unnormalised; keys are the vector lanes. */

/* r[x] = sum of the 16 lanes of a[x], x < 16 (a is clobbered). */
static inline __m512 hsum16(__m512 a[16]) {
  __m512 s1[8], s2[4];
  for (int i = 0; i < 8; i++) /* 128-bit lane k: x0+x2, y0+y2, x1+x3, y1+y3 */
    s1[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                          _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 4; i++) { /* 128-bit lane k: the lane-k sums of a[4i .. 4i+3] */
    __m512d x = _mm512_castps_pd(s1[2 * i]), y = _mm512_castps_pd(s1[2 * i + 1]);
    s2[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                          _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  __m512 u0 = _mm512_add_ps(_mm512_shuffle_f32x4(s2[0], s2[1], 0x44),
                            _mm512_shuffle_f32x4(s2[0], s2[1], 0xEE));
  __m512 u1 = _mm512_add_ps(_mm512_shuffle_f32x4(s2[2], s2[3], 0x44),
                            _mm512_shuffle_f32x4(s2[2], s2[3], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(u0, u1, 0x88), _mm512_shuffle_f32x4(u0, u1, 0xDD));
}

/* Rows [r0, r1) of pf (clipped to its rows) into cache, every line of each. */
static inline void prefetch_rows(const cpu_prefetch *pf, int r0, int r1) {
  if (!pf || !pf->p) return;
  for (int r = r0; r < r1 && r < pf->rows; r++) {
    const char *row = pf->p + r * pf->stride;
    for (uintptr_t a = (uintptr_t)row & ~(uintptr_t)63; a < (uintptr_t)row + pf->bytes; a += 64)
      _mm_prefetch((const char *)a, _MM_HINT_T0);
  }
}

/* Key row x of a chunk at p: rows are sb bytes apart; p4 = p + 4 sb, s3 = 3 sb, so that
 * every address is one base plus a scaled index (16 rows, 6 registers). */
#define KROW(p, p4, sb, s3, x)                                                                \
  ((const float *)((x) < 4 ? (p) + ((x) == 3 ? (s3) : (x) * (sb))                            \
                           : (p4) + ((x) % 4 == 3 ? (s3) : ((x) % 4) * (sb)) +               \
                                 ((x) / 4 - 1) * 4 * (sb)))

/* Scores of 8 keys (rows kr, sb bytes apart) for two lanes: S0[x] = K_x . qa, S1[x] =
 * K_x . qb for x < 8 where `keep` has bit x. Each K vector feeds both lanes' FMAs. */
static inline void scores_8x2(float *S0, float *S1, const char *kr, int64_t sb,
                              const float *qa, const float *qb, int D, __mmask16 keep) {
  const char *k4 = kr + 4 * sb;
  const int64_t s3 = 3 * sb;
  __m512 acc[16];
#pragma GCC unroll 16
  for (int x = 0; x < 16; x++) acc[x] = _mm512_setzero_ps();
  for (int d0 = 0; d0 < D; d0 += 16) {
    const __mmask16 dm = first_n(D - d0);
    const __m512 a = _mm512_maskz_loadu_ps(dm, qa + d0), b = _mm512_maskz_loadu_ps(dm, qb + d0);
#pragma GCC unroll 8
    for (int x = 0; x < 8; x++) {
      const __m512 k = _mm512_maskz_loadu_ps(dm, KROW(kr, k4, sb, s3, x) + d0);
      acc[x] = _mm512_fmadd_ps(k, a, acc[x]);
      acc[8 + x] = _mm512_fmadd_ps(k, b, acc[8 + x]);
    }
  }
  const __m512 r = hsum16(acc); /* lanes 0..7: S0's keys, 8..15: S1's */
  _mm512_mask_storeu_ps(S1 - 8, (__mmask16)(keep << 8), r);
  _mm512_mask_storeu_ps(S0, (__mmask16)(keep & 0xff), r);
}

/* Scores of 16 keys (rows kr, sb bytes apart) for one lane: S0[x] = K_x . q, x in keep. */
static inline void scores_16x1(float *S0, const char *kr, int64_t sb, const float *q, int D,
                               __mmask16 keep) {
  const char *k4 = kr + 4 * sb;
  const int64_t s3 = 3 * sb;
  __m512 acc[16];
#pragma GCC unroll 16
  for (int x = 0; x < 16; x++) acc[x] = _mm512_setzero_ps();
  for (int d0 = 0; d0 < D; d0 += 16) {
    const __mmask16 dm = first_n(D - d0);
    const __m512 a = _mm512_maskz_loadu_ps(dm, q + d0);
#pragma GCC unroll 16
    for (int x = 0; x < 16; x++)
      acc[x] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(dm, KROW(kr, k4, sb, s3, x) + d0), a, acc[x]);
  }
  _mm512_mask_storeu_ps(S0, keep, hsum16(acc));
}

/* Lanes in pairs over 8 keys (each K load feeds two FMAs), an odd last lane over 16. A
 * chunk's 16 rows stay in L1 over the lanes; the tile's last chunk, when short, goes
 * through a padded copy so the kernels keep their fixed row stride. The tile's K rows
 * were brought in by the P·V before (pf), except the first tile's of a run. */
static void scores_rows_avx512(float *S, const float *K, int64_t ldk, int nj, const float *Q,
                               int64_t ldq, int u, int D, const cpu_prefetch *pf) {
  float pad[16 * ATTN__MAX_HEAD_DIM] __attribute__((aligned(64)));
  for (int j0 = 0; j0 < nj; j0 += 16) {
    const int nk = nj - j0 < 16 ? nj - j0 : 16;
    const char *kr = (const char *)(K + j0 * ldk);
    int64_t sb = ldk * (int64_t)sizeof(float);
    if (nk < 16) {
      for (int x = 0; x < 16; x++)
        memcpy(pad + x * D, K + (j0 + (x < nk ? x : nk - 1)) * ldk, (size_t)D * sizeof(float));
      kr = (const char *)pad, sb = D * (int64_t)sizeof(float);
    }
    /* pf rows j0 .. j0 + 15 (the last chunk: the rest), a share before each kernel call:
     * a burst of them would overrun the outstanding-miss slots */
    const int pf_rows = pf && pf->p ? pf->rows : 0;
    const int calls = u / 2 * (nk > 8 ? 2 : 1) + u % 2, pend = j0 + 16 < nj ? j0 + 16 : pf_rows;
    const int share = (pend - j0 + calls - 1) / calls;
    int pr = j0;
    const __mmask16 keep = first_n(nk);
    int L = 0;
    for (; L + 1 < u; L += 2) {
      float *s0 = S + L * CPU_BC + j0, *s1 = s0 + CPU_BC;
      const float *qa = Q + L * ldq, *qb = qa + ldq;
      prefetch_rows(pf, pr, pr + share), pr += share;
      scores_8x2(s0, s1, kr, sb, qa, qb, D, keep);
      if (nk <= 8) continue;
      prefetch_rows(pf, pr, pr + share), pr += share;
      scores_8x2(s0 + 8, s1 + 8, kr + 8 * sb, sb, qa, qb, D, keep >> 8);
    }
    prefetch_rows(pf, pr, pend);
    if (L < u) scores_16x1(S + L * CPU_BC + j0, kr, sb, Q + L * ldq, D, keep);
  }
}

/* Transform keys j0..j0+15 of lane L (softcap, ALiBi, mask); keys past nj are -inf. */
static inline __m512 transform_keys16(__m512 s, int j0, int nj, int L, const cpu_tile_info *ti) {
  const __m512i j = _mm512_add_epi32(_mm512_set1_epi32(j0),
                                     _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  if (ti->softcap2 > 0.0f) s = _mm512_mul_ps(_mm512_set1_ps(ti->softcap2), tanh_ps(s));
  if (ti->alibi) {
    __m512 d = _mm512_abs_ps(_mm512_sub_ps(_mm512_set1_ps(ti->ipos[L]), _mm512_cvtepi32_ps(j)));
    s = _mm512_fnmadd_ps(_mm512_set1_ps(ti->alibi2[L]), d, s);
  }
  __mmask16 ok = first_n(nj - j0);
  if (ti->partial) {
    ok &= _mm512_cmpge_epi32_mask(j, _mm512_set1_epi32(ti->lo[L])) &
          _mm512_cmple_epi32_mask(j, _mm512_set1_epi32(ti->hi[L]));
    if (ti->elem)
      for (int x = 0; x < 16 && j0 + x < nj; x++)
        if (!ti->elem[(j0 + x) * CPU_BR + L]) ok &= (__mmask16)~(1u << x);
  }
  return _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), ok, s);
}

static void softmax_rows_avx512(float *S, int nj, int u, const cpu_tile_info *ti, int L0,
                                float *m, float *l, float *alpha) {
  for (int L = 0; L < u; L++) {
    float *row = S + L * CPU_BC;
    __m512 mx = _mm512_set1_ps(m[L]);
    for (int j0 = 0; j0 < nj; j0 += 16) {
      __m512 x = transform_keys16(_mm512_maskz_loadu_ps(first_n(nj - j0), row + j0), j0, nj,
                                  L0 + L, ti);
      _mm512_storeu_ps(row + j0, x); /* row has CPU_BC floats: whole vectors fit */
      mx = _mm512_max_ps(mx, x);
    }
    const float m_new = _mm512_reduce_max_ps(mx), mu = m_new == -INFINITY ? 0.0f : m_new;
    const __m512 muv = _mm512_set1_ps(mu);
    __m512 sum = _mm512_setzero_ps();
    for (int j0 = 0; j0 < nj; j0 += 16) {
      __m512 p = exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(row + j0), muv));
      _mm512_storeu_ps(row + j0, p);
      sum = _mm512_add_ps(sum, p);
    }
    float a = _mm512_cvtss_f32(exp2_ps(_mm512_set1_ps(m[L] - mu)));
    alpha[L] = a;
    l[L] = l[L] * a + _mm512_reduce_add_ps(sum);
    m[L] = m_new;
  }
}

/* O rows [UL][ldo], columns d0 .. d0 + 16 NC - 1 (masked past D):
 * O = alpha O + sum_j P[l][j] V[j] (V rows vb bytes apart), UL * NC <= 16 accumulators.
 * The fast pass does not look at V: a NaN or Inf in a V row turns a sum non-finite even
 * where its probability is 0 (0 * Inf = NaN), so a non-finite sum sends the group through
 * again skipping zero probabilities; a masked non-finite V row then adds nothing. pf's rows
 * (row j at key j, the rest after the last key) come in during the pass. */
#define PV_ARGS                                                                               \
  float *O, int64_t ldo, const char *V, int64_t vb, int nj, const float *P, int D, int d0,     \
      const float *alpha, const cpu_prefetch *pf
#define PV_ROWS_KERNEL(UL, NC)                                                                \
  static void pv_rows_##UL##x##NC##_safe(PV_ARGS);                                            \
  static inline __attribute__((always_inline)) void pv_body_##UL##x##NC(PV_ARGS, int safe) {  \
    __mmask16 dm[NC];                                                                         \
    __m512 acc[UL][NC];                                                                       \
    _Pragma("GCC unroll 16") for (int c = 0; c < NC; c++) dm[c] = first_n(D - d0 - 16 * c);   \
    _Pragma("GCC unroll 16") for (int l = 0; l < UL; l++)                                     \
      _Pragma("GCC unroll 16") for (int c = 0; c < NC; c++) acc[l][c] = _mm512_setzero_ps();  \
    for (int j = 0; j < nj; j++) {                                                            \
      const float *vj = (const float *)(V + j * vb) + d0;                                     \
      if (pf) prefetch_rows(pf, j, j + 1);                                                    \
      __m512 v[NC];                                                                           \
      _Pragma("GCC unroll 16") for (int c = 0; c < NC; c++)                                   \
        v[c] = _mm512_maskz_loadu_ps(dm[c], vj + 16 * c);                                     \
      _Pragma("GCC unroll 16") for (int l = 0; l < UL; l++) {                                 \
        const float p = P[l * CPU_BC + j];                                                    \
        if (safe && p == 0.0f) continue;                                                      \
        const __m512 pv = _mm512_set1_ps(p);                                                  \
        _Pragma("GCC unroll 16") for (int c = 0; c < NC; c++)                                 \
          acc[l][c] = _mm512_fmadd_ps(pv, v[c], acc[l][c]);                                   \
      }                                                                                       \
    }                                                                                         \
    if (pf) prefetch_rows(pf, nj, pf->rows);                                                  \
    __mmask16 bad = 0;                                                                        \
    _Pragma("GCC unroll 16") for (int l = 0; l < UL; l++)                                     \
      _Pragma("GCC unroll 16") for (int c = 0; c < NC; c++)                                   \
        bad |= _mm512_fpclass_ps_mask(acc[l][c], 0x99); /* QNaN, SNaN, +Inf, -Inf */          \
    if (bad && !safe) {                                                                       \
      pv_rows_##UL##x##NC##_safe(O, ldo, V, vb, nj, P, D, d0, alpha, NULL);                   \
      return;                                                                                 \
    }                                                                                         \
    _Pragma("GCC unroll 16") for (int l = 0; l < UL; l++)                                     \
      _Pragma("GCC unroll 16") for (int c = 0; c < NC; c++) {                                 \
        float *o = O + l * ldo + d0 + 16 * c;                                                 \
        __m512 x = _mm512_fmadd_ps(_mm512_set1_ps(alpha[l]), _mm512_maskz_loadu_ps(dm[c], o), \
                                   acc[l][c]);                                                \
        _mm512_mask_storeu_ps(o, dm[c], x);                                                   \
      }                                                                                       \
  }                                                                                           \
  static void pv_rows_##UL##x##NC##_safe(PV_ARGS) {                                           \
    pv_body_##UL##x##NC(O, ldo, V, vb, nj, P, D, d0, alpha, pf, 1);                           \
  }                                                                                           \
  static void pv_rows_##UL##x##NC(PV_ARGS) {                                                  \
    pv_body_##UL##x##NC(O, ldo, V, vb, nj, P, D, d0, alpha, pf, 0);                           \
  }
PV_ROWS_KERNEL(1, 8)
PV_ROWS_KERNEL(2, 8)
PV_ROWS_KERNEL(1, 4)
PV_ROWS_KERNEL(2, 4)
PV_ROWS_KERNEL(3, 4)
PV_ROWS_KERNEL(4, 4)

/* Lane groups of up to 4 over column chunks (128 columns when there are 1-2 lanes, else
 * 64, for every group: a chunk's columns are visited once, as each visit rescales O by
 * alpha); the first group of the first chunk brings pf in. */
static void pv_rows_avx512(float *O, int64_t ldo, const float *V, int64_t ldv, int nj,
                           const float *P, int u, int D, const float *alpha,
                           const cpu_prefetch *pf) {
  typedef void (*pv_fn)(PV_ARGS);
  static const pv_fn wide[2] = {pv_rows_1x8, pv_rows_2x8}; /* 128 columns */
  static const pv_fn narrow[4] = {pv_rows_1x4, pv_rows_2x4, pv_rows_3x4, pv_rows_4x4}; /* 64 */
  const int cols = u <= 2 ? 128 : 64;
  const pv_fn *by_lanes = u <= 2 ? wide : narrow;
  const int64_t vb = ldv * (int64_t)sizeof(float);
  for (int d0 = 0; d0 < D; d0 += cols)
    for (int L0 = 0; L0 < u; L0 += 4) {
      int ul = u - L0 < 4 ? u - L0 : 4;
      by_lanes[ul - 1](O + L0 * ldo, ldo, (const char *)V, vb, nj, P + L0 * CPU_BC, D, d0,
                       alpha + L0, d0 == 0 && L0 == 0 ? pf : NULL);
    }
}

static const cpu_tile_ops ops_avx512 = {"cpu-avx512",     gemm_avx512,    softmax_fwd_avx512,
                                        probs_bwd_avx512, dscores_avx512, pack_t_avx512,
                                        unpack_t_avx512,  rows_in_avx512, rows_out_avx512,
                                        nonfinite_avx512, scores_rows_avx512,
                                        softmax_rows_avx512, pv_rows_avx512};

const cpu_tile_ops *attn__cpu_ops_avx512(void) { return &ops_avx512; }
