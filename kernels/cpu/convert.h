/* convert.h — one element of a float32, bf16 or fp16 tensor to and from float32 (bf16:
 * nearest even, NaN kept quiet; fp16 through the compiler's _Float16, nearest even), and
 * the address of a row of a view whose offsets count elements of its dtype. Scalar code:
 * the AVX-512 row converters (tile_avx512.c) give the same bits. */
#ifndef ATTN_CPU_CONVERT_H
#define ATTN_CPU_CONVERT_H

#include "../../runtime/internal.h"

#include <string.h>

static inline float attn__cpu_load(const void *base, int64_t i, attn_dtype t) {
  if (t == ATTN_F32) return ((const float *)base)[i];
  uint16_t h = ((const uint16_t *)base)[i];
  if (t == ATTN_BF16) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  _Float16 x;
  memcpy(&x, &h, 2);
  return (float)x;
}

static inline void attn__cpu_store(void *base, int64_t i, attn_dtype t, float f) {
  if (t == ATTN_F32) {
    ((float *)base)[i] = f;
    return;
  }
  uint16_t h;
  if (t == ATTN_BF16) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) h = (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    else h = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);            /* RNE */
  } else {
    _Float16 x = (_Float16)f;
    memcpy(&h, &x, 2);
  }
  ((uint16_t *)base)[i] = h;
}

/* Row (b, s, h) of view x holding dtype t (x.p is the base; strides count elements of t;
 * a paged view through its page table). */
static inline void *attn__cpu_row(attn__view x, attn_dtype t, int64_t b, int64_t s, int64_t h) {
  return (char *)x.p + attn__view_offset(x, b, s, h) * (int64_t)attn_dtype_size(t);
}

#endif
