/* test_block.c — the state-carrying block API: K/V (and Q) split into blocks processed in
 * any order with attn_fwd_block + attn_state_finalize equals one-shot attn_fwd within
 * fp32 rounding; attn_state_merge of two partial states equals one state; a state holding
 * only some query rows (q_row0 != q_pos0); attn_bwd_prepare + attn_bwd_block over blocks
 * equals attn_bwd. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_case.h"

#define CHAIN_RTOL 2e-5 /* fp32 rounding of a different summation order */

static attn_ctx_t ctx;

typedef struct {
  int64_t n, at[32]; /* boundaries: block t is [at[t], at[t+1]) */
} splits;

/* Random cut points, including 1-row blocks and 64-row tile crossings. */
static splits make_splits(int64_t len, int max_blocks, tu_rng *r) {
  splits s = {0, {0}};
  s.at[s.n++] = 0;
  while (s.at[s.n - 1] < len && s.n < max_blocks) {
    int64_t step = tu_next(r) % 3 == 0 ? 1 : tu_randint(r, 1, len / 2 + 1);
    int64_t nx = s.at[s.n - 1] + step;
    s.at[s.n++] = nx < len ? nx : len;
  }
  if (s.at[s.n - 1] < len) s.at[s.n++] = len;
  s.n--; /* number of blocks */
  return s;
}

static void shuffle(int *x, int n, tu_rng *r) {
  for (int i = n - 1; i > 0; i--) {
    int j = (int)tu_randint(r, 0, i), t = x[i];
    x[i] = x[j];
    x[j] = t;
  }
}

typedef struct {
  attn_state st;
  float *m, *l, *acc;
} state_buf;

static void state_alloc(state_buf *s, const tc_prob *P, int64_t rows) {
  s->m = tu_falloc(P->B * P->Hq * rows);
  s->l = tu_falloc(P->B * P->Hq * rows);
  s->acc = tu_falloc(P->B * P->Hq * rows * P->Dv);
  attn_state st = {s->m, s->l, s->acc, P->B, P->Hq, rows, P->Dv};
  s->st = st;
  attn_status rc = attn_state_init(ctx, &s->st);
  TU_CHECK(rc == ATTN_OK, "attn_state_init: %s", attn_last_error());
}

static void state_free(state_buf *s) {
  free(s->m);
  free(s->l);
  free(s->acc);
}

/* Folds the (q block, k block) pairs listed in order[] into st: q rows [qa, qb) of the
 * problem map to state rows from qa - row_shift. */
static void fold(tc_prob *P, state_buf *s, const splits *qs, const splits *ks, const int *order,
                 int n, int64_t row_shift) {
  for (int x = 0; x < n; x++) {
    int qi = order[x] / ks->n, ki = order[x] % ks->n;
    int64_t q0 = qs->at[qi], q1 = qs->at[qi + 1], k0 = ks->at[ki], k1 = ks->at[ki + 1];
    attn_tensor q = tc_rows(&P->tq, q0, q1 - q0), k = tc_rows(&P->tk, k0, k1 - k0),
                v = tc_rows(&P->tv, k0, k1 - k0);
    attn_block_pos pos = {q0 - row_shift, q0, k0, P->Sq, P->Skv};
    attn_status rc = attn_fwd_block(ctx, &P->spec, &s->st, &q, &k, &v, &pos);
    TU_CHECK(rc == ATTN_OK, "attn_fwd_block q[%lld,%lld) k[%lld,%lld): %s", (long long)q0,
             (long long)q1, (long long)k0, (long long)k1, attn_last_error());
  }
}

static void finalize(tc_prob *P, state_buf *s, float *o, float *lse) {
  attn_tensor to = attn_tensor_f32(o, P->B, s->st.rows, P->Hq, P->Dv);
  attn_status rc = attn_state_finalize(ctx, &P->spec, &s->st, &to, lse);
  TU_CHECK(rc == ATTN_OK, "attn_state_finalize: %s", attn_last_error());
}

