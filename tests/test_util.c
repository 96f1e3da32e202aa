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

int tu_run_parts(const char *test, int argc, char **argv, const tu_part *parts, int count) {
  const char *part = argc > 1 ? argv[1] : parts[0].name;
  for (int i = 0; i < count; i++)
    if (!strcmp(part, parts[i].name)) {
      parts[i].run();
      char name[128];
      snprintf(name, sizeof name, "%s %s", test, part);
      return tu_finish(name);
    }
  fprintf(stderr, "%s: unknown part %s (parts:", test, part);
  for (int i = 0; i < count; i++) fprintf(stderr, " %s", parts[i].name);
  fprintf(stderr, ")\n");
  return 2;
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

void tu_print_index(int64_t idx, const int64_t *dims) {
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
double tu_element_error(double got, double ref) {
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
    double e = tu_element_error((double)got[i], r);
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
  tu_print_index(wi, dims);
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

void tu_varlen(attn_spec *spec, int nseq, const int32_t *lq, const int32_t *lkv,
               int32_t **cu_q, int32_t **cu_kv, int64_t *Sq, int64_t *Skv) {
  *cu_q = tu_alloc((size_t)(nseq + 1) * sizeof(int32_t));
  *cu_kv = tu_alloc((size_t)(nseq + 1) * sizeof(int32_t));
  for (int s = 0; s < nseq; s++) {
    (*cu_q)[s + 1] = (*cu_q)[s] + lq[s];
    (*cu_kv)[s + 1] = (*cu_kv)[s] + lkv[s];
  }
  *Sq = (*cu_q)[nseq];
  *Skv = (*cu_kv)[nseq];
  spec->cu_seqlens_q = *cu_q;
  spec->cu_seqlens_kv = *cu_kv;
  spec->num_seqs = nseq;
}

void tu_block_mask(attn_spec *spec, attn_block_mask *bm, uint8_t **mask, int64_t Sq,
                   int64_t Skv, int nseq, const int32_t *lq, const int32_t *lkv, int bq, int bk,
                   int short_by_one, const uint8_t *bits, uint64_t seed) {
  int64_t maxq = Sq, maxk = Skv; /* sequence-local extents */
  if (nseq) {
    maxq = maxk = 1;
    for (int s = 0; s < nseq; s++) {
      maxq = lq[s] > maxq ? lq[s] : maxq;
      maxk = lkv[s] > maxk ? lkv[s] : maxk;
    }
  }
  bm->block_q = bq;
  bm->block_k = bk;
  bm->num_q_blocks = (maxq + bq - 1) / bq;
  bm->num_k_blocks = (maxk + bk - 1) / bk;
  if (short_by_one) {
    bm->num_q_blocks = bm->num_q_blocks > 1 ? bm->num_q_blocks - 1 : 1;
    bm->num_k_blocks = bm->num_k_blocks > 1 ? bm->num_k_blocks - 1 : 1;
  }
  const int64_t n = bm->num_q_blocks * bm->num_k_blocks;
  *mask = tu_alloc((size_t)n);
  tu_rng r = tu_rng_make(seed);
  for (int64_t x = 0; x < n; x++) (*mask)[x] = bits ? bits[x] : (tu_next(&r) % 3) != 0;
  bm->mask = *mask;
  spec->block_mask = bm;
}

/* ---- bf16 / f16 rounding (round to nearest even) ------------------------------------ */
uint16_t tu_to_bits(float x, int dtype) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if (dtype == ATTN_BF16) {
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
  }
  uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u);
  if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);
  if (a < 0x38800000u) {
    float f;
    memcpy(&f, &a, 4);
    return (uint16_t)(sign | (uint32_t)nearbyintf(f * 16777216.0f));
  }
  uint32_t r = a + 0xFFFu + ((a >> 13) & 1u);
  return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

float tu_from_bits(uint16_t h, int dtype) {
  uint32_t u;
  float f;
  if (dtype == ATTN_BF16) {
    u = (uint32_t)h << 16;
  } else {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0) {
      f = ldexpf((float)m, -24);
      return sign ? -f : f;
    }
    u = e == 31 ? sign | 0x7F800000u | (m << 13) : sign | ((e + 112) << 23) | (m << 13);
  }
  memcpy(&f, &u, 4);
  return f;
}

float tu_round(float x, int dtype) {
  return dtype == ATTN_F32 ? x : tu_from_bits(tu_to_bits(x, dtype), dtype);
}
