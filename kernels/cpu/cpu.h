/* cpu.h — the CPU backend's internals: tile sizes, the per-tile description of masks and
 * score transforms, and the tables of ISA-specific tile primitives (scalar, AVX-512; AMX
 * or AVX512-BF16 for the bf16 tile products).
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
/* A KV group with at most this many lanes in a tile (decode: a few rows of a few heads)
 * takes the row kernels: the tile kernels compute 16 lanes at least and broadcast each K
 * and V element, the row kernels stream K and V rows once for all the lanes. Measured
 * (GQA 32/8, 32K keys, 2 threads): 16 lanes 16 ms by rows vs 21 by tiles; 32 lanes 28 vs
 * 24. */
#define CPU_ROWS_MAX 16
/* The most a bf16 forward spends on V packed once as bf16 pairs for all its query tiles
 * (the size of V itself); past it each tile packs its own. */
#define CPU_VPK_MAX_BYTES ((size_t)1 << 30)

/* Masks and transforms of one (query tile, key tile) pair, in log2 units. A tile's lanes
 * hold nh query heads of one GQA group over the same rows: lane L is row L % rows of head
 * h + L / rows (nh = 1 except for short query tiles, see attn__cpu_pack_heads). */
typedef struct {
  int partial;          /* 0: every (i, j) with i < rows is visible; 1: apply lo/hi/elem */
  int lanes;            /* lanes in use (nh * rows) rounded up to 16: lanes past it are
                         * neither computed nor read */
  int32_t lo[CPU_BR];   /* per lane: first visible key, tile-relative */
  int32_t hi[CPU_BR];   /* per lane: last visible key, tile-relative (lo > hi: none) */
  const uint8_t *elem;  /* [nj][CPU_BR] 1 = visible (block mask), or NULL */
  float softcap2;       /* cap*log2e; 0: off (then scores arrive already in log2 units) */
  int alibi;            /* 1: subtract alibi2[L] * |ipos[L] - j| */
  float alibi2[CPU_BR]; /* per lane: slope*log2e of the lane's head */
  float ipos[CPU_BR];   /* per lane: query position + off - the tile's first key position,
                         * so the ALiBi distance |ipos - j| stays exact at any length */
} cpu_tile_info;

enum { CPU_GEMM_SET = 0, CPU_GEMM_ADD = 1, CPU_GEMM_SCALE_ADD = 2 };

/* Rows a row kernel brings into cache while it computes, spread over its steps: the rows
 * the next kernel of the tile loop reads (V during the scores, the next K tile during
 * P·V). A decode tile computes for about a microsecond, several memory latencies, so a
 * phase's lead hides the misses of rows that sit a page apart (BSHD K/V). */
typedef struct {
  const char *p;  /* row 0, or NULL: nothing to bring in */
  int64_t stride; /* bytes between rows */
  int rows, bytes; /* rows, and bytes of each */
} cpu_prefetch;

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
  /* Backward: dP^T → dS^T in place: factor * P*(dP - delta) * (1 - T^2 if T); 0 where P = 0.
   * Lanes [0, lanes) of each row (lanes a multiple of 16). */
  void (*dscores)(float *dP, const float *P, const float *T, int nj, int lanes,
                  const float *delta, float factor);
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
  /* 1 when rows [rows][D] of dtype t (row stride ss elements) hold a NaN or an Inf. */
  int (*nonfinite)(const void *src, int64_t ss, attn_dtype t, int rows, int D);
  /* Row kernels, for tiles of at most CPU_ROWS_MAX lanes (decode): the lanes are rows and
   * the keys are the vector lanes. S [u][CPU_BC]: S[L][j] = sum_d K[j*ldk + d] Q[L*ldq + d]
   * for L < u, j < nj; brings pf's rows in meanwhile. */
  void (*scores_rows)(float *S, const float *K, int64_t ldk, int nj, const float *Q, int64_t ldq,
                      int u, int D, const cpu_prefetch *pf);
  /* S [u][CPU_BC] (raw scaled scores) → P in place, as softmax_fwd does for lanes; row L
   * of S and m[L], l[L], alpha[L] are lane L0 + L of ti (a KV group's lanes of a tile that
   * carries several groups). */
  void (*softmax_rows)(float *S, int nj, int u, const cpu_tile_info *ti, int L0, float *m,
                       float *l, float *alpha);
  /* O [u][ldo]: O[L] = alpha[L] O[L] + sum_j P[L*CPU_BC + j] V[j*ldv ..], d < D; a zero
   * probability adds nothing even where V holds NaN or Inf (the kernel looks itself: no
   * tile flags); brings pf's rows in meanwhile. */
  void (*pv_rows)(float *O, int64_t ldo, const float *V, int64_t ldv, int nj, const float *P,
                  int u, int D, const float *alpha, const cpu_prefetch *pf);
} cpu_tile_ops;

