/* test_ref.c — self-tests of the float64 oracle (kernels/ref), no library needed:
 * visibility against a brute-force reading of DESIGN.md §2, forward against a brute-force
 * softmax over all keys, backward against central finite differences of the forward,
 * row functions against full functions, empty rows, and windowed rows at 1M tokens. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"
#include "test_util.h"

/* ---- a small problem ------------------------------------------------------------------- */
typedef struct {
  const char *name;
  int64_t B, Sq, Skv;
  int Hq, Hkv, Dqk, Dv;
  int causal;
  int64_t wl, wr;
  float softcap, scale;
  int sinks, alibi;
  int nseq;                  /* varlen: > 0, B == 1, lens below */
  int32_t lq[4], lkv[4];
  int bq, bk;                /* block mask block sizes, 0: none */
} cfg;

typedef struct {
  cfg c;
  attn_spec spec;
  float *q, *k, *v, *dout, sinks[16], alibi[16];
  int32_t cu_q[5], cu_kv[5];
  attn_block_mask bm;
  uint8_t mask[256];
  attn_ref_arrays arr;
  attn_ref_problem p;
} prob;

static int64_t nq(const prob *P) { return P->c.B * P->c.Sq * P->c.Hq * P->c.Dqk; }
static int64_t nk(const prob *P) { return P->c.B * P->c.Skv * P->c.Hkv * P->c.Dqk; }
static int64_t nv(const prob *P) { return P->c.B * P->c.Skv * P->c.Hkv * P->c.Dv; }
static int64_t no(const prob *P) { return P->c.B * P->c.Sq * P->c.Hq * P->c.Dv; }

/* Values on a 2^-12 grid so that x +- 2^-12 is exact in float (finite differences). */
static void fill_grid(float *x, int64_t n, double amp, uint64_t seed) {
  tu_fill(x, n, -amp, amp, seed);
  for (int64_t i = 0; i < n; i++) {
    x[i] = (float)(nearbyint(x[i] * 4096.0) / 4096.0);
    if (x[i] == 0.0f) x[i] = 1.0f / 4096.0f;
  }
}

static void prob_init(prob *P, const cfg *c, uint64_t seed) {
  memset(P, 0, sizeof *P);
  P->c = *c;
  if (c->nseq > 0) {
    P->cu_q[0] = P->cu_kv[0] = 0;
    for (int s = 0; s < c->nseq; s++) {
      P->cu_q[s + 1] = P->cu_q[s] + c->lq[s];
      P->cu_kv[s + 1] = P->cu_kv[s] + c->lkv[s];
    }
    P->c.B = 1;
    P->c.Sq = P->cu_q[c->nseq];
    P->c.Skv = P->cu_kv[c->nseq];
  }
  P->q = tu_alloc((size_t)nq(P) * sizeof(float));
  P->k = tu_alloc((size_t)nk(P) * sizeof(float));
  P->v = tu_alloc((size_t)nv(P) * sizeof(float));
  P->dout = tu_alloc((size_t)no(P) * sizeof(float));
  fill_grid(P->q, nq(P), 1.5, seed + 1);
  fill_grid(P->k, nk(P), 1.5, seed + 2);
  fill_grid(P->v, nv(P), 1.0, seed + 3);
  fill_grid(P->dout, no(P), 1.0, seed + 4);
  fill_grid(P->sinks, 16, 1.0, seed + 5);
  for (int h = 0; h < 16; h++) P->alibi[h] = ldexpf(1.0f, -(h + 1)) * 3.0f;
  attn_spec s = ATTN_SPEC_INIT;
  s.num_heads_q = c->Hq;
  s.num_heads_kv = c->Hkv;
  s.head_dim_qk = c->Dqk;
  s.head_dim_v = c->Dv;
  s.scale = c->scale;
  s.causal = c->causal;
  s.window_left = c->wl;
  s.window_right = c->wr;
  s.softcap = c->softcap;
  s.sinks = c->sinks ? P->sinks : NULL;
  s.alibi_slopes = c->alibi ? P->alibi : NULL;
  if (c->nseq > 0) {
    s.cu_seqlens_q = P->cu_q;
    s.cu_seqlens_kv = P->cu_kv;
    s.num_seqs = c->nseq;
  }
  if (c->bq > 0) {
    int64_t maxq = P->c.Sq, maxk = P->c.Skv;
    P->bm.block_q = c->bq;
    P->bm.block_k = c->bk;
    P->bm.num_q_blocks = (maxq + c->bq - 1) / c->bq;
    P->bm.num_k_blocks = (maxk + c->bk - 1) / c->bk;
    tu_rng r = tu_rng_make(seed + 6);
    for (int64_t x = 0; x < P->bm.num_q_blocks * P->bm.num_k_blocks; x++)
      P->mask[x] = (tu_next(&r) & 3) != 0;
    P->bm.mask = P->mask;
    s.block_mask = &P->bm;
  }
  P->spec = s;
  P->arr.q = P->q;
  P->arr.k = P->k;
  P->arr.v = P->v;
  P->arr.dout = P->dout;
  attn_ref_problem_arrays(&P->p, &P->spec, P->c.B, P->c.Sq, P->c.Skv, &P->arr);
}

