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
/* Named barriers 0-15 (bar.sync / bar.arrive id, count): count threads, a multiple of 32,
 * complete a phase; sync waits for it, arrive does not. They count whole warps, as the
 * GPU: a lane waits for the other live (not exited) lanes of its warp, which must execute
 * the same instruction (the same kind and count: else an abort), and then its warp adds 32;
 * a warp only some of whose lanes come is a deadlock reported by warp and lane mask. Every
 * arrival of a phase must give the same count; a block may not end with a phase
 * half-filled. */
void emu_named_bar_sync(int id, int count);
void emu_named_bar_arrive(int id, int count);
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

/* ---- sm_90 (kernels/cuda/device_sm90.cuh) ------------------------------------------
 * Shared addresses are byte offsets in the block's shared window, whose dynamic part
 * starts at a random 16-byte-aligned (not 1024-byte-aligned) address each block: kernels
 * must align their swizzled tiles themselves (the swizzle patterns key on the address).
 * Shared memory has two views, as the PTX ISA's proxies: what threads read and write (the
 * generic proxy) and what TMA and wgmma read (the async proxy). TMA loads write both;
 * a thread's stores reach the async view only at a fence.proxy.async of that thread (the
 * model tracks which thread stored each byte last, by keeping the pages read-only from
 * the block's first sm_90 operation and comparing each page a thread opened when its
 * time slice ends; stores before that operation are published by any thread's fence).
 * wgmma and TMA stores abort when a byte they read differs between the views (a store
 * without its writer's fence), naming the writer. Shared memory ends at a guard page: a
 * plain load or store past its end faults.
 * mbarriers: phases complete when the arrivals of the init count are in and the
 * transaction count is back to 0 (both counts checked against the ISA's 2^20 - 1); a
 * wait blocks until the phase of the given parity has completed; the phase a thread means
 * is the next of that parity after the one its last wait on the barrier returned for (or
 * that one again, if the barrier has not moved since), and a wait on a phase two or more
 * behind the current one aborts (try_wait.parity would hang or pass by aliasing). TMA
 * loads read global memory and land (swizzled, out-of-range elements 0) only when some thread waits on
 * their mbarrier; their destination reads as NaN before. wgmma is a warpgroup collective
 * (4 consecutive warps): operands are read at the issue and must be unchanged when each
 * warp's wgmma.wait_group retires the group (shared memory and the A registers: else an
 * abort), the accumulators read as NaN until then (and must not be written: an abort),
 * an mma_async needs a wgmma.fence since the thread's last wait, its accumulators (unless
 * in flight: a chain) and A registers must be as they were at that fence (registers known
 * from the thread's earlier issues: a loop's first iteration is not checked), and a swizzled
 * descriptor's start must lie in the first 128-byte row of its swizzle pattern (base
 * offset 0 is all the model knows). */
struct emu_tmap {
  const void *base;
  int rank, elem_bytes, swizzle_bytes; /* swizzle: 0 (none), 32, 64 or 128 */
  uint64_t dims[5], strides[5];        /* elements; bytes (strides[0] = elem_bytes) */
  uint32_t box[5];
};
/* cuTensorMapEncodeTiled for the emulator, with the driver's checks (CUDA driver API,
 * "Tensor Map Object Management"): rank 1-5, base 16-byte aligned, dims 1 to 2^32, the
 * rank - 1 outer strides (bytes, strides[i] for dimension i + 1) multiples of 16 below
 * 2^40, box extents 1 to 256 with box[0] * elem_bytes a multiple of 16 and, swizzled, at
 * most the swizzle span. 0 with *m filled, or -1 where the driver returns
 * CUDA_ERROR_INVALID_VALUE. */
int emu_tmap_encode(emu_tmap *m, const void *base, int rank, int elem_bytes, const uint64_t *dims,
                    const uint64_t *strides, const uint32_t *box, int swizzle_bytes);
