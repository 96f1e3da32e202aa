/* tile_scalar.c — portable C tile primitives: always built, forceable (force_scalar), and
 * the definition the AVX-512 primitives must match. */
#include "convert.h"
#include "cpu.h"

static void gemm_scalar(float *C, int64_t ldc, const float *A, int64_t ak, int64_t am,
                        const float *B, int64_t ldb, int M, int N, int K, const float *alpha,
                        int mode, int safe) {
  for (int m = 0; m < M; m++) {
    float *c = C + m * ldc; /* [N] */
    for (int n = 0; n < N; n++) {
      float acc = 0.0f;
      for (int k = 0; k < K; k++) {
        float a = A[k * ak + m * am], b = B[k * ldb + n];
        if (safe && (a == 0.0f || b == 0.0f)) continue;
        acc += a * b;
      }
      c[n] = mode == CPU_GEMM_SET ? acc
             : mode == CPU_GEMM_ADD ? c[n] + acc
                                    : alpha[n] * c[n] + acc;
    }
  }
}

/* Score transform of element (j, lane i): softcap, ALiBi, mask; log2 units. */
static inline float transform(float s, int j, int i, const cpu_tile_info *ti, float *t_out) {
  if (ti->softcap2 > 0.0f) {
    float t = tanhf(s);
    if (t_out) *t_out = t;
    s = ti->softcap2 * t;
  }
  if (ti->alibi) s -= ti->alibi2[i] * fabsf(ti->ipos[i] - (float)j);
  if (ti->partial &&
      (j < ti->lo[i] || j > ti->hi[i] || (ti->elem && !ti->elem[j * CPU_BR + i])))
    return -INFINITY;
  return s;
}

static void softmax_fwd_scalar(float *S, int nj, const cpu_tile_info *ti, float *m, float *l,
                               float *alpha) {
  for (int i = 0; i < ti->lanes; i++) {
    float mx = m[i];
    for (int j = 0; j < nj; j++) {
      float x = transform(S[j * CPU_BR + i], j, i, ti, NULL);
      S[j * CPU_BR + i] = x;
      mx = x > mx ? x : mx;
    }
    float mu = mx == -INFINITY ? 0.0f : mx; /* all masked so far: keep P = 0, not NaN */
    float sum = 0.0f;
    for (int j = 0; j < nj; j++) {
      float p = exp2f(S[j * CPU_BR + i] - mu);
      S[j * CPU_BR + i] = p;
      sum += p;
    }
    alpha[i] = exp2f(m[i] - mu);
    l[i] = l[i] * alpha[i] + sum;
    m[i] = mx;
  }
}

static void probs_bwd_scalar(float *S, int nj, const cpu_tile_info *ti, const float *lse2,
                             float *T) {
  for (int j = 0; j < nj; j++)
    for (int i = 0; i < ti->lanes; i++) {
      float t = 0.0f;
      float x = transform(S[j * CPU_BR + i], j, i, ti, &t);
      if (T) T[j * CPU_BR + i] = t;
      S[j * CPU_BR + i] = x == -INFINITY ? 0.0f : exp2f(x - lse2[i]);
    }
}

static void dscores_scalar(float *dP, const float *P, const float *T, int nj, int lanes,
                           const float *delta, float factor) {
  for (int j = 0; j < nj; j++)
    for (int i = 0; i < lanes; i++) {
      int e = j * CPU_BR + i;
      float ds = 0.0f; /* masked (P = 0): 0, whatever NaN sits in dP or T */
      if (P[e] != 0.0f) ds = factor * P[e] * (dP[e] - delta[i]) * (T ? 1.0f - T[e] * T[e] : 1.0f);
      dP[e] = ds;
    }
}

/* 16 rows at a time so each d touches one line of dst and 16 cached source rows. */
static void pack_t_scalar(float *dst, const float *src, int64_t ss, int rows, int D,
                          float scale) {
  for (int i0 = 0; i0 < CPU_BR; i0 += 16)
    for (int d = 0; d < D; d++)
      for (int i = i0; i < i0 + 16; i++)
        dst[d * CPU_BR + i] = i < rows ? src[i * ss + d] * scale : 0.0f;
}

