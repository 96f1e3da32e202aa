/* test_case.c — the library-vs-oracle harness (see test_case.h). */
#include "test_case.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int64_t tc_n_q(const tc_prob *P) { return P->B * P->Sq * P->Hq * P->Dqk; }
int64_t tc_n_k(const tc_prob *P) { return P->B * P->Skv * P->Hkv * P->Dqk; }
int64_t tc_n_v(const tc_prob *P) { return P->B * P->Skv * P->Hkv * P->Dv; }
int64_t tc_n_o(const tc_prob *P) { return P->B * P->Sq * P->Hq * P->Dv; }
int64_t tc_n_lse(const tc_prob *P) { return P->B * P->Hq * P->Sq; }

attn_ctx_t tc_ctx_amx(int force_scalar, int threads, int cpu_amx) {
  attn_ctx_config cfg = ATTN_CTX_CONFIG_INIT;
  cfg.backend = ATTN_BACKEND_CPU;
  cfg.num_threads = threads;
  cfg.force_scalar = force_scalar;
  cfg.cpu_amx = cpu_amx;
  attn_ctx_t ctx = NULL;
  attn_status st = attn_ctx_create(&ctx, &cfg);
  if (st == ATTN_ERR_UNSUPPORTED && cpu_amx >= 1) return NULL;
  if (st != ATTN_OK) {
    fprintf(stderr, "attn_ctx_create: %s: %s\n", attn_status_string(st), attn_last_error());
    exit(1);
  }
  return ctx;
}

attn_ctx_t tc_ctx(int force_scalar, int threads) { return tc_ctx_amx(force_scalar, threads, 0); }

void tc_describe(const tc_case *c, char *buf, size_t n) {
  int w = snprintf(buf, n, "%s: B=%lld Sq=%lld Skv=%lld Hq=%d Hkv=%d Dqk=%d Dv=%d",
                   c->name ? c->name : "case", (long long)c->B, (long long)c->Sq,
                   (long long)c->Skv, c->Hq, c->Hkv, c->Dqk, c->Dv ? c->Dv : c->Dqk);
#define ADD(...)                                                        \
  do {                                                                  \
    if (w >= 0 && (size_t)w < n) w += snprintf(buf + w, n - (size_t)w, __VA_ARGS__); \
  } while (0)
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
  if (c->dtype) ADD(" %s", c->dtype == ATTN_BF16 ? "bf16" : c->dtype == ATTN_F16 ? "f16" : "dtype?");
  if (c->amp > 0) ADD(" amp=%g", c->amp);
  ADD(" seed=%llu", (unsigned long long)c->seed);
#undef ADD
}

static size_t esize(int dt) { return dt == ATTN_F32 ? 4 : 2; }

/* Element x of a library buffer of dtype dt. */
static void put(void *buf, int64_t x, int dt, float v) {
  if (dt == ATTN_F32) ((float *)buf)[x] = v;
  else ((uint16_t *)buf)[x] = tu_to_bits(v, dt);
}
static float get(const void *buf, int64_t x, int dt) {
  return dt == ATTN_F32 ? ((const float *)buf)[x] : tu_from_bits(((const uint16_t *)buf)[x], dt);
}

/* A [B,S,H,D] tensor of dtype dt over buf, in BHSD memory order when asked. */
static attn_tensor lib_view(const tc_prob *P, void *buf, int dt, int64_t S, int64_t H,
                            int64_t D) {
  attn_tensor t = {buf, (attn_dtype)dt, ATTN_DEVICE_HOST, {P->B, S, H, D}, {S * H * D, H * D, D, 1}};
  if (P->c.bhsd) {
    t.stride[1] = D;
    t.stride[2] = S * D;
  }
  return t;
}

/* Index in a library buffer (case memory order) of element (b, s, h, d). */
static int64_t lib_index(const tc_prob *P, int64_t S, int64_t H, int64_t D, int64_t b,
                         int64_t s, int64_t h, int64_t d) {
  return P->c.bhsd ? ((b * H + h) * S + s) * D + d : ((b * S + s) * H + h) * D + d;
}

