/* cuda_attn.h — the CUDA backend's C interface: the problem it takes (device pointers,
 * strided views in bf16/f16), the flash forward / backward launchers with the same
 * state-carrying block API as the CPU backend, and the workspace query.
 *
 * Plain C, no CUDA types: streams are passed as void * (a cudaStream_t; NULL is the
 * default stream). No call allocates memory or synchronises the host: every launcher only
 * enqueues work on the stream; scratch memory is the caller's workspace, sized by
 * attn_cuda_workspace_bytes(). Failures return a status and set attn_last_error() with a
 * message naming the value and what is supported. Semantics: DESIGN.md §2 (the same as
 * kernels/cpu): scores s = scale*q.k, softcap, ALiBi, then the mask; causal bottom-right;
 * sinks once, at finalize; empty rows give O = 0 and LSE = -inf (or the sink).
 *
 * Supported by the kernels: dtype bf16 and f16 with the (Dqk, Dv) pairs built from
 * ATTN_CUDA_HEAD_DIMS (default 64, 128, 256 and 192x128), tensor cores; dtype f32 with any
 * head dims that are multiples of 8 up to 256, on a slower SIMT path (FFMA, float32
 * accuracy); compute capability 8.0+. bf16/f16 views need 16-byte aligned data and
 * strides that are multiples of 8 elements; float32 views (f32 q/k/v/o/dout, dq, dk, dv,
 * the state) need 8-byte alignment and even strides.
 *
 * Not part of the installed API (attnrun.h), but exported by libattnrun.so (default
 * visibility below, while the rest of the kernel library stays hidden): the GPU tests and
 * the GPU benchmark call these through libattnrun, so the one copy of the kernels' fatbin
 * there serves every program of a build. */
#ifndef ATTN_CUDA_ATTN_H
#define ATTN_CUDA_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include "attnrun.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default)

/* A strided device view of a [B, S, H, D] tensor: element (b,s,h,d) at
 * p[b*sb + s*ss + h*sh + d], in elements of the view's type. */
typedef struct {
  void *p;
  int64_t sb, ss, sh;
} attn_cuda_view;

/* Everything a kernel needs, resolved (like attn__problem): sizes are local to the call,
 * positions global. All pointers are device pointers. */
typedef struct {
  int64_t B, Hq, Hkv, Dqk, Dv;
  int64_t sq, skv;        /* local query / key rows of this call */
  int64_t q_row0;         /* state / lse row of local query row 0 */
  int64_t q_pos0, k_pos0; /* global positions of local row 0 / key 0 */
  int64_t seq_q, seq_kv;  /* global lengths: off = seq_kv - seq_q (not varlen) */
  float scale;            /* resolved, > 0 */
  float softcap;          /* 0: off */
  int32_t causal;
  int64_t window_left, window_right; /* -1: unbounded */
  const float *sinks;                /* [Hq] or NULL */
  const float *alibi;                /* [Hq] slopes or NULL */
  /* varlen: [num_seqs + 1] prefix sums over global packed positions (B == 1) */
  const int32_t *cu_seqlens_q, *cu_seqlens_kv;
  int32_t num_seqs; /* 0: not varlen */
  /* block mask: [num_q_blocks, num_k_blocks] bytes, 1 = visible; NULL: none */
  const uint8_t *block_mask;
  int32_t block_q, block_k;
  int64_t num_q_blocks, num_k_blocks;
  int32_t dtype; /* attn_dtype: ATTN_BF16, ATTN_F16 or ATTN_F32 */
  attn_cuda_view q, k, v; /* q [B,sq,Hq,Dqk], k [B,skv,Hkv,Dqk], v [B,skv,Hkv,Dv] */
  /* A KV cache (the forward only; not with varlen), as attn_kv_cache: kv_used [B] int32,
   * the global keys batch b attends to (its off = kv_used[b] - seq_q; NULL: seq_kv);
   * block_table [B, pages_per_seq] int32 (NULL: K/V not paged): local key j of batch b is
   * row j % page_size of page block_table[b * pages_per_seq + j / page_size] of k and v,
   * whose sb is then the page stride, and skv == pages_per_seq * page_size. Both are
   * device arrays the host never reads: a used length outside 0..seq_kv is clamped, and
   * a table entry outside 0..num_pages - 1 reads as a zero K/V row. */
  const int32_t *kv_used, *block_table;
  int64_t pages_per_seq, page_size, num_pages;
} attn_cuda_problem;

