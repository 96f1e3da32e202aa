/* test_layer_ref.c — inputs, the float64 reference of the whole TP layer, and per-rank
 * slicing for the layer tests (see test_layer.h). Nothing here calls the library's layer. */
#include "test_layer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Small nonzero integers in [-2, 2]. */
static void fill_int(float *x, int64_t n, uint64_t seed) {
  tu_rng r = tu_rng_make(seed);
  for (int64_t i = 0; i < n; i++) {
    int64_t v = tu_randint(&r, -2, 1);
    x[i] = (float)(v >= 0 ? v + 1 : v);
  }
}

static void fill(float *x, int64_t n, double amp, int integer, uint64_t seed) {
  if (integer) fill_int(x, n, seed);
  else tu_fill(x, n, -amp, amp, seed);
}

static void make_spec(tl_prob *P) {
  const tl_case *c = &P->c;
  attn_spec s = ATTN_SPEC_INIT;
  s.num_heads_q = c->Hq;
  s.num_heads_kv = c->Hkv;
  s.head_dim_qk = c->Dqk;
  s.head_dim_v = (int32_t)P->Dv;
  s.causal = c->causal;
  s.window_left = c->wl;
  s.window_right = c->wr;
  s.softcap = c->softcap;
  s.sinks = P->sinks;
  s.alibi_slopes = P->alibi;
  if (c->nseq) {
    s.cu_seqlens_q = s.cu_seqlens_kv = P->cu;
    s.num_seqs = c->nseq;
  }
  P->spec = s;
}

void tl_init(tl_prob *P, const tl_case *c) {
  memset(P, 0, sizeof *P);
  P->c = *c;
  P->Dv = c->Dv ? c->Dv : c->Dqk;
  int64_t BS = c->B * c->S, d = c->d;
  double wamp = 1.0 / sqrt((double)d);
  P->x = tu_falloc(BS * d);
  P->dy = tu_falloc(BS * d);
  P->wq = tu_falloc(d * c->Hq * c->Dqk);
  P->wk = tu_falloc(d * c->Hkv * c->Dqk);
  P->wv = tu_falloc(d * c->Hkv * P->Dv);
  P->wo = tu_falloc(c->Hq * P->Dv * d);
  fill(P->x, BS * d, 1.0, c->integer, c->seed + 1);
  fill(P->dy, BS * d, 1.0, c->integer, c->seed + 2);
  fill(P->wk, d * c->Hkv * c->Dqk, 2.0 * wamp, c->integer, c->seed + 4);
  fill(P->wv, d * c->Hkv * P->Dv, 2.0 * wamp, c->integer, c->seed + 5);
  fill(P->wo, c->Hq * P->Dv * d, wamp, c->integer, c->seed + 6);
  if (c->integer) memset(P->wq, 0, (size_t)(d * c->Hq * c->Dqk) * sizeof(float));
  else fill(P->wq, d * c->Hq * c->Dqk, 2.0 * wamp, 0, c->seed + 3);
  if (c->sinks) {
    P->sinks = tu_falloc(c->Hq);
    tu_fill(P->sinks, c->Hq, -1.0, 1.0, c->seed + 7);
  }
  if (c->alibi) {
    P->alibi = tu_falloc(c->Hq);
    for (int h = 0; h < c->Hq; h++) P->alibi[h] = (float)pow(2.0, -8.0 * (h + 1) / c->Hq);
  }
  if (c->nseq) {
    P->cu = tu_alloc((size_t)(c->nseq + 1) * sizeof(int32_t));
    for (int i = 0; i < c->nseq; i++) P->cu[i + 1] = P->cu[i] + c->lens[i];
  }
  make_spec(P);
}

void tl_free(tl_prob *P) {
  void *ps[] = {P->x, P->dy, P->wq, P->wk, P->wv, P->wo, P->sinks, P->alibi, P->cu,
                P->y, P->dx, P->dwq, P->dwk, P->dwv, P->dwo};
  for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) free(ps[i]);
  memset(P, 0, sizeof *P);
}

attn_layer_config tl_config(const tl_prob *P) {
  attn_layer_config cfg = ATTN_LAYER_CONFIG_INIT;
  cfg.d_model = P->c.d;
  cfg.spec = P->spec;
  cfg.rope_theta = P->c.rope;
  cfg.layout = P->c.layout;
  if (P->c.adt) cfg.attention_dtype = P->c.adt;
  return cfg;
}

/* ---- float64 linear algebra -------------------------------------------------------- */

