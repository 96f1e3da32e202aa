/* attnrun.h — the public C API of attnrun: exact softmax attention, forward and backward.
 *
 * The only header users include. Every call returns attn_status; on failure
 * attn_last_error() (per thread) names the argument, its value, and what to do next.
 * The library never exits or aborts. Semantics: DESIGN.md §2, restated briefly here.
 *
 * Logical layouts (tensors carry strides in elements; the last dimension is contiguous):
 *   Q   [B, Sq,  Hq,  Dqk]      K [B, Skv, Hkv, Dqk]      V [B, Skv, Hkv, Dv]
 *   O   [B, Sq,  Hq,  Dv]       LSE, delta: float32 contiguous [B, Hq, Sq], natural log
 * Scores: s = scale*q.k, then softcap cap*tanh(s/cap), then ALiBi -slope*|i+off-j|,
 * then the mask. off = Skv - Sq; causal is bottom-right aligned: key j visible to query i
 * iff j <= i + off.  Window (left, right): i+off-left <= j <= i+off+right (-1: unbounded).
 */
#ifndef ATTNRUN_H
#define ATTNRUN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(ATTN_BUILDING_LIBRARY) && defined(__GNUC__)
#define ATTN_API __attribute__((visibility("default")))
#else
#define ATTN_API
#endif

#define ATTN_VERSION_MAJOR 0
#define ATTN_VERSION_MINOR 1
#define ATTN_VERSION_PATCH 0
#define ATTN_VERSION_CODE (ATTN_VERSION_MAJOR * 10000 + ATTN_VERSION_MINOR * 100 + ATTN_VERSION_PATCH)

/* Runtime version, as ATTN_VERSION_CODE and as "0.1.0". */
ATTN_API int attn_version(void);
ATTN_API const char *attn_version_string(void);

/* ---- status ------------------------------------------------------------------- */
#define ATTN_STATUS_TABLE(X)                                                    \
  X(ATTN_OK, 0, "ok")                                                           \
  X(ATTN_ERR_INVALID_ARG, 1, "invalid argument")                                \
  X(ATTN_ERR_UNSUPPORTED, 2, "unsupported")                                     \
  X(ATTN_ERR_OUT_OF_MEMORY, 3, "out of memory")                                 \
  X(ATTN_ERR_MPI, 4, "MPI error")                                               \
  X(ATTN_ERR_NCCL, 5, "NCCL error")                                             \
  X(ATTN_ERR_CUDA, 6, "CUDA error")                                             \
  X(ATTN_ERR_CUBLAS, 7, "cuBLAS error")                                         \
  X(ATTN_ERR_TIMEOUT, 8, "timeout")                                             \
  X(ATTN_ERR_MISMATCH, 9, "ranks disagree")                                     \
  X(ATTN_ERR_INTERNAL, 10, "internal error")

typedef enum {
#define ATTN_STATUS_ENUM(name, code, text) name = code,
  ATTN_STATUS_TABLE(ATTN_STATUS_ENUM)
#undef ATTN_STATUS_ENUM
} attn_status;

ATTN_API const char *attn_status_string(attn_status status);
/* The message of this thread's last failed call ("" if none). */
ATTN_API const char *attn_last_error(void);

/* ---- tensors ------------------------------------------------------------------ */
typedef enum { ATTN_F32 = 0, ATTN_BF16 = 1, ATTN_F16 = 2 } attn_dtype;
typedef enum { ATTN_DEVICE_HOST = 0, ATTN_DEVICE_CUDA = 1 } attn_device;

/* A 4-D strided view. shape/stride follow the logical layouts above; strides in
 * elements; stride[3] must be 1. */
typedef struct {
  void *data;
  attn_dtype dtype;
  attn_device device;
  int64_t shape[4];
  int64_t stride[4];
} attn_tensor;

/* A contiguous (row-major) host float32 tensor view. */
static inline attn_tensor attn_tensor_f32(void *data, int64_t d0, int64_t d1, int64_t d2,
                                          int64_t d3) {
  attn_tensor t = {data, ATTN_F32, ATTN_DEVICE_HOST, {d0, d1, d2, d3},
                   {d1 * d2 * d3, d2 * d3, d3, 1}};
  return t;
}

