/* check.c — validates one benchmark run on a few sampled rows against the float64 oracle
 * (kernels/ref), before anything is timed. */
#include "bench.h"
#include "ref.h"

#include <math.h>
#include <stdlib.h>

enum { CHECK_QROWS = 4, CHECK_KROWS = 2 };
/* A key row of the oracle costs a forward over every query row that sees it: only
 * checked while n*n*d stays small. */
#define CHECK_KROW_WORK ((int64_t)1 << 27)

typedef struct {
  double max_err, max_ref;
} err_acc;

static void acc_rows(err_acc *e, const float *got, const double *ref, int64_t d) {
  for (int64_t c = 0; c < d; c++) {
    double diff = fabs((double)got[c] - ref[c]);
    if (isnan(diff)) diff = INFINITY; /* NaN counts as the worst error */
    if (diff > e->max_err) e->max_err = diff;
    if (fabs(ref[c]) > e->max_ref) e->max_ref = fabs(ref[c]);
  }
}

static double rel(const err_acc *e) { return e->max_err / (e->max_ref > 0 ? e->max_ref : 1); }

static void setup(const bench_problem *p, attn_spec *spec, attn_ref_arrays *a,
                  attn_ref_problem *rp) {
  attn_spec s = ATTN_SPEC_INIT;
  s.num_heads_q = s.num_heads_kv = (int32_t)p->h;
  s.head_dim_qk = s.head_dim_v = (int32_t)p->d;
  s.causal = p->causal;
  *spec = s;
  a->q = p->q;
  a->k = p->k;
  a->v = p->v;
  a->dout = p->dout;
  attn_ref_problem_arrays(rp, spec, 1, p->n, p->n, a);
}

/* Sampled row r of CHECK rows: spread over the sequence, first and last included. */
static int64_t row_of(const bench_problem *p, int r, int rows) {
  return (int64_t)r * (p->n - 1) / (rows - 1);
}

double bench_check_fwd(const bench_problem *p) {
  attn_spec spec;
  attn_ref_arrays a;
  attn_ref_problem rp;
  setup(p, &spec, &a, &rp);
  double *ref = malloc((size_t)p->d * sizeof(double)), lse;
  err_acc e = {0, 0};
  for (int r = 0; r < CHECK_QROWS; r++) {
    int64_t i = row_of(p, r, CHECK_QROWS), h = r % p->h;
    attn_ref_fwd_row(&rp, 0, h, i, ref, &lse);
    acc_rows(&e, p->o + (i * p->h + h) * p->d, ref, p->d);
  }
  free(ref);
  return rel(&e);
}

double bench_check_bwd(const bench_problem *p, int *with_k) {
  attn_spec spec;
  attn_ref_arrays a;
  attn_ref_problem rp;
  setup(p, &spec, &a, &rp);
  double *r1 = malloc((size_t)p->d * sizeof(double)), *r2 = malloc((size_t)p->d * sizeof(double));
  double delta, dsink;
  err_acc e[3] = {{0, 0}, {0, 0}, {0, 0}}; /* dq, dk, dv: each relative to its own max */
  for (int r = 0; r < CHECK_QROWS; r++) {
    int64_t i = row_of(p, r, CHECK_QROWS), h = r % p->h;
    attn_ref_bwd_qrow(&rp, 0, h, i, r1, &delta, &dsink);
    acc_rows(&e[0], p->dq + (i * p->h + h) * p->d, r1, p->d);
  }
  *with_k = p->n * p->n * p->d <= CHECK_KROW_WORK;
  for (int r = 0; *with_k && r < CHECK_KROWS; r++) {
    int64_t j = (2 * r + 1) * p->n / (2 * CHECK_KROWS), h = r % p->h;
    attn_ref_bwd_krow(&rp, 0, h, j, r1, r2);
    acc_rows(&e[1], p->dk + (j * p->h + h) * p->d, r1, p->d);
    acc_rows(&e[2], p->dv + (j * p->h + h) * p->d, r2, p->d);
  }
  free(r1);
  free(r2);
  return fmax(rel(&e[0]), fmax(rel(&e[1]), rel(&e[2])));
}
