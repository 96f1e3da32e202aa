/* ops.cu — the data-movement kernels of ops.h: what the ring (pack K/V rows into a message,
 * add received dK/dV partials, zero accumulators) and the layer (float32 <-> bf16/f16
 * conversion of Q/K/V/O/dO, RoPE) run on device buffers. Memory-bound and simple: one CTA
 * per (b, s, h) row (grid-stride over rows), threads over D. Also built on the emulator. */
#include "device.cuh"
#include "ops.h"

#define OPS_THREADS 128
#define OPS_MAX_GRID 4096

enum { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2 }; /* attn_dtype values */

FA_DEV float load_elem(const void *p, int64_t i, int dt) {
  if (dt == DT_F32) return ((const float *)p)[i];
  const uint16_t h = ((const uint16_t *)p)[i];
  return dt == DT_BF16 ? fa_bf16_to_float(h) : fa_f16_to_float(h);
}

FA_DEV void store_elem(void *p, int64_t i, int dt, float v) {
  if (dt == DT_F32) {
    ((float *)p)[i] = v;
    return;
  }
  const uint32_t two = dt == DT_BF16 ? fa_pack_bf16(v, 0.0f) : fa_pack_f16(v, 0.0f);
  ((uint16_t *)p)[i] = (uint16_t)(two & 0xFFFFu);
}

FA_DEV int64_t elem_bytes(int dt) { return dt == DT_F32 ? 4 : 2; }

/* Row r = (b, s, h) of [B, S, H, D]; element offsets of the row in dst and src. */
FA_KERNEL_GENERIC ops_rows_kernel(int op, char *dst, int ddt, int64_t dsb, int64_t dss,
                                  int64_t dsh, const char *src, int sdt, int64_t ssb,
                                  int64_t sss, int64_t ssh, int64_t S, int64_t H, int64_t D,
                                  int64_t rows) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t h = r % H, s = (r / H) % S, b = r / (H * S);
    char *d = dst + (b * dsb + s * dss + h * dsh) * elem_bytes(ddt);
    const char *x = op == ATTN_CUDA_ROWS_ZERO ? nullptr
                                              : src + (b * ssb + s * sss + h * ssh) * elem_bytes(sdt);
    for (int64_t e = threadIdx.x; e < D; e += blockDim.x) {
      if (op == ATTN_CUDA_ROWS_ZERO) {
        store_elem(d, e, ddt, 0.0f);
      } else if (op == ATTN_CUDA_ROWS_ADD) {
        ((float *)d)[e] += ((const float *)x)[e];
      } else if (ddt == sdt) {
        if (ddt == DT_F32) ((float *)d)[e] = ((const float *)x)[e];
        else ((uint16_t *)d)[e] = ((const uint16_t *)x)[e];
      } else {
        store_elem(d, e, ddt, load_elem(x, e, sdt));
      }
    }
  }
}

/* One CTA per (b, s, h) row; thread i < D/2 rotates the pair (i, i + D/2) as rope.c does. */
FA_KERNEL_GENERIC ops_rope_kernel(float *x, int64_t sb, int64_t ss, int64_t sh, int64_t S,
                                  int64_t H, int64_t D, const float *cos_t, const float *sin_t,
                                  float sign, int64_t rows) {
  const int64_t half = D / 2;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t h = r % H, s = (r / H) % S, b = r / (H * S);
    float *row = x + b * sb + s * ss + h * sh;
    const float *c = cos_t + s * half, *sn = sin_t + s * half;
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
      const float a = row[i], bb = row[i + half], si = sign * sn[i];
      row[i] = a * c[i] - bb * si;
      row[i + half] = a * si + bb * c[i];
    }
  }
}

#ifndef ATTN_CUDA_EMULATE
#define OPS_STATUS() ((int)cudaGetLastError())
#else
#define OPS_STATUS() 0
#endif

static unsigned rows_grid(int64_t rows) {
  return (unsigned)(rows < 1 ? 1 : rows > OPS_MAX_GRID ? OPS_MAX_GRID : rows);
}

extern "C" int attn_cuda_rows(int op, attn_cuda_view dst, int dst_dtype, attn_cuda_view src,
                              int src_dtype, int64_t B, int64_t S, int64_t H, int64_t D,
                              void *stream) {
  const int64_t rows = B * S * H;
  if (rows <= 0 || D <= 0) return 0;
  FA_LAUNCH(ops_rows_kernel, dim3(rows_grid(rows)), dim3(OPS_THREADS), 0, stream, op,
            (char *)dst.p, dst_dtype, dst.sb, dst.ss, dst.sh, (const char *)src.p, src_dtype,
            src.sb, src.ss, src.sh, S, H, D, rows);
  return OPS_STATUS();
}

extern "C" int attn_cuda_rope(attn_cuda_view x, int64_t B, int64_t S, int64_t H, int64_t D,
                              const float *cos_t, const float *sin_t, int inverse,
                              void *stream) {
  const int64_t rows = B * S * H;
  if (rows <= 0 || D < 2) return 0;
  FA_LAUNCH(ops_rope_kernel, dim3(rows_grid(rows)), dim3(OPS_THREADS / 2), 0, stream,
            (float *)x.p, x.sb, x.ss, x.sh, S, H, D, cos_t, sin_t, inverse ? -1.0f : 1.0f, rows);
  return OPS_STATUS();
}
