/* backend.c — the CUDA backend's function table for the runtime: device and stream choice,
 * a workspace kept per context, and the translation of the resolved problem into the
 * kernels' C interface (cuda_attn.h). Built only with the CUDA backend. On a CUDA context
 * every tensor and every spec array (sinks, ALiBi slopes, cu_seqlens, block mask, the KV
 * cache's lengths and block table) is device memory; calls enqueue on the context's
 * stream and do not wait for it. */
#include "cuda_attn.h"
#include "internal.h"
#include "ops.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
  int device;
  cudaStream_t stream; /* the caller's (cfg.stream) or the default stream */
  void *ws;            /* workspace, grown on demand */
  size_t ws_bytes;
  float *scratch;      /* attn_bwd's delta, grown on demand */
  int64_t scratch_n;
  int deterministic; /* ATTN_DETERMINISTIC=1: bitwise-repeatable dQ */
  cublasHandle_t blas; /* created by the first gemm, bound to stream */
  /* attn_stats of the last call, counted on the host (tiles.c). Varlen offsets, block
   * masks and a KV cache's used lengths live in device memory: the caller's host copies are used where it has them
   * (ctx->spec_host: the ring), else they are copied into pinned host memory on the
   * stream, ahead of the kernels, and counted when the stats are read (cu_stats), so that
   * no call waits for the device. */
  struct {
    int pending; /* 1: a count waits for the copies (-1: queued, the launch not yet done) */
    attn_cuda_problem now; /* with host arrays: counted after the launch (pending == 0) */
    attn_cuda_problem p; /* its geometry (device array pointers replaced when counted) */
    int backward;
    void *host; /* pinned: cu_seqlens_q, cu_seqlens_kv [num_seqs + 1] int32, mask bytes */
    size_t host_bytes;
    cudaEvent_t copied; /* recorded after the copies */
  } st;
} cuda_backend;

static attn_status cuda_fail(cudaError_t e, const char *what) {
  return attn__fail(ATTN_ERR_CUDA, "%s: %s (%s)", what, cudaGetErrorString(e),
                    cudaGetErrorName(e));
}

static attn_cuda_view view_of(attn__view v) {
  attn_cuda_view c = {v.p, v.sb, v.ss, v.sh};
  return c;
}

static attn_cuda_problem to_cuda(const attn__problem *pb) {
  attn_cuda_problem p = {0};
  p.B = pb->B, p.Hq = pb->Hq, p.Hkv = pb->Hkv, p.Dqk = pb->Dqk, p.Dv = pb->Dv;
  p.sq = pb->sq, p.skv = pb->skv, p.q_row0 = pb->q_row0;
  p.q_pos0 = pb->q_pos0, p.k_pos0 = pb->k_pos0, p.seq_q = pb->seq_q, p.seq_kv = pb->seq_kv;
  p.scale = pb->scale, p.softcap = pb->softcap, p.causal = pb->causal;
  p.window_left = pb->window_left, p.window_right = pb->window_right;
  p.sinks = pb->sinks, p.alibi = pb->alibi;
  p.cu_seqlens_q = pb->cu_q, p.cu_seqlens_kv = pb->cu_kv, p.num_seqs = pb->num_seqs;
  if (pb->block_mask) {
    p.block_mask = pb->block_mask->mask;
    p.block_q = pb->block_mask->block_q, p.block_k = pb->block_mask->block_k;
    p.num_q_blocks = pb->block_mask->num_q_blocks;
    p.num_k_blocks = pb->block_mask->num_k_blocks;
  }
  p.dtype = (int32_t)pb->dtype;
  p.q = view_of(pb->q), p.k = view_of(pb->k), p.v = view_of(pb->v);
  p.kv_used = pb->kv_used;
  if (pb->k.pages) {
    p.block_table = pb->k.pages;
    p.pages_per_seq = pb->k.pages_per_b;
    p.page_size = pb->k.page_rows;
    p.num_pages = pb->k.num_pages;
  }
  return p;
}

