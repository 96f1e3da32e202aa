/* split_kv.c — split-KV attention over the CP group (context-parallel decode): every rank
 * holds all query rows and one K/V shard (attn_cp_shard_rows of seq_kv). Forward: each
 * rank folds its shard into a float32 (m, l, acc) state for all rows with the block API,
 * the states are gathered, and every rank merges them in rank order and finalizes, so all
 * ranks hold bitwise the same O and LSE. Backward: each rank takes its shard's dK/dV and a
 * partial dQ; the partials are summed over the group (the transport's sum is bitwise the
 * same on every rank). What travels is the state (B*Hq*Sq*(Dv+2) floats), not K/V: the
 * mode for few query rows against a long key sequence, where the ring would carry the
 * whole K/V cache around. Shares the ring's plan, folds and agreement (ring.h). */
#include "ring.h"
#include "validate.h"

#include <stdlib.h>
#include <string.h>

#define SPLIT_ALIGN 64 /* floats: every part of a gathered state starts 256-byte aligned */

static int64_t round_up(int64_t n) { return (n + SPLIT_ALIGN - 1) / SPLIT_ALIGN * SPLIT_ALIGN; }

/* Floats of one state in the gathered layout: m [n] | l [n] | acc [n, Dv], each padded. */
static int64_t slot_floats(const ring_plan *pl) {
  const int64_t n = pl->B * pl->Hq * pl->seq_q;
  return 2 * round_up(n) + round_up(n * pl->Dv);
}

static attn_state state_at(const ring_plan *pl, float *base) {
  const int64_t n = round_up(pl->B * pl->Hq * pl->seq_q);
  return (attn_state){base, base + n, base + 2 * n, pl->B, pl->Hq, pl->seq_q, pl->Dv};
}

typedef struct {
  ring_plan pl;
  float *mine;       /* [slot]: this rank's state (fwd) or delta [B, Hq, Sq] (bwd) */
  float *all;        /* fwd [P][slot]: every rank's state; bwd: dQ packed, when dq is strided */
  attn_stats stats;  /* summed over the block calls */
  ring_clock clock;  /* marks: 0 compute begins, 1 queued, 2 exchanged, 3 done */
} split_run;

static void split_free(split_run *run) {
  attn_ctx_t ctx = run->pl.ctx;
  if (ctx) {
    attn__ring_free(ctx, run->mine);
    attn__ring_free(ctx, run->all);
    attn__ring_clock_free(&run->pl, &run->clock);
  }
  attn__ring_plan_free(&run->pl);
}

/* Buffers of mine_n and all_n floats (all_n may be 0), the clock and the step record. */
static attn_status split_alloc(split_run *run, attn_group_t grp, int64_t mine_n, int64_t all_n) {
  ring_plan *pl = &run->pl;
  void *a = NULL, *b = NULL;
  attn_status st = attn__ring_alloc(pl->ctx, mine_n * 4, &a);
  run->mine = a;
  if (st == ATTN_OK && all_n) st = attn__ring_alloc(pl->ctx, all_n * 4, &b);
  run->all = b;
  if (st == ATTN_OK) st = attn__ring_clock_init(pl, &run->clock, 4);
  if (st == ATTN_OK) st = attn__group_steps_reset(grp, 1);
  if (st != ATTN_OK)
    return attn__fail(st, "split-kv: buffers (%lld + %lld floats): %s", (long long)mine_n,
                      (long long)all_n, attn_last_error());
  return ATTN_OK;
}

/* The end of a call: the step's times, the verdict of every rank, one log line. */
static attn_status split_end(split_run *run, attn_group_t grp, attn_status work,
                             const char *what) {
  run->pl.ctx->stats = run->stats;
  if (work == ATTN_OK) work = attn__ring_times(&run->pl, &run->clock, grp, 1);
  attn_status st = attn__ring_finish(&run->pl, work, NULL, 0);
  if (st == ATTN_OK) attn__ring_log(grp, what);
  return st;
}

/* Fold the own shard, gather the states, merge them in rank order. A communication
 * failure returns at once; a compute failure goes to *work while the gather goes on, so
 * that peers never wait for this rank. */
