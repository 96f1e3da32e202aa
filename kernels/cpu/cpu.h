/* cpu.h — the CPU backend's internals: tile sizes, the per-tile description of masks and
 * score transforms, and the table of ISA-specific tile primitives (scalar, AVX-512).
 *
 * Orientation: every score tile is transposed, S^T [keys j][queries i], so that query rows
 * are vector lanes: the online-softmax state (m, l) of a row lives in one lane and every
 * softmax step is vertical, with no horizontal reductions. */
#ifndef ATTN_CPU_H
#define ATTN_CPU_H

#include "../../runtime/internal.h"

#define CPU_BR 128 /* query rows per tile (lanes) */
#define CPU_BC 128 /* keys per tile */
#define CPU_LOG2E 1.4426950408889634f

/* Masks and transforms of one (query tile, key tile) pair, in log2 units. */
typedef struct {
  int partial;          /* 0: every (i, j) with i < rows is visible; 1: apply lo/hi/elem */
  int32_t lo[CPU_BR];   /* per lane: first visible key, tile-relative */
  int32_t hi[CPU_BR];   /* per lane: last visible key, tile-relative (lo > hi: none) */
  const uint8_t *elem;  /* [nj][CPU_BR] 1 = visible (block mask), or NULL */
  float softcap2;       /* cap*log2e; 0: off (then scores arrive already in log2 units) */
  float alibi2;         /* slope*log2e; 0: off (a zero slope adds nothing anyway) */
  float ipos[CPU_BR];   /* per lane: query position + off - the tile's first key position,
                         * so the ALiBi distance |ipos - j| stays exact at any length */
} cpu_tile_info;

enum { CPU_GEMM_SET = 0, CPU_GEMM_ADD = 1, CPU_GEMM_SCALE_ADD = 2 };

typedef struct {
  const char *name;
  /* C[m][n] (=, +=, alpha[n]*C +) sum_k A[k*ak + m*am] * B[k*ldb + n]
   * for m < M, n < N, k < K. safe: a product with a zero factor adds nothing (keeps NaN
   * or Inf sitting in masked K/V out of the result). */
  void (*gemm)(float *C, int64_t ldc, const float *A, int64_t ak, int64_t am, const float *B,
               int64_t ldb, int M, int N, int K, const float *alpha, int mode, int safe);
  /* Forward: S^T [nj][CPU_BR] (raw scaled scores) → P^T in place, with the online update
   * of m, l [CPU_BR] (log2 units) and alpha [CPU_BR] = 2^(m_old - m_new). */
  void (*softmax_fwd)(float *S, int nj, const cpu_tile_info *ti, float *m, float *l,
                      float *alpha);
  /* Backward: S^T → P^T = 2^(x - lse2) in place; T [nj][CPU_BR] gets tanh (softcap only). */
  void (*probs_bwd)(float *S, int nj, const cpu_tile_info *ti, const float *lse2, float *T);
  /* Backward: dP^T → dS^T in place: factor * P*(dP - delta) * (1 - T^2 if T); 0 where P = 0. */
  void (*dscores)(float *dP, const float *P, const float *T, int nj, const float *delta,
                  float factor);
  /* Rows to lanes: dst [D][CPU_BR] with dst[d][i] = src[i*ss + d] * scale for i < rows,
   * and 0 in lanes rows..CPU_BR-1. */
  void (*pack_t)(float *dst, const float *src, int64_t ss, int rows, int D, float scale);
  /* Lanes to rows: dst[i*ds + d] = src[d*CPU_BR + i] * (scale ? scale[i] : 1), i < rows. */
  void (*unpack_t)(float *dst, int64_t ds, const float *src, int rows, int D,
                   const float *scale);
  /* bf16/f16 rows to float32: dst[r*ld + d] = src[r*ss + d] for r < rows, d < D (src and
   * ss in elements of t, which is ATTN_BF16 or ATTN_F16). */
  void (*rows_in)(float *dst, int64_t ld, const void *src, int64_t ss, attn_dtype t, int rows,
                  int D);
  /* float32 rows to bf16/f16, nearest even: dst[r*ds + d] = src[r*ld + d]. */
  void (*rows_out)(void *dst, int64_t ds, attn_dtype t, const float *src, int64_t ld, int rows,
                   int D);
} cpu_tile_ops;

extern const cpu_tile_ops attn__cpu_ops_scalar;
/* NULL when the compiler could not build it. */
const cpu_tile_ops *attn__cpu_ops_avx512(void);

typedef struct {
  const cpu_tile_ops *ops;
  int threads;
} cpu_backend;

/* One contiguous run of query rows of one sequence against its keys (varlen splits a
 * block into several; otherwise there is one). Rows/keys are block-local indices. */
typedef struct {
  int64_t r0, r1;     /* local query rows */
  int64_t c0, c1;     /* local keys of the same sequence */
  int64_t qpos_row0;  /* sequence-local position of local row 0 */
  int64_t kpos_col0;  /* sequence-local position of local key 0 */
  int64_t off;        /* len_kv - len_q of the sequence */
  int64_t len_kv;     /* keys in the sequence */
} cpu_segment;

/* Segments of pb (caller frees *out). */
attn_status attn__cpu_segments(const attn__problem *pb, cpu_segment **out, int *count);

/* Fills ti for local rows [r0, r0+rows) x local keys [c0, c1) of seg for head h; returns
 * 0 when no pair is visible (skip the tile). elem_buf [CPU_BC*CPU_BR] backs ti->elem. */
int attn__cpu_tile_info(const attn__problem *pb, const cpu_segment *seg, int64_t h,
                        int64_t r0, int rows, int64_t c0, int64_t c1, cpu_tile_info *ti,
                        uint8_t *elem_buf);

/* Visible local key range [*c0, *c1) for rows [r0, r0+rows) of seg (empty if c0 >= c1). */
void attn__cpu_key_range(const attn__problem *pb, const cpu_segment *seg, int64_t r0, int rows,
                         int64_t *c0, int64_t *c1);

/* Flags [B][H][ceil(S/CPU_BC)]: 1 where a key tile of x (dtype t) holds NaN or Inf (those
 * tiles take the safe GEMM so masked non-finite values cannot leak). NULL on allocation
 * failure. */
uint8_t *attn__cpu_nonfinite_tiles(attn__view x, attn_dtype t, int64_t B, int64_t S, int64_t H,
                                   int64_t D);

/* Rows [s0, s0+rows) of head h of batch b of x (dtype t, D wide) as float32: x itself when
 * t is float32 (*ld = its row stride), else converted into buf [rows][D] (*ld = D). */
const float *attn__cpu_rows_f32(const cpu_tile_ops *ops, attn__view x, attn_dtype t, int64_t b,
                                int64_t s0, int64_t h, int rows, int D, float *buf,
                                int64_t *ld);

/* Adds a finished tile to the context's statistics (thread-safe). */
void attn__cpu_count(attn_ctx_t ctx, int64_t computed, int64_t skipped, double flops);

attn_status attn__cpu_fwd(attn_ctx_t ctx, const attn__problem *pb, attn__view o, float *lse,
                          int64_t lse_rows);
attn_status attn__cpu_fwd_block(attn_ctx_t ctx, const attn__problem *pb, attn_state *st);
attn_status attn__cpu_bwd_block(attn_ctx_t ctx, const attn__problem *pb, attn__view dout,
                                const float *lse, const float *delta, int64_t lse_rows,
                                attn__view dq, attn__view dk, attn__view dv);

#endif
