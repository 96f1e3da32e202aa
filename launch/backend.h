/* backend.h — which backend and dtype a run uses, and why: --backend auto resolved the way
 * attn_ctx_create's AUTO would (CUDA when the build has it and a device is visible), but
 * agreed over the ranks so that one job never mixes backends; the dtype's default per
 * backend; and whether the backend takes the dtype, asked of the library itself. */
#ifndef ATTNRUN_LAUNCH_BACKEND_H
#define ATTNRUN_LAUNCH_BACKEND_H

#include <stddef.h>

#include "args.h"
#include "attnrun.h"
#include "mpienv.h"

typedef struct {
  attn_backend backend; /* resolved: ATTN_BACKEND_CPU or ATTN_BACKEND_CUDA */
  attn_dtype dtype;
  int cuda_devices;     /* visible to this rank */
  char why[160];        /* "auto: 1 CUDA device visible", "--backend cpu", ... */
  char dtype_why[48];   /* "--dtype", "the default on cuda" */
} backend_choice;

/* Resolves --backend and --dtype (collective: every rank gets the same backend). 0, or -1
 * with the reason in err when --backend cuda finds no device on this rank (exit 2). */
int backend_choose(const mpienv *e, const run_args *a, backend_choice *out, char *err,
                   size_t errlen);

/* Whether ctx's backend takes dtype for Q, K, V: 0, or -1 with the library's reason in err
 * (exit 2). Validation only; nothing runs. */
int backend_check_dtype(attn_ctx_t ctx, const backend_choice *c, char *err, size_t errlen);

const char *backend_dtype_name(attn_dtype t);

#endif
