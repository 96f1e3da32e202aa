/* instance.h — what the C dispatcher hands to one kernel instance (head dims x dtype x
 * causal, one .cu each; the float32 instance takes every head dim and both causal modes)
 * and the helpers in state.cu that instances share. Plain C. */
#ifndef ATTN_CUDA_INSTANCE_H
#define ATTN_CUDA_INSTANCE_H

#include "cuda_attn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One launcher call. Forward: o/lse (one shot) or st (block mode). Backward: the rest. */
typedef struct {
  const attn_cuda_problem *pb;
  attn_cuda_view o;
  float *lse;
  int64_t lse_rows;
  const attn_state *st; /* non-NULL: fold into the state instead of writing o/lse */
  attn_cuda_view dout;
  const float *lse_in, *delta;
  attn_cuda_view dq, dk, dv; /* float32 */
  int deterministic;
  int32_t *tiles_q; /* varlen tile tables in the workspace (NULL when not varlen) */
  int32_t *dq_sems; /* the sm90 deterministic dQ's semaphores in the workspace (or NULL) */
  size_t dq_sem_bytes;
  int32_t *tiles_k;
  /* the forward's decode forms (0 or 1: off): query heads packed per CTA (GQA), CTAs per
   * query tile splitting its keys, and their partial states in the workspace */
  int pack, nsplit;
  int fwd_form; /* which mma.sync forward kernel, where it applies (FA_FWD_FORM_*) */
  int ablate;   /* FA_FWD_FORM_AB's FA_AB_* bits (ATTN_MMA_ABLATE) */
  int *form_ran; /* where the mma.sync forward's launcher writes the FA_FWD_FORM_* it ran */
  int bwd_stages;      /* the mma.sync dK/dV kernel's step buffers: 2, or FA_BWD_4S_STAGES */
  int *bwd_stages_ran; /* where its launcher writes the number it ran */
  float *part;
  void *stream;
} fa_call;

/* The mma.sync forward's kernels (fa_call.fwd_form; traits.h): 8 warps, one CTA an SM (the
 * default, and every decode form); 4 warps, two CTAs an SM (ATTN_CUDA_FWD_WARPS=4); 8 warps,
 * two CTAs an SM (ATTN_CUDA_FWD_CTAS=2); 4 warps of 32 rows, two CTAs an SM
 * (ATTN_CUDA_FWD_WARP_ROWS=32) — these three: head dims up to 128, no pack, no split; and
 * the 8-warp kernel with a 4-buffer K/V ring (ATTN_CUDA_FWD_STAGES=4), every form; the
 * key-split decode kernel (ATTN_CUDA_FWD_KSPLIT=1, traits.h FA_FWD_KS_*), where a KV head's
 * rows fit one m-tile, every form but varlen.
 * And a timing experiment (ATTN_MMA_ABLATE=m, set at all: FA_FWD_FORM_AB): the 8-warp kernel
 * built once more with run-time switches that leave stages of its key-tile loop out, bits
 * FA_AB_* of m (0: nothing left out, the switches' own cost), for bf16 (128, 128) not
 * causal, one shot, no decode form, not paged; its results are wrong for m != 0. */
enum {
  FA_FWD_FORM_8W = 0,
  FA_FWD_FORM_4W = 1,
  FA_FWD_FORM_2CTA = 2,
  FA_FWD_FORM_AB = 3,
  FA_FWD_FORM_4X32 = 4,
  FA_FWD_FORM_4S = 5,
  FA_FWD_FORM_KS = 6
};
enum {
  FA_AB_LOAD = 1,     /* K/V tiles after the first two are not loaded (the buffers are reused) */
  FA_AB_BAR = 2,      /* nor waited for: no barrier after the second tile (implies LOAD) */
  FA_AB_QK = 4,       /* no S = Q K^T: S = 0 */
  FA_AB_SOFTMAX = 8,  /* no max / exp2 / rescale: P = S as it is */
  FA_AB_PV = 16,      /* no O += P V */
  FA_AB_ALL = 31
};

