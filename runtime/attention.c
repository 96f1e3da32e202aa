/* attention.c — the public attention entry points: validate everything, then dispatch to
 * the context's backend. Single-rank backward = prepare + one block. */
#include "validate.h"

#include <stdlib.h>
#include <string.h>

static attn_status need(const void *p, const char *name) {
  return p ? ATTN_OK : attn__fail(ATTN_ERR_INVALID_ARG, "%s is NULL", name);
}

static void reset_stats(attn_ctx_t ctx) { memset(&ctx->stats, 0, sizeof ctx->stats); }

attn_status attn_fwd(attn_ctx_t ctx, const attn_spec *spec, const attn_tensor *q,
                     const attn_tensor *k, const attn_tensor *v, attn_tensor *o, float *lse) {
  attn__problem pb;
  attn__view ov;
  ATTN_CHECK(attn__make_problem(ctx, spec, q, k, v, NULL, &pb));
  ATTN_CHECK(attn__check_out(ctx, "o", o, pb.dtype, pb.B, pb.sq, pb.Hq, pb.Dv, &ov));
  reset_stats(ctx);
  return ctx->ops->fwd(ctx, &pb, ov, lse, pb.sq);
}

/* Zeroes a strided [B, S, H, D] float32 view in the context's memory (on its stream). */
static attn_status zero_view(attn_ctx_t ctx, attn__view v, int64_t B, int64_t S, int64_t H,
                             int64_t D) {
  return ctx->ops->rows(ctx, ATTN__ROWS_ZERO, v, ATTN_F32, v, ATTN_F32, B, S, H, D);
}

attn_status attn_bwd(attn_ctx_t ctx, const attn_spec *spec, const attn_tensor *q,
                     const attn_tensor *k, const attn_tensor *v, const attn_tensor *o,
                     const float *lse, const attn_tensor *dout, attn_tensor *dq,
                     attn_tensor *dk, attn_tensor *dv, float *dsinks) {
  attn__problem pb;
  attn__view ov, dov, dqv, dkv, dvv;
  ATTN_CHECK(attn__no_kv_cache(spec, "attn_bwd"));
  ATTN_CHECK(attn__make_problem(ctx, spec, q, k, v, NULL, &pb));
  ATTN_CHECK(attn__check_tensor(ctx, "o", o, pb.dtype, (int64_t[4]){pb.B, pb.sq, pb.Hq, pb.Dv}, 0, &ov));
  ATTN_CHECK(attn__check_tensor(ctx, "dout", dout, pb.dtype, (int64_t[4]){pb.B, pb.sq, pb.Hq, pb.Dv}, 0, &dov));
  ATTN_CHECK(need(lse, "lse"));
  ATTN_CHECK(attn__check_out(ctx, "dq", dq, ATTN__DT_ACCUM, pb.B, pb.sq, pb.Hq, pb.Dqk, &dqv));
  ATTN_CHECK(attn__check_out(ctx, "dk", dk, ATTN__DT_ACCUM, pb.B, pb.skv, pb.Hkv, pb.Dqk, &dkv));
  ATTN_CHECK(attn__check_out(ctx, "dv", dv, ATTN__DT_ACCUM, pb.B, pb.skv, pb.Hkv, pb.Dv, &dvv));
  if (pb.sinks && !dsinks)
    return attn__fail(ATTN_ERR_INVALID_ARG, "dsinks is NULL but spec->sinks is set");
  /* delta [B, Hq, Sq] in the context's memory: the backend's scratch where it has one (a
   * CUDA attn_bwd then only enqueues work, as attn_fwd does), else allocated here. */
  float *delta = NULL;
  const int64_t nd = pb.B * pb.Hq * pb.sq;
  if (ctx->ops->scratch) ATTN_CHECK(ctx->ops->scratch(ctx, nd, &delta));
  else ATTN_CHECK(ctx->ops->mem_alloc(ctx, (size_t)nd * sizeof(float), (void **)&delta));
  reset_stats(ctx);
  attn__view dsv = attn__view_of(dsinks, 0, 0, 0);
  attn_status st = ATTN_OK;
  if (dsinks && pb.sinks) st = zero_view(ctx, dsv, 1, 1, 1, pb.Hq);
  if (st == ATTN_OK) st = zero_view(ctx, dqv, pb.B, pb.sq, pb.Hq, pb.Dqk);
  if (st == ATTN_OK) st = zero_view(ctx, dkv, pb.B, pb.skv, pb.Hkv, pb.Dqk);
  if (st == ATTN_OK) st = zero_view(ctx, dvv, pb.B, pb.skv, pb.Hkv, pb.Dv);
  if (st == ATTN_OK)
    st = ctx->ops->bwd_prepare(ctx, &pb, ov, dov, lse, delta, pb.sinks ? dsinks : NULL);
  if (st == ATTN_OK) st = ctx->ops->bwd_block(ctx, &pb, dov, lse, delta, pb.sq, dqv, dkv, dvv);
  if (!ctx->ops->scratch) ctx->ops->mem_free(ctx, delta);
  return st;
}

