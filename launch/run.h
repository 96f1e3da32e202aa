/* run.h — runs the problem through the library: context, forward and backward, each
 * warmed up and timed (median and min over --iters), with the tiles-computed stats. */
#ifndef ATTNRUN_LAUNCH_RUN_H
#define ATTNRUN_LAUNCH_RUN_H

#include "args.h"
#include "attnrun.h"
#include "problem.h"

#define RUN_MAX_ITERS ARGS_MAX_ITERS /* timings live on the stack */

typedef struct {
  int done;
  double median_s, min_s;
  double flops;     /* peers' rule: attn_flops_fwd (backward: 2.5x) */
  attn_stats stats; /* tiles actually computed, from attn_ctx_last_stats */
} run_timing;

typedef struct {
  attn_ctx_t ctx;
  float *o;      /* [B, q_rows, Hq, Dv] */
  float *lse;    /* [B, Hq, q_rows] */
  float *dq;     /* [B, q_rows, Hq, Dqk] */
  float *dk;     /* [B, kv_rows, Hkv, Dqk] */
  float *dv;     /* [B, kv_rows, Hkv, Dv] */
  float *dsinks; /* [Hq] or NULL */
  run_timing fwd, bwd;
} run_result;

/* Creates r->ctx from the flags (backend, threads, --scalar). */
attn_status run_ctx_create(const run_args *a, run_result *r);

/* Allocates the outputs (gradients too with --bwd) and poisons them with NaN so that
 * unwritten elements show. 0 on success, -1 when out of memory. */
int run_alloc_outputs(const run_args *a, const problem *p, run_result *r);

/* Warmup + iters forward runs; O and LSE of the last run stay. */
attn_status run_forward(const run_args *a, const problem *p, run_result *r);

/* The same for the backward pass (needs run_forward first, and p->dout). */
attn_status run_backward(const run_args *a, const problem *p, run_result *r);

void run_free(run_result *r);

#endif
