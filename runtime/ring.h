/* ring.h — what the ring attention files share (runtime/ring*.c): the validated call
 * (the plan), the schedule (which rows of which K/V block a rank needs, and so which rows
 * travel at which step), views of K/V blocks, packing, and the pre-flight agreement.
 *
 * Words used throughout: P = CP group size, r = this rank's cp_rank. Block y = the K/V
 * shard of cp rank y; at step s rank r holds block (r - s) mod P. A shard has one or two
 * runs (contiguous / zigzag) of consecutive global rows. Spans are global rows, half-open. */
#ifndef ATTN_RING_H
#define ATTN_RING_H

#include "group.h"

typedef struct {
  int64_t lo, hi; /* global rows [lo, hi); empty when lo >= hi */
} ring_span;

typedef struct {
  ring_span run[2]; /* rows of each run of a K/V shard */
} ring_rows;

/* What a call is, for the agreement (split-KV calls share the plan and the block folds). */
typedef enum { RING_FWD = 0, RING_BWD = 1, SPLIT_KV_FWD = 2, SPLIT_KV_BWD = 3 } ring_op;

/* A validated ring call. */
typedef struct {
  attn_ctx_t ctx;
  attn__comm *comm; /* the CP communicator over MPI: agreement and verdicts (host data) */
  attn__comm *data; /* the CP communicator for the context's memory: exchanges, dsinks */
  attn_dtype dt;    /* of q, k, v: the K/V that travel; dK/dV accumulators are float32 */
  const attn_spec *spec; /* the caller's (handed to the block API as is) */
  int P, r;
  int64_t seq_q, seq_kv;
  int64_t B, Hq, Hkv, Dqk, Dv;
  int causal;
  int64_t wl, wr;
  attn_cp_shard *qsh, *ksh; /* [P]: query and K/V shards of every cp rank (split-KV: every
                             * rank's query shard is all seq_q rows) */
  int32_t nseq;             /* varlen sequences (0: one sequence of seq_q x seq_kv) */
  const int32_t *cq, *ck;   /* [nseq + 1] host memory (host copies on a device context) */
  int32_t *cu_host;         /* [2 * (nseq + 1)] those copies, or NULL */
  uint8_t *mask_host;       /* a device context's block mask, copied (for attn_stats) */
  attn__spec_host spec_host; /* those copies, handed to the context for the steps */
} ring_plan;

/* Validates the spec, q, k, v, the layout and every rank's shard sizes, and fills pl.
 * all_q (split-KV): every rank holds all seq_q query rows; only K/V are cut. Failures
 * name the argument; nothing is communicated. */
attn_status attn__ring_plan_init(ring_plan *pl, attn_group_t grp, const attn_spec *spec,
                                 attn_cp_layout layout, int64_t seq_q, int64_t seq_kv,
                                 const attn_tensor *q, const attn_tensor *k,
                                 const attn_tensor *v, int all_q);
void attn__ring_plan_free(ring_plan *pl);
/* Context memory (attn_ctx_alloc) of at least 256 bytes, so a zero-sized buffer of an idle
 * rank is still a pointer; *out = NULL on failure. */
attn_status attn__ring_alloc(attn_ctx_t ctx, int64_t bytes, void **out);
void attn__ring_free(attn_ctx_t ctx, void *p); /* accepts NULL */

/* Pre-flight over the CP group, before any exchange: every rank contributes the problem's
 * fingerprint and whether its own checks (local) passed. Returns ATTN_OK only when every
 * rank agrees and every rank's checks passed; otherwise every rank fails (MISMATCH when
 * ranks differ, the rank's own error when all failed alike). */
attn_status attn__ring_agree(attn_group_t grp, ring_op op, const attn_spec *spec,
                             attn_cp_layout layout, int64_t seq_q, int64_t seq_kv,
                             const attn_tensor *q, attn_status local);

/* End of a ring call: every rank learns whether any rank failed (extra: floats summed
 * along with the flag, e.g. dsinks; may be NULL). */
