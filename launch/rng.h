/* rng.h — counter-based RNG for generated inputs: a value is a pure function of
 * (seed, tensor id, global flat index), so any rank can regenerate any slice. */
#ifndef ATTNRUN_LAUNCH_RNG_H
#define ATTNRUN_LAUNCH_RNG_H

#include <stdint.h>

/* Tensor ids: the stream each generated tensor draws from. */
enum { RNG_Q = 1, RNG_K = 2, RNG_V = 3, RNG_DO = 4, RNG_SINKS = 5, RNG_VARLEN = 6, RNG_CHECK = 7 };
/* The layer (--d-model): x, the global weights W_q W_k W_v W_o, and dy. */
enum { RNG_X = 8, RNG_WQ = 9, RNG_WK = 10, RNG_WV = 11, RNG_WO = 12, RNG_DY = 13 };

/* 64 random bits for (seed, tensor, index). */
uint64_t rng_bits(uint64_t seed, uint64_t tensor, uint64_t index);

/* Uniform float in [lo, hi) for (seed, tensor, index). */
float rng_uniform(uint64_t seed, uint64_t tensor, uint64_t index, float lo, float hi);

/* out[i] = rng_uniform(seed, tensor, first + i, lo, hi) for i in [0, count); OpenMP. */
void rng_fill(uint64_t seed, uint64_t tensor, uint64_t first, int64_t count, float lo, float hi,
              float *out);

#endif
