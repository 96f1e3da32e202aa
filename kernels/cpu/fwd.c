/* fwd.c — CPU flash forward: one query tile at a time against the visible key tiles,
 * carrying a float32 (m, l, acc) state; one-shot (state in registers/L1, written as O and
 * LSE) or block mode (state loaded from and stored to an attn_state). */
#include "convert.h"
#include "cpu.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  int32_t b, h, seg;
  int32_t rows;
  int64_t r0;
} fwd_item;

typedef struct {
  float *qt;    /* [Dqk][CPU_BR] scaled Q^T */
  float *s;     /* [CPU_BC][CPU_BR] S^T, then P^T */
  float *ot;    /* [Dv][CPU_BR] unnormalised O^T */
  float *cv;    /* [CPU_BC][max(Dqk, Dv)] bf16/f16 rows as float32: Q, a K or V tile, O */
  float m[CPU_BR], l[CPU_BR], alpha[CPU_BR]; /* log2 units */
  uint8_t elem[CPU_BC * CPU_BR];
  cpu_tile_info ti;
} fwd_work;

typedef struct {
  const attn__problem *pb;
  const cpu_tile_ops *ops;
  const cpu_segment *segs;
  const uint8_t *vbad; /* [B][Hkv][nkt] */
  int64_t nkt;
  attn_ctx_t ctx;
} fwd_job;

static void pack_qt(const fwd_job *jb, const fwd_item *it, fwd_work *w) {
  const attn__problem *pb = jb->pb;
  const float qs = pb->softcap > 0.0f ? pb->scale / pb->softcap : pb->scale * CPU_LOG2E;
  int64_t ld;
  const float *q = attn__cpu_rows_f32(jb->ops, pb->q, pb->dtype, it->b, it->r0, it->h, it->rows,
                                      (int)pb->Dqk, w->cv, &ld);
  jb->ops->pack_t(w->qt, q, ld, it->rows, (int)pb->Dqk, qs);
}

/* Folds the visible key tiles of the item into w's state. */
static void run_tiles(const fwd_job *jb, const fwd_item *it, fwd_work *w) {
  const attn__problem *pb = jb->pb;
  const cpu_segment *seg = &jb->segs[it->seg];
  const int64_t hk = it->h / (pb->Hq / pb->Hkv);
  int64_t kc0, kc1, computed = 0;
  attn__cpu_key_range(pb, seg, it->r0, it->rows, &kc0, &kc1);
  double flops = 0;
  for (int64_t t = kc0 / CPU_BC; t * CPU_BC < kc1; t++) {
    int64_t ca = t * CPU_BC > kc0 ? t * CPU_BC : kc0;
    int64_t cb = (t + 1) * CPU_BC < kc1 ? (t + 1) * CPU_BC : kc1;
    int nj = (int)(cb - ca);
    if (!attn__cpu_tile_info(pb, seg, it->h, it->r0, it->rows, ca, cb, &w->ti, w->elem))
      continue;
    int64_t ld;
    const float *kt = attn__cpu_rows_f32(jb->ops, pb->k, pb->dtype, it->b, ca, hk, nj,
                                         (int)pb->Dqk, w->cv, &ld); /* [nj] rows */
    jb->ops->gemm(w->s, CPU_BR, kt, 1, ld, w->qt, CPU_BR, nj, CPU_BR, (int)pb->Dqk, NULL,
                  CPU_GEMM_SET, 0);
    jb->ops->softmax_fwd(w->s, nj, &w->ti, w->m, w->l, w->alpha);
    int safe = jb->vbad[(it->b * pb->Hkv + hk) * jb->nkt + t];
    const float *vt = attn__cpu_rows_f32(jb->ops, pb->v, pb->dtype, it->b, ca, hk, nj,
                                         (int)pb->Dv, w->cv, &ld); /* K's rows are done */
    jb->ops->gemm(w->ot, CPU_BR, vt, ld, 1, w->s, CPU_BR, (int)pb->Dv, CPU_BR, nj, w->alpha,
                  CPU_GEMM_SCALE_ADD, safe);
    computed++;
    flops += 2.0 * it->rows * nj * (double)(pb->Dqk + pb->Dv);
  }
  /* Tiles of the segment's key range never visited are skipped too. */
  int64_t all = seg->c1 > seg->c0 ? (seg->c1 - 1) / CPU_BC - seg->c0 / CPU_BC + 1 : 0;
  attn__cpu_count(jb->ctx, computed, all - computed, flops);
}