/* Library copy of a [B,S,H,D] float array (values representable in the case's dtype). */
static void make_lib_tensor(const tc_prob *P, const float *src, int64_t S, int64_t H,
                            int64_t D, void **buf, attn_tensor *t) {
  const int dt = P->c.dtype;
  int64_t n = P->B * S * H * D;
  if (!*buf) *buf = tu_alloc((size_t)n * esize(dt));
  for (int64_t b = 0; b < P->B; b++)
    for (int64_t s = 0; s < S; s++)
      for (int64_t h = 0; h < H; h++)
        for (int64_t d = 0; d < D; d++)
          put(*buf, lib_index(P, S, H, D, b, s, h, d), dt, src[((b * S + s) * H + h) * D + d]);
  *t = lib_view(P, *buf, dt, S, H, D);
}

/* Gathers a library output of dtype dt (case memory order) to float [B,S,H,D]. */
static void gather(const tc_prob *P, const void *buf, int dt, int64_t S, int64_t H, int64_t D,
                   float *dst) {
  for (int64_t b = 0; b < P->B; b++)
    for (int64_t s = 0; s < S; s++)
      for (int64_t h = 0; h < H; h++)
        for (int64_t d = 0; d < D; d++)
          dst[((b * S + s) * H + h) * D + d] = get(buf, lib_index(P, S, H, D, b, s, h, d), dt);
}

/* A poisoned output buffer of n elements of dtype dt (0xFFFF: NaN in bf16 and f16). */
static void *out_buf(int64_t n, int dt) {
  if (dt == ATTN_F32) return tu_falloc(n);
  uint16_t *h = tu_alloc((size_t)n * 2);
  for (int64_t x = 0; x < n; x++) h[x] = 0xFFFFu;
  return h;
}

void tc_init(tc_prob *P, const tc_case *c) {
  memset(P, 0, sizeof *P);
  P->c = *c;
  P->B = c->B;
  P->Sq = c->Sq;
  P->Skv = c->Skv;
  P->Hq = c->Hq;
  P->Hkv = c->Hkv;
  P->Dqk = c->Dqk;
  P->Dv = c->Dv ? c->Dv : c->Dqk;
  attn_spec s = ATTN_SPEC_INIT;
  s.num_heads_q = c->Hq;
  s.num_heads_kv = c->Hkv;
  s.head_dim_qk = c->Dqk;
  s.head_dim_v = c->Dv;
  s.scale = c->scale;
  s.causal = c->causal;
  s.window_left = c->window ? c->wl : -1;
  s.window_right = c->window ? c->wr : -1;
  s.softcap = c->softcap;
  P->spec = s;
  if (c->nseq) {
    tu_varlen(&P->spec, c->nseq, c->lq, c->lkv, &P->cu_q, &P->cu_kv, &P->Sq, &P->Skv);
    P->B = 1;
  }
  if (c->bq)
    tu_block_mask(&P->spec, &P->bm, &P->mask, P->Sq, P->Skv, c->nseq, c->lq, c->lkv, c->bq,
                  c->bk, c->mask_short, c->mask_bits, c->seed * 31 + 7);
  uint64_t seed = c->seed * 1000;
  double amp = c->amp > 0 ? c->amp : 1.0;
  P->sinks = tu_alloc((size_t)P->Hq * sizeof(float));
  P->alibi = tu_alloc((size_t)P->Hq * sizeof(float));
  tu_fill(P->sinks, P->Hq, -1.5, 2.5, seed + 5);
  for (int64_t h = 0; h < P->Hq; h++) /* the usual geometric slopes */
    P->alibi[h] = powf(2.0f, -8.0f * (float)(h + 1) / (float)P->Hq);
  if (c->sinks) P->spec.sinks = P->sinks;
  if (c->alibi) P->spec.alibi_slopes = P->alibi;
  P->q = tu_alloc((size_t)tc_n_q(P) * sizeof(float));
  P->k = tu_alloc((size_t)tc_n_k(P) * sizeof(float));
  P->v = tu_alloc((size_t)tc_n_v(P) * sizeof(float));
  P->dout = tu_alloc((size_t)tc_n_o(P) * sizeof(float));
  tu_fill(P->q, tc_n_q(P), -amp, amp, seed + 1);
  tu_fill(P->k, tc_n_k(P), -amp, amp, seed + 2);
  tu_fill(P->v, tc_n_v(P), -1.0, 1.0, seed + 3);
  tu_fill(P->dout, tc_n_o(P), -1.0, 1.0, seed + 4);
  P->arr.q = P->q;
  P->arr.k = P->k;
  P->arr.v = P->v;
  P->arr.dout = P->dout;
  attn_ref_problem_arrays(&P->rp, &P->spec, P->B, P->Sq, P->Skv, &P->arr);
  tc_sync(P);
}

