/* gpu_case.c — the CUDA-kernels-vs-oracle harness (see gpu_case.h). */
#include "gpu_case.h"

#include "naive_ref.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int64_t gc_n_q(const gc_prob *P) { return P->B * P->Sq * P->Hq * P->D; }
int64_t gc_n_o(const gc_prob *P) { return P->B * P->Sq * P->Hq * P->Dv; }
int64_t gc_n_k(const gc_prob *P) { return P->B * P->Skv * P->Hkv * P->D; }
int64_t gc_n_v(const gc_prob *P) { return P->B * P->Skv * P->Hkv * P->Dv; }
int64_t gc_n_lse(const gc_prob *P) { return P->B * P->Hq * P->Sq; }
size_t gc_elem_bytes(const gc_prob *P) { return P->c.dtype == ATTN_F32 ? 4 : 2; }

void gc_describe(const gc_case *c, char *buf, size_t n) {
  const char *dt = c->dtype == ATTN_BF16 ? "bf16" : c->dtype == ATTN_F16 ? "f16" : "f32";
  int w = snprintf(buf, n, "%s: %s B=%lld Sq=%lld Skv=%lld Hq=%d Hkv=%d D=%d",
                   c->name ? c->name : "case", dt, (long long)c->B, (long long)c->Sq,
                   (long long)c->Skv, c->Hq, c->Hkv, c->D);
#define ADD(...)                                                                          \
  do {                                                                                    \
    if (w >= 0 && (size_t)w < n) w += snprintf(buf + w, n - (size_t)w, __VA_ARGS__);     \
  } while (0)
  if (c->Dv && c->Dv != c->D) ADD(" Dv=%d", c->Dv);
  if (c->causal) ADD(" causal");
  if (c->window) ADD(" window=(%lld,%lld)", (long long)c->wl, (long long)c->wr);
  if (c->softcap > 0) ADD(" softcap=%g", (double)c->softcap);
  if (c->scale > 0) ADD(" scale=%g", (double)c->scale);
  if (c->sinks) ADD(" sinks");
  if (c->alibi) ADD(" alibi");
  if (c->nseq) {
    ADD(" varlen q=[");
    for (int s = 0; s < c->nseq; s++) ADD("%s%d", s ? "," : "", c->lq[s]);
    ADD("] kv=[");
    for (int s = 0; s < c->nseq; s++) ADD("%s%d", s ? "," : "", c->lkv[s]);
    ADD("]");
  }
  if (c->bq) ADD(" block_mask=%dx%d%s", c->bq, c->bk, c->mask_short ? "(short)" : "");
  if (c->bhsd) ADD(" bhsd");
  if (c->amp > 0) ADD(" amp=%g", c->amp);
  ADD(" seed=%llu", (unsigned long long)c->seed);
#undef ADD
}

/* ---- layout -------------------------------------------------------------------------- */
attn_cuda_view gc_view(const gc_prob *P, void *p, int64_t S, int64_t H, int64_t D) {
  attn_cuda_view v = {p, S * H * D, H * D, D};
  if (P->c.bhsd) {
    v.sb = H * S * D;
    v.ss = D;
    v.sh = S * D;
  }
  return v;
}

/* Element index of (b, s, h, 0) in the case's memory order. */
static int64_t at(const gc_prob *P, int64_t b, int64_t s, int64_t h, int64_t S, int64_t H,
                  int64_t D) {
  attn_cuda_view v = gc_view(P, NULL, S, H, D);
  return b * v.sb + s * v.ss + h * v.sh;
}

/* The bits of element x in the dtype: uint16 for bf16/f16, the float itself for f32. */
static void put_elem(const gc_prob *P, void *dst, int64_t i, float x) {
  if (P->c.dtype == ATTN_F32) ((float *)dst)[i] = x;
  else ((uint16_t *)dst)[i] = tu_to_bits(x, P->c.dtype);
}

/* Element i of a downloaded buffer; all-ones bits (never written) read as the harness's
 * poison NaN. */
static float get_elem(const gc_prob *P, const void *src, int64_t i) {
  if (P->c.dtype == ATTN_F32) {
    uint32_t u;
    memcpy(&u, (const float *)src + i, 4);
    return u == 0xFFFFFFFFu ? tu_poison_value() : ((const float *)src)[i];
  }
  const uint16_t x = ((const uint16_t *)src)[i];
  return x == 0xFFFFu ? tu_poison_value() : tu_from_bits(x, P->c.dtype);
}

