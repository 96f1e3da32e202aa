/* fwd_hd128_f16_causal.cu — flash forward instance: head dim 128, f16, causal. */
#define FA_HDQK 128
#define FA_HDV 128
#define FA_BF16 0
#define FA_CAUSAL 1
#define FA_SUFFIX hd128_f16_causal
#include "fwd_body.cuh"
