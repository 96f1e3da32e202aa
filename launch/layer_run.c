/* layer_run.c — the layer mode of attnrun (--d-model). Global weights are a pure function
 * of (seed, tensor, index): W_q [d_model, Hq*Dqk], W_k and W_v [d_model, Hkv*D], W_o
 * [Hq*Dv, d_model], each U[-sqrt3, sqrt3) / sqrt(fan-in) so that projections have unit
 * variance; every rank generates only its columns (rows of W_o) and its rows of x and dy.
 * The check regenerates the full weights and projects any row of x in float64 (all rows
 * once, when they fit in ORACLE_CACHE_BYTES), so the oracle sees exactly the q, k, v, dO
 * of the layer; RoPE is off. Weight gradients are not checked. */
#include "layer_run.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"
#include "rng.h"
#include "save.h"

#define BOUND 1.7320508f
#define ORACLE_CACHE_BYTES (256.0 * 1024 * 1024) /* projected rows kept when they fit */

double layer_flops_fwd(const problem *p, int64_t d_model) {
  const attn_spec *s = &p->spec;
  double rows = (double)p->batch * (double)p->seq_q, d = (double)d_model;
  double proj = 2.0 * rows * d *
                ((double)s->num_heads_q * (s->head_dim_qk + s->head_dim_v) +
                 (double)s->num_heads_kv * (s->head_dim_qk + s->head_dim_v));
  return attn_flops_fwd(s, p->batch, p->seq_q, p->seq_kv) + proj;
}

/* Element (i, c) of a generated [rows, cols] weight of fan-in `fan`. */
static float weight(uint64_t seed, uint64_t stream, int64_t i, int64_t c, int64_t cols, int64_t fan) {
  return rng_uniform(seed, stream, (uint64_t)(i * cols + c), -BOUND, BOUND) / sqrtf((float)fan);
}

/* This rank's w_qkv [d_model, wcols] = [W_q cols of hq0.. | W_k cols of hk0.. | W_v ...]. */
static void fill_w_qkv(const layer_job *L, const problem *p) {
  const attn_spec *s = &p->spec;
  int64_t d = L->d_model, dq = s->head_dim_qk, dv = s->head_dim_v;
  int64_t nq = p->hq * dq, nk = p->hk * dq, nv = p->hk * dv;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < d; i++) {
    float *row = L->w_qkv + i * L->wcols;
    for (int64_t c = 0; c < nq; c++)
      row[c] = weight(p->seed, RNG_WQ, i, p->hq0 * dq + c, s->num_heads_q * dq, d);
    for (int64_t c = 0; c < nk; c++)
      row[nq + c] = weight(p->seed, RNG_WK, i, p->hk0 * dq + c, s->num_heads_kv * dq, d);
    for (int64_t c = 0; c < nv; c++)
      row[nq + nk + c] = weight(p->seed, RNG_WV, i, p->hk0 * dv + c, s->num_heads_kv * dv, d);
  }
}

/* This rank's w_o [hq*Dv, d_model]: rows hq0*Dv.. of W_o. */
static void fill_w_o(const layer_job *L, const problem *p) {
  int64_t dv = p->spec.head_dim_v, fan = (int64_t)p->spec.num_heads_q * dv;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < p->hq * dv; i++)
    for (int64_t c = 0; c < L->d_model; c++)
      L->w_o[i * L->d_model + c] = weight(p->seed, RNG_WO, p->hq0 * dv + i, c, L->d_model, fan);
}

/* [B, rows, d_model] of a generated [B, S, d_model] stream, this rank's runs. */
static void fill_rows(const problem *p, uint64_t stream, int64_t d, float *dst) {
  const attn_cp_shard *sh = &p->qsh;
  for (int64_t b = 0; b < p->batch; b++)
    for (int32_t r = 0; r < sh->count; r++) {
      rng_fill(p->seed, stream, (uint64_t)((b * p->seq_q + sh->start[r]) * d), sh->len[r] * d,
               -BOUND, BOUND, dst);
      dst += sh->len[r] * d;
    }
}