static void state_zero(const attn__problem *pb, fwd_work *w) {
  for (int i = 0; i < CPU_BR; i++) {
    w->m[i] = -INFINITY;
    w->l[i] = 0.0f;
  }
  memset(w->ot, 0, (size_t)pb->Dv * CPU_BR * sizeof(float));
}

/* Writes O rows and LSE of the item; sinks enter the denominator here only. */
static void finalize_rows(const fwd_job *jb, const fwd_item *it, fwd_work *w, attn__view o,
                          float *lse, int64_t lse_rows) {
  const attn__problem *pb = jb->pb;
  const float sink2 = pb->sinks ? pb->sinks[it->h] * CPU_LOG2E : -INFINITY;
  float inv[CPU_BR];
  for (int i = 0; i < it->rows; i++) {
    float m2 = w->m[i], top = m2 > sink2 ? m2 : sink2, lse2 = -INFINITY;
    inv[i] = 0.0f;
    if (top != -INFINITY) {
      float sm = exp2f(m2 - top), z = w->l[i] * sm + exp2f(sink2 - top);
      inv[i] = sm / z;
      lse2 = top + log2f(z);
    }
    if (lse) lse[(it->b * pb->Hq + it->h) * lse_rows + pb->q_row0 + it->r0 + i] = lse2 / CPU_LOG2E;
  }
  void *o0 = attn__cpu_row(o, pb->dtype, it->b, it->r0, it->h); /* row i at o0 + i*o.ss */
  if (pb->dtype == ATTN_F32) {
    jb->ops->unpack_t(o0, o.ss, w->ot, it->rows, (int)pb->Dv, inv);
    return;
  }
  jb->ops->unpack_t(w->cv, pb->Dv, w->ot, it->rows, (int)pb->Dv, inv);
  jb->ops->rows_out(o0, o.ss, pb->dtype, w->cv, pb->Dv, it->rows, (int)pb->Dv);
}

static void state_load(const fwd_job *jb, const fwd_item *it, const attn_state *st,
                       fwd_work *w) {
  const attn__problem *pb = jb->pb;
  state_zero(pb, w);
  int64_t row = (it->b * pb->Hq + it->h) * st->rows + pb->q_row0 + it->r0;
  for (int i = 0; i < it->rows; i++) {
    w->m[i] = st->m[row + i] * CPU_LOG2E;
    w->l[i] = st->l[row + i];
  }
  jb->ops->pack_t(w->ot, st->acc + row * pb->Dv, pb->Dv, it->rows, (int)pb->Dv, 1.0f);
}

static void state_store(const fwd_job *jb, const fwd_item *it, attn_state *st,
                        const fwd_work *w) {
  const attn__problem *pb = jb->pb;
  int64_t row = (it->b * pb->Hq + it->h) * st->rows + pb->q_row0 + it->r0;
  for (int i = 0; i < it->rows; i++) {
    st->m[row + i] = w->m[i] / CPU_LOG2E;
    st->l[row + i] = w->l[i];
  }
  jb->ops->unpack_t(st->acc + row * pb->Dv, pb->Dv, w->ot, it->rows, (int)pb->Dv, NULL);
}

/* The forward's tile workspace is kept per thread between calls (a few hundred KB that
 * would otherwise be fresh, page-faulting memory on every call). */
static _Thread_local fwd_work *cached_work;
static _Thread_local size_t cached_floats;