static void *upload_elems(const gc_prob *P, const float *src, int64_t S, int64_t H, int64_t D) {
  const int64_t n = P->B * S * H * D;
  const size_t bytes = (size_t)n * gc_elem_bytes(P);
  void *buf = tu_alloc(bytes);
  for (int64_t b = 0; b < P->B; b++)
    for (int64_t s = 0; s < S; s++)
      for (int64_t h = 0; h < H; h++)
        for (int64_t d = 0; d < D; d++)
          put_elem(P, buf, at(P, b, s, h, S, H, D) + d, src[((b * S + s) * H + h) * D + d]);
  void *dev = td_alloc(bytes);
  td_upload(dev, buf, bytes);
  free(buf);
  return dev;
}

void gc_download_elems(const gc_prob *P, const void *dev, int64_t S, int64_t H, int64_t D,
                       float *out) {
  const int64_t n = P->B * S * H * D;
  void *buf = tu_alloc((size_t)n * gc_elem_bytes(P));
  td_download(buf, dev, (size_t)n * gc_elem_bytes(P));
  for (int64_t b = 0; b < P->B; b++)
    for (int64_t s = 0; s < S; s++)
      for (int64_t h = 0; h < H; h++)
        for (int64_t d = 0; d < D; d++)
          out[((b * S + s) * H + h) * D + d] = get_elem(P, buf, at(P, b, s, h, S, H, D) + d);
  free(buf);
}

void gc_download_f32(const gc_prob *P, const float *dev, int64_t S, int64_t H, int64_t D,
                     float *out) {
  const int64_t n = P->B * S * H * D;
  float *buf = tu_alloc((size_t)n * 4);
  td_download(buf, dev, (size_t)n * 4);
  for (int64_t b = 0; b < P->B; b++)
    for (int64_t s = 0; s < S; s++)
      for (int64_t h = 0; h < H; h++)
        memcpy(out + ((b * S + s) * H + h) * D, buf + at(P, b, s, h, S, H, D), (size_t)D * 4);
  free(buf);
}

/* ---- setup --------------------------------------------------------------------------- */
static void fill_rounded(float *x, int64_t n, double lo, double hi, uint64_t seed, int dtype) {
  tu_fill(x, n, lo, hi, seed);
  for (int64_t i = 0; i < n; i++) x[i] = tu_round(x[i], dtype);
}

static void upload_all(gc_prob *P) {
  td_free(P->dq_in);
  td_free(P->dk_in);
  td_free(P->dv_in);
  td_free(P->ddo);
  P->dq_in = upload_elems(P, P->q, P->Sq, P->Hq, P->D);
  P->dk_in = upload_elems(P, P->k, P->Skv, P->Hkv, P->D);
  P->dv_in = upload_elems(P, P->v, P->Skv, P->Hkv, P->Dv);
  P->ddo = upload_elems(P, P->dout, P->Sq, P->Hq, P->Dv);
  P->pb.q = gc_view(P, P->dq_in, P->Sq, P->Hq, P->D);
  P->pb.k = gc_view(P, P->dk_in, P->Skv, P->Hkv, P->D);
  P->pb.v = gc_view(P, P->dv_in, P->Skv, P->Hkv, P->Dv);
}

static void *upload_copy(const void *src, size_t bytes) {
  void *d = td_alloc(bytes);
  td_upload(d, src, bytes);
  return d;
}

static void make_problem(gc_prob *P) {
  attn_cuda_problem *pb = &P->pb;
  memset(pb, 0, sizeof *pb);
  pb->B = P->B;
  pb->Hq = P->Hq;
  pb->Hkv = P->Hkv;
  pb->Dqk = P->D;
  pb->Dv = P->Dv;
  pb->sq = pb->seq_q = P->Sq;
  pb->skv = pb->seq_kv = P->Skv;
  pb->scale = P->spec.scale > 0 ? P->spec.scale : 1.0f / sqrtf((float)P->D);
  pb->softcap = P->spec.softcap;
  pb->causal = P->spec.causal;
  pb->window_left = P->spec.window_left;
  pb->window_right = P->spec.window_right;
  pb->dtype = P->c.dtype;
  if (P->sinks) pb->sinks = P->d_sinks = upload_copy(P->sinks, (size_t)P->Hq * 4);
  if (P->alibi) pb->alibi = P->d_alibi = upload_copy(P->alibi, (size_t)P->Hq * 4);
  if (P->c.nseq) {
    pb->cu_seqlens_q = P->d_cu_q = upload_copy(P->cu_q, (size_t)(P->c.nseq + 1) * 4);
    pb->cu_seqlens_kv = P->d_cu_kv = upload_copy(P->cu_kv, (size_t)(P->c.nseq + 1) * 4);
    pb->num_seqs = P->c.nseq;
  }
  if (P->mask) {
    pb->block_mask = P->d_mask = upload_copy(P->mask, (size_t)(P->bm.num_q_blocks * P->bm.num_k_blocks));
    pb->block_q = P->bm.block_q;
    pb->block_k = P->bm.block_k;
    pb->num_q_blocks = P->bm.num_q_blocks;
    pb->num_k_blocks = P->bm.num_k_blocks;
  }
  P->ws_bytes = attn_cuda_workspace_bytes(pb);
  P->d_ws = P->ws_bytes ? td_alloc(P->ws_bytes) : NULL;
}

