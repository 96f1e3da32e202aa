/* layer.c — the tensor-parallel attention layer (DESIGN.md §4): QKV projection through BLAS,
 * RoPE, attention on this rank's heads (attn_fwd, or the ring over the CP group when
 * cp > 1), the W_O projection and an AllReduce over the TP group; backward mirrors it.
 *
 * Weight layouts (row-major, this rank's shard):
 *   w_qkv [d_model, cols], cols = hq*Dqk + hk*Dqk + hk*Dv = [W_q | W_k | W_v] of its heads,
 *         head-major inside each block (column h*Dqk + e is element e of local head h);
 *   w_o   [hq*Dv, d_model], row h*Dv + e belongs to element e of local query head h.
 * Activations: QKV [B, S_loc, cols] (one SGEMM, M = B*S_loc); Q, K, V are strided views
 * into it, O [B, S_loc, hq, Dv] is contiguous. RoPE: see rope.h (half-split pairing),
 * positions are global rows, so every CP shard (zigzag too) gets its rows' angles.
 *
 * Failures never leave a peer waiting: argument checks and allocations are agreed in a
 * pre-flight (attn__comm_agree) before the first collective, and every later collective
 * carries a per-status failure count in a few trailing slots, so a rank that failed
 * locally still joins, and every rank learns the outcome from the same sum. After a
 * failure the contents of the outputs are unspecified.
 *
 * On a CUDA context every float32 argument (x, weights, y, gradients, dsinks) is device
 * memory; the GEMMs run through the backend (cuBLAS, float32 in and out with float32
 * accumulation — the layer's float32 contract, with the CPU layer as its reference; see
 * kernels/cuda/backend.c for the TF32 opt-in), RoPE runs in float32 on the projections, and
 * Q/K/V (then dO) are converted to bf16 for the attention kernels, which take only bf16/f16;
 * O comes back as bf16 and is widened for the W_O GEMM. The AllReduces of device buffers go
 * over the group's device transport; verdicts and agreement over MPI.
 *
 * Ownership: forward copies x, w_qkv and w_o (backward needs them and is not given them
 * again), so the caller may reuse those buffers. The caller's spec pointers (sinks, alibi,
 * cu_seqlens, block mask) must outlive the layer; sinks and slopes are read at each call,
 * so updating them in place is seen. d(sinks) has no output in the layer API yet. */
#include "group.h"
#include "rope.h"
#include "validate.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Layer-owned buffers, grown on demand and freed by destroy. */
enum {
  BUF_X,      /* [B, S_loc, d]       copy of x */
  BUF_WQKV,   /* [d, cols]           copy of w_qkv */
  BUF_WO,     /* [hq*Dv, d]          copy of w_o */
  BUF_QKV,    /* [B, S_loc, cols]    Q, K after RoPE, V */
  BUF_O,      /* [B, S_loc, hq, Dv] */
  BUF_LSE,    /* [B, hq, S_loc] */
  BUF_COS,    /* [S_loc, Dqk/2] */
  BUF_SIN,    /* [S_loc, Dqk/2] */
  BUF_RED,    /* [B*S_loc*d + NSTATUS] y or dx partial, then its TP sum */
  BUF_DOUT,   /* [B, S_loc, hq, Dv] */
  BUF_DQKV,   /* [B, S_loc, cols]    dQ, dK (before and after inverse RoPE), dV */
  BUF_PACK,   /* KV-head and CP sums of the weight gradients (+ NSTATUS) */
  BUF_DSINKS, /* [hq] */
  /* The attention's own dtype copies (bf16) on a device context; unused on the host. */
  BUF_QKV16,  /* [B, S_loc, cols]    bf16 Q, K (after RoPE), V */
  BUF_O16,    /* [B, S_loc, hq, Dv]  bf16 O */
  BUF_DOUT16, /* [B, S_loc, hq, Dv]  bf16 dO */
  BUF_COUNT
};
static const char *const buf_name[BUF_COUNT] = {
    "x copy", "w_qkv copy", "w_o copy", "QKV", "O", "LSE", "RoPE cos", "RoPE sin",
    "AllReduce staging", "dO", "dQKV", "weight-gradient staging", "dsinks", "bf16 QKV",
    "bf16 O", "bf16 dO"};

#define NSTATUS (ATTN_ERR_INTERNAL + 1) /* trailing failure-count slots of each sum */

struct attn_layer_s {
  attn_group_t grp;
  attn_layer_config cfg;  /* the caller's config, copied; cfg.spec is the global spec */
  attn_spec spec;         /* this rank's heads: Hq = hq, Hkv = hk, sinks/alibi sliced */
  attn_layer_heads h;
  int64_t d, dqk, dv, cols; /* d_model, Dqk, Dv, columns of w_qkv */
  attn__comm *kv;         /* TP ranks sharing this rank's replicated KV head; NULL if split */
  attn_dtype adt;         /* dtype the attention runs in (cfg.attention_dtype; auto: F32 on
                           * the host, BF16 on a device) */
  int have_fwd;           /* the last forward succeeded: backward may run */
  int have_bwd;           /* the last backward succeeded: BUF_DSINKS holds d(sinks) */
  int64_t batch, seq, rows; /* of the last forward; rows = S_loc */
  attn_cp_shard shard;
  int64_t rope_seq;       /* seq the cached RoPE table was built for (-1: none) */
  float *buf[BUF_COUNT];   /* the context's memory */
  int64_t cap[BUF_COUNT];
};

