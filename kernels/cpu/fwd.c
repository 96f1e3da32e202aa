/* fwd.c — CPU flash forward: one query tile at a time against the visible key tiles,
 * carrying a float32 (m, l, acc) state; one-shot (state in registers/L1, written as O and
 * LSE) or block mode (state loaded from and stored to an attn_state). A short query tile
 * carries several query heads of its GQA group in its lanes (decode: one K/V pass a
 * group), and on the row kernels several whole groups, visited in turn on each key tile.
 * bf16 tiles of more than CPU_ROWS_MAX lanes take the bf16 tile products (AMX or
 * AVX512-BF16) where the CPU has them (cfg.cpu_amx), the O rows then accumulating in w->ro
 * as on the row kernels. */
#include "convert.h"
#include "cpu.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int32_t b, h, nh, seg; /* heads h..h+nh-1 (one GQA group) */
  int32_t rows;          /* rows of each head; lane L: row L % rows of head h + L / rows */
  int64_t r0;
} fwd_item;

typedef struct {
  float *qt;    /* [Dqk][CPU_BR] scaled Q^T */
  float *s;     /* [CPU_BC][CPU_BR] S^T, then P^T; the row kernels' S [CPU_ROWS_MAX][CPU_BC]
                 * instead (and their Q rows [CPU_BR][Dqk] in qt) */
  float *ot;    /* [Dv][CPU_BR] unnormalised O^T */
  float *ro;    /* [CPU_BR][Dv] the row kernels' O rows (the state while they run) */
  float *cv;    /* [CPU_BC][max(Dqk, Dv)] rows as float32: the lanes' Q, acc or O rows
                 * ([nh*rows][D]), or a bf16/f16 K or V tile */
  uint16_t *bf; /* the bf16 tiles' bf16 buffers: P [CPU_BR][CPU_BC], kpad [32][Dqk], vv
                  * [CPU_BC/2][Dv][2] (their Q^T, qv [Dqk/2][CPU_BR][2], in qt) */
  float m[CPU_BR], l[CPU_BR], alpha[CPU_BR]; /* log2 units */
  uint8_t elem[CPU_BC * CPU_BR];
  cpu_tile_info ti;
} fwd_work;

typedef struct {
  const attn__problem *pb;
  const cpu_tile_ops *ops;
  const cpu_segment *segs;
  const cpu_tile_flags *vbad; /* which V tiles hold NaN or Inf */
  const cpu_bf16_ops *bf16;   /* the bf16 tile products (AMX or AVX512-BF16), or NULL */
  attn_ctx_t ctx;
  /* bf16 tiles: V's pairs of every whole key tile, packed once for all the query tiles
   * ([B][Hkv][ntk][CPU_BC/2][Dv][2]), or NULL: each tile packs its own */
  uint16_t *vpk;
  int64_t ntk;
} fwd_job;

/* Rows to lanes: the item's lanes' rows of x (attn__cpu_lane_rows). */
static const float *lane_rows(const fwd_job *jb, const fwd_item *it, attn__view x, attn_dtype t,
                              int D, float *buf, int64_t *ld) {
  return attn__cpu_lane_rows(jb->ops, x, t, it->b, it->r0, it->h, it->nh, it->rows, D, buf, ld);
}

static void pack_qt(const fwd_job *jb, const fwd_item *it, fwd_work *w) {
  const attn__problem *pb = jb->pb;
  const float qs = attn__cpu_q_scale(pb);
  int64_t ld;
  const float *q = lane_rows(jb, it, pb->q, pb->dtype, (int)pb->Dqk, w->cv, &ld);
  jb->ops->pack_t(w->qt, q, ld, it->nh * it->rows, (int)pb->Dqk, qs);
}

/* Row kernels' buffers (see fwd_work). */
static float *rows_s(fwd_work *w) { return w->s; }
static float *rows_q(fwd_work *w) { return w->qt; }
static float *rows_o(fwd_work *w) { return w->ro; }

