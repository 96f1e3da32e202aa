/* ring_plan.c — the groundwork of ring attention: argument checks, the pre-flight
 * agreement, the schedule (which rows of which K/V block each rank needs, from global
 * positions), and views / packing of K/V blocks. runtime/ring.c and ring_bwd.c drive it. */
#include "ring.h"
#include "validate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double attn__ring_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- step timing ----------------------------------------------------------------------- */
attn_status attn__ring_clock_init(const ring_plan *pl, ring_clock *ck, int n) {
  const attn__backend_ops *be = pl->ctx->ops;
  memset(ck, 0, sizeof *ck);
  ck->n = n;
  if (!be->event_create) {
    ck->t = calloc((size_t)n, sizeof *ck->t);
    return ck->t ? ATTN_OK : attn__fail(ATTN_ERR_OUT_OF_MEMORY, "ring: %d step marks", n);
  }
  ck->ev = calloc((size_t)n, sizeof *ck->ev);
  if (!ck->ev) return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "ring: %d step events", n);
  for (int i = 0; i < n; i++) ATTN_CHECK(be->event_create(pl->ctx, &ck->ev[i]));
  return ATTN_OK;
}

void attn__ring_clock_free(const ring_plan *pl, ring_clock *ck) {
  for (int i = 0; ck->ev && i < ck->n; i++) pl->ctx->ops->event_destroy(pl->ctx, ck->ev[i]);
  free(ck->ev);
  free(ck->t);
  memset(ck, 0, sizeof *ck);
}

void attn__ring_mark(const ring_plan *pl, ring_clock *ck, int i, attn_status *work) {
  if (i < 0 || i >= ck->n) return;
  if (ck->t) {
    ck->t[i] = attn__ring_now();
    return;
  }
  attn_status st = pl->ctx->ops->event_record(pl->ctx, ck->ev[i]);
  if (st != ATTN_OK && *work == ATTN_OK) *work = st;
}

/* Seconds from mark i to mark j (both recorded, the stream drained). */
static attn_status span(const ring_plan *pl, const ring_clock *ck, int i, int j, double *out) {
  if (ck->t) {
    *out = ck->t[j] - ck->t[i];
    return ATTN_OK;
  }
  return pl->ctx->ops->event_elapsed(pl->ctx, ck->ev[i], ck->ev[j], out);
}

attn_status attn__ring_times(const ring_plan *pl, const ring_clock *ck, attn_group_t grp,
                             int nphases) {
  if (ck->ev) ATTN_CHECK(pl->ctx->ops->sync(pl->ctx));
  for (int k = 0; k < nphases && 3 * k + 3 < ck->n && grp->nsteps > 0; k++) {
    double a = 0, w = 0, b = 0;
    ATTN_CHECK(span(pl, ck, 3 * k, 3 * k + 1, &a));
    ATTN_CHECK(span(pl, ck, 3 * k + 1, 3 * k + 2, &w));
    ATTN_CHECK(span(pl, ck, 3 * k + 2, 3 * k + 3, &b));
    attn_ring_step *st = &grp->steps[k < grp->nsteps ? k : grp->nsteps - 1];
    st->compute_s += a + b;
    st->wait_s += w;
  }
  return ATTN_OK;
}

/* ---- checks -------------------------------------------------------------------------- */

static const char *layout_name(attn_cp_layout layout) {
  return layout == ATTN_LAYOUT_CONTIGUOUS ? "contiguous" : "zigzag";
}

/* Shards of every rank for one global length; each must hold at least one row. */
static attn_status make_shards(const char *what, attn_cp_layout layout, int P, int64_t seq,
                               attn_cp_shard **out) {
  attn_cp_shard *sh = calloc((size_t)P, sizeof *sh);
  if (!sh) return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "ring: shard table (%d) allocation failed", P);
  *out = sh;
  for (int y = 0; y < P; y++) {
    ATTN_CHECK(attn_cp_shard_rows(layout, P, y, seq, &sh[y]));
    if (sh[y].rows < 1)
      return attn__fail(ATTN_ERR_INVALID_ARG,
                        "%s=%lld is too short for cp=%d with the %s layout: cp rank %d would "
                        "hold no rows (every rank needs one; %d rows always suffice)",
                        what, (long long)seq, P, layout_name(layout), y,
                        layout == ATTN_LAYOUT_ZIGZAG ? 2 * P : P);
    if (sh[y].count < 2) sh[y].start[1] = sh[y].len[1] = 0;
  }
  return ATTN_OK;
}

