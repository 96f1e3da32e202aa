/* device_sm90.cuh — the Hopper (sm_90a) primitives of the warp-specialised forward kernel
 * (fwd_sm90_body.cuh): mbarriers with transaction counts, TMA tile loads
 * (cp.async.bulk.tensor onto an mbarrier) and stores (bulk async-groups), wgmma.mma_async
 * m64n128k16 (A from shared memory or registers, B from shared memory through
 * 128-byte-swizzled descriptors) with its
 * fence / commit / wait, setmaxnreg and the async-proxy fence; for the backward
 * (bwd_sm90_body.cuh) also m64n64k16 with both operands from shared memory, K-major or both
 * MN-major (A transposed: dS^T stored key-major read as dS), and m64n64k16 with A from
 * registers (the N = 64 products of head dim 64); for the forward at head dim 256 also
 * m64n256k16 with A from registers (P V at Dv = 256). With -DATTN_CUDA_EMULATE the
 * same names map to the host model in tests/gpu/emu.h (emu.cc writes their semantics from
 * the PTX ISA), so the kernel runs on a CPU too.
 *
 * Shared-memory tiles here are [rows][64] bf16/f16 blocks of 128-byte rows, as TMA writes
 * them with CU_TENSOR_MAP_SWIZZLE_128B: the 16-byte chunk c of row r sits at chunk
 * c ^ (r % 8), a pattern of 8 rows (1024 bytes) keyed to address bits 7-9, so every block
 * starts 1024-byte aligned. Only the device code of the sm_90a pass uses the real
 * instructions; other passes see the declarations (fa_sm90_device_ok() says which). */
#ifndef ATTN_CUDA_DEVICE_SM90_CUH
#define ATTN_CUDA_DEVICE_SM90_CUH

#include "device.cuh"

/* 1 in the device pass that has the sm_90a instructions (and on the emulator). */
#if defined(ATTN_CUDA_EMULATE) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA_SM90_DEVICE 1
#else
#define FA_SM90_DEVICE 0
#endif

/* The wgmma shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start
 * address, leading and stride byte offsets (each >> 4, 14 bits), base offset 0, swizzle
 * mode in bits 62-63 (1 = 128-byte swizzle). */
FA_DEV uint64_t fa_wgmma_desc(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
         ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | ((uint64_t)1 << 62);
}

/* Zeroes one 128-byte row of a swizzled tile (16-byte aligned) with 8-byte stores: a
 * plain memset compiles to 128 byte stores. Generic-proxy writes: the caller fences
 * (fa_fence_proxy_async) before wgmma or TMA touch the row. */
FA_DEV void fa_zero_row128(void *row) {
  uint64_t *q = (uint64_t *)row;
  FA_UNROLL
  for (int i = 0; i < 16; i++) q[i] = 0;
}

#ifndef ATTN_CUDA_EMULATE
#include <cuda.h> /* CUtensorMap: types only; the driver is reached through cudart */
#include <cudaTypedefs.h>

typedef CUtensorMap fa_tmap;
#define FA_GRID_CONST __grid_constant__

#if FA_SM90_DEVICE
FA_DEV void fa_mbar_init(uint64_t *bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(fa_smem_addr(bar)), "r"(count)
               : "memory");
}
/* Makes the initialised barriers visible to the async proxy (TMA) and the other threads. */
FA_DEV void fa_mbar_init_fence(void) {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
FA_DEV void fa_mbar_arrive(uint64_t *bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(fa_smem_addr(bar)) : "memory");
}
FA_DEV void fa_mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(fa_smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
/* Blocks until the phase of the given parity has completed. */
FA_DEV void fa_mbar_wait(uint64_t *bar, int parity) {
  const uint32_t a = fa_smem_addr(bar);
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(a), "r"(parity)
        : "memory");
}
/* A 4-d TMA box (coordinates innermost first, elements; out-of-range elements read 0) to
 * shared memory; its bytes count against bar's transaction count. */
