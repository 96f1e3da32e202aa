/* emu_cudart.cc — a test-only CUDA runtime (and cuBLAS GEMM) for the emulated device, so
 * that the library's device paths — ring attention over the MPI-staged transport, the
 * layer — run in CI without a GPU, with the kernels on the CPU emulator (emu.cc).
 *
 * Device memory is a separate arena that is inaccessible (PROT_NONE) except while an
 * emulated kernel, a cudaMemcpy or the GEMM runs: host code that reads or writes device
 * memory directly — the bug that only shows on a real GPU — crashes here at once. The
 * kernel launches are intercepted with the linker's --wrap of emu_launch. Copies check
 * that their kind matches where the pointers live and that they stay inside one
 * allocation. Streams are synchronous (every call completes before it returns), so this
 * cannot show missing stream synchronisation; cudaMalloc'd memory starts as 0xFF bytes
 * (NaN), as undefined memory should read. ATTN_EMU_UNPROTECTED=1 leaves the arena open;
 * ATTN_EMU_DEVICE_ID sets the PCI bus id this process reports. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <map>

#include "emu.h"
#include "emu_cudart/cublas_v2.h"
#include "emu_cudart/cuda_runtime.h"

namespace {

const size_t kArena = size_t(16) << 30; /* address space only (MAP_NORESERVE) */
const size_t kPage = 4096;

unsigned char *g_arena = nullptr;
size_t g_used = 0;                   /* bytes handed out, page-rounded */
std::map<uintptr_t, size_t> g_live;  /* allocation base -> bytes */
int g_open = 0;                      /* nesting of device scopes */
int g_protect = -1;                  /* 1: PROT_NONE outside device scopes */

bool arena_ready() {
  if (g_arena) return true;
  void *m = mmap(nullptr, kArena, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return false;
  g_arena = (unsigned char *)m;
  const char *e = getenv("ATTN_EMU_UNPROTECTED");
  g_protect = !(e && *e == '1');
  if (!g_protect) mprotect(g_arena, kArena, PROT_READ | PROT_WRITE);
  return true;
}

void set_access(bool open) {
  if (g_protect == 1 && g_used) mprotect(g_arena, g_used, open ? PROT_READ | PROT_WRITE : PROT_NONE);
}

/* Device memory is readable and writable while one of these lives. */
struct device_scope {
  device_scope() {
    if (g_open++ == 0) set_access(true);
  }
  ~device_scope() {
    if (--g_open == 0) set_access(false);
  }
};

bool in_arena(const void *p) {
  const unsigned char *c = (const unsigned char *)p;
  return g_arena && c >= g_arena && c < g_arena + kArena;
}

/* [p, p + bytes) inside one live allocation. */
bool inside_alloc(const void *p, size_t bytes) {
  auto it = g_live.upper_bound((uintptr_t)p);
  if (it == g_live.begin()) return false;
  --it;
  return (uintptr_t)p + bytes <= it->first + it->second;
}

bool copy_ok(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
  const bool dd = in_arena(dst), sd = in_arena(src);
  bool want_dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  bool want_sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind == cudaMemcpyDefault) want_dd = dd, want_sd = sd;
  if (dd != want_dd || sd != want_sd) {
    fprintf(stderr, "emu cudart: cudaMemcpy kind %d with dst %s and src %s memory\n", (int)kind,
            dd ? "device" : "host", sd ? "device" : "host");
    return false;
  }
  if ((dd && !inside_alloc(dst, bytes)) || (sd && !inside_alloc(src, bytes))) {
    fprintf(stderr, "emu cudart: cudaMemcpy of %zu bytes runs past a device allocation\n", bytes);
    return false;
  }
  return true;
}

} // namespace

/* Every emulated kernel launch runs with device memory open. */
extern "C" void __real__Z10emu_launch4dim3S_mRKSt8functionIFvvEE(dim3 grid, dim3 block,
                                                                   size_t smem,
                                                                   const std::function<void()> &body);
extern "C" void __wrap__Z10emu_launch4dim3S_mRKSt8functionIFvvEE(dim3 grid, dim3 block,
                                                                   size_t smem,
                                                                   const std::function<void()> &body) {
  device_scope open;
  __real__Z10emu_launch4dim3S_mRKSt8functionIFvvEE(grid, block, smem, body);
}