static fwd_work *work_get(const attn__problem *pb) {
  size_t qt = (size_t)pb->Dqk * CPU_BR, ot = (size_t)pb->Dv * CPU_BR;
  size_t cv = (size_t)CPU_BC * (size_t)(pb->Dqk > pb->Dv ? pb->Dqk : pb->Dv);
  size_t floats = qt + (size_t)CPU_BC * CPU_BR + ot + cv;
  if (!cached_work) {
    cached_work = aligned_alloc(64, (sizeof(fwd_work) + 63) / 64 * 64);
    if (!cached_work) return NULL;
    cached_work->qt = NULL;
  }
  if (floats > cached_floats) {
    free(cached_work->qt);
    cached_work->qt = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
    cached_floats = cached_work->qt ? floats : 0;
    if (!cached_work->qt) return NULL;
  }
  fwd_work *w = cached_work;
  w->s = w->qt + qt;
  w->ot = w->s + (size_t)CPU_BC * CPU_BR;
  w->cv = w->ot + ot;
  return w;
}

/* Items: (b, h, segment, query tile), heaviest (most keys) first for dynamic balance. */
static attn_status make_items(const attn__problem *pb, const cpu_segment *segs, int nseg,
                              fwd_item **out, int64_t *count) {
  int64_t n = 0;
  for (int s = 0; s < nseg; s++) n += (segs[s].r1 - segs[s].r0 + CPU_BR - 1) / CPU_BR;
  n *= pb->B * pb->Hq;
  fwd_item *items = malloc((size_t)(n > 0 ? n : 1) * sizeof *items);
  if (!items) return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "work list (%lld items) allocation failed", (long long)n);
  int64_t k = 0;
  for (int s = 0; s < nseg; s++)
    for (int64_t r0 = segs[s].r1; r0 > segs[s].r0;) {
      int64_t a = r0 - CPU_BR > segs[s].r0 ? r0 - CPU_BR : segs[s].r0;
      for (int64_t b = 0; b < pb->B; b++)
        for (int64_t h = 0; h < pb->Hq; h++)
          items[k++] = (fwd_item){(int32_t)b, (int32_t)h, s, (int32_t)(r0 - a), a};
      r0 = a;
    }
  *out = items;
  *count = k;
  return ATTN_OK;
}

/* st == NULL: one shot into o/lse; else fold into st. */
static attn_status run_fwd(attn_ctx_t ctx, const attn__problem *pb, attn_state *st,
                           attn__view o, float *lse, int64_t lse_rows) {
  cpu_backend *be = ctx->backend_data;
  cpu_segment *segs = NULL;
  fwd_item *items = NULL;
  int nseg = 0;
  int64_t nitems = 0;
  ATTN_CHECK(attn__cpu_segments(pb, &segs, &nseg));
  attn_status status = make_items(pb, segs, nseg, &items, &nitems);
  fwd_job jb = {pb, be->ops, segs, NULL, (pb->skv + CPU_BC - 1) / CPU_BC, ctx};
  uint8_t *vbad = status == ATTN_OK ? attn__cpu_nonfinite_tiles(pb->v, pb->dtype, pb->B, pb->skv, pb->Hkv, pb->Dv) : NULL;
  if (status == ATTN_OK && !vbad) status = attn__fail(ATTN_ERR_OUT_OF_MEMORY, "tile flags allocation failed");
  jb.vbad = vbad;
  int failed = 0;
  if (status == ATTN_OK) {
#pragma omp parallel num_threads(be->threads)
    {
      fwd_work *w = work_get(pb);
      if (!w) {
#pragma omp atomic write
        failed = 1;
      }
#pragma omp for schedule(dynamic, 1)
      for (int64_t n = 0; n < nitems; n++) {
        if (!w) continue;
        const fwd_item *it = &items[n];
        if (st) state_load(&jb, it, st, w);
        else state_zero(pb, w);
        pack_qt(&jb, it, w);
        run_tiles(&jb, it, w);
        if (st) state_store(&jb, it, st, w);
        else finalize_rows(&jb, it, w, o, lse, lse_rows);
      }
    }
    if (failed) status = attn__fail(ATTN_ERR_OUT_OF_MEMORY, "per-thread tile workspace allocation failed");
  }
  free(vbad);
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
