/* test_cuda_runtime.c — the public API on a CUDA context (backend selection, validation,
 * the runtime adapter) against the CPU backend on the same bf16-rounded inputs: attn_fwd,
 * attn_bwd and the block API, in bf16 and in float32 (the SIMT kernels). Exits 77 when no
 * CUDA device is visible. */
#include "attnrun.h"
#include "gpu_test.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define EXPECT(cond, ...)                                                  \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);      \
      fprintf(stderr, __VA_ARGS__);                                        \
      fprintf(stderr, " [%s]\n", attn_last_error());                       \
      failures++;                                                          \
    }                                                                      \
  } while (0)

/* Random bf16-representable values: host float copy and device bf16 copy. */
static float *rand_pair(size_t n, unsigned seed, uint16_t **dev) {
  float *h = malloc(n * sizeof(float));
  uint16_t *b = malloc(n * sizeof(uint16_t));
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    b[i] = gt_to_bf16(((seed >> 8) / 16777216.0f) * 2.0f - 1.0f);
    h[i] = gt_from_bf16(b[i]);
  }
  cudaMalloc((void **)dev, n * sizeof(uint16_t));
  cudaMemcpy(*dev, b, n * sizeof(uint16_t), cudaMemcpyHostToDevice);
  free(b);
  return h;
}

/* A device copy of n host floats. */
static float *dev_copy(const float *h, size_t n) {
  float *d = NULL;
  cudaMalloc((void **)&d, n * sizeof(float));
  cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
  return d;
}

static attn_tensor dev_tensor(void *p, attn_dtype t, int64_t b, int64_t s, int64_t h, int64_t d) {
  attn_tensor x = attn_tensor_f32(p, b, s, h, d);
  x.dtype = t;
  x.device = ATTN_DEVICE_CUDA;
  return x;
}

/* max |a - b| / max |b| over n floats; a is a bf16 device copy when bf16 != 0. */
static double rel_err_dev(const void *dev, int bf16, const float *ref, size_t n) {
  float *a = malloc(n * sizeof(float));
  if (bf16) {
    uint16_t *b = malloc(n * sizeof(uint16_t));
    cudaMemcpy(b, dev, n * sizeof(uint16_t), cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < n; i++) a[i] = gt_from_bf16(b[i]);
    free(b);
  } else {
    cudaMemcpy(a, dev, n * sizeof(float), cudaMemcpyDeviceToHost);
  }
  double err = 0, mx = 0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - ref[i]);
    if (!(e <= err)) err = e; /* NaN counts as the worst */
    if (fabs(ref[i]) > mx) mx = fabs(ref[i]);
  }
  free(a);
  return err / (mx > 0 ? mx : 1);
}