/* setmaxnreg.{inc,dec}.sync.aligned.u32 n (inc 1 / 0), PTX ISA rules: n a multiple of 8 in
 * 24-256, the same instruction from every thread of the warpgroup (a collective), dec not
 * above and inc not below the warpgroup's count, registers moved through a per-CTA pool
 * that starts empty: inc blocks until earlier decs have released enough (a deadlock, with
 * a message, if they never do). Every warpgroup starts at the launch's count, taken as
 * the most a __launch_bounds__(threads, 1) kernel gets (65536 / threads, down to a
 * multiple of 8, at most 255): cuda_ptxas_spills checks that ptxas gave the sm90 kernels
 * exactly that. */
void emu_setmaxnreg(int n, int inc);
uint32_t emu_smem_addr(const void *p);
void emu_mbar_init(uint64_t *bar, int count);
/* Adds tx_bytes to the transaction count, then arrives (mbarrier.arrive.expect_tx). */
void emu_mbar_arrive(uint64_t *bar, uint32_t tx_bytes);
void emu_mbar_wait(uint64_t *bar, int parity);
void emu_tma_load(void *smem_dst, const emu_tmap *map, const int *coords, uint64_t *bar);
/* TMA stores (cp.async.bulk.tensor global <- shared::cta, .bulk_group), the strictest
 * reading of the PTX ISA: the source box must not change from the issue until the
 * issuing thread's cp.async.bulk.wait_group.read retires its group (checked: the box is
 * compared at the wait, an abort with a message if it changed), and global memory is
 * written only then, clipped to the tensor (elements outside are not written); stores
 * never committed or waited for are never written. Each thread of the issuing thread's
 * warpgroup must have executed fence.proxy.async since that warpgroup's previous bulk
 * commit (stricter than the ISA, which asks it of the threads that wrote the box: here
 * that warpgroup is the writer). */
void emu_tma_store(const emu_tmap *map, const void *smem_src, const int *coords);
void emu_bulk_commit(void);
void emu_bulk_wait_read(int pending_groups);
void emu_fence_proxy_async(void);
void emu_wgmma_fence(void);
void emu_wgmma_commit(void);
void emu_wgmma_wait(int pending_groups);
/* d[n/2] (+)= A B, m64 n k16 f32: A from the descriptor desc_a, K-major (trans_a 0) or
 * MN-major (1), or, when a_regs is not NULL, from the warpgroup's registers (trans_a must
 * be 0); B from desc_b, K-major (trans_b 0) or MN-major (1). scale_d 0: d = A B. */
void emu_wgmma(float *d, int n, uint64_t desc_a, const uint32_t *a_regs, uint64_t desc_b,
               int scale_d, int trans_a, int trans_b, int is_bf16);
/* The shared-memory address swizzle of a mode (bytes 0, 32, 64, 128). */
uint32_t emu_swizzle(uint32_t addr, int swizzle_bytes);

/* p[0] += a, p[1] += b as one float2 atomicAdd (red.global.add.v2.f32, sm_90): p must be
 * 8-byte aligned (an abort, as the GPU's misaligned-address fault). */
void emu_atomic_add2(float *p, float a, float b);
/* The deterministic dQ's semaphore wait: CTAs run one after another on the emulator, so
 * *sem must already be want (else it could never become it: a deadlock on the GPU). */
void emu_sem_wait(const int32_t *sem, int want);

uint32_t emu_pack_bf16(float lo, float hi);
uint32_t emu_pack_f16(float lo, float hi);
float emu_bf16_to_float(uint16_t h);
float emu_f16_to_float(uint16_t h);

/* Device memory of the emulated device is host memory. */
void *emu_device_alloc(size_t bytes);
void emu_device_free(void *p);


/* TMA reduce-add (cp.reduce.async.bulk.tensor .add, .bulk_group) of a float32 box: the
 * rules of emu_tma_store (the warpgroup's fence.proxy.async; the box unchanged until the
 * issuing thread's wait_group.read retires it, compared there; and here also at a later
 * reduce from the same source still in flight), then each element inside the tensor
 * (clipped as the store is) added to global memory. The box is read at the issue: one
 * order the hardware may take, and the check makes every other order give the same sum. */
void emu_tma_reduce_add(const emu_tmap *map, const void *smem_src, const int *coords);

#endif