static attn_status check_state(const attn_state *st, const char *name) {
  if (!st) return attn__fail(ATTN_ERR_INVALID_ARG, "%s (attn_state *) is NULL", name);
  if (!st->m || !st->l || !st->acc)
    return attn__fail(ATTN_ERR_INVALID_ARG, "%s->%s is NULL", name,
                      !st->m ? "m" : !st->l ? "l" : "acc");
  if (st->batch <= 0 || st->heads <= 0 || st->rows <= 0 || st->head_dim_v <= 0)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "%s sizes batch=%lld heads=%lld rows=%lld head_dim_v=%lld must be positive",
                      name, (long long)st->batch, (long long)st->heads, (long long)st->rows,
                      (long long)st->head_dim_v);
  return ATTN_OK;
}

attn_status attn_state_init(attn_ctx_t ctx, attn_state *st) {
  ATTN_CHECK(need(ctx, "ctx"));
  ATTN_CHECK(check_state(st, "st"));
  return ctx->ops->state_init(ctx, st);
}

static attn_status state_matches(const attn__problem *pb, const attn_state *st) {
  if (st->batch != pb->B || st->heads != pb->Hq || st->head_dim_v != pb->Dv ||
      pb->q_row0 + pb->sq > st->rows)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "state [B=%lld, Hq=%lld, rows=%lld, Dv=%lld] does not fit q rows "
                      "%lld..%lld of B=%lld Hq=%lld Dv=%lld",
                      (long long)st->batch, (long long)st->heads, (long long)st->rows,
                      (long long)st->head_dim_v, (long long)pb->q_row0,
                      (long long)(pb->q_row0 + pb->sq), (long long)pb->B, (long long)pb->Hq,
                      (long long)pb->Dv);
  return ATTN_OK;
}

attn_status attn_fwd_block(attn_ctx_t ctx, const attn_spec *spec, attn_state *st,
                           const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                           const attn_block_pos *pos) {
  attn__problem pb;
  ATTN_CHECK(attn__make_problem(ctx, spec, q, k, v, pos, &pb));
  ATTN_CHECK(need(pos, "pos"));
  ATTN_CHECK(check_state(st, "st"));
  ATTN_CHECK(state_matches(&pb, st));
  reset_stats(ctx);
  return ctx->ops->fwd_block(ctx, &pb, st);
}

attn_status attn_state_merge(attn_ctx_t ctx, attn_state *dst, const attn_state *src) {
  ATTN_CHECK(need(ctx, "ctx"));
  ATTN_CHECK(check_state(dst, "dst"));
  ATTN_CHECK(check_state(src, "src"));
  if (dst->batch != src->batch || dst->heads != src->heads || dst->rows != src->rows ||
      dst->head_dim_v != src->head_dim_v)
    return attn__fail(ATTN_ERR_INVALID_ARG, "dst and src states have different sizes");
  return ctx->ops->state_merge(ctx, dst, src);
}

/* A problem carrying only what finalize/prepare need: heads, dims and sinks. */
static attn_status head_problem(attn_ctx_t ctx, const attn_spec *spec, int64_t B, int64_t sq,
                                attn__problem *pb) {
  ATTN_CHECK(need(ctx, "ctx"));
  attn_spec s;
  ATTN_CHECK(attn__copy_spec(spec, &s));
  ATTN_CHECK(attn__check_spec(&s));
  memset(pb, 0, sizeof *pb);
  pb->B = B;
  pb->sq = sq;
  pb->Hq = s.num_heads_q;
  pb->Hkv = s.num_heads_kv;
  pb->Dqk = s.head_dim_qk;
  pb->Dv = s.head_dim_v ? s.head_dim_v : s.head_dim_qk;
  pb->sinks = s.sinks;
  return ATTN_OK;
}

attn_status attn_state_finalize(attn_ctx_t ctx, const attn_spec *spec, const attn_state *st,
                                attn_tensor *o, float *lse) {
  attn__problem pb;
  attn__view ov;
  ATTN_CHECK(check_state(st, "st"));
  ATTN_CHECK(head_problem(ctx, spec, st->batch, st->rows, &pb));
  ATTN_CHECK(state_matches(&pb, st));
  ATTN_CHECK(attn__check_out(ctx, "o", o, ATTN__DT_ANY, pb.B, pb.sq, pb.Hq, pb.Dv, &ov));
  pb.dtype = o->dtype; /* the dtype finalize writes */
  return ctx->ops->finalize(ctx, &pb, st, ov, lse);
}

