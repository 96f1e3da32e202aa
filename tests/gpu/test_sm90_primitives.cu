/* test_sm90_primitives.cu — the Hopper primitives of kernels/cuda/device_sm90.cuh against
 * plain arithmetic on known data, one warpgroup: TMA boxes land where the 128-byte swizzle
 * of the PTX ISA puts them (chunk c of row r at chunk c ^ (r % 8)) with zeros outside the
 * tensor, negative coordinates included; mbarrier phases alternate; wgmma m64n128k16 with
 * A and B from K-major swizzled descriptors (the start address stepped 32 bytes per k16)
 * and with A from registers and B MN-major (LBO between 64-column blocks, SBO between
 * 8-row groups) equal plain matrix products; so do m64n64k16 with both operands K-major and
 * with both MN-major from shared memory (A transposed, as the backward reads dS^T), and
 * m64n64k16 with A from registers and B MN-major (head dim 64's P V); a TMA
 * store of two swizzled boxes, one starting above the tensor and one crossing its end,
 * writes exactly the rows inside it (rows between the boxes and past the end keep their
 * poison); a wgmma reads an operand the threads wrote (swizzled, then fence.proxy.async:
 * the kernels' zero-filled rows and dS^T), and a D fragment packed as the A fragments of
 * the next wgmma (the forward's P) gives the product of the chain; m64n256k16 with A from
 * registers and B MN-major over four 64-column blocks (head dim 256's P V) equals the plain
 * product too; so do m64n32k16 with both operands K-major, B starting 32 rows into its
 * tile, and m64n128k16 with A K-major and B MN-major from shared memory (head dim 256's
 * backward: S^T, dP^T on half the rows; dV, dK on half the columns), and m64n192k16 with
 * A K-major and B MN-major over three 64-column blocks (the (192, 128) backward's dK), and
 * m64n176k16 with both K-major, B written by the threads (the forward's S over 176-key
 * tiles); and
 * setmaxnreg moves
 * registers as the sm90 kernels split a 384-thread CTA (a wrong split hangs: the ctest
 * times out). Inputs are small integers (or raw 16-bit patterns), so results are exact
 * and compared with ==.
 *
 * Built twice: on the emulator (ctest cuda_emu_sm90_primitives: it checks the emulator's
 * model of the PTX text) and, for sm_90a, on the GPU (cuda_sm90_primitives, label gpu:
 * the same expectations against the hardware; exit 77 without a compute capability 9.0
 * device). A disagreement on the GPU means the layout model, not the kernel, is wrong. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_sm90.cuh"
#include "gpu_device.h"

#ifndef ATTN_CUDA_EMULATE
#include <cuda_runtime_api.h>
#endif

enum { XR = 100, XC = 64, BOX_R = 64 }; /* X [XR][XC]: boxes at rows -8 and XR - 40 */
enum { M = 64, N = 128, K = 64 };        /* D1 = A Bk^T, D2 = P V */
enum { YR = 100, Y_GUARD = 16 };         /* Y [YR][64] (+ guard rows): stores at -8, YR - 40 */

enum { N2 = 256 }; /* V2 [K][N2]: four 64-column blocks, D8 = 1 + P V2 (m64n256k16) */

struct prim_maps {
  fa_tmap x, a, bk, v, y, v2;
};

struct prim_out {
  int bad_box[128], no_sm90;
  float d1[M * N], d2[M * N]; /* [row][col] */
  float d3[M * 64], d4[M * 64]; /* m64n64k16: SS K-major; SS both MN-major */
  float d5[M * 64];             /* m64n64k16: RS, B MN-major (V's second column block) */
  float d6[M * 64];             /* A G^T, G = I written by the threads: A */
  float d7[M * N];              /* d6's D fragment packed as A fragments, times V */
  float d8[M * N2];             /* m64n256k16: RS, B MN-major (V2's four column blocks) */
  float d9[M * 32];             /* m64n32k16: SS K-major, Bk rows 32..63 */
  float d10[M * N];             /* m64n128k16: SS, A K-major, B MN-major (V) */
  float d11[M * 192];           /* m64n192k16: SS, A K-major, B MN-major (V2's first 3 blocks) */
  float d12[M * 176];           /* m64n176k16: SS K-major, B = G176 written by the threads */
};

