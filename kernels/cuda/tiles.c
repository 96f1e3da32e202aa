/* tiles.c — the tiles the CUDA kernels compute and skip, counted on the host from the
 * problem's geometry alone (no device work, no kernel counters), for attn_stats: the same
 * walks as the kernels (geometry.cuh: segments, row <-> key ranges, block-mask verdicts;
 * fwd_body.cuh / fwd_f32.cu / fwd_sm90_body.cuh, bwd_body.cuh / bwd_f32.cu) at their tile
 * shapes (traits.h), in closed form where no block mask is set.
 *
 * Definitions (those of the CPU backend, kernels/cpu/fwd.c and bwd.c, at the CUDA shapes):
 * a tile is (query rows of one step) x (keys of one key tile) of one (batch, query head);
 * its FLOPs are 2 * rows * keys * (Dqk + Dv) forward and 2 * rows * keys * (3 Dqk + 2 Dv)
 * backward, with rows and keys clipped to the range the kernel walks (so a 70-row
 * diagonal tile counts 70 rows). Forward (query-major): per query tile, the key tiles of
 * the sequence's keys in this call are computed or skipped. Backward: the dK/dV kernel's
 * (key tile, query step) pairs over the sequence's query rows; the deterministic mode's
 * separate dQ kernel recomputes those same pairs and is not counted again. */
#include <stdint.h>
#include <string.h>

#include "../../runtime/internal.h"
#include "cuda_attn.h"
#include "traits.h"

/* The Hopper forward's tile (H_BM x H_BN in fwd_sm90_body.cuh: 128 rows x
 * FA_SM90_FWD_BN keys, 64 at head dim 256): key tiles end at the CTA's last visible key
 * instead of starting at multiples of the tile. The Hopper
 * backward's (G_BM x G_BN in bwd_sm90_body.cuh): 128 keys a CTA, 64 query rows a step,
 * steps from the first row that sees a key, as the mma.sync dK/dV kernel walks them. */
#define SM90_ROWS 128
#define SM90_BWD_ROWS 64
#define SM90_BWD_KEYS 128

/* One sequence's part of the call (the whole call without varlen), as fa_make_seg. */
typedef struct {
  int64_t r0, r1, c0, c1;  /* local query rows, local keys */
  int64_t qpos0, kpos0;    /* sequence-local positions of local row 0 / key 0 */
  int64_t off, len_q, len_kv;
} seg;

typedef struct {
  const attn_cuda_problem *p;
  int rows, keys; /* tile shape: query rows x keys (backward: query rows per step, keys per CTA) */
  int key_aligned_end; /* forward key tiles end at the CTA's last key (the sm90 kernel) */
  double flops_per;    /* FLOPs per (row, key) pair */
  int64_t computed, skipped;
  double flops;
} counter;

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

/* Cells [g + k n, g + (k+1) n) of a grid with origin g that overlap [a, b). */
static int64_t cells(int64_t a, int64_t b, int64_t g, int64_t n) {
  return b > a ? floor_div(b - 1 - g, n) - floor_div(a - g, n) + 1 : 0;
}

/* b >= 0: batch b of a KV cache (kv_used, host), as fa_fwd_seg. */
static seg make_seg(const attn_cuda_problem *p, int s, int64_t b) {
  if (!p->num_seqs && b >= 0) {
    const int64_t used = min64(max64(p->kv_used[b], 0), p->seq_kv);
    return (seg){0, p->sq, 0, min64(max64(used - p->k_pos0, 0), p->skv), p->q_pos0, p->k_pos0,
                 used - p->seq_q, p->seq_q, used};
  }
  if (!p->num_seqs)
    return (seg){0, p->sq, 0, p->skv, p->q_pos0, p->k_pos0, p->seq_kv - p->seq_q, p->seq_q,
                 p->seq_kv};
  const int64_t qa = p->q_pos0, qb = p->q_pos0 + p->sq, ka = p->k_pos0, kb = p->k_pos0 + p->skv;
  const int64_t s_qa = p->cu_seqlens_q[s], s_qb = p->cu_seqlens_q[s + 1];
  const int64_t s_ka = p->cu_seqlens_kv[s], s_kb = p->cu_seqlens_kv[s + 1];
  seg g = {max64(s_qa, qa) - qa, min64(s_qb, qb) - qa, max64(s_ka, ka) - ka,
           min64(s_kb, kb) - ka, qa - s_qa, ka - s_ka, 0, s_qb - s_qa, s_kb - s_ka};
  if (g.c1 < g.c0) g.c1 = g.c0;
  g.off = g.len_kv - g.len_q;
  return g;
}