/* The row kernels' Q rows (scaled) and O rows (from w->ot, the state) of the item. */
static void rows_begin(const fwd_job *jb, const fwd_item *it, fwd_work *w) {
  const attn__problem *pb = jb->pb;
  const float qs = attn__cpu_q_scale(pb);
  const int u = it->nh * it->rows;
  int64_t ld;
  const float *q = lane_rows(jb, it, pb->q, pb->dtype, (int)pb->Dqk, w->cv, &ld);
  float *qr = rows_q(w); /* [u][Dqk], u <= CPU_BR */
  for (int L = 0; L < u; L++)
    for (int64_t d = 0; d < pb->Dqk; d++) qr[L * pb->Dqk + d] = q[L * ld + d] * qs;
  jb->ops->unpack_t(rows_o(w), pb->Dv, w->ot, u, (int)pb->Dv, NULL);
}

/* The bf16 tiles' Q^T (from the lanes' rows) and O rows (from w->ot, the state; the
 * padding lanes 0), and the tile configuration of this thread. */
static void bf16_begin(const fwd_job *jb, const fwd_item *it, fwd_work *w) {
  const attn__problem *pb = jb->pb;
  const int u = it->nh * it->rows, Dv = (int)pb->Dv;
  if (it->nh == 1) { /* one head's rows, read as bf16 where they lie */
    jb->bf16->pack_lanes((uint16_t *)w->qt, attn__cpu_row(pb->q, ATTN_BF16, it->b, it->r0, it->h),
                         pb->q.ss, u, (int)pb->Dqk);
  } else {
    int64_t ld;
    const float *q = lane_rows(jb, it, pb->q, pb->dtype, (int)pb->Dqk, w->cv, &ld);
    jb->bf16->pack_q((uint16_t *)w->qt, q, ld, u, (int)pb->Dqk);
  }
  jb->ops->unpack_t(rows_o(w), Dv, w->ot, u, Dv, NULL);
  memset(rows_o(w) + (size_t)u * Dv, 0, (size_t)(CPU_BR - u) * Dv * sizeof(float));
  jb->bf16->begin();
}

/* V's packed pairs of key tile t when [ca, ca + nj) is the whole tile, else NULL. */
static const uint16_t *vpk_tile(const fwd_job *jb, int64_t b, int64_t hk, int64_t t,
                                int64_t ca, int nj) {
  const attn__problem *pb = jb->pb;
  const int64_t end = (t + 1) * CPU_BC < pb->skv ? (t + 1) * CPU_BC : pb->skv;
  if (!jb->vpk || ca != t * CPU_BC || ca + nj != end) return NULL;
  return jb->vpk + ((size_t)(b * pb->Hkv + hk) * jb->ntk + t) * CPU_BC * pb->Dv;
}

/* Packs every key tile's V pairs into jb->vpk (inside the parallel region: a work-shared
 * loop, then its barrier). */
static void vpk_fill(const fwd_job *jb) {
  const attn__problem *pb = jb->pb;
  const int64_t n = pb->B * pb->Hkv * jb->ntk;
#pragma omp for schedule(static)
  for (int64_t u = 0; u < n; u++) {
    const int64_t t = u % jb->ntk, bh = u / jb->ntk, b = bh / pb->Hkv, hk = bh % pb->Hkv;
    const int64_t ca = t * CPU_BC, cb = ca + CPU_BC < pb->skv ? ca + CPU_BC : pb->skv;
    jb->bf16->pack_pairs(jb->vpk + (size_t)u * CPU_BC * pb->Dv,
                         attn__cpu_row(pb->v, ATTN_BF16, b, ca, hk), pb->v.ss, (int)(cb - ca),
                         (int)pb->Dv);
  }
}

