/* test_empty.c — empty rows and poisoned keys: rows that see no key give O = 0,
 * LSE = -inf (or the sink), zero gradients, never NaN; NaN/Inf in keys that no query sees
 * (outside a window band, another varlen sequence, skipped sparse blocks) must not leak;
 * nor may keys masked for some queries of a tile but visible to others (their scores are
 * made to overflow to +inf for the queries that cannot see them); large logits (±1e4).
 * Inputs in float32, bf16 and f16 (not all cases fit f16), on the SIMD and scalar paths. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_case.h"

static attn_ctx_t ctx;
static uint64_t next_seed = 500;
static int dtype; /* of the cases' inputs and O: ATTN_F32, ATTN_BF16, ATTN_F16 */
static const char *dtype_name(void) {
  return dtype == ATTN_BF16 ? "bf16" : dtype == ATTN_F16 ? "f16" : "f32";
}

/* Visibility of key j to query i (same for every batch and head). */
static int vis(const tc_prob *P, int64_t i, int64_t j) { return attn_ref_visible(&P->rp, i, j); }

static float *krow(tc_prob *P, int64_t b, int64_t j, int64_t h) {
  return P->k + ((b * P->Skv + j) * P->Hkv + h) * P->Dqk;
}
static float *vrow(tc_prob *P, int64_t b, int64_t j, int64_t h) {
  return P->v + ((b * P->Skv + j) * P->Hkv + h) * P->Dv;
}
static float *qrow(tc_prob *P, int64_t b, int64_t i, int64_t h) {
  return P->q + ((b * P->Sq + i) * P->Hq + h) * P->Dqk;
}

/* NaN in K and Inf in V of every key that no query sees. Returns how many. */
static int64_t plant_unseen(tc_prob *P, uint8_t *seen) {
  int64_t planted = 0;
  for (int64_t j = 0; j < P->Skv; j++) {
    seen[j] = 0;
    for (int64_t i = 0; i < P->Sq && !seen[j]; i++) seen[j] = (uint8_t)vis(P, i, j);
    if (seen[j]) continue;
    planted++;
    for (int64_t b = 0; b < P->B; b++)
      for (int64_t h = 0; h < P->Hkv; h++) {
        for (int64_t d = 0; d < P->Dqk; d++) krow(P, b, j, h)[d] = (j & 1) ? NAN : -INFINITY;
        for (int64_t d = 0; d < P->Dv; d++) vrow(P, b, j, h)[d] = (j & 1) ? INFINITY : NAN;
      }
  }
  tc_sync(P);
  return planted;
}

/* Exact values in empty rows and unseen keys. */
static void check_exact(tc_prob *P, const tc_out *out, const uint8_t *seen, int bwd) {
  int64_t empties = 0, bad = 0;
  for (int64_t i = 0; i < P->Sq; i++) {
    int any = 0;
    for (int64_t j = 0; j < P->Skv && !any; j++) any = vis(P, i, j);
    if (any) continue;
    empties++;
    for (int64_t b = 0; b < P->B; b++)
      for (int64_t h = 0; h < P->Hq; h++) {
        float L = out->lse[(b * P->Hq + h) * P->Sq + i];
        /* With a sink: the sink, allowing the one rounding of a log2-unit round trip. */
        if (P->c.sinks && L != P->sinks[h] && !(fabsf(L - P->sinks[h]) <= 0x1p-23f * fabsf(P->sinks[h])))
          fprintf(stderr, "empty row %lld head %lld: LSE %.9g, sink %.9g\n", (long long)i,
                  (long long)h, (double)L, (double)P->sinks[h]);
        bad += P->c.sinks ? !(fabsf(L - P->sinks[h]) <= 0x1p-23f * fabsf(P->sinks[h]))
                          : !(isinf(L) && L < 0);
        for (int64_t d = 0; d < P->Dv; d++) bad += out->o[((b * P->Sq + i) * P->Hq + h) * P->Dv + d] != 0.0f;
        for (int64_t d = 0; d < P->Dqk && bwd; d++)
          bad += out->dq[((b * P->Sq + i) * P->Hq + h) * P->Dqk + d] != 0.0f;
      }
  }
  for (int64_t j = 0; j < P->Skv && bwd; j++) {
    if (seen[j]) continue;
    for (int64_t b = 0; b < P->B; b++)
      for (int64_t h = 0; h < P->Hkv; h++) {
        for (int64_t d = 0; d < P->Dqk; d++) bad += out->dk[((b * P->Skv + j) * P->Hkv + h) * P->Dqk + d] != 0.0f;
        for (int64_t d = 0; d < P->Dv; d++) bad += out->dv[((b * P->Skv + j) * P->Hkv + h) * P->Dv + d] != 0.0f;
      }
  }
  char desc[512];
  tc_describe(&P->c, desc, sizeof desc);
  TU_CHECK(bad == 0, "%lld wrong exact values (empty rows: %lld) in %s, %s", (long long)bad,
           (long long)empties, desc, attn_ctx_backend_name(ctx));
}