/* c[m, n] = a[m, k] · b[k, n], both float. */
static void mm_fd(const float *a, const float *b, double *c, int64_t m, int64_t k, int64_t n) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double s = 0;
      for (int64_t t = 0; t < k; t++) s += (double)a[i * k + t] * b[t * n + j];
      c[i * n + j] = s;
    }
}

/* c[m, n] = a[m, k] · b[n, k]^T, a double, b float. */
static void mm_dft(const double *a, const float *b, double *c, int64_t m, int64_t k,
                   int64_t n) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double s = 0;
      for (int64_t t = 0; t < k; t++) s += a[i * k + t] * b[j * k + t];
      c[i * n + j] = s;
    }
}

/* c[k, n] = a[m, k]^T · b[m, n], a float, b double. */
static void mm_ftd(const float *a, const double *b, double *c, int64_t m, int64_t k,
                   int64_t n) {
  memset(c, 0, (size_t)(k * n) * sizeof(double));
  for (int64_t t = 0; t < m; t++)
    for (int64_t i = 0; i < k; i++)
      for (int64_t j = 0; j < n; j++) c[i * n + j] += (double)a[t * k + i] * b[t * n + j];
}

/* c[m, n] = a[m, k] · b[k, n], a double, b float. */
static void mm_df(const double *a, const float *b, double *c, int64_t m, int64_t k, int64_t n) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double s = 0;
      for (int64_t t = 0; t < k; t++) s += a[i * k + t] * b[t * n + j];
      c[i * n + j] = s;
    }
}

/* ---- RoPE in float64 (GPT-NeoX half-split) ---------------------------------------------
 * With varlen the reference restarts positions at each sequence (as frameworks do) while
 * the layer uses global rows: RoPE scores depend on i - j only and masks never cross a
 * sequence, so both must give the same outputs; the varlen case checks that. */

static int64_t position(const tl_prob *P, int64_t s) {
  if (!P->c.nseq) return s;
  int i = 0;
  while (P->cu[i + 1] <= s) i++;
  return s - P->cu[i];
}

/* x [B, S, H, D]; inverse rotates by -angle (the transpose, for gradients). */
static void rope(const tl_prob *P, double *x, int64_t H, int inverse) {
  int64_t D = P->c.Dqk, half = D / 2;
  if (P->c.rope == 0.0f) return;
  for (int64_t b = 0; b < P->c.B; b++)
    for (int64_t s = 0; s < P->c.S; s++)
      for (int64_t h = 0; h < H; h++) {
        double *r = x + ((b * P->c.S + s) * H + h) * D;
        for (int64_t i = 0; i < half; i++) {
          double ang = (double)position(P, s) * pow((double)P->c.rope, -2.0 * i / D);
          double cs = cos(ang), sn = inverse ? -sin(ang) : sin(ang);
          double a = r[i], bb = r[i + half];
          r[i] = a * cs - bb * sn;
          r[i + half] = a * sn + bb * cs;
        }
      }
}

static float *to_float(const double *x, int64_t n) {
  float *f = tu_falloc(n);
  for (int64_t i = 0; i < n; i++) f[i] = (float)x[i];
  return f;
}

/* ---- the reference layer ----------------------------------------------------------------- */

typedef struct {
  double *q, *k, *v, *o, *dout, *dq, *dk, *dv;
  float *qf, *kf, *vf, *dof;
} ref_work;

static void ref_forward(tl_prob *P, ref_work *w) {
  const tl_case *c = &P->c;
  int64_t M = c->B * c->S, d = c->d, Dv = P->Dv;
  w->q = tu_dalloc(M * c->Hq * c->Dqk);
  w->k = tu_dalloc(M * c->Hkv * c->Dqk);
  w->v = tu_dalloc(M * c->Hkv * Dv);
  w->o = tu_dalloc(M * c->Hq * Dv);
  mm_fd(P->x, P->wq, w->q, M, d, c->Hq * c->Dqk);
  mm_fd(P->x, P->wk, w->k, M, d, c->Hkv * c->Dqk);
  mm_fd(P->x, P->wv, w->v, M, d, c->Hkv * Dv);
  rope(P, w->q, c->Hq, 0);
  rope(P, w->k, c->Hkv, 0);
  w->qf = to_float(w->q, M * c->Hq * c->Dqk);
  w->kf = to_float(w->k, M * c->Hkv * c->Dqk);
  w->vf = to_float(w->v, M * c->Hkv * Dv);
  attn_ref_arrays arr = {w->qf, w->kf, w->vf, NULL};
  attn_ref_problem rp;
  attn_ref_problem_arrays(&rp, &P->spec, c->B, c->S, c->S, &arr);
  double *lse = tu_dalloc(c->B * c->Hq * c->S);
  attn_ref_fwd(&rp, w->o, lse);
  free(lse);
  P->y = tu_dalloc(M * d);
  mm_df(w->o, P->wo, P->y, M, c->Hq * Dv, d); /* y = O · W_o */
}

