/* bwd_hd128_bf16.cu — flash backward (dK/dV and dQ kernels) instance: head dim 128, bf16, not causal. */
#define FA_HDQK 128
#define FA_HDV 128
#define FA_BF16 1
#define FA_CAUSAL 0
#define FA_SUFFIX hd128_bf16
#include "bwd_body.cuh"
