/* fwd_body.cuh — the flash forward kernel (mma.sync m16n8k16, float32 online softmax in
 * registers, cp.async double-buffered K/V tiles) and its launcher, instantiated once per
 * (head dims, dtype, causal) by the fwd_*.cu files.
 *
 * A CTA owns FA_FWD_BM query rows of one (batch, head) — one sequence's rows under varlen —
 * and walks the key tiles of their visible range; tiles the block mask excludes are never
 * loaded. Each warp owns 16 rows and, per tile, is either idle (nothing visible), full
 * (every pair visible: no masking arithmetic) or partial (per-element mask by select).
 * Keys that no row of the CTA sees are zero-filled as they are loaded, so NaN/Inf sitting
 * in masked K/V cannot reach the tensor-core products. One shot: O and LSE are written,
 * with the sink in the denominator; block mode: the (m, l, acc) state is read and written
 * back (sinks are left to finalize).
 *
 * Two decode forms (dispatch.c's plan; both off is the plain kernel): packed GQA (p.pack
 * query heads of one KV head share the CTA's rows: row r is position R0 + r / pack of head
 * h0 + r % pack, so one K/V tile serves them all, and a decode step's 1-8 query rows per
 * head fill a tile together), and split-KV (p.nsplit CTAs per query tile, each walking its
 * share of the key tiles into a partial state that attn_cuda__split_combine folds into O /
 * LSE or the carried state: enough CTAs for the GPU when query tiles are few). A KV cache
 * (p.kv_used, p.pages) bounds each batch's keys by its used length (fa_fwd_seg) and loads
 * K/V rows through the block table (FA_LOAD_KV_TILE's paged form). */
#include "common.cuh"

/* shared memory of a CTA of bm query rows and bn-key tiles, st K/V buffers (2 but in the
 * 4-stage kernel, which adds st tile descriptors) */
#define F_SMEM_BYTES_ST(bm, bn, st) (((bm) * SQK + (st) * (bn) * SQK + (st) * (bn) * SV) * 2 + (bm) * 4)
#define F_SMEM_BYTES(bm, bn) F_SMEM_BYTES_ST(bm, bn, 2)

/* Each kernel: F_WARPS warps of F_MS 16-row m-tiles, F_BN keys a tile, Q in registers or not (F_Q_IN_REGS), the
 * decode forms or not (F_DECODE), full key tiles by FA_LOAD_ROWS_ALL or not (F_LOAD_ALL),
 * the ablation switches or not (F_ABLATE: 0 compiles them away), the rows' bounds in a
 * shared-memory table or in registers (F_ROW_TABLE; the table adds F_BM * 16 bytes). */
/* The 8-warp kernel (128 rows: the default, and every decode form). */
#define F_WARPS FA_FWD_WARPS
#define F_MS 1
#define F_BN FA_FWD_BN(DQK, DV)
#define F_Q_IN_REGS FA_FWD_Q_IN_REGS(DQK)
#define F_DECODE 1
#define F_LOAD_ALL 1
#define F_ABLATE 0
#define F_ROW_TABLE 0
#define F_STAGES 2
#define F_NAME FA_FN(flash_fwd_)
#define F_KERNEL_DECL FA_KERNEL(32 * FA_FWD_WARPS)
#include "fwd_kernel.cuh"
/* The 8-warp kernel with a ring of FA_FWD_4S_STAGES K/V buffers (3 tiles in flight, not 1),
 * ATTN_CUDA_FWD_STAGES=4, decode forms and all: does a CTA's one tile in flight leave its
 * loads' latency exposed (the 2026-12-04 decode tiles took as long as the dense ones)? */
#define F_WARPS FA_FWD_WARPS
#define F_MS 1
#define F_BN FA_FWD_BN(DQK, DV)
#define F_Q_IN_REGS FA_FWD_Q_IN_REGS(DQK)
#define F_DECODE 1
#define F_LOAD_ALL 1
#define F_ABLATE 0
#define F_ROW_TABLE 0
#define F_STAGES FA_FWD_4S_STAGES
#define F_NAME FA_FN(flash_fwd4s_)
#define F_KERNEL_DECL FA_KERNEL(32 * FA_FWD_WARPS)
#include "fwd_kernel.cuh"
/* The key-split decode kernel (traits.h FA_FWD_KS_*), ATTN_CUDA_FWD_KSPLIT=1: 16 rows, the
 * warps splitting each key tile, a 3-buffer K/V ring, two CTAs an SM; every decode form. */