extern "C" {

const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument (emulated device)";
    case cudaErrorMemoryAllocation: return "out of memory (emulated device)";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotReady: return "device not ready";
  }
  return "unknown error";
}

const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNotReady: return "cudaErrorNotReady";
  }
  return "cudaErrorUnknown";
}

cudaError_t cudaGetDeviceCount(int *n) {
  *n = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int dev) { return dev == 0 ? cudaSuccess : cudaErrorInvalidDevice; }

cudaError_t cudaGetDevice(int *dev) {
  *dev = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *buf, int len, int dev) {
  if (dev != 0 || len <= 0) return cudaErrorInvalidValue;
  const char *e = getenv("ATTN_EMU_DEVICE_ID");
  snprintf(buf, (size_t)len, "%s", e && *e ? e : "0000:00:00.0");
  return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
  *p = nullptr;
  if (!arena_ready()) return cudaErrorMemoryAllocation;
  const size_t n = bytes ? (bytes + kPage - 1) / kPage * kPage : kPage;
  if (g_used + n > kArena) return cudaErrorMemoryAllocation;
  unsigned char *base = g_arena + g_used;
  g_used += n;
  {
    device_scope open;
    if (g_protect == 1) mprotect(base, n, PROT_READ | PROT_WRITE);
    memset(base, 0xFF, n);
  }
  g_live[(uintptr_t)base] = bytes;
  *p = base;
  return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
  if (!p) return cudaSuccess;
  auto it = g_live.find((uintptr_t)p);
  if (it == g_live.end()) {
    fprintf(stderr, "emu cudart: cudaFree(%p) of a pointer cudaMalloc did not give\n", p);
    return cudaErrorInvalidValue;
  }
  const size_t n = (it->second + kPage - 1) / kPage * kPage;
  if (n) madvise(p, n, MADV_DONTNEED); /* the address range is not reused */
  g_live.erase(it);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t bytes) {
  *p = malloc(bytes ? bytes : 1);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFreeHost(void *p) {
  free(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
  if (!bytes) return cudaSuccess;
  if (!copy_ok(dst, src, bytes, kind)) return cudaErrorInvalidValue;
  device_scope open;
  memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemset(void *dst, int value, size_t bytes) {
  if (!bytes) return cudaSuccess;
  if (!in_arena(dst) || !inside_alloc(dst, bytes)) {
    fprintf(stderr, "emu cudart: cudaMemset of %zu bytes outside a device allocation\n", bytes);
    return cudaErrorInvalidValue;
  }
  device_scope open;
  memset(dst, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s) {
  (void)s;
  return cudaMemcpy(dst, src, bytes, kind);
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  (void)s;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

/* ---- cuBLAS: one naive column-major float32 GEMM ---------------------------------------- */
struct emu_blas_s {
  cudaStream_t stream;
};

cublasStatus_t cublasCreate(cublasHandle_t *h) {
  *h = (cublasHandle_t)calloc(1, sizeof(emu_blas_s));
  return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasDestroy(cublasHandle_t h) {
  free(h);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType at,
                            int lda, const void *B, cudaDataType bt, int ldb, const void *beta,
                            void *C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo) {
  (void)h, (void)compute, (void)algo;
  if (at != CUDA_R_32F || bt != CUDA_R_32F || ct != CUDA_R_32F || m < 0 || n < 0 || k < 0)
    return CUBLAS_STATUS_INVALID_VALUE;
  const float al = *(const float *)alpha, be = *(const float *)beta; /* host scalars */
  if (!in_arena(A) || !in_arena(B) || !in_arena(C)) {
    fprintf(stderr, "emu cublas: GEMM operand in host memory\n");
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  device_scope open;
  const float *a = (const float *)A, *b = (const float *)B;
  float *c = (float *)C;
  for (int j = 0; j < n; j++)
    for (int i = 0; i < m; i++) {
      double acc = 0;
      for (int p = 0; p < k; p++) {
        const float x = ta == CUBLAS_OP_N ? a[i + (size_t)p * lda] : a[p + (size_t)i * lda];
        const float y = tb == CUBLAS_OP_N ? b[p + (size_t)j * ldb] : b[j + (size_t)p * ldb];
        acc += (double)x * y;
      }
      float *out = &c[i + (size_t)j * ldc];
      *out = (float)(al * acc + (be != 0.0f ? (double)be * *out : 0.0));
    }
  return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"