static attn_status alloc_all(layer_job *L, const problem *p, int bwd) {
  int64_t rows = p->batch * p->q_rows, d = L->d_model, nwo = p->hq * p->spec.head_dim_v;
  L->x = problem_alloc(1, rows, 1, d);
  L->y = problem_alloc(1, rows, 1, d);
  L->w_qkv = problem_alloc(1, d, 1, L->wcols);
  L->w_o = problem_alloc(1, nwo, 1, d);
  if (!L->x || !L->y || !L->w_qkv || !L->w_o) return ATTN_ERR_OUT_OF_MEMORY;
  if (!bwd) return ATTN_OK;
  L->dy = problem_alloc(1, rows, 1, d);
  L->dx = problem_alloc(1, rows, 1, d);
  L->dw_qkv = problem_alloc(1, d, 1, L->wcols);
  L->dw_o = problem_alloc(1, nwo, 1, d);
  return L->dy && L->dx && L->dw_qkv && L->dw_o ? ATTN_OK : ATTN_ERR_OUT_OF_MEMORY;
}

attn_status layer_setup(layer_job *L, const run_env *env, problem *p, const char **what) {
  const run_args *a = env->a;
  memset(L, 0, sizeof *L);
  L->ctx = env->ctx;
  L->d_model = a->d_model;
  attn_layer_config cfg = ATTN_LAYER_CONFIG_INIT;
  cfg.d_model = a->d_model;
  cfg.spec = p->spec;
  cfg.layout = env->g->layout;
  cfg.attention_dtype = p->dtype; /* the run's dtype, as in plain attention */
  attn_status st = ATTN_OK;
  if (ctxbuf_wants_copies(env->ctx)) { /* the spec's arrays live where the tensors do */
    *what = "copying the spec's arrays to the device";
    st = ctxbuf_spec(env->ctx, &p->spec, L->spec_arrays, &L->bm, &cfg.spec);
  }
  *what = "attn_layer_create";
  if (st == ATTN_OK) st = attn_layer_create(&L->layer, env->grp, &cfg);
  attn_layer_heads h;
  if (st == ATTN_OK) st = attn_layer_get_heads(L->layer, &h);
  if (st != ATTN_OK) return st;
  problem_set_shard(p, &p->qsh, &p->ksh, h.hq0, h.hq, h.hk0, h.hk);
  L->wcols = (int64_t)h.hq * p->spec.head_dim_qk + (int64_t)h.hk * (p->spec.head_dim_qk + p->spec.head_dim_v);
  *what = "allocating the layer's buffers";
  if ((st = alloc_all(L, p, a->bwd)) != ATTN_OK) return st;
  fill_w_qkv(L, p);
  fill_w_o(L, p);
  fill_rows(p, RNG_X, L->d_model, L->x);
  if (a->bwd) fill_rows(p, RNG_DY, L->d_model, L->dy);
  return ATTN_OK;
}

/* ---- timed passes ------------------------------------------------------------------ */

typedef struct {
  layer_job *L;
  const problem *p;
} layer_pass;

static attn_status fwd_pass(void *user) {
  layer_pass *x = user;
  float *const *b = x->L->ctx_buf;
  attn_status st = attn_layer_fwd(x->L->layer, x->p->batch, x->p->seq_q, b[LB_X], b[LB_WQKV],
                                  b[LB_WO], b[LB_Y]);
  return st == ATTN_OK ? attn_ctx_sync(x->L->ctx) : st;
}

static attn_status bwd_pass(void *user) {
  layer_pass *x = user;
  float *const *b = x->L->ctx_buf;
  attn_status st = attn_layer_bwd(x->L->layer, b[LB_DY], b[LB_DX], b[LB_DWQKV], b[LB_DWO]);
  return st == ATTN_OK ? attn_ctx_sync(x->L->ctx) : st;
}