/* The m64nNk16 D fragment d of thread t into out [64][N]: rows 16w + g (+8), columns
 * 8i + 2c (+1). */
template <int NC> FA_DEV void store_dn(float *out, const float *d, int t) {
  const int w = t / 32, g = (t % 32) / 4, c = t % 4;
  for (int i = 0; i < NC / 8; i++)
    for (int e = 0; e < 4; e++) out[(16 * w + g + 8 * (e >> 1)) * NC + 8 * i + 2 * c + (e & 1)] = d[4 * i + e];
}

/* G176[n][k] (the N=176 check's B, small integers): its value, and its bf16 bits for the
 * device (exact, as bf16_of_int: a float of |x| <= 2 has its upper 16 bits exact) */
#define G176(n, k) (((n) * 3 + (k) * 7) % 5 - 2)
#define G176_BITS(n, k) ((uint16_t)(G176(n, k) == 0 ? 0 : G176(n, k) == 1 ? 0x3F80 : G176(n, k) == 2 ? 0x4000 \
                                   : G176(n, k) == -1 ? 0xBF80 : 0xC000))

/* Row r of the two stored boxes (r < 64: the first), column c: a raw bf16 bit pattern. */
#define Y_PATTERN(r, c) ((uint16_t)(0x4000 + (((r) * 64 + (c)) * 7 & 0x3FF)))

/* A fragments of P [M][K] bf16 bits from global memory: the m16n8k16 A layout of each
 * warp's 16 rows, k16 chunk kc in pa[kc]. */
FA_DEV void load_p_frags(uint32_t pa[K / 16][4], const uint16_t *p_bits, int t) {
  const int w = t / 32, g = (t % 32) / 4, c = t % 4;
  for (int kc = 0; kc < K / 16; kc++)
    for (int j = 0; j < 4; j++) {
      const int row = 16 * w + g + 8 * (j & 1), col = 16 * kc + 2 * c + 8 * (j >> 1);
      pa[kc][j] = (uint32_t)p_bits[row * K + col] | ((uint32_t)p_bits[row * K + col + 1] << 16);
    }
}

