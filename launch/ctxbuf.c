/* ctxbuf.c — moves a rank's shard into its context's memory and the outputs back. The
 * conversions go through a bounded host staging buffer, in pieces, so that a long shard
 * does not need a second full-size host copy; float32 goes straight through. */
#include "kvcache.h"
#include "ctxbuf.h"

#include <stdlib.h>
#include <string.h>

#include "dtype.h"

#define STAGE_ELEMS ((int64_t)1 << 24) /* 16 Mi elements (32 MiB of bf16) per piece */

attn_status ctxbuf_put(attn_ctx_t ctx, const float *host, int64_t n, attn_dtype t, void **dev) {
  size_t es = attn_dtype_size(t);
  attn_status st = attn_ctx_alloc(ctx, (size_t)n * es, dev);
  if (st != ATTN_OK || n == 0) return st;
  if (t == ATTN_F32) return attn_ctx_copy(ctx, *dev, host, (size_t)n * es, ATTN_COPY_HOST_TO_CTX);
  int64_t piece = n < STAGE_ELEMS ? n : STAGE_ELEMS;
  void *stage = malloc((size_t)piece * es);
  if (!stage) return ATTN_ERR_OUT_OF_MEMORY;
  for (int64_t at = 0; at < n && st == ATTN_OK; at += piece) {
    int64_t m = n - at < piece ? n - at : piece;
    dtype_pack(host + at, m, t, stage);
    st = attn_ctx_copy(ctx, (char *)*dev + at * es, stage, (size_t)m * es, ATTN_COPY_HOST_TO_CTX);
  }
  free(stage);
  return st;
}

attn_status ctxbuf_get(attn_ctx_t ctx, const void *dev, int64_t n, attn_dtype t, float *host) {
  size_t es = attn_dtype_size(t);
  if (n == 0) return ATTN_OK;
  if (t == ATTN_F32) return attn_ctx_copy(ctx, host, dev, (size_t)n * es, ATTN_COPY_CTX_TO_HOST);
  int64_t piece = n < STAGE_ELEMS ? n : STAGE_ELEMS;
  void *stage = malloc((size_t)piece * es);
  attn_status st = stage ? ATTN_OK : ATTN_ERR_OUT_OF_MEMORY;
  for (int64_t at = 0; at < n && st == ATTN_OK; at += piece) {
    int64_t m = n - at < piece ? n - at : piece;
    st = attn_ctx_copy(ctx, stage, (const char *)dev + at * es, (size_t)m * es, ATTN_COPY_CTX_TO_HOST);
    if (st == ATTN_OK) dtype_unpack(stage, m, t, host + at);
  }
  free(stage);
  return st;
}

int ctxbuf_wants_copies(attn_ctx_t ctx) {
  return attn_ctx_device(ctx) != ATTN_DEVICE_HOST || getenv("ATTNRUN_CTX_COPIES") != NULL;
}

/* Elements of input slot i and output slot o of this rank's shard. */
static int64_t in_elems(const problem *p, int i) {
  const attn_spec *s = &p->spec;
  int64_t rows = (i == T_Q || i == T_DO) ? p->q_rows * p->hq : p->kv_rows * p->hk;
  return p->batch * rows * ((i == T_Q || i == T_K) ? s->head_dim_qk : s->head_dim_v);
}

static int64_t out_elems(const problem *p, int o) {
  static const int like[OUT_COUNT] = {T_DO, -1, T_Q, T_K, T_V, -1};
  if (o == OUT_LSE) return p->batch * p->hq * p->q_rows;
  if (o == OUT_DSINKS) return p->hq;
  return in_elems(p, like[o]);
}

/* A raw copy of a host array (spec arrays) into context memory. */
static attn_status put_bytes(attn_ctx_t ctx, const void *host, size_t bytes, void **dev) {
  attn_status st = attn_ctx_alloc(ctx, bytes, dev);
  return st == ATTN_OK ? attn_ctx_copy(ctx, *dev, host, bytes, ATTN_COPY_HOST_TO_CTX) : st;
}

attn_status ctxbuf_spec(attn_ctx_t ctx, const attn_spec *g, void *arrays[CTXBUF_ARRAYS],
                        attn_block_mask *bm, attn_spec *out) {
  size_t hq = (size_t)g->num_heads_q * sizeof(float), cu = (size_t)(g->num_seqs + 1) * sizeof(int32_t);
  attn_status st = ATTN_OK;
  *out = *g;
  if (g->sinks && st == ATTN_OK) st = put_bytes(ctx, g->sinks, hq, &arrays[0]);
  if (g->alibi_slopes && st == ATTN_OK) st = put_bytes(ctx, g->alibi_slopes, hq, &arrays[1]);
  if (g->num_seqs && st == ATTN_OK) st = put_bytes(ctx, g->cu_seqlens_q, cu, &arrays[2]);
  if (g->num_seqs && st == ATTN_OK) st = put_bytes(ctx, g->cu_seqlens_kv, cu, &arrays[3]);
  if (g->block_mask && st == ATTN_OK)
    st = put_bytes(ctx, g->block_mask->mask,
                   (size_t)(g->block_mask->num_q_blocks * g->block_mask->num_k_blocks), &arrays[4]);
  if (st != ATTN_OK) return st;
  if (g->sinks) out->sinks = arrays[0];
  if (g->alibi_slopes) out->alibi_slopes = arrays[1];
  if (g->num_seqs) out->cu_seqlens_q = arrays[2], out->cu_seqlens_kv = arrays[3];
  if (g->block_mask) {
    *bm = *g->block_mask;
    bm->mask = arrays[4];
    out->block_mask = bm;
  }
  return ATTN_OK;
}

