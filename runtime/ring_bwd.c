/* ring_bwd.c — ring attention backward (context parallel): dQ accumulates at home while
 * K, V and float32 dK/dV accumulators travel the CP ring; one extra hop brings each
 * block's accumulators back to its owner. Words and helpers: ring.h, ring_plan.c.
 *
 * Schedule of rank r at step s = 0..P-1 (block y = r - s in hand, step 0 = its own):
 *   1. post one exchange with r+1 / r-1 carrying two parts:
 *        K/V of block y, the rows later ranks on y's path need (as in the forward), and
 *        dK/dV of block y+1 — the block of the previous step — over the rows that ranks
 *        y+2..r touched (need_hull(y+1, 1, s-1)); r-1 sends the same for block y;
 *   2. compute block y's contribution: dQ into the caller's dq; dK/dV into the caller's
 *      dk/dv at step 0, else into a zeroed accumulator over need_hull(y, 1, s);
 *   3. wait; add the partial dK/dV that arrived (ranks y+1..r-1) into the accumulator.
 * After step P-1 the accumulator of block r+1 goes to r+1 (the extra hop), which adds it
 * to its own dk/dv. The accumulator of a step thus travels one step behind its K/V, so
 * every exchange overlaps a computation except the last hop; its times and bytes are
 * recorded in the last step. Rows nobody needs (window) never travel, as in the forward. */
#include "ring.h"
#include "validate.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  ring_plan pl;
  float *delta;                 /* [B, Hq, Sq_loc] rowsum(dO * O), context memory */
  void *sbuf, *cur, *rbuf;      /* messages: [K/V part (input dtype) | dK/dV part (float32)] */
  void *acc;                    /* packed float32 dK/dV of the block being computed */
  ring_rows *kv_out, *kv_in;    /* [P] K/V rows sent / received at step s */
  ring_rows *g_out, *g_in;      /* [P+1] dK/dV rows sent / received; s = P: the hop home */
  ring_rows *g_acc;             /* [P] accumulator rows of the block computed at step s */
  attn_stats stats;
  ring_clock clock;             /* 3 marks per step and the hop home, one at the end */
} bwd_run;

static void bwd_free(bwd_run *run) {
  attn_ctx_t ctx = run->pl.ctx;
  if (ctx) {
    attn__ring_free(ctx, run->delta);
    attn__ring_free(ctx, run->sbuf);
    attn__ring_free(ctx, run->cur);
    attn__ring_free(ctx, run->rbuf);
    attn__ring_free(ctx, run->acc);
  }
  free(run->kv_out);
  free(run->kv_in);
  free(run->g_out);
  free(run->g_in);
  free(run->g_acc);
  if (ctx) attn__ring_clock_free(&run->pl, &run->clock);
  attn__ring_plan_free(&run->pl);
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Bytes of the two parts of the message of step s, sent (out) or received (in). */
static int64_t kv_part(const bwd_run *run, int s, int out) {
  if (s + 1 >= run->pl.P) return 0;
  return attn__ring_kv_bytes(&run->pl, out ? &run->kv_out[s] : &run->kv_in[s], run->pl.dt);
}
static int64_t g_part(const bwd_run *run, int s, int out) {
  return attn__ring_kv_bytes(&run->pl, out ? &run->g_out[s] : &run->g_in[s], ATTN_F32);
}

static attn_status bwd_alloc(bwd_run *run) {
  const ring_plan *pl = &run->pl;
  const int P = pl->P, r = pl->r;
  run->kv_out = calloc((size_t)P, sizeof(ring_rows));
  run->kv_in = calloc((size_t)P, sizeof(ring_rows));
  run->g_out = calloc((size_t)P + 1, sizeof(ring_rows));
  run->g_in = calloc((size_t)P + 1, sizeof(ring_rows));
  run->g_acc = calloc((size_t)P, sizeof(ring_rows));
  if (!run->kv_out || !run->kv_in || !run->g_out || !run->g_in || !run->g_acc)
    return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "ring: schedule (%d steps) allocation failed", P);
  for (int s = 0; s <= P; s++) {
    if (s + 1 < P) {
      attn__ring_need_hull(pl, ring_mod(r - s, P), s + 1, P - 1, &run->kv_out[s]);
      attn__ring_need_hull(pl, ring_mod(r - 1 - s, P), s + 1, P - 1, &run->kv_in[s]);
    }
    attn__ring_need_hull(pl, ring_mod(r - s + 1, P), 1, s - 1, &run->g_out[s]);
    attn__ring_need_hull(pl, ring_mod(r - s, P), 1, s - 1, &run->g_in[s]);
    if (s < P) attn__ring_need_hull(pl, ring_mod(r - s, P), 1, s, &run->g_acc[s]);
  }
  int64_t smax = 0, rmax = 0, amax = 0;
  for (int s = 0; s <= P; s++) {
    smax = max64(smax, kv_part(run, s, 1) + g_part(run, s, 1));
    rmax = max64(rmax, kv_part(run, s, 0) + g_part(run, s, 0));
    if (s < P) amax = max64(amax, attn__ring_kv_bytes(pl, &run->g_acc[s], ATTN_F32));
  }
  const int64_t n = pl->B * pl->Hq * pl->qsh[r].rows;
  void *delta = NULL;
  attn_status st = attn__ring_alloc(pl->ctx, n * 4, &delta);
  run->delta = delta;
  if (st == ATTN_OK) st = attn__ring_alloc(pl->ctx, smax, &run->sbuf);
  if (st == ATTN_OK) st = attn__ring_alloc(pl->ctx, rmax, &run->cur);
  if (st == ATTN_OK) st = attn__ring_alloc(pl->ctx, rmax, &run->rbuf);
  if (st == ATTN_OK) st = attn__ring_alloc(pl->ctx, amax, &run->acc);
  if (st == ATTN_OK) st = attn__ring_clock_init(pl, &run->clock, 3 * (P + 1) + 1);
  if (st != ATTN_OK)
    return attn__fail(st, "ring: backward buffers (%lld + 2 x %lld + %lld bytes): %s",
                      (long long)smax, (long long)rmax, (long long)amax, attn_last_error());
  return ATTN_OK;
}