/* Split-KV: every rank's query shard is all seq rows. */
static attn_status whole_shards(int P, int64_t seq, attn_cp_shard **out) {
  attn_cp_shard *sh = calloc((size_t)P, sizeof *sh);
  if (!sh) return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "split-kv: shard table (%d) allocation failed", P);
  *out = sh;
  for (int y = 0; y < P; y++) sh[y] = (attn_cp_shard){1, {0, 0}, {seq, 0}, seq};
  return ATTN_OK;
}

/* The schedule reads cu_seqlens on the host: on a device context, host copies, checked
 * as validate.c checks host ones (the kernels bound their own indices). */
static attn_status host_cu_seqlens(ring_plan *pl) {
  const size_t n = (size_t)pl->nseq + 1;
  pl->cu_host = malloc(2 * n * sizeof(int32_t));
  if (!pl->cu_host) return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "ring: cu_seqlens host copy");
  ATTN_CHECK(pl->ctx->ops->mem_copy(pl->ctx, pl->cu_host, pl->cq, n * 4, ATTN_COPY_CTX_TO_HOST));
  ATTN_CHECK(pl->ctx->ops->mem_copy(pl->ctx, pl->cu_host + n, pl->ck, n * 4, ATTN_COPY_CTX_TO_HOST));
  pl->cq = pl->cu_host;
  pl->ck = pl->cu_host + n;
  int ok = pl->cq[0] == 0 && pl->ck[0] == 0 && pl->cq[pl->nseq] == pl->seq_q &&
           pl->ck[pl->nseq] == pl->seq_kv;
  for (int32_t i = 0; ok && i < pl->nseq; i++)
    ok = pl->cq[i + 1] >= pl->cq[i] && pl->ck[i + 1] >= pl->ck[i];
  if (!ok)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "cu_seqlens_q/kv (device) must start at 0, be non-decreasing and end at "
                      "seq_q=%lld / seq_kv=%lld (they end at %d / %d)",
                      (long long)pl->seq_q, (long long)pl->seq_kv, pl->cq[pl->nseq],
                      pl->ck[pl->nseq]);
  return ATTN_OK;
}

/* On a device context: the host copies the steps hand to the context (ctx->spec_host), so
 * that the backend counts each block call's tiles without reading device memory; the
 * block mask is copied here, once per ring call. */
static attn_status host_spec_arrays(ring_plan *pl, const attn__problem *pb) {
  attn__spec_host *h = &pl->spec_host;
  if (pl->nseq) {
    h->cu_q_dev = pb->cu_q, h->cu_kv_dev = pb->cu_kv;
    h->cu_q = pl->cq, h->cu_kv = pl->ck;
  }
  const attn_block_mask *bm = pb->block_mask;
  if (!bm) return ATTN_OK;
  const size_t n = (size_t)(bm->num_q_blocks * bm->num_k_blocks);
  pl->mask_host = malloc(n ? n : 1);
  if (!pl->mask_host)
    return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "ring: block mask host copy (%zu bytes)", n);
  ATTN_CHECK(pl->ctx->ops->mem_copy(pl->ctx, pl->mask_host, bm->mask, n, ATTN_COPY_CTX_TO_HOST));
  h->mask_dev = bm->mask, h->mask = pl->mask_host;
  return ATTN_OK;
}