static void free_ref(tc_prob *P) {
  free(P->ro);
  free(P->rlse);
  free(P->rdq);
  free(P->rdk);
  free(P->rdv);
  free(P->rds);
  P->ro = P->rlse = P->rdq = P->rdk = P->rdv = P->rds = NULL;
}

void tc_sync(tc_prob *P) {
  if (P->c.dtype != ATTN_F32) { /* what the library can be given, the oracle reads */
    float *x[4] = {P->q, P->k, P->v, P->dout};
    int64_t n[4] = {tc_n_q(P), tc_n_k(P), tc_n_v(P), tc_n_o(P)};
    for (int a = 0; a < 4; a++)
      for (int64_t i = 0; i < n[a]; i++) x[a][i] = tu_round(x[a][i], P->c.dtype);
  }
  make_lib_tensor(P, P->q, P->Sq, P->Hq, P->Dqk, &P->lq, &P->tq);
  make_lib_tensor(P, P->k, P->Skv, P->Hkv, P->Dqk, &P->lk, &P->tk);
  make_lib_tensor(P, P->v, P->Skv, P->Hkv, P->Dv, &P->lv, &P->tv);
  make_lib_tensor(P, P->dout, P->Sq, P->Hq, P->Dv, &P->ldo, &P->tdo);
  free_ref(P);
}

void tc_ref(tc_prob *P, int bwd) {
  if (!P->ro) {
    P->ro = tu_dalloc(tc_n_o(P));
    P->rlse = tu_dalloc(tc_n_lse(P));
    attn_ref_fwd(&P->rp, P->ro, P->rlse);
  }
  if (bwd && !P->rdq) {
    P->rdq = tu_dalloc(tc_n_q(P));
    P->rdk = tu_dalloc(tc_n_k(P));
    P->rdv = tu_dalloc(tc_n_v(P));
    P->rds = tu_dalloc(P->Hq);
    attn_ref_bwd(&P->rp, P->rdq, P->rdk, P->rdv, P->rds);
  }
}

void tc_lib(attn_ctx_t ctx, tc_prob *P, tc_out *out, int bwd) {
  memset(out, 0, sizeof *out);
  out->o = tu_falloc(tc_n_o(P));
  out->lse = tu_falloc(tc_n_lse(P));
  void *obuf = out_buf(tc_n_o(P), P->c.dtype);
  attn_tensor to = lib_view(P, obuf, P->c.dtype, P->Sq, P->Hq, P->Dv);
  out->fwd_status = attn_fwd(ctx, &P->spec, &P->tq, &P->tk, &P->tv, &to, out->lse);
  gather(P, obuf, P->c.dtype, P->Sq, P->Hq, P->Dv, out->o);
  out->bwd_status = ATTN_OK;
  if (bwd) {
    out->dq = tu_falloc(tc_n_q(P));
    out->dk = tu_falloc(tc_n_k(P));
    out->dv = tu_falloc(tc_n_v(P));
    out->ds = tu_falloc(P->Hq);
    float *bq = tu_falloc(tc_n_q(P)), *bk = tu_falloc(tc_n_k(P)), *bv = tu_falloc(tc_n_v(P));
    attn_tensor tdq = lib_view(P, bq, ATTN_F32, P->Sq, P->Hq, P->Dqk);
    attn_tensor tdk = lib_view(P, bk, ATTN_F32, P->Skv, P->Hkv, P->Dqk);
    attn_tensor tdv = lib_view(P, bv, ATTN_F32, P->Skv, P->Hkv, P->Dv);
    out->bwd_status = attn_bwd(ctx, &P->spec, &P->tq, &P->tk, &P->tv, &to, out->lse, &P->tdo,
                               &tdq, &tdk, &tdv, out->ds);
    gather(P, bq, ATTN_F32, P->Sq, P->Hq, P->Dqk, out->dq);
    gather(P, bk, ATTN_F32, P->Skv, P->Hkv, P->Dqk, out->dk);
    gather(P, bv, ATTN_F32, P->Skv, P->Hkv, P->Dv, out->dv);
    free(bq);
    free(bk);
    free(bv);
  }
  free(obuf);
}

