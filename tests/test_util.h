/* test_util.h — small helpers shared by the unit tests: a seeded RNG, NaN poisoning,
 * compare-with-report against float64 references, failure counting. No library calls. */
#ifndef ATTN_TEST_UTIL_H
#define ATTN_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>

#include "attnrun.h" /* types only */

/* ---- failure counting: tests keep going, print every failure, exit non-zero at the end */
extern int tu_failures;
#define TU_CHECK(cond, ...)                                              \
  do {                                                                   \
    if (!(cond)) {                                                       \
      tu_failures++;                                                     \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);    \
      fprintf(stderr, __VA_ARGS__);                                      \
      fprintf(stderr, "\n");                                             \
    }                                                                    \
  } while (0)
/* Prints a summary line and returns the process exit code. */
int tu_finish(const char *test_name);
/* A test binary's parts, one ctest entry each: runs the part argv[1] names (default: the
 * first) and returns tu_finish("<test> <part>"); an unknown part lists them and returns 2. */
typedef struct {
  const char *name;
  void (*run)(void);
} tu_part;
int tu_run_parts(const char *test, int argc, char **argv, const tu_part *parts, int count);

/* ---- RNG: splitmix64, deterministic across platforms -------------------------------- */
typedef struct {
  uint64_t s;
} tu_rng;
tu_rng tu_rng_make(uint64_t seed);
uint64_t tu_next(tu_rng *r);
double tu_uniform(tu_rng *r, double lo, double hi); /* [lo, hi) */
int64_t tu_randint(tu_rng *r, int64_t lo, int64_t hi); /* [lo, hi] */
/* n floats uniform in [lo, hi), never exactly 0 (0 is nudged). */
void tu_fill(float *x, int64_t n, double lo, double hi, uint64_t seed);

/* ---- memory ------------------------------------------------------------------------------ */
void *tu_alloc(size_t bytes);  /* aborts on failure, zeroed */
float *tu_falloc(int64_t n);   /* n floats, poisoned */
double *tu_dalloc(int64_t n);  /* n doubles, zeroed */

/* A quiet NaN with a recognisable payload: poisoned elements that were never written. */
float tu_poison_value(void);
void tu_poison(float *x, int64_t n);
int64_t tu_count_poison(const float *x, int64_t n); /* bitwise poison count */

/* ---- comparison --------------------------------------------------------------------------
 * Passes iff every element is finite where ref is finite, equals ref where ref is
 * +-inf, and max|got - ref| <= rtol * max(|ref|) + atol. On failure prints `what`, the
 * worst element's index (decoded with dims[4] when given, else flat), value and
 * reference. Returns 1 on pass, 0 on failure (and counts the failure). */
int tu_compare(const char *what, const float *got, const double *ref, int64_t n,
               const int64_t *dims, double rtol, double atol);
/* Same for two float arrays (e.g. two library paths); ref is promoted to double. */
int tu_compare_f(const char *what, const float *got, const float *ref, int64_t n,
                 const int64_t *dims, double rtol, double atol);
/* Badness of one element: +inf for a non-finite mismatch, else |got - ref|. */
double tu_element_error(double got, double ref);
/* Prints element idx of a [4] dims tensor as [a,b,c,d] (dims NULL: [idx]) to stderr. */
void tu_print_index(int64_t idx, const int64_t *dims);
/* max |x| over finite elements. */
double tu_max_abs(const double *x, int64_t n);

/* ---- problem set-up shared by the CPU and GPU case harnesses ------------------------- */
/* Varlen: *cu_q, *cu_kv [nseq + 1] (allocated) are the prefix sums of lq, lkv [nseq];
 * spec's varlen fields point at them; *Sq, *Skv get the totals. */
void tu_varlen(attn_spec *spec, int nseq, const int32_t *lq, const int32_t *lkv,
               int32_t **cu_q, int32_t **cu_kv, int64_t *Sq, int64_t *Skv);
/* A bq x bk block mask over the sequence-local extents (Sq, Skv, or the longest varlen
 * sequence), one block short each way when `short_by_one`; bits row-major, or random
 * (~2/3 visible) from seed. *mask (allocated) backs bm; spec->block_mask = bm. */
void tu_block_mask(attn_spec *spec, attn_block_mask *bm, uint8_t **mask, int64_t Sq,
                   int64_t Skv, int nseq, const int32_t *lq, const int32_t *lkv, int bq, int bk,
                   int short_by_one, const uint8_t *bits, uint64_t seed);

/* ---- bf16 / f16 (an implementation of our own, apart from the library's) ------------ */
/* float -> nearest bf16 / f16 (bits), and back; tu_round is the identity for float32. */
uint16_t tu_to_bits(float x, int dtype);
float tu_from_bits(uint16_t h, int dtype);
float tu_round(float x, int dtype);

#endif
