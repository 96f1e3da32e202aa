/* ref.c — the float64 oracle: naive forward and backward attention, every feature of
 * DESIGN.md §2, written for clarity (two-pass softmax over the visible keys of a row).
 *
 * It shares no code with runtime/ or the kernels on purpose: the mask geometry below is
 * its own, so a slip there cannot hide in both. Rows are read through p->fetch; when
 * p->fetch is NULL, p->user is an attn_ref_arrays (see attn_ref_problem_arrays). */
#include "ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- problem accessors ---------------------------------------------------------------- */
static int64_t dqk_of(const attn_ref_problem *p) { return p->spec->head_dim_qk; }
static int64_t dv_of(const attn_ref_problem *p) {
  return p->spec->head_dim_v > 0 ? p->spec->head_dim_v : p->spec->head_dim_qk;
}
static double scale_of(const attn_ref_problem *p) {
  return p->spec->scale != 0.0f ? (double)p->spec->scale : 1.0 / sqrt((double)dqk_of(p));
}
static int64_t group_of(const attn_ref_problem *p) {
  return p->spec->num_heads_q / p->spec->num_heads_kv;
}

static void *xcalloc(size_t n, size_t size) {
  void *ptr = calloc(n ? n : 1, size);
  if (!ptr) abort(); /* the oracle runs in tests and --check only */
  return ptr;
}

/* Reads row (b, s, h) of tensor `which` into out (doubles). */
static void fetch_row(const attn_ref_problem *p, int which, int64_t b, int64_t s, int64_t h,
                      double *out) {
  int64_t d = (which == ATTN_REF_Q || which == ATTN_REF_K) ? dqk_of(p) : dv_of(p);
  float buf[512];
  float *f = d <= 512 ? buf : xcalloc((size_t)d, sizeof(float));
  if (p->fetch) {
    p->fetch(p->user, which, b, s, h, f);
  } else {
    const attn_ref_arrays *a = p->user;
    const float *base = which == ATTN_REF_Q ? a->q : which == ATTN_REF_K ? a->k
                        : which == ATTN_REF_V ? a->v : a->dout;
    int64_t seq = (which == ATTN_REF_K || which == ATTN_REF_V) ? p->seq_kv : p->seq_q;
    int64_t heads = (which == ATTN_REF_K || which == ATTN_REF_V) ? p->spec->num_heads_kv
                                                                 : p->spec->num_heads_q;
    memcpy(f, base + ((b * seq + s) * heads + h) * d, (size_t)d * sizeof(float));
  }
  for (int64_t x = 0; x < d; x++) out[x] = f[x];
  if (f != buf) free(f);
}

void attn_ref_problem_arrays(attn_ref_problem *p, const attn_spec *spec, int64_t batch,
                             int64_t seq_q, int64_t seq_kv, const attn_ref_arrays *a) {
  p->spec = spec;
  p->batch = batch;
  p->seq_q = seq_q;
  p->seq_kv = seq_kv;
  p->fetch = NULL;
  p->user = (void *)a;
}

/* ---- mask geometry --------------------------------------------------------------------- */
/* The sequence that a global query (or key) position belongs to, its local position, the
 * sequence's lengths and its first key position. Positions outside every varlen sequence
 * get len_kv = 0 (nothing visible). */
typedef struct {
  int64_t local;        /* sequence-local position */
  int64_t len_q, len_kv;
  int64_t q0, k0;       /* global position of the sequence's first query / key */
} ref_seq;

static int find_seq(const int32_t *cu, int32_t n, int64_t pos) {
  for (int32_t s = 0; s < n; s++)
    if (cu[s] <= pos && pos < cu[s + 1]) return s;
  return -1;
}

static ref_seq seq_of(const attn_ref_problem *p, int64_t pos, int is_key) {
  const attn_spec *sp = p->spec;
  ref_seq r = {pos, p->seq_q, p->seq_kv, 0, 0};
  if (sp->num_seqs <= 0 || !sp->cu_seqlens_q) return r;
  int s = find_seq(is_key ? sp->cu_seqlens_kv : sp->cu_seqlens_q, sp->num_seqs, pos);
  if (s < 0) {
    r.len_q = r.len_kv = 0;
    return r;
  }
  r.q0 = sp->cu_seqlens_q[s];
  r.k0 = sp->cu_seqlens_kv[s];
  r.len_q = sp->cu_seqlens_q[s + 1] - r.q0;
  r.len_kv = sp->cu_seqlens_kv[s + 1] - r.k0;
  r.local = pos - (is_key ? r.k0 : r.q0);
  return r;
}

