/* validate.c — checks every argument of a public call and builds the resolved problem;
 * each failure names the argument and its value. Nothing is written on failure. */
#include "validate.h"

#include <string.h>

attn_status attn__copy_spec(const attn_spec *spec, attn_spec *out) {
  if (!spec) return attn__fail(ATTN_ERR_INVALID_ARG, "spec is NULL");
  if (spec->size < offsetof(attn_spec, sinks) || spec->size > (1u << 16))
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "spec->size=%zu is not a valid size; initialise with ATTN_SPEC_INIT",
                      spec->size);
  if (spec->version < 1 || spec->version > ATTN_SPEC_VERSION)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "spec->version=%u is not supported (this library knows 1..%d)",
                      spec->version, ATTN_SPEC_VERSION);
  attn_spec dflt = ATTN_SPEC_INIT;
  *out = dflt;
  memcpy(out, spec, spec->size < sizeof *out ? spec->size : sizeof *out);
  out->size = sizeof *out;
  return ATTN_OK;
}

attn_status attn__check_spec(const attn_spec *s) {
  if (s->num_heads_q <= 0)
    return attn__fail(ATTN_ERR_INVALID_ARG, "num_heads_q=%d must be positive", s->num_heads_q);
  if (s->num_heads_kv <= 0)
    return attn__fail(ATTN_ERR_INVALID_ARG, "num_heads_kv=%d must be positive",
                      s->num_heads_kv);
  if (s->num_heads_q % s->num_heads_kv)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "num_heads_q=%d is not a multiple of num_heads_kv=%d (GQA needs Hq %% Hkv == 0)",
                      s->num_heads_q, s->num_heads_kv);
  if (s->head_dim_qk <= 0 || s->head_dim_qk > ATTN__MAX_HEAD_DIM)
    return attn__fail(ATTN_ERR_UNSUPPORTED, "head_dim_qk=%d is not supported (1..%d)",
                      s->head_dim_qk, ATTN__MAX_HEAD_DIM);
  if (s->head_dim_v < 0 || s->head_dim_v > ATTN__MAX_HEAD_DIM)
    return attn__fail(ATTN_ERR_UNSUPPORTED, "head_dim_v=%d is not supported (1..%d, 0 = Dqk)",
                      s->head_dim_v, ATTN__MAX_HEAD_DIM);
  if (!(s->scale >= 0.0f) || isinf(s->scale))
    return attn__fail(ATTN_ERR_INVALID_ARG, "scale=%g must be finite and >= 0 (0 = 1/sqrt(Dqk))",
                      (double)s->scale);
  if (!(s->softcap >= 0.0f) || isinf(s->softcap))
    return attn__fail(ATTN_ERR_INVALID_ARG, "softcap=%g must be finite and >= 0 (0 = off)",
                      (double)s->softcap);
  if (s->window_left < -1 || s->window_right < -1)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "window=(%lld,%lld): each side must be >= 0, or -1 for unbounded",
                      (long long)s->window_left, (long long)s->window_right);
  if (s->num_seqs < 0 || (s->num_seqs > 0) != (s->cu_seqlens_q != NULL) ||
      (s->cu_seqlens_q != NULL) != (s->cu_seqlens_kv != NULL))
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "varlen needs cu_seqlens_q, cu_seqlens_kv and num_seqs > 0 together "
                      "(num_seqs=%d, cu_seqlens_q %s, cu_seqlens_kv %s)",
                      s->num_seqs, s->cu_seqlens_q ? "set" : "NULL",
                      s->cu_seqlens_kv ? "set" : "NULL");
  const attn_block_mask *bm = s->block_mask;
  if (bm && (bm->block_q <= 0 || bm->block_k <= 0 || bm->num_q_blocks <= 0 ||
             bm->num_k_blocks <= 0 || !bm->mask))
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "block_mask: block_q=%d block_k=%d num_q_blocks=%lld num_k_blocks=%lld "
                      "mask=%p — all must be positive and mask non-NULL",
                      bm->block_q, bm->block_k, (long long)bm->num_q_blocks,
                      (long long)bm->num_k_blocks, (const void *)bm->mask);
  return ATTN_OK;
}

/* Products of sizes stay far from int64 overflow. */
#define MAX_EXTENT (INT64_C(1) << 40)

