/* device.cuh — the device primitives every CUDA kernel here is written with: mma.sync
 * m16n8k16 (bf16/f16 -> f32), ldmatrix, cp.async, warp shuffles, bf16/f16 packing, and
 * the launch macros. With -DATTN_CUDA_EMULATE the same names map to the host model in
 * tests/gpu/emu.h, so the kernels' logic is tested on a CPU too. */
#ifndef ATTN_CUDA_DEVICE_CUH
#define ATTN_CUDA_DEVICE_CUH

#include <stdint.h>

#ifndef ATTN_CUDA_EMULATE
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define FA_DEV static __device__ __forceinline__
#define FA_UNROLL _Pragma("unroll")
#define FA_NO_UNROLL _Pragma("unroll 1")
#define FA_KERNEL(threads) extern "C" __global__ void __launch_bounds__(threads, 1)
/* at least minb CTAs of threads resident per SM (registers capped to fit) */
#define FA_KERNEL_MIN(threads, minb) extern "C" __global__ void __launch_bounds__(threads, minb)
#define FA_KERNEL_GENERIC extern "C" __global__ void
#define FA_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#define FA_SYNC() __syncthreads()
#define FA_SYNC_OR(p) __syncthreads_or(p)
#define FA_LAUNCH(kern, grid, block, smem, stream, ...) \
  kern<<<(grid), (block), (smem), (cudaStream_t)(stream)>>>(__VA_ARGS__)

/* D += A * B, m16n8k16, A row-major, B column-major, float accumulators. */
FA_DEV void fa_mma_bf16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
FA_DEV void fa_mma_f16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

FA_DEV uint32_t fa_smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* Four 8x8 b16 matrices; lane l gives the address of row l%8 of matrix l/8. */
FA_DEV void fa_ldsm_x4(uint32_t r[4], const void *row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(fa_smem_addr(row))
               : "memory");
}
FA_DEV void fa_ldsm_x4_t(uint32_t r[4], const void *row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(fa_smem_addr(row))
               : "memory");
}

/* 16 bytes global -> shared, asynchronously; valid == 0 writes 16 zero bytes instead
 * (nothing is read from src, which must still be a mapped address). */
FA_DEV void fa_cp_async16(void *dst, const void *src, int valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(fa_smem_addr(dst)),
               "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
FA_DEV void fa_cp_async4(void *dst, const void *src, int valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(fa_smem_addr(dst)),
               "l"(src), "r"(valid ? 4 : 0)
               : "memory");
}
FA_DEV void fa_cp_commit(void) { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
FA_DEV void fa_cp_wait_all(void) { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
/* all but the newest N groups landed */
template <int N> FA_DEV void fa_cp_wait_group(void) {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

FA_DEV float fa_shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
FA_DEV int fa_any(int p) { return __any_sync(0xffffffffu, p); }
FA_DEV void fa_syncwarp(void) { __syncwarp(); }
/* Named barrier id (1-15; 0 is __syncthreads) over count threads, a multiple of 32: sync
 * waits for the phase, arrive only counts (a producer signalling consumers). */
FA_DEV void fa_named_bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
FA_DEV void fa_named_bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
/* p[0] += a, p[1] += b (p 8-byte aligned): one vector atomic on sm_90+, two before. */
FA_DEV void fa_atomic_add2(float *p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2 *>(p), make_float2(a, b));
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#endif
}

/* Ordering between CTAs (the sm90 backward's deterministic dQ): fa_ticket, the next
 * number of a counter (CTAs take them in the order they start); fa_sem_wait, until *sem ==
 * want (ld.acquire.gpu), unless *gave_up: after about a second without it, it sets
 * *gave_up and returns, and so do all later waits of the launch (the adds that follow stay
 * correct, only their order is lost: slow, never hung); fa_fence_gpu, this thread's
 * earlier global writes and atomics before its later ones for the whole GPU; fa_sem_post,
 * *sem += 1 (red.release.gpu). */
FA_DEV int fa_ticket(int32_t *ctr) { return atomicAdd(ctr, 1); }
FA_DEV void fa_sem_wait(const int32_t *sem, int want, int32_t *gave_up) {
  for (int spin = 0; spin < (1 << 20); spin++) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(sem) : "memory");
    if (v == want || *(volatile int32_t *)gave_up) return;
    __nanosleep(500);
  }
  atomicExch(gave_up, 1);
}
FA_DEV void fa_fence_gpu(void) { __threadfence(); }
FA_DEV void fa_sem_post(int32_t *sem) {
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(sem) : "memory");
}