/* One key tile [ca, ca + nj) of tile index t on the bf16 tiles: state in rows_o. */
static void bf16_tile(const fwd_job *jb, const fwd_item *it, fwd_work *w, int64_t hk,
                     int64_t t, int64_t ca, int nj) {
  const attn__problem *pb = jb->pb;
  const int Dqk = (int)pb->Dqk, Dv = (int)pb->Dv;
  uint16_t *P = w->bf, *kpad = P + CPU_BR * CPU_BC, *vv = kpad + 32 * Dqk;
  const uint16_t *k = attn__cpu_row(pb->k, ATTN_BF16, it->b, ca, hk);
  const uint16_t *v = attn__cpu_row(pb->v, ATTN_BF16, it->b, ca, hk);
  jb->bf16->scores(w->s, k, pb->k.ss, nj, (const uint16_t *)w->qt, w->ti.lanes, Dqk, kpad);
  jb->bf16->softmax(w->s, nj, &w->ti, attn__cpu_q_scale(pb), w->m, w->l, w->alpha, P);
  const int safe = attn__cpu_tile_nonfinite(jb->vbad, jb->ops, it->b, hk, t);
  const uint16_t *vp = vpk_tile(jb, it->b, hk, t, ca, nj);
  if (!vp && !safe) {
    jb->bf16->pack_pairs(vv, v, pb->v.ss, nj, Dv);
    vp = vv;
  }
  jb->bf16->pv(rows_o(w), Dv, P, vp, v, pb->v.ss, nj, w->ti.lanes, w->alpha, safe);
}

/* Keys [c0, c1) of KV head hk of batch b of x (D wide) as rows to prefetch. */
static cpu_prefetch kv_rows(const attn__problem *pb, attn__view x, int64_t b, int64_t hk,
                            int64_t c0, int64_t c1, int64_t D) {
  const int64_t es = (int64_t)attn_dtype_size(pb->dtype);
  if (c0 >= c1) return (cpu_prefetch){NULL, 0, 0, 0};
  return (cpu_prefetch){attn__cpu_row(x, pb->dtype, b, c0, hk), x.ss * es,
                        (int)attn__view_run(x, c0, c1 - c0), (int)(D * es)}; /* a page's */
}

/* One KV group's lanes [L0, L0 + ug) through the row kernels on keys [ca, cb) of KV head
 * hk (state in rows_o); `next` is what the tile loop reads after this group's P·V. */
static void rows_group(const fwd_job *jb, const fwd_item *it, fwd_work *w, int64_t hk, int L0,
                       int ug, int64_t ca, int64_t cb, const cpu_prefetch *next) {
  const attn__problem *pb = jb->pb;
  const cpu_tile_ops *ops = jb->ops;
  const int Dqk = (int)pb->Dqk, Dv = (int)pb->Dv, nj = (int)(cb - ca);
  int64_t ld;
  const float *kt = attn__cpu_rows_f32(ops, pb->k, pb->dtype, it->b, ca, hk, nj, Dqk, w->cv,
                                       &ld); /* [nj] rows */
  const cpu_prefetch vrows = kv_rows(pb, pb->v, it->b, hk, ca, cb, Dv);
  ops->scores_rows(rows_s(w), kt, ld, nj, rows_q(w) + (size_t)L0 * Dqk, Dqk, ug, Dqk, &vrows);
  ops->softmax_rows(rows_s(w), nj, ug, &w->ti, L0, w->m + L0, w->l + L0, w->alpha + L0);
  const float *vt = attn__cpu_rows_f32(ops, pb->v, pb->dtype, it->b, ca, hk, nj, Dv, w->cv,
                                       &ld); /* K's rows are done */
  ops->pv_rows(rows_o(w) + (size_t)L0 * Dv, Dv, vt, ld, nj, rows_s(w), ug, Dv, w->alpha + L0,
               next);
}

/* Folds split `split` of `nsplit` of the item's visible key tiles into w's state;
 * returns the tiles computed (flops added to *flops). When each KV group's lanes fit the
 * row kernels (CPU_ROWS_MAX), through them, group after group on each tile (state in
 * rows_o meanwhile); else through the tile kernels (then the item is one group). */