/* Key range [*lo, *hi] (local, inclusive) that causal and window allow for local query i. */
static void key_range(const attn_spec *sp, const ref_seq *q, int64_t *lo, int64_t *hi) {
  int64_t c = q->local + (q->len_kv - q->len_q);
  *lo = 0;
  *hi = q->len_kv - 1;
  if (sp->causal && c < *hi) *hi = c;
  if (sp->window_left >= 0 && c - sp->window_left > *lo) *lo = c - sp->window_left;
  if (sp->window_right >= 0 && c + sp->window_right < *hi) *hi = c + sp->window_right;
}

/* Query range [*lo, *hi] (local, inclusive) that causal and window allow for local key j. */
static void query_range(const attn_spec *sp, const ref_seq *k, int64_t *lo, int64_t *hi) {
  int64_t c = k->local - (k->len_kv - k->len_q); /* i + off == j  <=>  i == c */
  *lo = 0;
  *hi = k->len_q - 1;
  if (sp->causal && c > *lo) *lo = c;
  if (sp->window_right >= 0 && c - sp->window_right > *lo) *lo = c - sp->window_right;
  if (sp->window_left >= 0 && c + sp->window_left < *hi) *hi = c + sp->window_left;
}

static int block_visible(const attn_block_mask *bm, int64_t il, int64_t jl) {
  if (!bm) return 1;
  int64_t qb = il / bm->block_q, kb = jl / bm->block_k;
  if (qb >= bm->num_q_blocks || kb >= bm->num_k_blocks) return 0;
  return bm->mask[qb * bm->num_k_blocks + kb] != 0;
}

/* Local-position visibility within one sequence (q and key in the same sequence). */
static int local_visible(const attn_spec *sp, const ref_seq *q, int64_t jl) {
  int64_t lo, hi;
  key_range(sp, q, &lo, &hi);
  return jl >= lo && jl <= hi && block_visible(sp->block_mask, q->local, jl);
}

int attn_ref_visible(const attn_ref_problem *p, int64_t i, int64_t j) {
  ref_seq q = seq_of(p, i, 0);
  if (q.len_kv <= 0 || q.len_q <= 0) return 0;
  int64_t jl = j - q.k0;
  if (jl < 0 || jl >= q.len_kv) return 0;
  return local_visible(p->spec, &q, jl);
}

/* ---- K/V rows: cached for the full functions, fetched for the row functions ----------- */
typedef struct {
  const attn_ref_problem *p;
  int64_t b, hkv;
  double *kc, *vc; /* [Skv, Dqk], [Skv, Dv] or NULL */
  double *kbuf, *vbuf;
} ref_kv;

static void kv_open(ref_kv *s, const attn_ref_problem *p, int64_t b, int64_t hkv, int cache) {
  int64_t dqk = dqk_of(p), dv = dv_of(p);
  s->p = p;
  s->b = b;
  s->hkv = hkv;
  s->kc = s->vc = NULL;
  s->kbuf = xcalloc((size_t)dqk, sizeof(double));
  s->vbuf = xcalloc((size_t)dv, sizeof(double));
  if (!cache) return;
  /* Masked rows are cached too but never read: they may hold NaN. */
  s->kc = xcalloc((size_t)(p->seq_kv * dqk), sizeof(double));
  s->vc = xcalloc((size_t)(p->seq_kv * dv), sizeof(double));
  for (int64_t j = 0; j < p->seq_kv; j++) {
    fetch_row(p, ATTN_REF_K, b, j, hkv, s->kc + j * dqk);
    fetch_row(p, ATTN_REF_V, b, j, hkv, s->vc + j * dv);
  }
}

static void kv_close(ref_kv *s) {
  free(s->kc);
  free(s->vc);
  free(s->kbuf);
  free(s->vbuf);
}