static void unpack_t_scalar(float *dst, int64_t ds, const float *src, int rows, int D,
                            const float *scale) {
  for (int i0 = 0; i0 < rows; i0 += 16)
    for (int d = 0; d < D; d++)
      for (int i = i0; i < i0 + 16 && i < rows; i++)
        dst[i * ds + d] = src[d * CPU_BR + i] * (scale ? scale[i] : 1.0f);
}

static void rows_in_scalar(float *dst, int64_t ld, const void *src, int64_t ss, attn_dtype t,
                           int rows, int D) {
  const uint16_t *h = src;
  for (int r = 0; r < rows; r++)
    for (int d = 0; d < D; d++) dst[r * ld + d] = attn__cpu_load(h + r * ss, d, t);
}

static void rows_out_scalar(void *dst, int64_t ds, attn_dtype t, const float *src, int64_t ld,
                            int rows, int D) {
  uint16_t *h = dst;
  for (int r = 0; r < rows; r++)
    for (int d = 0; d < D; d++) attn__cpu_store(h + r * ds, d, t, src[r * ld + d]);
}

static int nonfinite_scalar(const void *src, int64_t ss, attn_dtype t, int rows, int D) {
  int bad = 0;
  for (int r = 0; r < rows; r++) {
    if (t == ATTN_F32) {
      const uint32_t *x = (const uint32_t *)src + r * ss;
      for (int d = 0; d < D; d++) bad |= (x[d] & 0x7F800000u) == 0x7F800000u; /* all-ones exponent */
    } else {
      const uint16_t *h = (const uint16_t *)src + r * ss, e = t == ATTN_BF16 ? 0x7F80u : 0x7C00u;
      for (int d = 0; d < D; d++) bad |= (h[d] & e) == e;
    }
  }
  return bad;
}

/* The scalar row kernels leave prefetching to the hardware (pf unused). */
static void scores_rows_scalar(float *S, const float *K, int64_t ldk, int nj, const float *Q,
                               int64_t ldq, int u, int D, const cpu_prefetch *pf) {
  (void)pf;
  for (int L = 0; L < u; L++)
    for (int j = 0; j < nj; j++) {
      float acc = 0.0f;
      for (int d = 0; d < D; d++) acc += K[j * ldk + d] * Q[L * ldq + d];
      S[L * CPU_BC + j] = acc;
    }
}

static void softmax_rows_scalar(float *S, int nj, int u, const cpu_tile_info *ti, int L0,
                                float *m, float *l, float *alpha) {
  for (int L = 0; L < u; L++) {
    float *row = S + L * CPU_BC, mx = m[L];
    for (int j = 0; j < nj; j++) {
      row[j] = transform(row[j], j, L0 + L, ti, NULL);
      mx = row[j] > mx ? row[j] : mx;
    }
    float mu = mx == -INFINITY ? 0.0f : mx, sum = 0.0f;
    for (int j = 0; j < nj; j++) {
      row[j] = exp2f(row[j] - mu);
      sum += row[j];
    }
    alpha[L] = exp2f(m[L] - mu);
    l[L] = l[L] * alpha[L] + sum;
    m[L] = mx;
  }
}

static void pv_rows_scalar(float *O, int64_t ldo, const float *V, int64_t ldv, int nj,
                           const float *P, int u, int D, const float *alpha,
                           const cpu_prefetch *pf) {
  (void)pf;
  for (int L = 0; L < u; L++)
    for (int d = 0; d < D; d++) {
      float acc = 0.0f; /* the tile's sum apart, then added (as gemm's SCALE_ADD) */
      for (int j = 0; j < nj; j++) {
        float p = P[L * CPU_BC + j];
        if (p == 0.0f) continue; /* masked: adds nothing, whatever V holds */
        acc += p * V[j * ldv + d];
      }
      O[L * ldo + d] = alpha[L] * O[L * ldo + d] + acc;
    }
}

const cpu_tile_ops attn__cpu_ops_scalar = {"cpu-scalar",    gemm_scalar,    softmax_fwd_scalar,
                                           probs_bwd_scalar, dscores_scalar, pack_t_scalar,
                                           unpack_t_scalar,  rows_in_scalar, rows_out_scalar,
                                           nonfinite_scalar, scores_rows_scalar,
                                           softmax_rows_scalar, pv_rows_scalar};
