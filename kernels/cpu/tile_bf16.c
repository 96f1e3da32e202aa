/* tile_bf16.c — the AVX-512 half of the bf16 tile products, shared by the AMX tiles
 * (tile_amx.c) and the AVX512-BF16 dot products (tile_dpbf16.c): operand packing (bf16
 * pairs as B tiles), the online softmax writing P in bf16, the backward's P and dS, and
 * the safe P·V of a V tile that holds NaN or Inf. Compiled with -mavx512bf16 (for
 * vcvtneps2bf16) in this unit only; called only where CPUID says AVX512-BF16. */
#include "bf16_tiles.h"

#include <string.h>

/* float32 → bf16 bits, nearest even (NaN stays NaN). */
static inline uint16_t bf16_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

void attn__bf16_pack_q(uint16_t *qv, const float *q, int64_t ld, int u, int D) {
  for (int d = 0; d < D; d += 2)
    for (int i = 0; i < CPU_BR; i++) {
      uint16_t *p = qv + (size_t)(d / 2) * CPU_BR * 2 + (size_t)i * 2; /* pair d/2, lane i */
      p[0] = i < u ? bf16_bits(q[i * ld + d]) : 0;
      p[1] = i < u ? bf16_bits(q[i * ld + d + 1]) : 0;
    }
}

/* 2^x for x <= 0 (or NaN), to P's needs: degree-5 polynomial on [-0.5, 0.5], 1.9e-7
 * relative (a least-squares fit weighted to minimax), no upper clamp. -inf → 0. */
static inline __m512 exp2_neg_ps(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-150.0f), x); /* NaN in x survives (second operand) */
  __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.3264718e-3f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6715130e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5507340e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022242e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314700e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

/* The word interleave of a vcvtne2ps2bf16 result: element 2i from i, 2i + 1 from 16 + i. */
static inline __m512i pair_idx(void) {
  uint16_t ix[32];
  for (int t = 0; t < 16; t++) ix[2 * t] = (uint16_t)t, ix[2 * t + 1] = (uint16_t)(16 + t);
  return _mm512_loadu_si512(ix);
}

/* Keys jb .. jb + 31 of 16 lanes from i0: p[r] holds key jb + r's values (float32), rows
 * (lane i0 + c, [CPU_BR][CPU_BC]) get them as bf16; so do the key rows of Xt ([key][CPU_BR],
 * keys below nj) unless NULL. A pair of keys becomes one 32-bit word per lane
 * (vcvtne2ps2bf16, then interleaved), so the transpose is one 16 x 16 of words. */
static inline void store_pairs32(uint16_t *rows, uint16_t *Xt, int nj, int i0, int jb,
                                 const __m512 p[32], __m512i idx) {
  __m512 w[16];
  for (int t = 0; t < 16; t++) {
    const __m512i v = (__m512i)_mm512_cvtne2ps_pbh(p[2 * t + 1], p[2 * t]);
    const int j = jb + 2 * t;
    if (Xt && j < nj) _mm256_storeu_si256((__m256i *)(Xt + j * CPU_BR + i0), _mm512_castsi512_si256(v));
    if (Xt && j + 1 < nj)
      _mm256_storeu_si256((__m256i *)(Xt + (j + 1) * CPU_BR + i0), _mm512_extracti64x4_epi64(v, 1));
    w[t] = _mm512_castsi512_ps(_mm512_permutexvar_epi16(idx, v));
  }
  transpose16(w); /* w[c]: lane i0 + c, key pairs jb/2 .. jb/2 + 15 */
  for (int c = 0; c < 16; c++) _mm512_storeu_ps(rows + (size_t)(i0 + c) * CPU_BC + jb, w[c]);
}