void tc_out_free(tc_out *out) {
  free(out->o);
  free(out->lse);
  free(out->dq);
  free(out->dk);
  free(out->dv);
  free(out->ds);
  memset(out, 0, sizeof *out);
}

void tc_free(tc_prob *P) {
  free_ref(P);
  free(P->q);
  free(P->k);
  free(P->v);
  free(P->dout);
  free(P->lq);
  free(P->lk);
  free(P->lv);
  free(P->ldo);
  free(P->sinks);
  free(P->alibi);
  free(P->cu_q);
  free(P->cu_kv);
  free(P->mask);
  memset(P, 0, sizeof *P);
}

static void report_case(const tc_prob *P, const char *tag) {
  char desc[512];
  tc_describe(&P->c, desc, sizeof desc);
  fprintf(stderr, "  ^ in [%s] %s\n", tag ? tag : "", desc);
}

/* bf16/f16: how far O's rounding can move d(sink_h) = -sum_i e^(sink_h - lse_i) delta_i,
 * delta_i = dO_i . O_i: u * sum_i e^(sink_h - lse_i) sum_d |dO_id O_id| (max over h). */
static double dsinks_bound(const tc_prob *P) {
  const double u = TC_O_RTOL(P->c.dtype);
  double worst = 0;
  for (int64_t h = 0; u > 0 && h < P->Hq; h++) {
    double sum = 0;
    for (int64_t b = 0; b < P->B; b++)
      for (int64_t i = 0; i < P->Sq; i++) {
        double L = P->rlse[(b * P->Hq + h) * P->Sq + i], dd = 0;
        if (isinf(L)) continue;
        for (int64_t d = 0; d < P->Dv; d++) {
          int64_t x = ((b * P->Sq + i) * P->Hq + h) * P->Dv + d;
          dd += fabs((double)P->dout[x] * P->ro[x]);
        }
        sum += exp((double)P->sinks[h] - L) * dd;
      }
    worst = fmax(worst, u * sum);
  }
  return worst;
}

/* The gradients of out against the oracle (computed). */
static void check_grads(tc_prob *P, const tc_out *out) {
  int64_t dq4[4] = {P->B, P->Sq, P->Hq, P->Dqk}, dk4[4] = {P->B, P->Skv, P->Hkv, P->Dqk};
  int64_t dv4[4] = {P->B, P->Skv, P->Hkv, P->Dv};
  /* A gradient that cancels to ~0 (e.g. dK with one visible key: dS = dP - delta) is
   * judged on the scale of all three gradients, not on its own max. */
  double g = tu_max_abs(P->rdq, tc_n_q(P));
  g = fmax(g, fmax(tu_max_abs(P->rdk, tc_n_k(P)), tu_max_abs(P->rdv, tc_n_v(P))));
  const double rtol = TC_BWD_RTOL + TC_G_RTOL(P->c.dtype), atol = 1e-6 + 0.1 * rtol * g;
  tu_compare("dQ", out->dq, P->rdq, tc_n_q(P), dq4, rtol, atol);
  tu_compare("dK", out->dk, P->rdk, tc_n_k(P), dk4, rtol, atol);
  tu_compare("dV", out->dv, P->rdv, tc_n_v(P), dv4, rtol, atol);
  if (P->c.sinks) tu_compare("dsinks", out->ds, P->rds, P->Hq, NULL, rtol, 1e-6 + dsinks_bound(P));
}

static int status_ok(tc_prob *P, const tc_out *out, int bwd, const char *tag) {
  if (out->fwd_status == ATTN_OK && (!bwd || out->bwd_status == ATTN_OK)) return 1;
  tu_failures++;
  fprintf(stderr, "FAIL status fwd=%s bwd=%s: %s\n", attn_status_string(out->fwd_status),
          attn_status_string(out->bwd_status), attn_last_error());
  report_case(P, tag);
  return 0;
}

