/* backend.c — the CUDA backend's function table for the runtime: device and stream choice,
 * a workspace kept per context, and the translation of the resolved problem into the
 * kernels' C interface (cuda_attn.h). Built only with the CUDA backend. On a CUDA context
 * every tensor and every spec array (sinks, ALiBi slopes, cu_seqlens, block mask) is device
 * memory; calls enqueue on the context's stream and do not wait for it. */
#include "cuda_attn.h"
#include "internal.h"

#include <cuda_runtime.h>
#include <stdlib.h>

typedef struct {
  int device;
  cudaStream_t stream; /* the caller's (cfg.stream) or the default stream */
  void *ws;            /* workspace, grown on demand */
  size_t ws_bytes;
  int deterministic; /* ATTN_DETERMINISTIC=1: bitwise-repeatable dQ */
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

static attn_status cu_fwd(attn_ctx_t ctx, const attn__problem *pb, attn__view o, float *lse,
                          int64_t lse_rows) {
  cuda_backend *be = ctx->backend_data;
  attn_cuda_problem p = to_cuda(pb);
  ATTN_CHECK(attn_cuda_check(&p));
  ATTN_CHECK(workspace(ctx, &p));
  return attn_cuda_fwd(&p, view_of(o), lse, lse_rows, be->ws, be->ws_bytes, be->stream);
}

static attn_status cu_fwd_block(attn_ctx_t ctx, const attn__problem *pb, attn_state *st) {
  cuda_backend *be = ctx->backend_data;
  attn_cuda_problem p = to_cuda(pb);
  ATTN_CHECK(attn_cuda_check(&p));
  ATTN_CHECK(workspace(ctx, &p));
  return attn_cuda_fwd_block(&p, st, be->ws, be->ws_bytes, be->stream);
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
  return attn_cuda_bwd_block(&p, view_of(dout), lse, delta, lse_rows, view_of(dq), view_of(dk),
                             view_of(dv), be->deterministic, be->ws, be->ws_bytes, be->stream);
}

static void release(void *data) {
  cuda_backend *be = data;
  if (be && be->ws) {
    cudaStreamSynchronize(be->stream);
    cudaFree(be->ws);
  }
  free(be);
}

static const attn__backend_ops ops_cuda = {
    "cuda", ATTN_DEVICE_CUDA, (1u << ATTN_BF16) | (1u << ATTN_F16) | (1u << ATTN_F32), cu_fwd, cu_fwd_block,
    cu_state_init, cu_state_merge, cu_finalize, cu_bwd_prepare, cu_bwd_block,
    release};

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


