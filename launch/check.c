/* check.c — --check: compares sampled rows of this rank's outputs with the float64 oracle
 * (kernels/ref). The oracle reads inputs through problem_fetch, i.e. over the full
 * sequence (regenerating or reading rows it does not hold), so a rank holding a shard of
 * rows and heads checks its rows; the oracle's row functions visit only visible keys. An element is wrong when
 * |out - ref| > tol * max|ref| (max over the sampled elements of that tensor; for the LSE,
 * a log, at least 1). */
#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ref.h"
#include "rng.h"

#define DSINKS_MAX_COST 268435456.0 /* B*Hq*Sq*Skv*(Dqk+Dv): dsinks needs every row */

const char *const check_tensor_name[CK_COUNT] = {"O", "LSE", "dQ", "dK", "dV", "dsinks", "y", "dx"};

typedef check_row row_id;

check_tol check_tolerance(attn_dtype t) {
  static const check_tol f32 = {2e-5, 2e-5, 2e-4}, bf16 = {2e-2, 1e-3, 4e-2},
                         f16 = {4e-3, 1e-3, 8e-3};
  return t == ATTN_BF16 ? bf16 : t == ATTN_F16 ? f16 : f32;
}

static double wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Sample k over [B] x (the shard's rows) x [h0, h0 + hn); the first two are the corners.
 * s and h are global. */
check_row check_sample(uint64_t seed, uint64_t stream_off, int64_t k, int64_t batch,
                       const attn_cp_shard *sh, int64_t h0, int64_t hn) {
  row_id r;
  int64_t local;
  if (k == 0) {
    r.b = 0, local = 0, r.h = h0;
  } else if (k == 1) {
    r.b = batch - 1, local = sh->rows - 1, r.h = h0 + hn - 1;
  } else {
    uint64_t idx = stream_off + 3 * (uint64_t)k;
    r.b = (int64_t)(rng_bits(seed, RNG_CHECK, idx) % (uint64_t)batch);
    local = (int64_t)(rng_bits(seed, RNG_CHECK, idx + 1) % (uint64_t)sh->rows);
    r.h = h0 + (int64_t)(rng_bits(seed, RNG_CHECK, idx + 2) % (uint64_t)hn);
  }
  r.s = problem_global_row(sh, local);
  return r;
}

static double elem_err(float got, double ref) {
  if ((double)got == ref) return 0.0; /* also equal infinities (LSE of an empty row) */
  if (isnan(got) || isinf(got) || isinf(ref)) return INFINITY;
  return fabs((double)got - ref);
}

/* Fills t from got/ref (n rows of dim elements, rows described by ids). */
void check_compare(check_tensor *t, const char *name, const float *got, const double *ref,
                   int64_t n, int64_t dim, const check_row *ids, double tol, double min_scale) {
  t->used = 1;
  t->tol = tol;
  t->count = n * dim;
  for (int64_t e = 0; e < n * dim; e++)
    if (isfinite(ref[e]) && fabs(ref[e]) > t->max_ref) t->max_ref = fabs(ref[e]);
  double denom = t->max_ref > min_scale ? t->max_ref : min_scale > 0 ? min_scale : 1.0;
  t->worst_err = -1;
  for (int64_t e = 0; e < n * dim; e++) {
    double err = elem_err(got[e], ref[e]);
    if (err > t->max_abs_err) t->max_abs_err = err;
    if (!(err <= tol * denom)) t->wrong++;
    if (err > t->worst_err) {
      const row_id *r = &ids[e / dim];
      t->worst_err = err;
      snprintf(t->worst, sizeof t->worst, "%s[b=%lld,s=%lld,h=%lld,d=%lld] = %.9g (ref %.9g)", name,
               (long long)r->b, (long long)r->s, (long long)r->h, (long long)(e % dim),
               (double)got[e], ref[e]);
    }
  }
}

typedef struct {
  const run_args *a;
  const problem *p;
  const run_result *r;
  attn_ref_problem rp;
  int64_t dqk, dv;
} check_ctx;

/* Offsets of a sampled row in this rank's [B, rows, heads, dim] buffers. */
static int64_t q_index(const check_ctx *c, row_id id, int64_t dim) {
  const problem *p = c->p;
  return ((id.b * p->q_rows + problem_local_row(&p->qsh, id.s)) * p->hq + (id.h - p->hq0)) * dim;
}

static int64_t k_index(const check_ctx *c, row_id id, int64_t dim) {
  const problem *p = c->p;
  return ((id.b * p->kv_rows + problem_local_row(&p->ksh, id.s)) * p->hk + (id.h - p->hk0)) * dim;
}

static int64_t lse_index(const check_ctx *c, row_id id) {
  const problem *p = c->p;
  return (id.b * p->hq + (id.h - p->hq0)) * p->q_rows + problem_local_row(&p->qsh, id.s);
}

static void check_query_rows(check_ctx *c, int64_t n, check_report *out) {
  const problem *p = c->p;
  int bwd = c->r->bwd.done;
  row_id *ids = malloc((size_t)n * sizeof *ids);
  float *g_o = malloc((size_t)(n * c->dv) * sizeof(float)),
        *g_l = malloc((size_t)n * sizeof(float));
  double *r_o = malloc((size_t)(n * c->dv) * sizeof(double)),
         *r_l = malloc((size_t)n * sizeof(double));
  float *g_dq = bwd ? malloc((size_t)(n * c->dqk) * sizeof(float)) : NULL;
  double *r_dq = bwd ? malloc((size_t)(n * c->dqk) * sizeof(double)) : NULL;
#pragma omp parallel for schedule(dynamic)
  for (int64_t k = 0; k < n; k++) {
    row_id id = check_sample(p->seed, 0, k, p->batch, &p->qsh, p->hq0, p->hq);
    ids[k] = id;
    attn_ref_problem rp = c->rp; /* a KV cache: the batch attends to its used keys alone */
    if (p->kv_used) rp.seq_kv = p->kv_used[id.b];
    attn_ref_fwd_row(&rp, id.b, id.h, id.s, r_o + k * c->dv, r_l + k);
    memcpy(g_o + k * c->dv, c->r->o + q_index(c, id, c->dv), (size_t)c->dv * sizeof(float));
    g_l[k] = c->r->lse[lse_index(c, id)];
    if (bwd) {
      double delta, dsink;
      attn_ref_bwd_qrow(&c->rp, id.b, id.h, id.s, r_dq + k * c->dqk, &delta, &dsink);
      memcpy(g_dq + k * c->dqk, c->r->dq + q_index(c, id, c->dqk), (size_t)c->dqk * sizeof(float));
    }
  }
  check_tol tol = check_tolerance(p->dtype);
  check_compare(&out->t[CK_O], "O", g_o, r_o, n, c->dv, ids, tol.fwd, 0.0);
  check_compare(&out->t[CK_LSE], "LSE", g_l, r_l, n, 1, ids, tol.lse, 1.0);
  if (bwd) check_compare(&out->t[CK_DQ], "dQ", g_dq, r_dq, n, c->dqk, ids, tol.bwd, 0.0);
  free(ids), free(g_o), free(g_l), free(r_o), free(r_l), free(g_dq), free(r_dq);
}

static void check_key_rows(check_ctx *c, int64_t n, check_report *out) {
  const problem *p = c->p;
  row_id *ids = malloc((size_t)n * sizeof *ids);
  float *g_dk = malloc((size_t)(n * c->dqk) * sizeof(float)),
        *g_dv = malloc((size_t)(n * c->dv) * sizeof(float));
  double *r_dk = malloc((size_t)(n * c->dqk) * sizeof(double)),
         *r_dv = malloc((size_t)(n * c->dv) * sizeof(double));
#pragma omp parallel for schedule(dynamic)
  for (int64_t k = 0; k < n; k++) {
    row_id id = check_sample(p->seed, 1ULL << 40, k, p->batch, &p->ksh, p->hk0, p->hk);
    ids[k] = id;
    attn_ref_bwd_krow(&c->rp, id.b, id.h, id.s, r_dk + k * c->dqk, r_dv + k * c->dv);
    memcpy(g_dk + k * c->dqk, c->r->dk + k_index(c, id, c->dqk), (size_t)c->dqk * sizeof(float));
    memcpy(g_dv + k * c->dv, c->r->dv + k_index(c, id, c->dv), (size_t)c->dv * sizeof(float));
  }
  double tol = check_tolerance(p->dtype).bwd;
  check_compare(&out->t[CK_DK], "dK", g_dk, r_dk, n, c->dqk, ids, tol, 0.0);
  check_compare(&out->t[CK_DV], "dV", g_dv, r_dv, n, c->dv, ids, tol, 0.0);
  free(ids), free(g_dk), free(g_dv), free(r_dk), free(r_dv);
}

/* dsinks[h] sums over every query row of head h: only on small problems. */
static void check_dsinks(check_ctx *c, check_report *out) {
  const problem *p = c->p;
  double cost = (double)p->batch * (double)p->hq * (double)p->seq_q * (double)p->seq_kv *
                (double)(c->dqk + c->dv);
  if (cost > DSINKS_MAX_COST) {
    out->dsinks_skipped = 1;
    return;
  }
  int64_t hn = p->hq; /* this rank's heads [hq0, hq0 + hq) */
  double *ref = calloc((size_t)hn, sizeof(double));
  double *scratch = malloc((size_t)(hn * c->dqk) * sizeof(double));
  row_id *ids = calloc((size_t)hn, sizeof *ids);
#pragma omp parallel for schedule(dynamic)
  for (int64_t x = 0; x < hn; x++) {
    ids[x].h = p->hq0 + x;
    for (int64_t b = 0; b < p->batch; b++)
      for (int64_t i = 0; i < p->seq_q; i++) {
        double delta, dsink;
        attn_ref_bwd_qrow(&c->rp, b, p->hq0 + x, i, scratch + x * c->dqk, &delta, &dsink);
        ref[x] += dsink;
      }
  }
  check_compare(&out->t[CK_DSINKS], "dsinks", c->r->dsinks, ref, hn, 1, ids,
                check_tolerance(p->dtype).bwd, 0.0);
  free(ref), free(scratch), free(ids);
}

void check_summarize(check_report *out) {
  for (int i = 0; i < CK_COUNT; i++) {
    const check_tensor *t = &out->t[i];
    if (!t->used) continue;
    out->wrong += t->wrong;
    if (t->max_abs_err > out->max_abs_err) out->max_abs_err = t->max_abs_err;
    double rel = t->max_abs_err / (t->max_ref > 0 ? t->max_ref : 1.0);
    if (rel > out->max_rel_err) out->max_rel_err = rel;
  }
}

void check_run(const run_args *a, const problem *p, const run_result *r, check_report *out) {
  memset(out, 0, sizeof *out);
  double t0 = wall_s();
  check_ctx c = {.a = a, .p = p, .r = r};
  c.rp.spec = &p->spec;
  c.rp.batch = p->batch, c.rp.seq_q = p->seq_q, c.rp.seq_kv = p->seq_kv;
  c.rp.fetch = problem_fetch;
  c.rp.user = (void *)p;
  c.dqk = p->spec.head_dim_qk, c.dv = p->spec.head_dim_v ? p->spec.head_dim_v : c.dqk;
  int64_t nq_total = p->batch * p->q_rows * p->hq, nk_total = p->batch * p->kv_rows * p->hk;
  out->q_rows = a->check_rows < nq_total ? a->check_rows : nq_total;
  check_query_rows(&c, out->q_rows, out);
  if (r->bwd.done) {
    out->k_rows = a->check_rows < nk_total ? a->check_rows : nk_total;
    check_key_rows(&c, out->k_rows, out);
    if (p->spec.sinks && r->dsinks) check_dsinks(&c, out);
  }
  check_summarize(out);
  out->seconds = wall_s() - t0;
}

static void merge_tensor(check_tensor *dst, const check_tensor *src) {
  if (!src->used) return;
  if (!dst->used || src->worst_err > dst->worst_err) {
    dst->worst_err = src->worst_err;
    memcpy(dst->worst, src->worst, sizeof dst->worst);
  }
  dst->used = 1;
  dst->tol = src->tol;
  dst->count += src->count;
  dst->wrong += src->wrong;
  if (src->max_abs_err > dst->max_abs_err) dst->max_abs_err = src->max_abs_err;
  if (src->max_ref > dst->max_ref) dst->max_ref = src->max_ref;
}

void check_merge(const check_report *ranks, int n, check_report *out) {
  memset(out, 0, sizeof *out);
  for (int r = 0; r < n; r++) {
    const check_report *c = &ranks[r];
    for (int i = 0; i < CK_COUNT; i++)
      merge_tensor(&out->t[i], &c->t[i]);
    out->q_rows = c->q_rows > out->q_rows ? c->q_rows : out->q_rows;
    out->k_rows = c->k_rows > out->k_rows ? c->k_rows : out->k_rows;
    out->seconds = c->seconds > out->seconds ? c->seconds : out->seconds;
    out->dsinks_skipped |= c->dsinks_skipped;
  }
  check_summarize(out);
}

void check_selftest_perturb(run_result *r, float *y, float *dx) {
  float *first[] = {r ? r->o : NULL, r ? r->dq : NULL, r ? r->dk : NULL, r ? r->dv : NULL, y, dx};
  for (size_t i = 0; i < sizeof first / sizeof first[0]; i++)
    if (first[i]) first[i][0] += 1e-2f * (1.0f + fabsf(first[i][0]));
}
