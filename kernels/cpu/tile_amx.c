/* tile_amx.c — the bf16 tile kernels on Intel AMX (AMX-BF16, Sapphire Rapids and
 * later): S^T = K·Q^T and O += P·V as bf16 tile products with float32 accumulation, the
 * online softmax in AVX-512 between them. P is rounded to bf16 for P·V, as GPU flash
 * kernels do, so results differ from the float32 path by that rounding (the 2x rule).
 * Compiled with -mamx-tile -mamx-bf16 -mavx512bf16 in this unit only; picked at run time
 * when CPUID says AMX-BF16 and the kernel grants the tile data state (arch_prctl).
 *
 * The backward's five products run there too, from P and dS rounded to bf16 (as FlashAttention's
 * kernels do): S^T = K·Q^T, dP^T = V·dO^T, dV += P^T·dO, dK += dS^T·Q, dQ += dS·K.
 *
 * Every tile register is 16 rows x 64 bytes: C 16 x 16 float32, A 16 x 32 bf16, B 16
 * pairs x 16 columns x 2 bf16 ("VNNI": B[k][n] at row k/2, element 2n + k%2). Blocking is
 * 2 x 2 C tiles (0..3) fed by A tiles 4, 5 and B tiles 6, 7. */
#include "avx512_math.h"

#include <cpuid.h>
#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define AMX_ROWB 64 /* bytes of a tile row */

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} amx_config;

/* A constant in memory: GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes only,
 * so a config built on the stack just before it loses its stores. */
static const amx_config amx_cfg = {
    1, 0, {0}, {AMX_ROWB, AMX_ROWB, AMX_ROWB, AMX_ROWB, AMX_ROWB, AMX_ROWB, AMX_ROWB, AMX_ROWB},
    {16, 16, 16, 16, 16, 16, 16, 16}};

static void amx_begin(void) { _tile_loadconfig(&amx_cfg); }

static void amx_end(void) { _tile_release(); }

/* float32 → bf16 bits, nearest even (NaN stays NaN). */
static inline uint16_t bf16_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static void amx_pack_q(uint16_t *qv, const float *q, int64_t ld, int u, int D) {
  for (int d = 0; d < D; d += 2)
    for (int i = 0; i < CPU_BR; i++) {
      uint16_t *p = qv + (size_t)(d / 2) * CPU_BR * 2 + (size_t)i * 2; /* pair d/2, lane i */
      p[0] = i < u ? bf16_bits(q[i * ld + d]) : 0;
      p[1] = i < u ? bf16_bits(q[i * ld + d + 1]) : 0;
    }
}

/* S^T rows [j0, j0 + 32) x lanes [i0, i0 + 16·(1 + two)) = K rows kb (stride ks elements)
 * · Q^T from qv. */
static inline void scores_block(float *S, const uint16_t *kb, int64_t ks, const uint16_t *qv,
                                int i0, int two, int D) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int d0 = 0; d0 < D; d0 += 32) {
    const uint16_t *qb = qv + (size_t)(d0 / 2) * CPU_BR * 2 + (size_t)i0 * 2;
    _tile_loadd(4, kb + d0, ks * 2);
    _tile_loadd(5, kb + 16 * ks + d0, ks * 2);
    _tile_loadd(6, qb, CPU_BR * 4);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(2, 5, 6);
    if (two) {
      _tile_loadd(7, qb + 32, CPU_BR * 4);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, S + i0, CPU_BR * 4);
  _tile_stored(2, S + 16 * CPU_BR + i0, CPU_BR * 4);
  if (two) {
    _tile_stored(1, S + i0 + 16, CPU_BR * 4);
    _tile_stored(3, S + 16 * CPU_BR + i0 + 16, CPU_BR * 4);
  }
}

static void amx_scores(float *S, const uint16_t *k, int64_t ldk, int nj, const uint16_t *qv,
                       int lanes, int D, uint16_t *kpad) {
  for (int j0 = 0; j0 < nj; j0 += 32) {
    const uint16_t *kb = k + j0 * ldk;
    int64_t ks = ldk;
    if (nj - j0 < 32) { /* the last keys, then zero keys: never read past row nj - 1 */
      for (int r = 0; r < 32; r++)
        if (j0 + r < nj) memcpy(kpad + r * D, kb + r * ldk, (size_t)D * 2);
        else memset(kpad + r * D, 0, (size_t)D * 2);
      kb = kpad;
      ks = D;
    }
    for (int i0 = 0; i0 < lanes; i0 += 32)
      scores_block(S + (size_t)j0 * CPU_BR, kb, ks, qv, i0, lanes - i0 >= 32, D);
  }
}

