/* save.h — --save DIR: the outputs (and the inputs, so that --load DIR reruns the same
 * problem) as .npy files. */
#ifndef ATTNRUN_LAUNCH_SAVE_H
#define ATTNRUN_LAUNCH_SAVE_H

#include <stddef.h>

#include "args.h"
#include "problem.h"
#include "run.h"

/* Writes o.npy lse.npy [dq.npy dk.npy dv.npy dsinks.npy] and, unless DIR is the --load
 * directory, q.npy k.npy v.npy [do.npy sinks.npy alibi.npy cu_seqlens_*.npy]. */
int save_outputs(const run_args *a, const problem *p, const run_result *r, char *err,
                 size_t errlen);

#endif
