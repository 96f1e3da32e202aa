/* estimate.c — the pre-run estimate. Computed FLOPs come from the mask geometry (causal,
 * window; block-sparse scaled by the mask density; varlen boundaries ignored, so an upper
 * bound), rounded to tiles as the kernels skip whole tiles. The rate comes from a probe:
 * a small non-causal attn_fwd (and attn_bwd) with this rank's heads and threads, timed on
 * this machine by one rank of a host at a time, scaled down when ranks share cores. */
#include "estimate.h"
#include "ctxbuf.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define PROBE_SEQ 256      /* tokens of the first probe */
#define PROBE_SEQ_MAX 2048 /* a fast device doubles up to this */
#define PROBE_MIN_S 0.02   /* a call shorter than this measures launch latency, not rate */
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

/* The probe's tensors in the context's memory, in the run's dtype (gradients float32). */
typedef struct {
  attn_tensor q, k, v, o, dout, dq, dk, dv;
  float *lse;
  void *mem[9];
} probe_bufs;

/* Slot i of the probe: [1, S, heads, dim] of dtype t, in context memory; q gets a mild
 * spread of values, so that exp does real work, the others zeros. */
static attn_status probe_tensor(const run_env *env, probe_bufs *b, int i, attn_dtype t,
                                int64_t S, int64_t heads, int64_t dim, attn_tensor *out) {
  int64_t n = S * heads * dim;
  float *host = calloc((size_t)n, sizeof(float));
  if (!host) return ATTN_ERR_OUT_OF_MEMORY;
  for (int64_t e = 0; i == 0 && e < n; e++)
    host[e] = (float)((e * 7919) % 17) * 0.05f;
  attn_status st = ctxbuf_put(env->ctx, host, n, t, &b->mem[i]);
  free(host);
  *out = attn_tensor_contig(b->mem[i], t, attn_ctx_device(env->ctx), 1, S, heads, dim);
  return st;
}

static attn_status probe_alloc(const run_env *env, const problem *p, int64_t S, probe_bufs *b) {
  const attn_spec *g = &p->spec;
  int64_t hq = p->hq, hk = p->hk, dq = g->head_dim_qk, dv = g->head_dim_v;
  attn_dtype t = env->dtype, f = ATTN_F32;
  attn_tensor lse;
  attn_status st = probe_tensor(env, b, 0, t, S, hq, dq, &b->q);
  if (st == ATTN_OK) st = probe_tensor(env, b, 1, t, S, hk, dq, &b->k);
  if (st == ATTN_OK) st = probe_tensor(env, b, 2, t, S, hk, dv, &b->v);
  if (st == ATTN_OK) st = probe_tensor(env, b, 3, t, S, hq, dv, &b->o);
  if (st == ATTN_OK) st = probe_tensor(env, b, 4, t, S, hq, dv, &b->dout);
  if (st == ATTN_OK) st = probe_tensor(env, b, 5, f, S, hq, dq, &b->dq);
  if (st == ATTN_OK) st = probe_tensor(env, b, 6, f, S, hk, dq, &b->dk);
  if (st == ATTN_OK) st = probe_tensor(env, b, 7, f, S, hk, dv, &b->dv);
  if (st == ATTN_OK) st = probe_tensor(env, b, 8, f, S, hq, 1, &lse);
  b->lse = b->mem[8];
  return st;
}

static double timed_call(const run_env *env, attn_status (*call)(const run_env *, const attn_spec *,
                                                                 probe_bufs *),
                         const attn_spec *s, probe_bufs *b, attn_stats *stats) {
  double t0 = now_s();
  attn_status st = call(env, s, b);
  if (st == ATTN_OK) st = attn_ctx_sync(env->ctx); /* device kernels are asynchronous */
  double dt = now_s() - t0;
  if (st != ATTN_OK) return -1;
  attn_ctx_last_stats(env->ctx, stats);
  return dt;
}

static attn_status call_fwd(const run_env *env, const attn_spec *s, probe_bufs *b) {
  return attn_fwd(env->ctx, s, &b->q, &b->k, &b->v, &b->o, b->lse);
}