/* ---- small helpers ------------------------------------------------------------------- */

static attn_ctx_t ctx_of(const attn_layer_t L) { return L->grp->ctx; }

/* n floats (4-byte elements) of context memory in buf[which]. */
static attn_status reserve(attn_layer_t L, int which, int64_t n) {
  if (n <= L->cap[which]) return ATTN_OK;
  attn_ctx_t ctx = ctx_of(L);
  if (L->buf[which]) ctx->ops->mem_free(ctx, L->buf[which]);
  void *p = NULL;
  attn_status st = ctx->ops->mem_alloc(ctx, (size_t)n * sizeof(float), &p);
  L->buf[which] = p;
  L->cap[which] = p ? n : 0;
  if (st != ATTN_OK)
    return attn__fail(st, "layer: %s buffer of %lld floats: %s", buf_name[which], (long long)n,
                      attn_last_error());
  return ATTN_OK;
}

/* n bf16 elements. */
static attn_status reserve16(attn_layer_t L, int which, int64_t n) {
  return reserve(L, which, (n + 1) / 2);
}

/* n floats within the context's memory (ordered on its stream). */
static attn_status ctx_copy(attn_layer_t L, void *dst, const void *src, int64_t n) {
  return n ? ctx_of(L)->ops->mem_copy(ctx_of(L), dst, src, (size_t)n * sizeof(float),
                                      ATTN_COPY_CTX_TO_CTX)
           : ATTN_OK;
}

/* Row-major C[M,N] = op(A) op(B) on the context's backend (BLAS or cuBLAS). */
static attn_status gemm(attn_layer_t L, int ta, int tb, int64_t M, int64_t N, int64_t K,
                        const float *A, int64_t lda, const float *B, int64_t ldb, float *C,
                        int64_t ldc) {
  return ctx_of(L)->ops->gemm(ctx_of(L), ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
}

/* A [rows, cols] matrix converted between float32 and the attention dtype. */
static attn_status convert(attn_layer_t L, void *dst, attn_dtype dt, const void *src,
                           attn_dtype st, int64_t rows, int64_t cols) {
  attn__view d = attn__view_of(dst, 0, cols, 0), s = attn__view_of(src, 0, cols, 0);
  return ctx_of(L)->ops->rows(ctx_of(L), ATTN__ROWS_COPY, d, dt, s, st, 1, rows, 1, cols);
}

/* The buffer the attention reads or writes: the float32 one on the host, else its copy. */
static void *abuf(const attn_layer_t L, int f32_buf, int copy_buf) {
  return L->adt == ATTN_F32 ? L->buf[f32_buf] : L->buf[copy_buf];
}

static int64_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (int64_t)u;
}

/* A [B, S, H, D] view of dtype dt in the context's memory whose rows are `ld` elements
 * apart (a column block of a matrix); col is the block's first column. */
static attn_tensor cols_view(const attn_layer_t L, void *base, attn_dtype dt, int64_t col,
                             int64_t B, int64_t S, int64_t H, int64_t D, int64_t ld) {
  attn_tensor t = attn_tensor_contig((char *)base + col * (int64_t)attn_dtype_size(dt), dt,
                                     ctx_of(L)->ops->device, B, S, H, D);
  t.stride[0] = S * ld;
  t.stride[1] = ld;
  return t;
}

static attn__view raw_view(float *base, int64_t S, int64_t D, int64_t ld) {
  attn__view v = attn__view_of(base, S * ld, ld, D);
  return v;
}

/* In-place float sum over c; a group of one needs no call. */
static attn_status comm_sum(attn__comm *c, float *buf, int64_t n) {
  if (!c || c->size == 1) return ATTN_OK;
  return c->ops->allreduce_sum(c, buf, n, ATTN_COMM_F32);
}

/* ---- failure bookkeeping --------------------------------------------------------------- */

/* This thread's last message, kept across calls that may overwrite it. */
typedef struct {
  char text[1024];
} saved_error;

static void save_error(saved_error *e) {
  snprintf(e->text, sizeof e->text, "%s", attn_last_error());
}

static attn_status restore_error(attn_status st, const saved_error *e) {
  return attn__fail(st, "%s", e->text);
}

/* Writes this rank's verdict into the NSTATUS slots (context memory) that follow a buffer
 * to be summed. */
static attn_status verdict_put(attn_ctx_t ctx, float *slots, attn_status st) {
  float v[NSTATUS] = {0};
  if (st != ATTN_OK) v[st] = 1.0f;
  return ctx->ops->mem_copy(ctx, slots, v, sizeof v, ATTN_COPY_HOST_TO_CTX);
}

/* The summed slots back on the host (a failed copy counts as an internal failure here). */
static void verdict_read(attn_ctx_t ctx, const float *slots, float out[NSTATUS]) {
  if (ctx->ops->mem_copy(ctx, out, slots, NSTATUS * sizeof(float), ATTN_COPY_CTX_TO_HOST) != ATTN_OK) {
    memset(out, 0, NSTATUS * sizeof(float));
    out[ATTN_ERR_INTERNAL] = 1.0f;
  }
}

/* After the sum: this rank's own failure wins (its message is the precise one); else the
 * most common failure among the peers, with a message that points at their messages. */