static void compare_fwd(tc_prob *P, const char *what, const float *o, const float *lse,
                        const tc_out *ref) {
  char label[128];
  int64_t do4[4] = {P->B, P->Sq, P->Hq, P->Dv}, dl4[4] = {1, P->B, P->Hq, P->Sq};
  int before = tu_failures;
  snprintf(label, sizeof label, "%s O vs one-shot", what);
  tu_compare_f(label, o, ref->o, tc_n_o(P), do4, CHAIN_RTOL, 1e-7);
  snprintf(label, sizeof label, "%s LSE vs one-shot", what);
  tu_compare_f(label, lse, ref->lse, tc_n_lse(P), dl4, CHAIN_RTOL, 1e-6);
  snprintf(label, sizeof label, "%s O vs oracle", what);
  tu_compare(label, o, P->ro, tc_n_o(P), do4, TC_FWD_RTOL, 1e-6);
  if (tu_failures != before) {
    char desc[512];
    tc_describe(&P->c, desc, sizeof desc);
    fprintf(stderr, "  ^ in %s\n", desc);
  }
}

static void check_forward(tc_prob *P, const tc_out *one, tu_rng *r) {
  splits qs = make_splits(P->Sq, 3, r), ks = make_splits(P->Skv, 7, r);
  int n = (int)(qs.n * ks.n), order[32 * 32];
  for (int x = 0; x < n; x++) order[x] = x;
  shuffle(order, n, r);
  float *o = tu_falloc(tc_n_o(P)), *lse = tu_falloc(tc_n_lse(P));
  /* All blocks into one state, in shuffled order. */
  state_buf s;
  state_alloc(&s, P, P->Sq);
  fold(P, &s, &qs, &ks, order, n, 0);
  finalize(P, &s, o, lse);
  compare_fwd(P, "chained", o, lse, one);
  /* Two states over disjoint halves of the pairs, merged. */
  state_buf a, b;
  state_alloc(&a, P, P->Sq);
  state_alloc(&b, P, P->Sq);
  fold(P, &a, &qs, &ks, order, n / 2, 0);
  fold(P, &b, &qs, &ks, order + n / 2, n - n / 2, 0);
  attn_status rc = attn_state_merge(ctx, &a.st, &b.st);
  TU_CHECK(rc == ATTN_OK, "attn_state_merge: %s", attn_last_error());
  tu_poison(o, tc_n_o(P));
  tu_poison(lse, tc_n_lse(P));
  finalize(P, &a, o, lse);
  compare_fwd(P, "merged", o, lse, one);
  /* Merging an untouched (initialised) state changes nothing. */
  state_buf e;
  state_alloc(&e, P, P->Sq);
  rc = attn_state_merge(ctx, &a.st, &e.st);
  TU_CHECK(rc == ATTN_OK, "attn_state_merge (empty src): %s", attn_last_error());
  rc = attn_state_merge(ctx, &e.st, &s.st);
  TU_CHECK(rc == ATTN_OK, "attn_state_merge (empty dst): %s", attn_last_error());
  tu_poison(o, tc_n_o(P));
  finalize(P, &e, o, lse);
  compare_fwd(P, "merged into empty", o, lse, one);
  state_free(&s);
  state_free(&a);
  state_free(&b);
  state_free(&e);
  free(o);
  free(lse);
}