int tc_check(tc_prob *P, const tc_out *out, int bwd, const char *tag) {
  int before = tu_failures;
  if (!status_ok(P, out, bwd, tag)) return 0;
  tc_ref(P, bwd);
  int64_t do4[4] = {P->B, P->Sq, P->Hq, P->Dv}, dl4[4] = {1, P->B, P->Hq, P->Sq};
  const int dt = P->c.dtype;
  tu_compare("O", out->o, P->ro, tc_n_o(P), do4, TC_FWD_RTOL + TC_O_RTOL(dt), 1e-6);
  tu_compare("LSE", out->lse, P->rlse, tc_n_lse(P), dl4, TC_FWD_RTOL, 2e-6);
  if (bwd) check_grads(P, out);
  if (tu_failures != before) report_case(P, tag);
  return tu_failures == before;
}

int tc_check_grads(tc_prob *P, const tc_out *out, const char *tag) {
  int before = tu_failures;
  if (!status_ok(P, out, 1, tag)) return 0;
  tc_ref(P, 1);
  check_grads(P, out);
  if (tu_failures != before) report_case(P, tag);
  return tu_failures == before;
}

int tc_check_pair(const tc_prob *P, const tc_out *a, const tc_out *b, int bwd, double rtol,
                  const char *tag) {
  int before = tu_failures;
  int64_t dq4[4] = {P->B, P->Sq, P->Hq, P->Dqk}, dk4[4] = {P->B, P->Skv, P->Hkv, P->Dqk};
  int64_t do4[4] = {P->B, P->Sq, P->Hq, P->Dv}, dv4[4] = {P->B, P->Skv, P->Hkv, P->Dv};
  int64_t dl4[4] = {1, P->B, P->Hq, P->Sq};
  tu_compare_f("O (pair)", a->o, b->o, tc_n_o(P), do4, rtol, 1e-7);
  tu_compare_f("LSE (pair)", a->lse, b->lse, tc_n_lse(P), dl4, rtol, 1e-6);
  if (bwd) {
    tu_compare_f("dQ (pair)", a->dq, b->dq, tc_n_q(P), dq4, rtol, 1e-7);
    tu_compare_f("dK (pair)", a->dk, b->dk, tc_n_k(P), dk4, rtol, 1e-7);
    tu_compare_f("dV (pair)", a->dv, b->dv, tc_n_v(P), dv4, rtol, 1e-7);
    if (P->c.sinks) tu_compare_f("dsinks (pair)", a->ds, b->ds, P->Hq, NULL, rtol, 1e-7);
  }
  if (tu_failures != before) report_case(P, tag);
  return tu_failures == before;
}

attn_tensor tc_rows(const attn_tensor *t, int64_t s0, int64_t n) {
  attn_tensor r = *t;
  r.data = (char *)t->data + s0 * t->stride[1] * (int64_t)attn_dtype_size(t->dtype);
  r.shape[1] = n;
  return r;
}

attn_state tc_fwd_blocks(attn_ctx_t ctx, tc_prob *P, const int64_t *cuts, int n) {
  attn_state st = {.batch = P->B, .heads = P->Hq, .rows = P->Sq, .head_dim_v = P->Dv};
  st.m = tu_falloc(P->B * P->Hq * P->Sq);
  st.l = tu_falloc(P->B * P->Hq * P->Sq);
  st.acc = tu_falloc(P->B * P->Hq * P->Sq * P->Dv);
  TU_CHECK(attn_state_init(ctx, &st) == ATTN_OK, "state_init: %s", attn_last_error());
  for (int b = 0; b < n; b++) {
    attn_tensor k = tc_rows(&P->tk, cuts[b], cuts[b + 1] - cuts[b]);
    attn_tensor v = tc_rows(&P->tv, cuts[b], cuts[b + 1] - cuts[b]);
    attn_block_pos pos = {.q_row0 = 0, .q_pos0 = 0, .k_pos0 = cuts[b], .seq_q = P->Sq,
                          .seq_kv = P->Skv};
    attn_status s = attn_fwd_block(ctx, &P->spec, &st, &P->tq, &k, &v, &pos);
    TU_CHECK(s == ATTN_OK, "fwd_block %d: %s", b, attn_last_error());
  }
  return st;
}