static void ref_backward(tl_prob *P, ref_work *w) {
  const tl_case *c = &P->c;
  int64_t M = c->B * c->S, d = c->d, Dv = P->Dv, nq = c->Hq * c->Dqk, nk = c->Hkv * c->Dqk,
          nv = c->Hkv * Dv, no = c->Hq * Dv;
  double *dyd = tu_dalloc(M * d);
  for (int64_t i = 0; i < M * d; i++) dyd[i] = P->dy[i];
  w->dout = tu_dalloc(M * no);
  mm_dft(dyd, P->wo, w->dout, M, d, no); /* dO = dy · W_o^T */
  P->dwo = tu_dalloc(no * d);
  for (int64_t t = 0; t < M; t++) /* dW_o = O^T · dy */
    for (int64_t i = 0; i < no; i++)
      for (int64_t j = 0; j < d; j++) P->dwo[i * d + j] += w->o[t * no + i] * P->dy[t * d + j];
  w->dof = to_float(w->dout, M * no);
  attn_ref_arrays arr = {w->qf, w->kf, w->vf, w->dof};
  attn_ref_problem rp;
  attn_ref_problem_arrays(&rp, &P->spec, c->B, c->S, c->S, &arr);
  w->dq = tu_dalloc(M * nq);
  w->dk = tu_dalloc(M * nk);
  w->dv = tu_dalloc(M * nv);
  double *ds = tu_dalloc(c->Hq);
  attn_ref_bwd(&rp, w->dq, w->dk, w->dv, ds);
  free(ds);
  rope(P, w->dq, c->Hq, 1);
  rope(P, w->dk, c->Hkv, 1);
  P->dwq = tu_dalloc(d * nq);
  P->dwk = tu_dalloc(d * nk);
  P->dwv = tu_dalloc(d * nv);
  mm_ftd(P->x, w->dq, P->dwq, M, d, nq);
  mm_ftd(P->x, w->dk, P->dwk, M, d, nk);
  mm_ftd(P->x, w->dv, P->dwv, M, d, nv);
  P->dx = tu_dalloc(M * d);
  double *t = tu_dalloc(M * d);
  const double *g[3] = {w->dq, w->dk, w->dv};
  const float *wt[3] = {P->wq, P->wk, P->wv};
  int64_t n[3] = {nq, nk, nv};
  for (int m = 0; m < 3; m++) { /* dx += dG · W^T */
    mm_dft(g[m], wt[m], t, M, n[m], d);
    for (int64_t i = 0; i < M * d; i++) P->dx[i] += t[i];
  }
  free(t);
  free(dyd);
}

void tl_ref(tl_prob *P) {
  ref_work w;
  memset(&w, 0, sizeof w);
  ref_forward(P, &w);
  ref_backward(P, &w);
  void *ps[] = {w.q, w.k, w.v, w.o, w.dout, w.dq, w.dk, w.dv, w.qf, w.kf, w.vf, w.dof};
  for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) free(ps[i]);
}

/* ---- slicing ------------------------------------------------------------------------------- */

attn_layer_heads tl_expected_heads(const tl_case *c, int tp, int tp_rank) {
  attn_layer_heads h;
  h.hq = c->Hq / tp;
  h.hq0 = tp_rank * h.hq;
  if (c->Hkv >= tp) {
    h.hk = c->Hkv / tp;
    h.hk0 = tp_rank * h.hk;
  } else {
    h.hk = 1;
    h.hk0 = h.hq0 / (c->Hq / c->Hkv);
  }
  return h;
}

/* Chunk ch of n over S rows: [floor(ch*S/n), floor((ch+1)*S/n)). */
static void chunk(int64_t S, int n, int ch, int64_t *start, int64_t *len) {
  *start = ch * S / n;
  *len = (ch + 1) * S / n - *start;
}

static void copy_rows(const float *src, float *dst, const tl_slice *s, int64_t B, int64_t S,
                      int64_t w) {
  for (int64_t b = 0; b < B; b++) {
    int64_t r = 0;
    for (int i = 0; i < s->count; i++)
      for (int64_t g = s->start[i]; g < s->start[i] + s->len[i]; g++, r++)
        memcpy(dst + (b * s->rows + r) * w, src + (b * S + g) * w, (size_t)w * sizeof(float));
  }
}