static int inside(ring_span a, ring_span outer) { return a.lo >= outer.lo && a.hi <= outer.hi; }

attn_status attn__ring_grad(const ring_plan *pl, attn_stats *sum, const ring_bwd_io *io,
                            const ring_kv *kv, const ring_kv *g, int y, int *computed) {
  const attn_cp_shard *qs = &pl->qsh[pl->r], *ks = &pl->ksh[y];
  for (int i = 0; i < qs->count; i++) {
    ring_span qsp = {qs->start[i], qs->start[i] + qs->len[i]};
    for (int j = 0; j < ks->count; j++) {
      ring_span ksp = {ks->start[j], ks->start[j] + ks->len[j]};
      ring_span vis = attn__ring_visible(pl, qsp, ksp);
      ring_span qv = attn__ring_visible_q(pl, qsp, vis); /* the queries that see vis */
      if (!ring_span_len(vis) || !ring_span_len(qv)) continue;
      if (!inside(vis, kv->rows.run[j]) || !inside(vis, g->rows.run[j]))
        return attn__fail(ATTN_ERR_INTERNAL,
                          "ring bwd: block %d rows [%lld, %lld) are needed but K/V rows "
                          "[%lld, %lld) and dK/dV rows [%lld, %lld) are at hand (schedule bug)",
                          y, (long long)vis.lo, (long long)vis.hi,
                          (long long)kv->rows.run[j].lo, (long long)kv->rows.run[j].hi,
                          (long long)g->rows.run[j].lo, (long long)g->rows.run[j].hi);
      attn_tensor kt = attn__ring_kv_tensor(pl, kv, 0, j, vis);
      attn_tensor vt = attn__ring_kv_tensor(pl, kv, 1, j, vis);
      attn_tensor dkt = attn__ring_kv_tensor(pl, g, 0, j, vis);
      attn_tensor dvt = attn__ring_kv_tensor(pl, g, 1, j, vis);
      const int64_t row0 = ring_run_off(qs, i) + (qv.lo - qsp.lo), nq = ring_span_len(qv);
      attn_tensor qt = attn__ring_rows_of(io->q, row0, nq);
      attn_tensor dot = attn__ring_rows_of(io->dout, row0, nq);
      attn_tensor dqt = attn__ring_rows_of(io->dq, row0, nq);
      attn_block_pos pos = {row0, qv.lo, vis.lo, pl->seq_q, pl->seq_kv};
      ATTN_CHECK(attn_bwd_block(pl->ctx, pl->spec, &qt, &kt, &vt, &dot, io->lse, io->delta,
                                qs->rows, &dqt, &dkt, &dvt, &pos));
      ATTN_CHECK(attn__ring_add_stats(sum, pl->ctx, computed));
    }
  }
  return ATTN_OK;
}

/* One exchange: the K/V part from kv (rows kv_rows) and the dK/dV part copied from the
 * accumulator (g_rows, already packed), to r+1; the message of r-1 into rbuf. */
