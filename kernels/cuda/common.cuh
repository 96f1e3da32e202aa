/* common.cuh — what every flash kernel instance includes first: the instance macros
 * checked, dtype-specific primitive names, the tile shapes, tile loads (cp.async with
 * zero fill) and the mma kernels' per-warp tile classification.
 *
 * An instance .cu defines FA_HDQK, FA_HDV, FA_BF16 (1 bf16, 0 f16), FA_CAUSAL and
 * FA_SUFFIX (e.g. hd128_bf16_causal) and includes fwd_body.cuh or bwd_body.cuh.
 *
 * The first part — the launchers' parameter set-up, varlen tile grids and FA_LAUNCH_SMEM —
 * is shared with the float32 kernels, which take it alone (they define
 * FA_COMMON_LAUNCH_ONLY before including this file). */
#ifndef ATTN_CUDA_COMMON_LAUNCH
#define ATTN_CUDA_COMMON_LAUNCH
#include "geometry.cuh"

/* The forward launchers' parameters: outputs, and the carried state in block mode. */
static inline fa_params fa_fwd_params(const fa_call *c) {
  fa_params p = fa_params_make(c);
  p.o = c->o;
  p.lse = c->lse;
  p.lse_rows = c->lse_rows;
  if (c->st) {
    p.block_mode = 1;
    p.st_m = c->st->m;
    p.st_l = c->st->l;
    p.st_acc = c->st->acc;
    p.st_rows = c->st->rows;
  }
  if (c->pack > 1) p.pack = c->pack;
  if (c->nsplit > 1) {
    const int64_t rows = FA_PART_ROWS(c->pb);
    p.nsplit = c->nsplit;
    p.part_m = c->part;
    p.part_l = c->part + c->nsplit * rows;
    p.part_acc = c->part + 2 * c->nsplit * rows;
  }
  return p;
}

/* The backward launchers' parameters (dQ fused into the dK/dV kernel unless deterministic). */
static inline fa_params fa_bwd_params(const fa_call *c) {
  fa_params p = fa_params_make(c);
  p.dout = c->dout;
  p.lse_in = c->lse_in;
  p.delta = c->delta;
  p.lse_rows = c->lse_rows;
  p.dq = c->dq;
  p.dk = c->dk;
  p.dv = c->dv;
  p.fuse_dq = !c->deterministic;
  p.dq_sem = NULL; /* the sm90 launcher sets it for a deterministic dQ */
  return p;
}

/* A query-major grid of tiles of `tile` rows: *grid CTAs, p->ntiles; under varlen one more
 * CTA per sequence and the tile table (built on the stream) in p->table. 0 or a
 * cudaError_t value. */
static inline int fa_query_grid(fa_params *p, const fa_call *c, int32_t tile, int64_t *grid) {
  const attn_cuda_problem *pb = c->pb;
  *grid = (pb->sq + tile - 1) / tile;
  p->table = NULL;
  if (pb->num_seqs) {
    int err = attn_cuda__build_tiles(pb->cu_seqlens_q, pb->num_seqs, pb->q_pos0, pb->sq, NULL, 0,
                                     0, 0, tile, c->tiles_q, c->stream);
    if (err) return err;
    p->table = c->tiles_q;
    *grid += pb->num_seqs;
  }
  p->ntiles = *grid;
  return 0;
}

/* The same over key tiles (the dK/dV kernels): only sequences with queries in the call. */
static inline int fa_key_grid(fa_params *p, const fa_call *c, int32_t tile, int64_t *grid) {
  const attn_cuda_problem *pb = c->pb;
  *grid = (pb->skv + tile - 1) / tile;
  p->table = NULL;
  if (pb->num_seqs) {
    int err = attn_cuda__build_tiles(pb->cu_seqlens_kv, pb->num_seqs, pb->k_pos0, pb->skv,
                                     pb->cu_seqlens_q, pb->q_pos0, pb->sq, 1, tile, c->tiles_k,
                                     c->stream);
    if (err) return err;
    p->table = c->tiles_k;
    *grid += pb->num_seqs;
  }
  p->ntiles = *grid;
  return 0;
}

/* Launches kern with smem bytes of dynamic shared memory on stream, raising the kernel's
 * shared-memory limit to smem first; err (an int) gets 0 or the cudaError_t value of the
 * attribute call or the launch. The emulator has no such limit and no launch errors. */