void attn__bf16_softmax(float *S, int nj, const cpu_tile_info *ti, float sscale, float *m,
                        float *l, float *alpha, uint16_t *P) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY), sc = _mm512_set1_ps(sscale);
  /* no transform: the scores are not stored back, x = S * sscale is formed where used */
  const int plain = ti->softcap2 <= 0.0f && !ti->alibi && !ti->partial && sscale > 0.0f;
  const __m512i idx = pair_idx();
  for (int i0 = 0; i0 < ti->lanes; i0 += 16) {
    __m512 mold = _mm512_loadu_ps(m + i0), mx = mold;
    if (plain) {
      __m512 r0 = ninf, r1 = ninf;
      int j = 0;
      for (; j + 1 < nj; j += 2) {
        r0 = _mm512_max_ps(r0, _mm512_loadu_ps(S + j * CPU_BR + i0));
        r1 = _mm512_max_ps(r1, _mm512_loadu_ps(S + (j + 1) * CPU_BR + i0));
      }
      if (j < nj) r0 = _mm512_max_ps(r0, _mm512_loadu_ps(S + j * CPU_BR + i0));
      mx = _mm512_max_ps(mx, _mm512_mul_ps(_mm512_max_ps(r0, r1), sc)); /* sscale > 0 */
    } else {
      for (int j = 0; j < nj; j++) {
        float *row = S + j * CPU_BR + i0;
        __m512 x = transform16(_mm512_mul_ps(_mm512_loadu_ps(row), sc), j, i0, ti, NULL);
        _mm512_storeu_ps(row, x);
        mx = _mm512_max_ps(mx, x);
      }
    }
    __m512 mu = _mm512_mask_mov_ps(mx, _mm512_cmpeq_ps_mask(mx, ninf), _mm512_setzero_ps());
    const __m512 xs = plain ? sc : _mm512_set1_ps(1.0f);
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    for (int jb = 0; jb < nj; jb += 32) {
      __m512 p[32];
      if (nj - jb >= 32) {
        for (int r = 0; r < 32; r++) {
          p[r] = exp2_neg_ps(_mm512_fmsub_ps(_mm512_loadu_ps(S + (jb + r) * CPU_BR + i0), xs, mu));
          if (r & 1) s1 = _mm512_add_ps(s1, p[r]);
          else s0 = _mm512_add_ps(s0, p[r]);
        }
      } else {
        for (int r = 0; r < 32; r++) {
          p[r] = jb + r < nj ? exp2_neg_ps(_mm512_fmsub_ps(
                                   _mm512_loadu_ps(S + (jb + r) * CPU_BR + i0), xs, mu))
                             : _mm512_setzero_ps();
          s0 = _mm512_add_ps(s0, p[r]);
        }
      }
      store_pairs32(P, NULL, nj, i0, jb, p, idx);
    }
    __m512 a = exp2_ps(_mm512_sub_ps(mold, mu));
    _mm512_storeu_ps(alpha + i0, a);
    _mm512_storeu_ps(l + i0, _mm512_fmadd_ps(_mm512_loadu_ps(l + i0), a, _mm512_add_ps(s0, s1)));
    _mm512_storeu_ps(m + i0, mx);
  }
}

/* Row pairs as B tiles: dst [n32/2][D][2] = src rows [n][D] (stride ld), zero rows from n
 * up to n32 (n rounded up to 32). */
void attn__bf16_pack_pairs(uint16_t *dst, const uint16_t *src, int64_t ld, int n, int D) {
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
      const __mmask32 k = D - d0 >= 32 ? 0xffffffffu : 0xffffu; /* a last 16 (D % 32 == 16) */
      __m512i x = j < n ? _mm512_maskz_loadu_epi16(k, a + d0) : _mm512_setzero_si512();
      __m512i y = j + 1 < n ? _mm512_maskz_loadu_epi16(k, b + d0) : _mm512_setzero_si512();
      _mm512_storeu_si512(o + 2 * d0, _mm512_permutex2var_epi16(x, lo_idx, y));
      if (D - d0 >= 32) _mm512_storeu_si512(o + 2 * d0 + 32, _mm512_permutex2var_epi16(x, hi_idx, y));
    }
  }
}

/* Lanes as B tiles: dst [D/2][CPU_BR][2] (pair d/2, lane i) = src rows [rows][D] (stride
 * ld), lanes from rows up to a multiple of 32 zero. A bf16 pair is one 32-bit word, so
 * this is a 16 x 16 transpose of words. */
