/* ring.c — ring attention forward (context parallel): K/V blocks travel the CP ring while
 * each rank folds the block in hand into its float32 (m, l, acc) state with the block API;
 * sinks enter once, at finalize. Words and the schedule's helpers: ring.h, ring_plan.c.
 *
 * Schedule of rank r at step s = 0..P-1 (block y = r - s in hand, step 0 = its own):
 *   1. post the exchange: send to r+1 the rows of y that ranks later on y's path still
 *      need (need_hull(y, s+1, P-1)); receive from r-1 the rows of block r-1-s that this
 *      rank and the ranks after it need (need_hull(r-1-s, s+1, P-1));
 *   2. fold block y into the state, one attn_fwd_block per (query run, key run) pair whose
 *      positions let some query see some key, over just those keys;
 *   3. wait, and the received rows become the block in hand.
 * Both ends of every message compute its rows from global positions, so an exchange with
 * nothing to carry is posted by neither side: with a window shorter than a chunk, blocks
 * that no query needs are not sent at all, and nobody waits for a message never sent. */
#include "ring.h"
#include "validate.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  ring_plan pl;
  attn_state st;            /* float32, context memory */
  void *sbuf, *cur, *rbuf;  /* packed K/V blocks in the input dtype: outgoing, in hand, incoming */
  ring_rows *out, *in;      /* [P]: rows sent / received at step s */
  attn_stats stats;         /* summed over the block calls */
  ring_clock clock;         /* 3 marks per step and one at the end (ring.h) */
} fwd_run;

static void fwd_free(fwd_run *run) {
  attn_ctx_t ctx = run->pl.ctx;
  if (ctx) {
    attn__ring_free(ctx, run->st.m);
    attn__ring_free(ctx, run->st.l);
    attn__ring_free(ctx, run->st.acc);
    attn__ring_free(ctx, run->sbuf);
    attn__ring_free(ctx, run->cur);
    attn__ring_free(ctx, run->rbuf);
  }
  free(run->out);
  free(run->in);
  if (ctx) attn__ring_clock_free(&run->pl, &run->clock);
  attn__ring_plan_free(&run->pl);
}

/* The schedule of this rank, the buffers sized for its largest message each way (shards of
 * uneven length differ by a row), and the state. */
static attn_status fwd_alloc(fwd_run *run) {
  ring_plan *pl = &run->pl;
  const int P = pl->P, r = pl->r;
  int64_t smax = 0, rmax = 0;
  run->out = calloc((size_t)P, sizeof *run->out);
  run->in = calloc((size_t)P, sizeof *run->in);
  if (!run->out || !run->in)
    return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "ring: schedule (%d steps) allocation failed", P);
  for (int s = 0; s + 1 < P; s++) {
    attn__ring_need_hull(pl, ring_mod(r - s, P), s + 1, P - 1, &run->out[s]);
    attn__ring_need_hull(pl, ring_mod(r - 1 - s, P), s + 1, P - 1, &run->in[s]);
    int64_t sb = attn__ring_kv_bytes(pl, &run->out[s], pl->dt);
    int64_t rb = attn__ring_kv_bytes(pl, &run->in[s], pl->dt);
    smax = sb > smax ? sb : smax;
    rmax = rb > rmax ? rb : rmax;
  }
  const int64_t rows = pl->qsh[r].rows, n = pl->B * pl->Hq * rows;
  run->st = (attn_state){NULL, NULL, NULL, pl->B, pl->Hq, rows, pl->Dv};
  void *m = NULL, *l = NULL, *acc = NULL;
  attn_status st = attn__ring_alloc(pl->ctx, n * 4, &m);
  if (st == ATTN_OK) st = attn__ring_alloc(pl->ctx, n * 4, &l);
  if (st == ATTN_OK) st = attn__ring_alloc(pl->ctx, n * pl->Dv * 4, &acc);
  run->st.m = m, run->st.l = l, run->st.acc = acc;
  if (st == ATTN_OK) st = attn__ring_alloc(pl->ctx, smax, &run->sbuf);
  if (st == ATTN_OK) st = attn__ring_alloc(pl->ctx, rmax, &run->cur);
  if (st == ATTN_OK) st = attn__ring_alloc(pl->ctx, rmax, &run->rbuf);
  if (st == ATTN_OK) st = attn__ring_clock_init(pl, &run->clock, 3 * P + 1);
  if (st != ATTN_OK)
    return attn__fail(st,
                      "ring: state (%lld rows) and K/V buffers (%lld + 2 x %lld bytes): %s",
                      (long long)n, (long long)smax, (long long)rmax, attn_last_error());
  return attn_state_init(pl->ctx, &run->st);
}