/* Bytes of one element of dtype (0 for a value that is not a dtype). */
static inline size_t attn_dtype_size(attn_dtype t) {
  return t == ATTN_F32 ? 4 : (t == ATTN_BF16 || t == ATTN_F16) ? 2 : 0;
}

/* A contiguous (row-major) view of any dtype, in host or device memory. */
static inline attn_tensor attn_tensor_contig(void *data, attn_dtype dtype, attn_device device,
                                             int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  attn_tensor t = {data, dtype, device, {d0, d1, d2, d3}, {d1 * d2 * d3, d2 * d3, d3, 1}};
  return t;
}

/* ---- the attention spec -------------------------------------------------------- */

/* A tile-level mask: key block kb is visible to query block qb iff
 * mask[qb * num_k_blocks + kb] != 0. Query block of position i is i / block_q (positions
 * within the sequence: global in ring mode, per sequence in varlen). Applies to every
 * batch and head; combines (AND) with causal and window. */
typedef struct {
  int32_t block_q, block_k;
  int64_t num_q_blocks, num_k_blocks;
  const uint8_t *mask; /* [num_q_blocks, num_k_blocks] */
} attn_block_mask;

/* Longformer/BigBird-style pattern. Query block qb sees key block kb iff
 *   |qb - kb| <= local_blocks                  (local band), or
 *   stride > 0 and |qb - kb| % stride == 0     (strided, as in Sparse Transformer), or
 *   qb < global_blocks or kb < global_blocks   (global tokens see / are seen by all), or
 *   kb is one of `random_blocks` key blocks drawn for qb from `seed` (BigBird).
 * bm->mask (writable, num_q_blocks*num_k_blocks bytes) is overwritten. */
typedef struct {
  int32_t local_blocks, stride, global_blocks, random_blocks;
  uint64_t seed;
} attn_sparse_pattern;
ATTN_API attn_status attn_block_mask_fill(attn_block_mask *bm, uint8_t *mask,
                                          const attn_sparse_pattern *p);

/* A KV cache, as inference servers keep it (version 2 of attn_spec). Forward only:
 * attn_fwd and attn_fwd_block take it, on the cpu and cuda backends; the backward, the
 * ring, split-KV and the layer refuse it; not with varlen (a batched problem).
 * - Paged (block_table set): K is [num_pages, page_size, Hkv, Dqk] and V [num_pages,
 *   page_size, Hkv, Dv], pages in any order; batch b's key j (0 <= j < Skv, Skv =
 *   pages_per_seq * page_size) is row j % page_size of page
 *   block_table[b * pages_per_seq + j / page_size]. Every entry a batch's used keys reach
 *   must lie in [0, num_pages); entries past them are not read. The host checks
 *   both arrays on the cpu backend; on cuda they are device memory it never reads: an
 *   entry outside the pool reads as zero K/V rows, a length outside 0..Skv is clamped.
 * - seqused_kv set (not varlen): batch b attends to its first seqused_kv[b] keys only
 *   (0..Skv), exactly as if its Skv were that: causal and window align bottom-right to
 *   it. Keys past it are never read (they may hold anything). 0: empty rows. */
typedef struct {
  const int32_t *block_table; /* [B, pages_per_seq] int32, or NULL: not paged */
  int32_t pages_per_seq;
  const int32_t *seqused_kv; /* [B] int32, or NULL: every key is used */
} attn_kv_cache;

#define ATTN_KV_CACHE_INIT {NULL, 0, NULL}

#define ATTN_SPEC_VERSION 2
typedef struct {
  size_t size;               /* sizeof(attn_spec) */
  uint32_t version;          /* ATTN_SPEC_VERSION */
  int32_t num_heads_q;       /* Hq */
  int32_t num_heads_kv;      /* Hkv; Hq % Hkv == 0 (GQA/MQA) */
  int32_t head_dim_qk;       /* Dqk, 1..256 */
  int32_t head_dim_v;        /* Dv, 1..256; 0 → Dqk */
  float scale;               /* 0 → 1/sqrt(Dqk) */
  int32_t causal;            /* bottom-right aligned */
  int64_t window_left;       /* -1: unbounded */
  int64_t window_right;      /* -1: unbounded */
  float softcap;             /* 0: off */
  const float *sinks;        /* [Hq] learnable sink logits, or NULL */
  const float *alibi_slopes; /* [Hq], or NULL */
  /* varlen: B must be 1; sequences packed along S; [num_seqs + 1] int32 prefix sums */
  const int32_t *cu_seqlens_q;
  const int32_t *cu_seqlens_kv;
  int32_t num_seqs;
  const attn_block_mask *block_mask; /* or NULL */
  const attn_kv_cache *kv_cache;     /* (version 2) a paged KV cache / used lengths, or NULL */
} attn_spec;
/* The arrays a spec points to (sinks, alibi_slopes, cu_seqlens_*, block_mask->mask,
 * kv_cache->block_table and ->seqused_kv) live where the context's tensors live: host
 * memory for the cpu backend, device memory for cuda. The attn_spec, attn_block_mask and
 * attn_kv_cache structs themselves are always host memory. */