enum { EXPECT_EMPTY_ROWS = 1, EXPECT_UNSEEN_KEYS = 2 };

static void run_empty(tc_case c, int expect) {
  c.seed = next_seed++;
  c.dtype = dtype;
  c.bwd = 1;
  tc_prob P;
  tc_out out;
  tc_init(&P, &c);
  uint8_t *seen = tu_alloc((size_t)P.Skv);
  int64_t planted = plant_unseen(&P, seen);
  tc_lib(ctx, &P, &out, 1);
  char tag[64];
  snprintf(tag, sizeof tag, "NaN/Inf in unseen keys, %s, %s", attn_ctx_backend_name(ctx),
           dtype_name());
  if (tc_check(&P, &out, 1, tag)) check_exact(&P, &out, seen, 1);
  int64_t empties = 0;
  for (int64_t i = 0; i < P.Sq; i++) {
    int any = 0;
    for (int64_t j = 0; j < P.Skv && !any; j++) any = vis(&P, i, j);
    empties += !any;
  }
  TU_CHECK(!(expect & EXPECT_EMPTY_ROWS) || empties > 0, "case %s has no empty rows", c.name);
  TU_CHECK(!(expect & EXPECT_UNSEEN_KEYS) || planted > 0, "case %s has no unseen keys", c.name);
  free(seen);
  tc_out_free(&out);
  tc_free(&P);
}

/* Keys masked for some queries of a tile but visible to others: hot keys get k[0] = 1e30,
 * every other key k[0] = 0; queries that see a hot key get q[0] = 0 (finite scores), the
 * others q[0] = 1e10, so q.k overflows to +inf exactly where the mask must win. */
static void run_hot(tc_case c, int nhot) {
  if (dtype == ATTN_F16) return; /* 1e30 and 1e10 are beyond f16 */
  c.seed = next_seed++;
  c.dtype = dtype;
  c.bwd = 1;
  tc_prob P;
  tc_out out;
  tc_init(&P, &c);
  tu_rng r = tu_rng_make(c.seed);
  int64_t hot[3];
  for (int t = 0; t < 3; t++) hot[t] = tu_randint(&r, 0, P.Skv - 1);
  for (int t = nhot; t < 3; t++) hot[t] = hot[0];
  for (int64_t j = 0; j < P.Skv; j++) {
    int is_hot = j == hot[0] || j == hot[1] || j == hot[2];
    for (int64_t b = 0; b < P.B; b++)
      for (int64_t h = 0; h < P.Hkv; h++) krow(&P, b, j, h)[0] = is_hot ? 1e30f : 0.0f;
  }
  int64_t blind = 0;
  for (int64_t i = 0; i < P.Sq; i++) {
    int sees = 0;
    for (int t = 0; t < 3; t++) sees |= vis(&P, i, hot[t]);
    blind += !sees;
    for (int64_t b = 0; b < P.B; b++)
      for (int64_t h = 0; h < P.Hq; h++) qrow(&P, b, i, h)[0] = sees ? 0.0f : 1e10f;
  }
  tc_sync(&P);
  tc_lib(ctx, &P, &out, 1);
  char tag[64];
  snprintf(tag, sizeof tag, "masked +inf scores, %s, %s", attn_ctx_backend_name(ctx),
           dtype_name());
  tc_check(&P, &out, 1, tag);
  TU_CHECK(blind > 0, "case %s: no query is blind to the hot keys", c.name);
  tc_out_free(&out);
  tc_free(&P);
}

/* Integer q, k with scale 1: scores up to ±1e4, exact in fp32 unless ALiBi adds fractions
 * (then fp32 itself cannot hold a score of ~1e4 closer than ulp(1e4) ~ 1e-3, and O may
 * move by that much relative). Gradients cancel to ~0 in saturated rows; their terms
 * dS*k reach |k| = 30, so they get an absolute tolerance on that scale. */
