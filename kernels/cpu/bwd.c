/* bwd.c — CPU flash backward (FlashAttention-2): recompute P from the final LSE, then
 * dV += P^T dO, dS = P*(dP - delta), dK += dS^T Q, dQ += dS K, tile by tile. Work units
 * are (batch, KV head, key split): each owns its dK/dV rows, so the result is
 * deterministic; dQ is shared across splits through partial buffers summed in order. */
#include "convert.h"
#include "cpu.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  int32_t seg, rows;
  int64_t r0;
  int64_t kc0, kc1; /* visible local keys */
} qtile;

typedef struct {
  const attn__problem *pb;
  const cpu_tile_ops *ops;
  const cpu_segment *segs;
  int nseg;
  const qtile *tiles;
  int64_t ntiles;
  const int64_t *seg_tile0; /* [nseg + 1] first tile of each segment */
  const cpu_tile_flags *kbad; /* which K tiles hold NaN or Inf */
  int nsplit;
  attn__view dout, dk, dv;
  attn__view *dq; /* [nsplit] */
  const float *lse, *delta;
  int64_t lse_rows;
  attn_ctx_t ctx;
} bwd_job;

typedef struct {
  float *qt;      /* [ntiles][Dqk][CPU_BR] scaled Q^T of one head */
  float *dot;     /* [ntiles][Dv][CPU_BR] dO^T */
  float *lse2;    /* [ntiles][CPU_BR] log2 units; +inf in unused lanes */
  float *dl;      /* [ntiles][CPU_BR] delta */
  float *s;       /* [CPU_BC][CPU_BR] S^T, then P^T */
  float *dp;      /* [CPU_BC][CPU_BR] dP^T, then dS^T */
  float *t;       /* [CPU_BC][CPU_BR] tanh (softcap) */
  /* bf16/f16 inputs as float32 (unused for float32): Q and dO rows of the head, K and V
   * rows of the key tile */
  float *qrow;    /* [ntiles][CPU_BR][Dqk] */
  float *dorow;   /* [ntiles][CPU_BR][Dv] */
  float *kc, *vc; /* [CPU_BC][Dqk], [CPU_BC][Dv] */
  uint8_t elem[CPU_BC * CPU_BR];
  cpu_tile_info ti;
} bwd_work;

/* Q^T, dO^T, lse and delta of head h, lane-major per query tile. */
static void pack_head(const bwd_job *jb, int64_t b, int64_t h, bwd_work *w) {
  const attn__problem *pb = jb->pb;
  const float qs = attn__cpu_q_scale(pb);
  for (int64_t t = 0; t < jb->ntiles; t++) {
    const qtile *qt = &jb->tiles[t];
    float *qd = w->qt + t * pb->Dqk * CPU_BR, *od = w->dot + t * pb->Dv * CPU_BR;
    float *l2 = w->lse2 + t * CPU_BR, *dl = w->dl + t * CPU_BR;
    int64_t lq, ld;
    float *qc = w->qrow ? w->qrow + t * CPU_BR * pb->Dqk : NULL; /* bf16/f16 only */
    float *dc = w->dorow ? w->dorow + t * CPU_BR * pb->Dv : NULL;
    const float *q = attn__cpu_rows_f32(jb->ops, pb->q, pb->dtype, b, qt->r0, h, qt->rows,
                                        (int)pb->Dqk, qc, &lq);
    const float *d = attn__cpu_rows_f32(jb->ops, jb->dout, pb->dtype, b, qt->r0, h, qt->rows,
                                        (int)pb->Dv, dc, &ld);
    jb->ops->pack_t(qd, q, lq, qt->rows, (int)pb->Dqk, qs);
    jb->ops->pack_t(od, d, ld, qt->rows, (int)pb->Dv, 1.0f);
    int64_t row = (b * pb->Hq + h) * jb->lse_rows + pb->q_row0 + qt->r0;
    for (int i = 0; i < CPU_BR; i++) {
      l2[i] = i < qt->rows ? jb->lse[row + i] * CPU_LOG2E : INFINITY; /* +inf: P = 0 */
      dl[i] = i < qt->rows ? jb->delta[row + i] : 0.0f;
    }
  }
}