/* A state for query rows [q0, q1) only (q_row0 = q_pos0 - q0), like a ring rank's. */
static void check_partial_rows(tc_prob *P, const tc_out *one, tu_rng *r) {
  if (P->Sq < 3) return;
  int64_t q0 = tu_randint(r, 1, P->Sq / 2), q1 = tu_randint(r, q0 + 1, P->Sq);
  splits qs = {1, {q0, q1}}, ks = make_splits(P->Skv, 5, r);
  int order[32];
  for (int x = 0; x < ks.n; x++) order[x] = x;
  shuffle(order, (int)ks.n, r);
  state_buf s;
  state_alloc(&s, P, q1 - q0);
  fold(P, &s, &qs, &ks, order, (int)ks.n, q0);
  int64_t rows = q1 - q0;
  float *o = tu_falloc(P->B * rows * P->Hq * P->Dv), *lse = tu_falloc(P->B * P->Hq * rows);
  finalize(P, &s, o, lse);
  float *ro = tu_falloc(P->B * rows * P->Hq * P->Dv), *rl = tu_falloc(P->B * P->Hq * rows);
  for (int64_t b = 0; b < P->B; b++) {
    memcpy(ro + b * rows * P->Hq * P->Dv, one->o + (b * P->Sq + q0) * P->Hq * P->Dv,
           (size_t)(rows * P->Hq * P->Dv) * sizeof(float));
    for (int64_t h = 0; h < P->Hq; h++)
      memcpy(rl + (b * P->Hq + h) * rows, one->lse + (b * P->Hq + h) * P->Sq + q0,
             (size_t)rows * sizeof(float));
  }
  int64_t do4[4] = {P->B, rows, P->Hq, P->Dv};
  tu_compare_f("partial-rows O vs one-shot", o, ro, P->B * rows * P->Hq * P->Dv, do4,
               CHAIN_RTOL, 1e-7);
  tu_compare_f("partial-rows LSE vs one-shot", lse, rl, P->B * P->Hq * rows, NULL, CHAIN_RTOL,
               1e-6);
  state_free(&s);
  free(o);
  free(lse);
  free(ro);
  free(rl);
}

static void check_backward(tc_prob *P, const tc_out *one, tu_rng *r) {
  splits qs = make_splits(P->Sq, 3, r), ks = make_splits(P->Skv, 6, r);
  int n = (int)(qs.n * ks.n), order[32 * 32];
  for (int x = 0; x < n; x++) order[x] = x;
  shuffle(order, n, r);
  float *delta = tu_falloc(tc_n_lse(P)), *ds = tu_falloc(P->Hq), *ds_want = tu_falloc(P->Hq);
  for (int64_t h = 0; h < P->Hq; h++) { /* prepare adds to dsinks */
    ds[h] = 0.25f * (float)(h + 1);
    ds_want[h] = P->c.sinks ? one->ds[h] + ds[h] : ds[h];
  }
  attn_tensor to = attn_tensor_f32(one->o, P->B, P->Sq, P->Hq, P->Dv);
  attn_tensor tdo = attn_tensor_f32(P->dout, P->B, P->Sq, P->Hq, P->Dv);
  attn_status rc = attn_bwd_prepare(ctx, &P->spec, &to, &tdo, one->lse, delta, ds);
  TU_CHECK(rc == ATTN_OK, "attn_bwd_prepare: %s", attn_last_error());
  float *dq = tu_alloc((size_t)tc_n_q(P) * sizeof(float));
  float *dk = tu_alloc((size_t)tc_n_k(P) * sizeof(float));
  float *dv = tu_alloc((size_t)tc_n_v(P) * sizeof(float));
  attn_tensor tdq = attn_tensor_f32(dq, P->B, P->Sq, P->Hq, P->Dqk);
  attn_tensor tdk = attn_tensor_f32(dk, P->B, P->Skv, P->Hkv, P->Dqk);
  attn_tensor tdv = attn_tensor_f32(dv, P->B, P->Skv, P->Hkv, P->Dv);
  for (int x = 0; x < n; x++) {
    int qi = order[x] / ks.n, ki = order[x] % ks.n;
    int64_t q0 = qs.at[qi], q1 = qs.at[qi + 1], k0 = ks.at[ki], k1 = ks.at[ki + 1];
    attn_tensor q = tc_rows(&P->tq, q0, q1 - q0), k = tc_rows(&P->tk, k0, k1 - k0),
                v = tc_rows(&P->tv, k0, k1 - k0), d_o = tc_rows(&tdo, q0, q1 - q0),
                gq = tc_rows(&tdq, q0, q1 - q0), gk = tc_rows(&tdk, k0, k1 - k0),
                gv = tc_rows(&tdv, k0, k1 - k0);
    attn_block_pos pos = {q0, q0, k0, P->Sq, P->Skv};
    rc = attn_bwd_block(ctx, &P->spec, &q, &k, &v, &d_o, one->lse, delta, P->Sq, &gq, &gk,
                        &gv, &pos);
    TU_CHECK(rc == ATTN_OK, "attn_bwd_block: %s", attn_last_error());
  }
  int before = tu_failures;
  int64_t dq4[4] = {P->B, P->Sq, P->Hq, P->Dqk}, dk4[4] = {P->B, P->Skv, P->Hkv, P->Dqk};
  int64_t dv4[4] = {P->B, P->Skv, P->Hkv, P->Dv};
  tu_compare_f("blocked dQ vs attn_bwd", dq, one->dq, tc_n_q(P), dq4, CHAIN_RTOL, 1e-7);
  tu_compare_f("blocked dK vs attn_bwd", dk, one->dk, tc_n_k(P), dk4, CHAIN_RTOL, 1e-7);
  tu_compare_f("blocked dV vs attn_bwd", dv, one->dv, tc_n_v(P), dv4, CHAIN_RTOL, 1e-7);
  tu_compare_f("prepare dsinks (+=) vs attn_bwd", ds, ds_want, P->Hq, NULL, CHAIN_RTOL, 1e-7);
  /* delta = rowsum(dO * O) */
  double *rd = tu_dalloc(tc_n_lse(P));
  for (int64_t b = 0; b < P->B; b++)
    for (int64_t i = 0; i < P->Sq; i++)
      for (int64_t h = 0; h < P->Hq; h++)
        for (int64_t d = 0; d < P->Dv; d++) {
          int64_t e = ((b * P->Sq + i) * P->Hq + h) * P->Dv + d;
          rd[(b * P->Hq + h) * P->Sq + i] += (double)one->o[e] * P->dout[e];
        }
  tu_compare("delta vs rowsum(dO*O)", delta, rd, tc_n_lse(P), NULL, 1e-5, 1e-6);
  if (tu_failures != before) {
    char desc[512];
    tc_describe(&P->c, desc, sizeof desc);
    fprintf(stderr, "  ^ in %s\n", desc);
  }
  free(rd);
  free(delta);
  free(ds);
  free(ds_want);
  free(dq);
  free(dk);
  free(dv);
}