#define F_WARPS FA_FWD_KS_WARPS(DQK, DV)
#define F_MS 1
#define F_BN FA_FWD_BN(DQK, DV)
#define F_Q_IN_REGS FA_FWD_Q_IN_REGS(DQK)
#define F_DECODE 1
#define F_LOAD_ALL 1
#define F_ABLATE 0
#define F_ROW_TABLE 0
#define F_STAGES FA_FWD_KS_STAGES
#define F_KSPLIT 1
#define F_NAME FA_FN(flash_fwdks_)
#define F_KERNEL_DECL FA_KERNEL_MIN(32 * FA_FWD_KS_WARPS(DQK, DV), 2)
#include "fwd_kernel.cuh"
#if FA_FWD_W4(DQK, DV)
/* The 4-warp kernel (64 rows, two CTAs an SM: one CTA's softmax overlaps the other's
 * mma), ATTN_CUDA_FWD_WARPS=4, without the decode forms (pack, split). */
#define F_WARPS 4
#define F_MS 1
#define F_BN FA_FWD_BN(DQK, DV)
#define F_Q_IN_REGS FA_FWD_Q_IN_REGS(DQK)
#define F_DECODE 0
#define F_LOAD_ALL 1
#define F_ABLATE 0
#define F_ROW_TABLE 0
#define F_STAGES 2
#define F_NAME FA_FN(flash_fwd4_)
#define F_KERNEL_DECL FA_KERNEL_MIN(128, 2)
#include "fwd_kernel.cuh"
#endif
#if FA_FWD_2CTA(DQK, DV)
/* The two-CTA 8-warp kernel (128 rows, at most 128 registers: two CTAs an SM),
 * ATTN_CUDA_FWD_CTAS=2, launched without the decode forms (pack, split); they stay
 * compiled in (F_DECODE 1) because without them ptxas spilled 44-56 B at 128 registers. */
#define F_WARPS FA_FWD_WARPS
#define F_MS 1
#define F_BN FA_FWD_2CTA_BN(DQK, DV)
#define F_Q_IN_REGS 0
#define F_DECODE 1
#define F_LOAD_ALL 0 /* its 8 addresses in flight spilled 8-68 B at 128 registers */
#define F_ABLATE 0
#define F_ROW_TABLE 0
#define F_STAGES 2
#define F_NAME FA_FN(flash_fwd2c_)
#define F_KERNEL_DECL FA_KERNEL_MIN(32 * FA_FWD_WARPS, FA_FWD_2CTA_MINB)
#include "fwd_kernel.cuh"
#endif
#if FA_FWD_4X32(DQK, DV)
/* The FlashAttention-2 shape (128 rows: 4 warps of two 16-row m-tiles, each K/V fragment
 * loaded once for both; two CTAs an SM), ATTN_CUDA_FWD_WARP_ROWS=32, without the decode
 * forms; Q's fragments from shared memory (two m-tiles' would not fit beside O). */
#define F_WARPS 4
#define F_MS 2
#define F_BN FA_FWD_4X32_BN(DQK, DV)
#define F_Q_IN_REGS 0
#define F_DECODE 0
#define F_LOAD_ALL 1
#define F_ABLATE 0
#define F_ROW_TABLE 1 /* in registers ptxas spilled 124 B (sm_90a, d = 128) */
#define F_STAGES 2
#define F_NAME FA_FN(flash_fwd4x32_)
#define F_KERNEL_DECL FA_KERNEL_MIN(128, 2)
#include "fwd_kernel.cuh"
#endif
/* The ablation kernel (ATTN_MMA_ABLATE; instance.h FA_FWD_FORM_AB): the 8-warp kernel with
 * the switches of p.ablate, at bf16 (128, 128) not causal only (one instance to build). */
#define F_AB_HERE (FA_BF16 && !FA_CAUSAL && DQK == 128 && DV == 128)
#if F_AB_HERE
#define F_WARPS FA_FWD_WARPS
#define F_MS 1
#define F_BN FA_FWD_BN(DQK, DV)
#define F_Q_IN_REGS FA_FWD_Q_IN_REGS(DQK)
#define F_DECODE 1
#define F_LOAD_ALL 1
#define F_ABLATE 1
#define F_ROW_TABLE 0
#define F_STAGES 2
#define F_NAME FA_FN(flash_fwd_ab_)
#define F_KERNEL_DECL FA_KERNEL(32 * FA_FWD_WARPS)
#include "fwd_kernel.cuh"
#endif