static attn_status post(bwd_run *run, const ring_kv *kv, const ring_rows *kv_rows, int64_t skv,
                        int64_t sg, int64_t rbytes, attn__comm_req **req) {
  const ring_plan *pl = &run->pl;
  *req = NULL;
  if (!skv && !sg && !rbytes) return ATTN_OK;
  if (skv) ATTN_CHECK(attn__ring_kv_pack(pl, kv, kv_rows, run->sbuf));
  if (sg)
    ATTN_CHECK(pl->ctx->ops->mem_copy(pl->ctx, (char *)run->sbuf + skv, run->acc, (size_t)sg,
                                      ATTN_COPY_CTX_TO_CTX));
  const int64_t sb = skv + sg;
  return pl->data->ops->exchange_start(pl->data, run->sbuf, sb, sb ? ring_mod(pl->r + 1, pl->P) : -1,
                                       run->rbuf, rbytes, rbytes ? ring_mod(pl->r - 1, pl->P) : -1,
                                       req);
}

/* The P steps and the hop home. A communication failure returns at once (the
 * communicator is dead then); a compute failure goes to *work while the exchanges go on.
 * As in the forward, nothing waits for the device: the transport orders the exchanges
 * with the context's stream. */
static attn_status bwd_steps(bwd_run *run, attn_group_t grp, const ring_bwd_io *io,
                             const attn_tensor *k, const attn_tensor *v, attn_tensor *dk,
                             attn_tensor *dv, attn_status *work) {
  const ring_plan *pl = &run->pl;
  const int P = pl->P, r = pl->r;
  attn__comm *c = pl->data;
  ring_kv cur, home, acc, part;
  memset(&acc, 0, sizeof acc);
  attn__ring_kv_local(pl, k, v, &cur);
  attn__ring_kv_local(pl, dk, dv, &home);
  attn__comm_req *req;
  for (int s = 0; s < P; s++) {
    attn__fault_point("ring", s);
    const int64_t skv = kv_part(run, s, 1), sg = g_part(run, s, 1);
    const int64_t rkv = kv_part(run, s, 0), rg = g_part(run, s, 0);
    attn__ring_mark(pl, &run->clock, 3 * s, work);
    ATTN_CHECK(post(run, &cur, &run->kv_out[s], skv, sg, rkv + rg, &req));
    int computed = 0;
    if (s > 0) {
      attn__ring_kv_packed(pl, run->acc, ATTN_F32, &run->g_acc[s], &acc);
      if (*work == ATTN_OK) *work = attn__ring_kv_zero(pl, &acc);
    }
    if (*work == ATTN_OK)
      *work = attn__ring_grad(pl, &run->stats, io, &cur, s ? &acc : &home, ring_mod(r - s, P),
                              &computed);
    attn__ring_mark(pl, &run->clock, 3 * s + 1, work);
    if (req) ATTN_CHECK(c->ops->exchange_wait(c, req));
    attn__ring_mark(pl, &run->clock, 3 * s + 2, work);
    if (rg && *work == ATTN_OK) {
      attn__ring_kv_packed(pl, (char *)run->rbuf + rkv, ATTN_F32, &run->g_in[s], &part);
      *work = attn__ring_kv_add(pl, &acc, &part);
    }
    grp->steps[s] = (attn_ring_step){0, 0, skv + sg, computed}; /* times: attn__ring_times */
    void *x = run->cur;
    run->cur = run->rbuf;
    run->rbuf = x;
    if (s + 1 < P) attn__ring_kv_packed(pl, rkv ? run->cur : NULL, pl->dt, &run->kv_in[s], &cur);
    grp->nsteps = s + 1;
  }
  /* The hop home: block r+1's accumulator to its owner, ours from r-1. */
  const int64_t sg = g_part(run, P, 1), rg = g_part(run, P, 0);
  attn__ring_mark(pl, &run->clock, 3 * P, work);
  ATTN_CHECK(post(run, NULL, NULL, 0, sg, rg, &req));
  attn__ring_mark(pl, &run->clock, 3 * P + 1, work);
  if (req) ATTN_CHECK(c->ops->exchange_wait(c, req));
  attn__ring_mark(pl, &run->clock, 3 * P + 2, work);
  if (rg && *work == ATTN_OK) {
    attn__ring_kv_packed(pl, run->rbuf, ATTN_F32, &run->g_in[P], &part);
    *work = attn__ring_kv_add(pl, &home, &part);
  }
  attn__ring_mark(pl, &run->clock, 3 * P + 3, work);
  grp->steps[P - 1].bytes += sg; /* the hop's times go to the last step too */
  return ATTN_OK;
}

