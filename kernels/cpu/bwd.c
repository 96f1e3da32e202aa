/* bwd.c — CPU flash backward (FlashAttention-2): recompute P from the final LSE, then
 * dV += P^T dO, dS = P*(dP - delta), dK += dS^T Q, dQ += dS K, tile by tile. Work units
 * are (batch, KV head, key split): each owns its dK/dV rows, so the result is
 * deterministic; dQ is shared across splits through partial buffers summed in order.
 * bf16 with a bf16 tile unit (cfg.cpu_amx: AMX or AVX512-BF16) runs the five products on
 * the tiles from bf16 operands, P and dS rounded to bf16, and accumulates dQ, dK, dV in
 * float32 buffers of the work unit that it adds to the outputs once a head (dQ) or a key
 * tile (dK, dV) is done. Short query tiles (decode, speculative steps) carry nh heads of
 * the GQA group in their lanes (lane L = row L % rows of head h + L / rows), so that each
 * K/V tile is read, and each dK/dV tile updated, once for them instead of once a head;
 * their dQ goes through the unit's float32 buffer. */
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
  const cpu_bf16_ops *bf16; /* the bf16 tile products (AMX or AVX512-BF16), or NULL */
  const cpu_segment *segs;
  int nseg;
  const qtile *tiles;
  int64_t ntiles;
  const int64_t *seg_tile0; /* [nseg + 1] first tile of each segment */
  const cpu_tile_flags *kbad; /* which K tiles hold NaN or Inf */
  int nsplit;
  int nh; /* query heads a tile's lanes carry (see bwd_pack) */
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
  /* bf16/f16 inputs as float32, and the lanes' rows of packed heads: Q and dO rows of the
   * head(s) per query tile; K and V rows of the key tile (bf16/f16) */
  float *qrow;    /* [ntiles][CPU_BR][Dqk] */
  float *dorow;   /* [ntiles][CPU_BR][Dv] */
  float *kc, *vc; /* [CPU_BC][Dqk], [CPU_BC][Dv] */
  /* bf16 tiles only (then qt, dot, qrow and dorow are unused): bf16 B tiles of the head's Q and
   * dO rows per query tile, both ways (pack_lanes, pack_pairs), and of the key tile's K;
   * bf16 P^T, dS^T and dS of a pair; float32 accumulators */
  uint16_t *qv, *qn;   /* [ntiles][Dqk/2][CPU_BR][2], [ntiles][CPU_BR/2][Dqk][2] */
  uint16_t *dov, *don; /* [ntiles][Dv/2][CPU_BR][2], [ntiles][CPU_BR/2][Dv][2] */
  uint16_t *kv;        /* [CPU_BC/2][Dqk][2] */
  uint16_t *kpad;      /* [32][max(Dqk, Dv)] */
  uint16_t *pt, *dst;  /* [CPU_BC][CPU_BR] */
  uint16_t *ds;        /* [CPU_BR][CPU_BC] */
  uint16_t *lane16;    /* [CPU_BR][max(Dqk, Dv)] packed heads' bf16 rows, gathered */
  float *dqacc;        /* [ntiles][CPU_BR][Dqk] (also float32 arithmetic with packed heads) */
  float *dkacc, *dvacc; /* [CPU_BC][Dqk], [CPU_BC][Dv] */
  uint8_t elem[CPU_BC * CPU_BR];
  cpu_tile_info ti;
} bwd_work;

/* lse (log2 units) and delta of a tile's lanes: heads h..h+nh-1 over its rows. */
static void lane_stats(const bwd_job *jb, int64_t b, int64_t h, int nh, int64_t t, bwd_work *w) {
  const attn__problem *pb = jb->pb;
  const qtile *qt = &jb->tiles[t];
  const int rows = qt->rows, used = nh * rows;
  float *l2 = w->lse2 + t * CPU_BR, *dl = w->dl + t * CPU_BR;
  for (int L = 0; L < CPU_BR; L++) {
    const int64_t row = (b * pb->Hq + h + L / rows) * jb->lse_rows + pb->q_row0 + qt->r0 + L % rows;
    l2[L] = L < used ? jb->lse[row] * CPU_LOG2E : INFINITY; /* +inf: P = 0 */
    dl[L] = L < used ? jb->delta[row] : 0.0f;
  }
}

/* Q^T, dO^T, lse and delta of heads h..h+nh-1, lane-major per query tile (packed heads:
 * their rows gathered into qrow / dorow, and the tile's dQ buffer zeroed). */
