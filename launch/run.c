/* run.c — drives the library for attnrun: context and group, tensor views of the local
 * shard in the context's memory (ctxbuf: copies in the run's dtype on cuda), outputs
 * poisoned (NaN) so unwritten elements show, warmup, then each iteration started together
 * (an agreement on the last call's status, which is also a barrier) and timed with the
 * monotonic clock up to attn_ctx_sync. Per rank: median, min,
 * the ring's per-step split; for the job: the slowest rank per iteration. */
#include "run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROGRESS_AFTER_S 3.0 /* runs longer than this print a progress line */
#define PROGRESS_EVERY_S 2.0

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

static void poison(float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    x[i] = NAN;
}

attn_status run_env_create_group(run_env *env, const char **what) {
  if (env->g->single) return ATTN_OK;
  attn_group_config gc = ATTN_GROUP_CONFIG_INIT;
  gc.tp = env->g->tp;
  gc.cp = env->g->cp;
  gc.timeout_s = env->e->timeout_s;
  MPI_Comm world = MPI_COMM_WORLD;
  *what = "attn_group_create";
  return attn_group_create(&env->grp, env->ctx, &world, &gc);
}

void run_env_free(run_env *env) {
  attn_group_destroy(env->grp);
  attn_ctx_destroy(env->ctx);
  env->grp = NULL;
  env->ctx = NULL;
}

/* Median, min and mean of n timings (sorted in place). */
static void summarize(double *times, int n, double *median, double *min, double *mean) {
  qsort(times, (size_t)n, sizeof *times, cmp_double);
  *min = times[0];
  *median = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
  *mean = 0;
  for (int i = 0; i < n; i++)
    *mean += times[i] / n;
}

/* Adds the last ring call's record to split. */
static attn_status add_steps(const run_env *env, run_split *split) {
  static attn_ring_step steps[RUN_MAX_STEPS];
  int32_t n = 0;
  if (!env->grp) return ATTN_OK;
  attn_status st = attn_group_last_steps(env->grp, steps, RUN_MAX_STEPS, &n);
  if (st != ATTN_OK) return st;
  if (n > RUN_MAX_STEPS) n = RUN_MAX_STEPS;
  split->steps = n;
  split->computed = 0;
  for (int32_t i = 0; i < n; i++) {
    split->compute_s += steps[i].compute_s;
    split->wait_s += steps[i].wait_s;
    split->bytes += (double)steps[i].bytes;
    split->computed += steps[i].computed != 0;
  }
  return ATTN_OK;
}

/* On rank 0, once the run is longer than PROGRESS_AFTER_S: "forward 3/6 ...". */
static void progress(const run_env *env, const char *name, int it, int total, double call_s,
                     double *last) {
  double now = mpienv_now(), el = now - env->t_start;
  if (env->e->rank != 0 || el < PROGRESS_AFTER_S || now - *last < PROGRESS_EVERY_S) return;
  *last = now;
  fprintf(stderr, "attnrun: %s %d/%d calls done (%d warmup), %.1f s elapsed, ~%.0f s more for the %s\n",
          name, it, total, env->a->warmup, el, call_s * (total - it), name);
}

/* Records one timed call (it >= warmup) and widens the agreement's slack. */
static attn_status record(const run_env *env, int it, double dt, double *times, double *job,
                          double *slack, run_split *sum) {
  const run_args *a = env->a;
  if (2 * dt + 10.0 > *slack) *slack = 2 * dt + 10.0; /* ranks may arrive that far apart */
  if (it < a->warmup) return ATTN_OK;
  times[it - a->warmup] = job[it - a->warmup] = dt;
  return add_steps(env, sum);
}

static void finish_timing(const run_env *env, double *times, double *job, double slack,
                          const char *name, const run_split *sum, run_timing *t) {
  const run_args *a = env->a;
  mpienv_max_doubles(env->e, job, a->iters, slack, name);
  summarize(times, a->iters, &t->median_s, &t->min_s, &t->mean_s);
  summarize(job, a->iters, &t->job_median_s, &t->job_min_s, &t->job_mean_s);
  t->split = *sum;
  t->split.compute_s /= a->iters, t->split.wait_s /= a->iters, t->split.bytes /= a->iters;
  if (!env->grp || (env->g->cp == 1 && !env->g->layer && !env->g->split_kv)) {
    /* no ring: all of it is compute */
    t->split.compute_s = t->mean_s;
    t->split.steps = t->split.computed = 1;
  }
  t->done = 1;
}