static attn_status verdict_get(const float *slots, attn_status mine, const saved_error *msg,
                               const char *where, const char *group) {
  if (mine != ATTN_OK) return restore_error(mine, msg);
  int worst = 0;
  float ranks = 0.0f;
  for (int s = 1; s < NSTATUS; s++) {
    ranks += slots[s];
    if (slots[s] > slots[worst]) worst = s; /* slots[0] stays 0 */
  }
  if (worst == 0) return ATTN_OK;
  return attn__fail((attn_status)worst,
                    "%s failed on %.0f other rank(s) of the %s group (%s); their "
                    "attn_last_error() says why; this rank's results are not valid",
                    where, (double)ranks, group, attn_status_string((attn_status)worst));
}

/* Pre-flight on the world communicator: the fingerprint plus this rank's own verdict.
 * Ranks that disagree on a field, or a rank whose checks failed, make every rank fail. */
static attn_status preflight(attn__comm *world, attn__fingerprint *fp, attn_status local) {
  saved_error msg;
  if (local != ATTN_OK) save_error(&msg);
  attn__fp_add(fp, "arguments valid on this rank (else see that rank's message)",
               local == ATTN_OK);
  attn_status st = attn__comm_agree(world, fp);
  if (local != ATTN_OK) return restore_error(local, &msg);
  return st;
}

/* ---- configuration ---------------------------------------------------------------------- */

static attn_status copy_config(const attn_layer_config *in, attn_layer_config *out) {
  attn_layer_config dflt = ATTN_LAYER_CONFIG_INIT;
  *out = dflt;
  if (!in) return attn__fail(ATTN_ERR_INVALID_ARG, "cfg (attn_layer_config *) is NULL");
  /* version 1 held a smaller attn_spec, so its later fields sit elsewhere: refused */
  if (in->size < offsetof(attn_layer_config, rope_theta) || in->size > (1u << 16) ||
      in->version != ATTN_LAYER_CONFIG_VERSION)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "cfg size=%zu version=%u is not valid (this library takes version %d); "
                      "initialise with ATTN_LAYER_CONFIG_INIT",
                      in->size, in->version, ATTN_LAYER_CONFIG_VERSION);
  memcpy(out, in, in->size < sizeof *out ? in->size : sizeof *out);
  out->size = sizeof *out;
  return attn__copy_spec(&in->spec, &out->spec);
}

static attn_status check_heads(const attn_spec *s, int tp) {
  if (s->num_heads_q % tp)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "num_heads_q=%d is not divisible by tp=%d: each TP rank owns Hq/tp "
                      "query heads; choose tp dividing Hq",
                      s->num_heads_q, tp);
  if (s->num_heads_kv >= tp && s->num_heads_kv % tp)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "num_heads_kv=%d is not divisible by tp=%d: KV heads are split when "
                      "Hkv >= tp, so tp must divide Hkv",
                      s->num_heads_kv, tp);
  if (s->num_heads_kv < tp && tp % s->num_heads_kv)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "tp=%d is not a multiple of num_heads_kv=%d: KV heads are replicated "
                      "when Hkv < tp, each shared by tp/Hkv ranks",
                      tp, s->num_heads_kv);
  return ATTN_OK;
}

/* Self-attention: Q and K rows come from the same x, so the packings must be the same.
 * The arrays live where the context's tensors do: on a device, compared as host copies. */
static attn_status check_varlen(attn_ctx_t ctx, const attn_spec *s) {
  if (s->num_seqs == 0) return ATTN_OK;
  const size_t n = (size_t)s->num_seqs + 1;
  const int32_t *cq = s->cu_seqlens_q, *ck = s->cu_seqlens_kv;
  int32_t *host = NULL; /* [2][n] */
  if (ctx->ops->device != ATTN_DEVICE_HOST) {
    host = malloc(2 * n * sizeof *host);
    if (!host) return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "cu_seqlens host copies (%zu ints)", 2 * n);
    attn_status st = ctx->ops->mem_copy(ctx, host, cq, n * sizeof *host, ATTN_COPY_CTX_TO_HOST);
    if (st == ATTN_OK)
      st = ctx->ops->mem_copy(ctx, host + n, ck, n * sizeof *host, ATTN_COPY_CTX_TO_HOST);
    if (st != ATTN_OK) {
      free(host);
      return st;
    }
    cq = host, ck = host + n;
  }
  attn_status st = ATTN_OK;
  for (int32_t i = 0; i <= s->num_seqs && st == ATTN_OK; i++)
    if (cq[i] != ck[i])
      st = attn__fail(ATTN_ERR_INVALID_ARG,
                      "cu_seqlens_q[%d]=%d != cu_seqlens_kv[%d]=%d: the layer is "
                      "self-attention, so both must describe the same packing",
                      i, cq[i], i, ck[i]);
  free(host);
  return st;
}

static attn_status check_config(attn_ctx_t ctx, const attn_layer_config *c, int tp) {
  if (c->d_model <= 0 || c->d_model > INT_MAX)
    return attn__fail(ATTN_ERR_INVALID_ARG, "d_model=%lld must be in 1..%d",
                      (long long)c->d_model, INT_MAX);
  ATTN_CHECK(attn__check_spec(&c->spec));
  if (c->spec.kv_cache)
    return attn__fail(ATTN_ERR_UNSUPPORTED,
                      "spec.kv_cache is set: the layer projects its own K and V and takes no "
                      "KV cache (attn_fwd and attn_fwd_block do)");
  if (!(c->rope_theta >= 0.0f) || isinf(c->rope_theta))
    return attn__fail(ATTN_ERR_INVALID_ARG, "rope_theta=%g must be finite and >= 0 (0 = off)",
                      (double)c->rope_theta);
  if (c->rope_theta > 0.0f && c->spec.head_dim_qk % 2)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "head_dim_qk=%d is odd: RoPE rotates pairs (i, i + Dqk/2), so Dqk "
                      "must be even (or set rope_theta=0)",
                      c->spec.head_dim_qk);
  if (c->layout != ATTN_LAYOUT_CONTIGUOUS && c->layout != ATTN_LAYOUT_ZIGZAG)
    return attn__fail(ATTN_ERR_INVALID_ARG, "layout=%d is not a layout (0 contiguous, 1 zigzag)",
                      (int)c->layout);
  ATTN_CHECK(check_heads(&c->spec, tp));
  return check_varlen(ctx, &c->spec);
}