static float **host_buf(layer_job *L, int i) {
  float **h[LB_COUNT] = {&L->x, &L->dy, &L->y, &L->dx, &L->w_qkv, &L->w_o, &L->dw_qkv, &L->dw_o};
  return h[i];
}

static int64_t buf_elems(const layer_job *L, const problem *p, int i) {
  int64_t rows = p->batch * p->q_rows, nwo = p->hq * p->spec.head_dim_v;
  return i <= LB_DX ? rows * L->d_model : (i == LB_WQKV || i == LB_DWQKV) ? L->d_model * L->wcols
                                                                          : nwo * L->d_model;
}

/* The buffers the layer calls see: on a device context float32 copies (y and dx NaN). */
static attn_status to_ctx(const run_env *env, layer_job *L, const problem *p) {
  int64_t n = p->batch * p->q_rows * L->d_model;
  for (int64_t i = 0; i < n; i++)
    L->y[i] = NAN;
  for (int64_t i = 0; L->dx && i < n; i++)
    L->dx[i] = NAN;
  L->ctx = env->ctx;
  L->copies = ctxbuf_wants_copies(env->ctx);
  attn_status st = ATTN_OK;
  for (int i = 0; i < LB_COUNT && st == ATTN_OK; i++) {
    float *h = *host_buf(L, i);
    if (!L->copies || !h)
      L->ctx_buf[i] = h;
    else
      st = ctxbuf_put(env->ctx, h, buf_elems(L, p, i), ATTN_F32, (void **)&L->ctx_buf[i]);
  }
  return st;
}

/* Output i back to the host (after its pass), when the layer ran on copies. */
static attn_status from_ctx(layer_job *L, const problem *p, int i) {
  if (!L->copies) return ATTN_OK;
  return ctxbuf_get(L->ctx, L->ctx_buf[i], buf_elems(L, p, i), ATTN_F32, *host_buf(L, i));
}

attn_status layer_run(const run_env *env, layer_job *L, const problem *p, run_result *r,
                      const char **what) {
  layer_pass x = {L, p};
  *what = "copying the layer's buffers to the device";
  attn_status st = to_ctx(env, L, p);
  if (st == ATTN_OK) *what = "attn_layer_fwd";
  st = run_timed(env, "layer_fwd", fwd_pass, &x, st, &r->fwd);
  if (st != ATTN_OK) return st;
  r->fwd.flops = layer_flops_fwd(p, L->d_model);
  if (env->a->bwd) {
    *what = "attn_layer_bwd";
    st = run_timed(env, "layer_bwd", bwd_pass, &x, ATTN_OK, &r->bwd);
    if (st != ATTN_OK) return st;
    r->bwd.flops = 2.5 * r->fwd.flops;
  }
  *what = "copying the layer's outputs back from the device";
  st = from_ctx(L, p, LB_Y);
  if (st == ATTN_OK && env->a->bwd) st = from_ctx(L, p, LB_DX);
  return st;
}

/* ---- the check: the oracle on projected rows ----------------------------------------- */

typedef struct {
  const problem *p;
  int64_t d;             /* d_model */
  float *wq, *wk, *wv;   /* [d, Hq*Dqk], [d, Hkv*Dqk], [d, Hkv*Dv]: the full weights */
  float *wo;             /* [Hq*Dv, d] */
  float *cache[T_COUNT]; /* [B, S, H, D] projected q, k, v, dO (small problems), or NULL */
} layer_oracle;

static float *full_weight(const problem *p, uint64_t stream, int64_t rows, int64_t cols, int64_t fan) {
  float *w = malloc((size_t)(rows * cols) * sizeof(float));
  if (!w) return NULL;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; i++)
    for (int64_t c = 0; c < cols; c++)
      w[i * cols + c] = weight(p->seed, stream, i, c, cols, fan);
  return w;
}