static int64_t run_tiles(const fwd_job *jb, const fwd_item *it, fwd_work *w, int split,
                         int nsplit, double *flops) {
  const attn__problem *pb = jb->pb;
  const cpu_tile_ops *ops = jb->ops;
  const cpu_segment *seg = &jb->segs[it->seg];
  const int64_t G = pb->Hq / pb->Hkv, hk0 = it->h / G;
  const int hg = it->nh < G ? it->nh : (int)G, ng = it->nh / hg, ug = hg * it->rows;
  const int u = it->nh * it->rows, by_rows = ug <= CPU_ROWS_MAX, by_bf16 = !by_rows && jb->bf16;
  const int Dqk = (int)pb->Dqk, Dv = (int)pb->Dv;
  int64_t kc0, kc1, computed = 0;
  attn__cpu_key_range(pb, seg, it->r0, it->rows, &kc0, &kc1);
  if (kc0 >= kc1) return 0;
  if (by_rows) rows_begin(jb, it, w);
  else if (by_bf16) bf16_begin(jb, it, w);
  else pack_qt(jb, it, w);
  const int64_t t0 = kc0 / CPU_BC, nt = (kc1 - 1) / CPU_BC + 1 - t0;
  const int64_t t_end = t0 + nt * (split + 1) / nsplit;
  for (int64_t t = t0 + nt * split / nsplit; t < t_end; t++) {
    int64_t ca = t * CPU_BC > kc0 ? t * CPU_BC : kc0;
    int64_t cb = (t + 1) * CPU_BC < kc1 ? (t + 1) * CPU_BC : kc1;
    int nj = (int)(cb - ca);
    if (!attn__cpu_tile_info(pb, seg, it->h, it->nh, it->r0, it->rows, ca, cb, &w->ti, w->elem))
      continue;
    computed++;
    *flops += 2.0 * u * nj * (double)(pb->Dqk + pb->Dv);
    if (by_rows) {
      /* after each group's P·V: the next group's K rows, or the next tile's first */
      int64_t nb = (t + 2) * CPU_BC < kc1 ? (t + 2) * CPU_BC : kc1;
      if (t + 1 >= t_end) nb = cb; /* the split ends here: nothing */
      for (int g = 0; g < ng; g++) {
        const cpu_prefetch next = g + 1 < ng ? kv_rows(pb, pb->k, it->b, hk0 + g + 1, ca, cb, Dqk)
                                             : kv_rows(pb, pb->k, it->b, hk0, cb, nb, Dqk);
        rows_group(jb, it, w, hk0 + g, g * ug, ug, ca, cb, &next);
      }
      continue;
    }
    if (by_bf16) {
      bf16_tile(jb, it, w, hk0, t, ca, nj);
      continue;
    }
    int64_t ld;
    const float *kt = attn__cpu_rows_f32(ops, pb->k, pb->dtype, it->b, ca, hk0, nj, Dqk, w->cv,
                                         &ld); /* [nj] rows */
    ops->gemm(w->s, CPU_BR, kt, 1, ld, w->qt, CPU_BR, nj, w->ti.lanes, Dqk, NULL, CPU_GEMM_SET, 0);
    ops->softmax_fwd(w->s, nj, &w->ti, w->m, w->l, w->alpha);
    const float *vt = attn__cpu_rows_f32(ops, pb->v, pb->dtype, it->b, ca, hk0, nj, Dv, w->cv,
                                         &ld); /* K's rows are done */
    ops->gemm(w->ot, CPU_BR, vt, ld, 1, w->s, CPU_BR, Dv, w->ti.lanes, nj, w->alpha,
              CPU_GEMM_SCALE_ADD, attn__cpu_tile_nonfinite(jb->vbad, ops, it->b, hk0, t));
  }
  if (by_bf16) jb->bf16->end();
  if (by_rows || by_bf16) ops->pack_t(w->ot, rows_o(w), pb->Dv, u, Dv, 1.0f); /* the state */
  return computed;
}

/* Statistics of an item: tiles of its segment's key range not computed were skipped; a
 * tile counts once per head it carries. */
static void count_item(const fwd_job *jb, const fwd_item *it, int64_t computed, double flops) {
  const cpu_segment *seg = &jb->segs[it->seg];
  int64_t all = seg->c1 > seg->c0 ? (seg->c1 - 1) / CPU_BC - seg->c0 / CPU_BC + 1 : 0;
  attn__cpu_count(jb->ctx, computed * it->nh, (all - computed) * it->nh, flops);
}

static void state_zero(const attn__problem *pb, fwd_work *w) {
  for (int i = 0; i < CPU_BR; i++) {
    w->m[i] = -INFINITY;
    w->l[i] = 0.0f;
  }
  memset(w->ot, 0, (size_t)pb->Dv * CPU_BR * sizeof(float));
}

/* Lanes to rows: w->ot's lanes, times scale[L] (NULL: 1), to the rows of each head of x
 * (dtype t): straight for one float32 head, else through w->cv. */