static void amx_softmax(float *S, int nj, const cpu_tile_info *ti, float sscale, float *m,
                        float *l, float *alpha, uint16_t *P) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY), sc = _mm512_set1_ps(sscale);
  const int nj32 = (nj + 31) / 32 * 32;
  for (int i0 = 0; i0 < ti->lanes; i0 += 16) {
    __m512 mold = _mm512_loadu_ps(m + i0), mx = mold;
    for (int j = 0; j < nj; j++) {
      float *row = S + j * CPU_BR + i0;
      __m512 x = transform16(_mm512_mul_ps(_mm512_loadu_ps(row), sc), j, i0, ti, NULL);
      _mm512_storeu_ps(row, x);
      mx = _mm512_max_ps(mx, x);
    }
    __m512 mu = _mm512_mask_mov_ps(mx, _mm512_cmpeq_ps_mask(mx, ninf), _mm512_setzero_ps());
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    for (int jb = 0; jb < nj32; jb += 16) {
      __m512 p[16];
      for (int r = 0; r < 16; r++) {
        p[r] = jb + r < nj ? exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(S + (jb + r) * CPU_BR + i0), mu))
                           : _mm512_setzero_ps();
        if (r & 1) s1 = _mm512_add_ps(s1, p[r]);
        else s0 = _mm512_add_ps(s0, p[r]);
      }
      transpose16(p); /* p[c]: lane i0 + c, keys jb .. jb + 15 */
      for (int c = 0; c < 16; c++)
        _mm256_storeu_si256((__m256i *)(P + (size_t)(i0 + c) * CPU_BC + jb),
                            (__m256i)_mm512_cvtneps_pbh(p[c]));
    }
    __m512 a = exp2_ps(_mm512_sub_ps(mold, mu));
    _mm512_storeu_ps(alpha + i0, a);
    _mm512_storeu_ps(l + i0, _mm512_fmadd_ps(_mm512_loadu_ps(l + i0), a, _mm512_add_ps(s0, s1)));
    _mm512_storeu_ps(m + i0, mx);
  }
}

/* Row pairs as B tiles: dst [n32/2][D][2] = src rows [n][D] (stride ld), zero rows from n
 * up to n32 (n rounded up to 32). */
static void amx_pack_pairs(uint16_t *dst, const uint16_t *src, int64_t ld, int n, int D) {
  const int n32 = (n + 31) / 32 * 32;
  __m512i lo_idx, hi_idx;
  uint16_t il[32], ih[32];
  for (int t = 0; t < 16; t++) {
    il[2 * t] = (uint16_t)t, il[2 * t + 1] = (uint16_t)(32 + t);
    ih[2 * t] = (uint16_t)(16 + t), ih[2 * t + 1] = (uint16_t)(48 + t);
  }
  lo_idx = _mm512_loadu_si512(il);
  hi_idx = _mm512_loadu_si512(ih);
  for (int j = 0; j < n32; j += 2) {
    const uint16_t *a = src + j * ld, *b = a + ld;
    uint16_t *o = dst + (size_t)(j / 2) * D * 2;
    for (int d0 = 0; d0 < D; d0 += 32) {
      __m512i x = j < n ? _mm512_loadu_si512(a + d0) : _mm512_setzero_si512();
      __m512i y = j + 1 < n ? _mm512_loadu_si512(b + d0) : _mm512_setzero_si512();
      _mm512_storeu_si512(o + 2 * d0, _mm512_permutex2var_epi16(x, lo_idx, y));
      _mm512_storeu_si512(o + 2 * d0 + 32, _mm512_permutex2var_epi16(x, hi_idx, y));
    }
  }
}

/* Lanes as B tiles: dst [D/2][CPU_BR][2] (pair d/2, lane i) = src rows [rows][D] (stride
 * ld), lanes from rows up to a multiple of 32 zero. A bf16 pair is one 32-bit word, so
 * this is a 16 x 16 transpose of words. */