/* The split-KV forward's partial states (in the workspace; float32): m [nsplit][R],
 * l [nsplit][R], acc [nsplit][R][Dv], R = B * Hq * sq rows, row (b * Hq + h) * sq + i. */
#define FA_PART_ROWS(pb) ((pb)->B * (pb)->Hq * (pb)->sq)
#define FA_PART_FLOATS(pb, nsplit) ((int64_t)(nsplit) * FA_PART_ROWS(pb) * (2 + (pb)->Dv))
/* The widest Dv the split-KV combine folds (state.cu): wider problems run unsplit. */
#define FA_COMBINE_DMAX 256

/* Each returns 0 or a cudaError_t value (the dispatcher turns it into a message), or
 * FA_ERR_FALLBACK: this instance cannot take the problem here (nothing was launched); the
 * dispatcher runs the general instance instead. */
#define FA_ERR_FALLBACK (-1)

/* The sm90 backward's deterministic-dQ workspace (dispatch.c sizes it, the kernel indexes
 * it): int32 semaphores [B][Hq][FA_DQ_TILES(sq)][2] (64-row dQ tiles x consumer parts),
 * then FA_DQ_SEM_EXTRA words: the CTA ticket counter, the gave-up flag, two spare. */
#define FA_DQ_TILES(sq) (((sq) + 63) / 64)
#define FA_DQ_SEM_WORDS(B, Hq, sq) ((B) * (Hq) * FA_DQ_TILES(sq) * 2)
#define FA_DQ_SEM_EXTRA 4
typedef int (*fa_launcher)(const fa_call *c);

#define FA_DECLARE_INSTANCE(sfx)                 \
  int attn_cuda__fwd_##sfx(const fa_call *c);    \
  int attn_cuda__bwd_##sfx(const fa_call *c);

/* state.cu: varlen tile table of tiles of `tile` rows over the local rows [0, count) of
 * cu (positions from pos0); with require_other, only sequences that also have rows in
 * [other_pos0, other_pos0 + other_count) of cu_other. table: int32 [4] header (count
 * first), then [4] per tile: sequence, first local row, rows, 0. */
int attn_cuda__build_tiles(const int32_t *cu, int32_t num_seqs, int64_t pos0, int64_t count,
                           const int32_t *cu_other, int64_t other_pos0, int64_t other_count,
                           int require_other, int32_t tile, int32_t *table, void *stream);
/* Entries a table for `count` rows needs, for any tile of at least min_tile rows. */
int64_t attn_cuda__table_entries(int64_t count, int32_t num_seqs, int32_t min_tile);

/* state.cu: the generic (any head dim) kernels. 0 or a cudaError_t value. */
int attn_cuda__state_init(attn_state *st, void *stream);
/* words 32-bit words at p zeroed on the stream (the deterministic dQ's semaphores) */
int attn_cuda__zero(void *p, int64_t words, void *stream);
int attn_cuda__state_merge(attn_state *dst, const attn_state *src, void *stream);
/* The split-KV forward's second step: the c->nsplit partial states of c->part folded
 * together per row, into the carried state c->st (block mode), else into O and LSE with
 * the sink (c->o, c->lse at row q_row0 + i of c->lse_rows). */
int attn_cuda__split_combine(const fa_call *c);
int attn_cuda__finalize(const attn_cuda_problem *p, const attn_state *st, attn_cuda_view o,
                        float *lse, void *stream);
int attn_cuda__bwd_prepare(const attn_cuda_problem *p, attn_cuda_view o, attn_cuda_view dout,
                           const float *lse, float *delta, float *dsinks, void *stream);
const char *attn_cuda__error_string(int err);
/* Compute capability of the current device as 10*major + minor; 0 when unknown. */
int attn_cuda__device_cc(void);
/* ATTN_CUDA_HOPPER's default: 1 on hardware (the H200 run of 2026-12-04 passed every sm90
 * test), 0 on the emulator, whose sm90 model is slow (its Hopper tests opt in). */
int attn_cuda__hopper_default(void);
/* Streaming multiprocessors of the current device; 0 when unknown. */
int attn_cuda__device_sms(void);

#ifdef __cplusplus
}
#endif
#endif