static void config_fingerprint(const attn_layer_config *c, attn__fingerprint *fp) {
  const attn_spec *s = &c->spec;
  fp->count = 0;
  attn__fp_add(fp, "d_model", c->d_model);
  attn__fp_add(fp, "attention_dtype", c->attention_dtype);
  attn__fp_add(fp, "num_heads_q", s->num_heads_q);
  attn__fp_add(fp, "num_heads_kv", s->num_heads_kv);
  attn__fp_add(fp, "head_dim_qk", s->head_dim_qk);
  attn__fp_add(fp, "head_dim_v", s->head_dim_v);
  attn__fp_add(fp, "scale (bits)", bits_of(s->scale));
  attn__fp_add(fp, "causal", s->causal);
  attn__fp_add(fp, "window_left", s->window_left);
  attn__fp_add(fp, "window_right", s->window_right);
  attn__fp_add(fp, "softcap (bits)", bits_of(s->softcap));
  attn__fp_add(fp, "sinks set", s->sinks != NULL);
  attn__fp_add(fp, "alibi set", s->alibi_slopes != NULL);
  attn__fp_add(fp, "num_seqs (varlen)", s->num_seqs);
  attn__fp_add(fp, "block_mask set", s->block_mask != NULL);
  attn__fp_add(fp, "rope_theta (bits)", bits_of(c->rope_theta));
  attn__fp_add(fp, "layout", c->layout);
}

/* This rank's heads and the local spec (DESIGN.md §4). */
static void assign_heads(attn_layer_t L) {
  const attn_spec *g = &L->cfg.spec;
  int tp = L->grp->info.tp_size, r = L->grp->info.tp_rank;
  int hq = g->num_heads_q / tp;
  L->h.hq = hq;
  L->h.hq0 = r * hq;
  if (g->num_heads_kv >= tp) {
    L->h.hk = g->num_heads_kv / tp;
    L->h.hk0 = r * L->h.hk;
  } else {
    L->h.hk = 1;
    L->h.hk0 = L->h.hq0 / (g->num_heads_q / g->num_heads_kv);
  }
  L->d = L->cfg.d_model;
  L->dqk = g->head_dim_qk;
  L->dv = g->head_dim_v ? g->head_dim_v : g->head_dim_qk;
  L->cols = hq * L->dqk + L->h.hk * (L->dqk + L->dv);
  L->spec = *g;
  L->spec.num_heads_q = hq;
  L->spec.num_heads_kv = L->h.hk;
  L->spec.head_dim_v = (int32_t)L->dv;
}

/* The local spec for one call: sinks and slopes sliced to this rank's query heads. */
static attn_spec local_spec(const attn_layer_t L) {
  attn_spec s = L->spec;
  s.sinks = L->cfg.spec.sinks ? L->cfg.spec.sinks + L->h.hq0 : NULL;
  s.alibi_slopes = L->cfg.spec.alibi_slopes ? L->cfg.spec.alibi_slopes + L->h.hq0 : NULL;
  return s;
}

/* ---- create / destroy ------------------------------------------------------------------- */

static attn_status split_kv(attn_layer_t L) {
  if (L->cfg.spec.num_heads_kv >= L->grp->info.tp_size) return ATTN_OK;
  attn__comm *tp = attn__group_tp_data(L->grp);
  return tp->ops->split(tp, L->h.hk0, L->grp->info.tp_rank, &L->kv);
}

attn_status attn_layer_create(attn_layer_t *out, attn_group_t grp, const attn_layer_config *cfg) {
  if (!out) return attn__fail(ATTN_ERR_INVALID_ARG, "out (attn_layer_t *) is NULL");
  *out = NULL;
  if (!grp) return attn__fail(ATTN_ERR_INVALID_ARG, "grp is NULL");
  attn_layer_t L = calloc(1, sizeof *L);
  if (!L) return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "layer allocation failed");
  L->grp = grp;
  L->rope_seq = -1;
  attn_status local = copy_config(cfg, &L->cfg);
  if (local == ATTN_OK) local = check_config(grp->ctx, &L->cfg, grp->info.tp_size);
  L->adt = grp->ctx->ops->device == ATTN_DEVICE_HOST ? ATTN_F32 : ATTN_BF16;
  if (local == ATTN_OK && L->cfg.attention_dtype != ATTN_LAYER_DTYPE_AUTO) {
    L->adt = (attn_dtype)L->cfg.attention_dtype;
    if (attn_ctx_supports_dtype(grp->ctx, L->adt) != ATTN_OK) {
      char why[256]; /* the message names the context's dtypes */
      snprintf(why, sizeof why, "%s", attn_last_error());
      local = attn__fail(ATTN_ERR_UNSUPPORTED, "cfg->attention_dtype=%d: %s",
                         (int)L->cfg.attention_dtype, why);
    }
  }
  attn__fingerprint fp;
  config_fingerprint(&L->cfg, &fp);
  attn_status st = preflight(grp->world, &fp, local);
  if (st == ATTN_OK) {
    assign_heads(L);
    st = split_kv(L);
  }
  if (st != ATTN_OK) {
    attn_layer_destroy(L);
    return st;
  }
  attn__clear_error();
  *out = L;
  return ATTN_OK;
}