FA_KERNEL(128) prim_kernel(const FA_GRID_CONST prim_maps maps, const uint16_t *p_bits, prim_out *out) {
#if FA_SM90_DEVICE
  FA_SMEM(raw);
  unsigned char *sm = raw + ((1024 - (fa_smem_addr(raw) & 1023)) & 1023);
  uint16_t *sX = (uint16_t *)sm;     /* [2][BOX_R][64] */
  uint16_t *sA = sX + 2 * BOX_R * 64; /* [M][64] */
  uint16_t *sB = sA + M * 64;        /* [N][64] */
  uint16_t *sV = sB + N * 64;        /* [2 column blocks][K][64] */
  uint64_t *bar = (uint64_t *)(sV + 2 * K * 64);
  const int t = (int)threadIdx.x;
  if (t == 0) {
    fa_mbar_init(&bar[0], 1);
    fa_mbar_init(&bar[1], 128);
    fa_mbar_init_fence();
  }
  FA_SYNC();
  if (t == 0) {
    fa_mbar_arrive_expect_tx(&bar[0], (2 * BOX_R + M + N + 2 * K) * 128);
    fa_tma_load_4d(sX, &maps.x, 0, -8, 0, 0, &bar[0]);
    fa_tma_load_4d(sX + BOX_R * 64, &maps.x, 0, XR - 40, 0, 0, &bar[0]);
    fa_tma_load_4d(sA, &maps.a, 0, 0, 0, 0, &bar[0]);
    fa_tma_load_4d(sB, &maps.bk, 0, 0, 0, 0, &bar[0]);
    fa_tma_load_4d(sV, &maps.v, 0, 0, 0, 0, &bar[0]);
    fa_tma_load_4d(sV + K * 64, &maps.v, 64, 0, 0, 0, &bar[0]);
  }
  fa_mbar_wait(&bar[0], 0);
  /* box row r (of both boxes): element c of X[first + r] at 128 r + 16 ((c / 8) ^ (r % 8))
   * + 2 (c % 8); rows outside X read 0 */
  int bad = 0;
  for (int r = t; r < 2 * BOX_R; r += 128)
    for (int c = 0; c < 64; c++) {
      const int xr = r < BOX_R ? r - 8 : XR - 40 + r - BOX_R;
      const uint16_t want = xr < 0 || xr >= XR ? 0 : (uint16_t)(0x3F80 + ((xr * 64 + c) & 127));
      const uint16_t got = sX[(r * 128 + 16 * ((c / 8) ^ (r % 8)) + 2 * (c % 8)) / 2];
      bad += got != want;
    }
  /* phases: 128 arrivals complete phase 0, then phase 1; a parity wait on the phase just
   * completed returns again at once (a wrong model deadlocks here: the ctest times out) */
  fa_mbar_arrive(&bar[1]);
  fa_mbar_wait(&bar[1], 0);
  fa_mbar_arrive(&bar[1]);
  fa_mbar_wait(&bar[1], 1);
  fa_mbar_wait(&bar[1], 1);
  out->bad_box[t] = bad;

  /* TMA store: thread t writes row t of sX (two 64-row boxes), swizzled as TMA loads it;
   * box 0 goes to Y rows -8.. (the first 8 clipped), box 1 to rows YR - 40.. (past YR clipped) */
  FA_SYNC();
  for (int c = 0; c < 64; c++) sX[(t * 128 + 16 * ((c / 8) ^ (t % 8)) + 2 * (c % 8)) / 2] = Y_PATTERN(t, c);
  fa_fence_proxy_async();
  FA_SYNC();
  if (t == 0) {
    fa_tma_store_4d(&maps.y, sX, 0, -8, 0, 0);
    fa_tma_store_4d(&maps.y, sX + BOX_R * 64, 0, YR - 40, 0, 0);
    fa_bulk_commit();
    fa_bulk_wait_read<0>();
  }
  FA_SYNC();

  float d[64];
  for (int i = 0; i < 64; i++) d[i] = 0.0f;
  const uint32_t a = fa_smem_addr(sA), bk = fa_smem_addr(sB), v = fa_smem_addr(sV);
  fa_wgmma_fence();
  for (int kk = 0; kk < K / 16; kk++)
    fa_wgmma_ss_bf16(d, fa_wgmma_desc(a + 32 * kk, 16, 1024), fa_wgmma_desc(bk + 32 * kk, 16, 1024), kk > 0);
  fa_wgmma_commit();
  fa_wgmma_wait<0>();
  store_dn<N>(out->d1, d, t);

  /* A fragments of P [M][K] from global memory (m16n8k16 A layout of each warp's rows) */
  uint32_t pa[K / 16][4];
  load_p_frags(pa, p_bits, t);
  for (int i = 0; i < 64; i++) d[i] = 1.0f; /* accumulate onto 1 */
  fa_wgmma_fence();
  for (int kc = 0; kc < K / 16; kc++)
    fa_wgmma_rs_t_bf16(d, pa[kc], fa_wgmma_desc(v + 2048 * kc, K * 128, 1024));
  fa_wgmma_commit();
  fa_wgmma_wait<0>();
  store_dn<N>(out->d2, d, t);

  /* m64n64k16: D3 = A Bk[0..63]^T (both K-major); D4 = V[:, 0..63]^T V[:, 64..127], A and
   * B both MN-major from V's two column blocks (A transposed: the backward's dS^T) */
  float e[32];
  fa_wgmma_fence();
  for (int kk = 0; kk < K / 16; kk++)
    fa_wgmma_ss64_bf16(e, fa_wgmma_desc(a + 32 * kk, 16, 1024), fa_wgmma_desc(bk + 32 * kk, 16, 1024), kk > 0);
  fa_wgmma_commit();
  fa_wgmma_wait<0>();
  store_dn<64>(out->d3, e, t);
  fa_wgmma_fence();
  for (int kc = 0; kc < K / 16; kc++)
    fa_wgmma_ss64_tt_bf16(e, fa_wgmma_desc(v + 2048 * kc, K * 128, 1024),
                          fa_wgmma_desc(v + K * 128 + 2048 * kc, K * 128, 1024), kc > 0);
  fa_wgmma_commit();
  fa_wgmma_wait<0>();
  store_dn<64>(out->d4, e, t);
  /* D5 = 1 + P V[:, 64..127]: A from registers, B MN-major from V's second column block */
  for (int i = 0; i < 32; i++) e[i] = 1.0f;
  fa_wgmma_fence();
  for (int kc = 0; kc < K / 16; kc++)
    fa_wgmma_rs64_t_bf16(e, pa[kc], fa_wgmma_desc(v + K * 128 + 2048 * kc, K * 128, 1024));
  fa_wgmma_commit();
  fa_wgmma_wait<0>();
  store_dn<64>(out->d5, e, t);
  /* D9 = A Bk[32..63]^T (m64n32k16, both K-major; B 32 rows = 4096 bytes into its tile);
   * D10 = 1 + A V (m64n128k16: A K-major, B MN-major from V's two column blocks) */
  float f9[16];
  fa_wgmma_fence();
  for (int kk = 0; kk < K / 16; kk++)
    fa_wgmma_ss32_bf16(f9, fa_wgmma_desc(a + 32 * kk, 16, 1024), fa_wgmma_desc(bk + 32 * 128 + 32 * kk, 16, 1024),
                       kk > 0);
  fa_wgmma_commit();
  fa_wgmma_wait<0>();
  store_dn<32>(out->d9, f9, t);
  for (int i = 0; i < 64; i++) d[i] = 1.0f;
  fa_wgmma_fence();
  for (int kc = 0; kc < K / 16; kc++)
    fa_wgmma_ss_t_bf16(d, fa_wgmma_desc(a + 32 * kc, 16, 1024), fa_wgmma_desc(v + 2048 * kc, K * 128, 1024));
  fa_wgmma_commit();
  fa_wgmma_wait<0>();
  store_dn<N>(out->d10, d, t);

  /* G = I [64][64] by thread stores (K-major, swizzled as TMA lands rows) into sX, made
   * visible to the async proxy; D6 = A G^T = A; then D6's D fragment packed as the A
   * fragments of 4 k16 chunks, as the forward packs P: D7 = D6 V */
  FA_SYNC();
  if (t < 64)
    for (int c = 0; c < 64; c++)
      sX[(t * 128 + 16 * ((c / 8) ^ (t % 8)) + 2 * (c % 8)) / 2] = c == t ? 0x3F80 : 0; /* bf16 1, 0 */
  fa_fence_proxy_async();
  FA_SYNC();
  const uint32_t gi = fa_smem_addr(sX);
  fa_wgmma_fence();
  for (int kk = 0; kk < K / 16; kk++)
    fa_wgmma_ss64_bf16(e, fa_wgmma_desc(a + 32 * kk, 16, 1024), fa_wgmma_desc(gi + 32 * kk, 16, 1024), kk > 0);
  fa_wgmma_commit();
  fa_wgmma_wait<0>();
  store_dn<64>(out->d6, e, t);
  uint32_t ea[K / 16][4];
  for (int kc = 0; kc < K / 16; kc++)
    for (int j = 0; j < 4; j++) ea[kc][j] = fa_pack_bf16(e[8 * kc + 2 * j], e[8 * kc + 2 * j + 1]);
  for (int i = 0; i < 64; i++) d[i] = 0.0f;
  fa_wgmma_fence();
  for (int kc = 0; kc < K / 16; kc++) fa_wgmma_rs_t_bf16(d, ea[kc], fa_wgmma_desc(v + 2048 * kc, K * 128, 1024));
  fa_wgmma_commit();
  fa_wgmma_wait<0>();
  store_dn<N>(out->d7, d, t);
#else
  (void)maps;
  (void)p_bits;
  if (threadIdx.x == 0) out->no_sm90 = 1; /* no sm_90a code in this pass */
#endif
}

