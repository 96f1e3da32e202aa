/* layer_run.h — attnrun --d-model N: the full tensor-parallel attention layer
 * (attn_layer_*) on generated x, weights and dy; timed like attention, checked row by row
 * against the float64 oracle through projected rows, saved as full arrays. */
#ifndef ATTNRUN_LAUNCH_LAYER_RUN_H
#define ATTNRUN_LAUNCH_LAYER_RUN_H

#include <stddef.h>

#include "check.h"
#include "grid.h"
#include "problem.h"
#include "run.h"

/* The layer's buffers, in the order of layer_job.ctx_buf. */
enum { LB_X, LB_DY, LB_Y, LB_DX, LB_WQKV, LB_WO, LB_DWQKV, LB_DWO, LB_COUNT };

typedef struct {
  int64_t d_model;
  int64_t wcols; /* hq*Dqk + hk*Dqk + hk*Dv: this rank's columns of [W_q | W_k | W_v] */
  attn_layer_t layer;
  float *x, *dy;        /* [B, S_loc, d_model] this CP rank's rows */
  float *y, *dx;        /* [B, S_loc, d_model] */
  float *w_qkv, *w_o;   /* [d_model, wcols], [hq*Dv, d_model] */
  float *dw_qkv, *dw_o; /* the same shapes */
  attn_ctx_t ctx;        /* on a device context: float32 copies of the buffers above */
  int copies;
  float *ctx_buf[LB_COUNT]; /* the buffers the layer calls see (copies, or the host's) */
  void *spec_arrays[CTXBUF_ARRAYS];     /* on a device context: the spec's arrays there (ctxbuf_spec) */
  attn_block_mask bm;
} layer_job;

/* Creates the layer (collective), sets p's heads from attn_layer_get_heads, allocates and
 * generates this rank's x, weights (and dy with --bwd). On failure *what names the call;
 * ATTN_ERR_OUT_OF_MEMORY when a buffer could not be allocated. */
attn_status layer_setup(layer_job *L, const run_env *env, problem *p, const char **what);

/* Forward and (with --bwd) backward, timed. */
attn_status layer_run(const run_env *env, layer_job *L, const problem *p, run_result *r,
                      const char **what);

/* Sampled rows of y (and dx) against the float64 oracle over the full sequence. */
void layer_check(const run_env *env, const layer_job *L, const problem *p, check_report *out);

/* --save: x.npy y.npy [dy.npy dx.npy], full arrays [B, S, d_model]. */
int layer_save(const mpienv *e, const grid *g, const run_args *a, const layer_job *L,
               const problem *p, int bwd, char *err, size_t errlen);

/* Peers' rule FLOPs of one forward: attention plus the projections. */
double layer_flops_fwd(const problem *p, int64_t d_model);

void layer_free(layer_job *L);

#endif