/* Visible local keys [lo, hi] of local row r, clamped as fa_row_keys does. */
static void row_keys(const counter *c, const seg *s, int64_t r, int64_t *lo, int64_t *hi) {
  const attn_cuda_problem *p = c->p;
  int64_t a, b;
  attn__row_range(p->causal, p->window_left, p->window_right, s->off, r + s->qpos0, s->len_kv,
                  &a, &b);
  *lo = min64(max64(a - s->kpos0, 0), p->skv);
  *hi = min64(max64(b - s->kpos0, -1), p->skv - 1);
}

/* Local rows [lo, hi] that see local key j (the inverse of row_keys, as fa_key_rows). */
static void key_rows(const counter *c, const seg *s, int64_t j, int64_t *lo, int64_t *hi) {
  const attn_cuda_problem *p = c->p;
  const int64_t x = j + s->kpos0 - s->off; /* the row position whose diagonal is key j */
  int64_t a = 0, b = s->len_q - 1;
  if (p->causal && x > a) a = x;
  if (p->window_right >= 0 && x - p->window_right > a) a = x - p->window_right;
  if (p->window_left >= 0 && x + p->window_left < b) b = x + p->window_left;
  *lo = min64(max64(a - s->qpos0, 0), p->sq);
  *hi = min64(max64(b - s->qpos0, -1), p->sq - 1);
}

/* 1 unless the block mask excludes every pair of local rows [ra, rb] x keys [ka, kb]
 * (fa_bm_verdict != 0). */
static int bm_any(const counter *c, const seg *s, int64_t ra, int64_t rb, int64_t ka, int64_t kb) {
  const attn_cuda_problem *p = c->p;
  if (!p->block_mask) return 1;
  const int64_t k0 = (ka + s->kpos0) / p->block_k;
  const int64_t k1 = min64((kb + s->kpos0) / p->block_k, p->num_k_blocks - 1);
  const int64_t q1 = min64((rb + s->qpos0) / p->block_q, p->num_q_blocks - 1);
  for (int64_t q = (ra + s->qpos0) / p->block_q; q <= q1; q++)
    for (int64_t k = k0; k <= k1; k++)
      if (p->block_mask[q * p->num_k_blocks + k]) return 1;
  return 0;
}

/* Forward: one query tile (local rows [R0, R0 + rows)) against its key tiles. */
static void fwd_tile(counter *c, const seg *s, int64_t R0, int64_t rows) {
  int64_t lo_first, hi_first, lo_last, hi_last;
  row_keys(c, s, R0, &lo_first, &hi_first);
  row_keys(c, s, R0 + rows - 1, &lo_last, &hi_last);
  const int64_t kc0 = max64(lo_first, s->c0), kc1 = min64(hi_last + 1, s->c1), n = c->keys;
  const int64_t g = c->key_aligned_end && kc1 > kc0 ? kc1 % n : 0; /* the key grid's origin */
  int64_t done = 0;
  if (kc0 < kc1 && !c->p->block_mask) {
    done = cells(kc0, kc1, g, n);
    c->flops += c->flops_per * (double)rows * (double)(kc1 - kc0);
  } else if (kc0 < kc1) {
    for (int64_t k = g + floor_div(kc0 - g, n) * n; k < kc1; k += n) {
      const int64_t ca = max64(k, kc0), cb = min64(k + n, kc1);
      if (!bm_any(c, s, R0, R0 + rows - 1, ca, cb - 1)) continue;
      done++;
      c->flops += c->flops_per * (double)rows * (double)(cb - ca);
    }
  }
  c->computed += done;
  c->skipped += cells(s->c0, s->c1, g, n) - done;
}

/* Backward: one dK/dV key tile (local keys [K0, K0 + nk)) against its query steps, which
 * start at the first row that sees a key of the tile. */