/* The workspace p needs; grows (after the stream drains) when too small. */
static attn_status workspace(attn_ctx_t ctx, const attn_cuda_problem *p) {
  cuda_backend *be = ctx->backend_data;
  size_t need = attn_cuda_workspace_bytes(p);
  if (need <= be->ws_bytes) return ATTN_OK;
  cudaError_t e = cudaStreamSynchronize(be->stream);
  if (e == cudaSuccess && be->ws) e = cudaFree(be->ws);
  be->ws = NULL;
  be->ws_bytes = 0;
  if (e == cudaSuccess) e = cudaMalloc(&be->ws, need);
  if (e != cudaSuccess) return cuda_fail(e, "workspace allocation");
  be->ws_bytes = need;
  return ATTN_OK;
}

/* ---- attn_stats ------------------------------------------------------------------------ */
static attn_status stage(cuda_backend *be, void *dst, const void *src, size_t bytes) {
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, be->stream);
  return e == cudaSuccess ? ATTN_OK : cuda_fail(e, "stats: cudaMemcpyAsync of the spec arrays");
}

/* p with the host copies of its device arrays that ctx->spec_host holds; 0 when it holds
 * none of one that p needs. */
static int host_arrays(attn_ctx_t ctx, const attn_cuda_problem *p, attn_cuda_problem *out) {
  const attn__spec_host *h = ctx->spec_host;
  *out = *p;
  if (p->kv_used) return 0; /* never held: staged */
  if (!p->num_seqs && !p->block_mask) return 1;
  if (!h || (p->num_seqs && (!h->cu_q || h->cu_q_dev != p->cu_seqlens_q ||
                             h->cu_kv_dev != p->cu_seqlens_kv)))
    return 0;
  if (p->block_mask && (!h->mask || h->mask_dev != p->block_mask)) return 0;
  if (p->num_seqs) out->cu_seqlens_q = h->cu_q, out->cu_seqlens_kv = h->cu_kv;
  if (p->block_mask) out->block_mask = h->mask;
  return 1;
}

/* Before the launch: the stats of p's call are counted after it when the geometry is on the
 * host; else (varlen, block mask) its device arrays are queued for copying and the count
 * waits for them. */
static attn_status stats_begin(attn_ctx_t ctx, const attn_cuda_problem *p, int backward) {
  cuda_backend *be = ctx->backend_data;
  be->st.pending = 0;
  if (host_arrays(ctx, p, &be->st.now)) return ATTN_OK; /* counted in stats_end */
  const size_t ncu = p->num_seqs ? (size_t)(p->num_seqs + 1) * sizeof(int32_t) : 0;
  const size_t nbm = p->block_mask ? (size_t)(p->num_q_blocks * p->num_k_blocks) : 0;
  const size_t nku = p->kv_used ? (size_t)p->B * sizeof(int32_t) : 0;
  const size_t total = nku + 2 * ncu + nbm;
  cudaError_t e = cudaSuccess;
  if (total > be->st.host_bytes) { /* grows rarely; freeing waits for the copies */
    if (be->st.host) e = cudaFreeHost(be->st.host);
    be->st.host = NULL;
    be->st.host_bytes = 0;
    if (e == cudaSuccess) e = cudaMallocHost(&be->st.host, total);
    if (e != cudaSuccess) {
      be->st.host = NULL;
      return cuda_fail(e, "stats: pinned buffer for the spec arrays");
    }
    be->st.host_bytes = total;
  }
  if (!be->st.copied && (e = cudaEventCreateWithFlags(&be->st.copied, cudaEventDisableTiming))) {
    be->st.copied = NULL;
    return cuda_fail(e, "stats: cudaEventCreate");
  }
  char *h = be->st.host; /* kv_used [B], cu_seqlens_q, cu_seqlens_kv, mask bytes */
  if (nku) ATTN_CHECK(stage(be, h, p->kv_used, nku));
  h += nku;
  if (ncu) ATTN_CHECK(stage(be, h, p->cu_seqlens_q, ncu));
  if (ncu) ATTN_CHECK(stage(be, h + ncu, p->cu_seqlens_kv, ncu));
  if (nbm) ATTN_CHECK(stage(be, h + 2 * ncu, p->block_mask, nbm));
  if ((e = cudaEventRecord(be->st.copied, be->stream)) != cudaSuccess)
    return cuda_fail(e, "stats: cudaEventRecord");
  be->st.p = *p;
  be->st.backward = backward;
  be->st.pending = -1; /* armed: stats_end makes it pending */
  return ATTN_OK;
}

