/* internal.h — what runtime/ and the backends share: error helpers, logging, tunables,
 * the resolved problem every kernel receives, and the backend function table. */
#ifndef ATTN_INTERNAL_H
#define ATTN_INTERNAL_H

#include "attnrun.h"

#include <math.h>
#include <stdarg.h>

/* ---- errors ---------------------------------------------------------------------- */
/* Records the per-thread message and returns status (so: return attn__fail(...)). */
attn_status attn__fail(attn_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void attn__clear_error(void);

#define ATTN__MAX_HEAD_DIM 256 /* head_dim_qk and head_dim_v: 1..this (validate.c) */

#define ATTN_CHECK(expr)                   \
  do {                                     \
    attn_status attn__s_ = (expr);         \
    if (attn__s_ != ATTN_OK) return attn__s_; \
  } while (0)

#define ATTN_CHECK_GOTO(expr, status_var, label) \
  do {                                           \
    (status_var) = (expr);                       \
    if ((status_var) != ATTN_OK) goto label;     \
  } while (0)

/* ---- logging and tunables ---------------------------------------------------------- */
enum { ATTN_LOG_WARN = 1, ATTN_LOG_INFO = 2 };
/* ATTN_DEBUG=WARN|INFO; lines are prefixed with host and rank (ATTN_RANK / OMPI env). */
void attn__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Integer tunable read once from the environment (name without the ATTN_ prefix). */
int64_t attn__param(const char *name, int64_t dflt);
#define ATTN_PARAM(name, dflt) attn__param(name, dflt)

/* ---- the resolved problem ----------------------------------------------------------- */
/* A strided float32 view of a [B, S, H, D] tensor: element (b,s,h,d) at
 * p[b*sb + s*ss + h*sh + d]. Paged (pages != NULL: K and V of a KV cache): row s of batch
 * b lies in page pages[b * pages_per_b + s / page_rows], at p[page*sb + (s % page_rows)*ss
 * + h*sh]; sb is then the page stride, and rows are evenly strided only within a page. */
typedef struct {
  float *p;
  int64_t sb, ss, sh;
  const int32_t *pages; /* [B][pages_per_b], or NULL */
  int64_t pages_per_b, page_rows, num_pages; /* num_pages: the pool's, sb apart */
} attn__view;

/* An unpaged view. */
static inline attn__view attn__view_of(const void *p, int64_t sb, int64_t ss, int64_t sh) {
  attn__view v;
  v.p = (float *)p;
  v.sb = sb, v.ss = ss, v.sh = sh;
  v.pages = NULL;
  v.pages_per_b = v.page_rows = v.num_pages = 0;
  return v;
}

/* Offset of row (b, s, h) of x, in elements of its dtype. */
static inline int64_t attn__view_offset(attn__view x, int64_t b, int64_t s, int64_t h) {
  if (!x.pages) return b * x.sb + s * x.ss + h * x.sh;
  const int64_t page = x.pages[b * x.pages_per_b + s / x.page_rows];
  return page * x.sb + (s % x.page_rows) * x.ss + h * x.sh;
}

/* Rows from row s on, at most `rows`, that lie evenly strided (ss) in x: all of them
 * unless paged, else those up to the end of s's page. */
static inline int64_t attn__view_run(attn__view x, int64_t s, int64_t rows) {
  if (!x.pages) return rows;
  const int64_t left = x.page_rows - s % x.page_rows;
  return rows < left ? rows : left;
}

/* Everything a kernel needs, validated and with defaults filled. Sizes are local to the
 * call (the block); positions are global. */
typedef struct {
  int64_t B, Hq, Hkv, Dqk, Dv;
  attn_dtype dtype; /* of q, k, v (and o, dout); gradients are float32 accumulators */
  int64_t sq;      /* local query rows in this call */
  int64_t skv;     /* local key rows in this call */
  int64_t q_row0;  /* state / lse row of local query row 0 */
  int64_t q_pos0;  /* global position of local query row 0 */
  int64_t k_pos0;  /* global position of local key row 0 */
  int64_t seq_q, seq_kv; /* global lengths (off = seq_kv - seq_q when not varlen) */
  float scale, softcap;
  int causal;
  int64_t window_left, window_right; /* -1 unbounded */
  const float *sinks, *alibi;        /* [Hq] or NULL */
  const int32_t *cu_q, *cu_kv;       /* varlen prefix sums over global packed positions */
  int32_t num_seqs;                  /* 0: not varlen */
  const attn_block_mask *block_mask;
  /* [B] global keys each batch uses (a KV cache's lengths: its off = kv_used[b] - seq_q),
   * or NULL: seq_kv */
  const int32_t *kv_used;
  /* q [B, sq, Hq, Dqk], k [B, skv, Hkv, Dqk], v [B, skv, Hkv, Dv]; k and v may be paged */
  attn__view q, k, v;
} attn__problem;

/* UNSUPPORTED, naming `who`, when spec carries a KV cache (the forward's alone). */
attn_status attn__no_kv_cache(const attn_spec *spec, const char *who);

/* ---- backends --------------------------------------------------------------------- */
typedef enum { ATTN__ROWS_COPY = 0, ATTN__ROWS_ADD = 1, ATTN__ROWS_ZERO = 2 } attn__rows_op;

typedef struct {
  const char *name;
  attn_device device; /* where this backend's tensors live */
  uint32_t dtypes;    /* bit (1 << attn_dtype) for each dtype it takes */
  /* One-shot forward: o [B,sq,Hq,Dv]; lse [B,Hq,lse_rows] at row q_row0+i, may be NULL. */
  attn_status (*fwd)(attn_ctx_t ctx, const attn__problem *pb, attn__view o, float *lse,
                     int64_t lse_rows);
  attn_status (*fwd_block)(attn_ctx_t ctx, const attn__problem *pb, attn_state *st);
  attn_status (*state_init)(attn_ctx_t ctx, attn_state *st);
  attn_status (*state_merge)(attn_ctx_t ctx, attn_state *dst, const attn_state *src);
  /* o covers the state's rows; sinks from pb (pb->sq == st->rows). */
  attn_status (*finalize)(attn_ctx_t ctx, const attn__problem *pb, const attn_state *st,
                          attn__view o, float *lse);
  /* delta [B,Hq,sq] = rowsum(dO*O); dsinks [Hq] += ... (may be NULL). */
  attn_status (*bwd_prepare)(attn_ctx_t ctx, const attn__problem *pb, attn__view o,
                             attn__view dout, const float *lse, float *delta, float *dsinks);
  /* dq/dk/dv += this block's gradient; dout [B,sq,Hq,Dv]; lse/delta [B,Hq,lse_rows]. */
  attn_status (*bwd_block)(attn_ctx_t ctx, const attn__problem *pb, attn__view dout,
                           const float *lse, const float *delta, int64_t lse_rows,
                           attn__view dq, attn__view dk, attn__view dv);
  /* Memory where this backend's tensors live (attn_ctx_alloc / _free / _copy / _sync). */
  attn_status (*mem_alloc)(attn_ctx_t ctx, size_t bytes, void **out);
  attn_status (*mem_free)(attn_ctx_t ctx, void *p);
  attn_status (*mem_copy)(attn_ctx_t ctx, void *dst, const void *src, size_t bytes,
                          attn_copy_kind kind);
  attn_status (*sync)(attn_ctx_t ctx);
  /* ---- timing and scratch for asynchronous backends (NULL on the cpu backend, whose
   * calls complete before they return: the host clock times them, malloc serves) ------- */
  /* A timing event; record marks the context's stream at this point; elapsed gives the
   * seconds between two records that have completed (after a sync). */
  attn_status (*event_create)(attn_ctx_t ctx, void **ev);
  attn_status (*event_record)(attn_ctx_t ctx, void *ev);
  attn_status (*event_elapsed)(attn_ctx_t ctx, void *start, void *end, double *seconds);
  void (*event_destroy)(attn_ctx_t ctx, void *ev); /* accepts NULL */
  /* Float32 scratch of at least n elements held by the context (grown on demand, freed
   * with it), valid until the next call that asks for it; work queued on the stream that
   * uses it is ordered before any later use. attn_bwd's delta lives here, so a call
   * neither allocates nor frees (cudaFree would wait for the device). */
  attn_status (*scratch)(attn_ctx_t ctx, int64_t n, float **out);
  /* Completes ctx->stats of the last fwd / fwd_block / bwd_block call where the backend
   * counts them later than the call (NULL: ctx->stats is complete when the call returns).
   * Read ctx->stats through attn__ctx_stats, which calls it. */
  attn_status (*stats)(attn_ctx_t ctx);
  /* ---- data movement for the ring and the layer, on this backend's memory ----------- */
  /* Over [B, S, H, D] strided views (attn__view in elements of the named dtype; .p is
   * cast): COPY dst = src (dtypes may differ: float32 <-> bf16/f16 converts, rounding to
   * nearest even; equal dtypes copy bits), ADD dst += src (both float32), ZERO dst = 0
   * (src unused). Enqueued on the context's stream; views must not overlap. */
  attn_status (*rows)(attn_ctx_t ctx, attn__rows_op op, attn__view dst, attn_dtype dst_dtype,
                      attn__view src, attn_dtype src_dtype, int64_t B, int64_t S, int64_t H,
                      int64_t D);
  /* RoPE (runtime/rope.h semantics) on a float32 [B, S, H, D] view in place; cos_t, sin_t
   * [S, D/2] float32 in this backend's memory; inverse = 1 rotates by -angle. */
  attn_status (*rope)(attn_ctx_t ctx, attn__view x, int64_t B, int64_t S, int64_t H, int64_t D,
                      const float *cos_t, const float *sin_t, int inverse);
  /* Row-major float32 C[M,N] = alpha * op(A) op(B) + beta * C (op: transpose when ta/tb),
   * lda/ldb/ldc the row pitches as stored; all in this backend's memory. */
  attn_status (*gemm)(attn_ctx_t ctx, int ta, int tb, int64_t M, int64_t N, int64_t K,
                      float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                      float beta, float *C, int64_t ldc);
  /* Names the device the context computes on, the same string on every process that
   * shares it (PCI bus id); "host" for the cpu backend. */
  attn_status (*device_id)(attn_ctx_t ctx, char *buf, size_t cap);
  /* Frees the context's backend_data. */
  void (*release)(void *backend_data);
} attn__backend_ops;

/* Host copies of a spec's device arrays that a runtime caller holds anyway (the ring's
 * plan), so that a device backend counts attn_stats from them instead of copying the
 * arrays back (kernels/cuda/backend.c). A copy is used only for the device pointer named
 * next to it. */
typedef struct {
  const int32_t *cu_q_dev, *cu_kv_dev, *cu_q, *cu_kv; /* [num_seqs + 1], or NULL */
  const uint8_t *mask_dev, *mask;                    /* block mask, or NULL */
} attn__spec_host;

struct attn_ctx_s {
  attn_ctx_config cfg;
  const attn__backend_ops *ops;
  void *backend_data;
  attn_stats stats;
  const attn__spec_host *spec_host; /* set for the duration of such a caller's calls */
};

/* ctx->stats of the last attention call, completed by the backend where it defers them
 * (runtime/context.c). */
attn_status attn__ctx_stats(attn_ctx_t ctx, attn_stats *out);

/* Backends (filled in their own folders). */
attn_status attn__cpu_backend(attn_ctx_t ctx, const attn__backend_ops **ops);
attn_status attn__cuda_backend(attn_ctx_t ctx, const attn__backend_ops **ops);
int attn__cuda_device_count(void);

/* ---- shared helpers --------------------------------------------------------------- */
/* Allowed key range of query at (sequence-local) position i given off: [lo, hi]
 * (inclusive; lo may exceed hi). Used by every backend and the reference. */
static inline void attn__row_range(int causal, int64_t wl, int64_t wr, int64_t off, int64_t i,
                                   int64_t skv, int64_t *lo, int64_t *hi) {
  int64_t a = 0, b = skv - 1, c = i + off;
  if (causal && c < b) b = c;
  if (wl >= 0 && c - wl > a) a = c - wl;
  if (wr >= 0 && c + wr < b) b = c + wr;
  *lo = a;
  *hi = b;
}

#endif
