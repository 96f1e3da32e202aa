/* geometry.cuh — where the CUDA kernels' tiles fall, shared by every kernel: the kernel
 * parameter block, varlen segments, the visible key range of a query row and its inverse
 * (the query rows that see a key), block-mask verdicts, the tile tables and key-tile walk,
 * and the score transform (scale, softcap, ALiBi, in log2 units) with its derivative. The
 * same rules as kernels/cpu/tiles.c, restated for the device (and the emulator). */
#ifndef ATTN_CUDA_GEOMETRY_CUH
#define ATTN_CUDA_GEOMETRY_CUH

#include "device.cuh"
#include "instance.h"

/* Kernel parameters (passed by value). Views are in elements of their type. */
struct fa_params {
  int64_t B, Hq, Hkv, group; /* group = Hq / Hkv */
  int64_t sq, skv, q_row0, q_pos0, k_pos0, seq_q, seq_kv;
  float sc;     /* scores to log2 units: scale*log2e, or scale/softcap with softcap */
  float cap2;   /* softcap*log2e; 0: off */
  float dscale; /* d(raw score)/d(q.k) without softcap: scale */
  int wl, wr;   /* window; -1 unbounded; clamped to 2^30 (longer than any sequence) */
  const float *sinks, *alibi;
  const int32_t *cu_q, *cu_kv;
  int32_t num_seqs;
  const uint8_t *bm;
  int bq, bk;
  int nqb, nkb;
  attn_cuda_view q, k, v;
  /* a KV cache (the forwards): used keys per batch (NULL: seq_kv), and K/V pages through
   * the block table (pages NULL: not paged) */
  const int32_t *kv_used, *pages;
  int pages_per_b, page_rows, num_pages;
  int hd_qk, hd_v, causal; /* read at run time by the float32 kernels (others: compiled in) */
  /* forward */
  attn_cuda_view o;
  float *lse;
  int64_t lse_rows;
  float *st_m, *st_l, *st_acc;
  int64_t st_rows;
  int block_mode;
  /* the decode forms of the mma.sync forward (1, 1: off). pack: query heads of one KV head
   * that share a CTA's tile rows (packed GQA); nsplit: CTAs that share a query tile's key
   * tiles, each writing a partial state [nsplit][B][Hq][sq] (m, l; acc [Dv]) at part_*
   * that attn_cuda__split_combine folds together (split-KV) */
  int pack, nsplit;
  float *part_m, *part_l, *part_acc;
  /* backward */
  attn_cuda_view dout, dq, dk, dv;
  const float *lse_in, *delta;
  int fuse_dq;
  /* the sm90 backward's deterministic dQ (NULL: dQ added in any order): the semaphores
   * (how many key CTAs have added to a 64-row tile, per consumer part), ticket and flag of
   * instance.h's FA_DQ_SEM_WORDS layout, zeroed before each launch */
  int32_t *dq_sem;
  /* tiles: a varlen table, or (table == NULL) ntiles plain tiles */
  const int32_t *table;
  int64_t ntiles;
  int ablate; /* FA_AB_* bits of the mma.sync forward's ablation kernel (instance.h) */
};

/* One sequence's part of the block (the whole block when not varlen); rows and keys are
 * block-local indices, positions sequence-local. Every index and position here is below
 * 2^30 (the dispatcher checks), so 32-bit arithmetic holds it and its sums. */
struct fa_seg {
  int r0, r1;    /* local query rows */
  int c0, c1;    /* local keys */
  int qpos_row0; /* sequence-local position of local row 0 */
  int kpos_col0; /* sequence-local position of local key 0 */
  int off;       /* len_kv - len_q */
  int len_q, len_kv;
};

FA_DEV int fa_min(int a, int b) { return a < b ? a : b; }
FA_DEV int fa_max(int a, int b) { return a > b ? a : b; }

/* A finished row (log2 units): running max m, running sum l, and the head's sink logit
 * sink2 (-inf: none) give inv, the factor that turns the accumulator into O, and lse2.
 * Sinks enter here, once; an empty row without a sink gives inv = 0, lse2 = -inf. */
FA_DEV void fa_row_finish(float m, float l, float sink2, float *inv, float *lse2) {
  const float top = fmaxf(m, sink2);
  *inv = 0.0f, *lse2 = -INFINITY;
  if (top == -INFINITY) return;
  const float sm = exp2f(m - top), z = l * sm + exp2f(sink2 - top);
  *inv = sm / z;
  *lse2 = top + log2f(z);
}