void gc_init(gc_prob *P, const gc_case *c) {
  memset(P, 0, sizeof *P);
  P->c = *c;
  P->B = c->B;
  P->Sq = c->Sq;
  P->Skv = c->Skv;
  P->Hq = c->Hq;
  P->Hkv = c->Hkv;
  P->D = c->D;
  P->Dv = c->Dv ? c->Dv : c->D;
  attn_spec s = ATTN_SPEC_INIT;
  P->spec = s;
  P->spec.num_heads_q = c->Hq;
  P->spec.num_heads_kv = c->Hkv;
  P->spec.head_dim_qk = c->D;
  P->spec.head_dim_v = (int32_t)P->Dv;
  P->spec.scale = c->scale;
  P->spec.causal = c->causal;
  if (c->window) {
    P->spec.window_left = c->wl;
    P->spec.window_right = c->wr;
  }
  P->spec.softcap = c->softcap;
  if (c->nseq) {
    tu_varlen(&P->spec, c->nseq, c->lq, c->lkv, &P->cu_q, &P->cu_kv, &P->Sq, &P->Skv);
    P->B = 1;
  }
  if (c->bq)
    tu_block_mask(&P->spec, &P->bm, &P->mask, P->Sq, P->Skv, c->nseq, c->lq, c->lkv, c->bq,
                  c->bk, c->mask_short, c->mask_bits, c->seed * 31 + 7);
  tu_rng r = tu_rng_make(c->seed * 7 + 3);
  if (c->sinks) {
    P->sinks = tu_alloc((size_t)P->Hq * 4);
    for (int h = 0; h < P->Hq; h++) P->sinks[h] = (float)tu_uniform(&r, -1.0, 2.0);
    P->spec.sinks = P->sinks;
  }
  if (c->alibi) {
    P->alibi = tu_alloc((size_t)P->Hq * 4);
    for (int h = 0; h < P->Hq; h++) P->alibi[h] = (float)tu_uniform(&r, 0.01, 0.3);
    P->spec.alibi_slopes = P->alibi;
  }
  const double amp = c->amp > 0 ? c->amp : 1.0;
  const int64_t nq = gc_n_q(P), nk = gc_n_k(P), no = gc_n_o(P), nv = gc_n_v(P);
  P->q = tu_alloc((size_t)nq * 4);
  P->k = tu_alloc((size_t)nk * 4);
  P->v = tu_alloc((size_t)nv * 4);
  P->dout = tu_alloc((size_t)no * 4);
  fill_rounded(P->q, nq, -amp, amp, c->seed * 4 + 0, c->dtype);
  fill_rounded(P->k, nk, -amp, amp, c->seed * 4 + 1, c->dtype);
  fill_rounded(P->v, nv, -1.0, 1.0, c->seed * 4 + 2, c->dtype);
  fill_rounded(P->dout, no, -1.0, 1.0, c->seed * 4 + 3, c->dtype);
  attn_ref_problem rp;
  attn_ref_arrays arr = {P->q, P->k, P->v, P->dout};
  attn_ref_problem_arrays(&rp, &P->spec, P->B, P->Sq, P->Skv, &arr);
  P->vis = tu_alloc((size_t)(P->Sq * P->Skv));
  for (int64_t i = 0; i < P->Sq; i++)
    for (int64_t j = 0; j < P->Skv; j++) P->vis[i * P->Skv + j] = (uint8_t)attn_ref_visible(&rp, i, j);
  make_problem(P);
  upload_all(P);
  P->d_o = td_alloc((size_t)no * gc_elem_bytes(P));
  P->d_lse = td_alloc((size_t)gc_n_lse(P) * 4);
}

static void free_refs(gc_prob *P) {
  double *d[] = {P->ro, P->rlse, P->rdq, P->rdk, P->rdv, P->rds};
  float *f[] = {P->no, P->nlse, P->ndq, P->ndk, P->ndv, P->nds};
  for (int i = 0; i < 6; i++) {
    free(d[i]);
    free(f[i]);
  }
  P->ro = P->rlse = P->rdq = P->rdk = P->rdv = P->rds = NULL;
  P->no = P->nlse = P->ndq = P->ndk = P->ndv = P->nds = NULL;
}

