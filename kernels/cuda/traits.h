/* traits.h — tile shapes of the CUDA flash kernels: the mma kernels' as a function of the
 * instance's head dims (FA_HDQK, FA_HDV, defined by the instance .cu before including
 * this), and the float32 SIMT kernels' (at the end).
 *
 * Every warp owns 16 rows of an m16n8k16 tile (queries in the forward and dQ kernels,
 * keys in the dK/dV kernel); shared-memory rows are padded by 8 elements (16 bytes) so
 * that the 8 row addresses of an ldmatrix fall in 8 different bank groups. Shapes were
 * chosen to stay under 255 registers with no spills (checked by cmake/check_spills.cmake)
 * and within 227 KB of shared memory (registers: the most over dtype and causal, from
 * ptxas -v for sm_80 / sm_90a, CUDA 13, 2026-12-06):
 *
 *   kernel dims     warps tile (rows x keys)       smem    regs     per-thread accumulators
 *   fwd    64        8    128 x 64                  54 KB  222/224  O 32, S 32, Q frags 16
 *   fwd    128       8    128 x 64                 102 KB  248/246  O 64, S 32, Q frags 32
 *   fwd    192x128   8    128 x 64                 134 KB  255/248  O 64, S 32, Q frags 48
 *   fwd    256       8    128 x 32, Q from smem    132 KB  248/248  O 128, S 16
 *   dkdv   64        8    keys 128, q 64            91 KB  245/245  dK 32, dV 32, S^T 32, dP^T 32
 *   dkdv   128       8    keys 128, q 32           113 KB  250/250  dK 64, dV 64, S^T 16, dP^T 16
 *   dkdv   192x128   8    keys 64 (2 warps each     90 KB  235/235  dK 48, dV 32, S^T 16, dP^T 16
 *   dkdv   256       8     16 keys), q 32          138 KB  250/251  dK 64, dV 64, S^T 16, dP^T 16
 *   dq     64        4     64 x 64                  54 KB  226/230  dQ 32, S 32, dP 32
 *   dq     128       4     64 x 64                 102 KB  242/242  dQ 64, S 32, dP 32
 *   dq     192x128   4     64 x 32                  84 KB  238/242  dQ 96, S 16, dP 16
 *   dq     256       4     64 x 32                 132 KB  252/250  dQ 128, S 16, dP 16
 *
 * The forward also has a 4-warp kernel (64 x 64 tiles, 2 CTAs an SM; fwd_kernel.cuh built
 * twice) at head dims up to 128, taken under ATTN_CUDA_FWD_WARPS=4 without packing or a
 * split: 255 registers (sm_80, sm_90a), no spills, 85 KB of shared memory at d = 128 (two: 171 of 227 KB).
 * And a two-CTA 8-warp kernel (128 x 32 tiles at d = 128, 128 x 64 at 64; FA_FWD_2CTA),
 * under ATTN_CUDA_FWD_CTAS=2: 128 registers, no spills, 70 KB at d = 128 (two: 140 KB).
 *
 * (The forward's figures include its decode forms, packed GQA and split-KV: +0.5 KB of
 * shared memory for per-row ALiBi slopes, and the row-to-position mapping.)
 *
 * Past d = 128 the per-thread accumulators are what decides: at 256 the forward's O takes
 * 128 registers, so Q is re-read from shared memory per tile and tiles hold 32 keys (64
 * keys spilled ~100 bytes); dK + dV of one key row would be 256 registers, so two warps
 * share each 16-key group with half the columns each (64 keys per CTA; both recompute the
 * group's S^T and dP^T); the dQ kernel takes 32-key tiles (at 64, 192x128 spilled). Fewer
 * query rows per CTA would not help: 16 is the mma's M.
 *
 * The Hopper kernels (sm_90a only: head dims 64, 128, 256 and (Dqk, Dv) = (192, 128))
 * have their own shapes: 3
 * warpgroups (a TMA producer, two wgmma consumers) and 168 registers at entry rebalanced
 * by setmaxnreg to 40 (producer) / 232 (consumers), no spills. The forward
 * (fwd_sm90_body.cuh): 128 rows x 128 keys (FA_SM90_FWD_BN), consumers of 64 rows, a K/V
 * ring of 3 stages at 128 causal (225 KB of shared memory), 2 of 176 keys at 128 not
 * causal (209 KB; S 88 + P 44 + O 64 floats a thread, the rows' key ranges recomputed per
 * masked tile as at 256: kept in registers they spilled 4 bytes) or 6 at 64 (209 KB: half the work a
 * tile, twice the tiles in flight) or 2 at 192 x 128 (209 KB: Q and K 48 KB a tile); at
 * 256, 128 rows x 64 keys (O is 128 floats a thread: a 128-key S, 64 floats + 32 packed P,
 * would not fit beside it in 232 registers) and 2 stages of 64 KB (193 KB). The backward (bwd_sm90_body.cuh): 128 keys per CTA, consumers of 64
 * keys, a ring of 64-row (Q, dO) tiles, 2 stages and about 166 KB at d = 128, 4 stages and
 * about 134 KB at d = 64; at 256 and 192 x 128, 64 keys a CTA with both consumers on them
 * (rows split for S^T / dP^T, columns for dK, dV, dQ; P^T and dS^T through shared memory:
 * bwd_sm90_csplit.cuh), 2 stages and about 226 KB at 256, 3 and about 195 KB at 192 x 128,
 * dQ by atomics only; its dQ mode 1 (ATTN_SM90_DQ=1: TMA reduce-adds from a float32
 * staging buffer a consumer instead of atomics) adds 32 KB, about 200 and 168 KB. These
 * mma.sync kernels stay the sm_80 path and the fallback (varlen, block masks, other head
 * dims, a deterministic dQ without its workspace). */