attn_status attn__ring_fold(const ring_plan *pl, attn_state *st, attn_stats *sum,
                            const attn_tensor *q, const ring_kv *kv, int y, int *computed) {
  const attn_cp_shard *qs = &pl->qsh[pl->r], *ks = &pl->ksh[y];
  for (int i = 0; i < qs->count; i++) {
    ring_span qsp = {qs->start[i], qs->start[i] + qs->len[i]};
    for (int j = 0; j < ks->count; j++) {
      ring_span ksp = {ks->start[j], ks->start[j] + ks->len[j]};
      ring_span vis = attn__ring_visible(pl, qsp, ksp);
      ring_span qv = attn__ring_visible_q(pl, qsp, vis); /* the queries that see vis */
      if (!ring_span_len(vis) || !ring_span_len(qv)) continue;
      if (vis.lo < kv->rows.run[j].lo || vis.hi > kv->rows.run[j].hi)
        return attn__fail(ATTN_ERR_INTERNAL,
                          "ring: block %d rows [%lld, %lld) are needed but rows [%lld, %lld) "
                          "arrived (schedule bug)",
                          y, (long long)vis.lo, (long long)vis.hi,
                          (long long)kv->rows.run[j].lo, (long long)kv->rows.run[j].hi);
      attn_tensor kt = attn__ring_kv_tensor(pl, kv, 0, j, vis);
      attn_tensor vt = attn__ring_kv_tensor(pl, kv, 1, j, vis);
      const int64_t row0 = ring_run_off(qs, i) + (qv.lo - qsp.lo);
      attn_tensor qt = attn__ring_rows_of(q, row0, ring_span_len(qv));
      attn_block_pos pos = {row0, qv.lo, vis.lo, pl->seq_q, pl->seq_kv};
      ATTN_CHECK(attn_fwd_block(pl->ctx, pl->spec, st, &qt, &kt, &vt, &pos));
      ATTN_CHECK(attn__ring_add_stats(sum, pl->ctx, computed));
    }
  }
  return ATTN_OK;
}

/* The P steps. Returns a communication failure at once (the communicator is dead then);
 * a local compute failure goes to *work while the exchanges go on, so that peers never
 * wait for this rank. Nothing here waits for the device: the transport orders the send
 * after the pack and the next step's kernels after the receive (events, on CUDA), so the
 * kernels of step s run while step s's block travels. */
static attn_status fwd_steps(fwd_run *run, attn_group_t grp, const attn_tensor *q,
                             const attn_tensor *k, const attn_tensor *v, attn_status *work) {
  const ring_plan *pl = &run->pl;
  const int P = pl->P, r = pl->r, to = ring_mod(r + 1, P), from = ring_mod(r - 1, P);
  attn__comm *c = pl->data;
  ring_kv cur;
  attn__ring_kv_local(pl, k, v, &cur);
  for (int s = 0; s < P; s++) {
    attn__fault_point("ring", s);
    const int64_t sb = s + 1 < P ? attn__ring_kv_bytes(pl, &run->out[s], pl->dt) : 0;
    const int64_t rb = s + 1 < P ? attn__ring_kv_bytes(pl, &run->in[s], pl->dt) : 0;
    attn__comm_req *req = NULL;
    attn__ring_mark(pl, &run->clock, 3 * s, work);
    if (sb || rb) {
      if (sb) ATTN_CHECK(attn__ring_kv_pack(pl, &cur, &run->out[s], run->sbuf));
      ATTN_CHECK(c->ops->exchange_start(c, run->sbuf, sb, sb ? to : -1, run->rbuf, rb,
                                        rb ? from : -1, &req));
    }
    int computed = 0;
    if (*work == ATTN_OK) *work = attn__ring_fold(pl, &run->st, &run->stats, q, &cur, ring_mod(r - s, P),
                                &computed);
    attn__ring_mark(pl, &run->clock, 3 * s + 1, work);
    if (req) ATTN_CHECK(c->ops->exchange_wait(c, req));
    attn__ring_mark(pl, &run->clock, 3 * s + 2, work);
    grp->steps[s] = (attn_ring_step){0, 0, sb, computed}; /* times: attn__ring_times */
    void *x = run->cur;
    run->cur = run->rbuf;
    run->rbuf = x;
    if (s + 1 < P) attn__ring_kv_packed(pl, rb ? run->cur : NULL, pl->dt, &run->in[s], &cur);
    grp->nsteps = s + 1;
  }
  attn__ring_mark(pl, &run->clock, 3 * P, work);
  return ATTN_OK;
}

attn_status attn_ring_fwd(attn_group_t grp, const attn_spec *spec, attn_cp_layout layout,
                          int64_t seq_q, int64_t seq_kv, const attn_tensor *q,
                          const attn_tensor *k, const attn_tensor *v, attn_tensor *o,
                          float *lse) {
  if (!grp) return attn__fail(ATTN_ERR_INVALID_ARG, "grp is NULL");
  fwd_run run;
  memset(&run, 0, sizeof run);
  attn__view ov;
  attn_status st = attn__ring_plan_init(&run.pl, grp, spec, layout, seq_q, seq_kv, q, k, v, 0);
  if (st == ATTN_OK)
    st = attn__check_out(run.pl.ctx, "o", o, ATTN__DT_ANY, run.pl.B, run.pl.qsh[run.pl.r].rows, run.pl.Hq, run.pl.Dv, &ov);
  if (st == ATTN_OK) st = fwd_alloc(&run);
  if (st == ATTN_OK) st = attn__group_steps_reset(grp, run.pl.P);
  st = attn__ring_agree(grp, RING_FWD, spec, layout, seq_q, seq_kv, q, st);
  if (st != ATTN_OK) {
    fwd_free(&run);
    return st;
  }
  attn_status work = ATTN_OK;
  run.pl.ctx->spec_host = &run.pl.spec_host;
  st = fwd_steps(&run, grp, q, k, v, &work);
  run.pl.ctx->spec_host = NULL;
  if (st == ATTN_OK) {
    if (work == ATTN_OK) work = attn_state_finalize(run.pl.ctx, spec, &run.st, o, lse);
    if (work == ATTN_OK) work = attn__ring_times(&run.pl, &run.clock, grp, run.pl.P);
    run.pl.ctx->stats = run.stats;
    st = attn__ring_finish(&run.pl, work, NULL, 0);
  }
  if (st == ATTN_OK) attn__ring_log(grp, "ring fwd");
  fwd_free(&run);
  return st;
}
