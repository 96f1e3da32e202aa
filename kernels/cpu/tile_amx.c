/* tile_amx.c — the bf16 forward's tile kernels on Intel AMX (AMX-BF16, Sapphire Rapids and
 * later): S^T = K·Q^T and O += P·V as bf16 tile products with float32 accumulation, the
 * online softmax in AVX-512 between them. P is rounded to bf16 for P·V, as GPU flash
 * kernels do, so results differ from the float32 path by that rounding (the 2x rule).
 * Compiled with -mamx-tile -mamx-bf16 -mavx512bf16 in this unit only; picked at run time
 * when CPUID says AMX-BF16 and the kernel grants the tile data state (arch_prctl).
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

/* V rows [nj][D] (stride ldv) as B tiles: vv [nj32/2][D][2], zero keys past nj. */
static void pack_v(uint16_t *vv, const uint16_t *v, int64_t ldv, int nj, int D) {
  const int nj32 = (nj + 31) / 32 * 32;
  __m512i lo_idx, hi_idx;
  uint16_t il[32], ih[32];
  for (int t = 0; t < 16; t++) {
    il[2 * t] = (uint16_t)t, il[2 * t + 1] = (uint16_t)(32 + t);
    ih[2 * t] = (uint16_t)(16 + t), ih[2 * t + 1] = (uint16_t)(48 + t);
  }
  lo_idx = _mm512_loadu_si512(il);
  hi_idx = _mm512_loadu_si512(ih);
  for (int j = 0; j < nj32; j += 2) {
    const uint16_t *a = v + j * ldv, *b = a + ldv;
    uint16_t *o = vv + (size_t)(j / 2) * D * 2;
    for (int d0 = 0; d0 < D; d0 += 32) {
      __m512i x = j < nj ? _mm512_loadu_si512(a + d0) : _mm512_setzero_si512();
      __m512i y = j + 1 < nj ? _mm512_loadu_si512(b + d0) : _mm512_setzero_si512();
      _mm512_storeu_si512(o + 2 * d0, _mm512_permutex2var_epi16(x, lo_idx, y));
      _mm512_storeu_si512(o + 2 * d0 + 32, _mm512_permutex2var_epi16(x, hi_idx, y));
    }
  }
}

/* O rows [i0, i0 + 16·(1 + two)) x columns [d0, d0 + 32) += P · V over nj32 keys. */
static inline void pv_block(float *O, int D, const uint16_t *P, const uint16_t *vv, int nj32,
                            int i0, int d0, int two) {
  float *o = O + (size_t)i0 * D + d0;
  _tile_loadd(0, o, D * 4);
  _tile_loadd(1, o + 16, D * 4);
  if (two) {
    _tile_loadd(2, o + 16 * D, D * 4);
    _tile_loadd(3, o + 16 * D + 16, D * 4);
  }
  for (int j0 = 0; j0 < nj32; j0 += 32) {
    const uint16_t *pa = P + (size_t)i0 * CPU_BC + j0, *vb = vv + (size_t)(j0 / 2) * D * 2 + 2 * d0;
    _tile_loadd(4, pa, CPU_BC * 2);
    _tile_loadd(6, vb, D * 4);
    _tile_loadd(7, vb + 32, D * 4);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if (two) {
      _tile_loadd(5, pa + 16 * CPU_BC, CPU_BC * 2);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, o, D * 4);
  _tile_stored(1, o + 16, D * 4);
  if (two) {
    _tile_stored(2, o + 16 * D, D * 4);
    _tile_stored(3, o + 16 * D + 16, D * 4);
  }
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
  const int nj32 = (nj + 31) / 32 * 32;
  pack_v(vv, v, ldv, nj, D);
  for (int i0 = 0; i0 < lanes; i0 += 32)
    for (int d0 = 0; d0 < D; d0 += 32) pv_block(O, D, P, vv, nj32, i0, d0, lanes - i0 >= 32);
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

static const cpu_amx_ops amx_ops = {amx_begin, amx_end, amx_pack_q, amx_scores, amx_softmax,
                                    amx_pv};

const cpu_amx_ops *attn__cpu_amx(void) {
  pthread_once(&amx_once, amx_probe);
  return amx_ok ? &amx_ops : NULL;
}