#ifndef ATTN_CUDA_TRAITS_H
#define ATTN_CUDA_TRAITS_H

#define FA_PAD 8 /* elements of padding per shared-memory row */

#define FA_FWD_WARPS 8
#define FA_FWD_BM (16 * FA_FWD_WARPS) /* query rows per CTA */
/* A second forward kernel of 4 warps (64 rows, two CTAs an SM) at head dims up to 128,
 * ATTN_CUDA_FWD_WARPS=4: an experiment against the 8-warp kernel's one CTA an SM, whose
 * warps meet at every tile's barrier (all in softmax at once, the tensor cores idle). */
#define FA_FWD_W4(dqk, dv) ((dqk) <= 128 && (dv) <= 128)
#define FA_FWD_W4_BM 64 /* its query rows per CTA */
/* A third forward kernel at head dims up to 128, ATTN_CUDA_FWD_CTAS=2: the 8-warp kernel
 * built for two CTAs an SM (__launch_bounds__(256, 2): at most 128 registers a thread, so
 * four warps a scheduler hide each other's latency instead of two), with Q's fragments
 * read from shared memory for every tile and, at Dv 128, 32 keys a tile: what fits 128
 * registers without spills (ptxas, CUDA 13; Q in registers spilled 80-600 B, 64 keys at
 * Dv 128 56-80 B). The same 128 query rows a CTA as the default kernel, so the same L2
 * traffic per FLOP. */
#define FA_FWD_2CTA(dqk, dv) ((dqk) <= 128 && (dv) <= 128)
#define FA_FWD_2CTA_BN(dqk, dv) ((dv) > 64 ? 32 : 64)
/* CTAs an SM it is built for: two on Hopper, the target; sm_80's ptxas spilled 4 B at 128
 * registers (d = 64 and 128), so there it is built for one (the same code and tiles). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define FA_FWD_2CTA_MINB 1
#else
#define FA_FWD_2CTA_MINB 2
#endif
/* A fourth at head dims up to 128, ATTN_CUDA_FWD_WARP_ROWS=32: FlashAttention-2's shape on
 * sm_80/sm_90 at d = 128 — 128 rows a CTA as 4 warps of 32 rows (two 16-row m-tiles that
 * share every K/V fragment: half the ldmatrix traffic an MMA), two CTAs an SM at up to 255
 * registers, so one CTA's waits overlap the other's work without the 4-warp kernel's doubled
 * K/V reads. */
#define FA_FWD_4X32(dqk, dv) ((dqk) <= 128 && (dv) <= 128)
/* its keys per tile: 32 at Dqk 128, where two m-tiles' O (128 floats a thread) beside S of
 * 64 keys (64) made ptxas spill 100 B at 255 registers; 64 at Dqk 64 (no spills) */
#define FA_FWD_4X32_BN(dqk, dv) ((dqk) > 64 ? 32 : 64)
/* A fifth, ATTN_CUDA_FWD_STAGES=4: the 8-warp kernel with 4 K/V buffers, 3 tiles in flight
 * (shared memory: 171 KiB at d = 128, 199 KiB at 256, 219 KiB at 192 x 128 — Hopper's 227
 * KiB; past sm_80's 163 KiB from d = 128 on, where its launch fails with CUDA's error). */
