/* fwd_hd128_bf16.cu — flash forward instance: head dim 128, bf16, not causal. */
#define FA_HDQK 128
#define FA_HDV 128
#define FA_BF16 1
#define FA_CAUSAL 0
#define FA_SUFFIX hd128_bf16
#include "fwd_body.cuh"
