/* fwd_hd192x128_f16_causal.cu — flash forward instance: Dqk 192, Dv 128 (DeepSeek MLA), f16, causal. */
#define FA_HDQK 192
#define FA_HDV 128
#define FA_BF16 0
#define FA_CAUSAL 1
#define FA_SUFFIX hd192x128_f16_causal
#include "fwd_body.cuh"
