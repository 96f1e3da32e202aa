/* rng.c — counter-based RNG: splitmix64 finalisers over (seed, tensor, index).
 * No state is carried between calls, so a slice of any tensor is regenerated on its own
 * (a rank holding rows [s0, s1) draws exactly the values a single rank would). */
#include "rng.h"

static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static uint64_t stream_key(uint64_t seed, uint64_t tensor) {
  return mix64(mix64(seed + 0x9e3779b97f4a7c15ULL) ^ (tensor * 0xd1b54a32d192ed03ULL));
}

uint64_t rng_bits(uint64_t seed, uint64_t tensor, uint64_t index) {
  return mix64(stream_key(seed, tensor) + (index + 1) * 0x9e3779b97f4a7c15ULL);
}

/* The top 24 bits give a float in [0, 1) exactly representable in float32. */
static float unit_float(uint64_t bits) { return (float)(bits >> 40) * (1.0f / 16777216.0f); }

float rng_uniform(uint64_t seed, uint64_t tensor, uint64_t index, float lo, float hi) {
  return lo + (hi - lo) * unit_float(rng_bits(seed, tensor, index));
}

void rng_fill(uint64_t seed, uint64_t tensor, uint64_t first, int64_t count, float lo, float hi,
              float *out) {
  const uint64_t key = stream_key(seed, tensor);
  const float span = hi - lo;
#pragma omp parallel for schedule(static) if (count > 65536)
  for (int64_t i = 0; i < count; i++) {
    uint64_t bits = mix64(key + (first + (uint64_t)i + 1) * 0x9e3779b97f4a7c15ULL);
    out[i] = lo + span * unit_float(bits);
  }
}
