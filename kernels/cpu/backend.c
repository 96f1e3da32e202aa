/* backend.c — the CPU backend's function table: ISA choice by CPUID (AVX-512 or the
 * portable scalar path), threads, and the state / finalize / backward-prepare steps. */
#include "convert.h"
#include "cpu.h"

#include "rope.h"

#include <cblas.h>
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void attn__cpu_count(attn_ctx_t ctx, int64_t computed, int64_t skipped, double flops) {
#pragma omp critical(attn_cpu_stats)
  {
    ctx->stats.tiles_computed += computed;
    ctx->stats.tiles_skipped += skipped;
    ctx->stats.flops_computed += flops;
  }
}

static attn_status cpu_state_init(attn_ctx_t ctx, attn_state *st) {
  (void)ctx;
  int64_t rows = st->batch * st->heads * st->rows;
  for (int64_t r = 0; r < rows; r++) {
    st->m[r] = -INFINITY;
    st->l[r] = 0.0f;
  }
  memset(st->acc, 0, (size_t)(rows * st->head_dim_v) * sizeof(float));
  return ATTN_OK;
}

static attn_status cpu_state_merge(attn_ctx_t ctx, attn_state *dst, const attn_state *src) {
  cpu_backend *be = ctx->backend_data;
  int64_t rows = dst->batch * dst->heads * dst->rows, D = dst->head_dim_v;
#pragma omp parallel for schedule(static) num_threads(be->threads)
  for (int64_t r = 0; r < rows; r++) {
    float ma = dst->m[r], mb = src->m[r], m = ma > mb ? ma : mb;
    if (m == -INFINITY) continue; /* both empty */
    float a = expf(ma - m), b = expf(mb - m);
    dst->m[r] = m;
    dst->l[r] = dst->l[r] * a + src->l[r] * b;
    float *x = dst->acc + r * D;       /* [Dv] */
    const float *y = src->acc + r * D; /* [Dv] */
    for (int64_t d = 0; d < D; d++) x[d] = x[d] * a + y[d] * b;
  }
  return ATTN_OK;
}

static attn_status cpu_finalize(attn_ctx_t ctx, const attn__problem *pb, const attn_state *st,
                                attn__view o, float *lse) {
  cpu_backend *be = ctx->backend_data;
#pragma omp parallel for collapse(2) schedule(static) num_threads(be->threads)
  for (int64_t b = 0; b < pb->B; b++)
    for (int64_t h = 0; h < pb->Hq; h++) {
      const float sink = pb->sinks ? pb->sinks[h] : -INFINITY;
      for (int64_t i = 0; i < st->rows; i++) {
        int64_t r = (b * pb->Hq + h) * st->rows + i;
        float m = st->m[r], top = m > sink ? m : sink, inv = 0.0f, out = -INFINITY;
        if (top != -INFINITY) {
          float sm = expf(m - top), z = st->l[r] * sm + expf(sink - top);
          inv = sm / z;
          out = top + logf(z);
        }
        void *orow = attn__cpu_row(o, pb->dtype, b, i, h); /* [Dv] of the dtype */
        for (int64_t d = 0; d < pb->Dv; d++)
          attn__cpu_store(orow, d, pb->dtype, st->acc[r * pb->Dv + d] * inv);
        if (lse) lse[r] = out;
      }
    }
  return ATTN_OK;
}

