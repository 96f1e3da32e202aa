/* f32_common.cuh — what the float32 flash kernels (SIMT: FFMA, no tensor cores; fwd_f32.cu,
 * bwd_f32.cu) share: the thread layout, row loads into padded shared memory with zero fill,
 * and a query row's visible keys.
 *
 * Head dims are read at run time (any multiple of 8 up to FA_F32_DMAX). FA_F32_TPR threads
 * work on one row (a query row, or a key in the dK/dV kernel): for a score tile each takes
 * the tile's columns l, l + 8, l + 16, ..; for a [row][D] accumulator each owns the column
 * pairs 2l + 16k, 2l + 16k + 1. Shared-memory rows have an odd stride (D + 1), so the 8 rows
 * that a row group reads at one column fall in 8 different banks. */
#ifndef ATTN_CUDA_F32_COMMON_CUH
#define ATTN_CUDA_F32_COMMON_CUH

#include <math.h>
#include <string.h>

#include "geometry.cuh"
#include "traits.h"

#define F32_THREADS (32 * FA_F32_WARPS)
#define F32_ROWS (F32_THREADS / FA_F32_TPR) /* rows per CTA (and keys per dK/dV CTA) */
#define F32_BN FA_F32_BN                    /* keys (or query rows) per score tile */
#define F32_NS (F32_BN / FA_F32_TPR)        /* score columns per thread */
#define F32_NP (FA_F32_DMAX / 16)           /* accumulator column pairs per thread */

#if F32_ROWS != F32_BN
#error "the float32 kernels' score tiles are square (rows x keys)"
#endif

FA_DEV const float *f32_at(const attn_cuda_view &v, int64_t b, int64_t s, int64_t h) {
  return (const float *)v.p + b * v.sb + s * v.ss + h * v.sh;
}

/* Rows [0, nrows) of a [nrows][D] tile from global rows src + r*stride where KEEP (an
 * expression of r_), zero elsewhere; shared-memory row stride D + 1. All threads take part. */
#define F32_LOAD_ROWS(dst, src, stride, D, nrows, tid, KEEP)                  \
  do {                                                                       \
    for (int i_ = (tid); i_ < (nrows) * (D); i_ += F32_THREADS) {            \
      const int r_ = i_ / (D), c_ = i_ % (D);                                \
      (dst)[r_ * ((D) + 1) + c_] = (KEEP) ? (src)[r_ * (stride) + c_] : 0.0f; \
    }                                                                        \
  } while (0)

/* The K and V rows of key tile [ca, cb) into sK [F32_BN][Dq+1] and sV [F32_BN][Dv+1]:
 * zero past cb and for keys no query row [R0, R0 + rows) sees (so NaN/Inf in masked K/V
 * never reaches a product; only a block mask leaves such keys in a tile:
 * fa_ktile_all_seen). All threads take part. */
#define F32_LOAD_KV_TILE(p, s, cur, ca, cb, gK, gV, sK, sV, Dq, Dv, R0, rows, tid)              \
  do {                                                                                        \
    F32_LOAD_ROWS(sK, (gK) + (int64_t)(ca) * (p).k.ss, (p).k.ss, Dq, F32_BN, tid,             \
                  r_ < (cb) - (ca) &&                                                         \
                      (fa_ktile_all_seen(cur) || fa_key_seen(p, (p).causal, s, (ca) + r_, R0, (R0) + (rows) - 1))); \
    F32_LOAD_ROWS(sV, (gV) + (int64_t)(ca) * (p).v.ss, (p).v.ss, Dv, F32_BN, tid,             \
                  r_ < (cb) - (ca) &&                                                         \
                      (fa_ktile_all_seen(cur) || fa_key_seen(p, (p).causal, s, (ca) + r_, R0, (R0) + (rows) - 1))); \
  } while (0)

/* One side (view: (p).k or (p).v) of a paged tile: rows [ca, cb) of batch b, KV head hk,
 * through the block table (fa_kv_offset; an entry outside the pool as zeros) into
 * sX [F32_BN][D+1]; zeros where F32_LOAD_KV_TILE puts them. */
#define F32_LOAD_PAGED_ROWS(p, view, s, cur, ca, cb, b, hk, sX, D, R0, rows, tid)             \
  do {                                                                                        \
    for (int i_ = (tid); i_ < F32_BN * (D); i_ += F32_THREADS) {                              \
      const int r_ = i_ / (D), c_ = i_ % (D);                                                 \
      int64_t o_ = -1;                                                                        \
      if (r_ < (cb) - (ca) &&                                                                 \
          (fa_ktile_all_seen(cur) || fa_key_seen(p, (p).causal, s, (ca) + r_, R0, (R0) + (rows) - 1)))    \
        o_ = fa_kv_offset(p, view, b, hk, (ca) + r_);                                         \
      (sX)[r_ * ((D) + 1) + c_] = o_ >= 0 ? ((const float *)(view).p)[o_ + c_] : 0.0f;        \
    }                                                                                         \
  } while (0)

/* F32_LOAD_KV_TILE through a KV cache's block table (p.pages). */
#define F32_LOAD_PAGED_KV_TILE(p, s, cur, ca, cb, b, hk, sK, sV, Dq, Dv, R0, rows, tid)         \
  do {                                                                                        \
    F32_LOAD_PAGED_ROWS(p, (p).k, s, cur, ca, cb, b, hk, sK, Dq, R0, rows, tid);              \
    F32_LOAD_PAGED_ROWS(p, (p).v, s, cur, ca, cb, b, hk, sV, Dv, R0, rows, tid);              \
  } while (0)

/* x . y over D columns of two shared-memory rows. */
FA_DEV float f32_dot(const float *x, const float *y, int D) {
  float acc = 0.0f;
  for (int d = 0; d < D; d++) acc = fmaf(x[d], y[d], acc);
  return acc;
}

/* acc[k] (column pair 2l + 16k) += w * row[2l + 16k], row[2l + 16k + 1] for columns < D. */
FA_DEV void f32_axpy(float (&acc)[F32_NP][2], float w, const float *row, int l, int D) {
  FA_UNROLL
  for (int k = 0; k < F32_NP; k++) {
    const int c = 16 * k + 2 * l;
    if (c < D) {
      acc[k][0] = fmaf(w, row[c], acc[k][0]);
      acc[k][1] = fmaf(w, row[c + 1], acc[k][1]);
    }
  }
}

/* One query row as a thread sees it: visible local keys [lo, hi], the ALiBi origin (row
 * position + off in local key coordinates) and the block-mask query block. */
struct f32_qrow {
  int lo, hi, ipos, qblk;
};

FA_DEV f32_qrow f32_qrow_make(const fa_params &p, const fa_seg &s, int r, int valid) {
  f32_qrow q;
  q.lo = (int)p.skv;
  q.hi = -1;
  if (valid) fa_row_keys(p, p.causal, s, r, q.lo, q.hi);
  q.ipos = r + s.qpos_row0 + s.off - s.kpos_col0;
  q.qblk = p.bm ? (r + s.qpos_row0) / p.bq : 0;
  return q;
}

/* Whether local key `key` (below the tile end cb) is visible to the row. */
FA_DEV int f32_visible(const fa_params &p, const fa_seg &s, const f32_qrow &q, int key, int cb) {
  int vis = key >= q.lo && key <= q.hi && key < cb;
  if (vis && p.bm) vis = fa_bm_at(p, q.qblk, (key + s.kpos_col0) / p.bk);
  return vis;
}

#endif