/* out[c] = sum_i row[i] * w[i, c0 + c] for c < n (w has `cols` columns), in float64. */
static void project(const float *row, int64_t d, const float *w, int64_t cols, int64_t c0,
                    int64_t n, float *out) {
  for (int64_t c = 0; c < n; c++) {
    double acc = 0;
    for (int64_t i = 0; i < d; i++)
      acc += (double)row[i] * w[i * cols + c0 + c];
    out[c] = (float)acc;
  }
}

/* Row (b, s, h) of q, k, v (x W) or dO (dy W_o^T), projected now. */
static void project_row(const layer_oracle *o, int which, int64_t b, int64_t s, int64_t h,
                        float *out) {
  const attn_spec *sp = &o->p->spec;
  int64_t dq = sp->head_dim_qk, dv = sp->head_dim_v, d = o->d;
  float row[8192], *r = d <= 8192 ? row : malloc((size_t)d * sizeof(float));
  uint64_t stream = which == T_DO ? RNG_DY : RNG_X;
  rng_fill(o->p->seed, stream, (uint64_t)((b * o->p->seq_q + s) * d), d, -BOUND, BOUND, r);
  if (which == T_Q) project(r, d, o->wq, sp->num_heads_q * dq, h * dq, dq, out);
  if (which == T_K) project(r, d, o->wk, sp->num_heads_kv * dq, h * dq, dq, out);
  if (which == T_V) project(r, d, o->wv, sp->num_heads_kv * dv, h * dv, dv, out);
  if (which == T_DO) /* dO_h[c] = sum_j dy[j] W_o[h*Dv + c, j] */
    for (int64_t c = 0; c < dv; c++) {
      double acc = 0;
      for (int64_t j = 0; j < d; j++)
        acc += (double)r[j] * o->wo[(h * dv + c) * d + j];
      out[c] = (float)acc;
    }
  if (r != row) free(r);
}

/* attn_ref_fetch_fn: from the cache when there is one. */
static void layer_fetch(void *user, int which, int64_t b, int64_t s, int64_t h, float *out) {
  const layer_oracle *o = user;
  if (!o->cache[which]) {
    project_row(o, which, b, s, h, out);
    return;
  }
  int64_t seq, heads, dim;
  problem_dims(o->p, which, &seq, &heads, &dim);
  memcpy(out, o->cache[which] + ((b * seq + s) * heads + h) * dim, (size_t)dim * sizeof(float));
}

/* Projects every row of q, k, v, dO once when they fit in ORACLE_CACHE_BYTES: the
 * backward oracle reads each row many times. */
static void fill_cache(layer_oracle *o, int bwd) {
  const problem *p = o->p;
  const attn_spec *s = &p->spec;
  double bytes = 4.0 * p->batch * p->seq_q * (s->num_heads_q + s->num_heads_kv) *
                 (s->head_dim_qk + s->head_dim_v);
  if (bytes > ORACLE_CACHE_BYTES) return;
  for (int t = 0; t < (bwd ? T_COUNT : T_DO); t++) {
    int64_t seq, heads, dim;
    problem_dims(p, t, &seq, &heads, &dim);
    float *c = malloc((size_t)(p->batch * seq * heads * dim) * sizeof(float));
    if (!c) continue;
#pragma omp parallel for schedule(static) collapse(2)
    for (int64_t b = 0; b < p->batch; b++)
      for (int64_t i = 0; i < seq; i++)
        for (int64_t h = 0; h < heads; h++)
          project_row(o, t, b, i, h, c + ((b * seq + i) * heads + h) * dim);
    o->cache[t] = c;
  }
}