/* D8 = 1 + P V2 by m64n256k16 (head dim 256's P V), a kernel of its own (its 128
 * accumulators beside prim_kernel's would serialise that kernel's wgmma): V2 [K][N2] lands
 * as four swizzled 64-column blocks, K * 128 bytes apart (LBO); A fragments of P from
 * global memory as in prim_kernel. */
FA_KERNEL(128) prim256_kernel(const FA_GRID_CONST prim_maps maps, const uint16_t *p_bits, prim_out *out) {
#if FA_SM90_DEVICE
  FA_SMEM(raw);
  unsigned char *sm = raw + ((1024 - (fa_smem_addr(raw) & 1023)) & 1023);
  uint16_t *sV2 = (uint16_t *)sm; /* [4 column blocks][K][64] */
  uint16_t *sA = sV2 + 4 * K * 64; /* [M][64] */
  uint64_t *bar = (uint64_t *)(sA + M * 64);
  const int t = (int)threadIdx.x;
  if (t == 0) {
    fa_mbar_init(bar, 1);
    fa_mbar_init_fence();
  }
  FA_SYNC();
  if (t == 0) {
    fa_mbar_arrive_expect_tx(bar, 4 * K * 128 + M * 128);
    for (int cb = 0; cb < 4; cb++) fa_tma_load_4d(sV2 + cb * K * 64, &maps.v2, 64 * cb, 0, 0, 0, bar);
    fa_tma_load_4d(sA, &maps.a, 0, 0, 0, 0, bar);
  }
  fa_mbar_wait(bar, 0);
  uint32_t pa[K / 16][4];
  load_p_frags(pa, p_bits, t);
  const uint32_t v2 = fa_smem_addr(sV2);
  float f[128];
  for (int i = 0; i < 128; i++) f[i] = 1.0f;
  fa_wgmma_fence();
  for (int kc = 0; kc < K / 16; kc++)
    fa_wgmma_rs256_t_bf16(f, pa[kc], fa_wgmma_desc(v2 + 2048 * kc, K * 128, 1024));
  fa_wgmma_commit();
  fa_wgmma_wait<0>();
  store_dn<N2>(out->d8, f, t);
  /* D11 = 1 + A V2[:, 0..191]: m64n192k16, A K-major, B MN-major over three blocks */
  const uint32_t a = fa_smem_addr(sA);
  for (int i = 0; i < 96; i++) f[i] = 1.0f;
  fa_wgmma_fence();
  for (int kc = 0; kc < K / 16; kc++)
    fa_wgmma_ss_t192_bf16(f, fa_wgmma_desc(a + 32 * kc, 16, 1024), fa_wgmma_desc(v2 + 2048 * kc, K * 128, 1024));
  fa_wgmma_commit();
  fa_wgmma_wait<0>();
  store_dn<192>(out->d11, f, t);
  /* D12 = A G176^T: m64n176k16, both K-major (the forward's S over 176-key tiles); G176
   * [176][64] written by the threads into sV2's room (its wgmmas have retired), swizzled
   * as TMA lands rows, made visible to the async proxy */
  FA_SYNC();
  for (int r = t; r < 176; r += 128)
    for (int c = 0; c < 64; c++)
      sV2[(r * 128 + 16 * ((c / 8) ^ (r % 8)) + 2 * (c % 8)) / 2] = G176_BITS(r, c);
  fa_fence_proxy_async();
  FA_SYNC();
  fa_wgmma_fence();
  for (int kk = 0; kk < K / 16; kk++)
    fa_wgmma_ss176_bf16(f, fa_wgmma_desc(a + 32 * kk, 16, 1024), fa_wgmma_desc(v2 + 32 * kk, 16, 1024), kk > 0);
  fa_wgmma_commit();
  fa_wgmma_wait<0>();
  store_dn<176>(out->d12, f, t);
#else
  (void)maps;
  (void)p_bits;
  if (threadIdx.x == 0) out->no_sm90 = 1;
#endif
}