void gc_sync(gc_prob *P) {
  upload_all(P);
  free_refs(P);
}

void gc_free(gc_prob *P) {
  free_refs(P);
  void *dev[] = {P->dq_in, P->dk_in, P->dv_in, P->ddo, P->d_sinks, P->d_alibi, P->d_cu_q,
                 P->d_cu_kv, P->d_mask, P->d_o, P->d_lse, P->d_ws};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) td_free(dev[i]);
  void *host[] = {P->mask, P->cu_q, P->cu_kv, P->sinks, P->alibi, P->q, P->k, P->v, P->dout, P->vis};
  for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
  memset(P, 0, sizeof *P);
}

void gc_out_free(gc_out *o) {
  free(o->o);
  free(o->lse);
  free(o->dq);
  free(o->dk);
  free(o->dv);
  free(o->ds);
  memset(o, 0, sizeof *o);
}

/* ---- which mma.sync forward kernel ran ------------------------------------------------
 * Every one-shot forward (gc_fwd) tallies attn_cuda_last_fwd_form(); a part run with
 * ATTN_MMA_ABLATE, ATTN_CUDA_FWD_WARPS=4, ATTN_CUDA_FWD_CTAS=2, ATTN_CUDA_FWD_WARP_ROWS=32 or
 * ATTN_CUDA_FWD_STAGES=4 or ATTN_CUDA_FWD_KSPLIT=1
 * (the precedence of dispatch.c's carve) fails unless one of its mma.sync forwards ran the
 * kernel so asked for:
 * a variable the dispatcher ignored would otherwise pass as the default kernel's test.
 * Likewise every backward (gc_bwd_views) tallies attn_cuda_last_bwd_form(), and a part run
 * with ATTN_CUDA_BWD_STAGES=4 fails unless one of its mma.sync backwards ran "4s". */
static const char *const form_names[] = {"8w", "4w", "2cta", "4x32", "4s", "ks", "ab", "none"};
enum { N_FORMS = (int)(sizeof form_names / sizeof form_names[0]) };
static int form_runs[N_FORMS];
static int bwd_runs[3]; /* the mma.sync dK/dV kernels: "2s", "4s", and "none" (sm90) */
static void (*chosen_part)(void);

static void tally_form(void) {
  const char *f = attn_cuda_last_fwd_form();
  for (int i = 0; i < N_FORMS; i++)
    if (!strcmp(f, form_names[i])) form_runs[i]++;
}

static int env_is(const char *name, int value) {
  const char *v = getenv(name);
  return v && *v && atoi(v) == value;
}

static void tally_bwd_form(void) {
  const char *f = attn_cuda_last_bwd_form();
  bwd_runs[!strcmp(f, "2s") ? 0 : !strcmp(f, "4s") ? 1 : 2]++;
}

static void run_and_check_forms(void) {
  chosen_part();
  const char *asked = getenv("ATTN_MMA_ABLATE")          ? "ab"
                      : env_is("ATTN_CUDA_FWD_WARPS", 4) ? "4w"
                      : env_is("ATTN_CUDA_FWD_CTAS", 2)  ? "2cta"
                      : env_is("ATTN_CUDA_FWD_WARP_ROWS", 32) ? "4x32"
                      : env_is("ATTN_CUDA_FWD_STAGES", 4) ? "4s"
                      : env_is("ATTN_CUDA_FWD_KSPLIT", 1) ? "ks"
                                                          : NULL;
  int mma = 0, got = 0;
  printf("mma.sync forward kernels of the one-shot forwards:");
  for (int i = 0; i < N_FORMS; i++) {
    printf(" %s %d", form_names[i], form_runs[i]);
    if (strcmp(form_names[i], "none")) mma += form_runs[i];
    if (asked && !strcmp(form_names[i], asked)) got = form_runs[i];
  }
  printf("%s%s\n", asked ? "; asked for " : "", asked ? asked : "");
  if (asked) TU_CHECK(mma == 0 || got > 0, "the environment asks for the %s kernel, but none of "
                      "the %d mma.sync forwards ran it", asked, mma);
  printf("mma.sync dK/dV kernels of the backwards: 2s %d 4s %d none %d\n", bwd_runs[0], bwd_runs[1],
         bwd_runs[2]);
  if (env_is("ATTN_CUDA_BWD_STAGES", 4))
    TU_CHECK(bwd_runs[0] + bwd_runs[1] == 0 || bwd_runs[1] > 0, "the environment asks for the 4s "
             "dK/dV kernel, but none of the %d mma.sync backwards ran it", bwd_runs[0] + bwd_runs[1]);
}

