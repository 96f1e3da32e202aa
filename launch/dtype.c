/* dtype.c — bf16 and IEEE binary16 conversions for attnrun's inputs and outputs, written
 * on the bit patterns: bf16 is the top half of a float32 (round by adding 0x7fff plus the
 * kept lowest bit); f16 rebiases the exponent and rounds 13 mantissa bits away the same
 * way, with its subnormals (below 2^-14) rounded by rintf in the default, nearest-even
 * mode on the value scaled by 2^24, and values from 65520 up going to infinity. */
#include "dtype.h"

#include <math.h>
#include <string.h>

static uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float float_of(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint16_t to_bf16(float f) {
  uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h) { return float_of((uint32_t)h << 16); }

static uint16_t to_f16(float f) {
  uint32_t u = bits_of(f), a = u & 0x7fffffffu;
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  if (a > 0x7f800000u) return sign | 0x7e00u; /* NaN */
  if (a >= 0x477ff000u) return sign | 0x7c00u; /* >= 65520: rounds past 65504 */
  if (a < 0x38800000u) /* below 2^-14: a multiple of 2^-24 (1024 is the least normal) */
    return sign | (uint16_t)rintf(float_of(a) * 16777216.0f);
  uint32_t r = a - (112u << 23); /* exponent bias 127 -> 15 */
  r += 0xfffu + ((r >> 13) & 1u);
  return sign | (uint16_t)(r >> 13);
}

static float from_f16(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v = e == 0 ? ldexpf((float)m, -24)
            : e == 31 ? (m ? NAN : INFINITY)
                      : ldexpf((float)(m | 0x400), e - 25);
  return (h & 0x8000u) ? -v : v;
}

float dtype_round(float x, attn_dtype t) {
  if (t == ATTN_BF16) return from_bf16(to_bf16(x));
  if (t == ATTN_F16) return from_f16(to_f16(x));
  return x;
}

void dtype_round_all(float *x, int64_t n, attn_dtype t) {
  if (t == ATTN_F32) return;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++)
    x[i] = dtype_round(x[i], t);
}

void dtype_pack(const float *src, int64_t n, attn_dtype t, void *dst) {
  uint16_t *h = dst;
  if (t == ATTN_F32) {
    memcpy(dst, src, (size_t)n * sizeof(float));
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++)
    h[i] = t == ATTN_BF16 ? to_bf16(src[i]) : to_f16(src[i]);
}

void dtype_unpack(const void *src, int64_t n, attn_dtype t, float *dst) {
  const uint16_t *h = src;
  if (t == ATTN_F32) {
    memcpy(dst, src, (size_t)n * sizeof(float));
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++)
    dst[i] = t == ATTN_BF16 ? from_bf16(h[i]) : from_f16(h[i]);
}
