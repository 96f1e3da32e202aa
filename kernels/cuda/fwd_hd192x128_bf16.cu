/* fwd_hd192x128_bf16.cu — flash forward instance: Dqk 192, Dv 128 (DeepSeek MLA), bf16, not causal. */
#define FA_HDQK 192
#define FA_HDV 128
#define FA_BF16 1
#define FA_CAUSAL 0
#define FA_SUFFIX hd192x128_bf16
#include "fwd_body.cuh"