attn_status attn_layer_destroy(attn_layer_t L) {
  if (!L) return ATTN_OK;
  attn_status st = ATTN_OK;
  if (L->kv) st = L->kv->ops->destroy(L->kv);
  for (int i = 0; i < BUF_COUNT; i++)
    if (L->buf[i]) ctx_of(L)->ops->mem_free(ctx_of(L), L->buf[i]);
  free(L);
  return st;
}

attn_status attn_layer_get_heads(attn_layer_t L, attn_layer_heads *out) {
  if (!L) return attn__fail(ATTN_ERR_INVALID_ARG, "layer is NULL");
  if (!out) return attn__fail(ATTN_ERR_INVALID_ARG, "out (attn_layer_heads *) is NULL");
  *out = L->h;
  return ATTN_OK;
}

/* ---- positions and RoPE ------------------------------------------------------------------- */

static attn_status find_shard(attn_layer_t L, int64_t seq, attn_cp_shard *sh) {
  const attn_group_info *gi = &L->grp->info;
  if (gi->cp_size > 1) return attn_cp_shard_rows(L->cfg.layout, gi->cp_size, gi->cp_rank, seq, sh);
  memset(sh, 0, sizeof *sh);
  sh->count = 1;
  sh->len[0] = sh->rows = seq;
  return ATTN_OK;
}

/* Builds the [S_loc, Dqk/2] table for this rank's rows (cached while seq is unchanged).
 * Positions are global rows, varlen included: RoPE scores depend on i - j only and masks
 * never cross a sequence, so per-sequence positions would give the same attention. */
static attn_status rope_table(attn_layer_t L) {
  if (L->rope_seq == L->seq) return ATTN_OK;
  int64_t *pos = malloc((size_t)L->rows * sizeof *pos);
  if (!pos) return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "layer: RoPE positions allocation failed");
  int64_t r = 0;
  for (int i = 0; i < L->shard.count; i++)
    for (int64_t g = L->shard.start[i]; g < L->shard.start[i] + L->shard.len[i]; g++)
      pos[r++] = g;
  /* Built on the host (double angles, rounded once), so every backend rotates by bitwise
   * the same table; then copied to where the context computes. */
  const int64_t n = L->rows * (L->dqk / 2);
  float *cs = malloc((size_t)(2 * n) * sizeof(float)); /* [2][S_loc, Dqk/2] */
  attn_status st = cs ? ATTN_OK : attn__fail(ATTN_ERR_OUT_OF_MEMORY, "layer: RoPE table");
  if (st == ATTN_OK) {
    attn__rope_table(L->cfg.rope_theta, L->dqk, pos, L->rows, cs, cs + n,
                     L->grp->ctx->cfg.num_threads);
    attn_ctx_t ctx = ctx_of(L);
    st = ctx->ops->mem_copy(ctx, L->buf[BUF_COS], cs, (size_t)n * 4, ATTN_COPY_HOST_TO_CTX);
    if (st == ATTN_OK)
      st = ctx->ops->mem_copy(ctx, L->buf[BUF_SIN], cs + n, (size_t)n * 4, ATTN_COPY_HOST_TO_CTX);
  }
  free(cs);
  free(pos);
  if (st == ATTN_OK) L->rope_seq = L->seq;
  return st;
}

/* Q heads then K heads of the QKV (or dQKV) matrix, rotated or un-rotated in place. */
static attn_status rope_qk(attn_layer_t L, float *qkv, int inverse) {
  const float *c = L->buf[BUF_COS], *s = L->buf[BUF_SIN];
  attn__view q = raw_view(qkv, L->rows, L->dqk, L->cols);
  attn__view k = raw_view(qkv + L->h.hq * L->dqk, L->rows, L->dqk, L->cols);
  attn_ctx_t ctx = ctx_of(L);
  ATTN_CHECK(ctx->ops->rope(ctx, q, L->batch, L->rows, L->h.hq, L->dqk, c, s, inverse));
  return ctx->ops->rope(ctx, k, L->batch, L->rows, L->h.hk, L->dqk, c, s, inverse);
}

/* ---- forward ---------------------------------------------------------------------------- */

static attn_status reserve_fwd(attn_layer_t L) {
  int64_t M = L->batch * L->rows, hq = L->h.hq;
  ATTN_CHECK(reserve(L, BUF_X, M * L->d));
  ATTN_CHECK(reserve(L, BUF_WQKV, L->d * L->cols));
  ATTN_CHECK(reserve(L, BUF_WO, hq * L->dv * L->d));
  ATTN_CHECK(reserve(L, BUF_QKV, M * L->cols));
  ATTN_CHECK(reserve(L, BUF_O, M * hq * L->dv));
  ATTN_CHECK(reserve(L, BUF_LSE, L->batch * hq * L->rows));
  ATTN_CHECK(reserve(L, BUF_RED, M * L->d + NSTATUS));
  if (L->adt != ATTN_F32) {
    ATTN_CHECK(reserve16(L, BUF_QKV16, M * L->cols));
    ATTN_CHECK(reserve16(L, BUF_O16, M * hq * L->dv));
  }
  if (L->cfg.rope_theta > 0.0f) {
    ATTN_CHECK(reserve(L, BUF_COS, L->rows * (L->dqk / 2)));
    ATTN_CHECK(reserve(L, BUF_SIN, L->rows * (L->dqk / 2)));
  }
  return ATTN_OK;
}