#define ATTN_SPEC_INIT                                                                   \
  {sizeof(attn_spec), ATTN_SPEC_VERSION, 0, 0, 0, 0, 0.0f, 0, -1, -1, 0.0f, NULL, NULL, \
   NULL, NULL, 0, NULL, NULL}

/* ---- context -------------------------------------------------------------------- */
typedef enum { ATTN_BACKEND_AUTO = 0, ATTN_BACKEND_CPU = 1, ATTN_BACKEND_CUDA = 2 } attn_backend;

#define ATTN_CTX_CONFIG_VERSION 2
typedef struct {
  size_t size;
  uint32_t version;
  attn_backend backend; /* AUTO: CUDA when a device is present, else CPU */
  int32_t device;       /* CUDA device ordinal */
  int32_t num_threads;  /* CPU threads; 0 → OpenMP default */
  int32_t force_scalar; /* CPU: use the portable scalar kernels (also ATTN_FORCE_SCALAR=1) */
  void *stream;         /* CUDA stream (cudaStream_t), NULL → default */
  /* (version 2) CPU bf16 forward and backward on bf16 product units: AMX tiles (Intel
   * AMX-BF16) or AVX512-BF16 dot products (AMD Zen 4, Intel Cooper Lake): products in
   * bf16 with float32 accumulation, P (and the backward's dS) rounded to bf16 for their
   * products as on GPUs; for head dims in multiples of 32 (AMX) or 16 (AVX512-BF16),
   * others take the float32 arithmetic. 0: AMX when the CPU has it, else AVX512-BF16;
   * 1: AMX required, 2: AVX512-BF16 required (attn_ctx_create fails with UNSUPPORTED
   * without it); -1: off, bf16 then runs the float32 arithmetic (bitwise the float32
   * path's on the same values). ATTN_CPU_AMX=-1|0|1|2 overrides. */
  int32_t cpu_amx;
} attn_ctx_config;

#define ATTN_CTX_CONFIG_INIT \
  {sizeof(attn_ctx_config), ATTN_CTX_CONFIG_VERSION, ATTN_BACKEND_AUTO, 0, 0, 0, NULL, 0}

typedef struct attn_ctx_s *attn_ctx_t;

ATTN_API attn_status attn_ctx_create(attn_ctx_t *out, const attn_ctx_config *cfg);
ATTN_API attn_status attn_ctx_destroy(attn_ctx_t ctx); /* accepts NULL */
/* "cpu-avx512", "cpu-scalar", "cuda", ... */
ATTN_API const char *attn_ctx_backend_name(attn_ctx_t ctx);
/* Where this context's tensors (and spec arrays) live: host for cpu, device for cuda. */
ATTN_API attn_device attn_ctx_device(attn_ctx_t ctx);
/* ATTN_OK when the context's backend takes q/k/v/o of this dtype; else UNSUPPORTED with a
 * message naming the dtypes it takes. */
ATTN_API attn_status attn_ctx_supports_dtype(attn_ctx_t ctx, attn_dtype dtype);

