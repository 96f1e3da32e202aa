/* fwd_hd192x128_bf16_causal_sm90.cu — Hopper (sm_90a) flash forward instance: Dqk 192, Dv 128 (DeepSeek MLA), bf16, causal; warp-specialised TMA + wgmma (fwd_sm90_body.cuh). */
#define FA_HDQK 192
#define FA_HDV 128
#define FA_BF16 1
#define FA_CAUSAL 1
#define FA_SUFFIX hd192x128_bf16_causal_sm90
#include "fwd_sm90_body.cuh"
