/* backend.c — resolves --backend and --dtype for attnrun. AUTO follows attn_ctx_create's
 * rule (CUDA when this build has it and a device is visible) through the public
 * attn_device_count, then the ranks agree: CUDA only when every rank sees a device, so
 * one job never mixes a CUDA rank with a CPU rank. Whether a backend takes a dtype is the
 * library's answer (attn_ctx_supports_dtype), not a table kept here. */
#include "backend.h"
#include "err.h"

#include <stdio.h>
#include <string.h>

const char *backend_dtype_name(attn_dtype t) {
  return t == ATTN_F32 ? "f32" : t == ATTN_BF16 ? "bf16" : t == ATTN_F16 ? "f16" : "?";
}

/* Visible CUDA devices, and in words why there are none. */
static int cuda_visible(char *none, size_t len) {
  int n = 0;
  attn_status st = attn_device_count(ATTN_BACKEND_CUDA, &n);
  if (st != ATTN_OK)
    snprintf(none, len, "%s", attn_last_error());
  else if (n == 0)
    snprintf(none, len, "no CUDA device is visible");
  return n;
}

static void resolve_auto(const mpienv *e, backend_choice *c, const char *none) {
  int lacking = (int)mpienv_sum_i64(e, c->cuda_devices == 0, 60.0, "choosing the backend");
  c->backend = lacking ? ATTN_BACKEND_CPU : ATTN_BACKEND_CUDA;
  if (!lacking)
    snprintf(c->why, sizeof c->why, "auto: %d CUDA device%s visible%s", c->cuda_devices,
             c->cuda_devices > 1 ? "s" : "", e->size > 1 ? " on rank 0's host" : "");
  else if (e->size == 1)
    snprintf(c->why, sizeof c->why, "auto: %s", none);
  else
    snprintf(c->why, sizeof c->why, "auto: %d of %d ranks see no CUDA device (%s)", lacking,
             e->size, c->cuda_devices ? "rank 0 sees one" : none);
}

int backend_choose(const mpienv *e, const run_args *a, backend_choice *out, char *err,
                   size_t errlen) {
  char none[256] = "";
  memset(out, 0, sizeof *out);
  out->cuda_devices = cuda_visible(none, sizeof none);
  if (a->backend == ATTN_BACKEND_AUTO) {
    resolve_auto(e, out, none);
  } else {
    out->backend = a->backend;
    snprintf(out->why, sizeof out->why, "--backend %s",
             a->backend == ATTN_BACKEND_CUDA ? "cuda" : "cpu");
  }
  int cuda = out->backend == ATTN_BACKEND_CUDA;
  out->dtype = (a->given & GIVEN_DTYPE) ? a->dtype : cuda ? ATTN_BF16 : ATTN_F32;
  snprintf(out->dtype_why, sizeof out->dtype_why, "%s",
           (a->given & GIVEN_DTYPE) ? "--dtype" : cuda ? "the default on cuda" : "the default on cpu");
  if (cuda && out->cuda_devices == 0)
    return launch_fail(err, errlen,
                       "--backend cuda: %s. Run where a CUDA device is visible, or use "
                       "--backend cpu (or auto)", none);
  if ((a->given & GIVEN_DEVICE) && !cuda)
    return launch_fail(err, errlen,
                       "--device %d picks a CUDA device, but the backend is cpu (%s); drop "
                       "--device or run where CUDA devices are visible",
                       a->device, out->why);
  if ((a->given & GIVEN_DEVICE) && a->device >= out->cuda_devices)
    return launch_fail(err, errlen, "--device %d: %d CUDA device%s visible (ordinals 0..%d)",
                       a->device, out->cuda_devices, out->cuda_devices > 1 ? "s" : "",
                       out->cuda_devices - 1);
  return 0;
}

int backend_check_dtype(attn_ctx_t ctx, const backend_choice *c, char *err, size_t errlen) {
  if (attn_ctx_supports_dtype(ctx, c->dtype) == ATTN_OK) return 0;
  const char *other = c->backend == ATTN_BACKEND_CUDA ? "--dtype bf16 or f16, or --backend cpu"
                                                      : "--dtype f32 (or a CUDA backend for bf16/f16)";
  return launch_fail(err, errlen, "dtype %s (%s) on the %s backend (%s): %s. Use %s",
                     backend_dtype_name(c->dtype), c->dtype_why,
                     c->backend == ATTN_BACKEND_CUDA ? "cuda" : "cpu", c->why, attn_last_error(),
                     other);
}