static void amx_pack_lanes(uint16_t *dst, const uint16_t *src, int64_t ld, int rows, int D) {
  const int l32 = (rows + 31) / 32 * 32;
  for (int i0 = 0; i0 < l32; i0 += 16)
    for (int w0 = 0; w0 < D / 2; w0 += 16) {
      __m512 r[16];
      for (int i = 0; i < 16; i++)
        r[i] = i0 + i < rows ? _mm512_castsi512_ps(_mm512_loadu_si512(src + (i0 + i) * ld + 2 * w0))
                             : _mm512_setzero_ps();
      transpose16(r);
      for (int w = 0; w < 16; w++) _mm512_storeu_ps(dst + ((size_t)(w0 + w) * CPU_BR + i0) * 2, r[w]);
    }
}

/* C rows [i0, i0 + 16·(1 + two)) x columns [n0, n0 + 32) += A · B over K. */
static inline void gemm_block(float *C, int64_t ldc, const uint16_t *A, int64_t lda,
                              const uint16_t *B, int N, int K, int i0, int n0, int two) {
  float *c = C + (size_t)i0 * ldc + n0;
  _tile_loadd(0, c, ldc * 4);
  _tile_loadd(1, c + 16, ldc * 4);
  if (two) {
    _tile_loadd(2, c + 16 * ldc, ldc * 4);
    _tile_loadd(3, c + 16 * ldc + 16, ldc * 4);
  }
  for (int k0 = 0; k0 < K; k0 += 32) {
    const uint16_t *pa = A + (size_t)i0 * lda + k0, *vb = B + (size_t)(k0 / 2) * N * 2 + 2 * n0;
    _tile_loadd(4, pa, lda * 2);
    _tile_loadd(6, vb, N * 4);
    _tile_loadd(7, vb + 32, N * 4);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if (two) {
      _tile_loadd(5, pa + 16 * lda, lda * 2);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, ldc * 4);
  _tile_stored(1, c + 16, ldc * 4);
  if (two) {
    _tile_stored(2, c + 16 * ldc, ldc * 4);
    _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
  }
}

static void amx_gemm(float *C, int64_t ldc, const uint16_t *A, int64_t lda, const uint16_t *B,
                     int M, int N, int K) {
  for (int i0 = 0; i0 < M; i0 += 32)
    for (int n0 = 0; n0 < N; n0 += 32) gemm_block(C, ldc, A, lda, B, N, K, i0, n0, M - i0 >= 32);
}

/* The safe P·V of a V tile that holds NaN or Inf: a zero probability adds nothing. */
static void pv_safe(float *O, int D, const uint16_t *P, const uint16_t *v, int64_t ldv, int nj,
                    int lanes) {
  for (int i = 0; i < lanes; i++)
    for (int j = 0; j < nj; j++) {
      uint32_t pb = (uint32_t)P[(size_t)i * CPU_BC + j] << 16;
      float p;
      memcpy(&p, &pb, 4);
      if (p == 0.0f) continue;
      const __m512 pp = _mm512_set1_ps(p);
      for (int d0 = 0; d0 < D; d0 += 16) {
        __m512 x = _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(v + j * ldv + d0))), 16));
        _mm512_storeu_ps(O + (size_t)i * D + d0,
                         _mm512_fmadd_ps(pp, x, _mm512_loadu_ps(O + (size_t)i * D + d0)));
      }
    }
}

static void amx_pv(float *O, int D, const uint16_t *P, const uint16_t *v, int64_t ldv, int nj,
                   int lanes, const float *alpha, int safe, uint16_t *vv) {
  for (int i = 0; i < lanes; i++) {
    if (alpha[i] == 1.0f) continue;
    const __m512 a = _mm512_set1_ps(alpha[i]);
    for (int d0 = 0; d0 < D; d0 += 16)
      _mm512_storeu_ps(O + (size_t)i * D + d0, _mm512_mul_ps(a, _mm512_loadu_ps(O + (size_t)i * D + d0)));
  }
  if (safe) {
    pv_safe(O, D, P, v, ldv, nj, lanes);
    return;
  }
  amx_pack_pairs(vv, v, ldv, nj, D);
  amx_gemm(O, D, P, CPU_BC, vv, lanes, D, (nj + 31) / 32 * 32);
}

/* ---- backward ------------------------------------------------------------------------ */
static inline void store_bf16(uint16_t *dst, __m512 x) {
  _mm256_storeu_si256((__m256i *)dst, (__m256i)_mm512_cvtneps_pbh(x));
}