static void pack_head(const bwd_job *jb, int64_t b, int64_t h, int nh, bwd_work *w) {
  const attn__problem *pb = jb->pb;
  const float qs = attn__cpu_q_scale(pb);
  for (int64_t t = 0; t < jb->ntiles; t++) {
    const qtile *qt = &jb->tiles[t];
    const int rows = qt->rows, used = nh * rows;
    float *qd = w->qt + t * pb->Dqk * CPU_BR, *od = w->dot + t * pb->Dv * CPU_BR;
    int64_t lq, ld;
    float *qc = w->qrow ? w->qrow + t * CPU_BR * pb->Dqk : NULL; /* bf16/f16 or packed */
    float *dc = w->dorow ? w->dorow + t * CPU_BR * pb->Dv : NULL;
    const float *q = attn__cpu_lane_rows(jb->ops, pb->q, pb->dtype, b, qt->r0, h, nh, rows,
                                         (int)pb->Dqk, qc, &lq);
    const float *d = attn__cpu_lane_rows(jb->ops, jb->dout, pb->dtype, b, qt->r0, h, nh, rows,
                                         (int)pb->Dv, dc, &ld);
    jb->ops->pack_t(qd, q, lq, used, (int)pb->Dqk, qs);
    jb->ops->pack_t(od, d, ld, used, (int)pb->Dv, 1.0f);
    if (nh > 1) memset(w->dqacc + t * CPU_BR * pb->Dqk, 0, (size_t)used * pb->Dqk * sizeof(float));
    lane_stats(jb, b, h, nh, t, w);
  }
}

/* Float32 rows of a key tile: k [nj][ldk], v [nj][ldv]. */
typedef struct {
  const float *k, *v;
  int64_t ldk, ldv;
} key_rows;

/* One (query tile, key tile) pair of heads h..h+nh-1 (packed heads: dQ into w->dqacc). */
static void run_pair(const bwd_job *jb, bwd_work *w, int64_t b, int64_t h, int nh, int64_t hk,
                     int64_t t, int64_t ca, int nj, int safe, attn__view dq,
                     const key_rows *kr) {
  const attn__problem *pb = jb->pb;
  const cpu_tile_ops *ops = jb->ops;
  const qtile *qt = &jb->tiles[t];
  const float *k = kr->k, *v = kr->v; /* [nj rows] */
  const float *q, *dO; /* [rows] rows: the caller's, or (bf16/f16) what pack_head converted */
  int64_t lq, ldo;
  if (pb->dtype == ATTN_F32 && nh == 1) {
    q = pb->q.p + b * pb->q.sb + qt->r0 * pb->q.ss + h * pb->q.sh, lq = pb->q.ss;
    dO = jb->dout.p + b * jb->dout.sb + qt->r0 * jb->dout.ss + h * jb->dout.sh, ldo = jb->dout.ss;
  } else {
    q = w->qrow + t * CPU_BR * pb->Dqk, lq = pb->Dqk;
    dO = w->dorow + t * CPU_BR * pb->Dv, ldo = pb->Dv;
  }
  float *dk = jb->dk.p + b * jb->dk.sb + ca * jb->dk.ss + hk * jb->dk.sh;
  float *dv = jb->dv.p + b * jb->dv.sb + ca * jb->dv.ss + hk * jb->dv.sh;
  float *dqr = nh == 1 ? dq.p + b * dq.sb + qt->r0 * dq.ss + h * dq.sh
                      : w->dqacc + t * CPU_BR * pb->Dqk;
  const int64_t ldq = nh == 1 ? dq.ss : pb->Dqk;
  const int Dqk = (int)pb->Dqk, Dv = (int)pb->Dv, rows = nh * qt->rows; /* lanes in use */
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
  ops->gemm(dqr, ldq, w->dp, CPU_BR, 1, k, kr->ldk, rows, Dqk, nj, NULL, CPU_GEMM_ADD, safe);
}

/* The bf16 tiles' operands of head h: Q and dO rows of each query tile as B tiles both
 * ways, lse and delta, and zero dQ accumulators. */
/* The bf16 rows of a tile's lanes (heads h..h+nh-1) of x: x itself for one head (*ld its
 * row stride), else gathered into buf [nh*rows][D] (*ld = D). */
static const uint16_t *lane_rows16(attn__view x, int64_t b, const qtile *qt, int64_t h, int nh,
                                   int D, uint16_t *buf, int64_t *ld) {
  *ld = nh == 1 ? x.ss : D;
  if (nh == 1) return attn__cpu_row(x, ATTN_BF16, b, qt->r0, h);
  for (int g = 0; g < nh; g++)
    for (int i = 0; i < qt->rows; i++)
      memcpy(buf + ((size_t)g * qt->rows + i) * D, attn__cpu_row(x, ATTN_BF16, b, qt->r0 + i, h + g),
             (size_t)D * sizeof(uint16_t));
  return buf;
}