int gc_run_parts(const char *test, int argc, char **argv, const tu_part *parts, int count,
                 const char *first_part, int *small) {
  const char *part = argc > 1 ? argv[1] : first_part;
  if (!td_available()) {
    printf("%s %s: no CUDA device, skipped\n", test, part);
    return 77;
  }
  *small = td_emulated() && !(getenv("ATTN_EMU_FULL") && atoi(getenv("ATTN_EMU_FULL")));
  printf("%s %s on %s; head dims built: %s\n", test, part, td_name(), attn_cuda_head_dims());
  for (int i = 0; i < count; i++)
    if (!strcmp(part, parts[i].name)) { /* the part, then the check of its forms */
      const tu_part one = {parts[i].name, run_and_check_forms};
      char *args[] = {argv[0], (char *)part, NULL};
      chosen_part = parts[i].run;
      return tu_run_parts(test, 2, args, &one, 1);
    }
  return tu_run_parts(test, argc, argv, parts, count); /* names the parts there are */
}

/* ---- runs ---------------------------------------------------------------------------- */
void gc_expect_ok(attn_status st, const char *what, const gc_case *c) {
  if (st == ATTN_OK) return;
  char desc[600];
  gc_describe(c, desc, sizeof desc);
  TU_CHECK(0, "%s: %s: %s in %s", what, attn_status_string(st), attn_last_error(), desc);
}

/* The forward (st NULL) or a finalize of st into the poisoned outputs, downloaded. */
static attn_status fwd_or_finalize(gc_prob *P, const attn_state *state, gc_out *out) {
  const int64_t no = gc_n_o(P), nl = gc_n_lse(P);
  td_memset(P->d_o, 0xFF, (size_t)no * gc_elem_bytes(P));
  td_memset(P->d_lse, 0xFF, (size_t)nl * 4);
  const attn_cuda_view o = gc_view(P, P->d_o, P->Sq, P->Hq, P->Dv);
  attn_status st = state ? attn_cuda_finalize(&P->pb, state, o, P->d_lse, NULL)
                         : attn_cuda_fwd(&P->pb, o, P->d_lse, P->Sq, P->d_ws, P->ws_bytes, NULL);
  td_sync();
  if (!state && st == ATTN_OK) tally_form();
  if (!out->o) out->o = tu_alloc((size_t)no * 4);
  if (!out->lse) out->lse = tu_alloc((size_t)nl * 4);
  gc_download_elems(P, P->d_o, P->Sq, P->Hq, P->Dv, out->o);
  td_download(out->lse, P->d_lse, (size_t)nl * 4);
  return st;
}

attn_status gc_fwd(gc_prob *P, gc_out *out) { return fwd_or_finalize(P, NULL, out); }

attn_status gc_finalize(gc_prob *P, const attn_state *st, gc_out *out) {
  return fwd_or_finalize(P, st, out);
}

attn_status gc_bwd_views(gc_prob *P, attn_cuda_view dq, attn_cuda_view dk, attn_cuda_view dv,
                         int deterministic, float *ds_out) {
  const int64_t nl = gc_n_lse(P);
  float *delta = td_alloc((size_t)nl * 4), *ds = td_alloc((size_t)P->Hq * 4 + 4);
  td_memset(delta, 0xFF, (size_t)nl * 4);
  td_memset(ds, 0, (size_t)P->Hq * 4 + 4);
  attn_cuda_view o = gc_view(P, P->d_o, P->Sq, P->Hq, P->Dv);
  attn_cuda_view dout = gc_view(P, P->ddo, P->Sq, P->Hq, P->Dv);
  attn_status st = attn_cuda_bwd_prepare(&P->pb, o, dout, P->d_lse, delta, P->sinks ? ds : NULL, NULL);
  if (st == ATTN_OK)
    st = attn_cuda_bwd_block(&P->pb, dout, P->d_lse, delta, P->Sq, dq, dk, dv, deterministic, P->d_ws,
                             P->ws_bytes, NULL);
  td_sync();
  if (st == ATTN_OK && P->c.dtype != ATTN_F32) tally_bwd_form();
  td_download(ds_out, ds, (size_t)P->Hq * 4);
  td_free(delta);
  td_free(ds);
  return st;
}