/* After a successful launch. sm90: the call ran a Hopper kernel (never with varlen or
 * block masks, so a deferred count is of the mma.sync or float32 kernels). */
static void stats_end(attn_ctx_t ctx, int backward, int sm90) {
  cuda_backend *be = ctx->backend_data;
  if (be->st.pending) be->st.pending = 1;
  else attn_cuda_count_tiles(&be->st.now, backward, sm90, &ctx->stats);
}

static attn_status cu_stats(attn_ctx_t ctx) {
  cuda_backend *be = ctx->backend_data;
  if (be->st.pending != 1) return ATTN_OK;
  be->st.pending = 0;
  cudaError_t e = cudaEventSynchronize(be->st.copied); /* the copies, not the kernels */
  if (e != cudaSuccess) return cuda_fail(e, "stats: cudaEventSynchronize");
  attn_cuda_problem h = be->st.p;
  const size_t ncu = h.num_seqs ? (size_t)(h.num_seqs + 1) : 0;
  const int32_t *cu = be->st.host;
  if (h.kv_used) {
    h.kv_used = cu;
    cu += h.B;
  }
  h.cu_seqlens_q = h.num_seqs ? cu : NULL;
  h.cu_seqlens_kv = h.num_seqs ? cu + ncu : NULL;
  if (h.block_mask) h.block_mask = (const uint8_t *)(cu + 2 * ncu);
  attn_cuda_count_tiles(&h, be->st.backward, 0, &ctx->stats);
  return ATTN_OK;
}

static attn_status cu_fwd(attn_ctx_t ctx, const attn__problem *pb, attn__view o, float *lse,
                          int64_t lse_rows) {
  cuda_backend *be = ctx->backend_data;
  attn_cuda_problem p = to_cuda(pb);
  ATTN_CHECK(attn_cuda_check(&p));
  ATTN_CHECK(workspace(ctx, &p));
  ATTN_CHECK(stats_begin(ctx, &p, 0));
  ATTN_CHECK(attn_cuda_fwd(&p, view_of(o), lse, lse_rows, be->ws, be->ws_bytes, be->stream));
  stats_end(ctx, 0, !strcmp(attn_cuda_last_fwd_path(), "sm90"));
  return ATTN_OK;
}

static attn_status cu_fwd_block(attn_ctx_t ctx, const attn__problem *pb, attn_state *st) {
  cuda_backend *be = ctx->backend_data;
  attn_cuda_problem p = to_cuda(pb);
  ATTN_CHECK(attn_cuda_check(&p));
  ATTN_CHECK(workspace(ctx, &p));
  ATTN_CHECK(stats_begin(ctx, &p, 0));
  ATTN_CHECK(attn_cuda_fwd_block(&p, st, be->ws, be->ws_bytes, be->stream));
  stats_end(ctx, 0, !strcmp(attn_cuda_last_fwd_path(), "sm90"));
  return ATTN_OK;
}

static attn_status cu_state_init(attn_ctx_t ctx, attn_state *st) {
  cuda_backend *be = ctx->backend_data;
  return attn_cuda_state_init(st, be->stream);
}

static attn_status cu_state_merge(attn_ctx_t ctx, attn_state *dst, const attn_state *src) {
  cuda_backend *be = ctx->backend_data;
  return attn_cuda_state_merge(dst, src, be->stream);
}

static attn_status cu_finalize(attn_ctx_t ctx, const attn__problem *pb, const attn_state *st,
                               attn__view o, float *lse) {
  cuda_backend *be = ctx->backend_data;
  attn_cuda_problem p = to_cuda(pb);
  return attn_cuda_finalize(&p, st, view_of(o), lse, be->stream);
}

static attn_status cu_bwd_prepare(attn_ctx_t ctx, const attn__problem *pb, attn__view o,
                                  attn__view dout, const float *lse, float *delta,
                                  float *dsinks) {
  cuda_backend *be = ctx->backend_data;
  attn_cuda_problem p = to_cuda(pb);
  return attn_cuda_bwd_prepare(&p, view_of(o), view_of(dout), lse, delta, dsinks, be->stream);
}