/* The local spec with its arrays in device memory (offsets to this rank's heads kept). */
static attn_status spec_arrays(ctx_tensors *t, const problem *p) {
  attn_spec g;
  attn_status st = ctxbuf_spec(t->ctx, &p->spec, t->arrays, &t->bm, &g);
  if (st != ATTN_OK) return st;
  if (p->kv_used) { /* the KV cache: lengths [B], table [B, pages_per_seq] */
    t->kc = p->kv_cache;
    st = put_bytes(t->ctx, p->kv_used, (size_t)p->batch * sizeof(int32_t), &t->arrays[5]);
    if (st == ATTN_OK && p->block_table)
      st = put_bytes(t->ctx, p->block_table,
                     (size_t)(p->batch * p->pages_per_seq) * sizeof(int32_t), &t->arrays[6]);
    if (st != ATTN_OK) return st;
    t->kc.seqused_kv = t->arrays[5];
    if (p->block_table) t->kc.block_table = t->arrays[6];
    t->spec.kv_cache = &t->kc;
  }
  if (g.sinks) t->spec.sinks = g.sinks + p->hq0;
  if (g.alibi_slopes) t->spec.alibi_slopes = g.alibi_slopes + p->hq0;
  if (g.num_seqs) t->spec.cu_seqlens_q = g.cu_seqlens_q, t->spec.cu_seqlens_kv = g.cu_seqlens_kv;
  if (g.block_mask) t->spec.block_mask = g.block_mask;
  return ATTN_OK;
}

static attn_status copies(ctx_tensors *t, const problem *p, float *const host[OUT_COUNT],
                          const char **what) {
  const float *in[T_COUNT] = {p->q, p->k, p->v, p->dout};
  attn_status st = ATTN_OK;
  *what = "copying the inputs to the device (attn_ctx_alloc / attn_ctx_copy)";
  for (int i = 0; i < T_COUNT && st == ATTN_OK; i++)
    if (in[i]) st = ctxbuf_put(t->ctx, in[i], in_elems(p, i), t->dtype, &t->in[i]);
  if (st == ATTN_OK) st = spec_arrays(t, p);
  *what = "allocating the outputs on the device";
  for (int o = 0; o < OUT_COUNT && st == ATTN_OK; o++) /* the host buffers hold NaN */
    if (host[o]) st = ctxbuf_put(t->ctx, host[o], out_elems(p, o), o == OUT_O ? t->dtype : ATTN_F32, &t->out[o]);
  return st;
}

attn_status ctxbuf_setup(ctx_tensors *t, attn_ctx_t ctx, attn_dtype dtype, const problem *p,
                         float *const host[OUT_COUNT], const char **what) {
  memset(t, 0, sizeof *t);
  t->ctx = ctx, t->dtype = dtype;
  t->spec = problem_local_spec(p);
  /* bf16/f16 on the cpu backend: the float32 host buffers are converted into copies too */
  t->copies = ctxbuf_wants_copies(ctx) || dtype != ATTN_F32;
  attn_status st = ATTN_OK;
  if (t->copies) {
    st = copies(t, p, host, what);
  } else {
    float *in[T_COUNT] = {p->q, p->k, p->v, p->dout};
    for (int i = 0; i < T_COUNT; i++)
      t->in[i] = in[i];
    for (int o = 0; o < OUT_COUNT; o++)
      t->out[o] = host[o];
  }
  if (st == ATTN_OK && p->block_table) { /* a paged cache: K and V in its pages */
    *what = "scattering K and V into the cache's pages (attn_ctx_alloc / attn_ctx_copy)";
    st = kvcache_pool(ctx, p, T_K, dtype, &t->pool[0]);
    if (st == ATTN_OK) st = kvcache_pool(ctx, p, T_V, dtype, &t->pool[1]);
  }
  return st;
}

attn_status ctxbuf_download(const ctx_tensors *t, const problem *p, float *const host[OUT_COUNT]) {
  attn_status st = ATTN_OK;
  if (!t->copies) return ATTN_OK;
  for (int o = 0; o < OUT_COUNT && st == ATTN_OK; o++)
    if (host[o] && t->out[o])
      st = ctxbuf_get(t->ctx, t->out[o], out_elems(p, o), o == OUT_O ? t->dtype : ATTN_F32, host[o]);
  return st;
}

void ctxbuf_free(ctx_tensors *t) {
  if (t->copies) {
    for (int i = 0; i < T_COUNT; i++)
      attn_ctx_free(t->ctx, t->in[i]);
    for (int o = 0; o < OUT_COUNT; o++)
      attn_ctx_free(t->ctx, t->out[o]);
    for (int a = 0; a < CTXBUF_ARRAYS; a++)
      attn_ctx_free(t->ctx, t->arrays[a]);
  }
  for (int i = 0; i < 2; i++) attn_ctx_free(t->ctx, t->pool[i]);
  memset(t, 0, sizeof *t);
}