FA_DEV void fa_tma_load_4d(void *dst, const fa_tmap *map, int c0, int c1, int c2, int c3,
                           uint64_t *bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(fa_smem_addr(dst)),
      "l"((uint64_t)(uintptr_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(fa_smem_addr(bar))
      : "memory");
}
/* A 4-d TMA box from shared memory (src: the box as fa_tma_load_4d lands it) to global
 * memory (cp.async.bulk.tensor, bulk-group completion); elements outside the tensor are
 * not written. The generic-proxy writes of src need fa_fence_proxy_async by their writers
 * (and a barrier) first; src may be overwritten only after fa_bulk_wait_read. */
FA_DEV void fa_tma_store_4d(const fa_tmap *map, const void *src, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
          (uint64_t)(uintptr_t)map),
      "r"(fa_smem_addr(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
/* The thread's bulk stores issued since its last commit form one bulk async-group. */
FA_DEV void fa_bulk_commit(void) { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/* Until at most N of the thread's bulk groups are still reading their shared memory (the
 * source may then be reused; the CTA may exit). */
template <int N> FA_DEV void fa_bulk_wait_read(void) {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
FA_DEV void fa_tmap_prefetch(const fa_tmap *map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)(uintptr_t)map) : "memory");
}
/* Generic-proxy shared-memory writes made visible to later async-proxy (wgmma) reads. */
FA_DEV void fa_fence_proxy_async(void) {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
template <int N> FA_DEV void fa_setmaxnreg_dec(void) {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> FA_DEV void fa_setmaxnreg_inc(void) {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
/* x as lane 0 has it: lets the compiler treat a warp-uniform value (the warpgroup index)
 * as such, so branches on it are not divergent paths around wgmma. */
FA_DEV int fa_warp_uniform(int x) { return __shfl_sync(0xffffffffu, x, 0); }
FA_DEV void fa_wgmma_fence(void) { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
FA_DEV void fa_wgmma_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> FA_DEV void fa_wgmma_wait(void) {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Keeps the compiler from moving accesses of an accumulator across a wgmma fence / wait. */
FA_DEV void fa_reg_fence(float &x) { asm volatile("" : "+f"(x)::"memory"); }
/* The same for a packed A-fragment register: its last write stays before the wgmma.fence
 * (PTX ISA wgmma.fence: register writes of A fragments must precede it). */
FA_DEV void fa_reg_fence_u32(uint32_t &x) { asm volatile("" : "+r"(x)::"memory"); }

#define FA_WG_D8(i)                                                                        \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define FA_WG_D64                                                                           \
  FA_WG_D8(0), FA_WG_D8(8), FA_WG_D8(16), FA_WG_D8(24), FA_WG_D8(32), FA_WG_D8(40),         \
      FA_WG_D8(48), FA_WG_D8(56)
#define FA_WG_REGS64                                                                       \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "   \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "    \
  "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "    \
  "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

/* d[ND] (+)= A B, m64nNk16, f32 accumulators (the m64nNk16 D fragment, D_OUT its asm
 * outputs, D_REGS their operand list); A and B both from shared memory, each K-major (TA /
 * TB "0") or MN-major ("1"); scale_d == 0 overwrites d. OA, OB, OS: the operand numbers of
 * da, db and scale_d (ND, ND + 1, ND + 2). */
#define FA_WGMMA_SS_N(name, ty, N, ND, D_OUT, D_REGS, OA, OB, OS, ta, tb)                    \
  FA_DEV void name(float d[ND], uint64_t da, uint64_t db, int scale_d) {                      \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #OS ", 0;\n"                           \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." ty "." ty " " D_REGS       \
                 ", %" #OA ", %" #OB ", p, 1, 1, " ta ", " tb ";\n}\n"                        \
                 : D_OUT                                                                      \
                 : "l"(da), "l"(db), "r"(scale_d));                                           \
  }
/* m64n128k16, K-major: the forward's S = Q K^T over 128-key tiles. */
#define FA_WGMMA_SS(name, ty) \
  FA_WGMMA_SS_N(name, ty, 128, 64, FA_WG_D64, FA_WG_REGS64, 64, 65, 66, "0", "0")
/* d[64] += A B, m64n128k16: A from registers (the m16n8k16 A fragment of each warp's 16
 * rows, packed pairs), B from shared memory MN-major (transposed). */
#define FA_WGMMA_RS_T(name, ty)                                                               \
  FA_DEV void name(float d[64], const uint32_t a[4], uint64_t db) {                           \
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32." ty "." ty " " FA_WG_REGS64    \
                 ", {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"                                  \
                 : FA_WG_D64                                                                  \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));                      \
  }
#define FA_WG_D32 FA_WG_D8(0), FA_WG_D8(8), FA_WG_D8(16), FA_WG_D8(24)
#define FA_WG_REGS32                                                                       \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "   \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
/* d[32] (+)= A B, m64n64k16 (the backward; the forward at head dim 64), TA / TB as above. */
#define FA_WGMMA_SS64(name, ty, ta, tb) \
  FA_WGMMA_SS_N(name, ty, 64, 32, FA_WG_D32, FA_WG_REGS32, 32, 33, 34, ta, tb)
FA_WGMMA_SS(fa_wgmma_ss_bf16, "bf16")
FA_WGMMA_SS(fa_wgmma_ss_f16, "f16")
FA_WGMMA_RS_T(fa_wgmma_rs_t_bf16, "bf16")
FA_WGMMA_RS_T(fa_wgmma_rs_t_f16, "f16")
/* d[32] += A B, m64n64k16: A from registers (as FA_WGMMA_RS_T), B from shared memory
 * MN-major (transposed): P V and the backward's dV, dK at head dim 64. */
#define FA_WGMMA_RS64_T(name, ty)                                                             \
  FA_DEV void name(float d[32], const uint32_t a[4], uint64_t db) {                           \
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32." ty "." ty " " FA_WG_REGS32     \
                 ", {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"                                  \
                 : FA_WG_D32                                                                  \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));                      \
  }
FA_WGMMA_SS64(fa_wgmma_ss64_bf16, "bf16", "0", "0")
FA_WGMMA_SS64(fa_wgmma_ss64_f16, "f16", "0", "0")
FA_WGMMA_SS64(fa_wgmma_ss64_tt_bf16, "bf16", "1", "1")
FA_WGMMA_SS64(fa_wgmma_ss64_tt_f16, "f16", "1", "1")
FA_WGMMA_RS64_T(fa_wgmma_rs64_t_bf16, "bf16")
FA_WGMMA_RS64_T(fa_wgmma_rs64_t_f16, "f16")
/* d[64] += A B, m64n128k16: A from shared memory K-major, B MN-major (transposed): the
 * head-dim-256 backward's dV += P^T dO and dK += dS^T Q on half the columns, P^T and dS^T
 * exchanged through shared memory. */
#define FA_WGMMA_SS_T(name, ty)                                                               \
  FA_DEV void name(float d[64], uint64_t da, uint64_t db) {                                   \
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32." ty "." ty " " FA_WG_REGS64    \
                 ", %64, %65, 1, 1, 1, 0, 1;\n"                                               \
                 : FA_WG_D64                                                                  \
                 : "l"(da), "l"(db));                                                         \
  }
FA_WGMMA_SS_T(fa_wgmma_ss_t_bf16, "bf16")
FA_WGMMA_SS_T(fa_wgmma_ss_t_f16, "f16")
#define FA_WG_D96 FA_WG_D64, FA_WG_D8(64), FA_WG_D8(72), FA_WG_D8(80), FA_WG_D8(88)
#define FA_WG_REGS96                                                                       \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "   \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "    \
  "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "    \
  "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, "    \
  "%70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, "    \
  "%87, %88, %89, %90, %91, %92, %93, %94, %95}"
#define FA_WG_REGS88 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17,  " \
  "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33,  " \
  "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49,  " \
  "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65,  " \
  "%66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81,  " \
  "%82, %83, %84, %85, %86, %87}"
/* d[96] += A B, m64n192k16, A K-major and B MN-major (three 64-column blocks LBO apart)
 * from shared memory: the (192, 128) backward's dK += dS^T Q. */
#define FA_WGMMA_SS_T192(name, ty)                                                            \
  FA_DEV void name(float d[96], uint64_t da, uint64_t db) {                                   \
    asm volatile("wgmma.mma_async.sync.aligned.m64n192k16.f32." ty "." ty " " FA_WG_REGS96    \
                 ", %96, %97, 1, 1, 1, 0, 1;\n"                                               \
                 : FA_WG_D96                                                                  \
                 : "l"(da), "l"(db));                                                         \
  }
FA_WGMMA_SS_T192(fa_wgmma_ss_t192_bf16, "bf16")
FA_WGMMA_SS_T192(fa_wgmma_ss_t192_f16, "f16")
#undef FA_WGMMA_SS_T192
#define FA_WG_D88 FA_WG_D64, FA_WG_D8(64), FA_WG_D8(72), FA_WG_D8(80)
/* d[88] (+)= A B, m64n176k16, K-major: the forward's S = Q K^T over 176-key tiles (head dim
 * 128, not causal). */
#define FA_WGMMA_SS176(name, ty) \
  FA_WGMMA_SS_N(name, ty, 176, 88, FA_WG_D88, FA_WG_REGS88, 88, 89, 90, "0", "0")
FA_WGMMA_SS176(fa_wgmma_ss176_bf16, "bf16")
FA_WGMMA_SS176(fa_wgmma_ss176_f16, "f16")
#undef FA_WGMMA_SS176
#define FA_WG_D16 FA_WG_D8(0), FA_WG_D8(8)
#define FA_WG_REGS16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
/* d[16] (+)= A B, m64n32k16, K-major: the head-dim-256 backward's S^T and dP^T, each
 * consumer 32 of the 64 query rows. */
#define FA_WGMMA_SS32(name, ty) \
  FA_WGMMA_SS_N(name, ty, 32, 16, FA_WG_D16, FA_WG_REGS16, 16, 17, 18, "0", "0")
FA_WGMMA_SS32(fa_wgmma_ss32_bf16, "bf16")
FA_WGMMA_SS32(fa_wgmma_ss32_f16, "f16")
#undef FA_WGMMA_SS_T
#undef FA_WGMMA_SS32
#undef FA_WGMMA_SS
#undef FA_WGMMA_SS64
#undef FA_WGMMA_SS_N
#undef FA_WGMMA_RS_T
#undef FA_WGMMA_RS64_T
/* d[128] += A B, m64n256k16: A from registers (as FA_WGMMA_RS_T), B from shared memory
 * MN-major (transposed), its four 64-column blocks LBO apart: P V at Dv = 256. */
#define FA_WG_D128                                                                           \
  FA_WG_D64, FA_WG_D8(64), FA_WG_D8(72), FA_WG_D8(80), FA_WG_D8(88), FA_WG_D8(96),            \
      FA_WG_D8(104), FA_WG_D8(112), FA_WG_D8(120)
#define FA_WG_REGS128 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, " \
  "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, " \
  "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, " \
  "%70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, " \
  "%87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, " \
  "%103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, " \
  "%117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define FA_WGMMA_RS256_T(name, ty)                                                            \
  FA_DEV void name(float d[128], const uint32_t a[4], uint64_t db) {                          \
    asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32." ty "." ty " " FA_WG_REGS128   \
                 ", {%128, %129, %130, %131}, %132, 1, 1, 1, 1;\n"                             \
                 : FA_WG_D128                                                                 \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));                      \
  }
FA_WGMMA_RS256_T(fa_wgmma_rs256_t_bf16, "bf16")
FA_WGMMA_RS256_T(fa_wgmma_rs256_t_f16, "f16")
#undef FA_WGMMA_RS256_T
#endif /* FA_SM90_DEVICE */

#else /* ---- host emulation ------------------------------------------------------------ */
typedef emu_tmap fa_tmap;
#define FA_GRID_CONST

FA_DEV void fa_mbar_init(uint64_t *bar, int count) { emu_mbar_init(bar, count); }
FA_DEV void fa_mbar_init_fence(void) {}
FA_DEV void fa_mbar_arrive(uint64_t *bar) { emu_mbar_arrive(bar, 0); }
FA_DEV void fa_mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) { emu_mbar_arrive(bar, bytes); }
FA_DEV void fa_mbar_wait(uint64_t *bar, int parity) { emu_mbar_wait(bar, parity); }
FA_DEV void fa_tma_load_4d(void *dst, const fa_tmap *map, int c0, int c1, int c2, int c3,
                           uint64_t *bar) {
  const int c[4] = {c0, c1, c2, c3};
  emu_tma_load(dst, map, c, bar);
}
FA_DEV void fa_tma_store_4d(const fa_tmap *map, const void *src, int c0, int c1, int c2, int c3) {
  const int c[4] = {c0, c1, c2, c3};
  emu_tma_store(map, src, c);
}
FA_DEV void fa_bulk_commit(void) { emu_bulk_commit(); }
template <int N> FA_DEV void fa_bulk_wait_read(void) { emu_bulk_wait_read(N); }
FA_DEV void fa_tmap_prefetch(const fa_tmap *) {}
FA_DEV void fa_fence_proxy_async(void) { emu_fence_proxy_async(); }
template <int N> FA_DEV void fa_setmaxnreg_dec(void) { emu_setmaxnreg(N, 0); }
template <int N> FA_DEV void fa_setmaxnreg_inc(void) { emu_setmaxnreg(N, 1); }
FA_DEV int fa_warp_uniform(int x) { return x; }
FA_DEV void fa_wgmma_fence(void) { emu_wgmma_fence(); }
FA_DEV void fa_wgmma_commit(void) { emu_wgmma_commit(); }
template <int N> FA_DEV void fa_wgmma_wait(void) { emu_wgmma_wait(N); }
FA_DEV void fa_reg_fence(float &) {}
FA_DEV void fa_reg_fence_u32(uint32_t &) {}
FA_DEV void fa_wgmma_ss_bf16(float d[64], uint64_t da, uint64_t db, int scale_d) {
  emu_wgmma(d, 128, da, nullptr, db, scale_d, 0, 0, 1);
}
FA_DEV void fa_wgmma_ss_f16(float d[64], uint64_t da, uint64_t db, int scale_d) {
  emu_wgmma(d, 128, da, nullptr, db, scale_d, 0, 0, 0);
}
FA_DEV void fa_wgmma_rs_t_bf16(float d[64], const uint32_t a[4], uint64_t db) {
  emu_wgmma(d, 128, 0, a, db, 1, 0, 1, 1);
}
FA_DEV void fa_wgmma_rs_t_f16(float d[64], const uint32_t a[4], uint64_t db) {
  emu_wgmma(d, 128, 0, a, db, 1, 0, 1, 0);
}
/* m64n64k16: A, B K-major (ss64) or both MN-major (ss64_tt) */
FA_DEV void fa_wgmma_ss64_bf16(float d[32], uint64_t da, uint64_t db, int scale_d) {
  emu_wgmma(d, 64, da, nullptr, db, scale_d, 0, 0, 1);
}
FA_DEV void fa_wgmma_ss64_f16(float d[32], uint64_t da, uint64_t db, int scale_d) {
  emu_wgmma(d, 64, da, nullptr, db, scale_d, 0, 0, 0);
}
FA_DEV void fa_wgmma_ss64_tt_bf16(float d[32], uint64_t da, uint64_t db, int scale_d) {
  emu_wgmma(d, 64, da, nullptr, db, scale_d, 1, 1, 1);
}
FA_DEV void fa_wgmma_ss64_tt_f16(float d[32], uint64_t da, uint64_t db, int scale_d) {
  emu_wgmma(d, 64, da, nullptr, db, scale_d, 1, 1, 0);
}
/* m64n64k16: A from registers, B MN-major */
FA_DEV void fa_wgmma_rs64_t_bf16(float d[32], const uint32_t a[4], uint64_t db) {
  emu_wgmma(d, 64, 0, a, db, 1, 0, 1, 1);
}
FA_DEV void fa_wgmma_rs64_t_f16(float d[32], const uint32_t a[4], uint64_t db) {
  emu_wgmma(d, 64, 0, a, db, 1, 0, 1, 0);
}
/* m64n128k16: A K-major from shared memory, B MN-major (the d = 256 backward's dV, dK) */
FA_DEV void fa_wgmma_ss_t_bf16(float d[64], uint64_t da, uint64_t db) {
  emu_wgmma(d, 128, da, nullptr, db, 1, 0, 1, 1);
}
FA_DEV void fa_wgmma_ss_t_f16(float d[64], uint64_t da, uint64_t db) {
  emu_wgmma(d, 128, da, nullptr, db, 1, 0, 1, 0);
}
/* m64n192k16: A K-major, B MN-major (the (192, 128) backward's dK) */
FA_DEV void fa_wgmma_ss_t192_bf16(float d[96], uint64_t da, uint64_t db) {
  emu_wgmma(d, 192, da, nullptr, db, 1, 0, 1, 1);
}
FA_DEV void fa_wgmma_ss_t192_f16(float d[96], uint64_t da, uint64_t db) {
  emu_wgmma(d, 192, da, nullptr, db, 1, 0, 1, 0);
}
/* m64n176k16: A, B K-major (the forward's S over 176-key tiles) */
FA_DEV void fa_wgmma_ss176_bf16(float d[88], uint64_t da, uint64_t db, int scale_d) {
  emu_wgmma(d, 176, da, nullptr, db, scale_d, 0, 0, 1);
}
FA_DEV void fa_wgmma_ss176_f16(float d[88], uint64_t da, uint64_t db, int scale_d) {
  emu_wgmma(d, 176, da, nullptr, db, scale_d, 0, 0, 0);
}
/* m64n32k16: A, B K-major (the d = 256 backward's S^T, dP^T) */
FA_DEV void fa_wgmma_ss32_bf16(float d[16], uint64_t da, uint64_t db, int scale_d) {
  emu_wgmma(d, 32, da, nullptr, db, scale_d, 0, 0, 1);
}
FA_DEV void fa_wgmma_ss32_f16(float d[16], uint64_t da, uint64_t db, int scale_d) {
  emu_wgmma(d, 32, da, nullptr, db, scale_d, 0, 0, 0);
}
/* m64n256k16: A from registers, B MN-major (P V at Dv = 256) */
FA_DEV void fa_wgmma_rs256_t_bf16(float d[128], const uint32_t a[4], uint64_t db) {
  emu_wgmma(d, 256, 0, a, db, 1, 0, 1, 1);
}
FA_DEV void fa_wgmma_rs256_t_f16(float d[128], const uint32_t a[4], uint64_t db) {
  emu_wgmma(d, 256, 0, a, db, 1, 0, 1, 0);
}
#endif


/* ---- TMA reduce-add (the backward's dQ, bwd_sm90_body.cuh) ------------------------------
 * fa_tma_reduce_add_4d: a 4-d float32 TMA box from shared memory (src, laid out as
 * fa_tma_load_4d would land it) added element-wise into global memory
 * (cp.reduce.async.bulk.tensor .add, bulk-group completion); elements outside the tensor
 * are not touched. The rules of fa_tma_store_4d: the writers of src fence
 * (fa_fence_proxy_async) and meet at a barrier before the issue, and src may be
 * rewritten only after the issuing thread's fa_bulk_wait_read. The adds of different
 * CTAs to one element are atomic with respect to each other (in no set order). */
#ifndef ATTN_CUDA_EMULATE
#if FA_SM90_DEVICE
FA_DEV void fa_tma_reduce_add_4d(const fa_tmap *map, const void *src, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4, %5}], "
      "[%1];\n" ::"l"((uint64_t)(uintptr_t)map),
      "r"(fa_smem_addr(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
#endif
#else
FA_DEV void fa_tma_reduce_add_4d(const fa_tmap *map, const void *src, int c0, int c1, int c2, int c3) {
  const int c[4] = {c0, c1, c2, c3};
  emu_tma_reduce_add(map, src, c);
}
#endif

#endif
