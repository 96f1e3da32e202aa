/* bwd_hd192x128_f16.cu — flash backward (dK/dV and dQ kernels) instance: Dqk 192, Dv 128 (DeepSeek MLA), f16, not causal. */
#define FA_HDQK 192
#define FA_HDV 128
#define FA_BF16 0
#define FA_CAUSAL 0
#define FA_SUFFIX hd192x128_f16
#include "bwd_body.cuh"