/* Two floats -> two bf16 / f16 in one register, lo in the low half (round to nearest). */
FA_DEV uint32_t fa_pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}
FA_DEV uint32_t fa_pack_f16(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}
FA_DEV float fa_bf16_to_float(uint16_t h) { return __bfloat162float(__ushort_as_bfloat16(h)); }
FA_DEV float fa_f16_to_float(uint16_t h) { return __half2float(__ushort_as_half(h)); }

#else /* ---- host emulation ------------------------------------------------------------ */
#include <math.h>
#include <string.h>

#include "emu.h"

#define FA_DEV static inline
#define FA_UNROLL
#define FA_NO_UNROLL
#define FA_KERNEL(threads) static void
#define FA_KERNEL_MIN(threads, minb) static void
#define FA_KERNEL_GENERIC static void
#define FA_SMEM(name) unsigned char *name = emu_smem()
#define FA_SYNC() emu_syncthreads()
#define FA_SYNC_OR(p) emu_syncthreads_or(p)
#define FA_LAUNCH(kern, grid, block, smem, stream, ...) \
  ((void)(stream), emu_launch((grid), (block), (smem), [&]() { kern(__VA_ARGS__); }))

FA_DEV void fa_mma_bf16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  emu_mma_16816(d, a, b0, b1, 1);
}
FA_DEV void fa_mma_f16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  emu_mma_16816(d, a, b0, b1, 0);
}
FA_DEV uint32_t fa_smem_addr(const void *p) { return emu_smem_addr(p); }
FA_DEV void fa_ldsm_x4(uint32_t r[4], const void *row) { emu_ldmatrix_x4(r, row, 0); }
FA_DEV void fa_ldsm_x4_t(uint32_t r[4], const void *row) { emu_ldmatrix_x4(r, row, 1); }
FA_DEV void fa_cp_async16(void *dst, const void *src, int valid) {
  emu_cp_async(dst, src, 16, valid ? 16 : 0);
}
FA_DEV void fa_cp_async4(void *dst, const void *src, int valid) {
  emu_cp_async(dst, src, 4, valid ? 4 : 0);
}
FA_DEV void fa_cp_commit(void) { emu_cp_commit(); }
FA_DEV void fa_cp_wait_all(void) { emu_cp_wait(0); }
template <int N> FA_DEV void fa_cp_wait_group(void) { emu_cp_wait(N); }
FA_DEV float fa_shfl_xor(float v, int m) { return emu_shfl_xor(v, m); }
FA_DEV int fa_any(int p) { return emu_any(p); }
FA_DEV void fa_syncwarp(void) { emu_syncwarp(); }
FA_DEV void fa_named_bar_sync(int id, int count) { emu_named_bar_sync(id, count); }
FA_DEV void fa_named_bar_arrive(int id, int count) { emu_named_bar_arrive(id, count); }
FA_DEV void fa_atomic_add2(float *p, float a, float b) { emu_atomic_add2(p, a, b); }
/* CTAs run one after another here: a wait that does not hold at once never would */
FA_DEV int fa_ticket(int32_t *ctr) { return (*ctr)++; }
FA_DEV void fa_sem_wait(const int32_t *sem, int want, int32_t *) { emu_sem_wait(sem, want); }
FA_DEV void fa_fence_gpu(void) {}
FA_DEV void fa_sem_post(int32_t *sem) { ++*sem; }
FA_DEV uint32_t fa_pack_bf16(float lo, float hi) { return emu_pack_bf16(lo, hi); }
FA_DEV uint32_t fa_pack_f16(float lo, float hi) { return emu_pack_f16(lo, hi); }
FA_DEV float fa_bf16_to_float(uint16_t h) { return emu_bf16_to_float(h); }
FA_DEV float fa_f16_to_float(uint16_t h) { return emu_f16_to_float(h); }
typedef void *cudaStream_t;
#endif

#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f

#endif