extern const cpu_tile_ops attn__cpu_ops_scalar;
/* NULL when the compiler could not build it. */
const cpu_tile_ops *attn__cpu_ops_avx512(void);

/* The bf16 tile kernels, forward and backward: the tile products in bf16 with float32
 * accumulation, P (and dS) rounded to bf16 for their products. Two tables: AMX tiles
 * (tile_amx.c) and AVX512-BF16 dot products (tile_dpbf16.c: Zen 4, Cooper Lake), the
 * same operands and the same roundings. Buffers: qv [Dqk/2][CPU_BR][2] (Q^T as
 * B tiles), P [CPU_BR][CPU_BC] (lanes' probabilities, bf16), kpad [32][Dqk], vv
 * [CPU_BC/2][Dv][2]; bf16 rows are raw storage (uint16_t), strides in elements. Dqk and Dv
 * are multiples of dim_align, lanes of 16, nj <= CPU_BC. */
typedef struct {
  const char *name;    /* "amx" or "avx512-bf16" */
  int dim_align;       /* the head dims it takes: multiples of this (AMX 32: a tile row) */
  void (*begin)(void); /* the tile configuration, in the thread that then calls the rest */
  void (*end)(void);
  /* qv from the lanes' rows q [u][ld] (float32 holding bf16 values); lanes past u 0 */
  void (*pack_q)(uint16_t *qv, const float *q, int64_t ld, int u, int D);
  /* S^T [nj][CPU_BR] (rows past nj may be written, up to nj rounded to 32) = K · Q^T, unscaled, for
   * lanes [0, lanes): K rows k (stride ldk) */
  void (*scores)(float *S, const uint16_t *k, int64_t ldk, int nj, const uint16_t *qv,
                 int lanes, int D, uint16_t *kpad);
  /* As softmax_fwd on S^T times sscale (the raw products' scale), writing P as bf16
   * (keys past nj up to a multiple of 32 set to 0) */
  void (*softmax)(float *S, int nj, const cpu_tile_info *ti, float sscale, float *m, float *l,
                  float *alpha, uint16_t *P);
  /* O rows [lanes][D]: O = alpha O + P · V, V's pairs in vv (pack_pairs of its nj rows);
   * safe: V holds NaN or Inf, so a zero probability must add nothing: then from V's rows
   * v (stride ldv) without the tile products, vv unused */
  void (*pv)(float *O, int D, const uint16_t *P, const uint16_t *vv, const uint16_t *v,
             int64_t ldv, int nj, int lanes, const float *alpha, int safe);
  /* The backward's. Lanes as B tiles (a product over d): dst [D/2][CPU_BR][2] from bf16
   * rows src [rows][ld]; lanes from rows up to a multiple of 32 zero. */
  void (*pack_lanes)(uint16_t *dst, const uint16_t *src, int64_t ld, int rows, int D);
  /* Row pairs as B tiles (a product over rows): dst [n32/2][D][2] from rows src [n][ld],
   * zero rows from n up to n32 (n rounded up to 32). */
  void (*pack_pairs)(uint16_t *dst, const uint16_t *src, int64_t ld, int n, int D);
  /* C [M][N] (float32, row stride ldc) += A [M][K] (bf16 rows, stride lda) · B (pack_pairs
   * of K rows N wide); M a multiple of 16, N of dim_align, K of 32. */
  void (*gemm)(float *C, int64_t ldc, const uint16_t *A, int64_t lda, const uint16_t *B, int M,
               int N, int K);
  /* S^T times sscale → P^T in place as probs_bwd does, and as bf16 Pt [nj][CPU_BR]; P is 0
   * in lanes whose lse2 is +inf (unused) and in lanes [lanes, lanes rounded up to 32). */
  void (*probs)(float *S, int nj, const cpu_tile_info *ti, float sscale, const float *lse2,
                float *T, uint16_t *Pt);
  /* dP^T → dS^T as bf16 both ways: dSt [nj][CPU_BR] (lanes to a multiple of 32, zero past
   * lanes) and dS [CPU_BR][CPU_BC] (lanes' rows, keys to a multiple of 32, zero past nj);
   * keep: also dS^T in float32 into dP in place, as dscores does (the safe dQ reads it). */
  void (*dscores)(float *dP, const float *P, const float *T, int nj, int lanes,
                  const float *delta, float factor, int keep, uint16_t *dSt, uint16_t *dS);
} cpu_bf16_ops;

