/* ops.h — the CUDA backend's data-movement kernels (ops.cu) for the ring and the layer:
 * strided [B, S, H, D] row copies with dtype conversion, float32 adds and zero fills, and
 * RoPE. Plain C; each launcher only enqueues on the stream and returns 0 or a cudaError_t
 * value (the caller words it). Views are attn_cuda_view in elements of their dtype. */
#ifndef ATTN_CUDA_OPS_H
#define ATTN_CUDA_OPS_H

#include "cuda_attn.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { ATTN_CUDA_ROWS_COPY = 0, ATTN_CUDA_ROWS_ADD = 1, ATTN_CUDA_ROWS_ZERO = 2 };

/* op COPY: dst = src (dtypes attn_dtype; equal dtypes copy bits, else convert through
 * float32 with round-to-nearest-even); ADD: dst += src (float32 both); ZERO: dst = 0. */
int attn_cuda_rows(int op, attn_cuda_view dst, int dst_dtype, attn_cuda_view src, int src_dtype,
                   int64_t B, int64_t S, int64_t H, int64_t D, void *stream);

/* x [B, S, H, D] float32 in place: pair (i, i + D/2) rotated by the angle whose cos / sin
 * are cos_t / sin_t [S, D/2] row s; inverse = 1 rotates by minus that angle. */
int attn_cuda_rope(attn_cuda_view x, int64_t B, int64_t S, int64_t H, int64_t D,
                   const float *cos_t, const float *sin_t, int inverse, void *stream);

#ifdef __cplusplus
}
#endif
#endif
