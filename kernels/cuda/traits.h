/* traits.h — tile shapes of the CUDA flash kernels, as a function of the instance's head
 * dims (FA_HDQK, FA_HDV, defined by the instance .cu before including this).
 *
 * Every warp owns 16 rows of an m16n8k16 tile (queries in the forward and dQ kernels,
 * keys in the dK/dV kernel); shared-memory rows are padded by 8 elements (16 bytes) so
 * that the 8 row addresses of an ldmatrix fall in 8 different bank groups. Shapes were
 * chosen to stay under 255 registers with no spills (checked by cmake/check_spills.cmake)
 * and within 227 KB of shared memory:
 *
 *   kernel   warps  tile (rows x keys)   smem (d=128)   per-thread accumulators (d=128)
 *   fwd        8     128 x 64            104 KB         O 64, S 32, Q fragments 32
 *   dkdv       8     keys 128, q 32/64   118 KB         dK 64, dV 64, S^T 16, dP^T 16
 *   dq         4      64 x 64            104 KB         dQ 64, S 32, dP 32 (Q, dO from smem)
 *
 * Future work (not in this build): a Hopper path (sm_90a: wgmma with B from shared
 * memory, TMA loads on an mbarrier, warp-specialised producer/consumer warpgroups) for
 * the forward and the dK/dV kernel; these mma.sync kernels stay as the sm_80 path. */
#ifndef ATTN_CUDA_TRAITS_H
#define ATTN_CUDA_TRAITS_H

#define FA_PAD 8 /* elements of padding per shared-memory row */

#define FA_FWD_WARPS 8
#define FA_FWD_BM (16 * FA_FWD_WARPS) /* query rows per CTA */
#define FA_FWD_BN 64                  /* keys per tile */

#define FA_BWD_WARPS 8
#define FA_BWD_BN (16 * FA_BWD_WARPS) /* keys per CTA */
/* query rows per inner step of the dK/dV kernel */
#define FA_BWD_BM(dqk, dv) (((dqk) > 64 || (dv) > 64) ? 32 : 64)

#define FA_DQ_WARPS 4
#define FA_DQ_BM (16 * FA_DQ_WARPS) /* query rows per CTA of the dQ kernel */
#define FA_DQ_BN 64                 /* keys per tile */

/* Varlen tile tables are sized for tiles of at least this many rows. */
#define FA_MIN_TILE 16

#endif