static const double *kv_k(ref_kv *s, int64_t j) {
  if (s->kc) return s->kc + j * dqk_of(s->p);
  fetch_row(s->p, ATTN_REF_K, s->b, j, s->hkv, s->kbuf);
  return s->kbuf;
}

static const double *kv_v(ref_kv *s, int64_t j) {
  if (s->vc) return s->vc + j * dv_of(s->p);
  fetch_row(s->p, ATTN_REF_V, s->b, j, s->hkv, s->vbuf);
  return s->vbuf;
}

static double dot(const double *a, const double *b, int64_t n) {
  double acc = 0.0;
  for (int64_t x = 0; x < n; x++) acc += a[x] * b[x];
  return acc;
}

/* ---- one query row -------------------------------------------------------------------- */
/* The visible keys of a row with their final scores and probabilities. */
typedef struct {
  int64_t n;      /* visible keys */
  int64_t *j;     /* [n] global key positions */
  double *s;      /* [n] final scores */
  double *dcap;   /* [n] d(capped)/d(raw) = 1 - (capped/cap)^2, or 1 */
  double *prob;   /* [n] exp(s - lse) */
  double lse;     /* natural log; -inf (or the sink) when n == 0 */
  double sink_p;  /* exp(sink - lse), 0 without sinks */
  double *q;      /* [Dqk] */
} ref_row;

static void row_free(ref_row *r) {
  free(r->j);
  free(r->s);
  free(r->dcap);
  free(r->prob);
  free(r->q);
}

/* Scores s = scale*q.k, then softcap, then ALiBi, then the mask (masked keys skipped), and
 * the softmax with the sink in the denominator only. */
static void row_compute(const attn_ref_problem *p, ref_kv *kv, int64_t b, int64_t h,
                        int64_t i, ref_row *r) {
  const attn_spec *sp = p->spec;
  int64_t dqk = dqk_of(p);
  ref_seq qs = seq_of(p, i, 0);
  int64_t lo = 0, hi = -1;
  if (qs.len_kv > 0 && qs.len_q > 0) key_range(sp, &qs, &lo, &hi);
  int64_t cap = hi >= lo ? hi - lo + 1 : 0;
  memset(r, 0, sizeof(*r));
  r->j = xcalloc((size_t)cap, sizeof(int64_t));
  r->s = xcalloc((size_t)cap, sizeof(double));
  r->dcap = xcalloc((size_t)cap, sizeof(double));
  r->prob = xcalloc((size_t)cap, sizeof(double));
  r->q = xcalloc((size_t)dqk, sizeof(double));
  fetch_row(p, ATTN_REF_Q, b, i, h, r->q);
  double scale = scale_of(p), softcap = sp->softcap;
  double off = (double)(qs.len_kv - qs.len_q);
  for (int64_t jl = lo; jl <= hi; jl++) {
    if (!block_visible(sp->block_mask, qs.local, jl)) continue;
    double s = scale * dot(r->q, kv_k(kv, qs.k0 + jl), dqk), dcap = 1.0;
    if (softcap > 0.0) {
      s = softcap * tanh(s / softcap);
      dcap = 1.0 - (s / softcap) * (s / softcap);
    }
    if (sp->alibi_slopes) s -= (double)sp->alibi_slopes[h] * fabs((double)qs.local + off - (double)jl);
    r->j[r->n] = qs.k0 + jl;
    r->s[r->n] = s;
    r->dcap[r->n] = dcap;
    r->n++;
  }
  int has_sink = sp->sinks != NULL;
  double sink = has_sink ? (double)sp->sinks[h] : 0.0;
  if (r->n == 0) {
    r->lse = has_sink ? sink : -INFINITY;
    r->sink_p = has_sink ? 1.0 : 0.0;
    return;
  }
  double m = has_sink ? sink : r->s[0];
  for (int64_t x = 0; x < r->n; x++) m = r->s[x] > m ? r->s[x] : m;
  double sum = has_sink ? exp(sink - m) : 0.0;
  for (int64_t x = 0; x < r->n; x++) sum += exp(r->s[x] - m);
  r->lse = m + log(sum);
  for (int64_t x = 0; x < r->n; x++) r->prob[x] = exp(r->s[x] - r->lse);
  r->sink_p = has_sink ? exp(sink - r->lse) : 0.0;
}

