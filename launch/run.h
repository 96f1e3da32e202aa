/* run.h — runs the problem through the library: context and group, forward and backward
 * (single rank, ring / TP attention over the group), each warmed up and timed: per-rank
 * median and min, the job's time per iteration (slowest rank), and the compute / exposed
 * communication split of each rank from attn_group_last_steps. */
#ifndef ATTNRUN_LAUNCH_RUN_H
#define ATTNRUN_LAUNCH_RUN_H

#include "args.h"
#include "attnrun.h"
#include "ctxbuf.h"
#include "grid.h"
#include "mpienv.h"
#include "problem.h"

#define RUN_MAX_ITERS ARGS_MAX_ITERS /* timings live on the stack */
#define RUN_MAX_STEPS 4096           /* ring steps recorded per call */

/* One rank's split of a pass, averaged over the timed iterations (compare with mean_s). */
typedef struct {
  double compute_s; /* kernel time (sum over ring steps) */
  double wait_s;    /* blocked waiting for exchanges: exposed communication */
  double bytes;     /* bytes this rank sent */
  int32_t steps, computed; /* ring steps, and how many the mask did not skip */
} run_split;

typedef struct {
  int done;
  int peer_failed;                /* another rank's call failed (this rank's did not) */
  double median_s, min_s, mean_s; /* this rank's own calls */
  double job_median_s, job_min_s;  /* per iteration the slowest rank, then median / min */
  double job_mean_s;
  double flops;                   /* peers' rule, whole problem (backward: 2.5x) */
  attn_stats stats;               /* this rank's last call: tiles actually computed */
  run_split split;
} run_timing;

/* What every pass needs: the library handles and the MPI environment. */
typedef struct {
  const run_args *a;
  const mpienv *e;
  const grid *g;
  attn_dtype dtype; /* of q, k, v, o, dout */
  attn_ctx_t ctx;
  attn_group_t grp; /* NULL on a single rank */
  double t_start;   /* for the progress line */
} run_env;

typedef struct {
  float *o;      /* [B, q_rows, hq, Dv] */
  float *lse;    /* [B, hq, q_rows] */
  float *dq;     /* [B, q_rows, hq, Dqk] */
  float *dk;     /* [B, kv_rows, hk, Dqk] */
  float *dv;     /* [B, kv_rows, hk, Dv] */
  float *dsinks; /* [hq] or NULL */
  run_timing fwd, bwd;
  ctx_tensors t; /* the same tensors in the context's memory (copies on cuda) */
} run_result;

/* Unless single: the group (tp x cp, the launcher's timeout) over MPI_COMM_WORLD on
 * env->ctx. Collective. On failure *what names the call. */
attn_status run_env_create_group(run_env *env, const char **what);
void run_env_free(run_env *env);

/* One timed pass: a->warmup + a->iters calls of fn (which waits for the context's work:
 * attn_ctx_sync), each after an agreement that is also a barrier: a rank whose call fails
 * (or whose `prior` step failed) stops, the others learn it at the next agreement and stop
 * too (t->peer_failed), so that every rank leaves with a failure and none is left in a
 * collective. ATTN_ERR_TIMEOUT returns at once: a peer is gone or stalled. */
typedef attn_status (*run_pass_fn)(void *user);
attn_status run_timed(const run_env *env, const char *name, run_pass_fn fn, void *user,
                      attn_status prior, run_timing *t);

/* Allocates the outputs (gradients too with --bwd) and poisons them with NaN so that
 * unwritten elements show. 0 on success, -1 when out of memory. */
int run_alloc_outputs(const run_args *a, const problem *p, run_result *r);

/* Forward and (with --bwd) backward of the attention problem on the context's copies
 * (ctxbuf); O and LSE (and the gradients) of the last call come back to the host buffers.
 * On failure *what names the call. */
attn_status run_attention(const run_env *env, const problem *p, run_result *r,
                          const char **what);

void run_free(run_result *r);

#endif
