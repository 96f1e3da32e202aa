/* rope.h — rotary position embedding for the TP layer (GPT-NeoX half-split pairing). */
#ifndef ATTN_ROPE_H
#define ATTN_ROPE_H

#include "internal.h"

/* Convention (GPT-NeoX / Llama in Hugging Face form, "rotate_half"): with D = head dim and
 * i in [0, D/2), element i pairs with element i + D/2 and the pair is rotated by
 *   angle(pos, i) = pos * theta^(-2i/D):
 *   x'[i]       = x[i] cos - x[i+D/2] sin
 *   x'[i+D/2]   = x[i] sin + x[i+D/2] cos
 * Angles are computed in double and rounded once to float, so every rank builds bitwise
 * the same table for the same global position, whatever its shard. */

/* threads: OpenMP threads for the loops below (the context's num_threads; 0 → default). */

/* cos, sin [rows, dim/2] for the given positions (dim even, theta > 0). */
void attn__rope_table(float theta, int64_t dim, const int64_t *pos, int64_t rows, float *cos_t,
                      float *sin_t, int threads);

/* Rotates (inverse = 0) or un-rotates (inverse = 1: the transpose, which is what a
 * gradient needs) every head of x [B, S, H, dim] in place; row s uses table row s. */
void attn__rope_apply(attn__view x, int64_t B, int64_t S, int64_t H, int64_t dim,
                      const float *cos_t, const float *sin_t, int inverse, int threads);

#endif