attn_status gc_bwd(gc_prob *P, gc_out *out, int deterministic) {
  const int64_t nq = gc_n_q(P), nk = gc_n_k(P), nv = gc_n_v(P);
  float *dq = td_alloc((size_t)nq * 4), *dk = td_alloc((size_t)nk * 4), *dv = td_alloc((size_t)nv * 4);
  td_memset(dq, 0, (size_t)nq * 4);
  td_memset(dk, 0, (size_t)nk * 4);
  td_memset(dv, 0, (size_t)nv * 4);
  if (!out->dq) out->dq = tu_alloc((size_t)nq * 4);
  if (!out->dk) out->dk = tu_alloc((size_t)nk * 4);
  if (!out->dv) out->dv = tu_alloc((size_t)nv * 4);
  if (!out->ds) out->ds = tu_alloc((size_t)P->Hq * 4 + 4);
  const attn_status st =
      gc_bwd_views(P, gc_view(P, dq, P->Sq, P->Hq, P->D), gc_view(P, dk, P->Skv, P->Hkv, P->D),
                   gc_view(P, dv, P->Skv, P->Hkv, P->Dv), deterministic, out->ds);
  gc_download_f32(P, dq, P->Sq, P->Hq, P->D, out->dq);
  gc_download_f32(P, dk, P->Skv, P->Hkv, P->D, out->dk);
  gc_download_f32(P, dv, P->Skv, P->Hkv, P->Dv, out->dv);
  td_free(dq);
  td_free(dk);
  td_free(dv);
  return st;
}

/* ---- references ---------------------------------------------------------------------- */
/* The naive same-precision kernel (tests/naive_ref.c) on P's host arrays. */
static void naive(gc_prob *P, int bwd) {
  const naive_problem np = {P->B, P->Sq, P->Skv, P->Hq, P->Hkv, P->D, P->Dv, P->c.dtype,
                            P->q, P->k, P->v, P->dout, P->vis, P->pb.scale, P->spec.softcap,
                            P->sinks, P->alibi, P->c.nseq, P->cu_q, P->cu_kv};
  naive_out no;
  naive_run(&np, bwd, &no);
  P->no = no.o, P->nlse = no.lse, P->ndq = no.dq, P->ndk = no.dk, P->ndv = no.dv, P->nds = no.ds;
}

void gc_ref(gc_prob *P, int bwd) {
  free_refs(P);
  attn_ref_problem rp;
  attn_ref_arrays arr = {P->q, P->k, P->v, P->dout};
  attn_ref_problem_arrays(&rp, &P->spec, P->B, P->Sq, P->Skv, &arr);
  P->ro = tu_dalloc(gc_n_o(P));
  P->rlse = tu_dalloc(gc_n_lse(P));
  attn_ref_fwd(&rp, P->ro, P->rlse);
  if (bwd) {
    P->rdq = tu_dalloc(gc_n_q(P));
    P->rdk = tu_dalloc(gc_n_k(P));
    P->rdv = tu_dalloc(gc_n_v(P));
    P->rds = tu_dalloc(P->Hq + 1);
    attn_ref_bwd(&rp, P->rdq, P->rdk, P->rdv, P->sinks ? P->rds : NULL);
  }
  naive(P, bwd);
}

/* ---- judging ------------------------------------------------------------------------- */
int gc_judge(const char *what, const float *got, const double *ref, const float *naive,
             int64_t n, const int64_t *dims) {
  return naive_judge(what, got, ref, naive, n, dims, 0.0);
}

int gc_judge_tol(const char *what, const float *got, const double *ref, const float *naive,
                 int64_t n, const int64_t *dims, double extra) {
  return naive_judge(what, got, ref, naive, n, dims, extra);
}

/* float32: relative to max|ref|, as the CPU backend's tests judge it (tests/test_case.h),
 * at 1e-5 both ways (the emulator measured at most 8e-7 over the f32 part's cases). */
#define GC_F32_FWD_RTOL 1e-5
#define GC_F32_BWD_RTOL 1e-5

static void check_f32(gc_prob *P, const gc_out *out, int bwd, const int64_t *dq4,
                      const int64_t *dk4, const int64_t *do4, const int64_t *dv4,
                      const int64_t *dl4) {
  tu_compare("O", out->o, P->ro, gc_n_o(P), do4, GC_F32_FWD_RTOL, 1e-6);
  tu_compare("LSE", out->lse, P->rlse, gc_n_lse(P), dl4, GC_F32_FWD_RTOL, 2e-6);
  if (!bwd) return;
  /* a gradient that cancels to ~0 is judged on the scale of all three */
  double g = tu_max_abs(P->rdq, gc_n_q(P));
  g = fmax(g, fmax(tu_max_abs(P->rdk, gc_n_k(P)), tu_max_abs(P->rdv, gc_n_v(P))));
  const double atol = 1e-6 + 0.1 * GC_F32_BWD_RTOL * g;
  tu_compare("dQ", out->dq, P->rdq, gc_n_q(P), dq4, GC_F32_BWD_RTOL, atol);
  tu_compare("dK", out->dk, P->rdk, gc_n_k(P), dk4, GC_F32_BWD_RTOL, atol);
  tu_compare("dV", out->dv, P->rdv, gc_n_v(P), dv4, GC_F32_BWD_RTOL, atol);
  if (P->sinks) tu_compare("dsinks", out->ds, P->rds, P->Hq, NULL, GC_F32_BWD_RTOL, 1e-6);
}