/* Checks that the kernels support p (dtype, head dims, alignment, grid limits) without
 * launching anything. ATTN_OK or UNSUPPORTED / INVALID_ARG with a message. */
attn_status attn_cuda_check(const attn_cuda_problem *p);

/* Workspace the launchers below use for p (0 when none: then workspace may be NULL).
 * Varlen needs it (tile tables); otherwise, for bf16/f16, it holds the Hopper backward's
 * deterministic-dQ semaphores, and a smaller one (or NULL) only sends a deterministic
 * backward to the mma.sync kernels. After those, the split-KV forward's partial states
 * (attn_cuda_fwd_plan), without which a forward runs unsplit. One workspace serves any
 * sequence of calls on one stream (each backward rezeroes the semaphores on the stream). */
size_t attn_cuda_workspace_bytes(const attn_cuda_problem *p);

/* One-shot forward: o [B,sq,Hq,Dv] (p->dtype), lse [B,Hq,lse_rows] float32 at row
 * q_row0 + i (may be NULL). Sinks from p->sinks. */
attn_status attn_cuda_fwd(const attn_cuda_problem *p, attn_cuda_view o, float *lse,
                          int64_t lse_rows, void *workspace, size_t workspace_bytes,
                          void *stream);

/* Folds one K/V block into the float32 state of q's rows (st->m/l/acc device memory,
 * layouts as attn_state; rows q_row0 .. q_row0 + sq - 1). */
attn_status attn_cuda_fwd_block(const attn_cuda_problem *p, attn_state *st, void *workspace,
                                size_t workspace_bytes, void *stream);

/* m = -inf, l = 0, acc = 0. */
attn_status attn_cuda_state_init(attn_state *st, void *stream);
/* dst := merge(dst, src): states of the same rows over disjoint key sets. */
attn_status attn_cuda_state_merge(attn_state *dst, const attn_state *src, void *stream);
/* o [B, st->rows, Hq, Dv] (p->dtype) and lse [B, Hq, st->rows] (may be NULL) from the
 * state; sinks (p->sinks) enter here, once. Uses p's B, Hq, Dv, sinks and dtype. */
attn_status attn_cuda_finalize(const attn_cuda_problem *p, const attn_state *st,
                               attn_cuda_view o, float *lse, void *stream);

/* delta [B,Hq,sq] = rowsum(dO * O) (float32); dsinks [Hq] += -sum_i e^(sink-lse_i)*delta_i
 * (may be NULL; summed in a fixed order). o, dout [B,sq,Hq,Dv] in p->dtype; lse [B,Hq,sq].
 * Uses p's B, Hq, Dv, sq, sinks and dtype. */
attn_status attn_cuda_bwd_prepare(const attn_cuda_problem *p, attn_cuda_view o,
                                  attn_cuda_view dout, const float *lse, float *delta,
                                  float *dsinks, void *stream);

/* Accumulates (+=) this K/V block's gradient into float32 dq [B,sq,Hq,Dqk],
 * dk [B,skv,Hkv,Dqk], dv [B,skv,Hkv,Dv] (float32 accumulators whatever p->dtype).
 * dout [B,sq,Hq,Dv] in p->dtype; lse, delta [B,Hq,lse_rows] at row q_row0 + i.
 * deterministic = 0: dQ through float32 atomics (fast, bitwise results may vary run to
 * run); 1: dQ from a second kernel that owns its rows (bitwise repeatable, ~1.4x the
 * arithmetic). dK and dV are always deterministic. */
attn_status attn_cuda_bwd_block(const attn_cuda_problem *p, attn_cuda_view dout,
                                const float *lse, const float *delta, int64_t lse_rows,
                                attn_cuda_view dq, attn_cuda_view dk, attn_cuda_view dv,
                                int deterministic, void *workspace, size_t workspace_bytes,
                                void *stream);

/* The Hopper forward and backward (sm_90a: TMA, wgmma, warp specialisation): mode 1 allows
 * them, 0 keeps every forward and backward on the mma.sync kernels, -1 (the start) follows ATTN_CUDA_HOPPER (default
 * 1 on hardware, 0 on the emulator). For tests and benchmarks that compare the two in one process. */
