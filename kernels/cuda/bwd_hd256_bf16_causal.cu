/* bwd_hd256_bf16_causal.cu — flash backward (dK/dV and dQ kernels) instance: head dim 256, bf16, causal. */
#define FA_HDQK 256
#define FA_HDV 256
#define FA_BF16 1
#define FA_CAUSAL 1
#define FA_SUFFIX hd256_bf16_causal
#include "bwd_body.cuh"