static void prob_free(prob *P) {
  free(P->q);
  free(P->k);
  free(P->v);
  free(P->dout);
}

/* ---- brute force, straight from DESIGN.md §2 --------------------------------------------- */
/* Sequence of global query position i (and its local i, off, first key); -1 if none. */
static int brute_seq(const prob *P, int64_t i, int64_t *il, int64_t *off, int64_t *k0,
                     int64_t *lkv) {
  if (P->c.nseq == 0) {
    *il = i;
    *off = P->c.Skv - P->c.Sq;
    *k0 = 0;
    *lkv = P->c.Skv;
    return 0;
  }
  for (int s = 0; s < P->c.nseq; s++)
    if (i >= P->cu_q[s] && i < P->cu_q[s + 1]) {
      *il = i - P->cu_q[s];
      *lkv = P->cu_kv[s + 1] - P->cu_kv[s];
      *off = *lkv - (P->cu_q[s + 1] - P->cu_q[s]);
      *k0 = P->cu_kv[s];
      return s;
    }
  return -1;
}

static int brute_visible(const prob *P, int64_t i, int64_t j) {
  int64_t il, off, k0, lkv;
  if (brute_seq(P, i, &il, &off, &k0, &lkv) < 0) return 0;
  int64_t jl = j - k0;
  if (jl < 0 || jl >= lkv) return 0; /* masks never cross a sequence boundary */
  if (P->c.causal && !(jl <= il + off)) return 0;
  if (P->c.wl >= 0 && !(il + off - P->c.wl <= jl)) return 0;
  if (P->c.wr >= 0 && !(jl <= il + off + P->c.wr)) return 0;
  if (P->c.bq > 0) {
    int64_t qb = il / P->bm.block_q, kb = jl / P->bm.block_k;
    if (qb >= P->bm.num_q_blocks || kb >= P->bm.num_k_blocks) return 0;
    if (!P->bm.mask[qb * P->bm.num_k_blocks + kb]) return 0;
  }
  return 1;
}