/* Checks one tensor against its expected shape and the context's device. */
static attn_status check_shape(const char *name, const attn_tensor *t, const int64_t shape[4],
                               int is_output, attn__view *view);

static const char *dtype_name(int d) {
  return d == ATTN_F32 ? "F32" : d == ATTN_BF16 ? "BF16" : d == ATTN_F16 ? "F16" : "?";
}

static const char *device_name(int d) {
  return d == ATTN_DEVICE_HOST ? "HOST" : d == ATTN_DEVICE_CUDA ? "CUDA" : "?";
}

/* The backend takes storage dtype t for q/k/v/o (what attn_ctx_supports_dtype answers). */
static attn_status check_backend_dtype(attn_ctx_t ctx, const char *name, attn_dtype t) {
  const attn__backend_ops *be = ctx->ops;
  if ((unsigned)t <= 31u && ((be->dtypes >> t) & 1u)) return ATTN_OK;
  char have[64] = "";
  for (int d = ATTN_F32; d <= ATTN_F16; d++)
    if ((be->dtypes >> d) & 1u) {
      strcat(have, have[0] ? ", " : "");
      strcat(have, dtype_name(d));
    }
  return attn__fail(ATTN_ERR_UNSUPPORTED,
                    "%s dtype=%d (%s) is not supported by the %s backend (supported: %s)", name,
                    (int)t, dtype_name(t), be->name, have);
}

attn_status attn_ctx_supports_dtype(attn_ctx_t ctx, attn_dtype dtype) {
  if (!ctx) return attn__fail(ATTN_ERR_INVALID_ARG, "ctx is NULL");
  return check_backend_dtype(ctx, "tensor", dtype);
}

attn_status attn__check_tensor(attn_ctx_t ctx, const char *name, const attn_tensor *t,
                               int dtype, const int64_t shape[4], int is_output,
                               attn__view *view) {
  if (!t) return attn__fail(ATTN_ERR_INVALID_ARG, "%s is NULL", name);
  const attn__backend_ops *be = ctx->ops;
  const int accum = dtype == ATTN__DT_ACCUM;
  if (!(accum && t->dtype == ATTN_F32)) ATTN_CHECK(check_backend_dtype(ctx, name, t->dtype));
  if ((accum && t->dtype != ATTN_F32) || (dtype >= 0 && (int)t->dtype != dtype))
    return attn__fail(ATTN_ERR_INVALID_ARG, "%s dtype=%d (%s) must be %s", name, (int)t->dtype,
                      dtype_name(t->dtype),
                      accum ? "F32 (gradients are float32 accumulators)"
                            : dtype == ATTN_F32 ? "F32, the dtype of q, k and v"
                            : dtype == ATTN_BF16 ? "BF16, the dtype of q, k and v"
                                                 : "F16, the dtype of q, k and v");
  if (t->device != be->device)
    return attn__fail(ATTN_ERR_UNSUPPORTED,
                      "%s device=%d (%s): the %s backend needs %s tensors", name, (int)t->device,
                      device_name(t->device), be->name, device_name(be->device));
  return check_shape(name, t, shape, is_output, view);
}