/* ---- memory where the context's tensors live ----------------------------------------- */
/* So that callers (the CLI, frameworks, tests) need no CUDA headers of their own. */
typedef enum {
  ATTN_COPY_HOST_TO_CTX = 0, /* host → context memory; returns when the copy is done */
  ATTN_COPY_CTX_TO_HOST = 1, /* context → host; waits for the context's queued work */
  ATTN_COPY_CTX_TO_CTX = 2   /* within context memory; ordered on the context's stream */
} attn_copy_kind;
/* bytes of context memory (256-byte aligned; bytes == 0 gives a valid, unique pointer). */
ATTN_API attn_status attn_ctx_alloc(attn_ctx_t ctx, size_t bytes, void **out);
/* Frees what attn_ctx_alloc gave, after the context's queued work (accepts NULL). */
ATTN_API attn_status attn_ctx_free(attn_ctx_t ctx, void *p);
ATTN_API attn_status attn_ctx_copy(attn_ctx_t ctx, void *dst, const void *src, size_t bytes,
                                   attn_copy_kind kind);
/* Waits until the context's queued work is done (a no-op on the cpu backend). */
ATTN_API attn_status attn_ctx_sync(attn_ctx_t ctx);

/* ---- single-rank attention -------------------------------------------------------- */

/* O [B,Sq,Hq,Dv] and lse [B,Hq,Sq] (may be NULL). Empty rows: O = 0, LSE = -inf (or the
 * sink logit when sinks are given). */
ATTN_API attn_status attn_fwd(attn_ctx_t ctx, const attn_spec *spec, const attn_tensor *q,
                              const attn_tensor *k, const attn_tensor *v, attn_tensor *o,
                              float *lse);

/* Gradients dq [B,Sq,Hq,Dqk], dk [B,Skv,Hkv,Dqk], dv [B,Skv,Hkv,Dv] (float32, written, not
 * accumulated), dsinks [Hq] (written; may be NULL when spec->sinks is NULL). o and lse
 * come from attn_fwd. */
ATTN_API attn_status attn_bwd(attn_ctx_t ctx, const attn_spec *spec, const attn_tensor *q,
                              const attn_tensor *k, const attn_tensor *v,
                              const attn_tensor *o, const float *lse, const attn_tensor *dout,
                              attn_tensor *dq, attn_tensor *dk, attn_tensor *dv,
                              float *dsinks);

/* ---- the state-carrying block API (ring / split-KV building block) ------------------- */

/* Float32 online-softmax state for `rows` query rows of B x Hq heads, in the context's
 * device memory. m is the running max and l the running sum, both in natural-log units of
 * the final scores; acc the unnormalised output. Caller-owned memory, plain layouts. */
typedef struct {
  float *m;      /* [B, Hq, rows] */
  float *l;      /* [B, Hq, rows] */
  float *acc;    /* [B, Hq, rows, Dv] */
  int64_t batch; /* B */
  int64_t heads; /* Hq */
  int64_t rows;
  int64_t head_dim_v; /* Dv */
} attn_state;

/* Where a block sits in the global sequence. Positions drive causal, window, ALiBi,
 * block masks and varlen (with varlen, positions index the packed global arrays that
 * cu_seqlens describe). */
typedef struct {
  int64_t q_row0; /* first state row (and lse/delta row) that q's rows map to */
  int64_t q_pos0; /* global position of q's first row */
  int64_t k_pos0; /* global position of k's first row */
  int64_t seq_q;  /* global query length (0 → q's length); sets off = seq_kv - seq_q */
  int64_t seq_kv; /* global key length (0 → k's length) */
} attn_block_pos;

#define ATTN_BLOCK_POS_INIT {0, 0, 0, 0, 0}

/* m = -inf, l = 0, acc = 0. */
ATTN_API attn_status attn_state_init(attn_ctx_t ctx, attn_state *st);
/* Fold one K/V block into the state of q's rows. */
ATTN_API attn_status attn_fwd_block(attn_ctx_t ctx, const attn_spec *spec, attn_state *st,
                                    const attn_tensor *q, const attn_tensor *k,
                                    const attn_tensor *v, const attn_block_pos *pos);
/* dst := merge(dst, src) (split-KV: states of the same rows over disjoint key sets). */
ATTN_API attn_status attn_state_merge(attn_ctx_t ctx, attn_state *dst, const attn_state *src);
/* O and lse from the state; sinks (spec->sinks) are applied here, exactly once. */
ATTN_API attn_status attn_state_finalize(attn_ctx_t ctx, const attn_spec *spec,
                                         const attn_state *st, attn_tensor *o, float *lse);