attn_status attn__ring_plan_init(ring_plan *pl, attn_group_t grp, const attn_spec *spec,
                                 attn_cp_layout layout, int64_t seq_q, int64_t seq_kv,
                                 const attn_tensor *q, const attn_tensor *k,
                                 const attn_tensor *v, int all_q) {
  memset(pl, 0, sizeof *pl);
  pl->ctx = grp->ctx;
  pl->comm = grp->cp;
  pl->data = attn__group_cp_data(grp);
  pl->spec = spec;
  pl->P = grp->cp->size;
  pl->r = grp->cp->rank;
  pl->seq_q = seq_q;
  pl->seq_kv = seq_kv;
  if (layout != ATTN_LAYOUT_CONTIGUOUS && layout != ATTN_LAYOUT_ZIGZAG)
    return attn__fail(ATTN_ERR_INVALID_ARG, "layout=%d is not a layout (0 contiguous, 1 zigzag)",
                      (int)layout);
  if (seq_q < 1 || seq_kv < 1)
    return attn__fail(ATTN_ERR_INVALID_ARG, "seq_q=%lld and seq_kv=%lld must be positive",
                      (long long)seq_q, (long long)seq_kv);
  if (!q || !k || !v)
    return attn__fail(ATTN_ERR_INVALID_ARG, "%s is NULL", !q ? "q" : !k ? "k" : "v");
  if (all_q)
    ATTN_CHECK(whole_shards(pl->P, seq_q, &pl->qsh));
  else
    ATTN_CHECK(make_shards("seq_q", layout, pl->P, seq_q, &pl->qsh));
  ATTN_CHECK(make_shards("seq_kv", layout, pl->P, seq_kv, &pl->ksh));
  const attn_cp_shard *qs = &pl->qsh[pl->r], *ks = &pl->ksh[pl->r];
  if (q->shape[1] != qs->rows || k->shape[1] != ks->rows)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "cp rank %d holds %lld query and %lld key rows, but the %s layout of "
                      "seq_q=%lld, seq_kv=%lld over cp=%d gives it %lld and %lld "
                      "(see attn_cp_shard_rows%s)",
                      pl->r, (long long)q->shape[1], (long long)k->shape[1], layout_name(layout),
                      (long long)seq_q, (long long)seq_kv, pl->P, (long long)qs->rows,
                      (long long)ks->rows,
                      all_q ? "; split-KV: every rank holds all query rows" : "");
  /* Spec, dtypes, strides and varlen check as one rank would check the global problem. */
  attn__problem pb;
  attn_block_pos pos = {0, 0, 0, seq_q, seq_kv};
  ATTN_CHECK(attn__no_kv_cache(spec, all_q ? "split-KV" : "the ring"));
  ATTN_CHECK(attn__make_problem(pl->ctx, spec, q, k, v, &pos, &pb));
  pl->B = pb.B;
  pl->Hq = pb.Hq;
  pl->Hkv = pb.Hkv;
  pl->Dqk = pb.Dqk;
  pl->Dv = pb.Dv;
  pl->causal = pb.causal;
  pl->wl = pb.window_left;
  pl->wr = pb.window_right;
  pl->dt = pb.dtype;
  pl->nseq = pb.num_seqs;
  pl->cq = pb.cu_q;
  pl->ck = pb.cu_kv;
  if (pl->ctx->ops->device == ATTN_DEVICE_HOST) return ATTN_OK;
  if (pl->nseq) ATTN_CHECK(host_cu_seqlens(pl));
  return host_spec_arrays(pl, &pb);
}

void attn__ring_plan_free(ring_plan *pl) {
  free(pl->qsh);
  free(pl->ksh);
  free(pl->cu_host);
  free(pl->mask_host);
  pl->qsh = pl->ksh = NULL;
  pl->cu_host = NULL;
  pl->mask_host = NULL;
}

/* ---- agreement ------------------------------------------------------------------------- */

static int64_t hash_host(const void *p, size_t n, int64_t h) {
  const unsigned char *c = p;
  uint64_t x = (uint64_t)h ^ 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) x = (x ^ c[i]) * 0x100000001b3ull;
  return (int64_t)(x >> 1);
}

/* The hash of n bytes of the context's memory (spec arrays live there); -1 when they
 * cannot be read, which then differs from every rank that could. */