/* y_ref [d] of row (b, s): sum over heads of O_h W_o[h rows]. */
static void ref_y(const attn_ref_problem *rp, const layer_oracle *o, int64_t b, int64_t s,
                  double *y) {
  const attn_spec *sp = rp->spec;
  int64_t dv = sp->head_dim_v;
  double *orow = malloc((size_t)dv * sizeof(double)), lse;
  memset(y, 0, (size_t)o->d * sizeof(double));
  for (int64_t h = 0; h < sp->num_heads_q; h++) {
    attn_ref_fwd_row(rp, b, h, s, orow, &lse);
    for (int64_t c = 0; c < dv; c++)
      for (int64_t j = 0; j < o->d; j++)
        y[j] += orow[c] * o->wo[(h * dv + c) * o->d + j];
  }
  free(orow);
}

/* dx[i] += sum_c g[c] * w[i, c0 + c]. */
static void back_project(const double *g, int64_t n, const float *w, int64_t cols, int64_t c0,
                         int64_t d, double *dx) {
  for (int64_t i = 0; i < d; i++)
    for (int64_t c = 0; c < n; c++)
      dx[i] += g[c] * w[i * cols + c0 + c];
}

/* dx_ref [d] of row (b, s): dQ W_q^T + dK W_k^T + dV W_v^T over every head. */
static void ref_dx(const attn_ref_problem *rp, const layer_oracle *o, int64_t b, int64_t s,
                   double *dx) {
  const attn_spec *sp = rp->spec;
  int64_t dq = sp->head_dim_qk, dv = sp->head_dim_v, d = o->d;
  double *g = malloc((size_t)(dq + dv) * sizeof(double)), delta, dsink;
  memset(dx, 0, (size_t)d * sizeof(double));
  for (int64_t h = 0; h < sp->num_heads_q; h++) {
    attn_ref_bwd_qrow(rp, b, h, s, g, &delta, &dsink);
    back_project(g, dq, o->wq, sp->num_heads_q * dq, h * dq, d, dx);
  }
  for (int64_t h = 0; h < sp->num_heads_kv; h++) {
    attn_ref_bwd_krow(rp, b, h, s, g, g + dq);
    back_project(g, dq, o->wk, sp->num_heads_kv * dq, h * dq, d, dx);
    back_project(g + dq, dv, o->wv, sp->num_heads_kv * dv, h * dv, d, dx);
  }
  free(g);
}

static int oracle_open(layer_oracle *o, const problem *p, int64_t d, int bwd) {
  const attn_spec *s = &p->spec;
  int64_t hq = s->num_heads_q, hk = s->num_heads_kv, dq = s->head_dim_qk, dv = s->head_dim_v;
  memset(o, 0, sizeof *o);
  o->p = p, o->d = d;
  o->wq = full_weight(p, RNG_WQ, d, hq * dq, d);
  o->wk = full_weight(p, RNG_WK, d, hk * dq, d);
  o->wv = full_weight(p, RNG_WV, d, hk * dv, d);
  o->wo = full_weight(p, RNG_WO, hq * dv, d, hq * dv);
  if (!o->wq || !o->wk || !o->wv || !o->wo) return -1;
  fill_cache(o, bwd);
  return 0;
}

static void oracle_close(layer_oracle *o) {
  free(o->wq), free(o->wk), free(o->wv), free(o->wo);
  for (int t = 0; t < T_COUNT; t++)
    free(o->cache[t]);
}

