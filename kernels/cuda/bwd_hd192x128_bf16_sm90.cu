/* bwd_hd192x128_bf16_sm90.cu — Hopper (sm_90a) flash backward instance: (Dqk, Dv) = (192, 128), bf16, not causal; TMA + wgmma, warp-specialised, dQ by atomics, columns split between the consumers (bwd_sm90_body.cuh). */
#define FA_HDQK 192
#define FA_HDV 128
#define FA_BF16 1
#define FA_CAUSAL 0
#define FA_SUFFIX hd192x128_bf16_sm90
#include "bwd_sm90_body.cuh"
