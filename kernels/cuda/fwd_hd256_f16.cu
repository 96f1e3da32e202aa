/* fwd_hd256_f16.cu — flash forward instance: head dim 256, f16, not causal. */
#define FA_HDQK 256
#define FA_HDV 256
#define FA_BF16 0
#define FA_CAUSAL 0
#define FA_SUFFIX hd256_f16
#include "fwd_body.cuh"