/* Shape, strides and overlap of one tensor; fills view. */
static attn_status check_shape(const char *name, const attn_tensor *t, const int64_t shape[4],
                               int is_output, attn__view *view) {
  for (int d = 0; d < 4; d++) {
    if (t->shape[d] <= 0 || t->shape[d] > MAX_EXTENT)
      return attn__fail(ATTN_ERR_INVALID_ARG, "%s shape[%d]=%lld must be in 1..2^40", name, d,
                        (long long)t->shape[d]);
    if (t->shape[d] != shape[d])
      return attn__fail(ATTN_ERR_INVALID_ARG,
                        "%s shape=[%lld,%lld,%lld,%lld] but [%lld,%lld,%lld,%lld] was expected",
                        name, (long long)t->shape[0], (long long)t->shape[1],
                        (long long)t->shape[2], (long long)t->shape[3], (long long)shape[0],
                        (long long)shape[1], (long long)shape[2], (long long)shape[3]);
    if (t->stride[d] < 0 || t->stride[d] > MAX_EXTENT)
      return attn__fail(ATTN_ERR_INVALID_ARG, "%s stride[%d]=%lld must be in 0..2^40", name, d,
                        (long long)t->stride[d]);
  }
  if (t->stride[3] != 1)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "%s stride[3]=%lld: the last dimension must be contiguous (1)", name,
                      (long long)t->stride[3]);
  double span = 1;
  for (int d = 0; d < 4; d++) span += (double)(t->shape[d] - 1) * (double)t->stride[d];
  if (span > 9.0e18)
    return attn__fail(ATTN_ERR_INVALID_ARG, "%s spans %.3g elements, past int64", name, span);
  if (is_output) {
    /* Outputs must not overlap themselves: sorted by stride, each stride covers the
     * extent of the dimensions below it. */
    int order[4] = {0, 1, 2, 3};
    for (int a = 0; a < 4; a++)
      for (int b = a + 1; b < 4; b++)
        if (t->stride[order[b]] < t->stride[order[a]]) {
          int x = order[a];
          order[a] = order[b];
          order[b] = x;
        }
    int64_t need = 1;
    for (int a = 0; a < 4; a++) {
      int d = order[a];
      if (t->shape[d] == 1) continue;
      if (t->stride[d] < need)
        return attn__fail(ATTN_ERR_INVALID_ARG,
                          "%s strides=[%lld,%lld,%lld,%lld] make elements overlap", name,
                          (long long)t->stride[0], (long long)t->stride[1],
                          (long long)t->stride[2], (long long)t->stride[3]);
      need = t->stride[d] * t->shape[d];
    }
  }
  if (!t->data) return attn__fail(ATTN_ERR_INVALID_ARG, "%s->data is NULL", name);
  *view = attn__view_of(t->data, t->stride[0], t->stride[1], t->stride[2]);
  return ATTN_OK;
}

static attn_status check_varlen(const attn_spec *s, int64_t batch, int64_t seq_q,
                                int64_t seq_kv) {
  if (!s->num_seqs) return ATTN_OK;
  if (batch != 1)
    return attn__fail(ATTN_ERR_INVALID_ARG, "varlen needs batch=1 (packed sequences), got %lld",
                      (long long)batch);
  const int32_t *cq = s->cu_seqlens_q, *ck = s->cu_seqlens_kv;
  if (cq[0] != 0 || ck[0] != 0)
    return attn__fail(ATTN_ERR_INVALID_ARG, "cu_seqlens_q[0]=%d and cu_seqlens_kv[0]=%d must be 0",
                      cq[0], ck[0]);
  for (int32_t i = 0; i < s->num_seqs; i++)
    if (cq[i + 1] < cq[i] || ck[i + 1] < ck[i])
      return attn__fail(ATTN_ERR_INVALID_ARG,
                        "cu_seqlens must be non-decreasing: cu_seqlens_q[%d..%d]=%d,%d "
                        "cu_seqlens_kv[%d..%d]=%d,%d",
                        i, i + 1, cq[i], cq[i + 1], i, i + 1, ck[i], ck[i + 1]);
  if (cq[s->num_seqs] != seq_q || ck[s->num_seqs] != seq_kv)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "cu_seqlens_q[%d]=%d and cu_seqlens_kv[%d]=%d must equal the global "
                      "lengths %lld and %lld",
                      s->num_seqs, cq[s->num_seqs], s->num_seqs, ck[s->num_seqs],
                      (long long)seq_q, (long long)seq_kv);
  return ATTN_OK;
}

static attn_status check_pos(const attn_block_pos *pos, int64_t sq, int64_t skv,
                             int64_t *seq_q, int64_t *seq_kv) {
  *seq_q = pos->seq_q ? pos->seq_q : sq;
  *seq_kv = pos->seq_kv ? pos->seq_kv : skv;
  if (pos->q_pos0 < 0 || pos->k_pos0 < 0 || pos->q_row0 < 0 || *seq_q < 0 || *seq_kv < 0 ||
      pos->q_pos0 + sq > *seq_q || pos->k_pos0 + skv > *seq_kv)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "block position q_pos0=%lld (+%lld rows) k_pos0=%lld (+%lld rows) "
                      "q_row0=%lld lies outside seq_q=%lld seq_kv=%lld",
                      (long long)pos->q_pos0, (long long)sq, (long long)pos->k_pos0,
                      (long long)skv, (long long)pos->q_row0, (long long)*seq_q,
                      (long long)*seq_kv);
  return ATTN_OK;
}

