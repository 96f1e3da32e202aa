/* fwd_hd256_f16_causal.cu — flash forward instance: head dim 256, f16, causal. */
#define FA_HDQK 256
#define FA_HDV 256
#define FA_BF16 0
#define FA_CAUSAL 1
#define FA_SUFFIX hd256_f16_causal
#include "fwd_body.cuh"
