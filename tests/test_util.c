/* test_util.c — RNG, poisoning and compare-with-report helpers for the unit tests. */
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int tu_failures = 0;

int tu_finish(const char *test_name) {
  if (tu_failures) {
    printf("%s: %d failure(s)\n", test_name, tu_failures);
    return 1;
  }
  printf("%s: all passed\n", test_name);
  return 0;
}

tu_rng tu_rng_make(uint64_t seed) {
  tu_rng r = {seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull};
  return r;
}

uint64_t tu_next(tu_rng *r) {
  uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double tu_uniform(tu_rng *r, double lo, double hi) {
  return lo + (hi - lo) * ((double)(tu_next(r) >> 11) * 0x1.0p-53);
}

int64_t tu_randint(tu_rng *r, int64_t lo, int64_t hi) {
  return lo + (int64_t)(tu_next(r) % (uint64_t)(hi - lo + 1));
}

void tu_fill(float *x, int64_t n, double lo, double hi, uint64_t seed) {
  tu_rng r = tu_rng_make(seed);
  for (int64_t i = 0; i < n; i++) {
    float f = (float)tu_uniform(&r, lo, hi);
    x[i] = f != 0.0f ? f : 0.5f * (float)hi;
  }
}

void *tu_alloc(size_t bytes) {
  void *p = calloc(bytes ? bytes : 1, 1);
  if (!p) {
    fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
    abort();
  }
  return p;
}

float *tu_falloc(int64_t n) {
  float *p = tu_alloc((size_t)n * sizeof(float));
  tu_poison(p, n);
  return p;
}

double *tu_dalloc(int64_t n) { return tu_alloc((size_t)n * sizeof(double)); }

float tu_poison_value(void) {
  uint32_t bits = 0x7FC0DEADu;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

void tu_poison(float *x, int64_t n) {
  float p = tu_poison_value();
  for (int64_t i = 0; i < n; i++) x[i] = p;
}

int64_t tu_count_poison(const float *x, int64_t n) {
  float p = tu_poison_value();
  int64_t c = 0;
  for (int64_t i = 0; i < n; i++) c += memcmp(&x[i], &p, sizeof p) == 0;
  return c;
}

double tu_max_abs(const double *x, int64_t n) {
  double m = 0.0;
  for (int64_t i = 0; i < n; i++)
    if (isfinite(x[i]) && fabs(x[i]) > m) m = fabs(x[i]);
  return m;
}

static void print_index(int64_t idx, const int64_t *dims) {
  if (!dims) {
    fprintf(stderr, "[%lld]", (long long)idx);
    return;
  }
  int64_t c[4];
  for (int a = 3; a >= 0; a--) {
    c[a] = idx % dims[a];
    idx /= dims[a];
  }
  fprintf(stderr, "[%lld,%lld,%lld,%lld]", (long long)c[0], (long long)c[1], (long long)c[2],
          (long long)c[3]);
}

/* Badness of one element: +inf for a non-finite mismatch, else |got - ref|. */
static double element_error(double got, double ref) {
  if (isinf(ref)) return got == ref ? 0.0 : INFINITY;
  if (!isfinite(got)) return INFINITY;
  return fabs(got - ref);
}

static int compare_impl(const char *what, const float *got, const double *refd,
                        const float *reff, int64_t n, const int64_t *dims, double rtol,
                        double atol) {
  double maxref = 0.0, worst = -1.0;
  int64_t wi = -1;
  for (int64_t i = 0; i < n; i++) {
    double r = refd ? refd[i] : (double)reff[i];
    if (isfinite(r) && fabs(r) > maxref) maxref = fabs(r);
  }
  for (int64_t i = 0; i < n; i++) {
    double r = refd ? refd[i] : (double)reff[i];
    double e = element_error((double)got[i], r);
    if (e > worst) {
      worst = e;
      wi = i;
    }
  }
  double tol = rtol * maxref + atol;
  if (n == 0 || worst <= tol) return 1;
  tu_failures++;
  double r = refd ? refd[wi] : (double)reff[wi];
  fprintf(stderr, "FAIL %s: max err %.3e > tol %.3e (max|ref| %.3e); worst at ", what, worst,
          tol, maxref);
  print_index(wi, dims);
  fprintf(stderr, " got %.9g ref %.9g%s\n", (double)got[wi], r,
          tu_count_poison(got + wi, 1) ? " (poison: never written)" : "");
  return 0;
}

int tu_compare(const char *what, const float *got, const double *ref, int64_t n,
               const int64_t *dims, double rtol, double atol) {
  return compare_impl(what, got, ref, NULL, n, dims, rtol, atol);
}

int tu_compare_f(const char *what, const float *got, const float *ref, int64_t n,
                 const int64_t *dims, double rtol, double atol) {
  return compare_impl(what, got, NULL, ref, n, dims, rtol, atol);
}
