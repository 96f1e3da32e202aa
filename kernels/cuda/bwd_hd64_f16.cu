/* bwd_hd64_f16.cu — flash backward (dK/dV and dQ kernels) instance: head dim 64, f16, not causal. */
#define FA_HDQK 64
#define FA_HDV 64
#define FA_BF16 0
#define FA_CAUSAL 0
#define FA_SUFFIX hd64_f16
#include "bwd_body.cuh"