/* setmaxnreg as the sm90 kernels use it: ptxas gives a 384-thread kernel with setmaxnreg
 * the launch bound's 168 registers a thread; warpgroup 0 releases to 40, 1 and 2 take
 * 232 (128 x 40 + 256 x 232 = 384 x 168: the CTA's pool exactly), then each consumer
 * thread writes out[t - 128] = 3 t + 1. */
FA_KERNEL(384) nreg_kernel(int *out) {
#if FA_SM90_DEVICE
  const int t = (int)threadIdx.x;
  if (fa_warp_uniform(t / 128) == 0) {
    fa_setmaxnreg_dec<40>();
    return;
  }
  fa_setmaxnreg_inc<232>();
  out[t - 128] = 3 * t + 1;
#else
  (void)out;
#endif
}

/* ---- host ------------------------------------------------------------------------------ */
static uint16_t bf16_of_int(int x) { /* small integers are exact in bf16 */
  float f = (float)x;
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}

static void make_map(fa_tmap *m, const void *base, uint64_t cols, uint64_t rows, uint32_t box_rows) {
#ifdef ATTN_CUDA_EMULATE
  const uint64_t dims[4] = {cols, rows, 1, 1}, strides[3] = {cols * 2, cols * rows * 2, cols * rows * 2};
  const uint32_t box[4] = {64, box_rows, 1, 1};
  if (emu_tmap_encode(m, base, 4, 2, dims, strides, box, 128)) {
    fprintf(stderr, "emu_tmap_encode failed\n");
    exit(1);
  }
#else
  void *fn = NULL;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) !=
          cudaSuccess || !fn) {
    fprintf(stderr, "no cuTensorMapEncodeTiled\n");
    exit(1);
  }
  const cuuint64_t dims[4] = {cols, rows, 1, 1}, strides[3] = {cols * 2, cols * rows * 2, cols * rows * 2};
  const cuuint32_t box[4] = {64, box_rows, 1, 1}, es[4] = {1, 1, 1, 1};
  if (((PFN_cuTensorMapEncodeTiled_v12000)fn)(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, (void *)base, dims,
                                              strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    fprintf(stderr, "cuTensorMapEncodeTiled failed\n");
    exit(1);
  }
#endif
}

