/* avx512_math.h — AVX-512 vector math shared by the AVX-512 and AMX tile primitives: 2^x,
 * tanh, the score transform (softcap, ALiBi, masks) and 16 x 16 transposes. Include only
 * from translation units compiled with -mavx512f -mavx512bw -mavx512dq -mavx512vl. */
#ifndef ATTN_AVX512_MATH_H
#define ATTN_AVX512_MATH_H

#include "cpu.h"

#include <immintrin.h>

/* ---- vector math -------------------------------------------------------------------- */
/* 2^x for float32: round-to-nearest split, degree-6 polynomial on [-0.5, 0.5] (Cephes
 * exp2f coefficients), vscalefps for the exponent. -inf → 0; NaN stays NaN. */
static inline __m512 exp2_ps(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-150.0f), x); /* NaN in x survives (second operand) */
  x = _mm512_min_ps(_mm512_set1_ps(128.0f), x);
  __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

/* tanh(x) = 1 - 2/(2^(2x*log2e) + 1); saturates correctly at both ends. */
static inline __m512 tanh_ps(__m512 x) {
  __m512 e = exp2_ps(_mm512_mul_ps(x, _mm512_set1_ps(2.0f * CPU_LOG2E)));
  __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
}

/* Transform one row j of 16 lanes starting at lane i0 (softcap, ALiBi, mask). */
static inline __m512 transform16(__m512 s, int j, int i0, const cpu_tile_info *ti,
                                 __m512 *t_out) {
  if (ti->softcap2 > 0.0f) {
    __m512 t = tanh_ps(s);
    if (t_out) *t_out = t;
    s = _mm512_mul_ps(_mm512_set1_ps(ti->softcap2), t);
  }
  if (ti->alibi) {
    __m512 d = _mm512_sub_ps(_mm512_loadu_ps(ti->ipos + i0), _mm512_set1_ps((float)j));
    d = _mm512_abs_ps(d);
    s = _mm512_fnmadd_ps(_mm512_loadu_ps(ti->alibi2 + i0), d, s);
  }
  if (ti->partial) {
    __m512i jv = _mm512_set1_epi32(j);
    __mmask16 ok = _mm512_cmple_epi32_mask(_mm512_loadu_si512(ti->lo + i0), jv) &
                   _mm512_cmpge_epi32_mask(_mm512_loadu_si512(ti->hi + i0), jv);
    if (ti->elem) {
      __m128i e = _mm_loadu_si128((const __m128i *)(ti->elem + j * CPU_BR + i0));
      ok &= _mm_cmpneq_epi8_mask(e, _mm_setzero_si128());
    }
    s = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), ok, s);
  }
  return s;
}

/* ---- 16 x 16 transposes ---------------------------------------------------------------
 * In: r[i][j]; out: r[j][i]. unpack pairs rows, shuffle_ps forms 4x4 blocks in each
 * 128-bit lane (u[4g+c] lane L = column 4L+c of rows 4g..4g+3), then two rounds of
 * shuffle_f32x4 gather lane L of u[c], u[4+c], u[8+c], u[12+c]. */
static inline void transpose16(__m512 r[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int c = 0; c < 4; c++) {
    __m512 x0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);
    __m512 x1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);
    __m512 y0 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
    __m512 y1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
    r[c] = _mm512_shuffle_f32x4(x0, y0, 0x88);
    r[8 + c] = _mm512_shuffle_f32x4(x0, y0, 0xDD);
    r[4 + c] = _mm512_shuffle_f32x4(x1, y1, 0x88);
    r[12 + c] = _mm512_shuffle_f32x4(x1, y1, 0xDD);
  }
}

static inline __mmask16 first_n(int n) {
  return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1u);
}

#endif