/* delta [B,Hq,Sq] = rowsum(dO * O); dsinks [Hq] (may be NULL) += -sum_i e^(sink-lse_i)*delta_i. */
ATTN_API attn_status attn_bwd_prepare(attn_ctx_t ctx, const attn_spec *spec,
                                      const attn_tensor *o, const attn_tensor *dout,
                                      const float *lse, float *delta, float *dsinks);
/* Accumulate (+=) one K/V block's contribution into dq, dk, dv (float32). lse and delta
 * are indexed by state rows (pos->q_row0 + local row). */
ATTN_API attn_status attn_bwd_block(attn_ctx_t ctx, const attn_spec *spec,
                                    const attn_tensor *q, const attn_tensor *k,
                                    const attn_tensor *v, const attn_tensor *dout,
                                    const float *lse, const float *delta, int64_t lse_rows,
                                    attn_tensor *dq, attn_tensor *dk, attn_tensor *dv,
                                    const attn_block_pos *pos);

/* ---- distribution: groups, ring attention (context parallel), the TP layer ---------- */

typedef struct attn_group_s *attn_group_t;

#define ATTN_GROUP_CONFIG_VERSION 1
typedef struct {
  size_t size;
  uint32_t version;
  int32_t tp;       /* tensor-parallel ranks (heads); TP groups are consecutive ranks */
  int32_t cp;       /* context-parallel ranks (ring); tp * cp == communicator size */
  double timeout_s; /* every wait; 0 → env ATTN_TIMEOUT, else 300 s */
} attn_group_config;

#define ATTN_GROUP_CONFIG_INIT \
  {sizeof(attn_group_config), ATTN_GROUP_CONFIG_VERSION, 1, 1, 0.0}

/* mpi_comm points to an MPI_Comm; it is duplicated, and the caller's error handler is
 * left as it is. Collective over the communicator. */
ATTN_API attn_status attn_group_create(attn_group_t *out, attn_ctx_t ctx, const void *mpi_comm,
                                       const attn_group_config *cfg);
ATTN_API attn_status attn_group_destroy(attn_group_t grp); /* accepts NULL */
/* After a failure: cancel what is pending and mark the group dead (later calls fail at
 * once). Never exits; the caller decides whether to end the job. */
ATTN_API attn_status attn_group_abort(attn_group_t grp);

typedef struct {
  int32_t rank, size;       /* in the group's communicator */
  int32_t tp_rank, tp_size; /* rank / size in this rank's TP group */
  int32_t cp_rank, cp_size; /* rank / size in this rank's CP group (the ring) */
} attn_group_info;
ATTN_API attn_status attn_group_get_info(attn_group_t grp, attn_group_info *out);

/* How a sequence is cut over the CP ranks. CONTIGUOUS: cp chunks, rank r holds chunk r.
 * ZIGZAG (TE/Megatron's 2*cp layout, balanced for causal): rank r holds chunks r and
 * 2*cp-1-r. Chunk c spans [floor(c*S/n), floor((c+1)*S/n)), so lengths that do not divide
 * give chunks that differ by at most one row. */
typedef enum { ATTN_LAYOUT_CONTIGUOUS = 0, ATTN_LAYOUT_ZIGZAG = 1 } attn_cp_layout;

typedef struct {
  int32_t count;    /* runs: 1 (contiguous) or 2 (zigzag) */
  int64_t start[2]; /* global row of each run */
  int64_t len[2];
  int64_t rows; /* len[0] + len[1]: this rank's local rows, in run order */
} attn_cp_shard;
ATTN_API attn_status attn_cp_shard_rows(attn_cp_layout layout, int32_t cp, int32_t cp_rank,
                                        int64_t seq, attn_cp_shard *out);

/* Ring attention over this rank's CP group. Local shards, rows as attn_cp_shard_rows of
 * the global lengths: q [B, Sq_loc, Hq, Dqk], k [B, Skv_loc, Hkv, Dqk], v [B, Skv_loc, Hkv,
 * Dv], o [B, Sq_loc, Hq, Dv], lse [B, Hq, Sq_loc]. Positions are global, so causal,
 * window, ALiBi, block masks and varlen (cu_seqlens over the global packed sequence) mean
 * exactly what they mean on one rank. The float32 state travels into every step's kernel;
 * sinks are applied once, at the end. */
ATTN_API attn_status attn_ring_fwd(attn_group_t grp, const attn_spec *spec,
                                   attn_cp_layout layout, int64_t seq_q, int64_t seq_kv,
                                   const attn_tensor *q, const attn_tensor *k,
                                   const attn_tensor *v, attn_tensor *o, float *lse);
