/* tiles.c — where the CPU kernels' tiles fall: varlen segments, the visible key range of a
 * query tile, and the per-tile mask description (skip, full, or partial). */
#include "convert.h"
#include "cpu.h"

#include <stdlib.h>
#include <string.h>

attn_status attn__cpu_segments(const attn__problem *pb, cpu_segment **out, int *count) {
  int n = pb->num_seqs ? pb->num_seqs : pb->kv_used ? (int)pb->B : 1;
  cpu_segment *seg = calloc((size_t)n, sizeof *seg);
  if (!seg) return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "segment list (%d) allocation failed", n);
  int used = 0;
  if (!pb->num_seqs && pb->kv_used) { /* batch b sees its first kv_used[b] keys */
    for (int b = 0; b < n; b++) {
      const int64_t len = pb->kv_used[b], c1 = len - pb->k_pos0;
      seg[used++] = (cpu_segment){0, pb->sq, 0, c1 < 0 ? 0 : c1 > pb->skv ? pb->skv : c1,
                                  pb->q_pos0, pb->k_pos0, len - pb->seq_q, len, b + 1};
    }
  } else if (!pb->num_seqs) {
    seg[0] = (cpu_segment){0, pb->sq, 0, pb->skv, pb->q_pos0, pb->k_pos0,
                           pb->seq_kv - pb->seq_q, pb->seq_kv, 0};
    used = 1;
  } else {
    const int64_t qa = pb->q_pos0, qb = pb->q_pos0 + pb->sq;
    const int64_t ka = pb->k_pos0, kb = pb->k_pos0 + pb->skv;
    for (int s = 0; s < pb->num_seqs; s++) {
      int64_t s_qa = pb->cu_q[s], s_qb = pb->cu_q[s + 1];
      int64_t s_ka = pb->cu_kv[s], s_kb = pb->cu_kv[s + 1];
      int64_t r0 = (s_qa > qa ? s_qa : qa) - qa, r1 = (s_qb < qb ? s_qb : qb) - qa;
      if (r0 >= r1) continue;
      int64_t c0 = (s_ka > ka ? s_ka : ka) - ka, c1 = (s_kb < kb ? s_kb : kb) - ka;
      if (c1 < c0) c1 = c0;
      seg[used++] = (cpu_segment){r0, r1, c0, c1, qa - s_qa, ka - s_ka,
                                  (s_kb - s_ka) - (s_qb - s_qa), s_kb - s_ka, 0};
    }
  }
  *out = seg;
  *count = used;
  return ATTN_OK;
}

static void row_range(const attn__problem *pb, const cpu_segment *seg, int64_t r, int64_t *lo,
                      int64_t *hi) {
  attn__row_range(pb->causal, pb->window_left, pb->window_right, seg->off, r + seg->qpos_row0,
                  seg->len_kv, lo, hi);
  *lo -= seg->kpos_col0; /* to local key indices */
  *hi -= seg->kpos_col0;
}

void attn__cpu_key_range(const attn__problem *pb, const cpu_segment *seg, int64_t r0, int rows,
                         int64_t *c0, int64_t *c1) {
  int64_t lo, hi, lo2, hi2;
  row_range(pb, seg, r0, &lo, &hi);
  row_range(pb, seg, r0 + rows - 1, &lo2, &hi2);
  *c0 = lo > seg->c0 ? lo : seg->c0;
  *c1 = hi2 + 1 < seg->c1 ? hi2 + 1 : seg->c1;
}

/* Block-mask verdict for sequence-local query positions [qa, qb] x keys [ka, kb]:
 * 0 none visible, 1 all visible, 2 mixed. */
static int block_verdict(const attn_block_mask *bm, int64_t qa, int64_t qb, int64_t ka,
                         int64_t kb) {
  int seen0 = 0, seen1 = 0;
  for (int64_t q = qa / bm->block_q; q <= qb / bm->block_q; q++)
    for (int64_t k = ka / bm->block_k; k <= kb / bm->block_k; k++) {
      int on = q < bm->num_q_blocks && k < bm->num_k_blocks &&
               bm->mask[q * bm->num_k_blocks + k];
      seen1 |= on;
      seen0 |= !on;
      if (seen0 && seen1) return 2;
    }
  return seen1 ? 1 : 0;
}