static void store_lanes(const fwd_job *jb, const fwd_item *it, fwd_work *w, attn__view x,
                        attn_dtype t, int D, const float *scale) {
  if (t == ATTN_F32 && it->nh == 1) {
    jb->ops->unpack_t(attn__cpu_row(x, t, it->b, it->r0, it->h), x.ss, w->ot, it->rows, D, scale);
    return;
  }
  jb->ops->unpack_t(w->cv, D, w->ot, it->nh * it->rows, D, scale);
  for (int g = 0; g < it->nh; g++) {
    const float *s = w->cv + (size_t)g * it->rows * D; /* [rows][D] */
    void *x0 = attn__cpu_row(x, t, it->b, it->r0, it->h + g); /* row i at x0 + i*x.ss */
    if (t != ATTN_F32) {
      jb->ops->rows_out(x0, x.ss, t, s, D, it->rows, D);
      continue;
    }
    for (int i = 0; i < it->rows; i++)
      memcpy((float *)x0 + i * x.ss, s + (size_t)i * D, (size_t)D * sizeof(float));
  }
}

/* Index of lane L's row in a [B][Hq][rows_total] array (the LSE, st->m, st->l). */
static int64_t lane_row(const attn__problem *pb, const fwd_item *it, int64_t rows_total, int L) {
  return (it->b * pb->Hq + it->h + L / it->rows) * rows_total + pb->q_row0 + it->r0 +
         L % it->rows;
}

/* Writes O rows and LSE of the item; sinks enter the denominator here only. */
static void finalize_rows(const fwd_job *jb, const fwd_item *it, fwd_work *w, attn__view o,
                          float *lse, int64_t lse_rows) {
  const attn__problem *pb = jb->pb;
  float inv[CPU_BR];
  for (int L = 0; L < it->nh * it->rows; L++) {
    const float sink2 = pb->sinks ? pb->sinks[it->h + L / it->rows] * CPU_LOG2E : -INFINITY;
    float m2 = w->m[L], top = m2 > sink2 ? m2 : sink2, lse2 = -INFINITY;
    inv[L] = 0.0f;
    if (top != -INFINITY) {
      float sm = exp2f(m2 - top), z = w->l[L] * sm + exp2f(sink2 - top);
      inv[L] = sm / z;
      lse2 = top + log2f(z);
    }
    if (lse) lse[lane_row(pb, it, lse_rows, L)] = lse2 / CPU_LOG2E;
  }
  store_lanes(jb, it, w, o, pb->dtype, (int)pb->Dv, inv);
}

/* st->acc [B][Hq][st->rows][Dv] as a view whose row (b, s, h) is the state row of local
 * query row s of head h. */
static attn__view acc_view(const attn__problem *pb, const attn_state *st) {
  return attn__view_of(st->acc + pb->q_row0 * pb->Dv, pb->Hq * st->rows * pb->Dv, pb->Dv,
                       st->rows * pb->Dv);
}

static void state_load(const fwd_job *jb, const fwd_item *it, const attn_state *st,
                       fwd_work *w) {
  const attn__problem *pb = jb->pb;
  state_zero(pb, w);
  for (int L = 0; L < it->nh * it->rows; L++) {
    int64_t r = lane_row(pb, it, st->rows, L);
    w->m[L] = st->m[r] * CPU_LOG2E;
    w->l[L] = st->l[r];
  }
  int64_t ld;
  const float *acc = lane_rows(jb, it, acc_view(pb, st), ATTN_F32, (int)pb->Dv, w->cv, &ld);
  jb->ops->pack_t(w->ot, acc, ld, it->nh * it->rows, (int)pb->Dv, 1.0f);
}

static void state_store(const fwd_job *jb, const fwd_item *it, attn_state *st, fwd_work *w) {
  const attn__problem *pb = jb->pb;
  for (int L = 0; L < it->nh * it->rows; L++) {
    int64_t r = lane_row(pb, it, st->rows, L);
    st->m[r] = w->m[L] / CPU_LOG2E;
    st->l[r] = w->l[L];
  }
  store_lanes(jb, it, w, acc_view(pb, st), ATTN_F32, (int)pb->Dv, NULL);
}