/* dq stays home; K, V and their gradient accumulators travel the ring. dsinks [Hq] is
 * summed over the CP group (identical on every rank). */
ATTN_API attn_status attn_ring_bwd(attn_group_t grp, const attn_spec *spec,
                                   attn_cp_layout layout, int64_t seq_q, int64_t seq_kv,
                                   const attn_tensor *q, const attn_tensor *k,
                                   const attn_tensor *v, const attn_tensor *o,
                                   const float *lse, const attn_tensor *dout, attn_tensor *dq,
                                   attn_tensor *dk, attn_tensor *dv, float *dsinks);

/* Split-KV attention over this rank's CP group (context-parallel decode): every rank holds
 * all query rows, the same on every rank — q [B, Sq, Hq, Dqk], o [B, Sq, Hq, Dv], lse
 * [B, Hq, Sq] — and K/V are cut as attn_cp_shard_rows of seq_kv: k [B, Skv_loc, Hkv, Dqk],
 * v [B, Skv_loc, Hkv, Dv]. Each rank folds its shard into a float32 state; the states are
 * gathered (B*Hq*Sq*(Dv+2) floats each) and merged in rank order, so every rank gets
 * bitwise the same O and LSE. Positions are global, as in the ring. For few query rows
 * against many keys (decode, chunked prefill): K/V never travel. */
ATTN_API attn_status attn_split_kv_fwd(attn_group_t grp, const attn_spec *spec,
                                       attn_cp_layout layout, int64_t seq_q, int64_t seq_kv,
                                       const attn_tensor *q, const attn_tensor *k,
                                       const attn_tensor *v, attn_tensor *o, float *lse);
/* dk, dv: this rank's shard; dq [B, Sq, Hq, Dqk] summed over the CP group and dsinks [Hq]
 * (computed from the replicated O), both bitwise the same on every rank. */
ATTN_API attn_status attn_split_kv_bwd(attn_group_t grp, const attn_spec *spec,
                                       attn_cp_layout layout, int64_t seq_q, int64_t seq_kv,
                                       const attn_tensor *q, const attn_tensor *k,
                                       const attn_tensor *v, const attn_tensor *o,
                                       const float *lse, const attn_tensor *dout,
                                       attn_tensor *dq, attn_tensor *dk, attn_tensor *dv,
                                       float *dsinks);

/* What the last ring call did, step by step (step 0 = the local block). On a CUDA context
 * the steps do not wait for the device; both times come from CUDA events on the context's
 * stream (read when the call ends): compute_s is the device time of the step's packing and
 * kernels, wait_s the time the stream then stalled for the step's exchange (the copies of
 * the MPI-staged transport included). On the cpu backend they are host times. */
typedef struct {
  double compute_s; /* kernel time, plus packing blocks and adding received partials */
  double wait_s;    /* time stalled waiting for the exchange (exposed communication) */
  int64_t bytes;    /* bytes this rank sent in the step */
  int32_t computed; /* 0 when the mask excluded the whole block */
} attn_ring_step;
/* Copies up to max steps into steps; *count gets the number of steps. */
ATTN_API attn_status attn_group_last_steps(attn_group_t grp, attn_ring_step *steps, int32_t max,
                                           int32_t *count);

/* The tensor-parallel attention layer: y = Attn(x W_q, x W_k, x W_v) W_o, heads sharded
 * over the TP group, each rank's part AllReduced; within a TP rank, attention runs as a
 * ring over its CP group when cp > 1. */
typedef struct attn_layer_s *attn_layer_t;

/* 2: attn_spec grew (version 2), so the fields after .spec moved */
#define ATTN_LAYER_CONFIG_VERSION 2
typedef struct {
  size_t size;
  uint32_t version;
  int64_t d_model;
  attn_spec spec;        /* global: Hq, Hkv, Dqk, Dv, masks; sinks/alibi are [Hq] global */
  float rope_theta;      /* RoPE on Q and K after projection; 0: off */
  attn_cp_layout layout; /* how x's rows are cut over the CP group (cp > 1) */
  /* Storage of the attention's Q, K, V, O (and dO) inside the layer; x, the weights, y
   * and every gradient stay float32. ATTN_LAYER_DTYPE_AUTO: BF16 on a device, F32 on
   * the host; else an attn_dtype the context takes (attn_ctx_supports_dtype). */
  int32_t attention_dtype;
} attn_layer_config;