static void amx_probs(float *S, int nj, const cpu_tile_info *ti, float sscale,
                      const float *lse2, float *T, uint16_t *Pt) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY), pinf = _mm512_set1_ps(INFINITY);
  const __m512 sc = _mm512_set1_ps(sscale);
  const int lanes = ti->lanes, pad = (lanes + 31) / 32 * 32 > lanes;
  for (int j = 0; j < nj; j++) {
    for (int i0 = 0; i0 < lanes; i0 += 16) {
      float *row = S + j * CPU_BR + i0;
      __m512 t = _mm512_setzero_ps();
      __m512 x = transform16(_mm512_mul_ps(_mm512_loadu_ps(row), sc), j, i0, ti, &t);
      if (T) _mm512_storeu_ps(T + j * CPU_BR + i0, t);
      const __m512 l2 = _mm512_loadu_ps(lse2 + i0);
      __m512 p = exp2_ps(_mm512_sub_ps(x, l2));
      /* masked keys, and unused lanes (lse2 +inf; their scores may be NaN from NaN K) */
      p = _mm512_mask_mov_ps(p, _mm512_cmpeq_ps_mask(x, ninf) | _mm512_cmpeq_ps_mask(l2, pinf),
                             _mm512_setzero_ps());
      _mm512_storeu_ps(row, p);
      store_bf16(Pt + j * CPU_BR + i0, p);
    }
    if (pad) store_bf16(Pt + j * CPU_BR + lanes, _mm512_setzero_ps());
  }
}

static void amx_dscores(float *dP, const float *P, const float *T, int nj, int lanes,
                        const float *delta, float factor, uint16_t *dSt, uint16_t *dS) {
  const __m512 f = _mm512_set1_ps(factor), one = _mm512_set1_ps(1.0f), z = _mm512_setzero_ps();
  const int nj32 = (nj + 31) / 32 * 32;
  for (int i0 = 0; i0 < lanes; i0 += 16) {
    const __m512 dl = _mm512_loadu_ps(delta + i0);
    for (int jb = 0; jb < nj32; jb += 16) {
      __m512 r[16];
      for (int c = 0; c < 16; c++) {
        const int j = jb + c, e = j * CPU_BR + i0;
        if (j >= nj) {
          r[c] = z;
          continue;
        }
        __m512 p = _mm512_loadu_ps(P + e);
        __m512 ds = _mm512_mul_ps(_mm512_mul_ps(f, p), _mm512_sub_ps(_mm512_loadu_ps(dP + e), dl));
        if (T) {
          __m512 t = _mm512_loadu_ps(T + e);
          ds = _mm512_mul_ps(ds, _mm512_fnmadd_ps(t, t, one));
        }
        ds = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(p, z, _CMP_NEQ_UQ), ds);
        _mm512_storeu_ps(dP + e, ds);
        store_bf16(dSt + j * CPU_BR + i0, ds);
        r[c] = ds;
      }
      transpose16(r); /* r[c]: lane i0 + c, keys jb .. jb + 15 */
      for (int c = 0; c < 16; c++) store_bf16(dS + (size_t)(i0 + c) * CPU_BC + jb, r[c]);
    }
  }
  if ((lanes + 31) / 32 * 32 > lanes)
    for (int j = 0; j < nj; j++) store_bf16(dSt + j * CPU_BR + lanes, z);
}

/* ---- availability -------------------------------------------------------------------- */
#define AMX_ARCH_REQ_XCOMP_PERM 0x1023
#define AMX_XFEATURE_XTILEDATA 18

static int amx_ok;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void amx_probe(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
  const int tile = (d >> 24) & 1, bf16 = (d >> 22) & 1;
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return;
  const int avx512bf16 = (a >> 5) & 1;
  if (!tile || !bf16 || !avx512bf16) return;
  /* the kernel enables the tile data state per process, on request */
  amx_ok = syscall(SYS_arch_prctl, AMX_ARCH_REQ_XCOMP_PERM, AMX_XFEATURE_XTILEDATA) == 0;
}

static const cpu_amx_ops amx_ops = {amx_begin,      amx_end,    amx_pack_q, amx_scores,
                                    amx_softmax,    amx_pv,     amx_pack_lanes, amx_pack_pairs,
                                    amx_gemm,       amx_probs,  amx_dscores};

const cpu_amx_ops *attn__cpu_amx(void) {
  pthread_once(&amx_once, amx_probe);
  return amx_ok ? &amx_ops : NULL;
}
