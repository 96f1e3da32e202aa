/* timing.c — what the CPU benchmark's sections share: the clock, the timing loop (median
 * and min of repeated runs), the counter-based input fill and the bf16/f16 conversions. */
#include "bench.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

double bench_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

bench_timing bench_time(bench_run_fn fn, void *arg, double budget_s, int min_reps) {
  double t0 = bench_now_s();
  fn(arg);
  double warm = bench_now_s() - t0;
  int reps = warm > 0 && budget_s / warm < BENCH_MAX_REPS ? (int)(budget_s / warm) : BENCH_MAX_REPS;
  if (reps < min_reps) reps = min_reps;
  if (reps > BENCH_MAX_REPS) reps = BENCH_MAX_REPS;
  double t[BENCH_MAX_REPS];
  for (int r = 0; r < reps; r++) {
    t0 = bench_now_s();
    fn(arg);
    t[r] = bench_now_s() - t0;
  }
  qsort(t, (size_t)reps, sizeof(double), cmp_double);
  bench_timing res = {reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]), t[0], reps};
  return res;
}

/* Uniform in [-1, 1) times amp. amp = sqrt(3) gives unit variance, so scores
 * q.k/sqrt(d) have unit variance too. */
void bench_fill(float *x, int64_t count, uint64_t seed, float amp) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; i++) {
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + (uint64_t)i + 1;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    x[i] = amp * (float)((double)(z >> 40) * (2.0 / 16777216.0) - 1.0);
  }
}

uint16_t bench_half_bits(float x, attn_dtype t) {
  uint16_t b;
  if (t == ATTN_F16) {
    _Float16 h = (_Float16)x;
    memcpy(&b, &h, 2);
    return b;
  }
  uint32_t u;
  memcpy(&u, &x, 4);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
float bench_half_value(uint16_t b, attn_dtype t) {
  if (t == ATTN_F16) {
    _Float16 h;
    memcpy(&h, &b, 2);
    return (float)h;
  }
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