/* Y[row][c] after the stores: box 0 row row + 8, box 1 row row - (YR - 40) + 64, else the
 * poison (rows YR - 48 .. YR - 41 lie between the boxes; rows from YR are guard rows). */
static uint16_t y_want(int row, int c) {
  if (row < BOX_R - 8) return Y_PATTERN(row + 8, c);
  if (row >= YR - 40 && row < YR) return Y_PATTERN(row - (YR - 40) + BOX_R, c);
  return 0xFFFF;
}

static int fA(int m, int k) { return (m * 7 + k * 3) % 5 - 2; }
static int fB(int n, int k) { return (n * 5 + k * 11) % 7 - 3; }
/* Elements of D[rows][cols] (row-major) that differ from bias + the sum over k < K of
 * term(m, n, k), the first five printed as "FAIL: <what> D[m][n] = got, want w". */
template <class F>
static int check_d(const char *what, const float *d, int rows, int cols, int bias, F term) {
  int bad = 0;
  for (int m = 0; m < rows; m++)
    for (int n = 0; n < cols; n++) {
      int w = bias;
      for (int k = 0; k < K; k++) w += term(m, n, k);
      if (d[m * cols + n] != (float)w && bad++ < 5)
        printf("FAIL: %s D[%d][%d] = %g, want %d\n", what, m, n, (double)d[m * cols + n], w);
    }
  return bad;
}
static int fP(int m, int k) { return (m * 3 + k * 13) % 5 - 2; }
static int fV(int k, int n) { return (k * 9 + n * 7) % 5 - 2; }
static int fV2(int k, int n) { return (k * 5 + n * 3) % 7 - 3; }

/* argv[1]: which kernel runs: tiles (prim_kernel), wide (prim256_kernel), nreg, or all (the
 * default). On the GPU each runs in a process of its own (three ctests): a fault such as an
 * illegal instruction poisons the context, and this way it names its kernel and leaves the
 * other checks standing. */