/* The forward's tile workspace is kept per thread between calls (a few hundred KB that
 * would otherwise be fresh, page-faulting memory on every call), under a thread key whose
 * destructor frees it when the thread ends (OpenMP teams come and go). */
typedef struct {
  fwd_work w;
  size_t floats; /* of w.qt's block */
} cached_work;

static pthread_key_t work_key;
static pthread_once_t work_once = PTHREAD_ONCE_INIT;
static int work_key_ok;

static void work_free(void *p) {
  cached_work *c = p;
  free(c->w.qt);
  free(c);
}

static void work_key_init(void) { work_key_ok = pthread_key_create(&work_key, work_free) == 0; }

static fwd_work *work_get(const attn__problem *pb) {
  size_t qt = (size_t)pb->Dqk * CPU_BR, ot = (size_t)pb->Dv * CPU_BR;
  size_t cv = (size_t)CPU_BC * (size_t)(pb->Dqk > pb->Dv ? pb->Dqk : pb->Dv);
  size_t bfb = ((size_t)CPU_BR * CPU_BC + 32 * (size_t)pb->Dqk + (size_t)CPU_BC * pb->Dv) / 2;
  size_t floats = qt + (size_t)CPU_BC * CPU_BR + 2 * ot + cv + bfb;
  pthread_once(&work_once, work_key_init);
  if (!work_key_ok) return NULL;
  cached_work *c = pthread_getspecific(work_key);
  if (!c) {
    c = aligned_alloc(64, (sizeof *c + 63) / 64 * 64);
    if (!c) return NULL;
    c->w.qt = NULL;
    c->floats = 0;
    if (pthread_setspecific(work_key, c) != 0) {
      free(c);
      return NULL;
    }
  }
  if (floats > c->floats) {
    free(c->w.qt);
    c->w.qt = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
    c->floats = c->w.qt ? floats : 0;
    if (!c->w.qt) return NULL;
  }
  fwd_work *w = &c->w;
  w->s = w->qt + qt;
  w->ot = w->s + (size_t)CPU_BC * CPU_BR;
  w->ro = w->ot + ot;
  w->cv = w->ro + ot;
  w->bf = (uint16_t *)(w->cv + cv);
  return w;
}

/* Items: (b, heads, segment, query tile), heaviest (most keys) first for dynamic balance;
 * a short tile's item carries as many heads of its GQA group as fit in its lanes. */
static int64_t fill_items(const attn__problem *pb, const cpu_segment *segs, int nseg,
                          fwd_item *items /* NULL: count only */) {
  const int64_t G = pb->Hq / pb->Hkv;
  int64_t k = 0;
  for (int s = 0; s < nseg; s++)
    for (int64_t r0 = segs[s].r1; r0 > segs[s].r0;) {
      int64_t a = r0 - CPU_BR > segs[s].r0 ? r0 - CPU_BR : segs[s].r0;
      const int rows = (int)(r0 - a), pack = attn__cpu_pack_heads(pb, rows);
      for (int64_t b = 0; b < pb->B; b++) {
        if (segs[s].batch1 && segs[s].batch1 != b + 1) continue; /* another batch's */
        for (int64_t h = 0, nh; h < pb->Hq; h += nh) {
          /* within one group, or whole groups (h at a group's first head) */
          nh = pack >= G ? (pack < pb->Hq - h ? pack : pb->Hq - h)
                         : (pack < G - h % G ? pack : G - h % G);
          if (items) items[k] = (fwd_item){(int32_t)b, (int32_t)h, (int32_t)nh, s, rows, a};
          k++;
        }
      }
      r0 = a;
    }
  return k;
}

static attn_status make_items(const attn__problem *pb, const cpu_segment *segs, int nseg,
                              fwd_item **out, int64_t *count) {
  int64_t n = fill_items(pb, segs, nseg, NULL);
  fwd_item *items = malloc((size_t)(n > 0 ? n : 1) * sizeof *items);
  if (!items)
    return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "work list (%lld items) allocation failed", (long long)n);
  *count = fill_items(pb, segs, nseg, items);
  *out = items;
  return ATTN_OK;
}