/* The one segment of a call without varlen: every local row and key. */
FA_DEV fa_seg fa_whole_seg(const fa_params &p) {
  fa_seg g;
  g.r0 = 0;
  g.r1 = (int)p.sq;
  g.c0 = 0;
  g.c1 = (int)p.skv;
  g.qpos_row0 = (int)p.q_pos0;
  g.kpos_col0 = (int)p.k_pos0;
  g.off = (int)(p.seq_kv - p.seq_q);
  g.len_q = (int)p.seq_q;
  g.len_kv = (int)p.seq_kv;
  return g;
}

FA_DEV fa_seg fa_make_seg(const fa_params &p, int s) {
  if (!p.num_seqs) return fa_whole_seg(p);
  fa_seg g;
  const int qa = (int)p.q_pos0, qb = (int)(p.q_pos0 + p.sq), ka = (int)p.k_pos0,
            kb = (int)(p.k_pos0 + p.skv);
  const int s_qa = p.cu_q[s], s_qb = p.cu_q[s + 1], s_ka = p.cu_kv[s], s_kb = p.cu_kv[s + 1];
  g.r0 = fa_max(s_qa, qa) - qa;
  g.r1 = fa_min(s_qb, qb) - qa;
  g.c0 = fa_max(s_ka, ka) - ka;
  g.c1 = fa_min(s_kb, kb) - ka;
  if (g.c1 < g.c0) g.c1 = g.c0;
  g.qpos_row0 = qa - s_qa;
  g.kpos_col0 = ka - s_ka;
  g.len_q = s_qb - s_qa;
  g.len_kv = s_kb - s_ka;
  g.off = g.len_kv - g.len_q;
  return g;
}

/* A forward's segment: fa_make_seg, and with a KV cache (never varlen) batch b's keys
 * below its used length: kv_used[b], clamped to 0..seq_kv, is its len_kv, so causal and
 * the window align to it. (The backward and the Hopper forward take no cache and keep
 * fa_make_seg.) */
FA_DEV fa_seg fa_fwd_seg(const fa_params &p, int s, int b) {
  fa_seg g = fa_make_seg(p, s);
  if (p.kv_used) {
    g.len_kv = fa_min(fa_max(p.kv_used[b], 0), (int)p.seq_kv);
    g.c1 = fa_min(fa_max(g.len_kv - g.kpos_col0, 0), (int)p.skv);
    g.off = g.len_kv - g.len_q;
  }
  return g;
}

/* Visible local keys [lo, hi] of local query row r (causal, window, sequence bounds);
 * clamped to [0, skv] / [-1, skv - 1] so they fit in int (lo > hi: none). */
FA_DEV void fa_row_keys(const fa_params &p, int causal, const fa_seg &s, int r, int &lo,
                        int &hi) {
  int a = 0, b = s.len_kv - 1;
  const int c = r + s.qpos_row0 + s.off;
  if (causal && c < b) b = c;
  if (p.wl >= 0 && c - p.wl > a) a = c - p.wl;
  if (p.wr >= 0 && c + p.wr < b) b = c + p.wr;
  lo = fa_min(fa_max(a - s.kpos_col0, 0), (int)p.skv);
  hi = fa_min(fa_max(b - s.kpos_col0, -1), (int)p.skv - 1);
}

/* Local query rows [lo, hi] that causal and window let see local key j (the exact inverse
 * of fa_row_keys), clamped like it to [0, sq] / [-1, sq - 1]. */
FA_DEV void fa_key_rows(const fa_params &p, int causal, const fa_seg &s, int j, int &lo,
                        int &hi) {
  const int c = j + s.kpos_col0 - s.off; /* i + off == key position  <=>  i == c */
  int a = 0, b = s.len_q - 1;
  if (causal && c > a) a = c;
  if (p.wr >= 0 && c - p.wr > a) a = c - p.wr;
  if (p.wl >= 0 && c + p.wl < b) b = c + p.wl;
  lo = fa_min(fa_max(a - s.qpos_row0, 0), (int)p.sq);
  hi = fa_min(fa_max(b - s.qpos_row0, -1), (int)p.sq - 1);
}

FA_DEV int fa_bm_at(const fa_params &p, int qblk, int kblk) {
  return qblk < p.nqb && kblk < p.nkb && p.bm[(int64_t)qblk * p.nkb + kblk] != 0;
}

/* Block-mask verdict for local rows [ra, rb] x local keys [ka, kb]: 0 none visible, 1 all
 * visible (or no mask), 2 mixed. */