static attn_status cu_bwd_block(attn_ctx_t ctx, const attn__problem *pb, attn__view dout,
                                const float *lse, const float *delta, int64_t lse_rows,
                                attn__view dq, attn__view dk, attn__view dv) {
  cuda_backend *be = ctx->backend_data;
  attn_cuda_problem p = to_cuda(pb);
  ATTN_CHECK(attn_cuda_check(&p));
  ATTN_CHECK(workspace(ctx, &p));
  ATTN_CHECK(stats_begin(ctx, &p, 1));
  ATTN_CHECK(attn_cuda_bwd_block(&p, view_of(dout), lse, delta, lse_rows, view_of(dq),
                                 view_of(dk), view_of(dv), be->deterministic, be->ws,
                                 be->ws_bytes, be->stream));
  stats_end(ctx, 1, !strcmp(attn_cuda_last_bwd_path(), "sm90"));
  return ATTN_OK;
}

static void release(void *data) {
  cuda_backend *be = data;
  if (be && (be->ws || be->scratch)) {
    cudaStreamSynchronize(be->stream);
    cudaFree(be->ws);
    cudaFree(be->scratch);
  }
  if (be && be->blas) cublasDestroy(be->blas);
  if (be && be->st.copied) cudaEventDestroy(be->st.copied);
  if (be && be->st.host) cudaFreeHost(be->st.host);
  free(be);
}

static attn_status cu_mem_alloc(attn_ctx_t ctx, size_t bytes, void **out) {
  (void)ctx;
  cudaError_t e = cudaMalloc(out, bytes ? bytes : 256); /* 256-byte aligned */
  if (e != cudaSuccess) {
    *out = NULL;
    return attn__fail(e == cudaErrorMemoryAllocation ? ATTN_ERR_OUT_OF_MEMORY : ATTN_ERR_CUDA,
                      "bytes=%zu: cudaMalloc failed: %s", bytes, cudaGetErrorString(e));
  }
  return ATTN_OK;
}

static attn_status cu_mem_free(attn_ctx_t ctx, void *p) {
  cuda_backend *be = ctx->backend_data;
  if (!p) return ATTN_OK;
  cudaError_t e = cudaStreamSynchronize(be->stream);
  if (e == cudaSuccess) e = cudaFree(p);
  return e == cudaSuccess ? ATTN_OK : cuda_fail(e, "cudaFree");
}

static attn_status cu_mem_copy(attn_ctx_t ctx, void *dst, const void *src, size_t bytes,
                               attn_copy_kind kind) {
  cuda_backend *be = ctx->backend_data;
  static const enum cudaMemcpyKind how[] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                            cudaMemcpyDeviceToDevice};
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, how[kind], be->stream);
  if (e == cudaSuccess && kind != ATTN_COPY_CTX_TO_CTX) e = cudaStreamSynchronize(be->stream);
  return e == cudaSuccess ? ATTN_OK : cuda_fail(e, "cudaMemcpyAsync");
}

static attn_status cu_sync(attn_ctx_t ctx) {
  cuda_backend *be = ctx->backend_data;
  cudaError_t e = cudaStreamSynchronize(be->stream);
  return e == cudaSuccess ? ATTN_OK : cuda_fail(e, "cudaStreamSynchronize");
}

/* ---- timing events and scratch ------------------------------------------------------ */
static attn_status cu_event_create(attn_ctx_t ctx, void **ev) {
  (void)ctx;
  cudaEvent_t e = NULL;
  cudaError_t r = cudaEventCreate(&e);
  *ev = r == cudaSuccess ? (void *)e : NULL;
  return r == cudaSuccess ? ATTN_OK : cuda_fail(r, "cudaEventCreate");
}

static attn_status cu_event_record(attn_ctx_t ctx, void *ev) {
  cuda_backend *be = ctx->backend_data;
  cudaError_t r = cudaEventRecord((cudaEvent_t)ev, be->stream);
  return r == cudaSuccess ? ATTN_OK : cuda_fail(r, "cudaEventRecord");
}