/* dst[row, c0 + j] = src[row, s0 + j] for j < n, rows of d. */
static void copy_cols(const float *src, int64_t lds, int64_t s0, float *dst, int64_t ldd,
                      int64_t c0, int64_t n, int64_t rows) {
  for (int64_t r = 0; r < rows; r++)
    memcpy(dst + r * ldd + c0, src + r * lds + s0, (size_t)n * sizeof(float));
}

void tl_slice_make(const tl_prob *P, int tp, int tp_rank, int cp, int cp_rank, tl_slice *s) {
  const tl_case *c = &P->c;
  memset(s, 0, sizeof *s);
  s->h = tl_expected_heads(c, tp, tp_rank);
  if (cp == 1) {
    s->count = 1;
    s->len[0] = c->S;
  } else if (c->layout == ATTN_LAYOUT_ZIGZAG) {
    s->count = 2;
    chunk(c->S, 2 * cp, cp_rank, &s->start[0], &s->len[0]);
    chunk(c->S, 2 * cp, 2 * cp - 1 - cp_rank, &s->start[1], &s->len[1]);
  } else {
    s->count = 1;
    chunk(c->S, cp, cp_rank, &s->start[0], &s->len[0]);
  }
  s->rows = s->len[0] + s->len[1];
  int64_t d = c->d, Dqk = c->Dqk, Dv = P->Dv, hq = s->h.hq, hk = s->h.hk;
  s->cols = hq * Dqk + hk * (Dqk + Dv);
  s->x = tu_falloc(c->B * s->rows * d);
  s->dy = tu_falloc(c->B * s->rows * d);
  copy_rows(P->x, s->x, s, c->B, c->S, d);
  copy_rows(P->dy, s->dy, s, c->B, c->S, d);
  s->wqkv = tu_falloc(d * s->cols);
  copy_cols(P->wq, c->Hq * Dqk, s->h.hq0 * Dqk, s->wqkv, s->cols, 0, hq * Dqk, d);
  copy_cols(P->wk, c->Hkv * Dqk, s->h.hk0 * Dqk, s->wqkv, s->cols, hq * Dqk, hk * Dqk, d);
  copy_cols(P->wv, c->Hkv * Dv, s->h.hk0 * Dv, s->wqkv, s->cols, (hq + hk) * Dqk, hk * Dv, d);
  s->wo = tu_falloc(hq * Dv * d);
  memcpy(s->wo, P->wo + s->h.hq0 * Dv * d, (size_t)(hq * Dv * d) * sizeof(float));
}

void tl_slice_free(tl_slice *s) {
  free(s->x);
  free(s->dy);
  free(s->wqkv);
  free(s->wo);
  memset(s, 0, sizeof *s);
}

static void dcopy_cols(const double *src, int64_t lds, int64_t s0, double *dst, int64_t ldd,
                       int64_t c0, int64_t n, int64_t rows) {
  for (int64_t r = 0; r < rows; r++)
    memcpy(dst + r * ldd + c0, src + r * lds + s0, (size_t)n * sizeof(double));
}

static void drows(const double *src, double *dst, const tl_slice *s, int64_t B, int64_t S,
                  int64_t w) {
  for (int64_t b = 0; b < B; b++) {
    int64_t r = 0;
    for (int i = 0; i < s->count; i++)
      for (int64_t g = s->start[i]; g < s->start[i] + s->len[i]; g++, r++)
        memcpy(dst + (b * s->rows + r) * w, src + (b * S + g) * w, (size_t)w * sizeof(double));
  }
}

void tl_slice_ref(const tl_prob *P, const tl_slice *s, double *y, double *dx, double *dwqkv,
                  double *dwo) {
  const tl_case *c = &P->c;
  int64_t d = c->d, Dqk = c->Dqk, Dv = P->Dv, hq = s->h.hq, hk = s->h.hk;
  drows(P->y, y, s, c->B, c->S, d);
  drows(P->dx, dx, s, c->B, c->S, d);
  dcopy_cols(P->dwq, c->Hq * Dqk, s->h.hq0 * Dqk, dwqkv, s->cols, 0, hq * Dqk, d);
  dcopy_cols(P->dwk, c->Hkv * Dqk, s->h.hk0 * Dqk, dwqkv, s->cols, hq * Dqk, hk * Dqk, d);
  dcopy_cols(P->dwv, c->Hkv * Dv, s->h.hk0 * Dv, dwqkv, s->cols, (hq + hk) * Dqk, hk * Dv, d);
  memcpy(dwo, P->dwo + s->h.hq0 * Dv * d, (size_t)(hq * Dv * d) * sizeof(double));
}