FA_DEV int fa_bm_verdict(const fa_params &p, const fa_seg &s, int ra, int rb, int ka, int kb) {
  if (!p.bm) return 1;
  int seen0 = 0, seen1 = 0;
  const int q1 = (rb + s.qpos_row0) / p.bq, k0 = (ka + s.kpos_col0) / p.bk,
            k1 = (kb + s.kpos_col0) / p.bk;
  for (int q = (ra + s.qpos_row0) / p.bq; q <= q1; q++)
    for (int k = k0; k <= k1; k++) {
      int on = fa_bm_at(p, q, k);
      seen1 |= on;
      seen0 |= !on;
      if (seen0 && seen1) return 2;
    }
  return seen1 ? 1 : 0;
}

/* 1 iff local key j (in the segment) is visible to at least one of local rows [ra, rb]. */
FA_DEV int fa_key_seen(const fa_params &p, int causal, const fa_seg &s, int j, int ra, int rb) {
  int lo, hi;
  fa_key_rows(p, causal, s, j, lo, hi);
  lo = fa_max(lo, ra);
  hi = fa_min(hi, rb);
  if (lo > hi) return 0;
  if (!p.bm) return 1;
  const int kblk = (j + s.kpos_col0) / p.bk;
  for (int q = (lo + s.qpos_row0) / p.bq; q <= (hi + s.qpos_row0) / p.bq; q++)
    if (fa_bm_at(p, q, kblk)) return 1;
  return 0;
}

/* The tile a CTA works on: sequence `seg`, local rows [r0, r0 + rows). Returns 0 when the
 * CTA has none (varlen tables are sized for the worst case). */
struct fa_tile {
  int seg, r0, rows;
};

FA_DEV int fa_get_tile(const fa_params &p, int t, int tile_rows, int extent, fa_tile &out) {
  if (p.table) {
    if (t >= p.table[0]) return 0;
    const int32_t *e = p.table + 4 * (t + 1);
    out.seg = e[0];
    out.r0 = e[1];
    out.rows = e[2];
    return 1;
  }
  out.seg = 0;
  out.r0 = t * tile_rows;
  out.rows = fa_min(tile_rows, extent - out.r0);
  return out.rows > 0;
}

/* A key tile of a query-major kernel (forward, dQ): local keys [ca, cb). */
struct fa_ktile {
  int kt;
  int ca, cb;
  int bmv;  /* block-mask verdict over all the CTA's rows */
  int full; /* every (row, key) pair of the CTA visible */
};

/* Advances t to the next tile (tiles of bn keys at multiples of bn, clipped to
 * [kc0, kc1)) that the block mask does not exclude; 0 when none is left. lo_last and
 * hi_first: key ranges of the CTA's last and first rows (lo and hi grow with the row). */
FA_DEV int fa_next_ktile(const fa_params &p, const fa_seg &s, int R0, int rows, int bm, int bn,
                         int lo_last, int hi_first, int kc0, int kc1, fa_ktile &t) {
  for (t.kt++; t.kt * bn < kc1; t.kt++) {
    t.ca = fa_max(t.kt * bn, kc0);
    t.cb = fa_min((t.kt + 1) * bn, kc1);
    if (t.ca >= t.cb) continue;
    t.bmv = fa_bm_verdict(p, s, R0, R0 + rows - 1, t.ca, t.cb - 1);
    if (t.bmv == 0) continue;
    t.full = rows == bm && t.cb - t.ca == bn && lo_last <= t.ca && hi_first >= t.cb - 1 &&
             t.bmv == 1;
    return 1;
  }
  return 0;
}

/* 1 iff every key of tile t (from fa_next_ktile) is seen by some row of its CTA, so its K/V
 * rows need no test one by one (fa_key_seen) before they load. The rows' key ranges
 * (fa_row_keys) are intervals whose ends never fall as the row grows, by at most one a row,
 * and only the first or the last rows can see nothing: together they see every key from
 * the first row's lo to the last row's hi, the CTA's [kc0, kc1), which the tile is clipped
 * to. Only the block mask can take keys out of that (a verdict of 2, mixed). */
FA_DEV int fa_ktile_all_seen(const fa_ktile &t) { return t.bmv == 1; }

/* Split `split` of nsplit of the key range [kc0, kc1): whole tiles of bn keys (multiples
 * of bn), as even as they divide; an empty range (kc0 == kc1) when it gets none. */