static void run(tc_case c, uint64_t seed) {
  c.seed = seed;
  tc_prob P;
  tc_out one;
  tc_init(&P, &c);
  tc_lib(ctx, &P, &one, 1);
  if (!tc_check(&P, &one, 1, "one-shot")) {
    tc_out_free(&one);
    tc_free(&P);
    return;
  }
  tu_rng r = tu_rng_make(seed);
  check_forward(&P, &one, &r);
  check_partial_rows(&P, &one, &r);
  check_backward(&P, &one, &r);
  tc_out_free(&one);
  tc_free(&P);
}

/* ---- far positions: the last rows of a long sequence, as a ring rank holds them ------- */
typedef struct {
  const float *q, *k, *dout; /* rows from q_at / k_at on, [rows, H, D] */
  int64_t q_at, k_at, Hq, Hkv, D;
} far_src;

static void far_fetch(void *user, int which, int64_t b, int64_t s, int64_t h, float *out) {
  const far_src *f = user;
  (void)b;
  const float *src = which == ATTN_REF_Q ? f->q + ((s - f->q_at) * f->Hq + h) * f->D
                     : which == ATTN_REF_DO ? f->dout + ((s - f->q_at) * f->Hq + h) * f->D
                     : f->k + ((s - f->k_at) * f->Hkv + h) * f->D; /* K and V share data */
  memcpy(out, src, (size_t)f->D * sizeof(float));
}

/* Query rows [L-n, L) against keys [L-n-W-5, L) of a sequence of length L, causal with a
 * window of W, ALiBi, softcap and sinks, through the block API; O, LSE and dQ against the
 * oracle's row functions. */