static void bwd_tile(counter *c, const seg *s, int64_t K0, int64_t nk) {
  int64_t qlo, qhi, x;
  key_rows(c, s, K0, &qlo, &x);
  key_rows(c, s, K0 + nk - 1, &x, &qhi);
  qlo = max64(qlo, s->r0);
  qhi = min64(qhi, s->r1 - 1);
  const int64_t m = c->rows;
  int64_t done = 0;
  if (qlo <= qhi && !c->p->block_mask) {
    done = cells(qlo, qhi + 1, qlo, m);
    c->flops += c->flops_per * (double)(qhi - qlo + 1) * (double)nk;
  } else if (qlo <= qhi) {
    for (int64_t qa = qlo; qa <= qhi; qa += m) {
      const int64_t qn = min64(m, qhi + 1 - qa);
      if (!bm_any(c, s, qa, qa + qn - 1, K0, K0 + nk - 1)) continue;
      done++;
      c->flops += c->flops_per * (double)qn * (double)nk;
    }
  }
  c->computed += done;
  c->skipped += cells(s->r0, s->r1, qlo <= qhi ? qlo : 0, m) - done;
}

/* The segments of the call and their tiles: the query grid (forward) or the key grid of
 * sequences that also have query rows in the call (backward), as state.cu's tile tables;
 * b >= 0: those of batch b of a KV cache. */
static void walk(counter *c, int backward, int64_t b) {
  const attn_cuda_problem *p = c->p;
  const int nseg = p->num_seqs ? p->num_seqs : 1;
  for (int i = 0; i < nseg; i++) {
    const seg s = make_seg(p, i, b);
    if (s.r1 <= s.r0 || (backward && s.c1 <= s.c0)) continue;
    if (!backward)
      for (int64_t r = s.r0; r < s.r1; r += c->rows) fwd_tile(c, &s, r, min64(c->rows, s.r1 - r));
    else
      for (int64_t k = s.c0; k < s.c1; k += c->keys) bwd_tile(c, &s, k, min64(c->keys, s.c1 - k));
  }
}

void attn_cuda_tile_shape(const attn_cuda_problem *p, int backward, int sm90, int *rows,
                          int *keys) {
  const int64_t dqk = p->Dqk, dv = p->Dv;
  if (p->dtype == ATTN_F32) {
    *rows = *keys = FA_F32_BN; /* 32 rows (or keys) per CTA x 32 keys (or rows) per step */
  } else if (backward && sm90) {
    *rows = SM90_BWD_ROWS;
    *keys = SM90_BWD_KEYS;
  } else if (backward) {
    *rows = FA_BWD_BM(dqk, dv);
    *keys = FA_BWD_BN(dqk, dv);
  } else if (sm90) {
    *rows = SM90_ROWS;
    *keys = FA_SM90_FWD_BN(dqk, dv, p->causal);
  } else {
    int pack, nsplit; /* packed GQA: FA_FWD_BM / pack positions of each head a tile */
    attn_cuda_fwd_plan(p, &pack, &nsplit);
    const char *form = attn_cuda_last_fwd_form(); /* the experiments' kernels (instance.h) */
    *rows = !strcmp(form, "4w")   ? FA_FWD_W4_BM
            : !strcmp(form, "ks") ? FA_FWD_KS_ROWS / pack
                                  : FA_FWD_BM / pack;
    *keys = !strcmp(form, "2cta")   ? FA_FWD_2CTA_BN(dqk, dv)
            : !strcmp(form, "4x32") ? FA_FWD_4X32_BN(dqk, dv)
                                    : FA_FWD_BN(dqk, dv);
  }
}

void attn_cuda_count_tiles(const attn_cuda_problem *p, int backward, int sm90, attn_stats *out) {
  memset(out, 0, sizeof *out);
  counter c;
  memset(&c, 0, sizeof c);
  c.p = p;
  sm90 = sm90 && p->dtype != ATTN_F32;
  attn_cuda_tile_shape(p, backward, sm90, &c.rows, &c.keys);
  c.key_aligned_end = sm90 && !backward;
  c.flops_per = backward ? 2.0 * (double)(3 * p->Dqk + 2 * p->Dv) : 2.0 * (double)(p->Dqk + p->Dv);
  if (p->sq < 1 || p->skv < 1) return;
  /* every query head walks the same tiles, and every batch unless a cache's lengths differ */
  int64_t copies = p->B;
  if (p->kv_used && !backward) {
    for (int64_t b = 0; b < p->B; b++) walk(&c, backward, b);
    copies = 1;
  } else {
    walk(&c, backward, -1);
  }
  out->tiles_computed = c.computed * copies * p->Hq;
  out->tiles_skipped = c.skipped * copies * p->Hq;
  out->flops_computed = c.flops * (double)copies * (double)p->Hq;
}