static attn_status call_bwd(const run_env *env, const attn_spec *s, probe_bufs *b) {
  return attn_bwd(env->ctx, s, &b->q, &b->k, &b->v, &b->o, b->lse, &b->dout, &b->dq, &b->dk,
                  &b->dv, NULL);
}

static void probe_free(const run_env *env, probe_bufs *b) {
  for (int i = 0; i < 9; i++) attn_ctx_free(env->ctx, b->mem[i]);
  memset(b, 0, sizeof *b);
}

/* FLOPs of a call's computed tiles; the rule's count where the backend keeps no statistics
 * (the probe has no mask, so the two agree up to the tile padding). */
static double probe_flops(const attn_stats *st, const attn_spec *s, int64_t S, double factor) {
  return st->flops_computed > 0 ? st->flops_computed : factor * attn_flops_fwd(s, 1, S, S);
}

/* GFLOP/s of the tiles computed by a small attn_fwd (bwd) on this rank's context, in the
 * run's dtype and memory; 0 on failure. The probe doubles its length from PROBE_SEQ while
 * a forward call is shorter than PROBE_MIN_S (a device's launch latency would otherwise be
 * most of what is measured), up to PROBE_SEQ_MAX. */
static void probe(const run_env *env, const problem *p, int bwd, double *gf_fwd, double *gf_bwd) {
  const attn_spec *g = &p->spec;
  attn_spec s = ATTN_SPEC_INIT;
  s.num_heads_q = p->hq, s.num_heads_kv = p->hk;
  s.head_dim_qk = g->head_dim_qk, s.head_dim_v = g->head_dim_v;
  int64_t S = PROBE_SEQ;
  probe_bufs b;
  memset(&b, 0, sizeof b);
  double best_f = INFINITY, best_b = INFINITY;
  attn_stats st_f = {0}, st_b = {0};
  *gf_fwd = *gf_bwd = 0;
  for (;;) { /* rep 0 of each length warms up and picks the length */
    double tf = probe_alloc(env, p, S, &b) == ATTN_OK ? timed_call(env, call_fwd, &s, &b, &st_f) : -1;
    if (tf >= PROBE_MIN_S || (tf >= 0 && S >= PROBE_SEQ_MAX)) break;
    probe_free(env, &b); /* too short, or failed (then b.mem[0] stays NULL: no reps) */
    if (tf < 0) break;
    S *= 2;
  }
  for (int rep = 1; rep <= PROBE_REPS && b.mem[0]; rep++) {
    double tf = timed_call(env, call_fwd, &s, &b, &st_f);
    double tb = bwd && tf >= 0 ? timed_call(env, call_bwd, &s, &b, &st_b) : 0;
    if (tf < 0 || tb < 0) break;
    best_f = fmin(best_f, tf), best_b = fmin(best_b, tb);
  }
  probe_free(env, &b);
  if (isfinite(best_f) && best_f > 0) *gf_fwd = probe_flops(&st_f, &s, S, 1.0) / best_f * 1e-9;
  if (bwd && isfinite(best_b) && best_b > 0)
    *gf_bwd = probe_flops(&st_b, &s, S, 2.5) / best_b * 1e-9;
}

/* Split-KV: the own state and the gathered ones, floats per batch entry. */
static double split_state_floats(const run_env *env, const problem *p) {
  return (env->g->cp + 1.0) * p->hq * (double)p->q_rows * (p->spec.head_dim_v + 2.0);
}

/* Bytes this rank holds: inputs, outputs and the ring's double buffers (split-KV: the
 * gathered states). */