/* O and LSE by the formula, scanning every key. */
static void brute_fwd(const prob *P, double *o, double *lse) {
  const cfg *c = &P->c;
  double scale = c->scale != 0.0f ? c->scale : 1.0 / sqrt((double)c->Dqk);
  int g = c->Hq / c->Hkv;
  for (int64_t b = 0; b < c->B; b++)
    for (int h = 0; h < c->Hq; h++)
      for (int64_t i = 0; i < c->Sq; i++) {
        int64_t il = 0, off = 0, k0 = 0, lkv = 0;
        brute_seq(P, i, &il, &off, &k0, &lkv);
        const float *qi = P->q + ((b * c->Sq + i) * c->Hq + h) * c->Dqk;
        double m = c->sinks ? P->sinks[h] : -INFINITY, den = 0.0;
        double *acc = o + ((b * c->Sq + i) * c->Hq + h) * c->Dv;
        for (int pass = 0; pass < 2; pass++)
          for (int64_t j = 0; j < c->Skv; j++) {
            if (!brute_visible(P, i, j)) continue;
            const float *kj = P->k + ((b * c->Skv + j) * c->Hkv + h / g) * c->Dqk;
            const float *vj = P->v + ((b * c->Skv + j) * c->Hkv + h / g) * c->Dv;
            double s = 0.0;
            for (int d = 0; d < c->Dqk; d++) s += (double)qi[d] * kj[d];
            s *= scale;
            if (c->softcap > 0) s = c->softcap * tanh(s / c->softcap);
            if (c->alibi) s += -P->alibi[h] * fabs((double)(il + off - (j - k0)));
            if (pass == 0) {
              m = s > m ? s : m;
              continue;
            }
            den += exp(s - m);
            for (int d = 0; d < c->Dv; d++) acc[d] += exp(s - m) * vj[d];
          }
        if (c->sinks) den += exp(P->sinks[h] - m);
        for (int d = 0; d < c->Dv; d++) acc[d] = den > 0 ? acc[d] / den : 0.0;
        lse[(b * c->Hq + h) * c->Sq + i] = den > 0 ? m + log(den) : -INFINITY;
      }
}

/* ---- the checks ----------------------------------------------------------------------- */
static double loss(const prob *P) {
  double *o = tu_dalloc(no(P)), *lse = tu_dalloc(P->c.B * P->c.Hq * P->c.Sq), L = 0.0;
  attn_ref_fwd(&P->p, o, lse);
  for (int64_t x = 0; x < no(P); x++) L += o[x] * P->dout[x];
  free(o);
  free(lse);
  return L;
}

/* Central differences of loss() w.r.t. every element of x, against the analytic grad. */
static void fd_check(prob *P, const char *what, float *x, int64_t n, const double *grad) {
  const float eps = 1.0f / 4096.0f;
  double *fd = tu_dalloc(n), gmax = tu_max_abs(grad, n);
  for (int64_t e = 0; e < n; e++) {
    float keep = x[e];
    x[e] = keep + eps;
    double lp = loss(P);
    x[e] = keep - eps;
    double lm = loss(P);
    x[e] = keep;
    fd[e] = (lp - lm) / (2.0 * eps);
  }
  char label[128];
  snprintf(label, sizeof label, "%s: finite-difference %s", P->c.name, what);
  float *gf = tu_alloc((size_t)n * sizeof(float));
  /* Compare fd (as float) against the analytic gradient (as reference). */
  for (int64_t e = 0; e < n; e++) gf[e] = (float)fd[e];
  tu_compare(label, gf, grad, n, NULL, 2e-5, 2e-6 * (gmax > 1 ? gmax : 1));
  free(gf);
  free(fd);
}

