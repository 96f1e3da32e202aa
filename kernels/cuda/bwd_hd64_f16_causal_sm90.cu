/* bwd_hd64_f16_causal_sm90.cu — Hopper (sm_90a) flash backward instance: head dim 64, f16, causal; TMA + wgmma, warp-specialised, dQ by atomics or TMA reduce-adds (bwd_sm90_body.cuh). */
#define FA_HDQK 64
#define FA_HDV 64
#define FA_BF16 0
#define FA_CAUSAL 1
#define FA_SUFFIX hd64_f16_causal_sm90
#include "bwd_sm90_body.cuh"