static void run_large(tc_case c, int lo_q, int hi_q, int lo_k, int hi_k) {
  if (dtype != ATTN_F32) return; /* its tolerances are float32's */
  c.seed = next_seed++;
  c.bwd = 1;
  c.scale = 1.0f;
  tc_prob P;
  tc_out out;
  tc_init(&P, &c);
  tu_rng r = tu_rng_make(c.seed);
  for (int64_t x = 0; x < tc_n_q(&P); x++) P.q[x] = (float)tu_randint(&r, lo_q, hi_q);
  for (int64_t x = 0; x < tc_n_k(&P); x++) P.k[x] = (float)tu_randint(&r, lo_k, hi_k);
  tc_sync(&P);
  double maxs = 0; /* max |q.k| of head 0, batch 0 */
  for (int64_t i = 0; i < P.Sq; i++)
    for (int64_t j = 0; j < P.Skv; j++) {
      double s = 0;
      for (int64_t d = 0; d < P.Dqk; d++) s += (double)qrow(&P, 0, i, 0)[d] * krow(&P, 0, j, 0)[d];
      maxs = fmax(maxs, fabs(s));
    }
  TU_CHECK(maxs > 8000, "large-logit case %s: max |score| only %g", c.name, maxs);
  tc_lib(ctx, &P, &out, 1);
  tc_ref(&P, 1);
  /* A float32 kernel that works in log2 units rounds s*log2(e) (and ALiBi makes scores
   * fractional): exponents of magnitude ~maxs carry an absolute error of a few
   * 2^-24 * maxs, and so P (hence O) that much relatively. The backward recomputes P from
   * the float32 LSE, itself of magnitude ~maxs, with the same kind of error. */
  double rtol = TC_FWD_RTOL + 4.0 * 0x1p-24 * maxs;
  double brtol = TC_BWD_RTOL + 8.0 * 0x1p-24 * maxs, gatol = 1e-6 * 50 * 4;
  int before = tu_failures;
  int64_t do4[4] = {P.B, P.Sq, P.Hq, P.Dv};
  tu_compare("large-logit O", out.o, P.ro, tc_n_o(&P), do4, rtol, 1e-6);
  tu_compare("large-logit LSE", out.lse, P.rlse, tc_n_lse(&P), NULL, TC_FWD_RTOL, 1e-6);
  tu_compare("large-logit dQ", out.dq, P.rdq, tc_n_q(&P), NULL, brtol, gatol);
  tu_compare("large-logit dK", out.dk, P.rdk, tc_n_k(&P), NULL, brtol, gatol);
  tu_compare("large-logit dV", out.dv, P.rdv, tc_n_v(&P), NULL, brtol, 1e-6);
  if (c.sinks) tu_compare("large-logit dsinks", out.ds, P.rds, P.Hq, NULL, brtol, 1e-6);
  TU_CHECK(out.fwd_status == ATTN_OK && out.bwd_status == ATTN_OK, "status %s",
           attn_last_error());
  if (tu_failures != before) {
    char desc[512];
    tc_describe(&c, desc, sizeof desc);
    fprintf(stderr, "  ^ in %s, %s\n", desc, attn_ctx_backend_name(ctx));
  }
  tc_out_free(&out);
  tc_free(&P);
}