static void check_visible_and_fwd(prob *P) {
  const cfg *c = &P->c;
  int64_t bad = 0;
  for (int64_t i = 0; i < c->Sq; i++)
    for (int64_t j = 0; j < c->Skv; j++) bad += attn_ref_visible(&P->p, i, j) != brute_visible(P, i, j);
  TU_CHECK(bad == 0, "%s: attn_ref_visible disagrees with DESIGN §2 at %lld pairs", c->name,
           (long long)bad);
  int64_t nl = c->B * c->Hq * c->Sq;
  double *o = tu_dalloc(no(P)), *lse = tu_dalloc(nl), *bo = tu_dalloc(no(P)), *bl = tu_dalloc(nl);
  attn_ref_fwd(&P->p, o, lse);
  brute_fwd(P, bo, bl);
  char label[128];
  float *f = tu_alloc((size_t)(no(P) + nl) * sizeof(float));
  for (int64_t x = 0; x < no(P); x++) f[x] = (float)(o[x] - bo[x]);
  for (int64_t x = 0; x < nl; x++) f[no(P) + x] = isinf(bl[x]) && lse[x] == bl[x] ? 0.0f : (float)(lse[x] - bl[x]);
  double *zero = tu_dalloc(no(P) + nl);
  snprintf(label, sizeof label, "%s: ref fwd (O then LSE) - brute force", c->name);
  tu_compare(label, f, zero, no(P) + nl, NULL, 0.0, 1e-6);
  /* Row function == full function, bitwise up to summation order. */
  double *row = tu_dalloc(c->Dv), rl;
  int64_t row_bad = 0;
  for (int64_t b = 0; b < c->B; b++)
    for (int h = 0; h < c->Hq; h++)
      for (int64_t i = 0; i < c->Sq; i++) {
        attn_ref_fwd_row(&P->p, b, h, i, row, &rl);
        const double *orow = o + ((b * c->Sq + i) * c->Hq + h) * c->Dv;
        double L = lse[(b * c->Hq + h) * c->Sq + i];
        if (!(rl == L || fabs(rl - L) <= 1e-12)) row_bad++;
        for (int d = 0; d < c->Dv; d++) row_bad += fabs(row[d] - orow[d]) > 1e-12;
      }
  TU_CHECK(row_bad == 0, "%s: attn_ref_fwd_row differs from attn_ref_fwd (%lld)", c->name,
           (long long)row_bad);
  free(row);
  free(zero);
  free(f);
  free(o);
  free(lse);
  free(bo);
  free(bl);
}

static void check_bwd(prob *P) {
  const cfg *c = &P->c;
  double *dq = tu_dalloc(nq(P)), *dk = tu_dalloc(nk(P)), *dv = tu_dalloc(nv(P));
  double dsinks[16] = {0};
  attn_ref_bwd(&P->p, dq, dk, dv, dsinks);
  for (int64_t x = 0; x < nq(P); x++) TU_CHECK(isfinite(dq[x]), "%s dq[%lld]", c->name, (long long)x);
  fd_check(P, "dq", P->q, nq(P), dq);
  fd_check(P, "dk", P->k, nk(P), dk);
  fd_check(P, "dv", P->v, nv(P), dv);
  if (c->sinks) fd_check(P, "dsinks", P->sinks, c->Hq, dsinks);
  /* qrow / krow against the full backward. */
  double *row = tu_dalloc(c->Dqk > c->Dv ? c->Dqk : c->Dv), *row2 = tu_dalloc(c->Dv);
  double *o = tu_dalloc(no(P)), *lse = tu_dalloc(c->B * c->Hq * c->Sq), dsum[16] = {0};
  attn_ref_fwd(&P->p, o, lse);
  int64_t bad = 0;
  for (int64_t b = 0; b < c->B; b++)
    for (int h = 0; h < c->Hq; h++)
      for (int64_t i = 0; i < c->Sq; i++) {
        double delta, ds, dref = 0.0;
        attn_ref_bwd_qrow(&P->p, b, h, i, row, &delta, &ds);
        dsum[h] += ds;
        int64_t base = (b * c->Sq + i) * c->Hq + h;
        for (int d = 0; d < c->Dv; d++) dref += o[base * c->Dv + d] * P->dout[base * c->Dv + d];
        bad += fabs(delta - dref) > 1e-12;
        for (int d = 0; d < c->Dqk; d++) bad += fabs(row[d] - dq[base * c->Dqk + d]) > 1e-12;
      }
  for (int h = 0; h < c->Hq && c->sinks; h++) bad += fabs(dsum[h] - dsinks[h]) > 1e-12;
  for (int64_t b = 0; b < c->B; b++)
    for (int hk = 0; hk < c->Hkv; hk++)
      for (int64_t j = 0; j < c->Skv; j++) {
        attn_ref_bwd_krow(&P->p, b, hk, j, row, row2);
        int64_t base = (b * c->Skv + j) * c->Hkv + hk;
        for (int d = 0; d < c->Dqk; d++) bad += fabs(row[d] - dk[base * c->Dqk + d]) > 1e-12;
        for (int d = 0; d < c->Dv; d++) bad += fabs(row2[d] - dv[base * c->Dv + d]) > 1e-12;
      }
  TU_CHECK(bad == 0, "%s: row backward functions differ from attn_ref_bwd (%lld)", c->name,
           (long long)bad);
  free(row);
  free(row2);
  free(o);
  free(lse);
  free(dq);
  free(dk);
  free(dv);
}