attn_status attn__ring_finish(const ring_plan *pl, attn_status local, float *extra, int64_t n);

/* Adds the last block call's stats to sum; *computed = 1 when a tile ran. */
attn_status attn__ring_add_stats(attn_stats *sum, attn_ctx_t ctx, int *computed);

/* One INFO line summing the step record of the call just made. */
void attn__ring_log(attn_group_t grp, const char *what);

/* ---- step timing ------------------------------------------------------------------- */
/* Marks on the context's stream: backend events on an asynchronous backend (read after
 * the stream drained, so they time the device), host times on the cpu backend (whose
 * calls complete before they return). Phase k of a ring call has marks 3k (it begins:
 * before the pack), 3k+1 (its compute is queued), 3k+2 (the compute stream may go on: the
 * exchange has arrived, or is waited for on the stream) and 3k+3 (the next phase begins):
 * compute_s = [3k, 3k+1] + [3k+2, 3k+3] — packing, kernels, adding partials; wait_s =
 * [3k+1, 3k+2] — where the stream stalls for the exchange, i.e. the exposed
 * communication. (On a device the host's own waiting overlaps the kernels, so host time
 * blocked would count hidden communication as exposed.) */
typedef struct {
  int n;
  void **ev; /* [n] backend events (asynchronous backend) */
  double *t; /* [n] host times (cpu backend) */
} ring_clock;

attn_status attn__ring_clock_init(const ring_plan *pl, ring_clock *ck, int n);
void attn__ring_clock_free(const ring_plan *pl, ring_clock *ck);
/* Records mark i; a failure goes to *work (if that is still ATTN_OK). */
void attn__ring_mark(const ring_plan *pl, ring_clock *ck, int i, attn_status *work);
/* Waits for the stream, then sets compute_s / wait_s of grp's steps from phases 0..nphases-1
 * (phases past the last step add to it: the backward's hop home). */
attn_status attn__ring_times(const ring_plan *pl, const ring_clock *ck, attn_group_t grp,
                             int nphases);

/* ---- the schedule ------------------------------------------------------------------- */
static inline int ring_mod(int64_t a, int P) { return (int)(((a % P) + P) % P); }
static inline int64_t ring_span_len(ring_span s) { return s.hi > s.lo ? s.hi - s.lo : 0; }
int64_t attn__ring_rows_count(const ring_rows *rows);

/* Hull of the keys in k that some query in q may see (causal, window, varlen); a superset
 * of the visible keys, empty ({0, 0}) when none is visible. Block masks are left to the
 * kernels. */
ring_span attn__ring_visible(const ring_plan *pl, ring_span q, ring_span k);
/* Hull of the queries in q that may see some key in k (same rules). */
ring_span attn__ring_visible_q(const ring_plan *pl, ring_span q, ring_span k);
/* Rows of block y that cp rank x's queries need. */
void attn__ring_need(const ring_plan *pl, int x, int y, ring_rows *out);
/* Hull over steps t in [t0, t1] of the rows of block y needed by rank (y + t) mod P —
 * what block y must still carry at step t0 (t1 = P-1), or the rows whose gradients ranks
 * y+1..y+t1 have touched (t0 = 1). Empty when t0 > t1. */
void attn__ring_need_hull(const ring_plan *pl, int y, int t0, int t1, ring_rows *out);
/* The full shard of block y. */
void attn__ring_shard_rows(const ring_plan *pl, int y, ring_rows *out);

/* ---- K/V block views -------------------------------------------------------------- */
/* Element (b, row, h, d) of K at element k[b*ksb + row*kss + h*ksh + d] of dtype dt (V
 * likewise), in the context's memory. The same view holds float32 dK/dV accumulators in
 * the backward. */
typedef struct {
  char *k, *v;
  attn_dtype dt;
  int64_t ksb, kss, ksh, vsb, vss, vsh;
  ring_rows rows;  /* global rows present, per run */
  int64_t row0[2]; /* view row holding rows.run[j].lo */
} ring_kv;

