/* tmap_sm90.cuh — the host side of the sm90 kernels' TMA: one tensor map (CUtensorMap, or
 * the emulator's emu_tmap) of a [B, S, H, D] bf16/f16/float32 view, for the forward
 * (fwd_sm90_body.cuh: Q, K, V loads, the O store) and the backward (bwd_sm90_body.cuh: Q,
 * dO, K, V loads, the float32 dQ reduce-adds), and whether the build has the kernels' sm_90a image for the device.
 * Each .cu includes one body, so this is a static function of its own
 * translation unit. */
#ifndef ATTN_CUDA_TMAP_SM90_CUH
#define ATTN_CUDA_TMAP_SM90_CUH

#include "common.cuh"
#include "device_sm90.cuh"

#define FA_TMAP_CB 64 /* box columns: one 128-byte swizzled column block of 16-bit elements */

#ifndef ATTN_CUDA_EMULATE
static PFN_cuTensorMapEncodeTiled_v12000 fa_tmap_encoder(void) {
  void *fn = NULL;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) !=
          cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    fn = NULL;
  (void)cudaGetLastError();
  return (PFN_cuTensorMapEncodeTiled_v12000)fn;
}
#endif

/* Element types of a map (the bf16 argument of the 16-bit callers is FA_TMAP_BF16 or
 * FA_TMAP_F16). */
enum { FA_TMAP_F16 = 0, FA_TMAP_BF16 = 1, FA_TMAP_F32 = 2 };

/* A 4-d map (d, s, h, b) of the view v (extents D, S, H, B, in elements of the given type:
 * 2 bytes, or 4 for FA_TMAP_F32) with boxes of 128 bytes of columns (FA_TMAP_CB 16-bit
 * elements, 32 floats) x box_rows rows, 128-byte swizzle, elements outside the tensor read
 * as 0 (loads) and not written (stores, reduce-adds). 0, or FA_ERR_FALLBACK when TMA cannot
 * describe the view: the base must be 16-byte aligned and the strides positive multiples
 * of 16 bytes below 2^40 (a stride of an extent-1 dimension is never used and is
 * replaced), or the driver declined it. */
static int fa_sm90_tmap(fa_tmap *m, const attn_cuda_view &v, int64_t D, int64_t S, int64_t H,
                        int64_t B, int box_rows, int type) {
  const int eb = type == FA_TMAP_F32 ? 4 : 2;
  const int64_t ext[3] = {S, H, B}, st[3] = {v.ss, v.sh, v.sb};
  uint64_t strides[3];
  if ((uintptr_t)v.p % 16) return FA_ERR_FALLBACK;
  for (int i = 0; i < 3; i++) {
    const int64_t bytes = ext[i] == 1 ? D * eb : st[i] * eb;
    if (bytes <= 0 || bytes % 16 || bytes >= (INT64_C(1) << 40)) return FA_ERR_FALLBACK;
    strides[i] = (uint64_t)bytes;
  }
  const uint32_t box_cols = 128 / (uint32_t)eb;
#ifndef ATTN_CUDA_EMULATE
  /* looked up once (a function-local static: thread-safe initialisation), NULL when the
   * driver has no cuTensorMapEncodeTiled of the 12.0 ABI */
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = fa_tmap_encoder();
  if (!encode) return FA_ERR_FALLBACK;
  const cuuint64_t dims[4] = {(cuuint64_t)D, (cuuint64_t)S, (cuuint64_t)H, (cuuint64_t)B};
  const cuuint32_t box[4] = {box_cols, (cuuint32_t)box_rows, 1, 1}, es[4] = {1, 1, 1, 1};
  const CUtensorMapDataType dt = type == FA_TMAP_F32    ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                 : type == FA_TMAP_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                        : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const CUresult r = encode(m, dt, 4, v.p, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? 0 : FA_ERR_FALLBACK;
#else
  /* the emulator's TMA moves bytes; it checks what the driver checks */
  const uint64_t dims[4] = {(uint64_t)D, (uint64_t)S, (uint64_t)H, (uint64_t)B};
  const uint32_t box[4] = {box_cols, (uint32_t)box_rows, 1, 1};
  return emu_tmap_encode(m, v.p, 4, eb, dims, strides, box, 128) ? FA_ERR_FALLBACK : 0;
#endif
}

/* 1 when this build's fatbin has code of kernel fn for the current device (an sm_90a
 * image on a compute capability 9.0 device), else 0; asked once, kept in *cache (-1 at
 * first). The emulator runs every kernel. */
static int fa_sm90_has_image(int *cache, const void *fn) {
#ifndef ATTN_CUDA_EMULATE
  if (*cache < 0) {
    cudaFuncAttributes a;
    *cache = cudaFuncGetAttributes(&a, fn) == cudaSuccess;
    (void)cudaGetLastError();
  }
  return *cache;
#else
  (void)cache;
  (void)fn;
  return 1;
#endif
}

#endif
