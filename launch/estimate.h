/* estimate.h — what a run will cost before it starts: FLOPs of the tiles each rank will
 * compute (from the mask geometry of its rows), a kernel rate measured on this machine by
 * a small probe, the resulting duration (passes and --check), and memory per rank. */
#ifndef ATTNRUN_LAUNCH_ESTIMATE_H
#define ATTNRUN_LAUNCH_ESTIMATE_H

#include <stdint.h>

#include "problem.h"
#include "run.h"

#define ESTIMATE_TILE 128 /* query/key tile the estimate rounds spans to */

typedef struct {
  double gflops_fwd, gflops_bwd; /* probe rates of this rank (0: the probe failed) */
  double flops_fwd, flops_bwd;   /* this rank's computed tiles per call (+ projections) */
  double flops_proj;             /* of which the layer's projections, forward */
  double fwd_s, bwd_s;           /* one call */
  double check_s;                /* --check */
  double total_s;                /* warmup + iters calls, and the check */
  double mem_bytes;              /* inputs, outputs, ring buffers of this rank (host) */
  double dev_bytes;              /* the same in device memory (cuda; 0 on cpu) */
} estimate;

/* Estimates this rank's run (attention; with d_model > 0 the layer's projections too).
 * Runs the probe on env->ctx, in the run's dtype and memory (a few milliseconds). cores:
 * the cores this rank may use (fractional when ranks share cores), for the oracle's time
 * and a cpu rank's rate; gpu_sharing: ranks on this rank's CUDA device, which share its
 * rate. */
void estimate_rank(const run_env *env, const problem *p, int64_t d_model, double cores,
                   int gpu_sharing, estimate *out);

/* Pairs (query, key) of this rank's query rows that the tile loop will compute, per batch
 * and head: per ESTIMATE_TILE query rows, the visible key span rounded out to tiles. */
double estimate_pairs(const attn_spec *s, int64_t seq_q, int64_t seq_kv, const attn_cp_shard *qsh);

#endif