extern "C" int FA_FN(attn_cuda__fwd_)(const fa_call *c) {
  const attn_cuda_problem *pb = c->pb;
  fa_params p = fa_fwd_params(c);
  int64_t grid_x = 0;
  int e = 0;
#if FA_FWD_W4(DQK, DV)
  if (c->fwd_form == FA_FWD_FORM_4W && p.pack == 1 && p.nsplit == 1) {
    e = fa_query_grid(&p, c, FA_FWD_W4_BM, &grid_x);
    if (e) return e;
    *c->form_ran = FA_FWD_FORM_4W;
    FA_LAUNCH_SMEM(e, FA_FN(flash_fwd4_), dim3((unsigned)grid_x, (unsigned)pb->Hq, (unsigned)pb->B),
                   dim3(128), F_SMEM_BYTES(FA_FWD_W4_BM, FA_FWD_BN(DQK, DV)), c->stream, p);
    return e;
  }
#endif
#if FA_FWD_2CTA(DQK, DV)
  if (c->fwd_form == FA_FWD_FORM_2CTA && p.pack == 1 && p.nsplit == 1) {
    e = fa_query_grid(&p, c, FA_FWD_BM, &grid_x);
    if (e) return e;
    *c->form_ran = FA_FWD_FORM_2CTA;
    FA_LAUNCH_SMEM(e, FA_FN(flash_fwd2c_), dim3((unsigned)grid_x, (unsigned)pb->Hq, (unsigned)pb->B),
                   dim3(32 * FA_FWD_WARPS), F_SMEM_BYTES(FA_FWD_BM, FA_FWD_2CTA_BN(DQK, DV)),
                   c->stream, p);
    return e;
  }
#endif
#if FA_FWD_4X32(DQK, DV)
  if (c->fwd_form == FA_FWD_FORM_4X32 && p.pack == 1 && p.nsplit == 1) {
    e = fa_query_grid(&p, c, FA_FWD_BM, &grid_x);
    if (e) return e;
    *c->form_ran = FA_FWD_FORM_4X32;
    FA_LAUNCH_SMEM(e, FA_FN(flash_fwd4x32_), dim3((unsigned)grid_x, (unsigned)pb->Hq, (unsigned)pb->B),
                   dim3(128), F_SMEM_BYTES(FA_FWD_BM, FA_FWD_4X32_BN(DQK, DV)) + FA_FWD_BM * sizeof(fa_qrow),
                   c->stream, p);
    return e;
  }
#endif
#if F_AB_HERE
  if (c->fwd_form == FA_FWD_FORM_AB && p.pack == 1 && p.nsplit == 1 && !p.block_mode && !p.pages) {
    e = fa_query_grid(&p, c, FA_FWD_BM, &grid_x);
    if (e) return e;
    p.ablate = c->ablate; /* dispatch.c said so in the log */
    *c->form_ran = FA_FWD_FORM_AB;
    FA_LAUNCH_SMEM(e, FA_FN(flash_fwd_ab_), dim3((unsigned)grid_x, (unsigned)pb->Hq, (unsigned)pb->B),
                   dim3(32 * FA_FWD_WARPS), F_SMEM_BYTES(FA_FWD_BM, FA_FWD_BN(DQK, DV)), c->stream, p);
    return e;
  }
#endif
  /* the key-split kernel (dispatch.c asks for it only where a KV head's rows fit its
   * m-tile: all positions one tile) */
  const int ks = c->fwd_form == FA_FWD_FORM_KS;
  e = fa_query_grid(&p, c, (ks ? FA_FWD_KS_ROWS : FA_FWD_BM) / p.pack, &grid_x);
  if (e) return e;
  const dim3 grid((unsigned)(grid_x * p.nsplit), (unsigned)(pb->Hq / p.pack), (unsigned)pb->B);
  if (ks) {
    *c->form_ran = FA_FWD_FORM_KS;
    FA_LAUNCH_SMEM(e, FA_FN(flash_fwdks_), grid, dim3(32 * FA_FWD_KS_WARPS(DQK, DV)),
                   F_SMEM_BYTES_ST(FA_FWD_KS_ROWS, FA_FWD_BN(DQK, DV), FA_FWD_KS_STAGES) +
                       FA_FWD_KS_STAGES * sizeof(fa_ktile),
                   c->stream, p);
  } else if (c->fwd_form == FA_FWD_FORM_4S) {
    *c->form_ran = FA_FWD_FORM_4S;
    FA_LAUNCH_SMEM(e, FA_FN(flash_fwd4s_), grid, dim3(32 * FA_FWD_WARPS),
                   F_SMEM_BYTES_ST(FA_FWD_BM, FA_FWD_BN(DQK, DV), FA_FWD_4S_STAGES) +
                       FA_FWD_4S_STAGES * sizeof(fa_ktile),
                   c->stream, p);
  } else {
    *c->form_ran = FA_FWD_FORM_8W;
    FA_LAUNCH_SMEM(e, FA_FN(flash_fwd_), grid, dim3(32 * FA_FWD_WARPS),
                   F_SMEM_BYTES(FA_FWD_BM, FA_FWD_BN(DQK, DV)), c->stream, p);
  }
  if (!e && p.nsplit > 1) e = attn_cuda__split_combine(c);
  return e;
}
#undef F_AB_HERE