static attn_status fwd_steps(split_run *run, attn_group_t grp, const attn_tensor *q,
                             const attn_tensor *k, const attn_tensor *v, attn_tensor *o,
                             float *lse, attn_status *work) {
  const ring_plan *pl = &run->pl;
  const int64_t slot = slot_floats(pl);
  attn_state mine = state_at(pl, run->mine);
  ring_kv kv;
  attn__ring_kv_local(pl, k, v, &kv);
  int computed = 0;
  attn__fault_point("ring", 0);
  attn__ring_mark(pl, &run->clock, 0, work);
  if (*work == ATTN_OK) *work = attn_state_init(pl->ctx, &mine);
  if (*work == ATTN_OK) *work = attn__ring_fold(pl, &mine, &run->stats, q, &kv, pl->r, &computed);
  attn__ring_mark(pl, &run->clock, 1, work);
  ATTN_CHECK(pl->data->ops->allgather(pl->data, run->mine, run->all, slot * 4));
  attn__ring_mark(pl, &run->clock, 2, work);
  attn_state acc = state_at(pl, run->all);
  for (int y = 1; y < pl->P && *work == ATTN_OK; y++) {
    attn_state from = state_at(pl, run->all + (int64_t)y * slot);
    *work = attn_state_merge(pl->ctx, &acc, &from);
  }
  if (*work == ATTN_OK) *work = attn_state_finalize(pl->ctx, pl->spec, &acc, o, lse);
  attn__ring_mark(pl, &run->clock, 3, work);
  grp->steps[0] = (attn_ring_step){0, 0, (pl->P - 1) * slot * 4, computed};
  grp->nsteps = 1;
  return ATTN_OK;
}

attn_status attn_split_kv_fwd(attn_group_t grp, const attn_spec *spec, attn_cp_layout layout,
                              int64_t seq_q, int64_t seq_kv, const attn_tensor *q,
                              const attn_tensor *k, const attn_tensor *v, attn_tensor *o,
                              float *lse) {
  if (!grp) return attn__fail(ATTN_ERR_INVALID_ARG, "grp is NULL");
  split_run run;
  memset(&run, 0, sizeof run);
  attn__view ov;
  attn_status st = attn__ring_plan_init(&run.pl, grp, spec, layout, seq_q, seq_kv, q, k, v, 1);
  const ring_plan *pl = &run.pl;
  if (st == ATTN_OK)
    st = attn__check_out(pl->ctx, "o", o, ATTN__DT_ANY, pl->B, seq_q, pl->Hq, pl->Dv, &ov);
  if (st == ATTN_OK)
    st = split_alloc(&run, grp, slot_floats(pl), slot_floats(pl) * pl->P);
  st = attn__ring_agree(grp, SPLIT_KV_FWD, spec, layout, seq_q, seq_kv, q, st);
  if (st != ATTN_OK) {
    split_free(&run);
    return st;
  }
  attn_status work = ATTN_OK;
  run.pl.ctx->spec_host = &run.pl.spec_host;
  st = fwd_steps(&run, grp, q, k, v, o, lse, &work);
  run.pl.ctx->spec_host = NULL;
  if (st == ATTN_OK) st = split_end(&run, grp, work, "split-kv fwd");
  split_free(&run);
  return st;
}

/* The natural [B, S, H, D] strides. */
static int contiguous(const attn_tensor *t) {
  const int64_t *n = t->shape, *s = t->stride;
  return s[3] == 1 && s[2] == n[3] && s[1] == n[2] * n[3] && s[0] == n[1] * n[2] * n[3];
}

/* Views of dq as the caller laid it out and packed in run->all. */
static void dq_views(const split_run *run, const attn_tensor *dq, attn__view *user,
                     attn__view *packed) {
  const int64_t *n = dq->shape;
  *user = attn__view_of(dq->data, dq->stride[0], dq->stride[1], dq->stride[2]);
  *packed = attn__view_of(run->all, n[1] * n[2] * n[3], n[2] * n[3], n[3]);
}

/* Zero, prepare (delta, dsinks), the own shard's gradients, then the sum of dQ; failures
 * as in fwd_steps. */