int main(int argc, char **argv) {
  const char *only = argc > 1 ? argv[1] : "all";
  const int all = strcmp(only, "all") == 0, run_tiles = all || strcmp(only, "tiles") == 0,
            run_wide = all || strcmp(only, "wide") == 0, run_nreg = all || strcmp(only, "nreg") == 0;
  if (!run_tiles && !run_wide && !run_nreg) {
    fprintf(stderr, "test_sm90_primitives: argument '%s' is not all, tiles, wide or nreg\n", only);
    return 2;
  }
  if (!td_available()) {
    printf("test_sm90_primitives: no CUDA device, skipped\n");
    return 77;
  }
#ifndef ATTN_CUDA_EMULATE
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (major * 10 + minor != 90) {
    printf("test_sm90_primitives: compute capability %d.%d is not 9.0, skipped\n", major, minor);
    return 77;
  }
#endif
  static uint16_t x[XR * XC], a[M * K], bk[N * K], p[M * K], v[K * N], v2[K * N2];
  for (int i = 0; i < XR * XC; i++) x[i] = (uint16_t)(0x3F80 + (i & 127));
  for (int m = 0; m < M; m++)
    for (int k = 0; k < K; k++) a[m * K + k] = bf16_of_int(fA(m, k)), p[m * K + k] = bf16_of_int(fP(m, k));
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K; k++) bk[n * K + k] = bf16_of_int(fB(n, k)), v[k * N + n] = bf16_of_int(fV(k, n));
  for (int n = 0; n < N2; n++)
    for (int k = 0; k < K; k++) v2[k * N2 + n] = bf16_of_int(fV2(k, n));
  void *dx = td_alloc(sizeof x), *da = td_alloc(sizeof a), *db = td_alloc(sizeof bk), *dp = td_alloc(sizeof p),
       *dv = td_alloc(sizeof v), *dy = td_alloc((size_t)(YR + Y_GUARD) * 64 * 2), *dv2 = td_alloc(sizeof v2);
  prim_out *dout = (prim_out *)td_alloc(sizeof(prim_out));
  td_upload(dx, x, sizeof x);
  td_upload(da, a, sizeof a);
  td_upload(db, bk, sizeof bk);
  td_upload(dp, p, sizeof p);
  td_upload(dv, v, sizeof v);
  td_upload(dv2, v2, sizeof v2);
  td_memset(dout, 0, sizeof(prim_out));
  td_memset(dy, 0xFF, (size_t)(YR + Y_GUARD) * 64 * 2);
  prim_maps maps;
  make_map(&maps.x, dx, XC, XR, BOX_R);
  make_map(&maps.a, da, K, M, M);
  make_map(&maps.bk, db, K, N, N);
  make_map(&maps.v, dv, N, K, K);
  make_map(&maps.y, dy, 64, YR, BOX_R);
  make_map(&maps.v2, dv2, N2, K, K);
  const size_t smem = 1024 + 2 * (2 * BOX_R * 64 + M * 64 + N * 64 + 2 * K * 64) + 16;
  const size_t smem256 = 1024 + 2 * (4 * K * 64 + M * 64) + 16;