static attn_status cu_event_elapsed(attn_ctx_t ctx, void *start, void *end, double *seconds) {
  (void)ctx;
  float ms = 0;
  cudaError_t r = cudaEventElapsedTime(&ms, (cudaEvent_t)start, (cudaEvent_t)end);
  *seconds = 1e-3 * (double)ms;
  return r == cudaSuccess ? ATTN_OK : cuda_fail(r, "cudaEventElapsedTime");
}

static void cu_event_destroy(attn_ctx_t ctx, void *ev) {
  (void)ctx;
  if (ev) cudaEventDestroy((cudaEvent_t)ev);
}

/* Growing frees the old buffer, which waits for the device; the same size again does not. */
static attn_status cu_scratch(attn_ctx_t ctx, int64_t n, float **out) {
  cuda_backend *be = ctx->backend_data;
  *out = NULL;
  if (n > be->scratch_n) {
    cudaError_t e = cudaFree(be->scratch);
    be->scratch = NULL;
    be->scratch_n = 0;
    if (e == cudaSuccess) e = cudaMalloc((void **)&be->scratch, (size_t)n * sizeof(float));
    if (e != cudaSuccess) {
      be->scratch = NULL;
      return attn__fail(e == cudaErrorMemoryAllocation ? ATTN_ERR_OUT_OF_MEMORY : ATTN_ERR_CUDA,
                        "scratch of %lld floats: %s", (long long)n, cudaGetErrorString(e));
    }
    be->scratch_n = n;
  }
  *out = be->scratch;
  return ATTN_OK;
}

/* ---- data movement for the ring and the layer (kernels in ops.cu) -------------------- */
static attn_status launched(int err, const char *what) {
  return err ? cuda_fail((cudaError_t)err, what) : ATTN_OK;
}

static attn_status cu_rows(attn_ctx_t ctx, attn__rows_op op, attn__view dst, attn_dtype dt,
                           attn__view src, attn_dtype st, int64_t B, int64_t S, int64_t H,
                           int64_t D) {
  cuda_backend *be = ctx->backend_data;
  if (op == ATTN__ROWS_ADD && (dt != ATTN_F32 || st != ATTN_F32))
    return attn__fail(ATTN_ERR_INTERNAL, "rows add: dtypes %d += %d, both must be F32", (int)dt,
                      (int)st);
  return launched(attn_cuda_rows((int)op, view_of(dst), (int)dt, view_of(src), (int)st, B, S, H,
                                 D, be->stream),
                  "rows kernel launch");
}

static attn_status cu_rope(attn_ctx_t ctx, attn__view x, int64_t B, int64_t S, int64_t H,
                           int64_t D, const float *cos_t, const float *sin_t, int inverse) {
  cuda_backend *be = ctx->backend_data;
  return launched(attn_cuda_rope(view_of(x), B, S, H, D, cos_t, sin_t, inverse, be->stream),
                  "RoPE kernel launch");
}

static attn_status blas_fail(cublasStatus_t s, const char *what) {
  return attn__fail(ATTN_ERR_CUBLAS, "%s: cuBLAS status %d", what, (int)s);
}

/* Float32 in, float32 out, float32 accumulation (CUBLAS_COMPUTE_32F): the layer's contract
 * is float32 and the CPU layer is the reference, so the default keeps full precision;
 * ATTN_TF32=1 lets the tensor cores round the inputs to TF32 (about 8x faster on H100-class
 * parts, 2^-11 relative input rounding). Row-major C = op(A) op(B) is column-major
 * C^T = op(B)^T op(A)^T, so the operands swap. */
static attn_status cu_gemm(attn_ctx_t ctx, int ta, int tb, int64_t M, int64_t N, int64_t K,
                           float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                           float beta, float *C, int64_t ldc) {
  cuda_backend *be = ctx->backend_data;
  if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || lda > INT32_MAX || ldb > INT32_MAX ||
      ldc > INT32_MAX)
    return attn__fail(ATTN_ERR_UNSUPPORTED, "gemm M=%lld N=%lld K=%lld exceeds cuBLAS's int range",
                      (long long)M, (long long)N, (long long)K);
  cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
  if (!be->blas) {
    s = cublasCreate(&be->blas);
    if (s != CUBLAS_STATUS_SUCCESS) {
      be->blas = NULL;
      return blas_fail(s, "cublasCreate");
    }
  }
  s = cublasSetStream(be->blas, be->stream);
  if (s != CUBLAS_STATUS_SUCCESS) return blas_fail(s, "cublasSetStream");
  const cublasComputeType_t compute =
      ATTN_PARAM("TF32", 0) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  s = cublasGemmEx(be->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                   (int)N, (int)M, (int)K, &alpha, B, CUDA_R_32F, (int)ldb, A, CUDA_R_32F,
                   (int)lda, &beta, C, CUDA_R_32F, (int)ldc, compute, CUBLAS_GEMM_DEFAULT);
  return s == CUBLAS_STATUS_SUCCESS ? ATTN_OK : blas_fail(s, "cublasGemmEx");
}

