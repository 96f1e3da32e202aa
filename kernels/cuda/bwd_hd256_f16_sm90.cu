/* bwd_hd256_f16_sm90.cu — Hopper (sm_90a) flash backward instance: head dim 256, f16, not causal; TMA + wgmma, warp-specialised, dQ by atomics, columns split between the consumers (bwd_sm90_body.cuh). */
#define FA_HDQK 256
#define FA_HDV 256
#define FA_BF16 0
#define FA_CAUSAL 0
#define FA_SUFFIX hd256_f16_sm90
#include "bwd_sm90_body.cuh"