/* Float32 rows of a key tile: k [nj][ldk], v [nj][ldv]. */
typedef struct {
  const float *k, *v;
  int64_t ldk, ldv;
} key_rows;

/* One (query tile, key tile) pair of head h. */
static void run_pair(const bwd_job *jb, bwd_work *w, int64_t b, int64_t h, int64_t hk,
                     int64_t t, int64_t ca, int nj, int safe, attn__view dq,
                     const key_rows *kr) {
  const attn__problem *pb = jb->pb;
  const cpu_tile_ops *ops = jb->ops;
  const qtile *qt = &jb->tiles[t];
  const float *k = kr->k, *v = kr->v; /* [nj rows] */
  const float *q, *dO; /* [rows] rows: the caller's, or (bf16/f16) what pack_head converted */
  int64_t lq, ldo;
  if (pb->dtype == ATTN_F32) {
    q = pb->q.p + b * pb->q.sb + qt->r0 * pb->q.ss + h * pb->q.sh, lq = pb->q.ss;
    dO = jb->dout.p + b * jb->dout.sb + qt->r0 * jb->dout.ss + h * jb->dout.sh, ldo = jb->dout.ss;
  } else {
    q = w->qrow + t * CPU_BR * pb->Dqk, lq = pb->Dqk;
    dO = w->dorow + t * CPU_BR * pb->Dv, ldo = pb->Dv;
  }
  float *dk = jb->dk.p + b * jb->dk.sb + ca * jb->dk.ss + hk * jb->dk.sh;
  float *dv = jb->dv.p + b * jb->dv.sb + ca * jb->dv.ss + hk * jb->dv.sh;
  float *dqr = dq.p + b * dq.sb + qt->r0 * dq.ss + h * dq.sh;
  const int Dqk = (int)pb->Dqk, Dv = (int)pb->Dv, rows = qt->rows;
  float *T = pb->softcap > 0.0f ? w->t : NULL;

  const int lanes = w->ti.lanes; /* S^T, dP^T: only the lanes of the tile's rows */
  ops->gemm(w->s, CPU_BR, k, 1, kr->ldk, w->qt + t * Dqk * CPU_BR, CPU_BR, nj, lanes, Dqk, NULL,
            CPU_GEMM_SET, 0);
  ops->probs_bwd(w->s, nj, &w->ti, w->lse2 + t * CPU_BR, T);
  ops->gemm(w->dp, CPU_BR, v, 1, kr->ldv, w->dot + t * Dv * CPU_BR, CPU_BR, nj, lanes, Dv, NULL,
            CPU_GEMM_SET, 0);
  ops->dscores(w->dp, w->s, T, nj, lanes, w->dl + t * CPU_BR, pb->scale);
  /* dV[j] += sum_i P^T[j][i] dO[i];  dK[j] += sum_i dS^T[j][i] Q[i] */
  ops->gemm(dv, jb->dv.ss, w->s, 1, CPU_BR, dO, ldo, nj, Dv, rows, NULL, CPU_GEMM_ADD, 0);
  ops->gemm(dk, jb->dk.ss, w->dp, 1, CPU_BR, q, lq, nj, Dqk, rows, NULL, CPU_GEMM_ADD, 0);
  /* dQ[i] += sum_j dS^T[j][i] K[j] */
  ops->gemm(dqr, dq.ss, w->dp, CPU_BR, 1, k, kr->ldk, rows, Dqk, nj, NULL, CPU_GEMM_ADD, safe);
}