/* NULL when the CPU has no AMX-BF16 or the kernel does not grant its tile state. */
const cpu_bf16_ops *attn__cpu_amx(void);
/* NULL when the CPU has no AVX512-BF16. */
const cpu_bf16_ops *attn__cpu_dpbf16(void);

typedef struct {
  const cpu_tile_ops *ops;
  const cpu_bf16_ops *bf16; /* the bf16 tile products, or NULL (cfg.cpu_amx) */
  int threads;
} cpu_backend;

/* The bf16 tile products for pb: be's unit when pb is bf16 with head dims it takes, else
 * NULL (the float32 arithmetic). */
static inline const cpu_bf16_ops *attn__cpu_bf16_for(const cpu_backend *be,
                                                     const attn__problem *pb) {
  const cpu_bf16_ops *u = be->bf16;
  if (!u || pb->dtype != ATTN_BF16) return NULL;
  return pb->Dqk % u->dim_align == 0 && pb->Dv % u->dim_align == 0 ? u : NULL;
}

/* One contiguous run of query rows of one sequence against its keys (varlen splits a
 * block into several; otherwise there is one). Rows/keys are block-local indices. */
typedef struct {
  int64_t r0, r1;     /* local query rows */
  int64_t c0, c1;     /* local keys of the same sequence */
  int64_t qpos_row0;  /* sequence-local position of local row 0 */
  int64_t kpos_col0;  /* sequence-local position of local key 0 */
  int64_t off;        /* len_kv - len_q of the sequence */
  int64_t len_kv;     /* keys in the sequence */
  int32_t batch1;     /* 0: every batch; b + 1: batch b only (a KV cache's used lengths) */
} cpu_segment;

/* Segments of pb (caller frees *out): one per varlen sequence, one per batch with used
 * lengths (pb->kv_used), else one. */
attn_status attn__cpu_segments(const attn__problem *pb, cpu_segment **out, int *count);

/* The factor Q is packed with: scores come out in log2 units, or as s/cap for softcap
 * (whose tanh comes first; the cap*log2e factor is applied after it). */
static inline float attn__cpu_q_scale(const attn__problem *pb) {
  return pb->softcap > 0.0f ? pb->scale / pb->softcap : pb->scale * CPU_LOG2E;
}

/* Key splits so that `units` work units become about `threads`: ceil(threads / units),
 * within [1, max_splits]. */
static inline int attn__cpu_splits(int64_t units, int threads, int64_t max_splits) {
  int64_t s = units > 0 ? (threads + units - 1) / units : 1;
  if (s > max_splits) s = max_splits;
  return s < 1 ? 1 : (int)s;
}

