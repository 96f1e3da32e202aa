/* check.h — --check N: sampled rows of the outputs against the float64 oracle over the full
 * sequence (rows fetched through problem_fetch), with errors relative to max|ref|. */
#ifndef ATTNRUN_LAUNCH_CHECK_H
#define ATTNRUN_LAUNCH_CHECK_H

#include <stdint.h>

#include "args.h"
#include "problem.h"
#include "run.h"

/* Tolerances relative to max|ref| of each tensor, per storage dtype. float32: the kernels'
 * float32 arithmetic. bf16 (unit roundoff u = 2^-8 = 3.9e-3) and f16 (u = 2^-11 =
 * 4.9e-4): O is stored rounded (up to u of |O|), and the kernels round P (and dS in the
 * backward) to the dtype for the tensor-core products, a few u more; the tolerances allow
 * about 5u forward and 10u backward, far below what a wrong mask, a lost block or a bad
 * scale gives (errors of order max|ref|). The inputs are the same rounded values for the
 * kernels and the oracle, so input rounding costs nothing. LSE is float32 from float32
 * sums: 1e-3 of max|LSE| (LSE ~ log of the keys seen) for bf16 and f16. */
typedef struct {
  double fwd, lse, bwd;
} check_tol;

check_tol check_tolerance(attn_dtype t);

/* Checked tensors: attention outputs, and the layer's y and dx (--d-model). */
enum { CK_O, CK_LSE, CK_DQ, CK_DK, CK_DV, CK_DSINKS, CK_Y, CK_DX, CK_COUNT };

typedef struct {
  int used;
  int64_t count, wrong;
  double max_abs_err, max_ref, tol;
  char worst[160]; /* "O[b=0,s=17,h=3,d=5] = 0.12 (ref 0.13)" */
  double worst_err;
} check_tensor;

typedef struct {
  int64_t q_rows, k_rows; /* rows sampled */
  check_tensor t[CK_COUNT];
  int64_t wrong;
  double max_abs_err, max_rel_err; /* over all tensors; rel = err / max|ref| of its tensor */
  double seconds;
  int dsinks_skipped; /* dsinks needs every row: skipped on big problems */
} check_report;

/* A sampled row: batch, global position, global head. */
typedef struct {
  int64_t b, s, h;
} check_row;

/* Compares n rows of dim elements (got vs ref) into t: wrong when off by more than
 * tol x max(max|ref|, min_scale) (max|ref| 0: 1); the worst element is described with the
 * row's ids. min_scale 1 for the LSE, a log: its float32 error is absolute (a one-key row's
 * LSE is its score, maybe near 0), else 0. */
void check_compare(check_tensor *t, const char *name, const float *got, const double *ref,
                   int64_t n, int64_t dim, const check_row *ids, double tol, double min_scale);

/* Totals (wrong, max errors) from the tensors of out. */
void check_summarize(check_report *out);

/* The job's report from every rank's: sums of counts, maxima of errors, the worst element
 * over all ranks; q_rows / k_rows stay per rank, seconds is the slowest rank's. */
void check_merge(const check_report *ranks, int n, check_report *out);

/* Samples row k of this rank's rows (in run order) and heads [h0, h0 + hn). */
check_row check_sample(uint64_t seed, uint64_t stream_off, int64_t k, int64_t batch,
                       const attn_cp_shard *sh, int64_t h0, int64_t hn);

/* Checks a->check_rows sampled query rows (O, LSE; with --bwd dQ, and as many key rows for
 * dK and dV; dsinks when the problem is small) of this rank's shard. */
void check_run(const run_args *a, const problem *p, const run_result *r, check_report *out);

/* Self-test of the checker (ATTNRUN_CHECK_SELFTEST=1, on the last rank): perturbs the
 * first element of the first sampled row of O, dQ, dK and dV (sample 0 is always element
 * 0), or of the layer's y and dx, by 1e-2, so tests can see --check report wrong elements
 * and exit non-zero. Any argument may be NULL. */
void check_selftest_perturb(run_result *r, float *y, float *dx);

extern const char *const check_tensor_name[CK_COUNT];

#endif
