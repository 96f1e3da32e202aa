/* run.c — drives the library for attnrun: context and group, tensor views of the local
 * shard, outputs poisoned (NaN) so unwritten elements show, warmup, then each iteration
 * started together (barrier) and timed with the monotonic clock. Per rank: median, min,
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

attn_status run_timed(const run_env *env, const char *name, run_pass_fn fn, void *user,
                      run_timing *t) {
  const run_args *a = env->a;
  double times[RUN_MAX_ITERS], job[RUN_MAX_ITERS], last = 0, slack = 10.0;
  int total = a->warmup + a->iters;
  run_split sum = {0};
  for (int it = 0; it < total; it++) {
    mpienv_barrier(env->e, slack, name);
    double t0 = mpienv_now();
    attn_status st = fn(user);
    double dt = mpienv_now() - t0;
    if (st != ATTN_OK) return st;
    if (2 * dt + 10.0 > slack) slack = 2 * dt + 10.0; /* ranks may arrive that far apart */
    if (it >= a->warmup) {
      times[it - a->warmup] = job[it - a->warmup] = dt;
      if ((st = add_steps(env, &sum)) != ATTN_OK) return st;
    }
    progress(env, name, it + 1, total, dt, &last);
  }
  attn_status st = attn_ctx_last_stats(env->ctx, &t->stats);
  if (st != ATTN_OK) return st;
  mpienv_max_doubles(env->e, job, a->iters, slack, name);
  summarize(times, a->iters, &t->median_s, &t->min_s, &t->mean_s);
  summarize(job, a->iters, &t->job_median_s, &t->job_min_s, &t->job_mean_s);
  t->split = sum;
  t->split.compute_s /= a->iters, t->split.wait_s /= a->iters, t->split.bytes /= a->iters;
  if (!env->grp || (env->g->cp == 1 && !env->g->layer)) { /* no ring: all of it is compute */
    t->split.compute_s = t->mean_s;
    t->split.steps = t->split.computed = 1;
  }
  t->done = 1;
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
  attn_spec spec; /* this rank's heads */
  attn_tensor q, k, v, o, dout, dq, dk, dv;
} attn_job;

static void make_views(attn_job *j) {
  const problem *p = j->p;
  const attn_spec *s = &p->spec;
  const run_result *r = j->r;
  int64_t B = p->batch, sq = p->q_rows, skv = p->kv_rows;
  j->spec = problem_local_spec(p);
  j->q = attn_tensor_f32(p->q, B, sq, p->hq, s->head_dim_qk);
  j->k = attn_tensor_f32(p->k, B, skv, p->hk, s->head_dim_qk);
  j->v = attn_tensor_f32(p->v, B, skv, p->hk, s->head_dim_v);
  j->o = attn_tensor_f32(r->o, B, sq, p->hq, s->head_dim_v);
  j->dout = attn_tensor_f32(p->dout, B, sq, p->hq, s->head_dim_v);
  j->dq = attn_tensor_f32(r->dq, B, sq, p->hq, s->head_dim_qk);
  j->dk = attn_tensor_f32(r->dk, B, skv, p->hk, s->head_dim_qk);
  j->dv = attn_tensor_f32(r->dv, B, skv, p->hk, s->head_dim_v);
}

/* One CP rank (single, or tp only): plain attention on this rank's heads, the same
 * kernels as one rank, so TP results are bitwise those of a single rank. */
static attn_status attn_fwd_pass(void *user) {
  attn_job *j = user;
  const problem *p = j->p;
  if (j->env->g->cp == 1) return attn_fwd(j->env->ctx, &j->spec, &j->q, &j->k, &j->v, &j->o, j->r->lse);
  return attn_ring_fwd(j->env->grp, &j->spec, j->env->g->layout, p->seq_q, p->seq_kv, &j->q,
                       &j->k, &j->v, &j->o, j->r->lse);
}

static attn_status attn_bwd_pass(void *user) {
  attn_job *j = user;
  const problem *p = j->p;
  run_result *r = j->r;
  if (j->env->g->cp == 1)
    return attn_bwd(j->env->ctx, &j->spec, &j->q, &j->k, &j->v, &j->o, r->lse, &j->dout, &j->dq,
                    &j->dk, &j->dv, r->dsinks);
  return attn_ring_bwd(j->env->grp, &j->spec, j->env->g->layout, p->seq_q, p->seq_kv, &j->q,
                       &j->k, &j->v, &j->o, r->lse, &j->dout, &j->dq, &j->dk, &j->dv, r->dsinks);
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

attn_status run_attention(const run_env *env, const problem *p, run_result *r,
                          const char **what) {
  attn_job j = {.env = env, .p = p, .r = r};
  make_views(&j);
  *what = env->g->cp > 1 ? "attn_ring_fwd" : "attn_fwd";
  attn_status st = run_timed(env, "forward", attn_fwd_pass, &j, &r->fwd);
  if (st != ATTN_OK) return st;
  r->fwd.flops = attn_flops_fwd(&p->spec, p->batch, p->seq_q, p->seq_kv);
  if (!env->a->bwd) return ATTN_OK;
  *what = env->g->cp > 1 ? "attn_ring_bwd" : "attn_bwd";
  st = run_timed(env, "backward", attn_bwd_pass, &j, &r->bwd);
  if (st != ATTN_OK) return st;
  r->bwd.flops = 2.5 * r->fwd.flops;
  sum_replicated_kv(env, p, r);
  return ATTN_OK;
}

void run_free(run_result *r) {
  free(r->o);
  free(r->lse);
  free(r->dq);
  free(r->dk);
  free(r->dv);
  free(r->dsinks);
  memset(r, 0, sizeof *r);
}
