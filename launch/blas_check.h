/* blas_check.h — makes sure OpenBLAS runs at the machine's vector width (Debian's 0.3.21
 * picks its "Prescott" kernel on AVX-512 CPUs unless OPENBLAS_CORETYPE is set). */
#ifndef ATTNRUN_LAUNCH_BLAS_CHECK_H
#define ATTNRUN_LAUNCH_BLAS_CHECK_H

/* Call first in main. If OpenBLAS chose a kernel narrower than AVX-512 on an AVX-512 CPU
 * and OPENBLAS_CORETYPE is unset, sets OPENBLAS_CORETYPE=SkylakeX and re-executes
 * /proc/self/exe once; if that is impossible, warns loudly on stderr. */
void blas_check_coretype(char **argv);

/* OpenBLAS's core name ("SkylakeX", "Prescott", ...) or "none" without OpenBLAS. */
const char *blas_core_name(void);

#endif