/* Query heads that share a tile's lanes when it has `rows` rows: all of a GQA group's
 * that fit in CPU_BR lanes (1 for full tiles), so decode and short varlen sequences load
 * each K/V tile once for the group instead of once a head. When a whole group takes the
 * row kernels (G * rows <= CPU_ROWS_MAX), several whole groups (up to CPU_BR lanes): the
 * tile loop then visits their KV heads in turn, so it reads every K/V row of a key range
 * (BSHD: the heads of a key sit side by side in one page) at about the same time. */
int attn__cpu_pack_heads(const attn__problem *pb, int rows);

/* Fills ti for local rows [r0, r0+rows) x local keys [c0, c1) of seg for heads
 * h..h+nh-1 (nh * rows <= CPU_BR); returns 0 when no pair is visible (skip the tile).
 * elem_buf [CPU_BC*CPU_BR] backs ti->elem. */
int attn__cpu_tile_info(const attn__problem *pb, const cpu_segment *seg, int64_t h, int nh,
                        int64_t r0, int rows, int64_t c0, int64_t c1, cpu_tile_info *ti,
                        uint8_t *elem_buf);

/* Visible local key range [*c0, *c1) for rows [r0, r0+rows) of seg (empty if c0 >= c1). */
void attn__cpu_key_range(const attn__problem *pb, const cpu_segment *seg, int64_t r0, int rows,
                         int64_t *c0, int64_t *c1);

/* Which key tiles of x [B, S, H, D] (dtype t) hold a NaN or an Inf: those tiles take the
 * safe GEMM, so that masked non-finite values cannot leak. Looked at lazily, when a kernel
 * first needs a tile (decode reads K/V once; a pass over all of it up front cost as much
 * as the attention), by whichever thread gets there: the answer is the same for all. */
typedef struct {
  attn__view x;
  attn_dtype t;
  int64_t S, H, D, nt;
  uint8_t *flag; /* [B][H][nt]: 0 not looked at yet, 1 finite, 2 holds NaN or Inf */
  /* a KV cache's used lengths (global keys, [B]) and x's first key position: rows past
   * them are not looked at (they may hold anything, or lie in no page); NULL: all */
  const int32_t *kv_used;
  int64_t k_pos0;
} cpu_tile_flags;

attn_status attn__cpu_flags_init(cpu_tile_flags *f, attn__view x, attn_dtype t, int64_t B,
                                 int64_t S, int64_t H, int64_t D);
void attn__cpu_flags_free(cpu_tile_flags *f);
/* 1 when key tile `tile` (rows tile*CPU_BC ..) of batch b, head h holds a NaN or an Inf. */
int attn__cpu_tile_nonfinite(const cpu_tile_flags *f, const cpu_tile_ops *ops, int64_t b,
                             int64_t h, int64_t tile);

/* Rows [s0, s0+rows) of head h of batch b of x (dtype t, D wide) as float32: x itself when
 * t is float32 and the rows lie evenly strided (*ld = its row stride; a paged view: within
 * one page), else converted or gathered into buf [rows][D] (*ld = D). */
const float *attn__cpu_rows_f32(const cpu_tile_ops *ops, attn__view x, attn_dtype t, int64_t b,
                                int64_t s0, int64_t h, int rows, int D, float *buf,
                                int64_t *ld);

/* Rows to lanes: rows [s0, s0+rows) of heads h..h+nh-1 of batch b of x (dtype t, D wide)
 * as float32 [nh*rows][*ld], lane L = row L % rows of head h + L / rows: x itself for one
 * float32 head, else gathered (and converted) into buf [nh*rows][D] (*ld = D). */
const float *attn__cpu_lane_rows(const cpu_tile_ops *ops, attn__view x, attn_dtype t, int64_t b,
                                 int64_t s0, int64_t h, int nh, int rows, int D, float *buf,
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
