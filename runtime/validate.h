/* validate.h — argument checks shared by the public entry points (runtime/attention.c). */
#ifndef ATTN_VALIDATE_H
#define ATTN_VALIDATE_H

#include "internal.h"

/* Copies min(spec->size, sizeof) bytes over defaults; checks size and version. */
attn_status attn__copy_spec(const attn_spec *spec, attn_spec *out);
/* Checks the values of a copied spec (heads, dims, scale, window, varlen, block mask). */
attn_status attn__check_spec(const attn_spec *s);
/* A tensor of the expected shape, in a dtype and on the device the ctx's backend takes. */
/* dtype: the exact dtype required (that of q, k, v), ATTN__DT_ANY for any the backend
 * takes, or ATTN__DT_ACCUM for a float32 accumulator (gradients). */
#define ATTN__DT_ANY (-1)
#define ATTN__DT_ACCUM (-2)
attn_status attn__check_tensor(attn_ctx_t ctx, const char *name, const attn_tensor *t,
                               int dtype, const int64_t shape[4], int is_output,
                               attn__view *view);
/* Validates spec, q, k, v and the block position; fills pb. pos may be NULL (one shot). */
attn_status attn__make_problem(attn_ctx_t ctx, const attn_spec *spec, const attn_tensor *q,
                               const attn_tensor *k, const attn_tensor *v,
                               const attn_block_pos *pos, attn__problem *pb);
/* An output tensor of shape [b, s, h, d]. */
attn_status attn__check_out(attn_ctx_t ctx, const char *name, const attn_tensor *t, int dtype,
                            int64_t b, int64_t s, int64_t h, int64_t d, attn__view *view);

#endif