attn_status run_timed(const run_env *env, const char *name, run_pass_fn fn, void *user,
                      attn_status prior, run_timing *t) {
  const run_args *a = env->a;
  double times[RUN_MAX_ITERS], job[RUN_MAX_ITERS], last = 0, slack = 10.0;
  int total = a->warmup + a->iters;
  run_split sum = {0};
  attn_status st = prior;
  for (int it = 0;; it++) {
    if (mpienv_max_int(env->e, st != ATTN_OK, slack, name)) { /* some rank failed */
      t->peer_failed = st == ATTN_OK;
      return st != ATTN_OK ? st : ATTN_ERR_INTERNAL;
    }
    if (it == total) break;
    double t0 = mpienv_now();
    st = fn(user);
    double dt = mpienv_now() - t0;
    if (st == ATTN_ERR_TIMEOUT) return st;
    if (st == ATTN_OK) st = record(env, it, dt, times, job, &slack, &sum);
    if (st == ATTN_OK) progress(env, name, it + 1, total, dt, &last);
  }
  st = attn_ctx_last_stats(env->ctx, &t->stats);
  if (st != ATTN_OK) return st;
  finish_timing(env, times, job, slack, name, &sum, t);
  return ATTN_OK;
}

int run_alloc_outputs(const run_args *a, const problem *p, run_result *r) {
  const attn_spec *s = &p->spec;
  int64_t B = p->batch, hq = p->hq, hk = p->hk;
  memset(r, 0, sizeof *r);
  r->o = problem_alloc(B, p->q_rows, hq, s->head_dim_v);
  r->lse = problem_alloc(B, hq, p->q_rows, 1);
  if (!r->o || !r->lse) return -1;
  poison(r->o, (size_t)(B * p->q_rows * hq * s->head_dim_v));
  poison(r->lse, (size_t)(B * hq * p->q_rows));
  if (!a->bwd) return 0;
  r->dq = problem_alloc(B, p->q_rows, hq, s->head_dim_qk);
  r->dk = problem_alloc(B, p->kv_rows, hk, s->head_dim_qk);
  r->dv = problem_alloc(B, p->kv_rows, hk, s->head_dim_v);
  if (s->sinks) r->dsinks = problem_alloc(1, 1, 1, hq);
  if (!r->dq || !r->dk || !r->dv || (s->sinks && !r->dsinks)) return -1;
  poison(r->dq, (size_t)(B * p->q_rows * hq * s->head_dim_qk));
  poison(r->dk, (size_t)(B * p->kv_rows * hk * s->head_dim_qk));
  poison(r->dv, (size_t)(B * p->kv_rows * hk * s->head_dim_v));
  if (r->dsinks) poison(r->dsinks, (size_t)hq);
  return 0;
}

/* ---- the attention passes ---------------------------------------------------------- */

typedef struct {
  const run_env *env;
  const problem *p;
  run_result *r;
  attn_tensor q, k, v, o, dout, dq, dk, dv;
} attn_job;

static void make_views(attn_job *j) {
  const problem *p = j->p;
  const attn_spec *s = &p->spec;
  const ctx_tensors *t = &j->r->t;
  int64_t B = p->batch, sq = p->q_rows, skv = p->kv_rows, dqk = s->head_dim_qk, dv = s->head_dim_v;
  attn_dtype dt = t->dtype;
  attn_device dev = attn_ctx_device(j->env->ctx);
  j->q = attn_tensor_contig(t->in[T_Q], dt, dev, B, sq, p->hq, dqk);
  j->k = attn_tensor_contig(t->in[T_K], dt, dev, B, skv, p->hk, dqk);
  j->v = attn_tensor_contig(t->in[T_V], dt, dev, B, skv, p->hk, dv);
  if (t->pool[0]) { /* a paged cache: [num_pages, page_size, hk, D] */
    j->k = attn_tensor_contig(t->pool[0], dt, dev, p->num_pages, p->page_size, p->hk, dqk);
    j->v = attn_tensor_contig(t->pool[1], dt, dev, p->num_pages, p->page_size, p->hk, dv);
  }
  j->dout = attn_tensor_contig(t->in[T_DO], dt, dev, B, sq, p->hq, dv);
  j->o = attn_tensor_contig(t->out[OUT_O], dt, dev, B, sq, p->hq, dv);
  j->dq = attn_tensor_contig(t->out[OUT_DQ], ATTN_F32, dev, B, sq, p->hq, dqk);
  j->dk = attn_tensor_contig(t->out[OUT_DK], ATTN_F32, dev, B, skv, p->hk, dqk);
  j->dv = attn_tensor_contig(t->out[OUT_DV], ATTN_F32, dev, B, skv, p->hk, dv);
}

/* One CP rank (single, or tp only): plain attention on this rank's heads, the same
 * kernels as one rank, so TP results are bitwise those of a single rank. Each call waits
 * for the context's queued work (CUDA kernels are asynchronous), so the clock is honest. */
static attn_status attn_fwd_pass(void *user) {
  attn_job *j = user;
  const problem *p = j->p;
  const ctx_tensors *t = &j->r->t;
  float *lse = t->out[OUT_LSE];
  const grid *g = j->env->g;
  attn_status st =
      g->cp == 1 && !g->split_kv
          ? attn_fwd(j->env->ctx, &t->spec, &j->q, &j->k, &j->v, &j->o, lse)
          : (g->split_kv ? attn_split_kv_fwd : attn_ring_fwd)(j->env->grp, &t->spec, g->layout,
                                                              p->seq_q, p->seq_kv, &j->q, &j->k,
                                                              &j->v, &j->o, lse);
  return st == ATTN_OK ? attn_ctx_sync(j->env->ctx) : st;
}

