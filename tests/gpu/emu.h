/* emu.h — a host model of the CUDA primitives that kernels/cuda uses, so that the same
 * kernel source runs on a CPU in tests (built with -DATTN_CUDA_EMULATE, as C++).
 *
 * Each CUDA thread of a block is a coroutine on one OS thread; every barrier, shuffle,
 * ldmatrix and mma.sync is a collective at which the lanes switch, so the data exchanged
 * follows the PTX ISA's fragment layouts exactly as written in emu.cc. cp.async copies land
 * only at cp.async.wait_group (their destination reads as NaN before), shared memory
 * starts as NaN, warps and blocks run in a shuffled order, and shared-memory accesses of
 * ldmatrix / cp.async are bounds-checked: missing waits, missing barriers and tile
 * overruns show up as wrong results or an abort with a message. Test-only code. */
#ifndef ATTN_EMU_H
#define ATTN_EMU_H

#include <stddef.h>
#include <stdint.h>

#include <functional>

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

extern dim3 emu_threadIdx, emu_blockIdx, emu_blockDim, emu_gridDim;
#define threadIdx emu_threadIdx
#define blockIdx emu_blockIdx
#define blockDim emu_blockDim
#define gridDim emu_gridDim

/* Runs body once per thread of every block (blocks one after another, in a shuffled
 * order); smem_bytes of shared memory per block, filled with 0xFF bytes at block start. */
void emu_launch(dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()> &body);
unsigned char *emu_smem(void);
void emu_syncthreads(void);
int emu_syncthreads_or(int pred);

/* Warp collectives (all 32 lanes must arrive at the same kind of operation). */
float emu_shfl_xor(float v, int lane_mask);
int emu_any(int pred);
void emu_syncwarp(void);
void emu_ldmatrix_x4(uint32_t r[4], const void *smem_row, int trans);
void emu_mma_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1, int is_bf16);

/* cp.async: src_bytes (0 or bytes) are copied, the rest of `bytes` zero-filled, when the
 * issuing thread waits for the group. */
void emu_cp_async(void *smem_dst, const void *gmem_src, int bytes, int src_bytes);
void emu_cp_commit(void);
void emu_cp_wait(int pending_groups);

uint32_t emu_pack_bf16(float lo, float hi);
uint32_t emu_pack_f16(float lo, float hi);
float emu_bf16_to_float(uint16_t h);
float emu_f16_to_float(uint16_t h);

/* Device memory of the emulated device is host memory. */
void *emu_device_alloc(size_t bytes);
void emu_device_free(void *p);

#endif