#ifndef ATTN_CUDA_EMULATE
  cudaFuncSetAttribute(prim_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
#endif
  if (run_tiles) {
    printf("test_sm90_primitives: prim_kernel (TMA, mbarrier, wgmma N=32..128, TMA store)\n");
    fflush(stdout);
    FA_LAUNCH(prim_kernel, dim3(1), dim3(128), smem, NULL, maps, (const uint16_t *)dp, dout);
    td_sync();
  }
  if (run_wide) {
    printf("test_sm90_primitives: prim256_kernel (wgmma N=256 RS, N=192 SS, N=176 SS)\n");
    fflush(stdout);
    FA_LAUNCH(prim256_kernel, dim3(1), dim3(128), smem256, NULL, maps, (const uint16_t *)dp, dout);
    td_sync();
  }
  int *dn = (int *)td_alloc(256 * sizeof(int));
  td_memset(dn, 0, 256 * sizeof(int));
  if (run_nreg) {
    printf("test_sm90_primitives: nreg_kernel (setmaxnreg 40 / 232 in 384 threads)\n");
    fflush(stdout);
    FA_LAUNCH(nreg_kernel, dim3(1), dim3(384), 0, NULL, dn);
    td_sync();
  }
  static prim_out out;
  td_download(&out, dout, sizeof out);
  int nreg[256], bad_nreg = 0;
  td_download(nreg, dn, sizeof nreg);
  for (int i = 0; i < 256 && run_nreg; i++) bad_nreg += nreg[i] != 3 * (i + 128) + 1;
  int fails = 0, bad_box = 0;
  for (int t = 0; t < 128 && run_tiles; t++) bad_box += out.bad_box[t];
  if (out.no_sm90) printf("FAIL: the kernel ran without sm_90a code\n"), fails++;
  if (bad_box) printf("FAIL: %d TMA box elements not where the 128-byte swizzle puts them\n", bad_box), fails++;
  /* each product D[rows][cols] against its integer sum (the bias 1 where D started at 1) */
  const int Mt = M * run_tiles, Mw = M * run_wide;
  const int bad1 = check_d("SS K-major", out.d1, Mt, N, 0,
                         [](int m, int n, int k) { return fA(m, k) * fB(n, k); });
  const int bad2 = check_d("RS MN-major", out.d2, Mt, N, 1,
                         [](int m, int n, int k) { return fP(m, k) * fV(k, n); });
  const int bad7 = check_d("wgmma of thread-written G:", out.d6, Mt, 64, 0, /* want fA(m, n) */
                         [](int m, int n, int k) { return k == 0 ? fA(m, n) : 0; });
  const int bad8 = check_d("D fragment reused as A:", out.d7, Mt, N, 0,
                         [](int m, int n, int k) { return fA(m, k) * fV(k, n); });
  if (bad_nreg) printf("FAIL: %d setmaxnreg consumer outputs wrong\n", bad_nreg);
  const int bad9 = check_d("N=256 RS MN-major", out.d8, Mw, N2, 1,
                         [](int m, int n, int k) { return fP(m, k) * fV2(k, n); });
  const int bad10 = check_d("N=32 SS K-major", out.d9, Mt, 32, 0,
                         [](int m, int n, int k) { return fA(m, k) * fB(32 + n, k); });
  const int bad11 = check_d("SS A K-major, B MN-major", out.d10, Mt, N, 1,
                         [](int m, int n, int k) { return fA(m, k) * fV(k, n); });
  const int bad12 = check_d("N=192 SS A K-major, B MN-major", out.d11, Mw, 192, 1,
                         [](int m, int n, int k) { return fA(m, k) * fV2(k, n); });
  const int bad13 = check_d("N=176 SS K-major", out.d12, Mw, 176, 0,
                         [](int m, int n, int k) { return fA(m, k) * G176(n, k); });
  const int bad6 = check_d("N=64 RS MN-major", out.d5, Mt, 64, 1,
                         [](int m, int n, int k) { return fP(m, k) * fV(k, 64 + n); });
  const int bad3 = check_d("N=64 SS K-major", out.d3, Mt, 64, 0,
                         [](int m, int n, int k) { return fA(m, k) * fB(n, k); });
  const int bad4 = check_d("N=64 SS A,B MN-major", out.d4, Mt, 64, 0,
                         [](int m, int n, int k) { return fV(k, m) * fV(k, 64 + n); });
  static uint16_t y[(YR + Y_GUARD) * 64];
  td_download(y, dy, sizeof y);
  int bad5 = 0;
  for (int row = 0; row < (YR + Y_GUARD) * run_tiles; row++)
    for (int c = 0; c < 64; c++)
      if (y[row * 64 + c] != y_want(row, c) && bad5++ < 5)
        printf("FAIL: TMA store Y[%d][%d] = 0x%04x, want 0x%04x\n", row, c, y[row * 64 + c], y_want(row, c));
  fails += bad1 + bad2 + bad3 + bad4 + bad5 + bad6 + bad7 + bad8 + bad9 + bad10 + bad11 + bad12 + bad13 + bad_nreg;
  if (run_tiles)
    printf("prim_kernel: TMA box %s, wgmma SS K-major %d wrong, RS MN-major %d wrong, N=64 SS K-major %d "
           "wrong, N=64 SS A,B MN-major %d wrong, N=64 RS MN-major %d wrong, TMA store %d wrong, "
           "thread-written operand %d wrong, D as A %d wrong, N=32 SS K-major %d wrong, SS A K-major "
           "B MN-major %d wrong\n",
           bad_box ? "WRONG" : "ok", bad1, bad2, bad3, bad4, bad6, bad5, bad7, bad8, bad10, bad11);
  if (run_wide)
    printf("prim256_kernel: N=256 RS MN-major %d wrong, N=192 SS A K-major B MN-major %d wrong, N=176 SS "
           "K-major %d wrong\n", bad9, bad12, bad13);
  if (run_nreg) printf("nreg_kernel: setmaxnreg %d wrong\n", bad_nreg);
  printf("test_sm90_primitives (%s): %s\n", only, fails ? "FAILED" : "all passed");
  td_free(dx);
  td_free(da);
  td_free(db);
  td_free(dp);
  td_free(dv);
  td_free(dv2);
  td_free(dy);
  td_free(dout);
  td_free(dn);
  return fails ? 1 : 0;
}