/* ---- key splits ------------------------------------------------------------------
 * With fewer items than threads (decode, or a long sequence of few heads) each item's key
 * tiles are cut into splits that run as units of their own, each with a fresh state
 * (split 0 starts from the block state), merged afterwards in split order: the result
 * depends on the thread count only through that choice. */
static int choose_splits(const attn__problem *pb, int64_t nitems, int threads) {
  int64_t tiles = (pb->skv + CPU_BC - 1) / CPU_BC, most = tiles / 2; /* two tiles a split */
  return attn__cpu_splits(nitems, threads, most < 64 ? most : 64);
}

/* A unit's partial state: m, l [CPU_BR] and ot [Dv][CPU_BR], then the tiles computed. */
static size_t part_floats(const attn__problem *pb) { return (size_t)(pb->Dv + 2) * CPU_BR + 2; }

static void part_save(const attn__problem *pb, const fwd_work *w, float *p, int64_t computed) {
  memcpy(p, w->m, sizeof w->m);
  memcpy(p + CPU_BR, w->l, sizeof w->l);
  memcpy(p + 2 * CPU_BR, w->ot, (size_t)pb->Dv * CPU_BR * sizeof(float));
  p[(pb->Dv + 2) * CPU_BR] = (float)computed; /* < 2^24 tiles an item */
}

/* w's state := merge(w's state, partial p) over `used` lanes (log2 units). */
static void part_merge(const attn__problem *pb, fwd_work *w, const float *p, int used) {
  const float *pm = p, *pl = p + CPU_BR, *po = p + 2 * CPU_BR;
  float a[CPU_BR], b[CPU_BR];
  for (int L = 0; L < used; L++) {
    float m = w->m[L] > pm[L] ? w->m[L] : pm[L];
    a[L] = m == -INFINITY ? 0.0f : exp2f(w->m[L] - m); /* both empty: acc stays 0 */
    b[L] = m == -INFINITY ? 0.0f : exp2f(pm[L] - m);
    w->l[L] = w->l[L] * a[L] + pl[L] * b[L];
    w->m[L] = m;
  }
  for (int64_t d = 0; d < pb->Dv; d++)
    for (int L = 0; L < used; L++)
      w->ot[d * CPU_BR + L] = w->ot[d * CPU_BR + L] * a[L] + po[d * CPU_BR + L] * b[L];
}

/* Unit u = (item u / nsplit, split u % nsplit): split 0 starts from the block state (st),
 * others from empty; with one split the item is finished here, else saved to part. */
static void run_unit(const fwd_job *jb, const fwd_item *it, int split, int nsplit,
                     fwd_work *w, attn_state *st, attn__view o, float *lse, int64_t lse_rows,
                     float *part) {
  if (st && split == 0) state_load(jb, it, st, w);
  else state_zero(jb->pb, w);
  double flops = 0;
  int64_t computed = run_tiles(jb, it, w, split, nsplit, &flops);
  if (nsplit > 1) {
    attn__cpu_count(jb->ctx, computed * it->nh, 0, flops);
    part_save(jb->pb, w, part, computed);
    return;
  }
  count_item(jb, it, computed, flops);
  if (st) state_store(jb, it, st, w);
  else finalize_rows(jb, it, w, o, lse, lse_rows);
}

/* Merges the item's nsplit partials (in split order) and finishes it. */
static void finish_splits(const fwd_job *jb, const fwd_item *it, int nsplit, fwd_work *w,
                          attn_state *st, attn__view o, float *lse, int64_t lse_rows,
                          const float *part /* [nsplit][part_floats] */) {
  const attn__problem *pb = jb->pb;
  const size_t pf = part_floats(pb);
  int64_t computed = 0;
  state_zero(pb, w);
  for (int s = 0; s < nsplit; s++) {
    part_merge(pb, w, part + s * pf, it->nh * it->rows);
    computed += (int64_t)part[s * pf + (pb->Dv + 2) * CPU_BR];
  }
  count_item(jb, it, computed, 0.0); /* the units counted their flops */
  if (st) state_store(jb, it, st, w);
  else finalize_rows(jb, it, w, o, lse, lse_rows);
}