attn_status attn__no_kv_cache(const attn_spec *spec, const char *who) {
  attn_spec s;
  if (!spec || attn__copy_spec(spec, &s) != ATTN_OK || !s.kv_cache) return ATTN_OK;
  return attn__fail(ATTN_ERR_UNSUPPORTED,
                    "spec->kv_cache is set, but %s takes no KV cache (attn_fwd and "
                    "attn_fwd_block do: the cache is for inference)",
                    who);
}

/* The KV cache's K/V shapes: paged K [num_pages, page_size, Hkv, Dqk] (its Skv is
 * pages_per_seq * page_size), else the usual [B, Skv, ...]; fills *skv. */
static attn_status cache_shape(const attn_spec *s, const attn_tensor *k, int64_t batch,
                               int64_t *k_b, int64_t *skv) {
  const attn_kv_cache *c = s->kv_cache;
  *k_b = batch;
  *skv = k->shape[1];
  if (c && c->seqused_kv && s->num_seqs)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "kv_cache->seqused_kv with varlen (num_seqs=%d): varlen gives each "
                      "sequence's keys by cu_seqlens_kv",
                      s->num_seqs);
  if (!c || !c->block_table) {
    if (c && c->pages_per_seq)
      return attn__fail(ATTN_ERR_INVALID_ARG,
                        "kv_cache->pages_per_seq=%d is set but kv_cache->block_table is NULL",
                        c->pages_per_seq);
    return ATTN_OK;
  }
  if (c->pages_per_seq <= 0)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "kv_cache->pages_per_seq=%d must be positive with a block_table",
                      c->pages_per_seq);
  if (s->num_seqs)
    return attn__fail(ATTN_ERR_UNSUPPORTED,
                      "kv_cache->block_table with varlen (num_seqs=%d): a paged cache serves "
                      "batched problems (B sequences, kv_cache->seqused_kv)",
                      s->num_seqs);
  *k_b = k->shape[0];                       /* num_pages */
  *skv = (int64_t)c->pages_per_seq * k->shape[1]; /* pages_per_seq * page_size */
  if (*skv > MAX_EXTENT)
    return attn__fail(ATTN_ERR_INVALID_ARG, "kv_cache: pages_per_seq=%d x page_size=%lld keys is past 2^40",
                      c->pages_per_seq, (long long)k->shape[1]);
  return ATTN_OK;
}

/* Host-side checks of the cache's arrays: used lengths within the keys, and each page a
 * batch's used keys of this block reach within the pool. */
static attn_status check_cache(const attn_spec *s, const attn__problem *pb, int64_t k_pos0,
                               int64_t num_pages) {
  const attn_kv_cache *c = s->kv_cache;
  if (!c) return ATTN_OK;
  for (int64_t b = 0; b < pb->B; b++) {
    int64_t used = pb->seq_kv;
    if (c->seqused_kv) {
      used = c->seqused_kv[b];
      if (used < 0 || used > pb->seq_kv)
        return attn__fail(ATTN_ERR_INVALID_ARG,
                          "kv_cache->seqused_kv[%lld]=%lld must be in 0..%lld (the keys)",
                          (long long)b, (long long)used, (long long)pb->seq_kv);
    }
    if (!c->block_table) continue;
    int64_t rows = used - k_pos0; /* local keys in use */
    rows = rows < 0 ? 0 : rows > pb->skv ? pb->skv : rows;
    const int64_t pages = (rows + pb->k.page_rows - 1) / pb->k.page_rows;
    for (int64_t i = 0; i < pages; i++) {
      const int32_t e = c->block_table[b * c->pages_per_seq + i];
      if (e < 0 || e >= num_pages)
        return attn__fail(ATTN_ERR_INVALID_ARG,
                          "kv_cache->block_table[%lld][%lld]=%d is not a page of k and v "
                          "(0..%lld); batch %lld uses %lld keys",
                          (long long)b, (long long)i, e, (long long)num_pages - 1,
                          (long long)b, (long long)used);
    }
  }
  return ATTN_OK;
}

