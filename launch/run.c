/* run.c — drives the library for attnrun: builds the tensor views of the local shard,
 * poisons outputs (NaN) so unwritten elements show, warms up, times each iteration with
 * the monotonic clock, and keeps the median, the min and the last call's tile stats. */
#include "run.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

static void poison(float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    x[i] = NAN;
}

attn_status run_ctx_create(const run_args *a, run_result *r) {
  memset(r, 0, sizeof *r);
  attn_ctx_config cfg = ATTN_CTX_CONFIG_INIT;
  cfg.backend = a->backend;
  cfg.num_threads = a->threads;
  cfg.force_scalar = a->scalar;
  return attn_ctx_create(&r->ctx, &cfg);
}

typedef struct {
  attn_tensor q, k, v, o, dout, dq, dk, dv;
} views;

static views make_views(const problem *p, const run_result *r) {
  const attn_spec *s = &p->spec;
  int64_t B = p->batch, sq = p->q_rows, skv = p->kv_rows;
  views w;
  w.q = attn_tensor_f32(p->q, B, sq, s->num_heads_q, s->head_dim_qk);
  w.k = attn_tensor_f32(p->k, B, skv, s->num_heads_kv, s->head_dim_qk);
  w.v = attn_tensor_f32(p->v, B, skv, s->num_heads_kv, s->head_dim_v);
  w.o = attn_tensor_f32(r->o, B, sq, s->num_heads_q, s->head_dim_v);
  w.dout = attn_tensor_f32(p->dout, B, sq, s->num_heads_q, s->head_dim_v);
  w.dq = attn_tensor_f32(r->dq, B, sq, s->num_heads_q, s->head_dim_qk);
  w.dk = attn_tensor_f32(r->dk, B, skv, s->num_heads_kv, s->head_dim_qk);
  w.dv = attn_tensor_f32(r->dv, B, skv, s->num_heads_kv, s->head_dim_v);
  return w;
}

/* Median and min of the timed iterations. */
static void summarize(double *times, int n, run_timing *t) {
  qsort(times, (size_t)n, sizeof *times, cmp_double);
  t->min_s = times[0];
  t->median_s = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
  t->done = 1;
}

int run_alloc_outputs(const run_args *a, const problem *p, run_result *r) {
  const attn_spec *s = &p->spec;
  int64_t B = p->batch, hq = s->num_heads_q, hkv = s->num_heads_kv;
  r->o = problem_alloc(B, p->q_rows, hq, s->head_dim_v);
  r->lse = problem_alloc(B, hq, p->q_rows, 1);
  if (!r->o || !r->lse) return -1;
  poison(r->o, (size_t)(B * p->q_rows * hq * s->head_dim_v));
  poison(r->lse, (size_t)(B * hq * p->q_rows));
  if (!a->bwd) return 0;
  r->dq = problem_alloc(B, p->q_rows, hq, s->head_dim_qk);
  r->dk = problem_alloc(B, p->kv_rows, hkv, s->head_dim_qk);
  r->dv = problem_alloc(B, p->kv_rows, hkv, s->head_dim_v);
  if (s->sinks) r->dsinks = problem_alloc(1, 1, 1, hq);
  if (!r->dq || !r->dk || !r->dv || (s->sinks && !r->dsinks)) return -1;
  poison(r->dq, (size_t)(B * p->q_rows * hq * s->head_dim_qk));
  poison(r->dk, (size_t)(B * p->kv_rows * hkv * s->head_dim_qk));
  poison(r->dv, (size_t)(B * p->kv_rows * hkv * s->head_dim_v));
  if (r->dsinks) poison(r->dsinks, (size_t)hq);
  return 0;
}

attn_status run_forward(const run_args *a, const problem *p, run_result *r) {
  const attn_spec *s = &p->spec;
  double times[RUN_MAX_ITERS];
  views w = make_views(p, r);
  attn_status st = ATTN_OK;
  for (int it = 0; it < a->warmup + a->iters && st == ATTN_OK; it++) {
    double t0 = now_s();
    st = attn_fwd(r->ctx, s, &w.q, &w.k, &w.v, &w.o, r->lse);
    if (it >= a->warmup) times[it - a->warmup] = now_s() - t0;
  }
  if (st == ATTN_OK) st = attn_ctx_last_stats(r->ctx, &r->fwd.stats);
  if (st == ATTN_OK) {
    summarize(times, a->iters, &r->fwd);
    r->fwd.flops = attn_flops_fwd(s, p->batch, p->seq_q, p->seq_kv);
  }
  return st;
}

attn_status run_backward(const run_args *a, const problem *p, run_result *r) {
  const attn_spec *s = &p->spec;
  double times[RUN_MAX_ITERS];
  attn_status st = ATTN_OK;
  views w = make_views(p, r);
  for (int it = 0; it < a->warmup + a->iters && st == ATTN_OK; it++) {
    double t0 = now_s();
    st = attn_bwd(r->ctx, s, &w.q, &w.k, &w.v, &w.o, r->lse, &w.dout, &w.dq, &w.dk, &w.dv,
                  r->dsinks);
    if (it >= a->warmup) times[it - a->warmup] = now_s() - t0;
  }
  if (st == ATTN_OK) st = attn_ctx_last_stats(r->ctx, &r->bwd.stats);
  if (st == ATTN_OK) {
    summarize(times, a->iters, &r->bwd);
    r->bwd.flops = 2.5 * attn_flops_fwd(s, p->batch, p->seq_q, p->seq_kv);
  }
  return st;
}

void run_free(run_result *r) {
  attn_ctx_destroy(r->ctx);
  free(r->o);
  free(r->lse);
  free(r->dq);
  free(r->dk);
  free(r->dv);
  free(r->dsinks);
  memset(r, 0, sizeof *r);
}
