/* emu_cudart.cc — a test-only CUDA runtime (and cuBLAS GEMM) for the emulated device, so
 * that the library's device paths — ring attention over the MPI-staged transport, the
 * layer — run in CI without a GPU, with the kernels on the CPU emulator (emu.cc).
 *
 * Device memory is a separate arena that is inaccessible (PROT_NONE) except while an
 * emulated kernel, a cudaMemcpy or the GEMM runs: host code that reads or writes device
 * memory directly — the bug that only shows on a real GPU — crashes here at once. The
 * kernel launches are intercepted with the linker's --wrap of emu_launch. Copies check
 * that their kind matches where the pointers live and that they stay inside one
 * allocation. cudaMalloc'd and cudaHostAlloc'd memory starts as 0xFF bytes (NaN), as
 * undefined memory should read. ATTN_EMU_UNPROTECTED=1 leaves the arena open;
 * ATTN_EMU_DEVICE_ID sets the PCI bus id this process reports.
 *
 * Streams and events. The default (NULL) stream runs everything at once, kernels included
 * (emu_launch receives no stream, so every kernel counts as a default-stream kernel). Work
 * on a created stream (copies, event records, waits) is queued and runs only when something
 * needs it: cudaStreamWaitEvent on the default stream, cudaEventQuery / Synchronize, a
 * stream or device sync, cudaFree / cudaFreeHost. That is one legal CUDA schedule — the
 * side streams as late as the program's waits allow — so a missing wait for side-stream
 * work shows up: a kernel or the host that reads a buffer whose copy was never waited for
 * sees the old bytes (or the poison). What it cannot show: a side stream that fails to wait
 * for a kernel (kernels already ran when they were launched), races between concurrent
 * kernels, blocking-stream (legacy) semantics beyond running a cudaStreamCreate stream's
 * work as it is issued (what a program of one such stream sees), and real timings (events
 * carry host timestamps of when their record ran). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <deque>
#include <functional>
#include <map>
#include <time.h>

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

/* ---- streams: queued work on created streams, run on demand --------------------------- */
struct queued {
  uint64_t seq;
  std::function<void()> run;
};

} // namespace

struct emu_stream_s {
  std::deque<queued> q;
  uint64_t next = 1; /* seq of the next queued item */
  bool live = true;  /* destroyed streams stay allocated: waits may still name them */
  bool eager = false; /* a blocking stream (cudaStreamCreate): its work runs when issued */
};

struct emu_event_s {
  emu_stream_s *s = nullptr; /* stream of the last record (nullptr: default stream) */
  uint64_t seq = 0;          /* its position there; 0: never recorded */
  bool done = false;         /* the last record has run */
  bool timing = true;
  double t = 0;              /* host seconds when the record ran */
};

namespace {

std::deque<emu_stream_s *> g_streams; /* every stream ever created */

double now_s() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Runs s's queued work up to and including seq (items may run other streams' work). */
void run_until(emu_stream_s *s, uint64_t seq) {
  while (s && !s->q.empty() && s->q.front().seq <= seq) {
    std::function<void()> f = std::move(s->q.front().run);
    s->q.pop_front();
    f();
  }
}

void run_all() {
  for (emu_stream_s *s : g_streams) run_until(s, UINT64_MAX);
}

/* Queues f on s, or runs it now on the default stream or a blocking one; returns its seq
 * (0: ran). */
uint64_t enqueue(emu_stream_s *s, std::function<void()> f) {
  if (!s || s->eager) {
    f();
    return 0;
  }
  const uint64_t seq = s->next++;
  s->q.push_back(queued{seq, std::move(f)});
  return seq;
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
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
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
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
  }
  return "cudaErrorUnknown";
}

cudaError_t cudaGetDeviceCount(int *n) {
  *n = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int dev) { return dev == 0 ? cudaSuccess : cudaErrorInvalidDevice; }