/* "host:pci-bus-id": processes that print the same string share one GPU. */
static attn_status cu_device_id(attn_ctx_t ctx, char *buf, size_t cap) {
  cuda_backend *be = ctx->backend_data;
  char host[128] = "?", bus[64] = "?";
  gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = '\0';
  cudaError_t e = cudaDeviceGetPCIBusId(bus, (int)sizeof bus, be->device);
  if (e != cudaSuccess) return cuda_fail(e, "cudaDeviceGetPCIBusId");
  snprintf(buf, cap, "%s:%s", host, bus);
  return ATTN_OK;
}

static const attn__backend_ops ops_cuda = {
    .name = "cuda", .device = ATTN_DEVICE_CUDA,
    .dtypes = (1u << ATTN_BF16) | (1u << ATTN_F16) | (1u << ATTN_F32),
    .fwd = cu_fwd, .fwd_block = cu_fwd_block, .state_init = cu_state_init,
    .state_merge = cu_state_merge, .finalize = cu_finalize, .bwd_prepare = cu_bwd_prepare,
    .bwd_block = cu_bwd_block, .mem_alloc = cu_mem_alloc, .mem_free = cu_mem_free,
    .mem_copy = cu_mem_copy, .sync = cu_sync, .event_create = cu_event_create,
    .event_record = cu_event_record, .event_elapsed = cu_event_elapsed,
    .event_destroy = cu_event_destroy, .scratch = cu_scratch, .stats = cu_stats,
    .rows = cu_rows, .rope = cu_rope,
    .gemm = cu_gemm, .device_id = cu_device_id, .release = release};

int attn__cuda_device_count(void) {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

attn_status attn__cuda_backend(attn_ctx_t ctx, const attn__backend_ops **ops) {
  int n = attn__cuda_device_count();
  if (n == 0)
    return attn__fail(ATTN_ERR_UNSUPPORTED, "backend=cuda: no CUDA device is visible");
  if (ctx->cfg.device < 0 || ctx->cfg.device >= n)
    return attn__fail(ATTN_ERR_INVALID_ARG, "cfg.device=%d: %d CUDA device(s) visible (0..%d)",
                      ctx->cfg.device, n, n - 1);
  cudaError_t e = cudaSetDevice(ctx->cfg.device);
  if (e != cudaSuccess) return cuda_fail(e, "cudaSetDevice");
  cuda_backend *be = calloc(1, sizeof *be);
  if (!be) return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "cuda backend allocation failed");
  be->device = ctx->cfg.device;
  be->stream = (cudaStream_t)ctx->cfg.stream;
  be->deterministic = ATTN_PARAM("DETERMINISTIC", 0) != 0;
  ctx->backend_data = be;
  *ops = &ops_cuda;
  return ATTN_OK;
}

/* The PCI bus id of device ordinal `device` (attn_device_pci_bus_id), for launchers that
 * match devices to hwloc's PCI objects. */
attn_status attn__cuda_pci_bus_id(int device, char *buf, size_t len) {
  int n = attn__cuda_device_count();
  if (device < 0 || device >= n)
    return attn__fail(ATTN_ERR_INVALID_ARG, "device=%d: %d CUDA device(s) visible%s", device, n,
                      n ? "" : " (none)");
  cudaError_t e = cudaDeviceGetPCIBusId(buf, (int)(len < 64 ? len : 64), device);
  return e == cudaSuccess ? ATTN_OK : cuda_fail(e, "cudaDeviceGetPCIBusId");
}
