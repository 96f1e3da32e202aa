/* save.h — --save DIR: the outputs (and the inputs, so that --load DIR reruns the same
 * problem) as .npy files holding full arrays, whatever the number of ranks: the files of
 * `mpirun -np 8` are the files of one rank. */
#ifndef ATTNRUN_LAUNCH_SAVE_H
#define ATTNRUN_LAUNCH_SAVE_H

#include <stddef.h>

#include "args.h"
#include "grid.h"
#include "mpienv.h"
#include "npy.h"
#include "problem.h"
#include "run.h"

typedef enum {
  PART_ROWS, /* [B, S, H, D] (or [B, S, D]): this rank's rows (sh), heads [h0, h0 + hn) */
  PART_LSE,  /* [B, H, S]:    the same rows and heads, LSE layout */
  PART_FLAT  /* elements [first, first + count) of the flat array */
} save_kind;

/* One file, and this rank's part of it. Every rank lists the same files in the same
 * order; `write` says whether this rank writes its part (replicas write once). */
typedef struct {
  const char *name;
  npy_dtype dtype;
  int ndim;
  int64_t shape[4];
  save_kind kind;
  const attn_cp_shard *sh;
  int64_t h0, hn;
  int64_t first, count;
  const void *data; /* [B, sh->rows, hn, D], [B, hn, sh->rows] or [count] */
  int write;
} save_part;

/* Rank 0 creates every file with its header and size, then each rank writes its parts at
 * their offsets (pwrite). Collective; 0 on every rank, or -1 on every rank (the rank that
 * failed has the reason in err). */
int save_parts(const mpienv *e, const char *dir, const save_part *parts, int n, char *err,
               size_t errlen);

/* The attention problem: o.npy lse.npy [dq.npy dk.npy dv.npy dsinks.npy] and, unless DIR
 * is the --load directory, q.npy k.npy v.npy [do.npy sinks.npy alibi.npy cu_seqlens_*.npy]. */
int save_outputs(const mpienv *e, const grid *g, const run_args *a, const problem *p,
                 const run_result *r, char *err, size_t errlen);

#endif
