/* rope.c — rotary position embedding on Q and K after projection (and its transpose on dQ,
 * dK in backward); the pairing convention is stated in rope.h. */
#include "rope.h"

#include <omp.h>

static int resolve_threads(int threads) { return threads > 0 ? threads : omp_get_max_threads(); }

void attn__rope_table(float theta, int64_t dim, const int64_t *pos, int64_t rows, float *cos_t,
                      float *sin_t, int threads) {
  int64_t half = dim / 2;
#pragma omp parallel for schedule(static) num_threads(resolve_threads(threads))
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t i = 0; i < half; i++) {
      double inv_freq = pow((double)theta, -2.0 * (double)i / (double)dim);
      double angle = (double)pos[r] * inv_freq;
      cos_t[r * half + i] = (float)cos(angle);
      sin_t[r * half + i] = (float)sin(angle);
    }
  }
}

/* One head row: rotate by +angle, or by -angle when inverse. */
static void rotate_row(float *x, int64_t half, const float *c, const float *s, int inverse) {
  float sign = inverse ? -1.0f : 1.0f;
  for (int64_t i = 0; i < half; i++) {
    float a = x[i], b = x[i + half], sn = sign * s[i];
    x[i] = a * c[i] - b * sn;
    x[i + half] = a * sn + b * c[i];
  }
}

void attn__rope_apply(attn__view x, int64_t B, int64_t S, int64_t H, int64_t dim,
                      const float *cos_t, const float *sin_t, int inverse, int threads) {
  int64_t half = dim / 2;
#pragma omp parallel for collapse(2) schedule(static) num_threads(resolve_threads(threads))
  for (int64_t b = 0; b < B; b++)
    for (int64_t s = 0; s < S; s++)
      for (int64_t h = 0; h < H; h++)
        rotate_row(x.p + b * x.sb + s * x.ss + h * x.sh, half, cos_t + s * half,
                   sin_t + s * half, inverse);
}