static void bf16_pack_head(const bwd_job *jb, int64_t b, int64_t h, int nh, bwd_work *w) {
  const attn__problem *pb = jb->pb;
  const int Dqk = (int)pb->Dqk, Dv = (int)pb->Dv;
  for (int64_t t = 0; t < jb->ntiles; t++) {
    const qtile *qt = &jb->tiles[t];
    const int used = nh * qt->rows;
    const size_t tq = (size_t)t * CPU_BR * Dqk, tv = (size_t)t * CPU_BR * Dv;
    int64_t ld;
    const uint16_t *q = lane_rows16(pb->q, b, qt, h, nh, Dqk, w->lane16, &ld);
    jb->bf16->pack_lanes(w->qv + tq, q, ld, used, Dqk);
    jb->bf16->pack_pairs(w->qn + tq, q, ld, used, Dqk);
    const uint16_t *d = lane_rows16(jb->dout, b, qt, h, nh, Dv, w->lane16, &ld);
    jb->bf16->pack_lanes(w->dov + tv, d, ld, used, Dv);
    jb->bf16->pack_pairs(w->don + tv, d, ld, used, Dv);
    memset(w->dqacc + tq, 0, (size_t)CPU_BR * Dqk * sizeof(float));
    lane_stats(jb, b, h, nh, t, w);
  }
}

/* dst rows [rows][D] (row stride ld) += acc [rows][D]. */
static void add_rows(float *dst, int64_t ld, const float *acc, int rows, int D) {
  for (int r = 0; r < rows; r++)
    for (int d = 0; d < D; d++) dst[r * ld + d] += acc[(size_t)r * D + d];
}

/* One (query tile, key tile) pair of head h on the bf16 tiles: keys [ca, ca + nj) of KV
 * head hk, whose K pairs are in w->kv; dK, dV into w->dkacc, w->dvacc, dQ into w->dqacc.
 * safe: K holds NaN or Inf, so dQ takes the float32 safe product (K rows as float32). */
static void bf16_pair(const bwd_job *jb, bwd_work *w, int64_t b, int64_t hk, int64_t t,
                     int64_t ca, int nj, int safe, int used) {
  const attn__problem *pb = jb->pb;
  const cpu_bf16_ops *bf = jb->bf16;
  const int Dqk = (int)pb->Dqk, Dv = (int)pb->Dv, lanes = w->ti.lanes;
  const int l32 = (lanes + 31) / 32 * 32, nj16 = (nj + 15) / 16 * 16, nj32 = (nj + 31) / 32 * 32;
  const size_t tq = (size_t)t * CPU_BR * Dqk, tv = (size_t)t * CPU_BR * Dv;
  const uint16_t *k = attn__cpu_row(pb->k, ATTN_BF16, b, ca, hk);
  const uint16_t *v = attn__cpu_row(pb->v, ATTN_BF16, b, ca, hk);
  float *T = pb->softcap > 0.0f ? w->t : NULL;
  bf->scores(w->s, k, pb->k.ss, nj, w->qv + tq, lanes, Dqk, w->kpad);
  bf->probs(w->s, nj, &w->ti, attn__cpu_q_scale(pb), w->lse2 + t * CPU_BR, T, w->pt);
  bf->scores(w->dp, v, pb->v.ss, nj, w->dov + tv, lanes, Dv, w->kpad);
  bf->dscores(w->dp, w->s, T, nj, lanes, w->dl + t * CPU_BR, pb->scale, safe, w->dst, w->ds);
  bf->gemm(w->dvacc, Dv, w->pt, CPU_BR, w->don + tv, nj16, Dv, l32);  /* dV += P^T dO */
  bf->gemm(w->dkacc, Dqk, w->dst, CPU_BR, w->qn + tq, nj16, Dqk, l32); /* dK += dS^T Q */
  if (!safe) {
    bf->gemm(w->dqacc + tq, Dqk, w->ds, CPU_BC, w->kv, lanes, Dqk, nj32); /* dQ += dS K */
    return;
  }
  int64_t ldk;
  const float *kf = attn__cpu_rows_f32(jb->ops, pb->k, ATTN_BF16, b, ca, hk, nj, Dqk, w->kc, &ldk);
  jb->ops->gemm(w->dqacc + tq, Dqk, w->dp, CPU_BR, 1, kf, ldk, used, Dqk, nj, NULL, CPU_GEMM_ADD, 1);
}

