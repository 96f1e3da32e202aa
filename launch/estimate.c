/* estimate.c — the pre-run estimate. Computed FLOPs come from the mask geometry (causal,
 * window; block-sparse scaled by the mask density; varlen boundaries ignored, so an upper
 * bound), rounded to tiles as the kernels skip whole tiles. The rate comes from a probe:
 * a small non-causal attn_fwd (and attn_bwd) with this rank's heads and threads, timed on
 * this machine by one rank of a host at a time, scaled down when ranks share cores. */
#include "estimate.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define PROBE_SEQ 256
#define PROBE_REPS 3
#define ORACLE_NS_PER_ELEM 5.0 /* float64 oracle: regenerate + multiply-add, per element */

/* Visible key span [lo, hi] of query i (no varlen). */
static void key_span(const attn_spec *s, int64_t i, int64_t seq_q, int64_t seq_kv, int64_t *lo,
                     int64_t *hi) {
  int64_t c = i + seq_kv - seq_q;
  *lo = 0, *hi = seq_kv - 1;
  if (s->causal && c < *hi) *hi = c;
  if (s->window_left >= 0 && c - s->window_left > *lo) *lo = c - s->window_left;
  if (s->window_right >= 0 && c + s->window_right < *hi) *hi = c + s->window_right;
}

static double mask_density(const attn_block_mask *bm) {
  int64_t n = bm->num_q_blocks * bm->num_k_blocks, on = 0;
  for (int64_t i = 0; i < n; i++)
    on += bm->mask[i] != 0;
  return n ? (double)on / (double)n : 0.0;
}

double estimate_pairs(const attn_spec *s, int64_t seq_q, int64_t seq_kv, const attn_cp_shard *qsh) {
  const int64_t T = ESTIMATE_TILE;
  double pairs = 0;
  for (int32_t r = 0; r < qsh->count; r++)
    for (int64_t i0 = qsh->start[r]; i0 < qsh->start[r] + qsh->len[r]; i0 += T) {
      int64_t i1 = i0 + T < qsh->start[r] + qsh->len[r] ? i0 + T : qsh->start[r] + qsh->len[r];
      int64_t lo, hi, lo1, hi1;
      key_span(s, i0, seq_q, seq_kv, &lo, &hi);
      key_span(s, i1 - 1, seq_q, seq_kv, &lo1, &hi1);
      if (hi1 > hi) hi = hi1;
      if (hi < lo) continue;
      lo = lo / T * T;
      hi = (hi / T + 1) * T < seq_kv ? (hi / T + 1) * T : seq_kv;
      pairs += (double)(i1 - i0) * (double)(hi - lo);
    }
  return s->block_mask ? pairs * mask_density(s->block_mask) : pairs;
}

static double now_s(void) { return mpienv_now(); }

/* GFLOP/s of the tiles computed by a small attn_fwd (bwd) on this rank; 0 on failure. */
static void probe(const run_env *env, const problem *p, int bwd, double *gf_fwd, double *gf_bwd) {
  const attn_spec *g = &p->spec;
  attn_spec s = ATTN_SPEC_INIT;
  s.num_heads_q = p->hq, s.num_heads_kv = p->hk;
  s.head_dim_qk = g->head_dim_qk, s.head_dim_v = g->head_dim_v;
  int64_t S = PROBE_SEQ, hq = p->hq, hk = p->hk, dq = g->head_dim_qk, dv = g->head_dim_v;
  float *buf = calloc((size_t)(S * (3 * hq * (dq + dv) + 2 * hk * (dq + dv) + hq)), sizeof(float));
  *gf_fwd = *gf_bwd = 0;
  if (!buf) return;
  for (int64_t i = 0; i < S * hq * dq; i++) /* q: a mild spread, so exp does real work */
    buf[i] = (float)((i * 7919) % 17) * 0.05f;
  float *x = buf;
  attn_tensor q = attn_tensor_f32(x, 1, S, hq, dq), o, dout, dqt, k, v, dk, dvt;
  x += S * hq * dq;
  k = attn_tensor_f32(x, 1, S, hk, dq), x += S * hk * dq;
  v = attn_tensor_f32(x, 1, S, hk, dv), x += S * hk * dv;
  o = attn_tensor_f32(x, 1, S, hq, dv), x += S * hq * dv;
  dout = attn_tensor_f32(x, 1, S, hq, dv), x += S * hq * dv;
  dqt = attn_tensor_f32(x, 1, S, hq, dq), x += S * hq * dq;
  dk = attn_tensor_f32(x, 1, S, hk, dq), x += S * hk * dq;
  dvt = attn_tensor_f32(x, 1, S, hk, dv), x += S * hk * dv;
  float *lse = x;
  double best_f = INFINITY, best_b = INFINITY;
  attn_stats st_f = {0}, st_b = {0};
  for (int rep = 0; rep <= PROBE_REPS; rep++) {
    double t0 = now_s();
    if (attn_fwd(env->ctx, &s, &q, &k, &v, &o, lse) != ATTN_OK) break;
    if (rep) best_f = fmin(best_f, now_s() - t0); /* rep 0 warms up */
    attn_ctx_last_stats(env->ctx, &st_f);
    if (!bwd) continue;
    t0 = now_s();
    if (attn_bwd(env->ctx, &s, &q, &k, &v, &o, lse, &dout, &dqt, &dk, &dvt, NULL) != ATTN_OK) break;
    if (rep) best_b = fmin(best_b, now_s() - t0);
    attn_ctx_last_stats(env->ctx, &st_b);
  }
  if (isfinite(best_f) && best_f > 0) *gf_fwd = st_f.flops_computed / best_f * 1e-9;
  if (isfinite(best_b) && best_b > 0) *gf_bwd = st_b.flops_computed / best_b * 1e-9;
  free(buf);
}