static void run_all(void) {
  static const int32_t lq[] = {50, 70, 0, 30}, lkv[] = {0, 100, 40, 90};
  static const int32_t lq2[] = {64, 64, 65}, lkv2[] = {60, 70, 64};
  /* 4 query blocks x 5 key blocks: query block 1 sees nothing, key block 3 is never seen. */
  static const uint8_t holes[] = {1, 1, 0, 0, 1, /**/ 0, 0, 0, 0, 0, /**/ 0, 1, 1, 0, 0,
                                  /**/ 1, 0, 0, 0, 1};
  const int E = EXPECT_EMPTY_ROWS, U = EXPECT_UNSEEN_KEYS;
  for (int sinks = 0; sinks < 2; sinks++) {
    run_empty((tc_case){.name = "causal Sq>Skv", .B = 2, .Sq = 200, .Skv = 70, .Hq = 2,
                        .Hkv = 1, .Dqk = 32, .causal = 1, .sinks = sinks}, E);
    run_empty((tc_case){.name = "window off the end", .B = 1, .Sq = 300, .Skv = 100, .Hq = 3,
                        .Hkv = 3, .Dqk = 16, .window = 1, .wl = 10, .wr = 5, .sinks = sinks,
                        .alibi = 1}, E);
    run_empty((tc_case){.name = "narrow window", .B = 1, .Sq = 150, .Skv = 400, .Hq = 2,
                        .Hkv = 1, .Dqk = 64, .window = 1, .wl = 3, .wr = 0, .sinks = sinks,
                        .softcap = 5.0f}, U);
    run_empty((tc_case){.name = "window both sides", .B = 1, .Sq = 500, .Skv = 260, .Hq = 1,
                        .Hkv = 1, .Dqk = 16, .window = 1, .wl = 0, .wr = 2, .causal = 1,
                        .sinks = sinks}, E);
    run_empty((tc_case){.name = "varlen empty kv", .Hq = 2, .Hkv = 1, .Dqk = 24, .nseq = 4,
                        .lq = lq, .lkv = lkv, .causal = 1, .sinks = sinks}, E | U);
    run_empty((tc_case){.name = "sparse blocks", .B = 1, .Sq = 256, .Skv = 300, .Hq = 2,
                        .Hkv = 2, .Dqk = 32, .bq = 64, .bk = 64, .mask_bits = holes,
                        .sinks = sinks}, E | U);
    run_empty((tc_case){.name = "sparse blocks unaligned", .B = 2, .Sq = 100, .Skv = 150,
                        .Hq = 1, .Hkv = 1, .Dqk = 8, .bq = 25, .bk = 30, .mask_bits = holes,
                        .causal = 1, .sinks = sinks}, E | U);
    run_empty((tc_case){.name = "short mask", .B = 1, .Sq = 130, .Skv = 200, .Hq = 1,
                        .Hkv = 1, .Dqk = 8, .bq = 64, .bk = 64, .mask_short = 1,
                        .sinks = sinks}, E | U);
  }
  run_hot((tc_case){.name = "hot causal", .B = 1, .Sq = 256, .Skv = 256, .Hq = 2, .Hkv = 1,
                    .Dqk = 32, .causal = 1}, 3);
  run_hot((tc_case){.name = "hot window", .B = 2, .Sq = 200, .Skv = 230, .Hq = 2, .Hkv = 2,
                    .Dqk = 64, .window = 1, .wl = 40, .wr = 17, .sinks = 1}, 3);
  run_hot((tc_case){.name = "hot window softcap", .B = 1, .Sq = 190, .Skv = 190, .Hq = 1,
                    .Hkv = 1, .Dqk = 128, .window = 1, .wl = 20, .wr = 20, .softcap = 10.0f}, 2);
  run_hot((tc_case){.name = "hot varlen", .Hq = 2, .Hkv = 1, .Dqk = 16, .nseq = 3, .lq = lq2,
                    .lkv = lkv2, .alibi = 1}, 1);
  run_hot((tc_case){.name = "hot varlen causal", .Hq = 2, .Hkv = 1, .Dqk = 7, .nseq = 3,
                    .lq = lq2, .lkv = lkv2, .causal = 1}, 1);
  run_hot((tc_case){.name = "hot blocks", .B = 1, .Sq = 200, .Skv = 200, .Hq = 1, .Hkv = 1,
                    .Dqk = 16, .bq = 16, .bk = 24}, 1);
  /* Large logits: mixed signs; all very negative (a sink then dominates); causal+ALiBi. */
  run_large((tc_case){.name = "large", .B = 1, .Sq = 100, .Skv = 130, .Hq = 2, .Hkv = 1,
                      .Dqk = 32}, -50, 50, -50, 50);
  run_large((tc_case){.name = "large negative sinks", .B = 1, .Sq = 70, .Skv = 90, .Hq = 2,
                      .Hkv = 2, .Dqk = 16, .sinks = 1}, 20, 30, -30, -20);
  run_large((tc_case){.name = "large negative", .B = 1, .Sq = 70, .Skv = 90, .Hq = 1,
                      .Hkv = 1, .Dqk = 16, .causal = 1}, 20, 30, -30, -20);
  run_large((tc_case){.name = "large causal alibi", .B = 1, .Sq = 129, .Skv = 129, .Hq = 1,
                      .Hkv = 1, .Dqk = 32, .causal = 1, .alibi = 1}, -50, 50, -50, 50);
}

int main(void) {
  for (int scalar = 0; scalar < 2; scalar++) { /* the SIMD path, then the scalar path */
    ctx = tc_ctx(scalar, 2);
    for (dtype = ATTN_F32; dtype <= ATTN_F16; dtype++) {
      printf("test_empty on %s, %s\n", attn_ctx_backend_name(ctx), dtype_name());
      next_seed = 500;
      run_all();
    }
    attn_ctx_destroy(ctx);
  }
  return tu_finish("test_empty");
}