#ifndef ATTN_CUDA_EMULATE
#define FA_LAUNCH_SMEM(err, kern, grid, block, smem, stream, ...)                            \
  do {                                                                                      \
    (err) = (int)cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,    \
                                      (int)(smem));                                         \
    if ((err) == 0) {                                                                       \
      FA_LAUNCH(kern, grid, block, smem, stream, __VA_ARGS__);                              \
      (err) = (int)cudaGetLastError();                                                      \
    }                                                                                       \
  } while (0)
#else
#define FA_LAUNCH_SMEM(err, kern, grid, block, smem, stream, ...) \
  do {                                                          \
    FA_LAUNCH(kern, grid, block, smem, stream, __VA_ARGS__);    \
    (err) = 0;                                                  \
  } while (0)
#endif
#endif

#if !defined(FA_COMMON_LAUNCH_ONLY) && !defined(ATTN_CUDA_COMMON_CUH)
#define ATTN_CUDA_COMMON_CUH

#if !defined(FA_HDQK) || !defined(FA_HDV) || !defined(FA_BF16) || !defined(FA_CAUSAL) || \
    !defined(FA_SUFFIX)
#error "define FA_HDQK, FA_HDV, FA_BF16, FA_CAUSAL and FA_SUFFIX before including a body"
#endif
#if FA_HDQK % 16 != 0 || FA_HDV % 16 != 0
#error "head dims must be multiples of 16"
#endif

#include <math.h>
#include <string.h>

#include "geometry.cuh"
#include "traits.h"

#define FA_PASTE2(a, b) a##b
#define FA_PASTE(a, b) FA_PASTE2(a, b)
#define FA_FN(prefix) FA_PASTE(prefix, FA_SUFFIX) /* FA_FN(flash_fwd_) */

#if FA_BF16
#define fa_mma fa_mma_bf16
#define fa_pack fa_pack_bf16
#else
#define fa_mma fa_mma_f16
#define fa_pack fa_pack_f16
#endif

#define DQK FA_HDQK
#define DV FA_HDV
#define SQK (DQK + FA_PAD) /* shared-memory row stride of Q/K tiles, elements */
#define SV (DV + FA_PAD)   /* of V / dO tiles */

/* Loads key tile T (K and V rows [T.ca, T.cb)) into buffer BUF of sK/sV; rows outside the
 * tile or seen by no query position R0..rlast of the CTA are zero-filled, so NaN/Inf in
 * them cannot reach a product. PAGED (a forward's p.pages != NULL; 0 elsewhere, which
 * compiles the paged loop away): the rows come through the KV cache's block table
 * (fa_kv_offset), an entry outside the pool as zeros. ALL: a tile of BN keys, all seen
 * (fa_ktile_all_seen: every tile but the last of the range and a block mask's mixed ones,
 * decode steps' too), takes FA_LOAD_ROWS_ALL, with no test a row (0 where its addresses in
 * flight would not fit the register budget).
 * Uses gK, gV, sK, sV, p, s, R0, rlast, tid, b, hk of the kernel. */
#define FA_LOAD_KV_TILE(T, BUF, BN, NTHREADS, PAGED, ALL)                                        \
  do {                                                                                        \
    const fa_ktile &T_ = (T);                                                                 \
    if (PAGED) {                                                                              \
      FA_LOAD_PAGED_ROWS(sK + (BUF) * (BN) * SQK, SQK, p.k, gK, DQK, BN, NTHREADS, T_);       \
      FA_LOAD_PAGED_ROWS(sV + (BUF) * (BN) * SV, SV, p.v, gV, DV, BN, NTHREADS, T_);          \
      break;                                                                                  \
    }                                                                                         \
    const fa_elem *k_ = gK + (int64_t)T_.ca * p.k.ss, *v_ = gV + (int64_t)T_.ca * p.v.ss;      \
    if ((ALL) && T_.cb - T_.ca == (BN) && fa_ktile_all_seen(T_)) { /* every row present and seen */ \
      FA_LOAD_ROWS_ALL(sK + (BUF) * (BN) * SQK, SQK, k_, p.k.ss, DQK, BN, NTHREADS, tid);     \
      FA_LOAD_ROWS_ALL(sV + (BUF) * (BN) * SV, SV, v_, p.v.ss, DV, BN, NTHREADS, tid);        \
      break;                                                                                  \
    }                                                                                         \
    FA_LOAD_ROWS(sK + (BUF) * (BN) * SQK, SQK, k_, p.k.ss, DQK, BN, NTHREADS, tid, FA_KV_KEEP(T_, r_)); \
    FA_LOAD_ROWS(sV + (BUF) * (BN) * SV, SV, v_, p.v.ss, DV, BN, NTHREADS, tid, FA_KV_KEEP(T_, r_));    \
  } while (0)