FA_DEV void fa_split_keys(int nsplit, int split, int bn, int &kc0, int &kc1) {
  if (kc0 >= kc1) return;
  const int t0 = kc0 / bn, n = (kc1 - 1) / bn + 1 - t0;
  const int a = t0 + (int)((int64_t)n * split / nsplit), b = t0 + (int)((int64_t)n * (split + 1) / nsplit);
  const int lo = fa_max(kc0, a * bn), hi = fa_min(kc1, b * bn);
  kc0 = lo;
  kc1 = hi > lo ? hi : lo;
}

/* Element offset of local key j's row of KV head hk in view v (p.k or p.v) of batch b, or
 * -1 for a block-table entry outside the pool (read as zeros). */
FA_DEV int64_t fa_kv_offset(const fa_params &p, const attn_cuda_view &v, int b, int hk, int j) {
  if (!p.pages) return b * v.sb + (int64_t)j * v.ss + hk * v.sh;
  const int page = p.pages[(int64_t)b * p.pages_per_b + j / p.page_rows];
  if (page < 0 || page >= p.num_pages) return -1;
  return (int64_t)page * v.sb + (int64_t)(j % p.page_rows) * v.ss + hk * v.sh;
}

/* The softcap / ALiBi transform of a raw dot product x = q.k, to log2 units. */
FA_DEV float fa_score(const fa_params &p, float x, float alibi2, float dist) {
  float s = x * p.sc;
  if (p.cap2 > 0.0f) s = p.cap2 * tanhf(s);
  if (alibi2 != 0.0f) s -= alibi2 * dist;
  return s;
}

/* The score of a raw dot product in log2 units, and d(score)/d(q.k) / scale (softcap). */
FA_DEV float fa_score_grad(const fa_params &p, float x, float alibi2, float dist, float &dcap) {
  float s = x * p.sc;
  dcap = 1.0f;
  if (p.cap2 > 0.0f) {
    const float t = tanhf(s);
    dcap = 1.0f - t * t;
    s = p.cap2 * t;
  }
  if (alibi2 != 0.0f) s -= alibi2 * dist;
  return s;
}

/* Common parameter setup of the launchers (host side). */
static inline fa_params fa_params_make(const fa_call *c) {
  const attn_cuda_problem *pb = c->pb;
  fa_params p;
  memset(&p, 0, sizeof p);
  p.B = pb->B;
  p.Hq = pb->Hq;
  p.Hkv = pb->Hkv;
  p.group = pb->Hq / pb->Hkv;
  p.sq = pb->sq;
  p.skv = pb->skv;
  p.q_row0 = pb->q_row0;
  p.q_pos0 = pb->q_pos0;
  p.k_pos0 = pb->k_pos0;
  p.seq_q = pb->seq_q;
  p.seq_kv = pb->seq_kv;
  p.cap2 = pb->softcap > 0.0f ? pb->softcap * FA_LOG2E : 0.0f;
  p.sc = pb->softcap > 0.0f ? pb->scale / pb->softcap : pb->scale * FA_LOG2E;
  p.dscale = pb->scale;
  p.wl = (int)(pb->window_left > (1 << 30) ? (1 << 30) : pb->window_left);
  p.wr = (int)(pb->window_right > (1 << 30) ? (1 << 30) : pb->window_right);
  p.sinks = pb->sinks;
  p.alibi = pb->alibi;
  p.cu_q = pb->cu_seqlens_q;
  p.cu_kv = pb->cu_seqlens_kv;
  p.num_seqs = pb->num_seqs;
  p.bm = pb->block_mask;
  p.bq = pb->block_q;
  p.bk = pb->block_k;
  p.nqb = (int)(pb->num_q_blocks > (1 << 30) ? (1 << 30) : pb->num_q_blocks);
  p.nkb = (int)(pb->num_k_blocks > (1 << 30) ? (1 << 30) : pb->num_k_blocks);
  p.q = pb->q;
  p.k = pb->k;
  p.v = pb->v;
  p.kv_used = pb->kv_used;
  p.pages = pb->block_table;
  if (p.pages) {
    p.pages_per_b = (int)pb->pages_per_seq;
    p.page_rows = (int)pb->page_size;
    p.num_pages = (int)(pb->num_pages > INT32_MAX ? INT32_MAX : pb->num_pages);
  }
  p.hd_qk = (int)pb->Dqk;
  p.hd_v = (int)pb->Dv;
  p.causal = pb->causal != 0;
  p.pack = 1;
  p.nsplit = 1;
  return p;
}

#endif