static void check_far(int64_t L, int use_alibi) {
  const int64_t n = 70, W = 100, Hq = 2, Hkv = 1, D = 16, nk = n + W + 5;
  const int64_t q_at = L - n, k_at = L - nk;
  float *q = tu_alloc((size_t)(n * Hq * D) * 4), *k = tu_alloc((size_t)(nk * Hkv * D) * 4);
  float *dout = tu_alloc((size_t)(n * Hq * D) * 4), sinks[2] = {0.5f, -1.0f},
        alibi[2] = {0.25f, 0.0625f};
  tu_fill(q, n * Hq * D, -1, 1, 61);
  tu_fill(k, nk * Hkv * D, -1, 1, 62);
  tu_fill(dout, n * Hq * D, -1, 1, 63);
  attn_spec sp = ATTN_SPEC_INIT;
  sp.num_heads_q = (int32_t)Hq;
  sp.num_heads_kv = (int32_t)Hkv;
  sp.head_dim_qk = (int32_t)D;
  sp.causal = 1;
  sp.window_left = W;
  sp.softcap = 3.0f;
  sp.sinks = sinks;
  sp.alibi_slopes = use_alibi ? alibi : NULL;
  attn_tensor tq = attn_tensor_f32(q, 1, n, Hq, D), tk = attn_tensor_f32(k, 1, nk, Hkv, D);
  attn_tensor tdo = attn_tensor_f32(dout, 1, n, Hq, D);
  state_buf s;
  tc_prob shape = {0};
  shape.B = 1;
  shape.Hq = Hq;
  shape.Dv = D;
  state_alloc(&s, &shape, n);
  int64_t cut = nk / 3;
  for (int part = 0; part < 2; part++) { /* the later block first */
    int64_t a = part ? 0 : cut, e = part ? cut : nk;
    attn_tensor kk = tc_rows(&tk, a, e - a);
    attn_block_pos pos = {0, q_at, k_at + a, L, L};
    attn_status rc = attn_fwd_block(ctx, &sp, &s.st, &tq, &kk, &kk, &pos);
    TU_CHECK(rc == ATTN_OK, "far fwd_block: %s", attn_last_error());
  }
  float *o = tu_falloc(n * Hq * D), *lse = tu_falloc(Hq * n), *delta = tu_falloc(Hq * n);
  attn_tensor to = attn_tensor_f32(o, 1, n, Hq, D);
  TU_CHECK(attn_state_finalize(ctx, &sp, &s.st, &to, lse) == ATTN_OK, "far finalize: %s",
           attn_last_error());
  float ds[2] = {0, 0}, *dq = tu_alloc((size_t)(n * Hq * D) * 4), *dk = tu_alloc((size_t)(nk * D) * 4),
        *dv = tu_alloc((size_t)(nk * D) * 4);
  TU_CHECK(attn_bwd_prepare(ctx, &sp, &to, &tdo, lse, delta, ds) == ATTN_OK, "far prepare: %s",
           attn_last_error());
  attn_tensor tdq = attn_tensor_f32(dq, 1, n, Hq, D), tdk = attn_tensor_f32(dk, 1, nk, Hkv, D),
              tdv = attn_tensor_f32(dv, 1, nk, Hkv, D);
  attn_block_pos pos = {0, q_at, k_at, L, L};
  TU_CHECK(attn_bwd_block(ctx, &sp, &tq, &tk, &tk, &tdo, lse, delta, n, &tdq, &tdk, &tdv, &pos) ==
               ATTN_OK, "far bwd_block: %s", attn_last_error());
  far_src src = {q, k, dout, q_at, k_at, Hq, Hkv, D};
  attn_ref_problem rp = {&sp, 1, L, L, far_fetch, &src};
  double *ro = tu_dalloc(n * Hq * D), *rl = tu_dalloc(Hq * n), *rdq = tu_dalloc(n * Hq * D);
  for (int64_t i = 0; i < n; i++)
    for (int64_t h = 0; h < Hq; h++) {
      double dl, dsk;
      attn_ref_fwd_row(&rp, 0, h, q_at + i, ro + (i * Hq + h) * D, &rl[h * n + i]);
      attn_ref_bwd_qrow(&rp, 0, h, q_at + i, rdq + (i * Hq + h) * D, &dl, &dsk);
    }
  char label[96];
  int before = tu_failures;
  snprintf(label, sizeof label, "far positions (L=%lld) O", (long long)L);
  tu_compare(label, o, ro, n * Hq * D, NULL, TC_FWD_RTOL, 1e-6);
  snprintf(label, sizeof label, "far positions (L=%lld) LSE", (long long)L);
  tu_compare(label, lse, rl, Hq * n, NULL, TC_FWD_RTOL, 2e-6);
  snprintf(label, sizeof label, "far positions (L=%lld) dQ", (long long)L);
  tu_compare(label, dq, rdq, n * Hq * D, NULL, TC_BWD_RTOL, 1e-6);
  if (tu_failures != before)
    fprintf(stderr, "  ^ query rows [%lld, %lld) of %lld, causal, window %lld,%s softcap, "
            "sinks\n", (long long)q_at, (long long)L, (long long)L, (long long)W,
            use_alibi ? " ALiBi," : "");
  state_free(&s);
  free(q);
  free(k);
  free(dout);
  free(o);
  free(lse);
  free(delta);
  free(dq);
  free(dk);
  free(dv);
  free(ro);
  free(rl);
  free(rdq);
}

