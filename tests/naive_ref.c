/* naive_ref.c — the naive same-precision attention kernel and FlashAttention's judging
 * rule (naive_ref.h). */
#include "naive_ref.h"

#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Score of (b, h, i, j) as a same-precision kernel computes it (float). */
static float naive_score(const naive_problem *P, int64_t b, int64_t h, int64_t i, int64_t j) {
  const int64_t hk = h / (P->Hq / P->Hkv), D = P->D;
  const float *q = P->q + ((b * P->Sq + i) * P->Hq + h) * D;
  const float *k = P->k + ((b * P->Skv + j) * P->Hkv + hk) * D;
  float acc = 0.0f;
  for (int64_t d = 0; d < D; d++) acc += q[d] * k[d];
  float s = acc * P->scale;
  if (P->softcap > 0) s = P->softcap * tanhf(s / P->softcap);
  if (P->alibi) {
    /* sequence-local distance |i + off - j| */
    int64_t iq = i, jk = j, off = P->Skv - P->Sq;
    if (P->nseq) {
      int s_ = 0;
      while (!(P->cu_q[s_] <= i && i < P->cu_q[s_ + 1])) s_++;
      iq = i - P->cu_q[s_];
      jk = j - P->cu_kv[s_];
      off = (P->cu_kv[s_ + 1] - P->cu_kv[s_]) - (P->cu_q[s_ + 1] - P->cu_q[s_]);
    }
    s -= P->alibi[h] * fabsf((float)(iq + off - jk));
  }
  return s;
}

/* Forward and backward of a naive kernel in the case's precision: float arithmetic, P
 * (and dS) rounded to the dtype before their products, O rounded to the dtype. */
void naive_run(const naive_problem *P, int bwd, naive_out *out) {
  const int64_t D = P->D, Dv = P->Dv, G = P->Hq / P->Hkv, dt = P->dtype;
  float *no = tu_alloc((size_t)(P->B * P->Sq * P->Hq * P->Dv) * 4);   /* O */
  float *nlse = tu_alloc((size_t)(P->B * P->Hq * P->Sq) * 4);          /* LSE */
  float *ndq = NULL, *ndk = NULL, *ndv = NULL, *nds = NULL;
  if (bwd) {
    ndq = tu_alloc((size_t)(P->B * P->Sq * P->Hq * P->D) * 4);
    ndk = tu_alloc((size_t)(P->B * P->Skv * P->Hkv * P->D) * 4);
    ndv = tu_alloc((size_t)(P->B * P->Skv * P->Hkv * P->Dv) * 4);
    nds = tu_alloc((size_t)P->Hq * 4 + 4);
  }
  float *s = tu_alloc((size_t)P->Skv * 4), *pr = tu_alloc((size_t)P->Skv * 4);
  float *acc = tu_alloc((size_t)Dv * 4);
  for (int64_t b = 0; b < P->B; b++)
    for (int64_t h = 0; h < P->Hq; h++)
      for (int64_t i = 0; i < P->Sq; i++) {
        const uint8_t *vis = P->vis + i * P->Skv;
        float m = P->sinks ? P->sinks[h] : -INFINITY;
        for (int64_t j = 0; j < P->Skv; j++)
          if (vis[j]) {
            s[j] = naive_score(P, b, h, i, j);
            m = s[j] > m ? s[j] : m;
          }
        float l = P->sinks && m != -INFINITY ? expf(P->sinks[h] - m) : 0.0f;
        for (int64_t j = 0; j < P->Skv; j++)
          if (vis[j]) l += expf(s[j] - m);
        const float lse = m == -INFINITY ? -INFINITY : m + logf(l);
        nlse[(b * P->Hq + h) * P->Sq + i] = lse;
        memset(acc, 0, (size_t)Dv * 4);
        for (int64_t j = 0; j < P->Skv; j++) {
          if (!vis[j]) continue;
          pr[j] = expf(s[j] - lse);
          const float pb = tu_round(pr[j], (int)dt);
          const float *v = P->v + ((b * P->Skv + j) * P->Hkv + h / G) * Dv;
          for (int64_t d = 0; d < Dv; d++) acc[d] += pb * v[d];
        }
        float *o = no + ((b * P->Sq + i) * P->Hq + h) * Dv;
        for (int64_t d = 0; d < Dv; d++) o[d] = tu_round(acc[d], (int)dt);
        if (!bwd) continue;
        const float *dO = P->dout + ((b * P->Sq + i) * P->Hq + h) * Dv;
        float delta = 0.0f;
        for (int64_t d = 0; d < Dv; d++) delta += dO[d] * o[d];
        if (P->sinks && lse != -INFINITY) nds[h] -= expf(P->sinks[h] - lse) * delta;
        float *dq = ndq + ((b * P->Sq + i) * P->Hq + h) * D;
        const float *q = P->q + ((b * P->Sq + i) * P->Hq + h) * D;
        for (int64_t j = 0; j < P->Skv; j++) {
          if (!vis[j]) continue;
          const int64_t kr = (b * P->Skv + j) * P->Hkv + h / G;
          const float *k = P->k + kr * D, *v = P->v + kr * Dv;
          float dp = 0.0f;
          for (int64_t d = 0; d < Dv; d++) dp += dO[d] * v[d];
          float dcap = 1.0f;
          if (P->softcap > 0) { /* d(cap*tanh(x/cap))/dx = 1 - tanh^2 */
            float raw = 0.0f;
            for (int64_t d = 0; d < D; d++) raw += q[d] * k[d];
            const float th = tanhf(raw * P->scale / P->softcap);
            dcap = 1.0f - th * th;
          }
          const float ds = tu_round(pr[j] * (dp - delta) * P->scale * dcap, (int)dt);
          const float pb = tu_round(pr[j], (int)dt);
          for (int64_t d = 0; d < D; d++) {
            dq[d] += ds * k[d];
            ndk[kr * D + d] += ds * q[d];
          }
          for (int64_t d = 0; d < Dv; d++) ndv[kr * Dv + d] += pb * dO[d];
        }
      }
  *out = (naive_out){no, nlse, ndq, ndk, ndv, nds};
  free(s);
  free(pr);
  free(acc);
}