static attn_status check_fwd(attn_layer_t L, int64_t batch, int64_t seq, const float *x,
                             const float *w_qkv, const float *w_o, const float *y) {
  if (!x || !w_qkv || !w_o || !y)
    return attn__fail(ATTN_ERR_INVALID_ARG, "%s is NULL",
                      !x ? "x" : !w_qkv ? "w_qkv" : !w_o ? "w_o" : "y");
  if (batch <= 0 || seq <= 0)
    return attn__fail(ATTN_ERR_INVALID_ARG, "batch=%lld and seq_global=%lld must be positive",
                      (long long)batch, (long long)seq);
  ATTN_CHECK(find_shard(L, seq, &L->shard));
  if (L->shard.rows <= 0)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "seq_global=%lld leaves cp rank %d no rows (cp=%d); use a longer sequence",
                      (long long)seq, L->grp->info.cp_rank, L->grp->info.cp_size);
  if (batch > INT_MAX / L->shard.rows)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "batch=%lld x local rows=%lld exceeds the BLAS index range (%d)",
                      (long long)batch, (long long)L->shard.rows, INT_MAX);
  L->batch = batch;
  L->seq = seq;
  L->rows = L->shard.rows;
  return reserve_fwd(L);
}

/* QKV = x · w_qkv, then RoPE on Q and K (float32), then the attention's dtype copy. */
static attn_status project_qkv(attn_layer_t L) {
  const int64_t M = L->batch * L->rows, d = L->d, C = L->cols;
  ATTN_CHECK(gemm(L, 0, 0, M, C, d, L->buf[BUF_X], d, L->buf[BUF_WQKV], C, L->buf[BUF_QKV], C));
  if (L->cfg.rope_theta > 0.0f) {
    ATTN_CHECK(rope_table(L));
    ATTN_CHECK(rope_qk(L, L->buf[BUF_QKV], 0));
  }
  if (L->adt == ATTN_F32) return ATTN_OK;
  return convert(L, L->buf[BUF_QKV16], L->adt, L->buf[BUF_QKV], ATTN_F32, M, C);
}

/* The three views of a QKV-shaped matrix of dtype dt. */
static void qkv_views(const attn_layer_t L, void *m, attn_dtype dt, attn_tensor *q,
                      attn_tensor *k, attn_tensor *v) {
  int64_t B = L->batch, S = L->rows, hq = L->h.hq, hk = L->h.hk;
  *q = cols_view(L, m, dt, 0, B, S, hq, L->dqk, L->cols);
  *k = cols_view(L, m, dt, hq * L->dqk, B, S, hk, L->dqk, L->cols);
  *v = cols_view(L, m, dt, (hq + hk) * L->dqk, B, S, hk, L->dv, L->cols);
}

/* O [B, S_loc, hq, Dv] in the attention's dtype. */
static attn_tensor o_tensor(const attn_layer_t L, int f32_buf, int copy_buf) {
  return attn_tensor_contig(abuf(L, f32_buf, copy_buf), L->adt, ctx_of(L)->ops->device,
                            L->batch, L->rows, L->h.hq, L->dv);
}

static attn_status attend(attn_layer_t L) {
  attn_spec s = local_spec(L);
  attn_tensor q, k, v, o = o_tensor(L, BUF_O, BUF_O16);
  qkv_views(L, abuf(L, BUF_QKV, BUF_QKV16), L->adt, &q, &k, &v);
  if (L->grp->info.cp_size == 1)
    ATTN_CHECK(attn_fwd(L->grp->ctx, &s, &q, &k, &v, &o, L->buf[BUF_LSE]));
  else
    ATTN_CHECK(attn_ring_fwd(L->grp, &s, L->cfg.layout, L->seq, L->seq, &q, &k, &v, &o,
                             L->buf[BUF_LSE]));
  if (L->adt == ATTN_F32) return ATTN_OK;
  return convert(L, L->buf[BUF_O], ATTN_F32, L->buf[BUF_O16], L->adt, L->batch * L->rows,
                 L->h.hq * L->dv);
}

/* Everything up to the partial y = O · w_o in BUF_RED. */
static attn_status forward_local(attn_layer_t L, const float *x, const float *w_qkv,
                                 const float *w_o) {
  int64_t M = L->batch * L->rows, hqdv = L->h.hq * L->dv;
  ATTN_CHECK(ctx_copy(L, L->buf[BUF_X], x, M * L->d));
  ATTN_CHECK(ctx_copy(L, L->buf[BUF_WQKV], w_qkv, L->d * L->cols));
  ATTN_CHECK(ctx_copy(L, L->buf[BUF_WO], w_o, hqdv * L->d));
  ATTN_CHECK(project_qkv(L));
  ATTN_CHECK(attend(L));
  return gemm(L, 0, 0, M, L->d, hqdv, L->buf[BUF_O], hqdv, L->buf[BUF_WO], L->d,
              L->buf[BUF_RED], L->d);
}