int gc_check(gc_prob *P, const gc_out *out, int bwd, const char *tag) {
  if (!P->ro || (bwd && !P->rdq)) gc_ref(P, bwd);
  const int before = tu_failures;
  const int64_t dq4[4] = {P->B, P->Sq, P->Hq, P->D}, dk4[4] = {P->B, P->Skv, P->Hkv, P->D};
  const int64_t do4[4] = {P->B, P->Sq, P->Hq, P->Dv}, dv4[4] = {P->B, P->Skv, P->Hkv, P->Dv};
  const int64_t dl4[4] = {1, P->B, P->Hq, P->Sq};
  if (P->c.dtype == ATTN_F32) {
    check_f32(P, out, bwd, dq4, dk4, do4, dv4, dl4);
  } else {
    gc_judge("O", out->o, P->ro, P->no, gc_n_o(P), do4);
    gc_judge("LSE", out->lse, P->rlse, P->nlse, gc_n_lse(P), dl4);
  }
  if (bwd && P->c.dtype != ATTN_F32) {
    /* float32 accumulation noise where gradients cancel (naive_grad_noise) */
    const double noise = naive_grad_noise(P->Sq, P->Skv, P->D, P->Dv, P->pb.scale, P->c.amp);
    gc_judge_tol("dQ", out->dq, P->rdq, P->ndq, gc_n_q(P), dq4, noise);
    gc_judge_tol("dK", out->dk, P->rdk, P->ndk, gc_n_k(P), dk4, noise);
    gc_judge_tol("dV", out->dv, P->rdv, P->ndv, gc_n_v(P), dv4, noise);
    /* d(sink) is one sum per head of terms e^(sink-lse) dO.O that each carry O's rounding
     * and may cancel: the 2x rule alone compares two random walks, so it also gets the
     * dtype's rounding unit times the sum of the terms' magnitudes. */
    if (P->sinks) {
      double mag = 0.0;
      for (int64_t h = 0; h < P->Hq; h++) {
        double m_h = 0.0;
        for (int64_t b = 0; b < P->B; b++)
          for (int64_t i = 0; i < P->Sq; i++) {
            const double lse = P->rlse[(b * P->Hq + h) * P->Sq + i];
            if (isinf(lse)) continue;
            double dot = 0.0;
            for (int64_t d = 0; d < P->Dv; d++) {
              const int64_t x = ((b * P->Sq + i) * P->Hq + h) * P->Dv + d;
              dot += fabs(P->dout[x] * P->ro[x]);
            }
            m_h += exp(P->sinks[h] - lse) * dot;
          }
        mag = m_h > mag ? m_h : mag;
      }
      gc_judge_tol("dsinks", out->ds, P->rds, P->nds, P->Hq, NULL,
                   (P->c.dtype == ATTN_BF16 ? 0x1p-8 : 0x1p-11) * mag);
    }
  }
  if (tu_failures == before) return 1;
  char desc[600];
  gc_describe(&P->c, desc, sizeof desc);
  fprintf(stderr, "  ^ %s in %s\n", tag, desc);
  return 0;
}

gc_case gc_flags_case(const char *name, int m, int64_t sq, int64_t skv, int64_t wide_left) {
  gc_case c = {.name = name, .B = 1, .Sq = sq, .Skv = skv, .Hq = 4, .Hkv = (m & 16) ? 1 : 2,
               .D = 128, .causal = m & 1, .bhsd = (m >> 3) & 1,
               .dtype = (m >> 2) & 1 ? ATTN_F16 : ATTN_BF16};
  if (m & 2) c.window = 1, c.wl = (m & 4) ? 20 : wide_left, c.wr = (m & 1) ? -1 : 33;
  if (m & 4) c.softcap = 1.5f, c.amp = 2.0;
  c.sinks = (m >> 3) & 1;
  c.alibi = (m >> 1) & 1;
  return c;
}

int64_t gc_empty_rows(const gc_prob *P) {
  int64_t empties = 0;
  for (int64_t i = 0; i < P->Sq; i++) {
    int any = 0;
    for (int64_t j = 0; j < P->Skv && !any; j++) any = P->vis[i * P->Skv + j];
    empties += !any;
  }
  return empties;
}