static int64_t hash_bytes(attn_ctx_t ctx, const void *p, size_t n, int64_t h) {
  if (ctx->ops->device == ATTN_DEVICE_HOST) return hash_host(p, n, h);
  void *c = malloc(n ? n : 1);
  int64_t out = -1;
  if (c && ctx->ops->mem_copy(ctx, c, p, n, ATTN_COPY_CTX_TO_HOST) == ATTN_OK)
    out = hash_host(c, n, h);
  free(c);
  return out;
}

static int64_t float_bits(float f) {
  int32_t i;
  memcpy(&i, &f, sizeof i);
  return i;
}

/* What every rank of the CP group must agree on: shapes, flags, the contents of the
 * arrays that steer the schedule (cu_seqlens, block mask) and of sinks / ALiBi. */
static void fingerprint(attn_ctx_t ctx, attn__fingerprint *fp, ring_op op, const attn_spec *spec,
                        attn_cp_layout layout, int64_t seq_q, int64_t seq_kv,
                        const attn_tensor *q, int local_ok) {
  attn_spec s;
  memset(&s, 0, sizeof s);
  int spec_ok = spec && attn__copy_spec(spec, &s) == ATTN_OK;
  if (!spec_ok) memset(&s, 0, sizeof s);
  int64_t hq = s.num_heads_q > 0 && s.num_heads_q <= (1 << 20) ? s.num_heads_q : 0;
  fp->count = 0;
  attn__fp_add(fp, "library_version", attn_version());
  attn__fp_add(fp, "operation(0=ring_fwd,1=ring_bwd,2=split_kv_fwd,3=split_kv_bwd)", op);
  attn__fp_add(fp, "batch", q ? q->shape[0] : -1);
  attn__fp_add(fp, "num_heads_q", s.num_heads_q);
  attn__fp_add(fp, "num_heads_kv", s.num_heads_kv);
  attn__fp_add(fp, "head_dim_qk", s.head_dim_qk);
  attn__fp_add(fp, "head_dim_v", s.head_dim_v ? s.head_dim_v : s.head_dim_qk);
  attn__fp_add(fp, "seq_q", seq_q);
  attn__fp_add(fp, "seq_kv", seq_kv);
  attn__fp_add(fp, "layout", layout);
  attn__fp_add(fp, "causal", s.causal != 0);
  attn__fp_add(fp, "window_left", s.window_left);
  attn__fp_add(fp, "window_right", s.window_right);
  attn__fp_add(fp, "scale", float_bits(s.scale > 0 || s.head_dim_qk <= 0
                                           ? s.scale
                                           : 1.0f / sqrtf((float)s.head_dim_qk)));
  attn__fp_add(fp, "softcap", float_bits(s.softcap));
  attn__fp_add(fp, "sinks(hash)", s.sinks ? hash_bytes(ctx, s.sinks, (size_t)hq * 4, 1) : 0);
  attn__fp_add(fp, "alibi_slopes(hash)",
               s.alibi_slopes ? hash_bytes(ctx, s.alibi_slopes, (size_t)hq * 4, 2) : 0);
  attn__fp_add(fp, "num_seqs", s.num_seqs);
  int64_t cu = 0;
  if (s.num_seqs > 0 && s.cu_seqlens_q && s.cu_seqlens_kv) {
    cu = hash_bytes(ctx, s.cu_seqlens_q, (size_t)(s.num_seqs + 1) * 4, 3);
    cu = hash_bytes(ctx, s.cu_seqlens_kv, (size_t)(s.num_seqs + 1) * 4, cu);
  }
  attn__fp_add(fp, "cu_seqlens(hash)", cu);
  const attn_block_mask *bm = s.block_mask;
  int bm_ok = bm && bm->mask && bm->num_q_blocks > 0 && bm->num_k_blocks > 0 &&
              bm->num_q_blocks * bm->num_k_blocks < (INT64_C(1) << 40);
  attn__fp_add(fp, "block_mask", bm != NULL);
  attn__fp_add(fp, "block_mask.block_q", bm ? bm->block_q : 0);
  attn__fp_add(fp, "block_mask.block_k", bm ? bm->block_k : 0);
  attn__fp_add(fp, "block_mask.num_q_blocks", bm ? bm->num_q_blocks : 0);
  attn__fp_add(fp, "block_mask.num_k_blocks", bm ? bm->num_k_blocks : 0);
  attn__fp_add(fp, "block_mask.mask(hash)",
               bm_ok ? hash_bytes(ctx, bm->mask, (size_t)(bm->num_q_blocks * bm->num_k_blocks), 4) : 0);
  attn__fp_add(fp, "arguments_valid_on_rank", local_ok);
}