static attn_status bwd_steps(split_run *run, attn_group_t grp, const ring_bwd_io *io,
                             const attn_tensor *o, const attn_tensor *k, const attn_tensor *v,
                             attn_tensor *dk, attn_tensor *dv, float *ds, attn_status *work) {
  const ring_plan *pl = &run->pl;
  ring_kv kv, home;
  attn__ring_kv_local(pl, k, v, &kv);
  attn__ring_kv_local(pl, dk, dv, &home);
  int computed = 0;
  attn__fault_point("ring", 0);
  attn__ring_mark(pl, &run->clock, 0, work);
  *work = attn__ring_bwd_begin(pl, o, io, run->mine, dk, dv, ds);
  if (*work == ATTN_OK)
    *work = attn__ring_grad(pl, &run->stats, io, &kv, &home, pl->r, &computed);
  /* dQ summed over the group: in place when dq is contiguous, else packed in run->all. */
  const int64_t *n = io->dq->shape, count = n[0] * n[1] * n[2] * n[3];
  attn__view user, packed;
  dq_views(run, io->dq, &user, &packed);
  float *buf = run->all ? run->all : io->dq->data;
  if (run->all && *work == ATTN_OK)
    *work = pl->ctx->ops->rows(pl->ctx, ATTN__ROWS_COPY, packed, ATTN_F32, user, ATTN_F32, n[0],
                               n[1], n[2], n[3]);
  attn__ring_mark(pl, &run->clock, 1, work);
  ATTN_CHECK(pl->data->ops->allreduce_sum(pl->data, buf, count, ATTN_COMM_F32));
  attn__ring_mark(pl, &run->clock, 2, work);
  if (run->all && *work == ATTN_OK)
    *work = pl->ctx->ops->rows(pl->ctx, ATTN__ROWS_COPY, user, ATTN_F32, packed, ATTN_F32, n[0],
                               n[1], n[2], n[3]);
  attn__ring_mark(pl, &run->clock, 3, work);
  /* A bandwidth-optimal allreduce sends 2 (P-1)/P of the buffer. */
  grp->steps[0] = (attn_ring_step){0, 0, 2 * (pl->P - 1) * count * 4 / pl->P, computed};
  grp->nsteps = 1;
  return ATTN_OK;
}

attn_status attn_split_kv_bwd(attn_group_t grp, const attn_spec *spec, attn_cp_layout layout,
                              int64_t seq_q, int64_t seq_kv, const attn_tensor *q,
                              const attn_tensor *k, const attn_tensor *v, const attn_tensor *o,
                              const float *lse, const attn_tensor *dout, attn_tensor *dq,
                              attn_tensor *dk, attn_tensor *dv, float *dsinks) {
  if (!grp) return attn__fail(ATTN_ERR_INVALID_ARG, "grp is NULL");
  split_run run;
  memset(&run, 0, sizeof run);
  attn_status st = attn__ring_plan_init(&run.pl, grp, spec, layout, seq_q, seq_kv, q, k, v, 1);
  const ring_plan *pl = &run.pl;
  if (st == ATTN_OK) st = attn__ring_check_bwd(pl, o, lse, dout, dq, dk, dv, dsinks);
  if (st == ATTN_OK) {
    const int64_t nq = pl->B * seq_q * pl->Hq * pl->Dqk;
    st = split_alloc(&run, grp, pl->B * pl->Hq * seq_q, contiguous(dq) ? 0 : nq);
  }
  st = attn__ring_agree(grp, SPLIT_KV_BWD, spec, layout, seq_q, seq_kv, q, st);
  if (st != ATTN_OK) {
    split_free(&run);
    return st;
  }
  attn_spec s;
  attn__copy_spec(spec, &s);
  attn_status work = ATTN_OK;
  ring_bwd_io io = {q, dout, lse, run.mine, dq};
  run.pl.ctx->spec_host = &run.pl.spec_host;
  st = bwd_steps(&run, grp, &io, o, k, v, dk, dv, s.sinks ? dsinks : NULL, &work);
  run.pl.ctx->spec_host = NULL;
  if (st == ATTN_OK) st = split_end(&run, grp, work, "split-kv bwd");
  split_free(&run);
  return st;
}