/* Keys that no query sees get NaN in K and V: outputs and gradients stay finite, empty
 * rows are exactly O = 0, LSE = -inf (or the sink), zero gradients. */
static void check_empty_and_nan(prob *P) {
  const cfg *c = &P->c;
  int g = c->Hq / c->Hkv, planted = 0;
  for (int64_t j = 0; j < c->Skv; j++) {
    int seen = 0;
    for (int64_t i = 0; i < c->Sq; i++) seen |= attn_ref_visible(&P->p, i, j);
    if (seen) continue;
    planted++;
    for (int64_t b = 0; b < c->B; b++)
      for (int hk = 0; hk < c->Hkv; hk++) {
        for (int d = 0; d < c->Dqk; d++) P->k[((b * c->Skv + j) * c->Hkv + hk) * c->Dqk + d] = NAN;
        for (int d = 0; d < c->Dv; d++) P->v[((b * c->Skv + j) * c->Hkv + hk) * c->Dv + d] = INFINITY;
      }
  }
  double *o = tu_dalloc(no(P)), *lse = tu_dalloc(c->B * c->Hq * c->Sq);
  double *dq = tu_dalloc(nq(P)), *dk = tu_dalloc(nk(P)), *dv = tu_dalloc(nv(P)), dsinks[16];
  attn_ref_fwd(&P->p, o, lse);
  attn_ref_bwd(&P->p, dq, dk, dv, dsinks);
  int64_t nonfinite = 0, bad_empty = 0, empties = 0;
  for (int64_t x = 0; x < no(P); x++) nonfinite += !isfinite(o[x]);
  for (int64_t x = 0; x < nq(P); x++) nonfinite += !isfinite(dq[x]);
  for (int64_t x = 0; x < nk(P); x++) nonfinite += !isfinite(dk[x]);
  for (int64_t x = 0; x < nv(P); x++) nonfinite += !isfinite(dv[x]);
  for (int h = 0; h < c->Hq && c->sinks; h++) nonfinite += !isfinite(dsinks[h]);
  for (int64_t b = 0; b < c->B; b++)
    for (int h = 0; h < c->Hq; h++)
      for (int64_t i = 0; i < c->Sq; i++) {
        int any = 0;
        for (int64_t j = 0; j < c->Skv; j++) any |= attn_ref_visible(&P->p, i, j);
        if (any) continue;
        empties++;
        int64_t base = (b * c->Sq + i) * c->Hq + h;
        double L = lse[(b * c->Hq + h) * c->Sq + i];
        bad_empty += c->sinks ? L != P->sinks[h] : !(isinf(L) && L < 0);
        for (int d = 0; d < c->Dv; d++) bad_empty += o[base * c->Dv + d] != 0.0;
        for (int d = 0; d < c->Dqk; d++) bad_empty += dq[base * c->Dqk + d] != 0.0;
      }
  TU_CHECK(nonfinite == 0, "%s: %lld non-finite outputs with NaN in %d masked keys", c->name,
           (long long)nonfinite, planted);
  TU_CHECK(bad_empty == 0, "%s: %lld wrong values in %lld empty rows", c->name,
           (long long)bad_empty, (long long)empties);
  (void)g;
  free(o);
  free(lse);
  free(dq);
  free(dk);
  free(dv);
}