static attn_status attn_bwd_pass(void *user) {
  attn_job *j = user;
  const problem *p = j->p;
  const ctx_tensors *t = &j->r->t;
  const float *lse = t->out[OUT_LSE];
  float *dsinks = t->out[OUT_DSINKS];
  const grid *g = j->env->g;
  attn_status st =
      g->cp == 1 && !g->split_kv
          ? attn_bwd(j->env->ctx, &t->spec, &j->q, &j->k, &j->v, &j->o, lse, &j->dout, &j->dq,
                     &j->dk, &j->dv, dsinks)
          : (g->split_kv ? attn_split_kv_bwd : attn_ring_bwd)(
                j->env->grp, &t->spec, g->layout, p->seq_q, p->seq_kv, &j->q, &j->k, &j->v,
                &j->o, lse, &j->dout, &j->dq, &j->dk, &j->dv, dsinks);
  return st == ATTN_OK ? attn_ctx_sync(j->env->ctx) : st;
}

/* In-place float sum over comm, in pieces that fit MPI's int counts. */
static void allreduce_floats(float *x, int64_t n, MPI_Comm comm) {
  const int64_t piece = 1 << 30;
  for (int64_t at = 0; at < n; at += piece)
    MPI_Allreduce(MPI_IN_PLACE, x + at, (int)(n - at < piece ? n - at : piece), MPI_FLOAT, MPI_SUM,
                  comm);
}

/* A KV head replicated over TP ranks (Hkv < tp) gets a partial dK/dV on each of them:
 * sum them over the ranks that share it (same CP rank, same KV head), after the timing,
 * so that --check and --save see the full gradient. */
static void sum_replicated_kv(const run_env *env, const problem *p, run_result *r) {
  const grid *g = env->g;
  if (g->single || p->spec.num_heads_kv >= g->tp) return;
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, g->cp_rank * p->spec.num_heads_kv + g->hk0, env->e->rank, &sub);
  int64_t rows = p->batch * p->kv_rows * p->hk;
  allreduce_floats(r->dk, rows * p->spec.head_dim_qk, sub);
  allreduce_floats(r->dv, rows * p->spec.head_dim_v, sub);
  MPI_Comm_free(&sub);
}

static float *const *host_outputs(run_result *r, float *out[OUT_COUNT]) {
  out[OUT_O] = r->o, out[OUT_LSE] = r->lse, out[OUT_DQ] = r->dq;
  out[OUT_DK] = r->dk, out[OUT_DV] = r->dv, out[OUT_DSINKS] = r->dsinks;
  return out;
}

/* The outputs back on the host; agreed, because summing replicated dK/dV is collective. */
static attn_status download(const run_env *env, const problem *p, run_result *r,
                            const char **what) {
  float *host[OUT_COUNT];
  *what = "copying the outputs back from the device (attn_ctx_copy)";
  attn_status st = ctxbuf_download(&r->t, p, host_outputs(r, host));
  if (mpienv_max_int(env->e, st != ATTN_OK, 60.0, "copying the outputs back")) {
    r->fwd.peer_failed = st == ATTN_OK;
    return st != ATTN_OK ? st : ATTN_ERR_INTERNAL;
  }
  if (r->bwd.done) sum_replicated_kv(env, p, r);
  return ATTN_OK;
}

attn_status run_attention(const run_env *env, const problem *p, run_result *r,
                          const char **what) {
  attn_job j = {.env = env, .p = p, .r = r};
  float *host[OUT_COUNT];
  attn_status st = ctxbuf_setup(&r->t, env->ctx, env->dtype, p, host_outputs(r, host), what);
  make_views(&j);
  const int split = env->g->split_kv, ring = env->g->cp > 1 && !split;
  if (st == ATTN_OK) *what = split ? "attn_split_kv_fwd" : ring ? "attn_ring_fwd" : "attn_fwd";
  st = run_timed(env, "forward", attn_fwd_pass, &j, st, &r->fwd);
  if (st != ATTN_OK) return st;
  r->fwd.flops = attn_flops_fwd(&p->spec, p->batch, p->seq_q, p->seq_kv);
  if (env->a->bwd) {
    *what = split ? "attn_split_kv_bwd" : ring ? "attn_ring_bwd" : "attn_bwd";
    st = run_timed(env, "backward", attn_bwd_pass, &j, ATTN_OK, &r->bwd);
    if (st != ATTN_OK) return st;
    r->bwd.flops = 2.5 * r->fwd.flops;
  }
  return download(env, p, r, what);
}

void run_free(run_result *r) {
  ctxbuf_free(&r->t);
  free(r->o);
  free(r->lse);
  free(r->dq);
  free(r->dk);
  free(r->dv);
  free(r->dsinks);
  memset(r, 0, sizeof *r);
}