/* o_row [Dv] = sum_j P_j v_j. */
static void row_output(const attn_ref_problem *p, ref_kv *kv, const ref_row *r, double *o_row) {
  int64_t dv = dv_of(p);
  for (int64_t d = 0; d < dv; d++) o_row[d] = 0.0;
  for (int64_t x = 0; x < r->n; x++) {
    const double *v = kv_v(kv, r->j[x]);
    for (int64_t d = 0; d < dv; d++) o_row[d] += r->prob[x] * v[d];
  }
}

void attn_ref_fwd_row(const attn_ref_problem *p, int64_t b, int64_t h, int64_t i,
                      double *o_row, double *lse) {
  ref_kv kv;
  ref_row r;
  kv_open(&kv, p, b, h / group_of(p), 0);
  row_compute(p, &kv, b, h, i, &r);
  row_output(p, &kv, &r, o_row);
  *lse = r.lse;
  row_free(&r);
  kv_close(&kv);
}

void attn_ref_fwd(const attn_ref_problem *p, double *o, double *lse) {
  const attn_spec *sp = p->spec;
  int64_t Hq = sp->num_heads_q, dv = dv_of(p);
  for (int64_t b = 0; b < p->batch; b++)
    for (int64_t h = 0; h < Hq; h++) {
      ref_kv kv;
      kv_open(&kv, p, b, h / group_of(p), 1);
      for (int64_t i = 0; i < p->seq_q; i++) {
        ref_row r;
        row_compute(p, &kv, b, h, i, &r);
        row_output(p, &kv, &r, o + ((b * p->seq_q + i) * Hq + h) * dv);
        lse[(b * Hq + h) * p->seq_q + i] = r.lse;
        row_free(&r);
      }
      kv_close(&kv);
    }
}

/* ---- backward ---------------------------------------------------------------------------
 * With P_j = exp(s_j - lse), O = sum P_j v_j, delta = dO.O:
 *   dv_j += P_j dO;   dS_j = P_j (dO.v_j - delta);   dx_j = dS_j * dcap_j * scale
 *   dq += dx_j k_j;   dk_j += dx_j q;   d(sink) += -exp(sink - lse) * delta. */
typedef struct {
  double *dq;                /* [Dqk] */
  double *dk, *dv;           /* [Skv, Dqk], [Skv, Dv] for the full backward, or NULL */
  int64_t only_j;            /* krow: accumulate dk/dv for this key only, into dk/dv[0] */
  double delta, dsink;
} ref_grad;

static void row_backward(const attn_ref_problem *p, ref_kv *kv, int64_t b, int64_t h,
                         int64_t i, ref_grad *g) {
  int64_t dqk = dqk_of(p), dv = dv_of(p);
  double scale = scale_of(p);
  ref_row r;
  row_compute(p, kv, b, h, i, &r);
  double *o = xcalloc((size_t)dv, sizeof(double));
  double *dout = xcalloc((size_t)dv, sizeof(double));
  row_output(p, kv, &r, o);
  fetch_row(p, ATTN_REF_DO, b, i, h, dout);
  g->delta = dot(dout, o, dv);
  g->dsink = p->spec->sinks ? -r.sink_p * g->delta : 0.0;
  if (g->dq) memset(g->dq, 0, (size_t)dqk * sizeof(double));
  for (int64_t x = 0; x < r.n; x++) {
    int64_t j = r.j[x];
    if (g->only_j >= 0 && j != g->only_j) continue;
    const double *k = kv_k(kv, j), *v = kv_v(kv, j);
    double dx = r.prob[x] * (dot(dout, v, dv) - g->delta) * r.dcap[x] * scale;
    if (g->dq)
      for (int64_t d = 0; d < dqk; d++) g->dq[d] += dx * k[d];
    if (g->dk) {
      int64_t row = g->only_j >= 0 ? 0 : j;
      for (int64_t d = 0; d < dqk; d++) g->dk[row * dqk + d] += dx * r.q[d];
      for (int64_t d = 0; d < dv; d++) g->dv[row * dv + d] += r.prob[x] * dout[d];
    }
  }
  free(o);
  free(dout);
  row_free(&r);
}