static void run_unit(const bwd_job *jb, bwd_work *w, int64_t b, int64_t hk, int split) {
  const attn__problem *pb = jb->pb;
  const int64_t G = pb->Hq / pb->Hkv;
  const cpu_bf16_ops *bf = jb->bf16;
  const int Dqk = (int)pb->Dqk, Dv = (int)pb->Dv;
  int64_t computed = 0, skipped = 0;
  double flops = 0;
  if (bf) bf->begin();
  for (int64_t h = hk * G, nh; h < (hk + 1) * G; h += nh) {
    nh = (hk + 1) * G - h < jb->nh ? (hk + 1) * G - h : jb->nh;
    if (bf) bf16_pack_head(jb, b, h, (int)nh, w);
    else pack_head(jb, b, h, (int)nh, w);
    for (int s = 0; s < jb->nseg; s++) {
      const cpu_segment *seg = &jb->segs[s];
      for (int64_t kt = seg->c0 / CPU_BC; kt * CPU_BC < seg->c1; kt++) {
        if (kt % jb->nsplit != split) continue;
        int64_t ca = kt * CPU_BC > seg->c0 ? kt * CPU_BC : seg->c0;
        int64_t cb = (kt + 1) * CPU_BC < seg->c1 ? (kt + 1) * CPU_BC : seg->c1;
        const int nj = (int)(cb - ca);
        int safe = attn__cpu_tile_nonfinite(jb->kbad, jb->ops, b, hk, kt);
        key_rows kr = {0};
        if (bf) {
          bf->pack_pairs(w->kv, attn__cpu_row(pb->k, ATTN_BF16, b, ca, hk), pb->k.ss, nj, Dqk);
          const size_t nj16 = (size_t)(nj + 15) / 16 * 16; /* the rows the products write */
          memset(w->dkacc, 0, nj16 * Dqk * sizeof(float));
          memset(w->dvacc, 0, nj16 * Dv * sizeof(float));
        } else {
          kr.k = attn__cpu_rows_f32(jb->ops, pb->k, pb->dtype, b, ca, hk, nj, Dqk, w->kc, &kr.ldk);
          kr.v = attn__cpu_rows_f32(jb->ops, pb->v, pb->dtype, b, ca, hk, nj, Dv, w->vc, &kr.ldv);
        }
        for (int64_t t = jb->seg_tile0[s]; t < jb->seg_tile0[s + 1]; t++) {
          const qtile *qt = &jb->tiles[t];
          int64_t a = ca > qt->kc0 ? ca : qt->kc0, e = cb < qt->kc1 ? cb : qt->kc1;
          if (a >= e || !attn__cpu_tile_info(pb, seg, h, (int)nh, qt->r0, qt->rows, ca, cb,
                                             &w->ti, w->elem)) {
            skipped += nh;
            continue;
          }
          if (bf) bf16_pair(jb, w, b, hk, t, ca, nj, safe, (int)nh * qt->rows);
          else run_pair(jb, w, b, h, (int)nh, hk, t, ca, nj, safe, jb->dq[split], &kr);
          computed += nh;
          flops += 2.0 * nh * qt->rows * (double)nj * (double)(3 * pb->Dqk + 2 * pb->Dv);
        }
        if (bf) {
          add_rows(jb->dk.p + b * jb->dk.sb + ca * jb->dk.ss + hk * jb->dk.sh, jb->dk.ss,
                   w->dkacc, nj, Dqk);
          add_rows(jb->dv.p + b * jb->dv.sb + ca * jb->dv.ss + hk * jb->dv.sh, jb->dv.ss,
                   w->dvacc, nj, Dv);
        }
      }
    }
    if (bf || nh > 1) { /* each head's lanes of the dQ buffers */
      const attn__view dq = jb->dq[split];
      for (int64_t t = 0; t < jb->ntiles; t++)
        for (int64_t g = 0; g < nh; g++)
          add_rows(dq.p + b * dq.sb + jb->tiles[t].r0 * dq.ss + (h + g) * dq.sh, dq.ss,
                   w->dqacc + ((size_t)t * CPU_BR + (size_t)g * jb->tiles[t].rows) * Dqk,
                   jb->tiles[t].rows, Dqk);
    }
  }
  if (bf) bf->end();
  attn__cpu_count(jb->ctx, computed, skipped, flops);
}