int main(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("no CUDA device: skipped\n");
    return 77;
  }
  const int B = 2, S = 300, H = 4, Hkv = 2, D = 128;
  attn_ctx_t gpu = NULL, cpu = NULL;
  attn_ctx_config cfg = ATTN_CTX_CONFIG_INIT;
  EXPECT(attn_ctx_create(&gpu, &cfg) == ATTN_OK, "auto backend");
  EXPECT(gpu && !strcmp(attn_ctx_backend_name(gpu), "cuda"), "auto picks cuda, got %s",
         gpu ? attn_ctx_backend_name(gpu) : "none");
  cfg.backend = ATTN_BACKEND_CPU;
  EXPECT(attn_ctx_create(&cpu, &cfg) == ATTN_OK, "cpu backend");
  if (!gpu || !cpu) return 1;
  { /* context memory: a round trip host -> device -> device -> host */
    float src[301], back[301];
    for (int i = 0; i < 301; i++) src[i] = (float)i * 0.5f - 7.0f, back[i] = NAN;
    void *a = NULL, *b = NULL;
    EXPECT(attn_ctx_device(gpu) == ATTN_DEVICE_CUDA, "cuda context memory is device memory");
    EXPECT(attn_ctx_alloc(gpu, sizeof src, &a) == ATTN_OK && attn_ctx_alloc(gpu, sizeof src, &b) == ATTN_OK,
           "alloc");
    EXPECT(attn_ctx_copy(gpu, a, src, sizeof src, ATTN_COPY_HOST_TO_CTX) == ATTN_OK, "copy in");
    EXPECT(attn_ctx_copy(gpu, b, a, sizeof src, ATTN_COPY_CTX_TO_CTX) == ATTN_OK, "copy within");
    EXPECT(attn_ctx_copy(gpu, back, b, sizeof src, ATTN_COPY_CTX_TO_HOST) == ATTN_OK, "copy out");
    EXPECT(!memcmp(src, back, sizeof src), "round trip through device memory differs");
    EXPECT(attn_ctx_sync(gpu) == ATTN_OK && attn_ctx_free(gpu, a) == ATTN_OK &&
               attn_ctx_free(gpu, b) == ATTN_OK,
           "sync and free");
  }

  size_t nq = (size_t)B * S * H * D, nk = (size_t)B * S * Hkv * D;
  uint16_t *dq16, *dk16, *dv16, *ddo16, *do16;
  float *q = rand_pair(nq, 1, &dq16), *k = rand_pair(nk, 2, &dk16), *v = rand_pair(nk, 3, &dv16);
  float *dout = rand_pair(nq, 4, &ddo16);
  float *o = malloc(nq * 4), *lse = malloc((size_t)B * H * S * 4);
  float *gq = malloc(nq * 4), *gk = malloc(nk * 4), *gv = malloc(nk * 4);
  cudaMalloc((void **)&do16, nq * 2);
  float *dlse, *dgq, *dgk, *dgv;
  cudaMalloc((void **)&dlse, (size_t)B * H * S * 4);
  cudaMalloc((void **)&dgq, nq * 4);
  cudaMalloc((void **)&dgk, nk * 4);
  cudaMalloc((void **)&dgv, nk * 4);

  for (int causal = 0; causal < 2; causal++) {
    attn_spec sp = ATTN_SPEC_INIT;
    sp.num_heads_q = H, sp.num_heads_kv = Hkv, sp.head_dim_qk = D, sp.causal = causal;
    sp.window_left = causal ? 100 : -1;
    attn_tensor tq = attn_tensor_f32(q, B, S, H, D), tk = attn_tensor_f32(k, B, S, Hkv, D);
    attn_tensor tv = attn_tensor_f32(v, B, S, Hkv, D), to = attn_tensor_f32(o, B, S, H, D);
    attn_tensor tdo = attn_tensor_f32(dout, B, S, H, D), tgq = attn_tensor_f32(gq, B, S, H, D);
    attn_tensor tgk = attn_tensor_f32(gk, B, S, Hkv, D), tgv = attn_tensor_f32(gv, B, S, Hkv, D);
    EXPECT(attn_fwd(cpu, &sp, &tq, &tk, &tv, &to, lse) == ATTN_OK, "cpu fwd");
    EXPECT(attn_bwd(cpu, &sp, &tq, &tk, &tv, &to, lse, &tdo, &tgq, &tgk, &tgv, NULL) == ATTN_OK,
           "cpu bwd");

    attn_tensor gq_ = dev_tensor(dq16, ATTN_BF16, B, S, H, D);
    attn_tensor gk_ = dev_tensor(dk16, ATTN_BF16, B, S, Hkv, D);
    attn_tensor gv_ = dev_tensor(dv16, ATTN_BF16, B, S, Hkv, D);
    attn_tensor go_ = dev_tensor(do16, ATTN_BF16, B, S, H, D);
    attn_tensor gdo = dev_tensor(ddo16, ATTN_BF16, B, S, H, D);
    attn_tensor gdq = dev_tensor(dgq, ATTN_F32, B, S, H, D);
    attn_tensor gdk = dev_tensor(dgk, ATTN_F32, B, S, Hkv, D);
    attn_tensor gdv = dev_tensor(dgv, ATTN_F32, B, S, Hkv, D);
    cudaMemset(do16, 0xff, nq * 2); /* poison */
    EXPECT(attn_fwd(gpu, &sp, &gq_, &gk_, &gv_, &go_, dlse) == ATTN_OK, "cuda fwd");
    EXPECT(attn_bwd(gpu, &sp, &gq_, &gk_, &gv_, &go_, dlse, &gdo, &gdq, &gdk, &gdv, NULL) ==
               ATTN_OK,
           "cuda bwd");
    EXPECT(cudaDeviceSynchronize() == cudaSuccess, "sync");
    double eo = rel_err_dev(do16, 1, o, nq), el = rel_err_dev(dlse, 0, lse, (size_t)B * H * S);
    double eq = rel_err_dev(dgq, 0, gq, nq), ek = rel_err_dev(dgk, 0, gk, nk);
    double ev = rel_err_dev(dgv, 0, gv, nk);
    printf("causal=%d: O %.2e LSE %.2e dQ %.2e dK %.2e dV %.2e (vs cpu on the same inputs)\n",
           causal, eo, el, eq, ek, ev);
    /* bf16 output rounding is 2^-9 relative; P is rounded to bf16 inside the kernels. */
    EXPECT(eo < 1.6e-2 && el < 1e-3, "forward off: O %.2e LSE %.2e", eo, el);
    EXPECT(eq < 3e-2 && ek < 3e-2 && ev < 3e-2, "backward off: %.2e %.2e %.2e", eq, ek, ev);

    /* float32 device tensors on the CUDA context: the same inputs, float32 accuracy. */
    float *fq = dev_copy(q, nq), *fk = dev_copy(k, nk), *fv = dev_copy(v, nk);
    float *fdo = dev_copy(dout, nq), *fo = NULL;
    cudaMalloc((void **)&fo, nq * 4);
    cudaMemset(fo, 0xff, nq * 4); /* poison */
    attn_tensor fq_ = dev_tensor(fq, ATTN_F32, B, S, H, D), fk_ = dev_tensor(fk, ATTN_F32, B, S, Hkv, D);
    attn_tensor fv_ = dev_tensor(fv, ATTN_F32, B, S, Hkv, D), fo_ = dev_tensor(fo, ATTN_F32, B, S, H, D);
    attn_tensor fdo_ = dev_tensor(fdo, ATTN_F32, B, S, H, D);
    EXPECT(attn_fwd(gpu, &sp, &fq_, &fk_, &fv_, &fo_, dlse) == ATTN_OK, "cuda f32 fwd");
    EXPECT(attn_bwd(gpu, &sp, &fq_, &fk_, &fv_, &fo_, dlse, &fdo_, &gdq, &gdk, &gdv, NULL) ==
               ATTN_OK,
           "cuda f32 bwd");
    EXPECT(cudaDeviceSynchronize() == cudaSuccess, "sync");
    eo = rel_err_dev(fo, 0, o, nq), el = rel_err_dev(dlse, 0, lse, (size_t)B * H * S);
    eq = rel_err_dev(dgq, 0, gq, nq), ek = rel_err_dev(dgk, 0, gk, nk), ev = rel_err_dev(dgv, 0, gv, nk);
    printf("causal=%d f32: O %.2e LSE %.2e dQ %.2e dK %.2e dV %.2e (vs cpu)\n", causal, eo, el, eq,
           ek, ev);
    /* both sides are float32 within ~1e-6 of float64: 1e-4 leaves room and still tells
     * float32 from a bf16 path (1e-2) */
    EXPECT(eo < 1e-4 && el < 1e-4 && eq < 1e-4 && ek < 1e-4 && ev < 1e-4,
           "f32 off: O %.2e LSE %.2e dQ %.2e dK %.2e dV %.2e", eo, el, eq, ek, ev);
    cudaFree(fq);
    cudaFree(fk);
    cudaFree(fv);
    cudaFree(fdo);
    cudaFree(fo);

    /* Validation on the CUDA context: host tensors are not taken. */
    EXPECT(attn_fwd(gpu, &sp, &tq, &tk, &tv, &to, lse) == ATTN_ERR_UNSUPPORTED, "host f32 rejected");
    attn_tensor bad = gdq; /* dq must be float32 */
    bad.dtype = ATTN_BF16;
    EXPECT(attn_bwd(gpu, &sp, &gq_, &gk_, &gv_, &go_, dlse, &gdo, &bad, &gdk, &gdv, NULL) ==
               ATTN_ERR_INVALID_ARG,
           "bf16 dq rejected");
  }
  attn_ctx_destroy(gpu);
  attn_ctx_destroy(cpu);
  printf("test_cuda_runtime: %s\n", failures ? "FAILED" : "all passed");
  return failures ? 1 : 0;
}