/* ---- 1M tokens with a window: rows of the huge problem equal rows of a small copy ------ */
typedef struct {
  int64_t qbase, kbase; /* global position of local position 0 */
  int dqk, dv;
} hash_src;

static float hash_val(int which, int64_t b, int64_t s, int64_t h, int64_t d) {
  uint64_t z = ((uint64_t)which << 60) ^ ((uint64_t)b << 52) ^ ((uint64_t)s << 16) ^
               ((uint64_t)h << 9) ^ (uint64_t)d;
  tu_rng r = tu_rng_make(z);
  return (float)tu_uniform(&r, -1.0, 1.0);
}

static void hash_fetch(void *user, int which, int64_t b, int64_t s, int64_t h, float *out) {
  const hash_src *hs = user;
  int64_t pos = s + (which == ATTN_REF_K || which == ATTN_REF_V ? hs->kbase : hs->qbase);
  int n = which == ATTN_REF_Q || which == ATTN_REF_K ? hs->dqk : hs->dv;
  for (int d = 0; d < n; d++) out[d] = hash_val(which, b, pos, h, d);
}

static void check_million(int causal) {
  const int64_t S = (int64_t)1 << 20, off = 5, L = 40, R = 17;
  attn_spec sp = ATTN_SPEC_INIT;
  float sinks[2] = {0.3f, -0.2f}, alibi[2] = {0.01f, 0.002f};
  sp.num_heads_q = 2;
  sp.num_heads_kv = 1;
  sp.head_dim_qk = 8;
  sp.head_dim_v = 5;
  sp.causal = causal;
  sp.window_left = L;
  sp.window_right = R;
  sp.softcap = 2.0f;
  sp.sinks = sinks;
  sp.alibi_slopes = alibi;
  hash_src big = {0, 0, 8, 5};
  attn_ref_problem pb = {&sp, 1, S, S + off, hash_fetch, &big};
  int64_t rows[3] = {0, S / 2 + 3, S - 1};
  for (int r = 0; r < 3; r++) {
    int64_t i = rows[r], j = rows[r] + 2; /* also the key row j */
    /* Small problem: positions [base, base + n) of both, off preserved. */
    int64_t n = 2 * (L + R) + 8, base = (j - L - R - 3 > 0 ? j - L - R - 3 : 0);
    if (base + n > S) base = S - n;
    hash_src small = {base, base, 8, 5};
    attn_ref_problem ps = {&sp, 1, n, n + off, hash_fetch, &small};
    double o1[5], o2[5], l1, l2, dq1[8], dq2[8], dl1, dl2, s1, s2, dk1[8], dk2[8], dv1[5], dv2[5];
    attn_ref_fwd_row(&pb, 0, 1, i, o1, &l1);
    attn_ref_fwd_row(&ps, 0, 1, i - base, o2, &l2);
    attn_ref_bwd_qrow(&pb, 0, 0, i, dq1, &dl1, &s1);
    attn_ref_bwd_qrow(&ps, 0, 0, i - base, dq2, &dl2, &s2);
    attn_ref_bwd_krow(&pb, 0, 0, j, dk1, dv1);
    attn_ref_bwd_krow(&ps, 0, 0, j - base, dk2, dv2);
    double err = fabs(l1 - l2) + fabs(dl1 - dl2) + fabs(s1 - s2);
    for (int d = 0; d < 5; d++) err += fabs(o1[d] - o2[d]) + fabs(dv1[d] - dv2[d]);
    for (int d = 0; d < 8; d++) err += fabs(dq1[d] - dq2[d]) + fabs(dk1[d] - dk2[d]);
    TU_CHECK(err < 1e-12 && isfinite(l1), "1M causal=%d row %lld: big vs small err %g", causal,
             (long long)i, err);
  }
}