static void run_cases(uint64_t seed) {
  static const int32_t lq[] = {70, 0, 90, 31}, lkv[] = {100, 20, 64, 130};
  run((tc_case){.name = "plain", .B = 1, .Sq = 130, .Skv = 200, .Hq = 2, .Hkv = 1, .Dqk = 32}, seed++);
  run((tc_case){.name = "all flags", .B = 2, .Sq = 150, .Skv = 333, .Hq = 4, .Hkv = 2, .Dqk = 48,
                .Dv = 40, .causal = 1, .window = 1, .wl = 120, .wr = -1, .softcap = 2.0f,
                .sinks = 1, .alibi = 1, .bhsd = 1},
      seed++);
  run((tc_case){.name = "Sq>Skv causal sinks", .B = 1, .Sq = 200, .Skv = 70, .Hq = 3, .Hkv = 1,
                .Dqk = 16, .causal = 1, .sinks = 1},
      seed++);
  run((tc_case){.name = "window both", .B = 1, .Sq = 257, .Skv = 257, .Hq = 1, .Hkv = 1,
                .Dqk = 64, .window = 1, .wl = 30, .wr = 40, .alibi = 1},
      seed++);
  run((tc_case){.name = "varlen mask", .Hq = 2, .Hkv = 2, .Dqk = 24, .nseq = 4, .lq = lq,
                .lkv = lkv, .causal = 1, .bq = 32, .bk = 16, .sinks = 1},
      seed++);
  run((tc_case){.name = "decode", .B = 2, .Sq = 1, .Skv = 700, .Hq = 4, .Hkv = 1, .Dqk = 128,
                .sinks = 1},
      seed++);
  run((tc_case){.name = "decode GQA alibi", .B = 1, .Sq = 3, .Skv = 900, .Hq = 6, .Hkv = 2,
                .Dqk = 64, .causal = 1, .alibi = 1, .softcap = 3.0f, .bhsd = 1},
      seed++);
  run((tc_case){.name = "rows, Dv > 64", .B = 1, .Sq = 7, .Skv = 7, .Hq = 6, .Hkv = 3,
                .Dqk = 128},
      seed++);
}

int main(void) {
  /* 2 threads, then 7: with 7 the short cases have fewer work items than threads, and the
   * forward splits their keys over the threads inside each block call. */
  ctx = tc_ctx(0, 2);
  run_cases(100);
  attn_ctx_destroy(ctx);
  ctx = tc_ctx(0, 7);
  run_cases(200);
  attn_ctx_destroy(ctx);
  ctx = tc_ctx(0, 2);
  check_far(1000, 1);
  check_far(((int64_t)1 << 20) + 777, 1); /* 1M tokens: the design's long context */
  check_far(((int64_t)1 << 25) + 3, 0);
  check_far(((int64_t)1 << 25) + 3, 1);   /* past 2^24: positions are not exact in float */
  attn_ctx_destroy(ctx);
  return tu_finish("test_block");
}
