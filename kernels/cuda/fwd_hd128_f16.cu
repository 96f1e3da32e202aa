/* fwd_hd128_f16.cu — flash forward instance: head dim 128, f16, not causal. */
#define FA_HDQK 128
#define FA_HDV 128
#define FA_BF16 0
#define FA_CAUSAL 0
#define FA_SUFFIX hd128_f16
#include "fwd_body.cuh"