attn_status attn_layer_fwd(attn_layer_t L, int64_t batch, int64_t seq_global, const float *x,
                           const float *w_qkv, const float *w_o, float *y) {
  if (!L) return attn__fail(ATTN_ERR_INVALID_ARG, "layer is NULL");
  L->have_fwd = 0;
  L->have_bwd = 0;
  attn_status local = check_fwd(L, batch, seq_global, x, w_qkv, w_o, y);
  attn__fingerprint fp;
  config_fingerprint(&L->cfg, &fp);
  attn__fp_add(&fp, "batch", batch);
  attn__fp_add(&fp, "seq_global", seq_global);
  ATTN_CHECK(preflight(L->grp->world, &fp, local));

  saved_error msg;
  attn_status mine = forward_local(L, x, w_qkv, w_o);
  if (mine != ATTN_OK) save_error(&msg);
  int64_t n = L->batch * L->rows * L->d;
  float *red = L->buf[BUF_RED], slots[NSTATUS];
  attn_status put = verdict_put(ctx_of(L), red + n, mine);
  if (mine == ATTN_OK && put != ATTN_OK) save_error(&msg), mine = put;
  ATTN_CHECK(comm_sum(attn__group_tp_data(L->grp), red, n + NSTATUS));
  verdict_read(ctx_of(L), red + n, slots);
  ATTN_CHECK(verdict_get(slots, mine, &msg, "attn_layer_fwd", "TP"));
  ATTN_CHECK(ctx_copy(L, y, red, n));
  L->have_fwd = 1;
  return ATTN_OK;
}

/* ---- backward ----------------------------------------------------------------------------- */

static attn_status check_bwd(attn_layer_t L, const float *dy, const float *dx,
                             const float *dw_qkv, const float *dw_o) {
  if (!L->have_fwd)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "attn_layer_bwd needs a successful attn_layer_fwd first");
  if (!dy || !dx || !dw_qkv || !dw_o)
    return attn__fail(ATTN_ERR_INVALID_ARG, "%s is NULL",
                      !dy ? "dy" : !dx ? "dx" : !dw_qkv ? "dw_qkv" : "dw_o");
  int64_t M = L->batch * L->rows, hqdv = L->h.hq * L->dv;
  int64_t pack = L->d * L->cols + (L->grp->info.cp_size > 1 ? hqdv * L->d : 0) + NSTATUS;
  ATTN_CHECK(reserve(L, BUF_DOUT, M * hqdv));
  ATTN_CHECK(reserve(L, BUF_DQKV, M * L->cols));
  ATTN_CHECK(reserve(L, BUF_PACK, pack));
  ATTN_CHECK(reserve(L, BUF_DSINKS, L->h.hq));
  if (L->adt != ATTN_F32) ATTN_CHECK(reserve16(L, BUF_DOUT16, M * hqdv));
  return ATTN_OK;
}

/* dQ, dK, dV into BUF_DQKV (written, not accumulated), d(sinks) into BUF_DSINKS. */
static attn_status attend_bwd(attn_layer_t L) {
  attn_spec s = local_spec(L);
  int64_t B = L->batch, S = L->rows, hq = L->h.hq;
  attn_tensor q, k, v, dq, dk, dv;
  attn_tensor o = o_tensor(L, BUF_O, BUF_O16), dout = o_tensor(L, BUF_DOUT, BUF_DOUT16);
  float *dsinks = s.sinks ? L->buf[BUF_DSINKS] : NULL;
  if (L->adt != ATTN_F32)
    ATTN_CHECK(convert(L, L->buf[BUF_DOUT16], L->adt, L->buf[BUF_DOUT], ATTN_F32, B * S, hq * L->dv));
  qkv_views(L, abuf(L, BUF_QKV, BUF_QKV16), L->adt, &q, &k, &v);
  qkv_views(L, L->buf[BUF_DQKV], ATTN_F32, &dq, &dk, &dv);
  if (L->grp->info.cp_size == 1)
    return attn_bwd(L->grp->ctx, &s, &q, &k, &v, &o, L->buf[BUF_LSE], &dout, &dq, &dk, &dv,
                    dsinks);
  return attn_ring_bwd(L->grp, &s, L->cfg.layout, L->seq, L->seq, &q, &k, &v, &o,
                       L->buf[BUF_LSE], &dout, &dq, &dk, &dv, dsinks);
}

/* Local gradients: dw_o, dw_qkv (this rank's rows only) and the dx partial in BUF_RED. */
static attn_status backward_local(attn_layer_t L, const float *dy, float *dw_qkv, float *dw_o) {
  const int64_t M = L->batch * L->rows, d = L->d, C = L->cols, hqdv = L->h.hq * L->dv;
  /* dO = dy · w_o^T  [M, hq*Dv];  dw_o = O^T · dy  [hq*Dv, d] */
  ATTN_CHECK(gemm(L, 0, 1, M, hqdv, d, dy, d, L->buf[BUF_WO], d, L->buf[BUF_DOUT], hqdv));
  ATTN_CHECK(gemm(L, 1, 0, hqdv, d, M, L->buf[BUF_O], hqdv, dy, d, dw_o, d));
  ATTN_CHECK(attend_bwd(L));
  if (L->cfg.rope_theta > 0.0f) ATTN_CHECK(rope_qk(L, L->buf[BUF_DQKV], 1));
  /* dx_partial = dQKV · w_qkv^T  [M, d];  dw_qkv = x^T · dQKV  [d, cols] */
  ATTN_CHECK(gemm(L, 0, 1, M, d, C, L->buf[BUF_DQKV], C, L->buf[BUF_WQKV], C, L->buf[BUF_RED], d));
  return gemm(L, 1, 0, d, C, M, L->buf[BUF_X], d, L->buf[BUF_DQKV], C, dw_qkv, C);
}