static const cfg cases[] = {
    {"plain", 2, 5, 7, 2, 1, 4, 3, 0, -1, -1, 0, 0, 0, 0, 0, {0}, {0}, 0, 0},
    {"causal+sinks Sq>Skv", 1, 7, 5, 2, 2, 3, 3, 1, -1, -1, 0, 0, 1, 0, 0, {0}, {0}, 0, 0},
    {"causal Sq<Skv", 1, 4, 9, 1, 1, 3, 2, 1, -1, -1, 0, 0, 0, 0, 0, {0}, {0}, 0, 0},
    {"window+alibi+softcap", 1, 8, 8, 2, 1, 4, 4, 0, 2, 1, 0.7f, 0, 0, 1, 0, {0}, {0}, 0, 0},
    {"all GQA", 2, 6, 7, 4, 2, 3, 5, 1, 3, 0, 0.9f, 0.6f, 1, 1, 0, {0}, {0}, 0, 0},
    {"window left only Sq>Skv", 1, 9, 4, 1, 1, 2, 2, 0, 1, -1, 0, 0, 1, 0, 0, {0}, {0}, 0, 0},
    {"varlen causal sinks", 1, 0, 0, 2, 1, 3, 2, 1, -1, -1, 0, 0, 1, 0, 3, {3, 1, 4}, {2, 5, 3}, 0, 0},
    {"varlen window alibi", 1, 0, 0, 3, 3, 2, 3, 0, 1, 2, 0.8f, 0, 0, 1, 3, {4, 2, 3}, {3, 3, 5}, 0, 0},
    {"block mask causal", 1, 9, 11, 2, 1, 3, 3, 1, -1, -1, 0, 0, 1, 0, 0, {0}, {0}, 2, 3},
    {"block mask varlen", 1, 0, 0, 2, 2, 2, 2, 0, -1, -1, 0, 0, 0, 1, 2, {5, 4}, {6, 3}, 2, 2},
    {"MQA Sq=1", 1, 1, 6, 3, 1, 4, 2, 0, -1, -1, 0.5f, 0, 1, 0, 0, {0}, {0}, 0, 0},
    {"Skv=1", 2, 6, 1, 2, 1, 3, 3, 1, -1, -1, 0, 0, 1, 1, 0, {0}, {0}, 0, 0},
    {"empty window", 1, 6, 6, 1, 1, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0, {0}, {0}, 0, 0},
};

int main(void) {
  for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
    prob P;
    prob_init(&P, &cases[t], 1000 + 17 * t);
    check_visible_and_fwd(&P);
    check_bwd(&P);
    check_empty_and_nan(&P);
    prob_free(&P);
  }
  /* A hand-computed case: q=1, k=(1,2), v=(3,5), scale 1, sink 0.5. */
  {
    float q = 1, k[2] = {1, 2}, v[2] = {3, 5}, sink = 0.5f;
    attn_spec sp = ATTN_SPEC_INIT;
    sp.num_heads_q = sp.num_heads_kv = sp.head_dim_qk = 1;
    sp.scale = 1.0f;
    sp.sinks = &sink;
    attn_ref_arrays a = {&q, k, v, NULL};
    attn_ref_problem p;
    attn_ref_problem_arrays(&p, &sp, 1, 1, 2, &a);
    double o, lse, e1 = exp(1.0), e2 = exp(2.0), es = exp(0.5);
    attn_ref_fwd(&p, &o, &lse);
    TU_CHECK(fabs(o - (3 * e1 + 5 * e2) / (e1 + e2 + es)) < 1e-14, "hand O %g", o);
    TU_CHECK(fabs(lse - log(e1 + e2 + es)) < 1e-14, "hand LSE %g", lse);
  }
  check_million(0);
  check_million(1);
  return tu_finish("test_ref");
}