void attn__bf16_pack_lanes(uint16_t *dst, const uint16_t *src, int64_t ld, int rows, int D) {
  const int l32 = (rows + 31) / 32 * 32;
  for (int i0 = 0; i0 < l32; i0 += 16)
    for (int w0 = 0; w0 < D / 2; w0 += 16) {
      const int nw = D / 2 - w0 >= 16 ? 16 : D / 2 - w0; /* 8 when D % 32 == 16 */
      __m512 r[16];
      for (int i = 0; i < 16; i++)
        r[i] = i0 + i < rows ? _mm512_maskz_loadu_ps(first_n(nw), src + (i0 + i) * ld + 2 * w0)
                             : _mm512_setzero_ps();
      transpose16(r);
      for (int w = 0; w < nw; w++) _mm512_storeu_ps(dst + ((size_t)(w0 + w) * CPU_BR + i0) * 2, r[w]);
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

void attn__bf16_pv(float *O, int D, const uint16_t *P, const uint16_t *vv, const uint16_t *v,
                   int64_t ldv, int nj, int lanes, const float *alpha, int safe,
                   attn__bf16_gemm_fn gemm) {
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
  gemm(O, D, P, CPU_BC, vv, lanes, D, (nj + 31) / 32 * 32);
}

/* ---- backward ------------------------------------------------------------------------ */
static inline void store_bf16(uint16_t *dst, __m512 x) {
  _mm256_storeu_si256((__m256i *)dst, (__m256i)_mm512_cvtneps_pbh(x));
}

void attn__bf16_probs(float *S, int nj, const cpu_tile_info *ti, float sscale,
                      const float *lse2, float *T, uint16_t *Pt) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY), pinf = _mm512_set1_ps(INFINITY);
  const __m512 sc = _mm512_set1_ps(sscale);
  const int lanes = ti->lanes, pad = (lanes + 31) / 32 * 32 > lanes;
  if (ti->softcap2 <= 0.0f && !ti->alibi && !ti->partial) { /* no transform, nothing masked */
    for (int j = 0; j < nj; j++) {
      for (int i0 = 0; i0 < lanes; i0 += 16) {
        float *row = S + j * CPU_BR + i0;
        const __m512 l2 = _mm512_loadu_ps(lse2 + i0);
        __m512 p = exp2_neg_ps(_mm512_fmsub_ps(_mm512_loadu_ps(row), sc, l2));
        p = _mm512_mask_mov_ps(p, _mm512_cmpeq_ps_mask(l2, pinf), _mm512_setzero_ps());
        _mm512_storeu_ps(row, p);
        store_bf16(Pt + j * CPU_BR + i0, p);
      }
      if (pad) store_bf16(Pt + j * CPU_BR + lanes, _mm512_setzero_ps());
    }
    return;
  }
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

void attn__bf16_dscores(float *dP, const float *P, const float *T, int nj, int lanes,
                        const float *delta, float factor, int keep, uint16_t *dSt, uint16_t *dS) {
  const __m512 f = _mm512_set1_ps(factor), one = _mm512_set1_ps(1.0f), z = _mm512_setzero_ps();
  const __m512i idx = pair_idx();
  for (int i0 = 0; i0 < lanes; i0 += 16) {
    const __m512 dl = _mm512_loadu_ps(delta + i0);
    for (int jb = 0; jb < nj; jb += 32) {
      __m512 r[32];
      for (int c = 0; c < 32; c++) {
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
        r[c] = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(p, z, _CMP_NEQ_UQ), ds);
        if (keep) _mm512_storeu_ps(dP + e, r[c]);
      }
      store_pairs32(dS, dSt, nj, i0, jb, r, idx); /* dS rows, and dS^T rows as bf16 */
    }
  }
  if ((lanes + 31) / 32 * 32 > lanes)
    for (int j = 0; j < nj; j++) store_bf16(dSt + j * CPU_BR + lanes, z);
}