static void run_unit(const bwd_job *jb, bwd_work *w, int64_t b, int64_t hk, int split) {
  const attn__problem *pb = jb->pb;
  const int64_t G = pb->Hq / pb->Hkv;
  int64_t computed = 0, skipped = 0;
  double flops = 0;
  for (int64_t h = hk * G; h < (hk + 1) * G; h++) {
    pack_head(jb, b, h, w);
    for (int s = 0; s < jb->nseg; s++) {
      const cpu_segment *seg = &jb->segs[s];
      for (int64_t kt = seg->c0 / CPU_BC; kt * CPU_BC < seg->c1; kt++) {
        if (kt % jb->nsplit != split) continue;
        int64_t ca = kt * CPU_BC > seg->c0 ? kt * CPU_BC : seg->c0;
        int64_t cb = (kt + 1) * CPU_BC < seg->c1 ? (kt + 1) * CPU_BC : seg->c1;
        int safe = attn__cpu_tile_nonfinite(jb->kbad, jb->ops, b, hk, kt);
        key_rows kr;
        kr.k = attn__cpu_rows_f32(jb->ops, pb->k, pb->dtype, b, ca, hk, (int)(cb - ca),
                                  (int)pb->Dqk, w->kc, &kr.ldk);
        kr.v = attn__cpu_rows_f32(jb->ops, pb->v, pb->dtype, b, ca, hk, (int)(cb - ca),
                                  (int)pb->Dv, w->vc, &kr.ldv);
        for (int64_t t = jb->seg_tile0[s]; t < jb->seg_tile0[s + 1]; t++) {
          const qtile *qt = &jb->tiles[t];
          int64_t a = ca > qt->kc0 ? ca : qt->kc0, e = cb < qt->kc1 ? cb : qt->kc1;
          if (a >= e ||
              !attn__cpu_tile_info(pb, seg, h, 1, qt->r0, qt->rows, ca, cb, &w->ti, w->elem)) {
            skipped++;
            continue;
          }
          run_pair(jb, w, b, h, hk, t, ca, (int)(cb - ca), safe, jb->dq[split], &kr);
          computed++;
          flops += 2.0 * qt->rows * (double)(cb - ca) * (double)(3 * pb->Dqk + 2 * pb->Dv);
        }
      }
    }
  }
  attn__cpu_count(jb->ctx, computed, skipped, flops);
}

static bwd_work *work_alloc(const attn__problem *pb, int64_t ntiles) {
  bwd_work *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  size_t tile = (size_t)CPU_BC * CPU_BR;
  const int lp = pb->dtype != ATTN_F32; /* the float32 copies of bf16/f16 inputs */
  size_t n = (size_t)ntiles * CPU_BR * (size_t)((1 + lp) * (pb->Dqk + pb->Dv) + 2) + 3 * tile +
             (lp ? (size_t)CPU_BC * (size_t)(pb->Dqk + pb->Dv) : 0);
  float *buf = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
  if (!buf) {
    free(w);
    return NULL;
  }
  w->qt = buf;
  w->dot = w->qt + (size_t)ntiles * pb->Dqk * CPU_BR;
  w->lse2 = w->dot + (size_t)ntiles * pb->Dv * CPU_BR;
  w->dl = w->lse2 + (size_t)ntiles * CPU_BR;
  w->s = w->dl + (size_t)ntiles * CPU_BR;
  w->dp = w->s + tile;
  w->t = w->dp + tile;
  if (lp) {
    w->qrow = w->t + tile;
    w->dorow = w->qrow + (size_t)ntiles * CPU_BR * pb->Dqk;
    w->kc = w->dorow + (size_t)ntiles * CPU_BR * pb->Dv;
    w->vc = w->kc + (size_t)CPU_BC * pb->Dqk;
  }
  return w;
}

static void work_free(bwd_work *w) {
  if (!w) return;
  free(w->qt);
  free(w);
}

static attn_status make_tiles(const attn__problem *pb, const cpu_segment *segs, int nseg,
                              qtile **tiles, int64_t *ntiles, int64_t **seg_tile0) {
  int64_t n = 0;
  for (int s = 0; s < nseg; s++) n += (segs[s].r1 - segs[s].r0 + CPU_BR - 1) / CPU_BR;
  *tiles = malloc((size_t)(n > 0 ? n : 1) * sizeof **tiles);
  *seg_tile0 = malloc((size_t)(nseg + 1) * sizeof **seg_tile0);
  if (!*tiles || !*seg_tile0) return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "tile list allocation failed");
  int64_t k = 0;
  for (int s = 0; s < nseg; s++) {
    (*seg_tile0)[s] = k;
    for (int64_t r0 = segs[s].r0; r0 < segs[s].r1; r0 += CPU_BR) {
      qtile *t = &(*tiles)[k++];
      t->seg = s;
      t->r0 = r0;
      t->rows = (int32_t)(segs[s].r1 - r0 < CPU_BR ? segs[s].r1 - r0 : CPU_BR);
      attn__cpu_key_range(pb, &segs[s], r0, t->rows, &t->kc0, &t->kc1);
    }
  }
  (*seg_tile0)[nseg] = k;
  *ntiles = k;
  return ATTN_OK;
}

