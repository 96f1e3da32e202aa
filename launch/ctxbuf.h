/* ctxbuf.h — this rank's tensors where its context wants them. On the cpu backend in
 * float32 they are the launcher's own host buffers (no copy). On cuda (and for bf16/f16
 * on the cpu backend) they are attn_ctx_alloc'ed
 * copies: Q, K, V, dO and O in the run's dtype (converted from the rounded float copies),
 * LSE and the gradients float32, and the spec's arrays (sinks, ALiBi slopes, cu_seqlens,
 * block-mask bytes) in device memory too; outputs start as NaN, and come back to the host
 * buffers (converted to float32) for --check and --save. */
#ifndef ATTNRUN_LAUNCH_CTXBUF_H
#define ATTNRUN_LAUNCH_CTXBUF_H

#include <stddef.h>
#include <stdint.h>

#include "attnrun.h"
#include "problem.h"

/* Host outputs, in this order: o, lse, dq, dk, dv, dsinks (NULL: not computed). */
enum { OUT_O, OUT_LSE, OUT_DQ, OUT_DK, OUT_DV, OUT_DSINKS, OUT_COUNT };

#define CTXBUF_ARRAYS 7

typedef struct {
  attn_ctx_t ctx;
  int copies;       /* 1: device copies (free them); 0: the host buffers themselves */
  attn_dtype dtype; /* of q, k, v, dout, o */
  void *in[T_COUNT]; /* q [B,q_rows,hq,Dqk], k, v [B,kv_rows,hk,D], dout [B,q_rows,hq,Dv] */
  void *out[OUT_COUNT]; /* o (dtype), lse, dq, dk, dv, dsinks (float32) */
  attn_spec spec;   /* this rank's heads; arrays where the tensors live */
  attn_block_mask bm;
  attn_kv_cache kc;
  void *arrays[CTXBUF_ARRAYS]; /* copies of sinks, alibi, cu_q, cu_kv, mask bytes, the cache's
                                * block table and used lengths */
  void *pool[2];    /* a paged cache: K and V [num_pages, page_size, hk, D], or NULL */
} ctx_tensors;

/* Views (or copies) of p's shard and the host outputs host[OUT_COUNT]. On failure *what
 * names the step. */
attn_status ctxbuf_setup(ctx_tensors *t, attn_ctx_t ctx, attn_dtype dtype, const problem *p,
                         float *const host[OUT_COUNT], const char **what);

/* Device outputs back into host[] (float32); nothing on the cpu backend. */
attn_status ctxbuf_download(const ctx_tensors *t, const problem *p, float *const host[OUT_COUNT]);

void ctxbuf_free(ctx_tensors *t);

/* Whether tensors go to the context as copies: on a device backend, and on the cpu backend
 * when ATTNRUN_CTX_COPIES is set (tests: the device path's copies, with float32 on the
 * host, where no GPU is). */
int ctxbuf_wants_copies(attn_ctx_t ctx);

/* The spec g with its arrays (sinks, ALiBi slopes, cu_seqlens, block-mask bytes) copied
 * into ctx's memory: *out is g with those pointers (bm: the mask's header, which
 * out->block_mask points to); arrays[0..5) are the copies, for attn_ctx_free (NULL: none).
 * A KV cache's arrays need the batch: spec_arrays (ctxbuf.c) copies them. */
attn_status ctxbuf_spec(attn_ctx_t ctx, const attn_spec *g, void *arrays[CTXBUF_ARRAYS],
                        attn_block_mask *bm, attn_spec *out);

/* n floats of host, converted to dtype t, into new context memory *dev. */
attn_status ctxbuf_put(attn_ctx_t ctx, const float *host, int64_t n, attn_dtype t, void **dev);

/* n elements of t at dev back into host floats. */
attn_status ctxbuf_get(attn_ctx_t ctx, const void *dev, int64_t n, attn_dtype t, float *host);

#endif
