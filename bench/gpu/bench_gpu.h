/* bench_gpu.h — what the GPU benchmarks share: the CUDA error check that ends the run, bf16
 * and f16 bits of random inputs in [-1, 1), and the median of sorted timings. Test-side
 * helpers, header-only (each benchmark is one C file). */
#ifndef ATTN_BENCH_GPU_H
#define ATTN_BENCH_GPU_H

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnrun.h"

#ifndef BENCH_GIT_SHA
#define BENCH_GIT_SHA "unknown"
#endif

#define CHECK_CUDA(x)                                                                   \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                            \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

static inline uint16_t to_bits(float x, int dtype) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if (dtype == ATTN_BF16) return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  /* f16 for |x| < 2: normal range only (inputs are in [-1, 1)) */
  uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
  if (a < 0x38800000u) return (uint16_t)sign; /* flush the few subnormal draws */
  return (uint16_t)(sign | ((a + 0xFFFu + ((a >> 13) & 1u) - 0x38000000u) >> 13));
}

static inline float from_bits(uint16_t h, int dtype) {
  uint32_t u;
  if (dtype == ATTN_BF16) {
    u = (uint32_t)h << 16;
  } else {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    u = e == 0 ? sign : sign | ((e + 112) << 23) | (m << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline void fill_random(uint16_t *x, int64_t n, uint64_t seed, int dtype) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; i++) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x[i] = to_bits((float)((double)(s >> 11) * 0x1.0p-53 * 2.0 - 1.0), dtype);
  }
}

static inline int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Median of t[0..n) after sorting it (min: t[0]). */
static inline double sorted_median(double *t, int n) {
  qsort(t, (size_t)n, sizeof t[0], cmp_double);
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

#endif