void attn_ref_bwd_qrow(const attn_ref_problem *p, int64_t b, int64_t h, int64_t i,
                       double *dq_row, double *delta, double *dsink) {
  ref_kv kv;
  ref_grad g = {dq_row, NULL, NULL, -1, 0.0, 0.0};
  kv_open(&kv, p, b, h / group_of(p), 0);
  row_backward(p, &kv, b, h, i, &g);
  kv_close(&kv);
  *delta = g.delta;
  *dsink = g.dsink;
}

void attn_ref_bwd_krow(const attn_ref_problem *p, int64_t b, int64_t hkv, int64_t j,
                       double *dk_row, double *dv_row) {
  const attn_spec *sp = p->spec;
  int64_t dqk = dqk_of(p), dv = dv_of(p), group = group_of(p);
  double *dk = xcalloc((size_t)dqk, sizeof(double)), *dvv = xcalloc((size_t)dv, sizeof(double));
  ref_seq ks = seq_of(p, j, 1);
  int64_t lo = 0, hi = -1;
  if (ks.len_q > 0 && ks.len_kv > 0) query_range(sp, &ks, &lo, &hi);
  ref_kv kv;
  kv_open(&kv, p, b, hkv, 0);
  for (int64_t h = hkv * group; h < (hkv + 1) * group; h++)
    for (int64_t il = lo; il <= hi; il++) {
      if (!attn_ref_visible(p, ks.q0 + il, j)) continue;
      ref_grad g = {NULL, dk, dvv, j, 0.0, 0.0};
      row_backward(p, &kv, b, h, ks.q0 + il, &g);
    }
  kv_close(&kv);
  memcpy(dk_row, dk, (size_t)dqk * sizeof(double));
  memcpy(dv_row, dvv, (size_t)dv * sizeof(double));
  free(dk);
  free(dvv);
}

void attn_ref_bwd(const attn_ref_problem *p, double *dq, double *dk, double *dv,
                  double *dsinks) {
  const attn_spec *sp = p->spec;
  int64_t Hq = sp->num_heads_q, Hkv = sp->num_heads_kv, dqk = dqk_of(p), dvd = dv_of(p);
  int64_t Sq = p->seq_q, Skv = p->seq_kv, group = group_of(p);
  memset(dq, 0, (size_t)(p->batch * Sq * Hq * dqk) * sizeof(double));
  memset(dk, 0, (size_t)(p->batch * Skv * Hkv * dqk) * sizeof(double));
  memset(dv, 0, (size_t)(p->batch * Skv * Hkv * dvd) * sizeof(double));
  if (dsinks) memset(dsinks, 0, (size_t)Hq * sizeof(double));
  double *gk = xcalloc((size_t)(Skv * dqk), sizeof(double));   /* [Skv, Dqk] one kv head */
  double *gv = xcalloc((size_t)(Skv * dvd), sizeof(double));   /* [Skv, Dv] */
  for (int64_t b = 0; b < p->batch; b++)
    for (int64_t hkv = 0; hkv < Hkv; hkv++) {
      ref_kv kv;
      kv_open(&kv, p, b, hkv, 1);
      memset(gk, 0, (size_t)(Skv * dqk) * sizeof(double));
      memset(gv, 0, (size_t)(Skv * dvd) * sizeof(double));
      for (int64_t h = hkv * group; h < (hkv + 1) * group; h++)
        for (int64_t i = 0; i < Sq; i++) {
          ref_grad g = {dq + ((b * Sq + i) * Hq + h) * dqk, gk, gv, -1, 0.0, 0.0};
          row_backward(p, &kv, b, h, i, &g);
          if (dsinks) dsinks[h] += g.dsink;
        }
      for (int64_t j = 0; j < Skv; j++) {
        memcpy(dk + ((b * Skv + j) * Hkv + hkv) * dqk, gk + j * dqk, (size_t)dqk * sizeof(double));
        memcpy(dv + ((b * Skv + j) * Hkv + hkv) * dvd, gv + j * dvd, (size_t)dvd * sizeof(double));
      }
      kv_close(&kv);
    }
  free(gk);
  free(gv);
}