#define ATTN_LAYER_DTYPE_AUTO (-1)
#define ATTN_LAYER_CONFIG_INIT                                                              \
  {sizeof(attn_layer_config), ATTN_LAYER_CONFIG_VERSION, 0, ATTN_SPEC_INIT, 0.0f,           \
   ATTN_LAYOUT_ZIGZAG, ATTN_LAYER_DTYPE_AUTO}

/* Heads this TP rank owns: query heads [hq0, hq0 + hq), KV heads [hk0, hk0 + hk). KV heads
 * are split when Hkv >= tp and replicated (hk = 1) when Hkv < tp. */
typedef struct {
  int32_t hq0, hq, hk0, hk;
} attn_layer_heads;

ATTN_API attn_status attn_layer_create(attn_layer_t *out, attn_group_t grp,
                                       const attn_layer_config *cfg);
ATTN_API attn_status attn_layer_destroy(attn_layer_t layer); /* accepts NULL */
ATTN_API attn_status attn_layer_get_heads(attn_layer_t layer, attn_layer_heads *out);
/* x, y [B, S_loc, d_model] (this CP rank's rows; x identical over the TP group);
 * w_qkv [d_model, (hq*Dqk + hk*Dqk + hk*Dv)] = this rank's columns [W_q | W_k | W_v];
 * w_o [hq*Dv, d_model] = this rank's rows of W_o. y is identical over the TP group.
 * All float32, in the context's memory (device memory on a CUDA context, where the
 * projections run through cuBLAS and the attention in bf16). The layer keeps what
 * backward needs until the next forward. */
ATTN_API attn_status attn_layer_fwd(attn_layer_t layer, int64_t batch, int64_t seq_global,
                                    const float *x, const float *w_qkv, const float *w_o,
                                    float *y);
/* dy [B, S_loc, d_model] → dx (AllReduced over TP), dw_qkv and dw_o (this rank's shards;
 * a replicated KV head's gradient is summed over the ranks that share it). */
ATTN_API attn_status attn_layer_bwd(attn_layer_t layer, const float *dy, float *dx,
                                    float *dw_qkv, float *dw_o);
/* d(sinks) of this rank's query heads [hq] (summed over the CP group) from the last
 * attn_layer_bwd; the layer must have sinks. */
ATTN_API attn_status attn_layer_get_dsinks(attn_layer_t layer, float *dsinks);

/* Forward FLOPs by the peers' rule: 2*B*Hq*Sq*Skv*(Dqk+Dv) (= 4*..*D), halved when
 * causal; backward is 2.5x that. With varlen it sums over the sequences, and with a KV
 * cache's used lengths over the batches (Skv = seqused_kv[b]), reading those arrays on
 * the host: pass a spec with host arrays. */
ATTN_API double attn_flops_fwd(const attn_spec *spec, int64_t batch, int64_t seq_q,
                               int64_t seq_kv);

/* What the context's last attn_* call computed: FLOPs of the tiles actually computed
 * (skipped tiles cost nothing), and tiles computed / skipped. */
typedef struct {
  double flops_computed;
  int64_t tiles_computed;
  int64_t tiles_skipped;
} attn_stats;
ATTN_API attn_status attn_ctx_last_stats(attn_ctx_t ctx, attn_stats *out);

/* ---- devices ------------------------------------------------------------------------ */
/* So that launchers can place ranks on devices without CUDA headers of their own. */
/* Devices of backend b: CUDA: the visible devices (0 when none is visible; the build has
 * no CUDA backend: *count = 0 and ATTN_ERR_UNSUPPORTED); CPU: 1, the host. AUTO is not a
 * device kind (ATTN_ERR_INVALID_ARG). */
ATTN_API attn_status attn_device_count(attn_backend b, int *count);
/* The PCI bus id of CUDA device ordinal `device`, as "dddd:bb:dd.f" (hex, the form
 * hwloc_get_pcidev_by_busidstring and nvidia-smi take), NUL-terminated in buf[len]. */
ATTN_API attn_status attn_device_pci_bus_id(int device, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