/* The bf16 tiles' buffers (one allocation, zeroed). */
static bwd_work *bf16_work_alloc(const attn__problem *pb, int64_t ntiles) {
  bwd_work *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  const size_t tile = (size_t)CPU_BC * CPU_BR, Dqk = (size_t)pb->Dqk, Dv = (size_t)pb->Dv;
  const size_t nt = (size_t)ntiles * CPU_BR; /* lanes of all query tiles */
  size_t floats = 2 * nt + 3 * tile + nt * Dqk + CPU_BC * (2 * Dqk + Dv);
  size_t halves = 2 * nt * (Dqk + Dv) + CPU_BC * Dqk + (32 + CPU_BR) * (Dqk > Dv ? Dqk : Dv) +
                  3 * tile;
  size_t bytes = (floats * sizeof(float) + halves * 2 + 63) / 64 * 64;
  float *buf = aligned_alloc(64, bytes);
  if (!buf) {
    free(w);
    return NULL;
  }
  memset(buf, 0, bytes);
  w->qt = buf; /* what work_free frees */
  w->lse2 = buf;
  w->dl = w->lse2 + nt;
  w->s = w->dl + nt;
  w->dp = w->s + tile;
  w->t = w->dp + tile;
  w->dqacc = w->t + tile;
  w->dkacc = w->dqacc + nt * Dqk;
  w->dvacc = w->dkacc + CPU_BC * Dqk;
  w->kc = w->dvacc + CPU_BC * Dv;
  w->qv = (uint16_t *)(w->kc + CPU_BC * Dqk);
  w->qn = w->qv + nt * Dqk;
  w->dov = w->qn + nt * Dqk;
  w->don = w->dov + nt * Dv;
  w->kv = w->don + nt * Dv;
  w->kpad = w->kv + CPU_BC * Dqk;
  w->pt = w->kpad + 32 * (Dqk > Dv ? Dqk : Dv);
  w->dst = w->pt + tile;
  w->ds = w->dst + tile;
  w->lane16 = w->ds + tile;
  return w;
}

static bwd_work *work_alloc(const attn__problem *pb, int64_t ntiles, int bf16, int nh) {
  if (bf16) return bf16_work_alloc(pb, ntiles);
  bwd_work *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  size_t tile = (size_t)CPU_BC * CPU_BR;
  const int conv = pb->dtype != ATTN_F32, lp = conv || nh > 1; /* float32 rows of Q, dO */
  size_t n = (size_t)ntiles * CPU_BR * (size_t)((1 + lp) * (pb->Dqk + pb->Dv) + 2) + 3 * tile +
             (conv ? (size_t)CPU_BC * (size_t)(pb->Dqk + pb->Dv) : 0) +
             (nh > 1 ? (size_t)ntiles * CPU_BR * (size_t)pb->Dqk : 0);
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
  float *end = w->t + tile;
  if (lp) {
    w->qrow = end;
    w->dorow = w->qrow + (size_t)ntiles * CPU_BR * pb->Dqk;
    end = w->dorow + (size_t)ntiles * CPU_BR * pb->Dv;
  }
  if (conv) {
    w->kc = end;
    w->vc = w->kc + (size_t)CPU_BC * pb->Dqk;
    end = w->vc + (size_t)CPU_BC * pb->Dv;
  }
  if (nh > 1) w->dqacc = end;
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

/* Heads a query tile's lanes carry: as many of the GQA group as fit when every tile holds
 * at most half the lanes, else 1. */
static int bwd_pack(const attn__problem *pb, const qtile *tiles, int64_t ntiles) {
  int rows = 1;
  for (int64_t t = 0; t < ntiles; t++) rows = tiles[t].rows > rows ? tiles[t].rows : rows;
  const int64_t G = pb->Hq / pb->Hkv, fit = CPU_BR / rows;
  if (fit < 2) return 1;
  return (int)(G < fit ? G : fit);
}

static attn_status run_units(bwd_job *jb, int threads) {
  const attn__problem *pb = jb->pb;
  int64_t nunits = pb->B * pb->Hkv * jb->nsplit;
  int failed = 0;
#pragma omp parallel num_threads(threads)
  {
    bwd_work *w = work_alloc(pb, jb->ntiles, jb->bf16 != NULL, jb->nh);
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
  const cpu_bf16_ops *bf16 = attn__cpu_bf16_for(be, pb);
  bwd_job jb = {.pb = pb, .ops = be->ops, .bf16 = bf16, .dout = dout, .dk = dk, .dv = dv, .lse = lse,
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
  jb.nh = bwd_pack(pb, tiles, jb.ntiles);
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
      dqs[s] = attn__view_of(partial + one * (size_t)(s - 1), pb->sq * pb->Hq * pb->Dqk,
                           pb->Hq * pb->Dqk, pb->Dqk);
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