attn_status attn_bwd_prepare(attn_ctx_t ctx, const attn_spec *spec, const attn_tensor *o,
                             const attn_tensor *dout, const float *lse, float *delta,
                             float *dsinks) {
  attn__problem pb;
  attn__view ov, dov;
  ATTN_CHECK(need(o, "o"));
  ATTN_CHECK(head_problem(ctx, spec, o->shape[0], o->shape[1], &pb));
  ATTN_CHECK(attn__check_tensor(ctx, "o", o, ATTN__DT_ANY, (int64_t[4]){pb.B, pb.sq, pb.Hq, pb.Dv}, 0, &ov));
  ATTN_CHECK(attn__check_tensor(ctx, "dout", dout, o->dtype, (int64_t[4]){pb.B, pb.sq, pb.Hq, pb.Dv}, 0, &dov));
  ATTN_CHECK(need(lse, "lse"));
  ATTN_CHECK(need(delta, "delta"));
  pb.dtype = o->dtype; /* the dtype of o and dout that prepare reads */
  return ctx->ops->bwd_prepare(ctx, &pb, ov, dov, lse, delta, pb.sinks ? dsinks : NULL);
}

attn_status attn_bwd_block(attn_ctx_t ctx, const attn_spec *spec, const attn_tensor *q,
                           const attn_tensor *k, const attn_tensor *v, const attn_tensor *dout,
                           const float *lse, const float *delta, int64_t lse_rows,
                           attn_tensor *dq, attn_tensor *dk, attn_tensor *dv,
                           const attn_block_pos *pos) {
  attn__problem pb;
  attn__view dov, dqv, dkv, dvv;
  ATTN_CHECK(attn__no_kv_cache(spec, "attn_bwd_block"));
  ATTN_CHECK(attn__make_problem(ctx, spec, q, k, v, pos, &pb));
  ATTN_CHECK(need(pos, "pos"));
  ATTN_CHECK(attn__check_tensor(ctx, "dout", dout, pb.dtype, (int64_t[4]){pb.B, pb.sq, pb.Hq, pb.Dv}, 0, &dov));
  ATTN_CHECK(need(lse, "lse"));
  ATTN_CHECK(need(delta, "delta"));
  if (lse_rows < pb.q_row0 + pb.sq)
    return attn__fail(ATTN_ERR_INVALID_ARG, "lse_rows=%lld is less than q_row0+rows=%lld",
                      (long long)lse_rows, (long long)(pb.q_row0 + pb.sq));
  ATTN_CHECK(attn__check_out(ctx, "dq", dq, ATTN__DT_ACCUM, pb.B, pb.sq, pb.Hq, pb.Dqk, &dqv));
  ATTN_CHECK(attn__check_out(ctx, "dk", dk, ATTN__DT_ACCUM, pb.B, pb.skv, pb.Hkv, pb.Dqk, &dkv));
  ATTN_CHECK(attn__check_out(ctx, "dv", dv, ATTN__DT_ACCUM, pb.B, pb.skv, pb.Hkv, pb.Dv, &dvv));
  reset_stats(ctx);
  return ctx->ops->bwd_block(ctx, &pb, dov, lse, delta, lse_rows, dqv, dkv, dvv);
}

double attn_flops_fwd(const attn_spec *spec, int64_t batch, int64_t seq_q, int64_t seq_kv) {
  if (!spec) return 0;
  double dqk = spec->head_dim_qk, dv = spec->head_dim_v ? spec->head_dim_v : dqk;
  double per = 2.0 * spec->num_heads_q * (dqk + dv) * (spec->causal ? 0.5 : 1.0);
  if (spec->num_seqs > 0 && spec->cu_seqlens_q && spec->cu_seqlens_kv) {
    double sum = 0;
    for (int32_t s = 0; s < spec->num_seqs; s++)
      sum += (double)(spec->cu_seqlens_q[s + 1] - spec->cu_seqlens_q[s]) *
             (double)(spec->cu_seqlens_kv[s + 1] - spec->cu_seqlens_kv[s]);
    return per * sum;
  }
  const attn_kv_cache *kc =
      spec->size >= offsetof(attn_spec, kv_cache) + sizeof spec->kv_cache ? spec->kv_cache : NULL;
  if (kc && kc->seqused_kv) {
    double sum = 0;
    for (int64_t b = 0; b < batch; b++) sum += (double)seq_q * (double)kc->seqused_kv[b];
    return per * sum;
  }
  return per * (double)batch * (double)seq_q * (double)seq_kv;
}