int64_t gc_plant_unseen(gc_prob *P, float k_odd, float k_even, float v_odd, float v_even) {
  int64_t planted = 0;
  for (int64_t j = 0; j < P->Skv; j++) {
    int seen = 0;
    for (int64_t i = 0; i < P->Sq && !seen; i++) seen = P->vis[i * P->Skv + j];
    if (seen) continue;
    planted++;
    for (int64_t b = 0; b < P->B; b++)
      for (int64_t h = 0; h < P->Hkv; h++) {
        float *k = P->k + ((b * P->Skv + j) * P->Hkv + h) * P->D;
        float *v = P->v + ((b * P->Skv + j) * P->Hkv + h) * P->Dv;
        for (int64_t d = 0; d < P->D; d++) k[d] = (j & 1) ? k_odd : k_even;
        for (int64_t d = 0; d < P->Dv; d++) v[d] = (j & 1) ? v_odd : v_even;
      }
  }
  return planted;
}

int gc_have_dims(const gc_case *c) {
  char want[24];
  const int dv = c->Dv ? c->Dv : c->D;
  if (c->dtype == ATTN_F32) return 1; /* any multiple of 8 up to 256, always built */
  if (dv == c->D) snprintf(want, sizeof want, "%d", c->D);
  else snprintf(want, sizeof want, "%dx%d", c->D, dv);
  const char *s = attn_cuda_head_dims();
  for (const char *p = strstr(s, want); p; p = strstr(p + 1, want)) {
    const int before = p == s || p[-1] == ' ' || p[-1] == ',';
    const char after = p[strlen(want)];
    if (before && (after == '\0' || after == ',' || after == ' ')) return 1;
  }
  return 0;
}

int64_t gc_empty_wrong(const gc_prob *P, const gc_out *out) {
  int64_t bad = 0;
  for (int64_t i = 0; i < P->Sq; i++) {
    int any = 0;
    for (int64_t j = 0; j < P->Skv && !any; j++) any = P->vis[i * P->Skv + j];
    if (any) continue;
    for (int64_t b = 0; b < P->B; b++)
      for (int64_t h = 0; h < P->Hq; h++) {
        const float L = out->lse[(b * P->Hq + h) * P->Sq + i];
        bad += P->sinks ? !(fabsf(L - P->sinks[h]) <= 0x1p-22f * fabsf(P->sinks[h]) + 1e-7f)
                        : !(isinf(L) && L < 0);
        for (int64_t d = 0; d < P->Dv; d++) bad += out->o[((b * P->Sq + i) * P->Hq + h) * P->Dv + d] != 0.0f;
        for (int64_t d = 0; out->dq && d < P->D; d++)
          bad += out->dq[((b * P->Sq + i) * P->Hq + h) * P->D + d] != 0.0f;
      }
  }
  return bad;
}

int64_t gc_make_hot(gc_prob *P) {
  const int64_t hot = P->Skv / 2;
  int64_t masked = 0;
  for (int64_t j = 0; j < P->Skv; j++)
    for (int64_t b = 0; b < P->B; b++)
      for (int64_t h = 0; h < P->Hkv; h++)
        P->k[((b * P->Skv + j) * P->Hkv + h) * P->D] = j == hot ? tu_round(1e30f, ATTN_BF16) : 0.0f;
  for (int64_t i = 0; i < P->Sq; i++) {
    masked += !P->vis[i * P->Skv + hot];
    for (int64_t b = 0; b < P->B; b++)
      for (int64_t h = 0; h < P->Hq; h++)
        P->q[((b * P->Sq + i) * P->Hq + h) * P->D] = P->vis[i * P->Skv + hot] ? 0.0f : tu_round(1e10f, ATTN_BF16);
  }
  return masked;
}

void gc_expect_empty(const gc_prob *P, const gc_out *out, const gc_case *c, int judged,
                     int64_t empties, int64_t planted, int expect) {
  if (judged) {
    const int64_t bad = gc_empty_wrong(P, out);
    char desc[600];
    gc_describe(c, desc, sizeof desc);
    TU_CHECK(bad == 0, "%lld wrong exact values in empty rows (%lld) of %s", (long long)bad,
             (long long)empties, desc);
  }
  TU_CHECK(!(expect & GC_EXPECT_EMPTY_ROWS) || empties > 0, "case %s has no empty rows", c->name);
  TU_CHECK(!(expect & GC_EXPECT_UNSEEN_KEYS) || planted > 0, "case %s has no unseen keys", c->name);
}