/* Rows of y (tensor CK_Y) or dx (CK_DX) sampled from this rank's rows. */
static void check_rows(const run_env *env, const layer_job *L, const attn_ref_problem *rp,
                       const layer_oracle *o, int which, int64_t n, check_report *out) {
  const problem *p = o->p;
  int64_t d = L->d_model;
  const float *got_all = which == CK_Y ? L->y : L->dx;
  check_row *ids = malloc((size_t)n * sizeof *ids);
  float *got = malloc((size_t)(n * d) * sizeof(float));
  double *ref = malloc((size_t)(n * d) * sizeof(double));
  uint64_t off = ((uint64_t)env->g->tp_rank << 32) + (which == CK_DX ? 1ULL << 40 : 0);
#pragma omp parallel for schedule(dynamic)
  for (int64_t k = 0; k < n; k++) {
    check_row id = check_sample(p->seed, off, k, p->batch, &p->qsh, 0, 1);
    ids[k] = id;
    int64_t local = id.b * p->q_rows + problem_local_row(&p->qsh, id.s);
    memcpy(got + k * d, got_all + local * d, (size_t)d * sizeof(float));
    if (which == CK_Y)
      ref_y(rp, o, id.b, id.s, ref + k * d);
    else
      ref_dx(rp, o, id.b, id.s, ref + k * d);
  }
  check_compare(&out->t[which], check_tensor_name[which], got, ref, n, d, ids,
                which == CK_Y ? check_tolerance(p->dtype).fwd : check_tolerance(p->dtype).bwd, 0.0);
  free(ids), free(got), free(ref);
}

void layer_check(const run_env *env, const layer_job *L, const problem *p, check_report *out) {
  memset(out, 0, sizeof *out);
  double t0 = mpienv_now();
  layer_oracle o;
  attn_ref_problem rp = {&p->spec, p->batch, p->seq_q, p->seq_kv, layer_fetch, &o};
  int64_t total = p->batch * p->q_rows;
  int64_t n = env->a->check_rows < total ? env->a->check_rows : total;
  if (oracle_open(&o, p, L->d_model, L->dx && env->a->bwd) == 0) {
    out->q_rows = n;
    check_rows(env, L, &rp, &o, CK_Y, n, out);
    if (L->dx && env->a->bwd) {
      out->k_rows = n;
      check_rows(env, L, &rp, &o, CK_DX, n, out);
    }
  } else { /* no memory for the full weights: every sampled element counts as wrong */
    out->t[CK_Y].used = 1, out->t[CK_Y].wrong = out->t[CK_Y].count = n * L->d_model;
    snprintf(out->t[CK_Y].worst, sizeof out->t[CK_Y].worst, "out of memory for the oracle's weights");
  }
  oracle_close(&o);
  check_summarize(out);
  out->seconds = mpienv_now() - t0;
}

/* ---- save ------------------------------------------------------------------------- */

static save_part rows_part(const char *name, const problem *p, int64_t d, const float *data,
                           int write) {
  save_part x = {.name = name, .dtype = NPY_F32, .ndim = 3, .kind = PART_ROWS, .sh = &p->qsh,
                 .h0 = 0, .hn = 1, .data = data, .write = write};
  x.shape[0] = p->batch, x.shape[1] = p->seq_q, x.shape[2] = d;
  return x;
}

int layer_save(const mpienv *e, const grid *g, const run_args *a, const layer_job *L,
               const problem *p, int bwd, char *err, size_t errlen) {
  save_part parts[4];
  int n = 0, w = g->tp_rank == 0; /* rows are replicated over the TP group */
  parts[n++] = rows_part("x.npy", p, L->d_model, L->x, w);
  parts[n++] = rows_part("y.npy", p, L->d_model, L->y, w);
  if (bwd) {
    parts[n++] = rows_part("dy.npy", p, L->d_model, L->dy, w);
    parts[n++] = rows_part("dx.npy", p, L->d_model, L->dx, w);
  }
  return save_parts(e, a->save_dir, parts, n, err, errlen);
}

void layer_free(layer_job *L) {
  attn_layer_destroy(L->layer);
  for (int i = 0; L->copies && i < LB_COUNT; i++)
    attn_ctx_free(L->ctx, L->ctx_buf[i]);
  for (int i = 0; i < CTXBUF_ARRAYS; i++)
    attn_ctx_free(L->ctx, L->spec_arrays[i]);
  free(L->x), free(L->dy), free(L->y), free(L->dx);
  free(L->w_qkv), free(L->w_o), free(L->dw_qkv), free(L->dw_o);
  memset(L, 0, sizeof *L);
}