static double memory_bytes(const run_env *env, const problem *p, int64_t d_model) {
  const attn_spec *s = &p->spec;
  double B = (double)p->batch, dq = s->head_dim_qk, dv = s->head_dim_v, bwd = env->a->bwd;
  double qrow = p->hq * (dq + dv + (bwd ? dq + dv : 0)) + p->hq; /* q, o, [dq, do], lse */
  double krow = p->hk * (dq + dv) * (bwd ? 2 : 1);                /* k, v, [dk, dv] */
  double ring = env->g->split_kv ? split_state_floats(env, p) /* the gathered states */
                 : env->g->cp > 1 ? 2.0 * krow * (double)p->kv_rows /* two blocks in flight */
                                  : 0;
  double bytes = 4 * B * ((double)p->q_rows * qrow + (double)p->kv_rows * krow + ring);
  if (d_model > 0) /* x, y (dy, dx) rows and this rank's weight columns */
    bytes += 4 * (B * (double)p->q_rows * d_model * (bwd ? 4 : 2) +
                  (double)d_model * (p->hq * (dq + dv) + p->hk * (dq + dv)) * (bwd ? 2 : 1));
  return bytes;
}

/* Device memory of a cuda run: the same tensors, Q K V O dO in the dtype, LSE and the
 * gradients float32 (the layer: float32 throughout), plus the ring's two blocks. */
static double device_bytes(const run_env *env, const problem *p, int64_t d_model) {
  if (d_model > 0) return memory_bytes(env, p, d_model);
  const attn_spec *s = &p->spec;
  double B = (double)p->batch, dq = s->head_dim_qk, dv = s->head_dim_v, bwd = env->a->bwd;
  double es = (double)attn_dtype_size(env->dtype);
  double qrow = p->hq * (es * (dq + dv + (bwd ? dv : 0)) + 4.0 * (1 + (bwd ? dq : 0)));
  double krow = p->hk * (es * (dq + dv) + (bwd ? 4.0 * (dq + dv) : 0));
  double ring = env->g->split_kv ? 4.0 * split_state_floats(env, p)
                 : env->g->cp > 1 ? 2.0 * krow * (double)p->kv_rows
                                  : 0;
  return B * ((double)p->q_rows * qrow + (double)p->kv_rows * krow + ring);
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
  /* a key row is seen by about pairs_per_row * Sq / Skv query rows, each recomputed over
   * its pairs_per_row keys */
  double q_per_key = pairs_per_row * (double)p->seq_q / (double)p->seq_kv;
  if (q_per_key > (double)p->seq_q) q_per_key = (double)p->seq_q;
  if (env->a->bwd) t += n * group * q_per_key * pairs_per_row * per_key * 3.0;
  if (d_model > 0) /* every head of a row, and the projections of the rows it reads */
    t *= (double)p->spec.num_heads_kv * (1.0 + (double)d_model / 64.0);
  int threads = omp_get_max_threads();
  return t / (cores < threads ? cores : threads);
}

void estimate_rank(const run_env *env, const problem *p, int64_t d_model, double cores,
                   int gpu_sharing, estimate *out) {
  const run_args *a = env->a;
  const attn_spec *s = &p->spec;
  memset(out, 0, sizeof *out);
  double pairs = estimate_pairs(s, p->seq_q, p->seq_kv, &p->qsh);
  if (env->g->split_kv) pairs /= env->g->cp; /* all queries, a cut of the keys */
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
  double share = attn_ctx_device(env->ctx) != ATTN_DEVICE_HOST
                     ? 1.0 / (gpu_sharing > 1 ? gpu_sharing : 1) /* ranks on one device */
                     : cores < threads ? cores / threads : 1.0;
  out->gflops_fwd *= share, out->gflops_bwd *= share;
  if (out->gflops_fwd > 0) out->fwd_s = out->flops_fwd / (out->gflops_fwd * 1e9);
  if (a->bwd && out->gflops_bwd > 0) out->bwd_s = out->flops_bwd / (out->gflops_bwd * 1e9);
  attn_cp_shard whole = problem_whole(p->seq_q);
  double per_row = estimate_pairs(s, p->seq_q, p->seq_kv, &whole) / (double)p->seq_q;
  if (a->check_rows > 0) out->check_s = check_seconds(env, p, per_row, d_model, cores);
  out->total_s = (a->warmup + a->iters) * (out->fwd_s + out->bwd_s) + out->check_s;
  out->mem_bytes = memory_bytes(env, p, d_model);
  if (attn_ctx_device(env->ctx) != ATTN_DEVICE_HOST) out->dev_bytes = device_bytes(env, p, d_model);
}