/* Bytes this rank holds: inputs, outputs and the ring's double buffers. */
static double memory_bytes(const run_env *env, const problem *p, int64_t d_model) {
  const attn_spec *s = &p->spec;
  double B = (double)p->batch, dq = s->head_dim_qk, dv = s->head_dim_v, bwd = env->a->bwd;
  double qrow = p->hq * (dq + dv + (bwd ? dq + dv : 0)) + p->hq; /* q, o, [dq, do], lse */
  double krow = p->hk * (dq + dv) * (bwd ? 2 : 1);                /* k, v, [dk, dv] */
  double ring = env->g->cp > 1 ? 2.0 * krow * (double)p->kv_rows : 0; /* two blocks in flight */
  double bytes = 4 * B * ((double)p->q_rows * qrow + (double)p->kv_rows * krow + ring);
  if (d_model > 0) /* x, y (dy, dx) rows and this rank's weight columns */
    bytes += 4 * (B * (double)p->q_rows * d_model * (bwd ? 4 : 2) +
                  (double)d_model * (p->hq * (dq + dv) + p->hk * (dq + dv)) * (bwd ? 2 : 1));
  return bytes;
}

/* The float64 oracle: per sampled query row, its visible keys; per sampled key row (with
 * --bwd), a backward over the query rows that see it. Spread over this rank's threads. */
static double check_seconds(const run_env *env, const problem *p, double pairs_per_row,
                            int64_t d_model, double cores) {
  const attn_spec *s = &p->spec;
  double n = (double)env->a->check_rows, d = s->head_dim_qk + s->head_dim_v;
  double group = (double)s->num_heads_q / s->num_heads_kv;
  double per_key = d * ORACLE_NS_PER_ELEM * 1e-9;
  double t = n * pairs_per_row * per_key * (env->a->bwd ? 3.0 : 1.0);
  if (env->a->bwd) t += n * group * pairs_per_row * pairs_per_row * per_key * 3.0;
  if (d_model > 0) /* every head of a row, and the projections of the rows it reads */
    t *= (double)p->spec.num_heads_kv * (1.0 + (double)d_model / 64.0);
  int threads = omp_get_max_threads();
  return t / (cores < threads ? cores : threads);
}

void estimate_rank(const run_env *env, const problem *p, int64_t d_model, double cores,
                   estimate *out) {
  const run_args *a = env->a;
  const attn_spec *s = &p->spec;
  memset(out, 0, sizeof *out);
  double pairs = estimate_pairs(s, p->seq_q, p->seq_kv, &p->qsh);
  out->flops_fwd = pairs * (double)p->batch * p->hq * 2.0 * (s->head_dim_qk + s->head_dim_v);
  if (d_model > 0) /* projections: x W_qkv and O W_o */
    out->flops_proj = 2.0 * (double)p->batch * (double)p->q_rows * (double)d_model *
                      (p->hq * (double)(s->head_dim_qk + s->head_dim_v) +
                       p->hk * (double)(s->head_dim_qk + s->head_dim_v));
  out->flops_bwd = 2.5 * out->flops_fwd + 2.0 * out->flops_proj;
  out->flops_fwd += out->flops_proj;
  /* ranks of a host take turns: each measures the rate of its threads alone, then gets
   * its share of the host's cores */
  for (int turn = 0; turn < env->e->local_size; turn++) {
    if (turn == env->e->local_rank) probe(env, p, a->bwd, &out->gflops_fwd, &out->gflops_bwd);
    mpienv_node_barrier(env->e, "the probe");
  }
  int threads = omp_get_max_threads();
  if (cores < threads) out->gflops_fwd *= cores / threads, out->gflops_bwd *= cores / threads;
  if (out->gflops_fwd > 0) out->fwd_s = out->flops_fwd / (out->gflops_fwd * 1e9);
  if (a->bwd && out->gflops_bwd > 0) out->bwd_s = out->flops_bwd / (out->gflops_bwd * 1e9);
  attn_cp_shard whole = problem_whole(p->seq_q);
  double per_row = estimate_pairs(s, p->seq_q, p->seq_kv, &whole) / (double)p->seq_q;
  if (a->check_rows > 0) out->check_s = check_seconds(env, p, per_row, d_model, cores);
  out->total_s = (a->warmup + a->iters) * (out->fwd_s + out->bwd_s) + out->check_s;
  out->mem_bytes = memory_bytes(env, p, d_model);
}
