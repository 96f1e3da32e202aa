/* test_emu_cudart.c — the stream and event model of the emulated CUDA runtime
 * (tests/gpu/emu_cudart.cc), on which the emu ring tests rely to show a missing wait: work
 * queued on a created stream runs only when something waits for it (a default-stream
 * cudaStreamWaitEvent, cudaEventQuery / Synchronize, a stream or device sync, cudaFree),
 * elapsed times need completed records, fresh memory is poisoned, and a blocking stream
 * (cudaStreamCreate, what the benchmarks use) runs its work as it is issued. Label emu. */
#include <stdio.h>
#include <string.h>

#include "cuda_runtime.h"

static int failures;

#define EXPECT(cond)                                                  \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                     \
    }                                                                 \
  } while (0)

enum { N = 64 };

/* Device bytes back through the (synchronous, default-stream) cudaMemcpy. */
static unsigned char first_byte(const void *dev) {
  unsigned char b[N];
  EXPECT(cudaMemcpy(b, dev, N, cudaMemcpyDeviceToHost) == cudaSuccess);
  return b[0];
}

/* A copy queued on s stays queued until a wait, a query, a sync or a free runs it. */
static void deferred_copies(cudaStream_t s, void *dev, void *dev2) {
  unsigned char x[N];
  cudaEvent_t ev;
  EXPECT(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess);
  memset(x, 7, N);
  EXPECT(cudaMemcpyAsync(dev, x, N, cudaMemcpyHostToDevice, s) == cudaSuccess);
  EXPECT(cudaEventRecord(ev, s) == cudaSuccess);
  EXPECT(first_byte(dev) == 0xFF); /* not waited for: still the poison */
  EXPECT(cudaStreamWaitEvent(NULL, ev, 0) == cudaSuccess);
  EXPECT(first_byte(dev) == 7);
  memset(x, 8, N);
  EXPECT(cudaMemcpyAsync(dev, x, N, cudaMemcpyHostToDevice, s) == cudaSuccess);
  EXPECT(cudaEventRecord(ev, s) == cudaSuccess);
  EXPECT(first_byte(dev) == 7);
  EXPECT(cudaEventQuery(ev) == cudaSuccess && first_byte(dev) == 8);
  memset(x, 9, N);
  EXPECT(cudaMemcpyAsync(dev, x, N, cudaMemcpyHostToDevice, s) == cudaSuccess);
  EXPECT(cudaFree(dev2) == cudaSuccess && first_byte(dev) == 9); /* cudaFree waits */
  EXPECT(cudaEventDestroy(ev) == cudaSuccess);
}

/* cudaMemsetAsync is queued on a non-blocking stream like a copy; a cudaStreamCreate
 * (blocking) stream runs its work as it is issued, events included. */
static void memsets_and_blocking(cudaStream_t s, void *dev) {
  cudaStream_t b = NULL;
  cudaEvent_t e0, e1;
  float ms = -1;
  EXPECT(cudaMemsetAsync(dev, 3, N, s) == cudaSuccess);
  EXPECT(first_byte(dev) != 3);
  EXPECT(cudaStreamSynchronize(s) == cudaSuccess && first_byte(dev) == 3);
  EXPECT(cudaMemsetAsync(dev, 0, 2 * N, s) == cudaErrorInvalidValue); /* past the allocation */
  EXPECT(cudaStreamCreate(&b) == cudaSuccess);
  EXPECT(cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess);
  EXPECT(cudaEventRecord(e0, b) == cudaSuccess);
  EXPECT(cudaMemsetAsync(dev, 4, N, b) == cudaSuccess && first_byte(dev) == 4);
  EXPECT(cudaEventRecord(e1, b) == cudaSuccess);
  EXPECT(cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess && ms >= 0);
  EXPECT(cudaEventDestroy(e0) == cudaSuccess && cudaEventDestroy(e1) == cudaSuccess);
  EXPECT(cudaStreamDestroy(b) == cudaSuccess);
}

/* Elapsed times need both records to have run; timing-disabled events have none. */
static void timing(cudaStream_t s) {
  cudaEvent_t a, b, quiet;
  float ms = -1;
  EXPECT(cudaEventCreate(&a) == cudaSuccess && cudaEventCreate(&b) == cudaSuccess);
  EXPECT(cudaEventCreateWithFlags(&quiet, cudaEventDisableTiming) == cudaSuccess);
  EXPECT(cudaEventRecord(a, s) == cudaSuccess && cudaEventRecord(b, s) == cudaSuccess);
  EXPECT(cudaEventElapsedTime(&ms, a, b) == cudaErrorNotReady);
  EXPECT(cudaStreamSynchronize(s) == cudaSuccess);
  EXPECT(cudaEventElapsedTime(&ms, a, b) == cudaSuccess && ms >= 0);
  EXPECT(cudaEventRecord(quiet, NULL) == cudaSuccess);
  EXPECT(cudaEventElapsedTime(&ms, a, quiet) != cudaSuccess);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaEventDestroy(quiet);
}

int main(void) {
  cudaStream_t s = NULL, blocking = NULL;
  void *dev = NULL, *dev2 = NULL;
  unsigned char *pinned = NULL;
  EXPECT(cudaStreamCreateWithFlags(&blocking, cudaStreamDefault) != cudaSuccess);
  EXPECT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  EXPECT(cudaMalloc(&dev, N) == cudaSuccess && cudaMalloc(&dev2, N) == cudaSuccess);
  EXPECT(cudaHostAlloc((void **)&pinned, N, cudaHostAllocDefault) == cudaSuccess);
  EXPECT(pinned && pinned[0] == 0xFF && pinned[N - 1] == 0xFF);
  EXPECT(first_byte(dev) == 0xFF);
  deferred_copies(s, dev, dev2);
  memsets_and_blocking(s, dev);
  timing(s);
  EXPECT(cudaStreamDestroy(s) == cudaSuccess);
  EXPECT(cudaFreeHost(pinned) == cudaSuccess && cudaFree(dev) == cudaSuccess);
  printf("test_emu_cudart: %s\n", failures ? "FAILED" : "all passed");
  return failures ? 1 : 0;
}