#define FA_FWD_4S_STAGES 4
/* A sixth, ATTN_CUDA_FWD_KSPLIT=1: the decode kernel, for problems of at most
 * FA_FWD_KS_ROWS rows a KV head (Sq x group: a decode step's) without varlen. One 16-row
 * m-tile a CTA (the 8-warp kernel's decode CTA computes on one warp of eight), whose
 * FA_FWD_KS_WARPS warps split every key tile, 16 keys a warp, each warp with an online-
 * softmax state of its own, merged across the warps after the last tile; a ring of
 * FA_FWD_KS_STAGES K/V buffers (two tiles in flight) and two CTAs an SM (109 KiB of shared
 * memory at d = 128): FlashDecoding's split of the keys inside the CTA. */
#define FA_FWD_KS_ROWS 16
#define FA_FWD_KS_WARPS(dqk, dv) (FA_FWD_BN(dqk, dv) / 16)
#define FA_FWD_KS_STAGES 3
/* and the backward's dK/dV kernel with 4 (Q, dO) step buffers, ATTN_CUDA_BWD_STAGES=4
 * (bwd_body.cuh flash_dkdv4s_; shared memory: 151 KiB at d = 128), built up to Dqk 192: at
 * 256 sm_80's ptxas spilled 8 B (one register more than the default kernel's 250) and its
 * 204 KiB would not fit sm_80 anyway; there the default kernel runs. */
#define FA_BWD_4S_STAGES 4
#define FA_BWD_4S(dqk, dv) ((dqk) <= 192)
/* keys per tile: 32 at Dv 256, where O alone takes 128 registers a thread */
#define FA_FWD_BN(dqk, dv) ((dv) > 128 ? 32 : 64)
/* Q's mma fragments stay in registers for the whole CTA up to Dqk 192; at 256 they are
 * read from shared memory for every tile (64 more registers would not fit next to O). */
#define FA_FWD_Q_IN_REGS(dqk) ((dqk) <= 192)

/* keys per tile of the Hopper forward (fwd_sm90_body.cuh H_BN; 128 query rows): 64 at
 * Dqk 256, 176 at (128, 128) not causal (FlashAttention-3's tile there), 128 otherwise */
#define FA_SM90_FWD_BN(dqk, dv, causal) \
  ((dqk) > 192 ? 64 : (dqk) == 128 && (dv) == 128 && !(causal) ? 176 : 128)
/* Does the Hopper forward keep its rows' key ranges in registers across the key tiles (up
 * to Dqk 192), or recompute them at each tile that needs them (256: O's 128 registers)? */
#define FA_SM90_FWD_ROWS_IN_REGS(dqk) ((dqk) <= 192)

#define FA_BWD_WARPS 8
/* Warps that share one 16-key group of the dK/dV kernel, each accumulating 1/CSPLIT of
 * the dK and dV columns: 2 once the two accumulators pass 256 floats a row. */
#define FA_BWD_CSPLIT(dqk, dv) ((dqk) + (dv) > 256 ? 2 : 1)
#define FA_BWD_BN(dqk, dv) (16 * FA_BWD_WARPS / FA_BWD_CSPLIT(dqk, dv)) /* keys per CTA */
/* query rows per inner step of the dK/dV kernel */
#define FA_BWD_BM(dqk, dv) (((dqk) > 64 || (dv) > 64) ? 32 : 64)

#define FA_DQ_WARPS 4
#define FA_DQ_BM (16 * FA_DQ_WARPS) /* query rows per CTA of the dQ kernel */
/* keys per tile: 32 past d = 128, where dQ alone holds 96-128 registers */
#define FA_DQ_BN(dqk, dv) (((dqk) > 128 || (dv) > 128) ? 32 : 64)

/* The float32 kernels (SIMT, f32_common.cuh): 8 threads per row, 32 rows (queries, or
 * keys in the dK/dV kernel) x 32 keys (or query rows) per tile, head dims up to 256 read
 * at run time; accumulators 32 floats a thread per [row][D] tensor. ptxas (sm_80/90a):
 * fwd 108/108 registers, dkdv 178/182, dq 109/108, no spills; shared memory sized at
 * launch, at D = 256: fwd 103 KB, dkdv 140 KB, dq 136 KB (29, 37, 36 KB at D = 64). */
#define FA_F32_WARPS 8
#define FA_F32_TPR 8
#define FA_F32_BN 32
#define FA_F32_DMAX 256

/* Varlen tile tables are sized for tiles of at least this many rows. */
#define FA_MIN_TILE 16

#endif