attn_status attn__ring_agree(attn_group_t grp, ring_op op, const attn_spec *spec,
                             attn_cp_layout layout, int64_t seq_q, int64_t seq_kv,
                             const attn_tensor *q, attn_status local) {
  char mine[1024] = "";
  if (local != ATTN_OK) snprintf(mine, sizeof mine, "%s", attn_last_error());
  attn__fingerprint fp;
  fingerprint(grp->ctx, &fp, op, spec, layout, seq_q, seq_kv, q, local == ATTN_OK);
  attn_status st = attn__comm_agree(grp->cp, &fp);
  if (st == ATTN_OK)
    return local == ATTN_OK ? ATTN_OK : attn__fail(local, "%s", mine);
  if (local == ATTN_OK) return st;
  char theirs[1024];
  snprintf(theirs, sizeof theirs, "%s", attn_last_error());
  return attn__fail(st, "%.600s (on this rank: %.400s)", theirs, mine);
}

attn_status attn__ring_finish(const ring_plan *pl, attn_status local, float *extra, int64_t n) {
  char mine[1024] = "";
  if (local != ATTN_OK) snprintf(mine, sizeof mine, "%s", attn_last_error());
  float failed = local != ATTN_OK ? 1.0f : 0.0f;
  attn_status st = pl->comm->ops->allreduce_sum(pl->comm, &failed, 1, ATTN_COMM_F32);
  if (st != ATTN_OK) return st;
  if (local != ATTN_OK) return attn__fail(local, "%s", mine);
  if (failed > 0.0f)
    return attn__fail(ATTN_ERR_INTERNAL,
                      "ring: %.0f other cp rank(s) failed during the ring; their messages "
                      "name the cause",
                      (double)failed);
  /* Every rank knows the verdict, so all take this second collective or none does. */
  return n ? pl->data->ops->allreduce_sum(pl->data, extra, n, ATTN_COMM_F32) : ATTN_OK;
}

attn_status attn__ring_add_stats(attn_stats *sum, attn_ctx_t ctx, int *computed) {
  attn_stats s;
  ATTN_CHECK(attn__ctx_stats(ctx, &s));
  sum->flops_computed += s.flops_computed;
  sum->tiles_computed += s.tiles_computed;
  sum->tiles_skipped += s.tiles_skipped;
  if (s.tiles_computed > 0) *computed = 1;
  return ATTN_OK;
}

void attn__ring_log(attn_group_t grp, const char *what) {
  double comp = 0, wait = 0;
  int64_t bytes = 0;
  int computed = 0;
  for (int32_t s = 0; s < grp->nsteps; s++) {
    comp += grp->steps[s].compute_s;
    wait += grp->steps[s].wait_s;
    bytes += grp->steps[s].bytes;
    computed += grp->steps[s].computed;
  }
  attn__log(ATTN_LOG_INFO, "%s: %d steps (%d computed), compute %.3f s, waited %.3f s, sent %lld bytes",
            what, grp->nsteps, computed, comp, wait, (long long)bytes);
}

/* ---- the schedule ---------------------------------------------------------------------- */

int64_t attn__ring_rows_count(const ring_rows *rows) {
  return ring_span_len(rows->run[0]) + ring_span_len(rows->run[1]);
}