/* elem [CPU_BC][CPU_BR]: lane g*rows + i (g < nh) of key row j is 1 when the block mask
 * shows key kpos0 + j to query qpos0 + i (the mask is the same for every head). */
static void fill_elem(const attn_block_mask *bm, int64_t qpos0, int rows, int nh, int64_t kpos0,
                      int nj, uint8_t *elem) {
  memset(elem, 0, (size_t)CPU_BC * CPU_BR);
  for (int j = 0; j < nj; j++) {
    uint8_t *e = elem + j * CPU_BR;
    int64_t kb = (kpos0 + j) / bm->block_k;
    for (int i = 0; i < rows; i++) {
      int64_t qb = (qpos0 + i) / bm->block_q;
      e[i] = qb < bm->num_q_blocks && kb < bm->num_k_blocks &&
             bm->mask[qb * bm->num_k_blocks + kb] != 0;
    }
    for (int g = 1; g < nh; g++) memcpy(e + g * rows, e, (size_t)rows);
  }
}

int attn__cpu_pack_heads(const attn__problem *pb, int rows) {
  int64_t G = pb->Hq / pb->Hkv, fit = CPU_BR / (rows > 0 ? rows : 1);
  if (G * rows > CPU_ROWS_MAX) return (int)(G < fit ? G : fit);
  int64_t groups = fit / G < pb->Hkv ? fit / G : pb->Hkv;
  return (int)(G * groups);
}

int attn__cpu_tile_info(const attn__problem *pb, const cpu_segment *seg, int64_t h, int nh,
                        int64_t r0, int rows, int64_t c0, int64_t c1, cpu_tile_info *ti,
                        uint8_t *elem_buf) {
  const int nj = (int)(c1 - c0), used = nh * rows;
  int any = 0, partial = 0;
  for (int i = 0; i < CPU_BR; i++) {
    int64_t lo = 1, hi = 0;
    if (i < rows) {
      row_range(pb, seg, r0 + i, &lo, &hi);
      lo -= c0;
      hi -= c0;
      if (lo < 0) lo = 0;
      if (hi > nj - 1) hi = nj - 1;
      if (lo <= hi) any = 1;
      if (lo > 0 || hi < nj - 1) partial = 1;
      if (lo > nj) lo = nj; /* keep within int32 */
      if (hi < -1) hi = -1;
    }
    ti->lo[i] = (int32_t)lo;
    ti->hi[i] = (int32_t)hi;
    ti->ipos[i] = i < rows ? (float)(r0 + i + seg->qpos_row0 + seg->off - (c0 + seg->kpos_col0)) : 0.0f;
  }
  if (!any) return 0;
  for (int g = 1; g < nh; g++) { /* the other heads' lanes repeat the rows */
    memcpy(ti->lo + g * rows, ti->lo, (size_t)rows * sizeof ti->lo[0]);
    memcpy(ti->hi + g * rows, ti->hi, (size_t)rows * sizeof ti->hi[0]);
    memcpy(ti->ipos + g * rows, ti->ipos, (size_t)rows * sizeof ti->ipos[0]);
  }
  ti->lanes = (used + 15) / 16 * 16;
  ti->elem = NULL;
  const attn_block_mask *bm = pb->block_mask;
  if (bm) {
    int64_t qa = r0 + seg->qpos_row0, ka = c0 + seg->kpos_col0;
    int v = block_verdict(bm, qa, qa + rows - 1, ka, ka + nj - 1);
    if (v == 0) return 0;
    if (v == 2) {
      fill_elem(bm, qa, rows, nh, ka, nj, elem_buf);
      ti->elem = elem_buf;
      partial = 1;
    }
  }
  ti->partial = partial;
  ti->softcap2 = pb->softcap > 0.0f ? pb->softcap * CPU_LOG2E : 0.0f;
  ti->alibi = pb->alibi != NULL;
  if (ti->alibi)
    for (int L = 0; L < CPU_BR; L++)
      ti->alibi2[L] = L < used ? pb->alibi[h + L / rows] * CPU_LOG2E : 0.0f;
  return 1;
}