static attn_status run_units(bwd_job *jb, int threads) {
  const attn__problem *pb = jb->pb;
  int64_t nunits = pb->B * pb->Hkv * jb->nsplit;
  int failed = 0;
#pragma omp parallel num_threads(threads)
  {
    bwd_work *w = work_alloc(pb, jb->ntiles);
    if (!w) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < nunits; u++)
      if (w) run_unit(jb, w, u / (pb->Hkv * jb->nsplit), (u / jb->nsplit) % pb->Hkv, (int)(u % jb->nsplit));
    work_free(w);
  }
  return failed ? attn__fail(ATTN_ERR_OUT_OF_MEMORY, "per-thread backward workspace allocation failed")
                : ATTN_OK;
}

/* dq += sum over splits s >= 1 of the partial buffers, in split order. */
static void reduce_dq(const bwd_job *jb, attn__view dq) {
  const attn__problem *pb = jb->pb;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < pb->B; b++)
    for (int64_t i = 0; i < pb->sq; i++)
      for (int s = 1; s < jb->nsplit; s++) {
        const attn__view p = jb->dq[s];
        for (int64_t h = 0; h < pb->Hq; h++) {
          float *d = dq.p + b * dq.sb + i * dq.ss + h * dq.sh;
          const float *x = p.p + b * p.sb + i * p.ss + h * p.sh;
          for (int64_t k = 0; k < pb->Dqk; k++) d[k] += x[k];
        }
      }
}

attn_status attn__cpu_bwd_block(attn_ctx_t ctx, const attn__problem *pb, attn__view dout,
                                const float *lse, const float *delta, int64_t lse_rows,
                                attn__view dq, attn__view dk, attn__view dv) {
  cpu_backend *be = ctx->backend_data;
  bwd_job jb = {.pb = pb, .ops = be->ops, .dout = dout, .dk = dk, .dv = dv, .lse = lse,
                .delta = delta, .lse_rows = lse_rows, .ctx = ctx};
  cpu_segment *segs = NULL;
  qtile *tiles = NULL;
  int64_t *seg_tile0 = NULL;
  cpu_tile_flags kbad = {0};
  float *partial = NULL;
  attn__view dqs[64];
  attn_status st;
  ATTN_CHECK(attn__cpu_segments(pb, &segs, &jb.nseg));
  jb.segs = segs;
  ATTN_CHECK_GOTO(make_tiles(pb, segs, jb.nseg, &tiles, &jb.ntiles, &seg_tile0), st, done);
  jb.tiles = tiles;
  jb.seg_tile0 = seg_tile0;
  ATTN_CHECK_GOTO(attn__cpu_flags_init(&kbad, pb->k, pb->dtype, pb->B, pb->skv, pb->Hkv, pb->Dqk),
                  st, done);
  jb.kbad = &kbad;
  /* Splits per (batch, KV head) so that there are at least as many units as threads. */
  jb.nsplit = attn__cpu_splits(pb->B * pb->Hkv, be->threads > 64 ? 64 : be->threads,
                               (pb->skv + CPU_BC - 1) / CPU_BC);
  dqs[0] = dq;
  if (jb.nsplit > 1) {
    size_t one = (size_t)(pb->B * pb->sq * pb->Hq * pb->Dqk); /* [B, sq, Hq, Dqk] */
    partial = calloc(one * (size_t)(jb.nsplit - 1), sizeof(float));
    if (!partial) {
      st = attn__fail(ATTN_ERR_OUT_OF_MEMORY, "dq partials (%d x %zu floats) allocation failed",
                      jb.nsplit - 1, one);
      goto done;
    }
    for (int s = 1; s < jb.nsplit; s++)
      dqs[s] = (attn__view){partial + one * (size_t)(s - 1), pb->sq * pb->Hq * pb->Dqk,
                            pb->Hq * pb->Dqk, pb->Dqk};
  }
  jb.dq = dqs;
  st = run_units(&jb, be->threads);
  if (st == ATTN_OK && jb.nsplit > 1) reduce_dq(&jb, dq);
done:
  free(partial);
  attn__cpu_flags_free(&kbad);
  free(seg_tile0);
  free(tiles);
  free(segs);
  return st;
}
