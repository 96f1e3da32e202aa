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
  if (ti->alibi2 != 0.0f) s -= ti->alibi2 * fabsf(ti->ipos[i] - (float)j);
  if (ti->partial &&
      (j < ti->lo[i] || j > ti->hi[i] || (ti->elem && !ti->elem[j * CPU_BR + i])))
    return -INFINITY;
  return s;
}

static void softmax_fwd_scalar(float *S, int nj, const cpu_tile_info *ti, float *m, float *l,
                               float *alpha) {
  for (int i = 0; i < CPU_BR; i++) {
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
    for (int i = 0; i < CPU_BR; i++) {
      float t = 0.0f;
      float x = transform(S[j * CPU_BR + i], j, i, ti, &t);
      if (T) T[j * CPU_BR + i] = t;
      S[j * CPU_BR + i] = x == -INFINITY ? 0.0f : exp2f(x - lse2[i]);
    }
}

static void dscores_scalar(float *dP, const float *P, const float *T, int nj,
                           const float *delta, float factor) {
  for (int j = 0; j < nj; j++)
    for (int i = 0; i < CPU_BR; i++) {
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

const cpu_tile_ops attn__cpu_ops_scalar = {"cpu-scalar",    gemm_scalar,    softmax_fwd_scalar,
                                           probs_bwd_scalar, dscores_scalar, pack_t_scalar,
                                           unpack_t_scalar,  rows_in_scalar, rows_out_scalar};
