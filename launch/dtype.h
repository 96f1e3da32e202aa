/* dtype.h — float32 to and from the storage dtypes (bf16, f16), rounding to nearest even,
 * as the inputs of a CUDA run are stored: the launcher keeps float copies of the rounded
 * values, so that the oracle sees exactly what the kernels see. */
#ifndef ATTNRUN_LAUNCH_DTYPE_H
#define ATTNRUN_LAUNCH_DTYPE_H

#include <stdint.h>

#include "attnrun.h"

/* x rounded to t (nearest even; NaN stays NaN, overflow gives infinity), as a float. */
float dtype_round(float x, attn_dtype t);

/* x[0..n) rounded to t in place (nothing for ATTN_F32); OpenMP. */
void dtype_round_all(float *x, int64_t n, attn_dtype t);

/* dst [n elements of t] = src rounded to t; for ATTN_F32 a copy. OpenMP. */
void dtype_pack(const float *src, int64_t n, attn_dtype t, void *dst);

/* dst [n floats] = src [n elements of t], exactly. OpenMP. */
void dtype_unpack(const void *src, int64_t n, attn_dtype t, float *dst);

#endif
