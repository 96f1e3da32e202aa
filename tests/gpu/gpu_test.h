/* gpu_test.h — what the CUDA runtime tests (test_cuda_ring.c, test_cuda_layer.c,
 * test_cuda_runtime.c) share: host conversions between float32 and the bf16 / fp16 storage
 * types (round to nearest even, as the kernels' own packing does), and whether the test
 * runs on the emulated device (ATTN_TEST_EMULATED: smaller shapes). Header only. */
#ifndef ATTN_GPU_TEST_H
#define ATTN_GPU_TEST_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attnrun.h"

#ifdef ATTN_TEST_EMULATED
enum { EMULATED = 1 };
#else
enum { EMULATED = 0 };
#endif

static inline uint16_t gt_to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline float gt_from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* IEEE binary16: overflow to inf, subnormals below 2^-14, NaN stays NaN. */
static inline uint16_t gt_to_f16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;  /* NaN */
  if (a >= 0x477ff000u) return sign | 0x7c00u; /* rounds to inf (>= 65520) */
  if (a < 0x38800000u) {                        /* below 2^-14: a multiple of 2^-24 */
    float f;
    memcpy(&f, &a, 4);
    return sign | (uint16_t)rintf(f * 16777216.0f);
  }
  a -= 112u << 23; /* exponent bias 127 -> 15 */
  a += 0xfffu + ((a >> 13) & 1u);
  return sign | (uint16_t)(a >> 13);
}

static inline float gt_from_f16(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float f = ldexpf((float)m, -24);
    return sign ? -f : f;
  }
  uint32_t u = sign | (e == 31 ? 0x7f800000u | (m << 13) : ((e + 112u) << 23) | (m << 13));
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* x rounded to dtype dt (float32: unchanged). */
static inline float gt_round(float x, attn_dtype dt) {
  return dt == ATTN_BF16 ? gt_from_bf16(gt_to_bf16(x)) : dt == ATTN_F16 ? gt_from_f16(gt_to_f16(x)) : x;
}

#endif