attn_status attn__ring_bwd_begin(const ring_plan *pl, const attn_tensor *o, const ring_bwd_io *io,
                                 float *delta, attn_tensor *dk, attn_tensor *dv, float *ds) {
  if (ds) {
    attn_tensor dst = attn_tensor_contig(ds, ATTN_F32, pl->ctx->ops->device, 1, 1, 1, pl->Hq);
    ATTN_CHECK(attn__ring_zero_tensor(pl->ctx, &dst));
  }
  ATTN_CHECK(attn__ring_zero_tensor(pl->ctx, io->dq));
  ATTN_CHECK(attn__ring_zero_tensor(pl->ctx, dk));
  ATTN_CHECK(attn__ring_zero_tensor(pl->ctx, dv));
  return attn_bwd_prepare(pl->ctx, pl->spec, o, io->dout, io->lse, delta, ds);
}

attn_status attn__ring_check_bwd(const ring_plan *pl, const attn_tensor *o, const float *lse,
                                  const attn_tensor *dout, attn_tensor *dq, attn_tensor *dk,
                                  attn_tensor *dv, const float *dsinks) {
  attn__view x;
  const int64_t sq = pl->qsh[pl->r].rows, skv = pl->ksh[pl->r].rows;
  ATTN_CHECK(attn__check_tensor(pl->ctx, "o", o, ATTN__DT_ANY, (int64_t[4]){pl->B, sq, pl->Hq, pl->Dv}, 0, &x));
  ATTN_CHECK(attn__check_tensor(pl->ctx, "dout", dout, o->dtype, (int64_t[4]){pl->B, sq, pl->Hq, pl->Dv}, 0, &x));
  if (!lse) return attn__fail(ATTN_ERR_INVALID_ARG, "lse is NULL");
  ATTN_CHECK(attn__check_out(pl->ctx, "dq", dq, ATTN__DT_ACCUM, pl->B, sq, pl->Hq, pl->Dqk, &x));
  ATTN_CHECK(attn__check_out(pl->ctx, "dk", dk, ATTN__DT_ACCUM, pl->B, skv, pl->Hkv, pl->Dqk, &x));
  ATTN_CHECK(attn__check_out(pl->ctx, "dv", dv, ATTN__DT_ACCUM, pl->B, skv, pl->Hkv, pl->Dv, &x));
  attn_spec s;
  ATTN_CHECK(attn__copy_spec(pl->spec, &s));
  if (s.sinks && !dsinks)
    return attn__fail(ATTN_ERR_INVALID_ARG, "dsinks is NULL but spec->sinks is set");
  return ATTN_OK;
}

attn_status attn_ring_bwd(attn_group_t grp, const attn_spec *spec, attn_cp_layout layout,
                          int64_t seq_q, int64_t seq_kv, const attn_tensor *q,
                          const attn_tensor *k, const attn_tensor *v, const attn_tensor *o,
                          const float *lse, const attn_tensor *dout, attn_tensor *dq,
                          attn_tensor *dk, attn_tensor *dv, float *dsinks) {
  if (!grp) return attn__fail(ATTN_ERR_INVALID_ARG, "grp is NULL");
  bwd_run run;
  memset(&run, 0, sizeof run);
  attn_status st = attn__ring_plan_init(&run.pl, grp, spec, layout, seq_q, seq_kv, q, k, v, 0);
  if (st == ATTN_OK) st = attn__ring_check_bwd(&run.pl, o, lse, dout, dq, dk, dv, dsinks);
  if (st == ATTN_OK) st = bwd_alloc(&run);
  if (st == ATTN_OK) st = attn__group_steps_reset(grp, run.pl.P);
  st = attn__ring_agree(grp, RING_BWD, spec, layout, seq_q, seq_kv, q, st);
  if (st != ATTN_OK) {
    bwd_free(&run);
    return st;
  }
  const ring_plan *pl = &run.pl;
  attn_spec s;
  attn__copy_spec(spec, &s);
  float *ds = s.sinks ? dsinks : NULL;
  ring_bwd_io io = {q, dout, lse, run.delta, dq};
  attn_status work = attn__ring_bwd_begin(pl, o, &io, run.delta, dk, dv, ds);
  run.pl.ctx->spec_host = &run.pl.spec_host;
  st = bwd_steps(&run, grp, &io, k, v, dk, dv, &work);
  run.pl.ctx->spec_host = NULL;
  if (st == ATTN_OK) {
    pl->ctx->stats = run.stats;
    if (work == ATTN_OK) work = attn__ring_times(pl, &run.clock, grp, pl->P + 1);
    st = attn__ring_finish(pl, work, ds, ds ? pl->Hq : 0);
  }
  if (st == ATTN_OK) attn__ring_log(grp, "ring bwd");
  bwd_free(&run);
  return st;
}
