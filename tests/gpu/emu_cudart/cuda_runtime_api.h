/* cuda_runtime_api.h (test-only stand-in) — what the GPU benchmarks include; the emulated
 * runtime's declarations are all in cuda_runtime.h. */
#include "cuda_runtime.h"