/* Bytes of a packed block of dtype dt holding rows: K [B, n, Hkv, Dqk] then V [B, n, Hkv,
 * Dv]. */
int64_t attn__ring_kv_bytes(const ring_plan *pl, const ring_rows *rows, attn_dtype dt);
/* A view of a packed buffer of dtype dt holding rows (run 0's rows first). */
void attn__ring_kv_packed(const ring_plan *pl, void *buf, attn_dtype dt, const ring_rows *rows,
                          ring_kv *out);
/* A view of this rank's own K/V shard (or dK/dV outputs) as the caller laid it out. */
void attn__ring_kv_local(const ring_plan *pl, const attn_tensor *k, const attn_tensor *v,
                         ring_kv *out);
/* A [B, rows, Hkv, D] tensor of K (which = 0) or V (1) over rows sp of run j. */
attn_tensor attn__ring_kv_tensor(const ring_plan *pl, const ring_kv *kv, int which, int j,
                                 ring_span sp);
/* The data moves below run on the context's backend (its stream, on CUDA). */
/* Copies rows (a subset of src's) into dst, packed in src's dtype. */
attn_status attn__ring_kv_pack(const ring_plan *pl, const ring_kv *src, const ring_rows *rows,
                               void *dst);
/* dst += src over src's rows (a subset of dst's); both float32. */
attn_status attn__ring_kv_add(const ring_plan *pl, const ring_kv *dst, const ring_kv *src);
/* Zeroes every present row of kv. */
attn_status attn__ring_kv_zero(const ring_plan *pl, const ring_kv *kv);

/* Rows [s0, s0 + n) of a [B, S, H, D] tensor. */
attn_tensor attn__ring_rows_of(const attn_tensor *t, int64_t s0, int64_t n);
/* Zeroes a [B, S, H, D] tensor through its strides, on the context's backend. */
attn_status attn__ring_zero_tensor(attn_ctx_t ctx, const attn_tensor *t);
/* Offset of run j within the local rows of shard sh. */
static inline int64_t ring_run_off(const attn_cp_shard *sh, int j) { return j ? sh->len[0] : 0; }
double attn__ring_now(void);

/* ---- folding one block (ring.c, ring_bwd.c; split_kv.c uses them too) --------------- */
/* Folds block y (view kv) into st, the state of this rank's query rows: one
 * attn_fwd_block per (query run, key run) pair that positions allow, over just the keys
 * the run's queries may see and the queries that see them. Stats add to sum. */
attn_status attn__ring_fold(const ring_plan *pl, attn_state *st, attn_stats *sum,
                            const attn_tensor *q, const ring_kv *kv, int y, int *computed);

/* The caller's tensors of one backward call; delta [B, Hq, Sq_loc]. */
typedef struct {
  const attn_tensor *q, *dout;
  const float *lse, *delta;
  attn_tensor *dq;
} ring_bwd_io;
/* Block y's contribution: dQ into io->dq, dK/dV into g (pairs as attn__ring_fold). */
attn_status attn__ring_grad(const ring_plan *pl, attn_stats *sum, const ring_bwd_io *io,
                            const ring_kv *kv, const ring_kv *g, int y, int *computed);
/* The backward's start: ds [Hq] (the resolved dsinks, or NULL), io->dq, dk, dv zeroed, then
 * delta [B, Hq, Sq_loc] and ds from o, dO and LSE (attn_bwd_prepare). */
attn_status attn__ring_bwd_begin(const ring_plan *pl, const attn_tensor *o, const ring_bwd_io *io,
                                 float *delta, attn_tensor *dk, attn_tensor *dv, float *ds);
/* The backward's own tensors (q, k, v and the spec are checked by the plan). */
attn_status attn__ring_check_bwd(const ring_plan *pl, const attn_tensor *o, const float *lse,
                                 const attn_tensor *dout, attn_tensor *dq, attn_tensor *dk,
                                 attn_tensor *dv, const float *dsinks);

#endif