void attn_cuda_set_hopper(int mode);
/* The kernel family attn_cuda_fwd or attn_cuda_fwd_block would pick for p now: "sm90",
 * "mma", "f32" or "none".
 * ("sm90" can still fall back to "mma" at launch, logged at INFO, when the build has no
 * sm_90a image for the device or TMA cannot describe a view.) */
const char *attn_cuda_fwd_path(const attn_cuda_problem *p);
/* The family the last bf16/f16 attn_cuda_fwd or attn_cuda_fwd_block call of the process
 * ran: "sm90" or "mma". */
const char *attn_cuda_last_fwd_path(void);
/* Which mma.sync forward kernel (instance.h FA_FWD_FORM_*) that call ran: "8w" (the
 * default), "4w" (ATTN_CUDA_FWD_WARPS=4), "2cta" (ATTN_CUDA_FWD_CTAS=2), "4x32"
 * (ATTN_CUDA_FWD_WARP_ROWS=32), "4s" (ATTN_CUDA_FWD_STAGES=4), "ks" (the key-split decode
 * kernel, ATTN_CUDA_FWD_KSPLIT=1, at most 16 rows a KV head), "ab" (the ablation kernel,
 * ATTN_MMA_ABLATE), or "none" when the sm90 kernel ran it. The forms
 * apply only where they are built (see instance.h), so tests and benchmarks read this rather
 * than the variable they set. */
const char *attn_cuda_last_fwd_form(void);
/* Which mma.sync dK/dV kernel the last bf16/f16 attn_cuda_bwd or attn_cuda_bwd_block call
 * ran: "2s" (two step buffers, the default), "4s" (four, ATTN_CUDA_BWD_STAGES=4), or "none"
 * when the sm90 kernel ran it. */
const char *attn_cuda_last_bwd_form(void);

/* The mma.sync forward's decode forms (dispatch.c): packed GQA (pack query heads of one KV
 * head share a CTA's rows) and split-KV (nsplit CTAs share a query tile's keys; their
 * partial states, in the workspace, are folded by a second kernel). pack: 0 off, 1 where it
 * saves CTAs (the default), 2 wherever Hq > Hkv; splits: 0 the heuristic (the default), n
 * exactly n (clamped to the key tiles; 1 off); -1 (the start) follows ATTN_CUDA_PACK_GQA /
 * ATTN_CUDA_SPLITS. For tests and benchmarks. */
void attn_cuda_set_decode(int pack, int splits);
/* What a forward of p would run with now, given the workspace attn_cuda_workspace_bytes
 * asks (1, 1 for float32 and for the Hopper forward), and what the last bf16/f16 forward
 * of the process ran with. */
void attn_cuda_fwd_plan(const attn_cuda_problem *p, int *pack, int *nsplit);
void attn_cuda_last_fwd_plan(int *pack, int *nsplit);
/* The same for attn_cuda_bwd_block (given the workspace attn_cuda_workspace_bytes asks:
 * without it a deterministic dQ runs mma.sync), and the family its last bf16/f16 call
 * ran: "sm90" or "mma". */
const char *attn_cuda_bwd_path(const attn_cuda_problem *p, int deterministic);
const char *attn_cuda_last_bwd_path(void);

/* tiles.c: the tiles of p that the kernels compute and skip and the FLOPs of the computed
 * ones (definitions in tiles.c: those of the CPU backend, at the CUDA tile shapes), counted
 * on the host from the geometry alone: causal, window, varlen, block mask. backward: the
 * dK/dV kernel's tiles, else the forward's; sm90: the call ran the Hopper kernel.
 * Reads p->cu_seqlens_*, p->block_mask and p->kv_used, which must be HOST copies here. */
void attn_cuda_count_tiles(const attn_cuda_problem *p, int backward, int sm90, attn_stats *out);
/* The tile shape those counts use: query rows x keys of one tile (the mma.sync forward's:
 * of the kernel attn_cuda_last_fwd_form names). */
void attn_cuda_tile_shape(const attn_cuda_problem *p, int backward, int sm90, int *rows,
                          int *keys);

/* "64, 128, 256, 192x128" — the bf16/f16 head dims (D or DqkxDv) this build instantiated
 * (the float32 kernels take any supported head dims). */
const char *attn_cuda_head_dims(void);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif
