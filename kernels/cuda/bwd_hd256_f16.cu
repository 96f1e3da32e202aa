/* bwd_hd256_f16.cu — flash backward (dK/dV and dQ kernels) instance: head dim 256, f16, not causal. */
#define FA_HDQK 256
#define FA_HDV 256
#define FA_BF16 0
#define FA_CAUSAL 0
#define FA_SUFFIX hd256_f16
#include "bwd_body.cuh"