static attn_status cpu_bwd_prepare(attn_ctx_t ctx, const attn__problem *pb, attn__view o,
                                   attn__view dout, const float *lse, float *delta,
                                   float *dsinks) {
  cpu_backend *be = ctx->backend_data;
#pragma omp parallel for schedule(static) num_threads(be->threads)
  for (int64_t h = 0; h < pb->Hq; h++) {
    double ds = 0.0;
    for (int64_t b = 0; b < pb->B; b++)
      for (int64_t i = 0; i < pb->sq; i++) {
        const void *x = attn__cpu_row(o, pb->dtype, b, i, h);    /* [Dv] of the dtype */
        const void *y = attn__cpu_row(dout, pb->dtype, b, i, h); /* [Dv] */
        float acc = 0.0f;
        for (int64_t d = 0; d < pb->Dv; d++)
          acc += attn__cpu_load(x, d, pb->dtype) * attn__cpu_load(y, d, pb->dtype);
        int64_t r = (b * pb->Hq + h) * pb->sq + i;
        delta[r] = acc;
        if (pb->sinks && lse[r] != -INFINITY) ds -= exp((double)pb->sinks[h] - lse[r]) * acc;
      }
    if (dsinks) dsinks[h] += (float)ds;
  }
  return ATTN_OK;
}

/* Host memory: the cpu backend's tensors are the caller's host arrays. */
static attn_status cpu_mem_alloc(attn_ctx_t ctx, size_t bytes, void **out) {
  (void)ctx;
  size_t rounded = (bytes + 255) / 256 * 256;
  *out = aligned_alloc(256, rounded ? rounded : 256);
  if (!*out)
    return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "bytes=%zu: host allocation failed", bytes);
  return ATTN_OK;
}

static attn_status cpu_mem_free(attn_ctx_t ctx, void *p) {
  (void)ctx;
  free(p);
  return ATTN_OK;
}

static attn_status cpu_mem_copy(attn_ctx_t ctx, void *dst, const void *src, size_t bytes,
                                attn_copy_kind kind) {
  (void)ctx, (void)kind;
  memmove(dst, src, bytes);
  return ATTN_OK;
}

static attn_status cpu_sync(attn_ctx_t ctx) {
  (void)ctx;
  return ATTN_OK;
}

/* ---- data movement for the ring and the layer (host memory) --------------------------- */
/* One [D] row of the rows op; offsets in elements. */
static void rows_one(attn__rows_op op, char *dst, attn_dtype dt, const char *src, attn_dtype st,
                     int64_t D) {
  const size_t es = attn_dtype_size(dt);
  if (op == ATTN__ROWS_ZERO) {
    memset(dst, 0, (size_t)D * es);
  } else if (op == ATTN__ROWS_ADD) {
    float *x = (float *)dst;
    const float *y = (const float *)src;
    for (int64_t d = 0; d < D; d++) x[d] += y[d];
  } else if (dt == st) {
    memcpy(dst, src, (size_t)D * es);
  } else {
    for (int64_t d = 0; d < D; d++) attn__cpu_store(dst, d, dt, attn__cpu_load(src, d, st));
  }
}

static attn_status cpu_rows(attn_ctx_t ctx, attn__rows_op op, attn__view dst, attn_dtype dt,
                            attn__view src, attn_dtype st, int64_t B, int64_t S, int64_t H,
                            int64_t D) {
  (void)ctx;
  if (op == ATTN__ROWS_ADD && (dt != ATTN_F32 || st != ATTN_F32))
    return attn__fail(ATTN_ERR_INTERNAL, "rows add: dtypes %d += %d, both must be F32", (int)dt,
                      (int)st);
  const int64_t de = (int64_t)attn_dtype_size(dt), se = (int64_t)attn_dtype_size(st);
  char *dp = (char *)dst.p;
  const char *sp = (const char *)src.p;
  for (int64_t b = 0; b < B; b++)
    for (int64_t s = 0; s < S; s++)
      for (int64_t h = 0; h < H; h++)
        rows_one(op, dp + (b * dst.sb + s * dst.ss + h * dst.sh) * de, dt,
                 op == ATTN__ROWS_ZERO ? NULL : sp + (b * src.sb + s * src.ss + h * src.sh) * se,
                 st, D);
  return ATTN_OK;
}

