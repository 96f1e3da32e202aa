/* test_layer.h — the TP layer tests' shared pieces: a case description, full-size inputs
 * every rank regenerates, a naive float64 reference of the whole layer (projections, RoPE,
 * attention through the kernels/ref oracle, W_O, and the backward), and the slicing of
 * the full problem to one rank's heads and rows. */
#ifndef ATTN_TEST_LAYER_H
#define ATTN_TEST_LAYER_H

#include "attnrun.h"
#include "ref.h"
#include "test_util.h"

typedef struct {
  const char *name;
  int64_t B, S, d;        /* batch, global sequence, d_model (B = 1 with varlen) */
  int Hq, Hkv, Dqk, Dv;   /* Dv 0 → Dqk */
  float rope;             /* rope_theta; 0 off */
  int causal;
  int64_t wl, wr;         /* window sides; both -1: none */
  int sinks, alibi;
  float softcap;
  int nseq;               /* varlen: sequence lengths in lens (sum = S) */
  const int32_t *lens;
  attn_cp_layout layout;
  int integer;            /* small-integer x, W_k, W_v, W_o, dy and W_q = 0 (exact path) */
  int adt;                /* attention_dtype ATTN_BF16 / ATTN_F16; 0: the layer's default */
  uint64_t seed;
} tl_case;

/* The full problem (every rank holds all of it; sizes are small). */
typedef struct {
  tl_case c;
  int64_t Dv;
  attn_spec spec;                 /* global spec */
  float *x, *dy;                  /* [B, S, d] */
  float *wq, *wk, *wv;            /* [d, Hq*Dqk], [d, Hkv*Dqk], [d, Hkv*Dv] */
  float *wo;                      /* [Hq*Dv, d] */
  float *sinks, *alibi;           /* [Hq] or NULL */
  int32_t *cu;                    /* [nseq + 1] or NULL */
  double *y, *dx;                 /* [B, S, d] reference */
  double *dwq, *dwk, *dwv, *dwo;  /* reference weight gradients, shaped like the weights */
} tl_prob;

void tl_init(tl_prob *P, const tl_case *c);
void tl_free(tl_prob *P);
/* Fills the reference outputs and gradients (float64). */
void tl_ref(tl_prob *P);
/* The layer config of the case. */
attn_layer_config tl_config(const tl_prob *P);

/* One rank's slice: heads, rows (independent re-derivation of the CP layout). */
typedef struct {
  attn_layer_heads h;
  int64_t rows, start[2], len[2];
  int count;
  int64_t cols;                   /* hq*Dqk + hk*(Dqk + Dv) */
  float *x, *dy;                  /* [B, rows, d] */
  float *wqkv, *wo;               /* [d, cols], [hq*Dv, d] */
} tl_slice;

/* Heads as the layer must assign them (DESIGN.md §4). */
attn_layer_heads tl_expected_heads(const tl_case *c, int tp, int tp_rank);
void tl_slice_make(const tl_prob *P, int tp, int tp_rank, int cp, int cp_rank, tl_slice *s);
void tl_slice_free(tl_slice *s);
/* Reference rows/columns of one slice, as float64 arrays shaped like the layer's outputs. */
void tl_slice_ref(const tl_prob *P, const tl_slice *s, double *y, double *dx, double *dwqkv,
                  double *dwo);

#endif
