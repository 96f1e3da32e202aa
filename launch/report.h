/* report.h — what attnrun prints, in the manner of nccl-tests: a header (parameters, one
 * line per rank with host, cpuset and rows held, the estimate), the result table (one line
 * per rank and pass, then the job), the check summary, an OK/FAILED footer, and the
 * --json record (one JSON object per line, appended, with the per-rank split). Rank 0
 * prints; the per-rank data is gathered to it first. */
#ifndef ATTNRUN_LAUNCH_REPORT_H
#define ATTNRUN_LAUNCH_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "args.h"
#include "backend.h"
#include "bind.h"
#include "check.h"
#include "estimate.h"
#include "gpu.h"
#include "grid.h"
#include "mpienv.h"
#include "problem.h"
#include "run.h"

/* Known before the run, per rank. */
typedef struct {
  int32_t rank, tp_rank, cp_rank;
  char host[64];
  bind_info bind;
  attn_cp_shard qsh, ksh;
  int32_t hq0, hq, hk0, hk;
  estimate est;
  gpu_info gpu; /* ordinal -1 on the cpu backend */
} rank_info;

/* Known after the run, per rank. */
typedef struct {
  run_timing fwd, bwd;
  int64_t peak_rss;
  int checked;
  check_report check;
} rank_outcome;

typedef struct {
  const run_args *a;
  const problem *p;
  const grid *g;
  const mpienv *e;
  const char *backend_name;
  const backend_choice *bc;  /* which backend and dtype, and why */
  int64_t d_model;           /* > 0: the layer */
  const rank_info *info;     /* [ranks] on rank 0 */
  const rank_outcome *out;   /* [ranks] on rank 0, after the run */
  const check_report *check; /* merged over ranks; NULL without --check */
  double flops_fwd;          /* peers' rule, the whole problem (backward: 2.5x) */
} report_data;

/* Peak resident set size of this process (VmHWM; getrusage as a fallback), bytes. */
int64_t report_peak_rss(void);

/* Header, per-rank lines and the estimate (rank 0). */
void report_header(FILE *out, const report_data *d);
/* Result table (rank 0). */
void report_table(FILE *out, const report_data *d);
/* Check summary and the OK/FAILED footer (rank 0). */
void report_footer(FILE *out, const report_data *d);
/* "~3.2 h", "12 s": a duration for people. */
const char *report_duration(double s, char *buf, size_t len);

/* Appends one JSON line to path (rank 0). 0 on success, else -1 with errno set. */
int report_json(const char *path, const report_data *d);

#endif
