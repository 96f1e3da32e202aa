/* bwd_hd128_bf16_causal.cu — flash backward (dK/dV and dQ kernels) instance: head dim 128, bf16, causal. */
#define FA_HDQK 128
#define FA_HDV 128
#define FA_BF16 1
#define FA_CAUSAL 1
#define FA_SUFFIX hd128_bf16_causal
#include "bwd_body.cuh"
