/* blas_check.c — OpenBLAS core-type check for attnrun's main. OpenBLAS reads
 * OPENBLAS_CORETYPE only when the library loads, so the fix is to set it and re-execute
 * the program once (guarded by ATTNRUN_BLAS_REEXEC against loops). */
#include "blas_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define REEXEC_GUARD "ATTNRUN_BLAS_REEXEC"

#if ATTN_HAVE_OPENBLAS
extern char *openblas_get_corename(void);

const char *blas_core_name(void) {
  const char *name = openblas_get_corename();
  return name ? name : "unknown";
}

/* Kernels that use AVX-512. */
static int core_is_avx512(const char *name) {
  static const char *const wide[] = {"skylakex", "cooperlake", "sapphirerapids"};
  for (size_t i = 0; i < sizeof wide / sizeof wide[0]; i++)
    if (strcasecmp(name, wide[i]) == 0) return 1;
  return 0;
}

static void warn_slow(const char *core, const char *why) {
  fprintf(stderr,
          "attnrun: WARNING: OpenBLAS uses its '%s' kernel on this AVX-512 CPU (about 5x slower "
          "BLAS); %s. Run with OPENBLAS_CORETYPE=SkylakeX set in the environment.\n",
          core, why);
}

void blas_check_coretype(char **argv) {
  __builtin_cpu_init();
  const char *core = blas_core_name();
  if (!__builtin_cpu_supports("avx512f") || core_is_avx512(core)) return;
  if (getenv("OPENBLAS_CORETYPE")) {
    warn_slow(core, "OPENBLAS_CORETYPE is set but did not select an AVX-512 kernel");
    return;
  }
  if (getenv(REEXEC_GUARD)) {
    warn_slow(core, "re-executing with OPENBLAS_CORETYPE=SkylakeX did not help");
    return;
  }
  if (setenv("OPENBLAS_CORETYPE", "SkylakeX", 1) == 0 && setenv(REEXEC_GUARD, "1", 1) == 0) {
    fflush(NULL);
    execv("/proc/self/exe", argv);
  }
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv(REEXEC_GUARD);
  warn_slow(core, "re-executing with OPENBLAS_CORETYPE=SkylakeX failed");
}

#else /* no OpenBLAS: nothing to check */

const char *blas_core_name(void) { return "none"; }
void blas_check_coretype(char **argv) { (void)argv; }

#endif