static ring_span shard_span(const attn_cp_shard *sh, int j) {
  ring_span s = {sh->start[j], sh->start[j] + sh->len[j]};
  return s;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static ring_span hull(ring_span a, ring_span b) {
  if (ring_span_len(a) == 0) return b;
  if (ring_span_len(b) == 0) return a;
  ring_span h = {min64(a.lo, b.lo), max64(a.hi, b.hi)};
  return h;
}

/* Query and key bounds of sequence i (one sequence of seq_q x seq_kv without varlen). */
static void seq_bounds(const ring_plan *pl, int32_t i, ring_span *q, ring_span *k) {
  if (!pl->nseq) {
    *q = (ring_span){0, pl->seq_q};
    *k = (ring_span){0, pl->seq_kv};
    return;
  }
  *q = (ring_span){pl->cq[i], pl->cq[i + 1]};
  *k = (ring_span){pl->ck[i], pl->ck[i + 1]};
}

ring_span attn__ring_visible(const ring_plan *pl, ring_span q, ring_span k) {
  ring_span out = {0, 0}, sq, sk;
  if (ring_span_len(q) == 0 || ring_span_len(k) == 0) return out;
  int32_t n = pl->nseq ? pl->nseq : 1, a = 0, b = n;
  while (a < b) { /* first sequence whose queries end after q.lo */
    int32_t mid = a + (b - a) / 2;
    seq_bounds(pl, mid, &sq, &sk);
    if (sq.hi <= q.lo) a = mid + 1;
    else b = mid;
  }
  for (int32_t i = a; i < n; i++) {
    seq_bounds(pl, i, &sq, &sk);
    if (sq.lo >= q.hi) break;
    int64_t qa = max64(q.lo, sq.lo), qb = min64(q.hi, sq.hi);
    int64_t ka = max64(k.lo, sk.lo), kb = min64(k.hi, sk.hi);
    if (qa >= qb || ka >= kb) continue;
    /* Each row's [lo, hi] is non-decreasing in the row, so the first row's lo and the
     * last row's hi bound every visible key of the rows in between. */
    int64_t len_k = sk.hi - sk.lo, off = len_k - (sq.hi - sq.lo), lo1, hi1, lo2, hi2;
    attn__row_range(pl->causal, pl->wl, pl->wr, off, qa - sq.lo, len_k, &lo1, &hi1);
    attn__row_range(pl->causal, pl->wl, pl->wr, off, qb - 1 - sq.lo, len_k, &lo2, &hi2);
    ring_span vis = {max64(sk.lo + lo1, ka), min64(sk.lo + hi2 + 1, kb)};
    out = hull(out, vis);
  }
  return ring_span_len(out) ? out : (ring_span){0, 0};
}

/* First row in [a, b) with pred true (pred false then true along the rows), else b. */
static int64_t first_true(const ring_plan *pl, ring_span sq, int64_t len_k, int64_t a, int64_t b,
                          int64_t key, int want_hi) {
  const int64_t off = len_k - (sq.hi - sq.lo);
  while (a < b) {
    int64_t mid = a + (b - a) / 2, lo, hi;
    attn__row_range(pl->causal, pl->wl, pl->wr, off, mid - sq.lo, len_k, &lo, &hi);
    /* want_hi: does the row reach key (hi >= key)? else: has it left key behind (lo > key)? */
    if (want_hi ? hi >= key : lo > key) b = mid;
    else a = mid + 1;
  }
  return a;
}

ring_span attn__ring_visible_q(const ring_plan *pl, ring_span q, ring_span k) {
  ring_span out = {0, 0}, sq, sk;
  if (ring_span_len(q) == 0 || ring_span_len(k) == 0) return out;
  int32_t n = pl->nseq ? pl->nseq : 1, a = 0, b = n;
  while (a < b) {
    int32_t mid = a + (b - a) / 2;
    seq_bounds(pl, mid, &sq, &sk);
    if (sq.hi <= q.lo) a = mid + 1;
    else b = mid;
  }
  for (int32_t i = a; i < n; i++) {
    seq_bounds(pl, i, &sq, &sk);
    if (sq.lo >= q.hi) break;
    int64_t qa = max64(q.lo, sq.lo), qb = min64(q.hi, sq.hi);
    int64_t ka = max64(k.lo, sk.lo), kb = min64(k.hi, sk.hi);
    if (qa >= qb || ka >= kb) continue;
    /* Rows whose last key reaches ka and whose first key is not past kb-1 (both bounds
     * are non-decreasing in the row; rows that see nothing have hi < 0 <= ka). */
    const int64_t len_k = sk.hi - sk.lo;
    int64_t r0 = first_true(pl, sq, len_k, qa, qb, ka - sk.lo, 1);
    int64_t r1 = first_true(pl, sq, len_k, r0, qb, kb - 1 - sk.lo, 0);
    out = hull(out, (ring_span){r0, r1});
  }
  return ring_span_len(out) ? out : (ring_span){0, 0};
}

void attn__ring_need(const ring_plan *pl, int x, int y, ring_rows *out) {
  const attn_cp_shard *qs = &pl->qsh[x], *ks = &pl->ksh[y];
  for (int j = 0; j < 2; j++) {
    ring_span h = {0, 0};
    for (int i = 0; i < 2; i++)
      h = hull(h, attn__ring_visible(pl, shard_span(qs, i), shard_span(ks, j)));
    out->run[j] = h;
  }
}

void attn__ring_need_hull(const ring_plan *pl, int y, int t0, int t1, ring_rows *out) {
  memset(out, 0, sizeof *out);
  if (t0 < 0) t0 = 0;
  for (int t = t0; t <= t1 && t < pl->P; t++) {
    ring_rows n;
    attn__ring_need(pl, ring_mod(y + t, pl->P), y, &n);
    for (int j = 0; j < 2; j++) out->run[j] = hull(out->run[j], n.run[j]);
  }
}

void attn__ring_shard_rows(const ring_plan *pl, int y, ring_rows *out) {
  for (int j = 0; j < 2; j++) out->run[j] = shard_span(&pl->ksh[y], j);
}

/* ---- K/V block views ------------------------------------------------------------------- */

int64_t attn__ring_kv_bytes(const ring_plan *pl, const ring_rows *rows, attn_dtype dt) {
  return attn__ring_rows_count(rows) * pl->B * pl->Hkv * (pl->Dqk + pl->Dv) *
         (int64_t)attn_dtype_size(dt);
}

void attn__ring_kv_packed(const ring_plan *pl, void *buf, attn_dtype dt, const ring_rows *rows,
                          ring_kv *out) {
  int64_t n = attn__ring_rows_count(rows), ek = pl->Hkv * pl->Dqk, ev = pl->Hkv * pl->Dv;
  const int64_t es = (int64_t)attn_dtype_size(dt);
  out->k = buf;                                        /* [B, n, Hkv, Dqk] */
  out->v = buf ? (char *)buf + pl->B * n * ek * es : NULL; /* [B, n, Hkv, Dv] */
  out->dt = dt;
  out->ksb = n * ek;
  out->kss = ek;
  out->ksh = pl->Dqk;
  out->vsb = n * ev;
  out->vss = ev;
  out->vsh = pl->Dv;
  out->rows = *rows;
  out->row0[0] = 0;
  out->row0[1] = ring_span_len(rows->run[0]);
}

void attn__ring_kv_local(const ring_plan *pl, const attn_tensor *k, const attn_tensor *v,
                         ring_kv *out) {
  const attn_cp_shard *sh = &pl->ksh[pl->r];
  out->k = k->data;
  out->v = v->data;
  out->dt = k->dtype;
  out->ksb = k->stride[0];
  out->kss = k->stride[1];
  out->ksh = k->stride[2];
  out->vsb = v->stride[0];
  out->vss = v->stride[1];
  out->vsh = v->stride[2];
  for (int j = 0; j < 2; j++) {
    out->rows.run[j] = shard_span(sh, j);
    out->row0[j] = ring_run_off(sh, j);
  }
}

attn_tensor attn__ring_kv_tensor(const ring_plan *pl, const ring_kv *kv, int which, int j,
                                 ring_span sp) {
  int64_t row = kv->row0[j] + (sp.lo - kv->rows.run[j].lo);
  const int64_t es = (int64_t)attn_dtype_size(kv->dt);
  attn_tensor t = {0};
  t.dtype = kv->dt;
  t.device = pl->ctx->ops->device;
  int64_t D = which ? pl->Dv : pl->Dqk;
  t.data = which ? kv->v + row * kv->vss * es : kv->k + row * kv->kss * es;
  int64_t shape[4] = {pl->B, ring_span_len(sp), pl->Hkv, D};
  int64_t stride[4] = {which ? kv->vsb : kv->ksb, which ? kv->vss : kv->kss,
                       which ? kv->vsh : kv->ksh, 1};
  memcpy(t.shape, shape, sizeof shape);
  memcpy(t.stride, stride, sizeof stride);
  return t;
}

/* One backend rows op per (K or V, run) over rows present in both views: K then V. */
static attn_status for_rows(const ring_plan *pl, const ring_kv *dst, const ring_kv *src,
                            const ring_rows *rows, attn__rows_op op) {
  const int64_t des = (int64_t)attn_dtype_size(dst->dt), ses = (int64_t)attn_dtype_size(src->dt);
  for (int which = 0; which < 2; which++) {
    const int64_t D = which ? pl->Dv : pl->Dqk;
    char *dp = which ? dst->v : dst->k;
    const char *sp = which ? src->v : src->k;
    attn__view dv = attn__view_of(NULL, which ? dst->vsb : dst->ksb, which ? dst->vss : dst->kss,
                                  which ? dst->vsh : dst->ksh);
    attn__view sv = attn__view_of(NULL, which ? src->vsb : src->ksb, which ? src->vss : src->kss,
                                  which ? src->vsh : src->ksh);
    for (int j = 0; j < 2; j++) {
      const ring_span sp_j = rows->run[j];
      if (!ring_span_len(sp_j)) continue;
      const int64_t d0 = dst->row0[j] + sp_j.lo - dst->rows.run[j].lo;
      const int64_t s0 = src->row0[j] + sp_j.lo - src->rows.run[j].lo;
      dv.p = (float *)(dp + d0 * dv.ss * des);
      sv.p = (float *)(sp + s0 * sv.ss * ses);
      ATTN_CHECK(pl->ctx->ops->rows(pl->ctx, op, dv, dst->dt, sv, src->dt, pl->B,
                                    ring_span_len(sp_j), pl->Hkv, D));
    }
  }
  return ATTN_OK;
}

attn_status attn__ring_kv_pack(const ring_plan *pl, const ring_kv *src, const ring_rows *rows,
                               void *dst) {
  ring_kv d;
  attn__ring_kv_packed(pl, dst, src->dt, rows, &d);
  return for_rows(pl, &d, src, rows, ATTN__ROWS_COPY);
}

attn_status attn__ring_kv_add(const ring_plan *pl, const ring_kv *dst, const ring_kv *src) {
  return for_rows(pl, dst, src, &src->rows, ATTN__ROWS_ADD);
}

attn_status attn__ring_kv_zero(const ring_plan *pl, const ring_kv *kv) {
  return for_rows(pl, kv, kv, &kv->rows, ATTN__ROWS_ZERO);
}

attn_tensor attn__ring_rows_of(const attn_tensor *t, int64_t s0, int64_t n) {
  attn_tensor r = *t;
  r.data = (char *)t->data + s0 * t->stride[1] * (int64_t)attn_dtype_size(t->dtype);
  r.shape[1] = n;
  return r;
}

attn_status attn__ring_zero_tensor(attn_ctx_t ctx, const attn_tensor *t) {
  attn__view v = attn__view_of(t->data, t->stride[0], t->stride[1], t->stride[2]);
  return ctx->ops->rows(ctx, ATTN__ROWS_ZERO, v, t->dtype, v, t->dtype, t->shape[0], t->shape[1],
                        t->shape[2], t->shape[3]);
}

attn_status attn__ring_alloc(attn_ctx_t ctx, int64_t bytes, void **out) {
  *out = NULL;
  return ctx->ops->mem_alloc(ctx, (size_t)(bytes > 256 ? bytes : 256), out);
}

void attn__ring_free(attn_ctx_t ctx, void *p) {
  if (p) ctx->ops->mem_free(ctx, p);
}
