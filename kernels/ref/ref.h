/* ref.h — the float64 oracle: naive, obviously right attention forward and backward,
 * used by tests, by `attnrun --check` and by nothing on a hot path.
 *
 * Rows are fetched through a callback so that a caller holding no full tensor (a rank in
 * ring mode, regenerating inputs from the counter RNG) can check sampled rows over the
 * full sequence. attn_ref_arrays_* wrap contiguous float32 arrays. Masks follow
 * DESIGN.md §2 exactly, with positions global (0..Sq-1, 0..Skv-1; varlen: packed
 * positions described by spec->cu_seqlens_*). */
#ifndef ATTN_REF_H
#define ATTN_REF_H

#include "attnrun.h"

enum { ATTN_REF_Q = 0, ATTN_REF_K = 1, ATTN_REF_V = 2, ATTN_REF_DO = 3 };

/* Write row (b, s, h) of tensor `which` (Dqk or Dv floats) into out. */
typedef void (*attn_ref_fetch_fn)(void *user, int which, int64_t b, int64_t s, int64_t h,
                                  float *out);

typedef struct {
  const attn_spec *spec; /* Hq, Hkv, Dqk, Dv(0 → Dqk), scale(0 → 1/sqrt(Dqk)), masks... */
  int64_t batch, seq_q, seq_kv;
  attn_ref_fetch_fn fetch;
  void *user;
} attn_ref_problem;

/* Contiguous arrays q [B,Sq,Hq,Dqk], k [B,Skv,Hkv,Dqk], v [B,Skv,Hkv,Dv], dout
 * [B,Sq,Hq,Dv] (dout may be NULL for forward only). */
typedef struct {
  const float *q, *k, *v, *dout;
} attn_ref_arrays;
/* Fills p to read from a (a must outlive p). */
void attn_ref_problem_arrays(attn_ref_problem *p, const attn_spec *spec, int64_t batch,
                             int64_t seq_q, int64_t seq_kv, const attn_ref_arrays *a);

/* True iff key j is visible to query i (global positions) for head h. */
int attn_ref_visible(const attn_ref_problem *p, int64_t i, int64_t j);

/* Forward of one query row: o_row [Dv], *lse (natural log; -inf or the sink when empty). */
void attn_ref_fwd_row(const attn_ref_problem *p, int64_t b, int64_t h, int64_t i,
                      double *o_row, double *lse);

/* Full forward: o [B,Sq,Hq,Dv], lse [B,Hq,Sq]. */
void attn_ref_fwd(const attn_ref_problem *p, double *o, double *lse);

/* Backward of one query row: dq_row [Dqk]; also returns delta_i = dO_i . O_i and the
 * row's contribution to d(sink_h) (0 without sinks). Needs dout. */
void attn_ref_bwd_qrow(const attn_ref_problem *p, int64_t b, int64_t h, int64_t i,
                       double *dq_row, double *delta, double *dsink);

/* Backward of one key row of KV head hkv (summed over the query heads that read it):
 * dk_row [Dqk], dv_row [Dv]. Cost: a forward over the query rows that see key j. */
void attn_ref_bwd_krow(const attn_ref_problem *p, int64_t b, int64_t hkv, int64_t j,
                       double *dk_row, double *dv_row);

/* Full backward: dq [B,Sq,Hq,Dqk], dk [B,Skv,Hkv,Dqk], dv [B,Skv,Hkv,Dv], dsinks [Hq]
 * (may be NULL). Cost O(B*Hq*Sq*Skv*D), computed once (not row by row). */
void attn_ref_bwd(const attn_ref_problem *p, double *dq, double *dk, double *dv,
                  double *dsinks);

#endif
