/* gpu_device_cuda.c — td_* on a real GPU through the CUDA runtime. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpu_device.h"

static void check(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return;
  fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(e));
  exit(1);
}

int td_available(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n > 0;
}

int td_emulated(void) { return 0; }

const char *td_name(void) {
  static char name[320];
  struct cudaDeviceProp prop;
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  snprintf(name, sizeof name, "%s (sm_%d%d, %d SMs)", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount);
  return name;
}

void *td_alloc(size_t bytes) {
  void *p = NULL;
  check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
  return p;
}

void td_free(void *p) {
  if (p) check(cudaFree(p), "cudaFree");
}

/* cudaMemcpy from pageable memory and cudaMemset may still be in flight when they return,
 * and a kernel on a non-blocking stream is not ordered after them: wait for the device. */
void td_upload(void *dst, const void *src, size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  check(cudaDeviceSynchronize(), "cudaMemcpy H2D (sync)");
}

void td_download(void *dst, const void *src, size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

void td_memset(void *dst, int byte, size_t bytes) {
  check(cudaMemset(dst, byte, bytes), "cudaMemset");
  check(cudaDeviceSynchronize(), "cudaMemset (sync)");
}

void td_sync(void) {
  check(cudaDeviceSynchronize(), "kernel (cudaDeviceSynchronize)");
  check(cudaGetLastError(), "cudaGetLastError");
}