attn_status attn__make_problem(attn_ctx_t ctx, const attn_spec *spec_in, const attn_tensor *q,
                               const attn_tensor *k, const attn_tensor *v,
                               const attn_block_pos *pos, attn__problem *pb) {
  if (!ctx) return attn__fail(ATTN_ERR_INVALID_ARG, "ctx is NULL");
  attn_spec s;
  ATTN_CHECK(attn__copy_spec(spec_in, &s));
  ATTN_CHECK(attn__check_spec(&s));
  if (!q || !k || !v)
    return attn__fail(ATTN_ERR_INVALID_ARG, "%s is NULL", !q ? "q" : !k ? "k" : "v");
  memset(pb, 0, sizeof *pb);
  pb->B = q->shape[0];
  pb->Hq = s.num_heads_q;
  pb->Hkv = s.num_heads_kv;
  pb->Dqk = s.head_dim_qk;
  pb->Dv = s.head_dim_v ? s.head_dim_v : s.head_dim_qk;
  pb->sq = q->shape[1];
  int64_t kb; /* k's and v's first extent: B, or the pages of a paged cache */
  ATTN_CHECK(cache_shape(&s, k, pb->B, &kb, &pb->skv));
  const int paged = s.kv_cache && s.kv_cache->block_table;
  const int64_t krows = paged ? k->shape[1] : pb->skv;
  const int64_t qs[4] = {pb->B, pb->sq, pb->Hq, pb->Dqk};
  const int64_t ks[4] = {kb, krows, pb->Hkv, pb->Dqk};
  const int64_t vs[4] = {kb, krows, pb->Hkv, pb->Dv};
  ATTN_CHECK(attn__check_tensor(ctx, "q", q, -1, qs, 0, &pb->q));
  ATTN_CHECK(attn__check_tensor(ctx, "k", k, q->dtype, ks, 0, &pb->k));
  ATTN_CHECK(attn__check_tensor(ctx, "v", v, q->dtype, vs, 0, &pb->v));
  if (paged) { /* rows reach their page through the table */
    const attn_kv_cache *c = s.kv_cache;
    pb->k.pages = pb->v.pages = c->block_table;
    pb->k.pages_per_b = pb->v.pages_per_b = c->pages_per_seq;
    pb->k.page_rows = pb->v.page_rows = krows;
    pb->k.num_pages = pb->v.num_pages = kb;
  }
  attn_block_pos dpos = ATTN_BLOCK_POS_INIT;
  if (!pos) pos = &dpos;
  ATTN_CHECK(check_pos(pos, pb->sq, pb->skv, &pb->seq_q, &pb->seq_kv));
  /* cu_seqlens and the cache's arrays live in the backend's memory: read them here only
   * when that is the host (a device backend's kernels bound every index by the tensor
   * sizes). */
  if (ctx->ops->device == ATTN_DEVICE_HOST) {
    ATTN_CHECK(check_varlen(&s, pb->B, pb->seq_q, pb->seq_kv));
    ATTN_CHECK(check_cache(&s, pb, pos->k_pos0, kb));
  } else if (s.num_seqs && pb->B != 1)
    return attn__fail(ATTN_ERR_INVALID_ARG, "varlen needs batch=1 (packed sequences), got %lld",
                      (long long)pb->B);
  pb->dtype = q->dtype;
  pb->q_row0 = pos->q_row0;
  pb->q_pos0 = pos->q_pos0;
  pb->k_pos0 = pos->k_pos0;
  pb->scale = s.scale > 0 ? s.scale : 1.0f / sqrtf((float)s.head_dim_qk);
  pb->softcap = s.softcap;
  pb->causal = s.causal != 0;
  pb->window_left = s.window_left;
  pb->window_right = s.window_right;
  pb->sinks = s.sinks;
  pb->alibi = s.alibi_slopes;
  pb->cu_q = s.cu_seqlens_q;
  pb->cu_kv = s.cu_seqlens_kv;
  pb->num_seqs = s.num_seqs;
  pb->block_mask = s.block_mask;
  pb->kv_used = s.kv_cache ? s.kv_cache->seqused_kv : NULL;
  return ATTN_OK;
}

attn_status attn__check_out(attn_ctx_t ctx, const char *name, const attn_tensor *t, int dtype,
                            int64_t b, int64_t s, int64_t h, int64_t d, attn__view *view) {
  const int64_t shape[4] = {b, s, h, d};
  return attn__check_tensor(ctx, name, t, dtype, shape, 1, view);
}