int naive_judge(const char *what, const float *got, const double *ref, const float *naive,
                int64_t n, const int64_t *dims, double extra) {
  double maxref = 0.0, err_n = 0.0, err_k = -1.0;
  int64_t wi = 0;
  for (int64_t i = 0; i < n; i++)
    if (isfinite(ref[i]) && fabs(ref[i]) > maxref) maxref = fabs(ref[i]);
  for (int64_t i = 0; i < n; i++) {
    double en = tu_element_error(naive[i], ref[i]), ek = tu_element_error(got[i], ref[i]);
    if (en > err_n) err_n = en;
    if (ek > err_k) {
      err_k = ek;
      wi = i;
    }
  }
  /* FlashAttention's rule, plus an atol far below the dtype's rounding. */
  const double tol = 2.0 * err_n + 1e-4 * maxref + 1e-6 + extra;
  if (n == 0 || err_k <= tol) return 1;
  tu_failures++;
  fprintf(stderr, "FAIL %s: max err %.3e > tol %.3e (naive err %.3e, max|ref| %.3e); worst at ",
          what, err_k, tol, err_n, maxref);
  tu_print_index(wi, dims);
  fprintf(stderr, " got %.9g ref %.9g naive %.9g%s\n", (double)got[wi], ref[wi], (double)naive[wi],
          tu_count_poison(got + wi, 1) ? " (poison: never written)" : "");
  return 0;
}

double naive_grad_noise(int64_t Sq, int64_t Skv, int64_t D, int64_t Dv, double scale,
                        double amp) {
  const double terms = (double)(Sq > Skv ? Sq : Skv) * (double)(D > Dv ? D : Dv);
  return 16.0 * 0x1p-24 * sqrt(terms) * scale * (amp > 0 ? amp : 1.0);
}