/* Whether row r_ of key tile T_ loads (else zeros): present, and seen by a row of the CTA
 * (fa_ktile_all_seen, else fa_key_seen key by key). T_.full, which implies all seen, is
 * tested first: without it the 2-CTA kernel at d = 64 spilled 128 B (ptxas, CUDA 13,
 * sm_90a). Uses p, s, R0, rlast of the kernel. */
#define FA_KV_KEEP(T_, r_) \
  ((r_) < (T_).cb - (T_).ca && ((T_).full || fa_ktile_all_seen(T_) || fa_key_seen(p, FA_CAUSAL, s, (T_).ca + (r_), R0, rlast)))

/* The paged half of FA_LOAD_KV_TILE: rows of view V (p.k or p.v) through the block
 * table; G, any valid address, is the source of the zero fills. */
#define FA_LOAD_PAGED_ROWS(dst, ld, V, G, D, BN, NTHREADS, T_)                                \
  do {                                                                                        \
    for (int i_ = tid; i_ < (BN) * ((D) / 8); i_ += (NTHREADS)) {                             \
      const int r_ = i_ / ((D) / 8), c_ = i_ % ((D) / 8);                                     \
      int64_t o_ = -1;                                                                        \
      if (FA_KV_KEEP(T_, r_)) o_ = fa_kv_offset(p, V, b, hk, T_.ca + r_);                      \
      fa_cp_async16((dst) + r_ * (ld) + c_ * 8,                                               \
                    o_ >= 0 ? (const fa_elem *)(V).p + o_ + c_ * 8 : (G), o_ >= 0);           \
    }                                                                                         \
  } while (0)

/* The m-tile loops below take MS 16-row m-tiles of A at once, each fragment of B loaded
 * once for all of them; SUB(X, ms) names m-tile ms's part of X: FA_ONE, X itself (one
 * m-tile), or FA_EACH, X[ms]. */
#define FA_ONE(X, ms) X
#define FA_EACH(X, ms) X[ms]

/* C[n] += A B_n^T for the NN / 8 n-blocks of C: A the 16-column A fragment a, B_n the 8
 * rows n*8.. of tile (row stride LD elements), their 16 columns kk*16.. (by ldmatrix,
 * two n-blocks a load); FA_MMA_ABT_M: for MS m-tiles, SUB(C, ms) and SUB(a, ms). */
#define FA_MMA_ABT_M(C, a, MS, SUB, NN, tile, LD, kk)                                       \
  do {                                                                                      \
    FA_UNROLL                                                                               \
    for (int n_ = 0; n_ < (NN) / 8; n_ += 2) {                                              \
      uint32_t b_[4];                                                                       \
      fa_ldsm_x4(b_, (tile) + (n_ * 8 + (lane >> 4) * 8 + (lane & 7)) * (LD) + (kk) * 16 +  \
                         ((lane >> 3) & 1) * 8);                                            \
      FA_UNROLL                                                                             \
      for (int ms_ = 0; ms_ < (MS); ms_++) {                                                \
        fa_mma(SUB(C, ms_)[n_], SUB(a, ms_), b_[0], b_[1]);                                 \
        fa_mma(SUB(C, ms_)[n_ + 1], SUB(a, ms_), b_[2], b_[3]);                             \
      }                                                                                     \
    }                                                                                       \
  } while (0)
#define FA_MMA_ABT(C, a, NN, tile, LD, kk) FA_MMA_ABT_M(C, a, 1, FA_ONE, NN, tile, LD, kk)

/* acc[n] += A B over K = KN: A from score registers S[KN/8][4] (an mma C layout is the A
 * layout, packed in pairs), B = KN rows x DN columns of a shared-memory tile at `tile`
 * (row stride LD elements) by ldmatrix.trans. Used for O += P V and dQ += dS K.
 * FA_MMA_SCORES_SMEM_M: for MS m-tiles, SUB(acc, ms) and SUB(S, ms) (FA_MMA_ABT_M). */