/* A replicated KV head: its dW_k | dW_v columns summed over the TP ranks sharing it, so
 * each holds the full gradient (the dx partials used the unsummed dK, dV on purpose: the
 * TP sum of dx adds them up exactly once). */
static attn_status sum_shared_kv(attn_layer_t L, float *dw_qkv) {
  if (!L->kv) return ATTN_OK;
  int64_t c0 = L->h.hq * L->dqk, w = L->cols - c0;
  float *pack = L->buf[BUF_PACK]; /* [d, w] <- columns c0.. of dw_qkv [d, cols] */
  attn_ctx_t ctx = ctx_of(L);
  attn__view pk = attn__view_of(pack, 0, w, 0), cl = attn__view_of(dw_qkv + c0, 0, L->cols, 0);
  ATTN_CHECK(ctx->ops->rows(ctx, ATTN__ROWS_COPY, pk, ATTN_F32, cl, ATTN_F32, 1, L->d, 1, w));
  ATTN_CHECK(comm_sum(L->kv, pack, L->d * w));
  return ctx->ops->rows(ctx, ATTN__ROWS_COPY, cl, ATTN_F32, pk, ATTN_F32, 1, L->d, 1, w);
}

/* cp > 1: each CP rank saw different rows; the weight gradients are summed over the CP
 * group in one call that also carries the failure counts (peers in other TP groups may
 * not know yet). Every CP rank joins, whatever its status. */
static attn_status sum_over_cp(attn_layer_t L, float *dw_qkv, float *dw_o, attn_status mine) {
  saved_error msg;
  if (mine != ATTN_OK) save_error(&msg);
  int64_t nq = L->d * L->cols, no = L->h.hq * L->dv * L->d;
  float *pack = L->buf[BUF_PACK], slots[NSTATUS];
  attn_status st = ctx_copy(L, pack, dw_qkv, nq);
  if (st == ATTN_OK) st = ctx_copy(L, pack + nq, dw_o, no);
  if (st == ATTN_OK) st = verdict_put(ctx_of(L), pack + nq + no, mine);
  if (st != ATTN_OK && mine == ATTN_OK) save_error(&msg), mine = st;
  st = comm_sum(attn__group_cp_data(L->grp), pack, nq + no + NSTATUS);
  if (st != ATTN_OK) return mine != ATTN_OK ? restore_error(mine, &msg) : st;
  verdict_read(ctx_of(L), pack + nq + no, slots);
  ATTN_CHECK(verdict_get(slots, mine, &msg, "attn_layer_bwd", "CP"));
  ATTN_CHECK(ctx_copy(L, dw_qkv, pack, nq));
  return ctx_copy(L, dw_o, pack + nq, no);
}

attn_status attn_layer_bwd(attn_layer_t L, const float *dy, float *dx, float *dw_qkv,
                           float *dw_o) {
  if (!L) return attn__fail(ATTN_ERR_INVALID_ARG, "layer is NULL");
  attn_status local = check_bwd(L, dy, dx, dw_qkv, dw_o);
  attn__fingerprint fp;
  config_fingerprint(&L->cfg, &fp);
  attn__fp_add(&fp, "forward done", L->have_fwd);
  ATTN_CHECK(preflight(L->grp->world, &fp, local));

  saved_error msg;
  L->have_bwd = 0;
  attn_status mine = backward_local(L, dy, dw_qkv, dw_o);
  if (mine != ATTN_OK) save_error(&msg);
  int64_t n = L->batch * L->rows * L->d;
  float *red = L->buf[BUF_RED], slots[NSTATUS];
  attn_status put = verdict_put(ctx_of(L), red + n, mine);
  if (mine == ATTN_OK && put != ATTN_OK) save_error(&msg), mine = put;
  attn_status st = comm_sum(attn__group_tp_data(L->grp), red, n + NSTATUS);
  if (st == ATTN_OK) {
    verdict_read(ctx_of(L), red + n, slots);
    st = verdict_get(slots, mine, &msg, "attn_layer_bwd", "TP");
  } else if (mine != ATTN_OK) {
    st = restore_error(mine, &msg);
  }
  if (st == ATTN_OK) st = sum_shared_kv(L, dw_qkv);
  if (L->grp->info.cp_size > 1) st = sum_over_cp(L, dw_qkv, dw_o, st);
  if (st != ATTN_OK) return st;
  ATTN_CHECK(ctx_copy(L, dx, red, n));
  L->have_bwd = 1;
  return ATTN_OK;
}

attn_status attn_layer_get_dsinks(attn_layer_t L, float *dsinks) {
  if (!L) return attn__fail(ATTN_ERR_INVALID_ARG, "layer is NULL");
  if (!dsinks) return attn__fail(ATTN_ERR_INVALID_ARG, "dsinks is NULL");
  if (!L->cfg.spec.sinks)
    return attn__fail(ATTN_ERR_INVALID_ARG, "the layer has no sinks (cfg.spec.sinks is NULL)");
  if (!L->have_bwd)
    return attn__fail(ATTN_ERR_INVALID_ARG, "attn_layer_get_dsinks needs a successful attn_layer_bwd first");
  return ctx_copy(L, dsinks, L->buf[BUF_DSINKS], L->h.hq);
}