/* What the emulator is: compute capability 9.0 (emu.cc models the sm90 primitives too). */
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int dev) {
  if (dev != 0) return cudaErrorInvalidDevice;
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "emulated-device");
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 1;
  return cudaSuccess;
}

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
  run_all(); /* cudaFree waits for the device */
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

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags) {
  (void)flags;
  *p = malloc(bytes ? bytes : 1);
  if (*p) memset(*p, 0xFF, bytes);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFreeHost(void *p) {
  run_all(); /* as cudaFree */
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

/* Queued on a non-blocking stream like a copy; on the default or a blocking stream it runs
 * now (enqueue), which is cudaMemset. */
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s) {
  if (s && !s->live) return cudaErrorInvalidResourceHandle;
  if (!bytes) return cudaSuccess;
  if (!in_arena(dst) || !inside_alloc(dst, bytes)) { /* checked when queued */
    fprintf(stderr, "emu cudart: cudaMemset of %zu bytes outside a device allocation\n", bytes);
    return cudaErrorInvalidValue;
  }
  enqueue(s, [=]() {
    device_scope open;
    memset(dst, value, bytes);
  });
  return cudaSuccess;
}

cudaError_t cudaMemset(void *dst, int value, size_t bytes) { return cudaMemsetAsync(dst, value, bytes, nullptr); }

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s) {
  if (!s) return cudaMemcpy(dst, src, bytes, kind);
  if (!s->live) return cudaErrorInvalidResourceHandle;
  if (!bytes) return cudaSuccess;
  if (!copy_ok(dst, src, bytes, kind)) return cudaErrorInvalidValue; /* checked when queued */
  enqueue(s, [=]() {
    device_scope open;
    memmove(dst, src, bytes);
  });
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (s && !s->live) return cudaErrorInvalidResourceHandle;
  run_until(s, UINT64_MAX);
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  run_all();
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
  if (!(flags & cudaStreamNonBlocking)) {
    fprintf(stderr, "emu cudart: only non-blocking streams are emulated (flags %u)\n", flags);
    return cudaErrorInvalidValue;
  }
  *s = new emu_stream_s;
  g_streams.push_back(*s);
  return cudaSuccess;
}

/* A blocking stream, as the benchmarks create theirs: program order with the default
 * stream, which is what running its work when issued gives (kernels run when launched). */
cudaError_t cudaStreamCreate(cudaStream_t *s) {
  *s = new emu_stream_s;
  (*s)->eager = true;
  g_streams.push_back(*s);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s || !s->live) return cudaErrorInvalidResourceHandle;
  run_until(s, UINT64_MAX); /* its work still completes */
  s->live = false;
  return cudaSuccess;
}

/* Work queued on s after this waits for ev's last record (the default stream: runs it now). */
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned int flags) {
  if (!ev || (s && !s->live) || flags) return cudaErrorInvalidResourceHandle;
  emu_stream_s *es = ev->s;
  const uint64_t seq = ev->seq;
  enqueue(s, [=]() { run_until(es, seq); });
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned int flags) {
  *ev = new emu_event_s;
  (*ev)->timing = !(flags & cudaEventDisableTiming);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *ev) { return cudaEventCreateWithFlags(ev, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t ev) {
  if (!ev) return cudaErrorInvalidResourceHandle;
  run_until(ev->s, ev->seq); /* its queued record must not outlive it */
  delete ev;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s) {
  if (!ev || (s && !s->live)) return cudaErrorInvalidResourceHandle;
  ev->s = s;
  ev->done = false;
  ev->seq = s ? s->next : 0;
  const uint64_t seq = ev->seq;
  enqueue(s, [=]() {
    if (ev->s == s && ev->seq == seq) ev->done = true, ev->t = now_s();
  });
  return cudaSuccess;
}

/* Never "not ready": the event's work runs now (nothing else would run it). */
cudaError_t cudaEventQuery(cudaEvent_t ev) {
  if (!ev) return cudaErrorInvalidResourceHandle;
  run_until(ev->s, ev->seq);
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t ev) { return cudaEventQuery(ev); }

/* Both records must have run already (as on a GPU: cudaErrorNotReady otherwise), so a
 * missing synchronisation before reading a timer shows. */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
  if (!a || !b || !a->timing || !b->timing) return cudaErrorInvalidResourceHandle;
  if (!a->seq && !a->done) return cudaErrorInvalidResourceHandle; /* never recorded */
  if (!a->done || !b->done) return cudaErrorNotReady;
  *ms = (float)((b->t - a->t) * 1e3);
  return cudaSuccess;
}

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