#define FA_MMA_SCORES_SMEM_M(acc, S, MS, SUB, KN, DN, tile, LD)                             \
  do {                                                                                      \
    FA_UNROLL                                                                               \
    for (int kc_ = 0; kc_ < (KN) / 16; kc_++) {                                             \
      uint32_t a_[MS][4];                                                                   \
      FA_UNROLL                                                                             \
      for (int ms_ = 0; ms_ < (MS); ms_++) {                                                \
        a_[ms_][0] = fa_pack(SUB(S, ms_)[2 * kc_][0], SUB(S, ms_)[2 * kc_][1]);             \
        a_[ms_][1] = fa_pack(SUB(S, ms_)[2 * kc_][2], SUB(S, ms_)[2 * kc_][3]);             \
        a_[ms_][2] = fa_pack(SUB(S, ms_)[2 * kc_ + 1][0], SUB(S, ms_)[2 * kc_ + 1][1]);     \
        a_[ms_][3] = fa_pack(SUB(S, ms_)[2 * kc_ + 1][2], SUB(S, ms_)[2 * kc_ + 1][3]);     \
      }                                                                                     \
      FA_UNROLL                                                                             \
      for (int n_ = 0; n_ < (DN) / 8; n_ += 2) {                                            \
        uint32_t b_[4];                                                                     \
        fa_ldsm_x4_t(b_, (tile) + (kc_ * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * (LD) +  \
                             n_ * 8 + (lane >> 4) * 8);                                     \
        FA_UNROLL                                                                           \
        for (int ms_ = 0; ms_ < (MS); ms_++) {                                              \
          fa_mma(SUB(acc, ms_)[n_], a_[ms_], b_[0], b_[1]);                                 \
          fa_mma(SUB(acc, ms_)[n_ + 1], a_[ms_], b_[2], b_[3]);                             \
        }                                                                                   \
      }                                                                                     \
    }                                                                                       \
  } while (0)
#define FA_MMA_SCORES_SMEM(acc, S, KN, DN, tile, LD) \
  FA_MMA_SCORES_SMEM_M(acc, S, 1, FA_ONE, KN, DN, tile, LD)

typedef uint16_t fa_elem; /* bf16 or f16 bits */

/* One online-softmax step of a thread's two rows (an m16n8 / m64nN accumulator fragment:
 * the 4 lanes of a quad share a row): mx, the tile's row max of this thread's scores
 * (log2 units), is reduced over the quad; alpha = 2^(m_old - m_new) rescales l (and, by the
 * caller, the accumulator); mu is the max to subtract from this tile's scores — 0 for a row
 * with nothing visible yet, so P = 0 there, not NaN. */
FA_DEV void fa_online_step(float (&mx)[2], float (&m)[2], float (&l)[2], float (&alpha)[2],
                           float (&mu)[2]) {
  FA_UNROLL
  for (int i = 0; i < 2; i++) {
    mx[i] = fmaxf(mx[i], fa_shfl_xor(mx[i], 1));
    mx[i] = fmaxf(mx[i], fa_shfl_xor(mx[i], 2));
    mu[i] = mx[i] == -INFINITY ? 0.0f : mx[i];
    alpha[i] = exp2f(m[i] - mu[i]);
    m[i] = mx[i];
    l[i] *= alpha[i];
  }
}

/* 2^x: the approximate MUFU instruction (CUDA's exp2f is the same, with extra work for
 * results below 2^-126, which P can do without); exact on the emulator. */
#ifndef ATTN_CUDA_EMULATE
FA_DEV float fa_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
#else
FA_DEV float fa_exp2(float x) { return exp2f(x); }
#endif

/* Element x of a thread's NS-float accumulator fragment — mma.sync m16n8 tiles S[n][e] as
 * S[4n + e], or a wgmma m64nN one: row i = FA_FRAG_ROW(x) (0: g, 1: g + 8), tile column
 * FA_FRAG_COL(x, tg). The element-wise passes below take the fragment whole, with every
 * uniform choice outside their element loops: each loop is then one basic block that
 * ptxas can interleave, where a test per element would split it into a chain of small
 * ones (and run the branch, or the predicated-off softcap, 32 times a tile). */
#define FA_FRAG_ROW(x) (((x) >> 1) & 1)
#define FA_FRAG_COL(x, tg) (((x) >> 2) * 8 + 2 * (tg) + ((x) & 1))

/* S (scores in log2 units after a multiplication by sc > 0, masked) -> P = 2^(score - mu)
 * in place, with the online-softmax step of the thread's two rows; maxima and sums run in
 * CHAINS chains a row (two: more ILP, for the sm90 kernel; one: two registers fewer, where
 * the mma.sync kernels have none to spare). Without softcap and ALiBi the caller passes the raw dot products and
 * sc = p.sc (the row max is taken on S, the scale goes into the FMA before the exp2), else
 * fa_score_tile's scores and 1. */
template <int NS, int CHAINS>
FA_DEV void fa_exp_rows(float *S, float sc, float (&m)[2], float (&l)[2], float (&alpha)[2]) {
  static_assert(CHAINS == 1 || CHAINS == 2, "chains a row");
  const int ch = CHAINS == 2 ? 3 : 2; /* element x's [row i][chain], the chain bit masked */
  float mx[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
  FA_UNROLL
  for (int x = 0; x < NS; x++) mx[x & ch] = fmaxf(mx[x & ch], S[x]);
  float top[2] = {fmaxf(m[0], fmaxf(mx[0], mx[1]) * sc), fmaxf(m[1], fmaxf(mx[2], mx[3]) * sc)};
  float mu[2];
  fa_online_step(top, m, l, alpha, mu);
  float ls[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  FA_UNROLL
  for (int x = 0; x < NS; x++) {
    const float pv = fa_exp2(fmaf(S[x], sc, -mu[FA_FRAG_ROW(x)]));
    S[x] = pv;
    ls[x & ch] += pv;
  }
  l[0] += ls[0] + ls[1];
  l[1] += ls[2] + ls[3];
}

/* Raw dot products -> scores in log2 units (fa_score's softcap and ALiBi; alibi2 by row, 0
 * for a head without a slope; the distance of column c is |base[i] - c|, in integers: a
 * float column would be 16 registers held across the kernel), each transform one loop
 * under its uniform test. */
template <int NS>
FA_DEV void fa_score_tile(const fa_params &p, float *S, const float (&alibi2)[2],
                          const int (&base)[2], int tg) {
  if (p.cap2 > 0.0f) {
    FA_UNROLL
    for (int x = 0; x < NS; x++) S[x] = p.cap2 * tanhf(S[x] * p.sc);
  } else {
    FA_UNROLL
    for (int x = 0; x < NS; x++) S[x] *= p.sc;
  }
  if (p.alibi) {
    FA_UNROLL
    for (int x = 0; x < NS; x++) {
      const int i = FA_FRAG_ROW(x);
      S[x] -= alibi2[i] * fabsf((float)(base[i] - FA_FRAG_COL(x, tg)));
    }
  }
}

/* Block mode: the carried state of a thread's row i (state row `row`; m in natural units,
 * log2 units in registers; l whole on the quad's tg 0 lane, the other lanes' shares 0; acc
 * [Dv] float32) into m, l and the O fragment acc[4n + 2i + e] = column 8n + 2tg + e (the
 * m16n8 fragments acc[n][e] of the mma.sync kernel, the m64nN one of wgmma, alike). */
FA_DEV void fa_state_load(const fa_params &p, int64_t row, int i, int tg, float *acc,
                          float (&m)[2], float (&l)[2]) {
  m[i] = p.st_m[row] * FA_LOG2E;
  l[i] = tg == 0 ? p.st_l[row] : 0.0f;
  const float *a = p.st_acc + row * DV;
  FA_UNROLL
  for (int n = 0; n < DV / 8; n++) {
    acc[4 * n + 2 * i] = a[n * 8 + 2 * tg];
    acc[4 * n + 2 * i + 1] = a[n * 8 + 2 * tg + 1];
  }
}

/* The same back into state arrays sm / sl / sacc (the carried state, or a key split's
 * partial one), after the quad's l shares are summed (every lane holds the row's l). */
FA_DEV void fa_state_put(float *sm, float *sl, float *sacc, int64_t row, int i, int tg,
                         const float *acc, const float (&m)[2], const float (&l)[2]) {
  if (tg == 0) {
    sm[row] = m[i] / FA_LOG2E;
    sl[row] = l[i];
  }
  float *a = sacc + row * DV;
  FA_UNROLL
  for (int n = 0; n < DV / 8; n++) {
    a[n * 8 + 2 * tg] = acc[4 * n + 2 * i];
    a[n * 8 + 2 * tg + 1] = acc[4 * n + 2 * i + 1];
  }
}

FA_DEV void fa_state_store(const fa_params &p, int64_t row, int i, int tg, const float *acc,
                           const float (&m)[2], const float (&l)[2]) {
  fa_state_put(p.st_m, p.st_l, p.st_acc, row, i, tg, acc, m, l);
}

FA_DEV const fa_elem *fa_at(const attn_cuda_view &v, int64_t b, int64_t s, int64_t h) {
  return (const fa_elem *)v.p + b * v.sb + s * v.ss + h * v.sh;
}

/* Rows [0, nrows) of a [rows][D] tile from the global rows ROW (an expression in r_, the
 * tile row) where KEEP (also in r_) holds, zero elsewhere; smem row stride ld; src: any
 * valid address (the source of the zero fills). All threads of the CTA take part. */
#define FA_LOAD_ROWS_AT(dst, ld, src, ROW, D, nrows, nthreads, tid, KEEP)               \
  do {                                                                                  \
    for (int i_ = (tid); i_ < (nrows) * ((D) / 8); i_ += (nthreads)) {                  \
      const int r_ = i_ / ((D) / 8), c_ = i_ % ((D) / 8);                               \
      const int ok_ = (KEEP);                                                           \
      fa_cp_async16((dst) + r_ * (ld) + c_ * 8, ok_ ? (ROW) + c_ * 8 : (src), ok_);     \
    }                                                                                   \
  } while (0)
/* The same from rows src + r*stride. */
#define FA_LOAD_ROWS(dst, ld, src, stride, D, nrows, nthreads, tid, KEEP) \
  FA_LOAD_ROWS_AT(dst, ld, src, (src) + r_ * (stride), D, nrows, nthreads, tid, KEEP)
/* Rows [0, nrows) of a [rows][D] tile from rows src + r*stride, every one present and
 * kept: no predicate and no zero fill, unrolled (the trip count is known), the thread's
 * row and column computed once when nthreads is a multiple of a row's D/8 16-byte chunks.
 * The interior tiles' form of FA_LOAD_ROWS, whose per-chunk visibility test costs ~35
 * dependent integer instructions a 16-byte chunk (sm_90a SASS of the 8-warp forward). */
#define FA_LOAD_ROWS_ALL(dst, ld, src, stride, D, nrows, nthreads, tid)                     \
  do {                                                                                    \
    enum { CPR_ = (D) / 8, NCH_ = (nrows) * CPR_, STEP_ = (nthreads) / CPR_ };             \
    const int tr_ = (tid) / CPR_, tc_ = (tid) % CPR_;                                     \
    FA_UNROLL                                                                             \
    for (int j_ = 0; j_ < (NCH_ + (nthreads) - 1) / (nthreads); j_++) {                   \
      const int i_ = (tid) + j_ * (nthreads);                                             \
      if (NCH_ % (nthreads) != 0 && i_ >= NCH_) break;                                    \
      const int r_ = (nthreads) % CPR_ == 0 ? tr_ + j_ * STEP_ : i_ / CPR_;               \
      const int c_ = (nthreads) % CPR_ == 0 ? tc_ : i_ % CPR_;                            \
      fa_cp_async16((dst) + r_ * (ld) + c_ * 8, (src) + r_ * (int64_t)(stride) + c_ * 8, 1); \
    }                                                                                     \
  } while (0)

/* Key ranges of a query-major CTA (positions [R0, R0 + npos) of one segment, `pack` query
 * heads each: tile row r is position R0 + r / pack, head r % pack of the CTA's; pack = 1
 * but in the packed-GQA forward) as seen by one thread: the CTA's first and last
 * positions, its warp's first and last rows, the lane's vote row (lane % 16 of the warp)
 * and the thread's two accumulator rows g and g + 8. Positions grow with the row, so the
 * first and last rows bound every range. They do not depend on the key tile, so they are
 * computed once. */
struct fa_qrows {
  int lo_first, hi_first, lo_last, hi_last;
  int kc0, kc1; /* keys any row may see */
  int wn;           /* the warp's valid rows (0..16) */
  int wlo_last, whi_first, vlo, vhi;
  int lo_r[2], hi_r[2];
  int ipos[2]; /* row position + off, in local key coordinates (ALiBi distances) */
  int qblk[2]; /* block-mask query block of the row */
};

/* Row r of such a CTA (r past the rows: no keys, [skv, -1]): what fa_qrows holds of each
 * row. 16 bytes, so a kernel short of registers keeps a table of them in shared memory. */
struct fa_qrow {
  int lo, hi; /* its key range (lo > hi: none) */
  int ipos;   /* fa_qrows.ipos */
  int qblk;   /* fa_qrows.qblk */
};

FA_DEV fa_qrow fa_qrow_at(const fa_params &p, int causal, const fa_seg &s, int R0, int npos,
                          int pack, int r) {
  const int pos = R0 + r / pack;
  fa_qrow e;
  e.lo = (int)p.skv;
  e.hi = -1;
  if (r < npos * pack) fa_row_keys(p, causal, s, pos, e.lo, e.hi);
  e.ipos = pos + s.qpos_row0 + s.off - s.kpos_col0;
  e.qblk = p.bm ? (pos + s.qpos_row0) / p.bq : 0;
  return e;
}

/* The warp's and the thread's fields of q (m-tile rows wr0 .. wr0 + 15 of `rows`), row(r)
 * giving row r's fa_qrow: computed, or read from a table. */
template <class RowFn>
FA_DEV void fa_qrows_fill(int rows, int wr0, int lane, const RowFn &row, fa_qrows &q) {
  q.wn = rows - wr0 < 0 ? 0 : rows - wr0 > 16 ? 16 : rows - wr0;
  q.wlo_last = 0;
  q.whi_first = -1;
  q.vlo = 1;
  q.vhi = 0;
  if (q.wn > 0) {
    q.wlo_last = row(wr0 + q.wn - 1).lo;
    q.whi_first = row(wr0).hi;
    if ((lane & 15) < q.wn) {
      const fa_qrow v = row(wr0 + (lane & 15));
      q.vlo = v.lo;
      q.vhi = v.hi;
    }
  }
  FA_UNROLL
  for (int i = 0; i < 2; i++) {
    const fa_qrow e = row(wr0 + lane / 4 + 8 * i);
    q.lo_r[i] = e.lo;
    q.hi_r[i] = e.hi;
    q.ipos[i] = e.ipos;
    q.qblk[i] = e.qblk;
  }
}

FA_DEV void fa_qrows_init(const fa_params &p, int causal, const fa_seg &s, int R0, int npos,
                          int pack, int wr0, int lane, fa_qrows &q) {
  fa_row_keys(p, causal, s, R0, q.lo_first, q.hi_first);
  fa_row_keys(p, causal, s, R0 + npos - 1, q.lo_last, q.hi_last);
  q.kc0 = fa_max(q.lo_first, s.c0);
  q.kc1 = fa_min(q.hi_last + 1, s.c1);
  fa_qrows_fill(npos * pack, wr0, lane,
                [&](int r) { return fa_qrow_at(p, causal, s, R0, npos, pack, r); }, q);
}

/* q of m-tile rows wr0.. from a CTA's row table tab[rows] (fa_qrow_at of each row), its
 * CTA-wide fields from cta (an fa_qrows_init of the CTA's); returns q. */
FA_DEV const fa_qrows &fa_qrows_tab(const fa_qrow *tab, const fa_qrows &cta, int rows, int wr0,
                                    int lane, fa_qrows &q) {
  q.lo_first = cta.lo_first;
  q.hi_first = cta.hi_first;
  q.lo_last = cta.lo_last;
  q.hi_last = cta.hi_last;
  q.kc0 = cta.kc0;
  q.kc1 = cta.kc1;
  fa_qrows_fill(rows, wr0, lane, [&](int r) { return tab[r]; }, q);
  return q;
}

/* A warp's share of key tile t: 0 idle (nothing visible), 1 full (all 16 rows see every
 * key of a whole tile: no masking), 2 partial (mask each element). Warp-uniform. pack as
 * for fa_qrows_init. */
FA_DEV int fa_qwarp_mode(const fa_params &p, const fa_seg &s, const fa_qrows &q, int R0,
                         int pack, int wr0, const fa_ktile &t, int bn) {
  if (q.wn == 0 || !fa_any(q.vlo <= q.vhi && q.vhi >= t.ca && q.vlo <= t.cb - 1)) return 0;
  const int wbm = t.bmv == 1 ? 1
                             : fa_bm_verdict(p, s, R0 + wr0 / pack, R0 + (wr0 + q.wn - 1) / pack,
                                             t.ca, t.cb - 1);
  if (wbm == 0) return 0;
  return q.wn == 16 && t.cb - t.ca == bn && q.wlo_last <= t.ca && q.whi_first >= t.cb - 1 &&
                 wbm == 1
             ? 1
             : 2;
}

/* A partial tile (fa_qwarp_mode 2) of keys [ca, cb): the elements the thread's rows do not
 * see -> -inf, by select. The rows' bounds less 2 tg compare with constants. The block
 * mask's lookups run in a loop of their own, not unrolled: unrolled, ptxas hoists every
 * load and division and the kernel spills. There the row is not a constant, so its block
 * is picked by select (an indexed register array would go to local memory). */
template <int NS>
FA_DEV void fa_mask_tile(const fa_params &p, const fa_seg &s, const fa_qrows &q, int ca, int cb,
                         int tg, float *S) {
  static_assert(NS <= 32, "one bit an element");
  int lo[2], hi[2];
  FA_UNROLL
  for (int i = 0; i < 2; i++) {
    lo[i] = q.lo_r[i] - ca - 2 * tg;
    hi[i] = fa_min(q.hi_r[i], cb - 1) - ca - 2 * tg;
  }
  FA_UNROLL
  for (int x = 0; x < NS; x++) {
    const int i = FA_FRAG_ROW(x), c = FA_FRAG_COL(x, 0);
    S[x] = c >= lo[i] && c <= hi[i] ? S[x] : -INFINITY;
  }
  if (!p.bm) return;
  uint32_t on = 0;
FA_NO_UNROLL
  for (int x = 0; x < NS; x++) {
    const int qblk = FA_FRAG_ROW(x) ? q.qblk[1] : q.qblk[0];
    on |= (uint32_t)fa_bm_at(p, qblk, (ca + FA_FRAG_COL(x, tg) + s.kpos_col0) / p.bk) << x;
  }
  FA_UNROLL
  for (int x = 0; x < NS; x++) S[x] = (on >> x) & 1u ? S[x] : -INFINITY;
}

/* P and dS of a tile's elements in place: S, raw dot products -> P = 2^(score - L); DP,
 * dP -> dS = P (dP - D) dscale dcap (fa_score_grad; ALiBi slopes alibi2 by row at distance
 * |base[i] - column|, as fa_score_tile's). L, D: the LSE (times lsc: log2 units) and delta of the element's
 * query, by row (COL 0: L[i]) or by column (COL 1: L[c]); P and dS are 0 where the
 * element is not seen: all are in a full tile, else vis(i, c) says. A full tile without
 * softcap and ALiBi — the usual one — takes a loop with no test in it; the others test
 * element by element, as a loop of every transform without tests needs more registers
 * than the mma.sync dK/dV kernel has. exp2f, not fa_exp2: with the shorter one ptxas
 * overlaps more of the loop and the sm90 kernel at head dim 128 spills. */
FA_DEV int fa_probs_plain(const fa_params &p, int full) { return full && !(p.cap2 > 0.0f) && !p.alibi; }

/* fa_probs_tile's plain tile in two halves, for a caller whose dP is still in flight when
 * S has landed (the sm90 backward): P first, then dS from P. */
template <int NS, int COL> FA_DEV void fa_probs_p(const fa_params &p, float *S, const float *L, float lsc, int tg) {
  FA_UNROLL
  for (int x = 0; x < NS; x++) S[x] = exp2f(S[x] * p.sc - L[COL ? FA_FRAG_COL(x, tg) : FA_FRAG_ROW(x)] * lsc);
}
template <int NS, int COL> FA_DEV void fa_probs_ds(const fa_params &p, const float *P, float *DP, const float *D, int tg) {
  FA_UNROLL
  for (int x = 0; x < NS; x++) DP[x] = P[x] * (DP[x] - D[COL ? FA_FRAG_COL(x, tg) : FA_FRAG_ROW(x)]) * p.dscale;
}

template <int NS, int COL, typename V>
FA_DEV void fa_probs_tile(const fa_params &p, float *S, float *DP, const float *L, const float *D,
                          float lsc, const float (&alibi2)[2], const int (&base)[2], int tg,
                          int full, V vis) {
  if (fa_probs_plain(p, full)) {
    fa_probs_p<NS, COL>(p, S, L, lsc, tg);
    fa_probs_ds<NS, COL>(p, S, DP, D, tg);
    return;
  }
  FA_UNROLL
  for (int x = 0; x < NS; x++) {
    const int i = FA_FRAG_ROW(x), c = FA_FRAG_COL(x, tg), r = COL ? c : i;
    float dcap;
    const float sc = fa_score_grad(p, S[x], alibi2[i], fabsf((float)(base[i] - c)), dcap);
    const float pr = full || vis(i, c) ? exp2f(sc - L[r] * lsc) : 0.0f;
    S[x] = pr;
    DP[x] = pr != 0.0f ? pr * (DP[x] - D[r]) * p.dscale * dcap : 0.0f;
  }
}

#endif