tc_case tc_flags_case(tc_case c, int m, const int32_t *lq, const int32_t *lkv) {
  c.name = "flags";
  c.bhsd = (m >> 1) & 1;
  c.causal = m & 1;
  if (m & 2) {
    c.window = 1;
    c.wl = (m & 64) ? 20 : 75;
    c.wr = (m & 1) ? -1 : 33;
  }
  if (m & 4) c.softcap = 1.5f, c.amp = 2.0;
  c.sinks = (m >> 3) & 1;
  c.alibi = (m >> 4) & 1;
  if (m & 32) c.nseq = 3, c.lq = lq, c.lkv = lkv;
  if (m & 64) c.bq = 32, c.bk = 48;
  return c;
}

tu_rng tc_random_rng(int *count, int dflt) {
  const char *seed = getenv("ATTN_TEST_SEED"), *n = getenv("ATTN_TEST_COUNT");
  *count = n ? atoi(n) : dflt;
  /* seeds k and k + 1 must not give overlapping streams (tu_rng_make's states are one
   * step apart): spread them */
  return tu_rng_make((seed ? strtoull(seed, NULL, 10) : 20261203) * 0xD1B54A32D192ED03ull);
}

static int64_t pick(tu_rng *r, const int64_t *v, int n) { return v[tu_randint(r, 0, n - 1)]; }

tc_case tc_random_case(tu_rng *r, int32_t lq[4], int32_t lkv[4]) {
  static const int64_t lens[] = {1, 2, 3, 5, 6, 7, 9, 10, 13, 16, 17, 31, 63, 64, 65, 127, 128, 129, 200, 257, 300};
  static const int64_t dims[] = {8, 16, 24, 32, 48, 64, 80, 96, 128, 256};
  const int nl = (int)(sizeof lens / sizeof lens[0]), nd = (int)(sizeof dims / sizeof dims[0]);
  tc_case c = {.name = "random", .B = tu_randint(r, 1, 3), .Hkv = (int)tu_randint(r, 1, 3)};
  c.Hq = c.Hkv * (int)tu_randint(r, 1, 4);
  c.Sq = pick(r, lens, nl);
  c.Skv = tu_randint(r, 0, 2) ? c.Sq : pick(r, lens, nl);
  c.Dqk = (int)pick(r, dims, nd);
  c.Dv = tu_randint(r, 0, 2) ? 0 : (int)pick(r, dims, nd);
  c.causal = (int)tu_randint(r, 0, 1);
  if (tu_randint(r, 0, 3) == 0) c.window = 1, c.wl = tu_randint(r, -1, 80), c.wr = tu_randint(r, -1, 40);
  if (tu_randint(r, 0, 4) == 0) c.softcap = 2.0f, c.amp = 2.0;
  c.sinks = tu_randint(r, 0, 3) == 0;
  c.alibi = tu_randint(r, 0, 3) == 0;
  c.bhsd = (int)tu_randint(r, 0, 1);
  c.bwd = tu_randint(r, 0, 2) == 0;
  c.dtype = tu_randint(r, 0, 2) ? ATTN_BF16 : ATTN_F16;
  if (tu_randint(r, 0, 5) == 0) {
    c.nseq = 4, c.lq = lq, c.lkv = lkv;
    for (int i = 0; i < 4; i++) lq[i] = (int32_t)tu_randint(r, 0, 150), lkv[i] = (int32_t)tu_randint(r, 0, 150);
  }
  if (tu_randint(r, 0, 5) == 0) c.bq = (int)tu_randint(r, 1, 96), c.bk = (int)tu_randint(r, 1, 96);
  return c;
}

int tc_run(attn_ctx_t ctx, const tc_case *c) {
  tc_prob P;
  tc_out out;
  tc_init(&P, c);
  tc_lib(ctx, &P, &out, c->bwd);
  int ok = tc_check(&P, &out, c->bwd, NULL);
  tc_out_free(&out);
  tc_free(&P);
  return ok;
}
