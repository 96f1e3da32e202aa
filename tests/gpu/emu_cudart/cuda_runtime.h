/* cuda_runtime.h (test-only stand-in) — the subset of the CUDA runtime API that the
 * runtime adapter (kernels/cuda/backend.c), the MPI-staged transport (comm/staged.c),
 * test_cuda_runtime.c and the GPU benchmarks (bench/gpu) call, declared for the emulated
 * device of tests/gpu/emu_cudart.cc: memory, copies, streams (non-blocking, and blocking
 * ones whose work runs as it is issued) and events. Only the emulated library variant
 * (attnrun_emu) sees this header; the real build uses the toolkit's. */
#ifndef ATTN_EMU_CUDA_RUNTIME_H
#define ATTN_EMU_CUDA_RUNTIME_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600
} cudaError_t;

#define cudaStreamDefault 0x0
#define cudaStreamNonBlocking 0x1 /* no implicit default-stream sync (cudaStreamCreate: blocking) */
#define cudaEventDefault 0x0
#define cudaEventDisableTiming 0x2
#define cudaHostAllocDefault 0x0

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};

typedef struct emu_stream_s *cudaStream_t;
typedef struct emu_event_s *cudaEvent_t;

/* the fields the GPU benchmarks print */
struct cudaDeviceProp {
  char name[256];
  int major, minor, multiProcessorCount;
};

const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int dev);
cudaError_t cudaGetDevice(int *dev);
cudaError_t cudaDeviceGetPCIBusId(char *buf, int len, int dev);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t s);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind);
cudaError_t cudaMemset(void *dst, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned int flags);
cudaError_t cudaEventCreate(cudaEvent_t *ev);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t ev);
cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s);
cudaError_t cudaEventQuery(cudaEvent_t ev);
cudaError_t cudaEventSynchronize(cudaEvent_t ev);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

#ifdef __cplusplus
}
#endif
#endif