static attn_status cpu_rope(attn_ctx_t ctx, attn__view x, int64_t B, int64_t S, int64_t H,
                            int64_t D, const float *cos_t, const float *sin_t, int inverse) {
  attn__rope_apply(x, B, S, H, D, cos_t, sin_t, inverse, ctx->cfg.num_threads);
  return ATTN_OK;
}

static attn_status cpu_gemm(attn_ctx_t ctx, int ta, int tb, int64_t M, int64_t N, int64_t K,
                            float alpha, const float *A, int64_t lda, const float *B,
                            int64_t ldb, float beta, float *C, int64_t ldc) {
  (void)ctx;
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX || lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX)
    return attn__fail(ATTN_ERR_UNSUPPORTED, "gemm M=%lld N=%lld K=%lld exceeds the BLAS int range",
                      (long long)M, (long long)N, (long long)K);
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
  return ATTN_OK;
}

static attn_status cpu_device_id(attn_ctx_t ctx, char *buf, size_t cap) {
  (void)ctx;
  snprintf(buf, cap, "host");
  return ATTN_OK;
}

#define CPU_OPS(label)                                                                    \
  {.name = label, .device = ATTN_DEVICE_HOST,                                            \
   .dtypes = 1u << ATTN_F32 | 1u << ATTN_BF16 | 1u << ATTN_F16,                          \
   .fwd = attn__cpu_fwd, .fwd_block = attn__cpu_fwd_block, .state_init = cpu_state_init, \
   .state_merge = cpu_state_merge, .finalize = cpu_finalize,                             \
   .bwd_prepare = cpu_bwd_prepare, .bwd_block = attn__cpu_bwd_block,                     \
   .mem_alloc = cpu_mem_alloc, .mem_free = cpu_mem_free, .mem_copy = cpu_mem_copy,        \
   .sync = cpu_sync, .rows = cpu_rows, .rope = cpu_rope, .gemm = cpu_gemm,                \
   .device_id = cpu_device_id, .release = free}
static const attn__backend_ops ops_avx512 = CPU_OPS("cpu-avx512");
static const attn__backend_ops ops_scalar = CPU_OPS("cpu-scalar");

attn_status attn__cpu_backend(attn_ctx_t ctx, const attn__backend_ops **ops) {
  cpu_backend *be = calloc(1, sizeof *be);
  if (!be) return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "cpu backend allocation failed");
  int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  if (avx512 && !ctx->cfg.force_scalar && attn__cpu_ops_avx512()) {
    be->ops = attn__cpu_ops_avx512();
    *ops = &ops_avx512;
  } else {
    be->ops = &attn__cpu_ops_scalar;
    *ops = &ops_scalar;
    if (!ctx->cfg.force_scalar)
      attn__log(ATTN_LOG_WARN, "no AVX-512 on this CPU: using the scalar kernels (slow)");
  }
  const int amx = ctx->cfg.cpu_amx;
  if (amx >= 0 && !ctx->cfg.force_scalar && be->ops != &attn__cpu_ops_scalar) {
    if (amx != 2) be->bf16 = attn__cpu_amx();
    if (amx != 1 && !be->bf16) be->bf16 = attn__cpu_dpbf16();
  }
  if (amx > 0 && !be->bf16) {
    free(be);
    return attn__fail(ATTN_ERR_UNSUPPORTED, "cfg.cpu_amx=%d (%s required), but %s", amx,
                      amx == 1 ? "AMX" : "AVX512-BF16",
                      ctx->cfg.force_scalar ? "force_scalar is set"
                      : amx == 1            ? "this CPU or kernel offers no AMX-BF16"
                                            : "this CPU offers no AVX512-BF16");
  }
  if (be->bf16)
    attn__log(ATTN_LOG_INFO, "bf16 tile products on %s (cfg.cpu_amx, ATTN_CPU_AMX=-1: off)",
              be->bf16->name);
  be->threads = ctx->cfg.num_threads > 0 ? ctx->cfg.num_threads : omp_get_max_threads();
  ctx->backend_data = be;
  return ATTN_OK;
}