attn_status attn__cpu_flags_init(cpu_tile_flags *f, attn__view x, attn_dtype t, int64_t B,
                                 int64_t S, int64_t H, int64_t D) {
  *f = (cpu_tile_flags){x, t, S, H, D, (S + CPU_BC - 1) / CPU_BC, NULL, NULL, 0};
  f->flag = calloc((size_t)(B * H * f->nt) + 1, 1);
  if (!f->flag)
    return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "tile flags (%lld) allocation failed",
                      (long long)(B * H * f->nt));
  return ATTN_OK;
}

void attn__cpu_flags_free(cpu_tile_flags *f) {
  free(f->flag);
  f->flag = NULL;
}

int attn__cpu_tile_nonfinite(const cpu_tile_flags *f, const cpu_tile_ops *ops, int64_t b,
                             int64_t h, int64_t tile) {
  uint8_t *flag = &f->flag[(b * f->H + h) * f->nt + tile];
  uint8_t v = __atomic_load_n(flag, __ATOMIC_RELAXED);
  if (!v) {
    int64_t s0 = tile * CPU_BC, end = f->S;
    if (f->kv_used && f->kv_used[b] - f->k_pos0 < end) end = f->kv_used[b] - f->k_pos0;
    if (end > s0 + CPU_BC) end = s0 + CPU_BC;
    v = 1;
    for (int64_t s = s0, run; s < end && v == 1; s += run) { /* page by page */
      run = attn__view_run(f->x, s, end - s);
      if (ops->nonfinite(attn__cpu_row(f->x, f->t, b, s, h), f->x.ss, f->t, (int)run, (int)f->D))
        v = 2;
    }
    __atomic_store_n(flag, v, __ATOMIC_RELAXED);
  }
  return v == 2;
}

const float *attn__cpu_rows_f32(const cpu_tile_ops *ops, attn__view x, attn_dtype t, int64_t b,
                                int64_t s0, int64_t h, int rows, int D, float *buf,
                                int64_t *ld) {
  const void *src = attn__cpu_row(x, t, b, s0, h);
  const int64_t run = attn__view_run(x, s0, rows);
  if (t == ATTN_F32 && run == rows) {
    *ld = x.ss;
    return src;
  }
  for (int64_t r = 0, n; r < rows; r += n) { /* page by page when paged */
    n = attn__view_run(x, s0 + r, rows - r);
    const void *from = attn__cpu_row(x, t, b, s0 + r, h);
    if (t != ATTN_F32) ops->rows_in(buf + r * D, D, from, x.ss, t, (int)n, D);
    else
      for (int64_t i = 0; i < n; i++)
        memcpy(buf + (r + i) * D, (const float *)from + i * x.ss, (size_t)D * sizeof(float));
  }
  *ld = D;
  return buf;
}

const float *attn__cpu_lane_rows(const cpu_tile_ops *ops, attn__view x, attn_dtype t, int64_t b,
                                 int64_t s0, int64_t h, int nh, int rows, int D, float *buf,
                                 int64_t *ld) {
  if (nh == 1) return attn__cpu_rows_f32(ops, x, t, b, s0, h, rows, D, buf, ld);
  for (int g = 0; g < nh; g++) {
    float *dst = buf + (size_t)g * rows * D;
    if (t != ATTN_F32) {
      int64_t ignored;
      attn__cpu_rows_f32(ops, x, t, b, s0, h + g, rows, D, dst, &ignored);
      continue;
    }
    for (int i = 0; i < rows; i++)
      memcpy(dst + (size_t)i * D, attn__cpu_row(x, ATTN_F32, b, s0 + i, h + g),
             (size_t)D * sizeof(float));
  }
  *ld = D;
  return buf;
}