/* st == NULL: one shot into o/lse; else fold into st. */
static attn_status run_fwd(attn_ctx_t ctx, const attn__problem *pb, attn_state *st,
                           attn__view o, float *lse, int64_t lse_rows) {
  cpu_backend *be = ctx->backend_data;
  cpu_segment *segs = NULL;
  fwd_item *items = NULL;
  float *part = NULL;
  int nseg = 0;
  int64_t nitems = 0;
  ATTN_CHECK(attn__cpu_segments(pb, &segs, &nseg));
  attn_status status = make_items(pb, segs, nseg, &items, &nitems);
  cpu_tile_flags vbad = {0};
  /* the bf16 tile products read K/V rows evenly strided: paged, only pages of whole tiles */
  const int paged = pb->k.pages != NULL, cache = paged || pb->kv_used;
  const cpu_bf16_ops *bf16 =
      paged && pb->k.page_rows % CPU_BC ? NULL : attn__cpu_bf16_for(be, pb);
  fwd_job jb = {pb, be->ops, segs, &vbad, bf16, ctx, NULL, (pb->skv + CPU_BC - 1) / CPU_BC};
  if (status == ATTN_OK)
    status = attn__cpu_flags_init(&vbad, pb->v, pb->dtype, pb->B, pb->skv, pb->Hkv, pb->Dv);
  vbad.kv_used = pb->kv_used;
  vbad.k_pos0 = pb->k_pos0;
  /* V's pairs packed once when each KV head has query tiles to share them (a pack a tile
   * cost 6% of the forward at 4K), within a bound on the copy; else a pack a tile. Not for
   * a KV cache, whose rows past the used ones may lie in no page. */
  const size_t vpk_bytes = (size_t)(pb->B * pb->Hkv * jb.ntk) * CPU_BC * (size_t)pb->Dv * 2;
  if (status == ATTN_OK && bf16 && !cache && nitems >= 2 * pb->B * pb->Hkv &&
      pb->sq > CPU_ROWS_MAX && vpk_bytes <= CPU_VPK_MAX_BYTES)
    jb.vpk = aligned_alloc(64, (vpk_bytes + 63) / 64 * 64); /* NULL: a pack a tile */
  const int nsplit = choose_splits(pb, nitems, be->threads);
  const size_t pf = part_floats(pb);
  if (status == ATTN_OK && nsplit > 1) {
    part = malloc((size_t)nitems * (size_t)nsplit * pf * sizeof(float));
    if (!part)
      status = attn__fail(ATTN_ERR_OUT_OF_MEMORY, "key-split states (%lld x %d) allocation failed",
                          (long long)nitems, nsplit);
  }
  int failed = 0;
  if (status == ATTN_OK) {
#pragma omp parallel num_threads(be->threads)
    {
      fwd_work *w = work_get(pb);
      if (!w) {
#pragma omp atomic write
        failed = 1;
      }
      if (jb.vpk) vpk_fill(&jb);
#pragma omp for schedule(dynamic, 1)
      for (int64_t u = 0; u < nitems * nsplit; u++)
        if (w)
          run_unit(&jb, &items[u / nsplit], (int)(u % nsplit), nsplit, w, st, o, lse, lse_rows,
                   part ? part + (size_t)u * pf : NULL);
      if (nsplit > 1) {
#pragma omp for schedule(dynamic, 1)
        for (int64_t n = 0; n < nitems; n++)
          if (w)
            finish_splits(&jb, &items[n], nsplit, w, st, o, lse, lse_rows,
                          part + (size_t)n * nsplit * pf);
      }
    }
    if (failed) status = attn__fail(ATTN_ERR_OUT_OF_MEMORY, "per-thread tile workspace allocation failed");
  }
  free(part);
  free(jb.vpk);
  attn__cpu_flags_free(&vbad);
  free(items);
  free(segs);
  return status;
}

attn_status attn__cpu_fwd(attn_ctx_t ctx, const attn__problem *pb, attn__view o, float *lse,
                          int64_t lse_rows) {
  return run_fwd(ctx, pb, NULL, o, lse, lse_rows);
}

attn_status attn__cpu_fwd_block(attn_ctx_t ctx, const attn__problem *pb, attn_state *st) {
  attn__view none = {0};
  return run_fwd(ctx, pb, st, none, NULL, 0);
}
