/* test_bf16_tiles.c — the CPU bf16 forward and backward on bf16 product units (cfg.cpu_amx:
 * AMX tiles, or AVX512-BF16 dot products): products in
 * bf16 with float32 accumulation, P and dS rounded to bf16, so they are judged as the GPU
 * kernels are, by FlashAttention's rule against a naive bf16 kernel (tests/naive_ref.c):
 * O, LSE, dQ, dK and dV error vs the float64 oracle at most 2x the naive kernel's. Each
 * case also runs with the tiles off: the two must differ somewhere (the tiles ran) unless the
 * case never reaches them (row kernels, odd head dims), and a second bf16-tile run must repeat
 * the bits. Every mask flag on and off, shapes around the tiles, head dims, packed GQA
 * tiles, NaN/Inf in unseen K/V (forward and backward), the block API.
 * Exit 77 (skipped) when the CPU lacks the unit. Usage: test_bf16_tiles UNIT_PART, UNIT amx
 * or dp (AVX512-BF16), PART flags|shapes|unseen|block. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "naive_ref.h"
#include "test_case.h"

static attn_ctx_t unit_ctx, exact;
static int dim_align = 32; /* the head dims the unit under test takes: AMX 32, AVX512-BF16 16 */
static uint64_t next_seed = 31000;

static int64_t bits_differ(const float *a, const float *b, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) bad += memcmp(&a[i], &b[i], 4) != 0;
  return bad;
}

static float scale_of(const tc_prob *P) {
  return P->spec.scale > 0 ? P->spec.scale : 1.0f / sqrtf((float)P->Dqk);
}

/* The naive bf16 kernel on P's inputs and mask. */
static naive_out naive_of(const tc_prob *P, int bwd) {
  uint8_t *vis = tu_alloc((size_t)(P->Sq * P->Skv));
  for (int64_t i = 0; i < P->Sq; i++)
    for (int64_t j = 0; j < P->Skv; j++) vis[i * P->Skv + j] = (uint8_t)attn_ref_visible(&P->rp, i, j);
  const naive_problem np = {P->B, P->Sq, P->Skv, P->Hq, P->Hkv, P->Dqk, P->Dv, P->c.dtype,
                            P->q, P->k, P->v, P->dout, vis, scale_of(P), P->spec.softcap,
                            P->spec.sinks, P->spec.alibi_slopes, P->c.nseq, P->cu_q, P->cu_kv};
  naive_out n;
  naive_run(&np, bwd, &n);
  free(vis);
  return n;
}

/* O and LSE of out by the 2x rule; 1 on pass. */
static int judge(tc_prob *P, const tc_out *out, const char *desc) {
  const int before = tu_failures;
  if (!P->ro) tc_ref(P, 0);
  naive_out n = naive_of(P, 0);
  const int64_t od[4] = {P->B, P->Sq, P->Hq, P->Dv}, ld[4] = {1, P->B, P->Hq, P->Sq};
  naive_judge("O", out->o, P->ro, n.o, tc_n_o(P), od, 0.0);
  naive_judge("LSE", out->lse, P->rlse, n.lse, tc_n_lse(P), ld, 0.0);
  free(n.o);
  free(n.lse);
  if (tu_failures != before) fprintf(stderr, "  in %s\n", desc);
  return tu_failures == before;
}

/* The random part's floor under the 2x rule, as a fraction of max|ref|: its problems may
 * be tiny (2 keys a row), where each gradient is a term or two and the naive kernel's
 * error is as much luck as its rounding: one bf16 unit (2^-8) of the largest. */
static double grad_floor = 0.0;

static double floor_of(const double *ref, int64_t n) { return grad_floor * tu_max_abs(ref, n); }

/* dQ, dK, dV of out by the 2x rule (plus float32 noise where gradients cancel), and every
 * gradient (dsinks too) by the bf16 tolerances of the CPU tests; 1 on pass. */
static int judge_grads(tc_prob *P, const tc_out *out, const char *desc) {
  const int before = tu_failures;
  if (!tc_check_grads(P, out, "bf16-tile backward")) return 0;
  naive_out n = naive_of(P, 1);
  const double noise = naive_grad_noise(P->Sq, P->Skv, P->Dqk, P->Dv, scale_of(P), P->c.amp);
  const int64_t q4[4] = {P->B, P->Sq, P->Hq, P->Dqk}, k4[4] = {P->B, P->Skv, P->Hkv, P->Dqk};
  const int64_t v4[4] = {P->B, P->Skv, P->Hkv, P->Dv};
  naive_judge("dQ", out->dq, P->rdq, n.dq, tc_n_q(P), q4, noise + floor_of(P->rdq, tc_n_q(P)));
  naive_judge("dK", out->dk, P->rdk, n.dk, tc_n_k(P), k4, noise + floor_of(P->rdk, tc_n_k(P)));
  naive_judge("dV", out->dv, P->rdv, n.dv, tc_n_v(P), v4, noise + floor_of(P->rdv, tc_n_v(P)));
  free(n.o), free(n.lse), free(n.dq), free(n.dk), free(n.dv), free(n.ds);
  if (tu_failures != before) fprintf(stderr, "  in %s (backward)\n", desc);
  return tu_failures == before;
}

static int64_t grads_differ(const tc_prob *P, const tc_out *a, const tc_out *b) {
  return bits_differ(a->dq, b->dq, tc_n_q(P)) + bits_differ(a->dk, b->dk, tc_n_k(P)) +
         bits_differ(a->dv, b->dv, tc_n_v(P));
}

/* The bf16-tile backward by the 2x rule, repeatable, and (ran_check) not the exact path's
 * bits where the head dims take the tiles (every bf16 tile does, short ones too). */
static void run_bwd(tc_prob *P, const char *desc, int ran_check) {
  tc_out b, again, e;
  tc_lib(unit_ctx, P, &b, 1);
  if (judge_grads(P, &b, desc)) {
    tc_lib(unit_ctx, P, &again, 1);
    const int64_t rep = grads_differ(P, &b, &again);
    TU_CHECK(rep == 0, "a second bf16-tile backward differs in %lld elements in %s", (long long)rep, desc);
    tc_out_free(&again);
    tc_lib(exact, P, &e, 1);
    const int tiles = ran_check && P->Dqk % dim_align == 0 && P->Dv % dim_align == 0;
    const int64_t diff = grads_differ(P, &b, &e);
    TU_CHECK(!tiles || diff > 0, "bf16-tile and exact gradients are bitwise equal in %s: the tiles "
             "did not run", desc);
    tc_out_free(&e);
  }
  tc_out_free(&b);
}

/* The bf16-tile forward by the 2x rule, repeatable, and not the exact path's bits where the case
 * has tiles of more than 16 lanes (tiles: 0 when it may take the row kernels only; -1: a
 * random case, which may be degenerate, e.g. every key masked or one visible key, whose
 * gradients are exact both ways: no check that the tiles ran, forward or backward); with
 * c.bwd, the backward (run_bwd). */
static void run(tc_case c, int tiles) {
  c.seed = next_seed++;
  char desc[512];
  tc_describe(&c, desc, sizeof desc);
  tc_prob P;
  tc_out a, again, e;
  tc_init(&P, &c);
  tc_lib(unit_ctx, &P, &a, 0);
  TU_CHECK(a.fwd_status == ATTN_OK, "bf16-tile forward: %s in %s", attn_last_error(), desc);
  if (a.fwd_status == ATTN_OK && judge(&P, &a, desc)) {
    tc_lib(unit_ctx, &P, &again, 0);
    int64_t rep = bits_differ(a.o, again.o, tc_n_o(&P)) + bits_differ(a.lse, again.lse, tc_n_lse(&P));
    TU_CHECK(rep == 0, "a second bf16-tile run differs in %lld elements in %s", (long long)rep, desc);
    tc_out_free(&again);
    tc_lib(exact, &P, &e, 0);
    int64_t diff = bits_differ(a.o, e.o, tc_n_o(&P)) + bits_differ(a.lse, e.lse, tc_n_lse(&P));
    TU_CHECK(tiles <= 0 || diff > 0, "bf16-tile and exact results are bitwise equal in %s: the tiles "
             "did not run", desc);
    tc_out_free(&e);
    if (c.bwd) run_bwd(&P, desc, tiles >= 0);
  }
  tc_out_free(&a);
  tc_free(&P);
}

/* All 128 combinations of causal, window (+BHSD), softcap, sinks, ALiBi, varlen and block
 * mask (tc_flags_case) on two shapes: GQA with Dqk != Dv, and MQA over tile edges. */
static void flags(void) {
  for (int m = 0; m < 128; m++) {
    tc_case s1 = {.B = 2, .Sq = 203, .Skv = 113, .Hq = 4, .Hkv = 2, .Dqk = 128, .Dv = 64,
                  .bwd = 1, .dtype = ATTN_BF16};
    run(tc_flags_case(s1, m, (const int32_t[]){100, 3, 100}, (const int32_t[]){50, 60, 3}), 1);
    tc_case s2 = {.B = 1, .Sq = 129, .Skv = 257, .Hq = 3, .Hkv = 1, .Dqk = 64, .Dv = 64,
                  .bwd = (m % 2) == 0, .dtype = ATTN_BF16};
    run(tc_flags_case(s2, m, (const int32_t[]){40, 17, 72}, (const int32_t[]){70, 33, 154}), 1);
  }
}

/* Lengths around the 128 x 128 tiles and the 32-key / 32-lane tile blocks, Sq != Skv both
 * ways, the head dims the tiles take (64, 128, 256, 192x128; 80 and 48 on the dot products
 * only) and two they do not (odd: the float32 arithmetic), short tiles packing GQA heads into more than 16 lanes, wide
 * values. */
static void shapes(void) {
  static const int64_t sizes[][2] = {{127, 129}, {129, 127}, {128, 128}, {33, 31}, {17, 300},
                                     {255, 257}, {48, 16},   {2, 130},   {600, 620}};
  static const int dims[][2] = {{64, 0}, {128, 0}, {256, 0}, {192, 128}, {128, 64}, {32, 96}};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    for (int causal = 0; causal < 2; causal++) {
      const int *d = dims[(i * 2 + (size_t)causal) % (sizeof dims / sizeof dims[0])];
      run((tc_case){.name = "shape", .B = 2, .Sq = sizes[i][0], .Skv = sizes[i][1], .Hq = 4,
                    .Hkv = causal ? 1 : 2, .Dqk = d[0], .Dv = d[1], .causal = causal,
                    .bhsd = (int)(i & 1), .bwd = 1, .dtype = ATTN_BF16},
          sizes[i][0] * (causal ? 4 : 2) > 16);
    }
  /* decode-like: 8 rows x a group of 4 = 32 lanes (tiles); 4 x 4 = 16 (row kernels) */
  run((tc_case){.name = "packed", .B = 2, .Sq = 8, .Skv = 1000, .Hq = 8, .Hkv = 2, .Dqk = 128,
                .causal = 1, .bwd = 1, .dtype = ATTN_BF16}, 1);
  run((tc_case){.name = "rows", .B = 1, .Sq = 4, .Skv = 700, .Hq = 8, .Hkv = 2, .Dqk = 128,
                .bwd = 1, .dtype = ATTN_BF16}, 0);
  run((tc_case){.name = "odd dims", .B = 1, .Sq = 150, .Skv = 170, .Hq = 2, .Hkv = 1,
                .Dqk = 40, .Dv = 24, .bwd = 1, .dtype = ATTN_BF16}, 0);
  /* multiples of 16, not of 32: the dot products' tiles (a half pair block at the end of
   * each packed row), AMX's float32 arithmetic */
  run((tc_case){.name = "dims of 16", .B = 2, .Sq = 150, .Skv = 170, .Hq = 4, .Hkv = 2,
                .Dqk = 80, .Dv = 48, .causal = 1, .bwd = 1, .dtype = ATTN_BF16}, dim_align == 16);
  run((tc_case){.name = "dims of 16", .B = 1, .Sq = 200, .Skv = 90, .Hq = 2, .Hkv = 1,
                .Dqk = 48, .Dv = 80, .bhsd = 1, .softcap = 20.0f, .bwd = 1, .dtype = ATTN_BF16},
      dim_align == 16);
  run((tc_case){.name = "wide values", .B = 1, .Sq = 70, .Skv = 90, .Hq = 1, .Hkv = 1,
                .Dqk = 64, .scale = 0.3f, .amp = 4.0, .bwd = 1, .dtype = ATTN_BF16}, 1);
  run((tc_case){.name = "big", .B = 1, .Sq = 1000, .Skv = 1030, .Hq = 2, .Hkv = 1, .Dqk = 128,
                .causal = 1, .sinks = 1, .bwd = 1, .dtype = ATTN_BF16}, 1);
}

/* NaN and Inf in K/V rows that no query sees, inside the key tiles that run: a block mask
 * (16 x 16 blocks) whose key-block columns 3, 9 and 17 are off for every row. Outputs and
 * gradients stay finite and match; the V tiles that hold them take the safe P·V, the K
 * tiles the backward's safe dS·K. */
static void unseen(void) {
  const float bad[4] = {NAN, INFINITY, -INFINITY, NAN};
  enum { BQ = 16, BK = 16, NBQ = (60 + BQ - 1) / BQ, NBK = (400 + BK - 1) / BK };
  static uint8_t bits[NBQ * NBK];
  for (int r = 0; r < NBQ; r++)
    for (int cb = 0; cb < NBK; cb++) bits[r * NBK + cb] = cb != 3 && cb != 9 && cb != 17;
  for (int t = 0; t < 4; t++) {
    tc_case c = {.name = "unseen", .B = 1, .Sq = 60, .Skv = 400, .Hq = 4, .Hkv = 2, .Dqk = 64,
                 .causal = t & 1, .bq = BQ, .bk = BK, .mask_bits = bits, .dtype = ATTN_BF16,
                 .seed = next_seed++};
    tc_prob P;
    tc_init(&P, &c);
    int64_t planted = 0;
    for (int64_t j = 0; j < P.Skv; j++) {
      const int64_t cb = j / BK;
      if (cb != 3 && cb != 9 && cb != 17) continue;
      for (int h = 0; h < P.Hkv; h++) {
        if (t & 2) P.k[(j * P.Hkv + h) * P.Dqk + (j % P.Dqk)] = bad[t];
        P.v[(j * P.Hkv + h) * P.Dv + (j % P.Dv)] = bad[(t + 1) % 4];
        planted++;
      }
    }
    tc_sync(&P);
    char desc[512];
    tc_describe(&c, desc, sizeof desc);
    TU_CHECK(planted == 3 * BK * P.Hkv, "planted %lld values in %s", (long long)planted, desc);
    tc_out a;
    tc_lib(unit_ctx, &P, &a, 0);
    TU_CHECK(a.fwd_status == ATTN_OK, "bf16-tile forward: %s in %s", attn_last_error(), desc);
    if (a.fwd_status == ATTN_OK && judge(&P, &a, desc)) run_bwd(&P, desc, 1);
    tc_out_free(&a);
    tc_free(&P);
  }
}

/* The block API: keys in 3 blocks folded into a float32 state on the bf16 tiles, then
 * finalize; against the oracle by the 2x rule. */
static void block(void) {
  for (int causal = 0; causal < 2; causal++) {
    tc_case c = {.name = "block", .B = 2, .Sq = 150, .Skv = 300, .Hq = 4, .Hkv = 2, .Dqk = 64,
                 .Dv = 32, .causal = causal, .sinks = 1, .alibi = causal, .bhsd = causal,
                 .dtype = ATTN_BF16, .seed = next_seed++};
    char desc[512];
    tc_describe(&c, desc, sizeof desc);
    tc_prob P;
    tc_init(&P, &c);
    static const int64_t cuts[] = {0, 70, 171, 300};
    attn_state st = tc_fwd_blocks(unit_ctx, &P, cuts, 3);
    tc_out out = {0};
    out.o = tu_falloc(tc_n_o(&P));
    out.lse = tu_falloc(tc_n_lse(&P));
    uint16_t *ob = tu_alloc((size_t)tc_n_o(&P) * 2);
    memset(ob, 0xFF, (size_t)tc_n_o(&P) * 2);
    attn_tensor to = attn_tensor_contig(ob, ATTN_BF16, ATTN_DEVICE_HOST, P.B, P.Sq, P.Hq, P.Dv);
    TU_CHECK(attn_state_finalize(unit_ctx, &P.spec, &st, &to, out.lse) == ATTN_OK, "finalize: %s",
             attn_last_error());
    for (int64_t i = 0; i < tc_n_o(&P); i++) out.o[i] = tu_from_bits(ob[i], ATTN_BF16);
    judge(&P, &out, desc);
    free(ob);
    free(out.o);
    free(out.lse);
    free(st.m);
    free(st.l);
    free(st.acc);
    tc_free(&P);
  }
}

/* Random bf16 problems (tc_random_case): forward and, one time in three, backward, each by
 * the 2x rule (gradients with grad_floor under it). ATTN_TEST_SEED picks another set, ATTN_TEST_COUNT its size (default 120). */
static void random_cases(void) {
  int total;
  tu_rng r = tc_random_rng(&total, 120);
  int32_t lq[4], lkv[4];
  grad_floor = 0x1p-8;
  for (int n = 0; n < total; n++) {
    tc_case c = tc_random_case(&r, lq, lkv);
    c.dtype = ATTN_BF16;
    run(c, -1);
  }
  grad_floor = 0.0;
}

int main(int argc, char **argv) {
  static const tu_part parts[] = {{"flags", flags},   {"shapes", shapes}, {"unseen", unseen},
                                  {"block", block},   {"random", random_cases}};
  const char *arg = argc > 1 ? argv[1] : "dp_flags";
  const int unit = !strncmp(arg, "amx_", 4) ? 1 : !strncmp(arg, "dp_", 3) ? 2 : 0;
  if (!unit) {
    fprintf(stderr, "test_bf16_tiles: %s: want amx_PART or dp_PART\n", arg);
    return 2;
  }
  unit_ctx = tc_ctx_amx(0, 2, unit);
  if (!unit_ctx) {
    printf("SKIP: no %s on this CPU (or the kernel does not grant it)\n",
           unit == 1 ? "AMX-BF16" : "AVX512-BF16");
    return 77;
  }
  dim_align = unit == 1 ? 32 : 16;
  exact = tc_ctx_amx(0, 2, -1);
  char *av[2] = {argv[0], (char *)strchr(arg, '_') + 1};
  int rc = tu_run_parts(unit == 1 ? "test_bf16_tiles amx" : "test_bf16_tiles avx512-bf16", 2, av,
                        parts, (int)(sizeof parts / sizeof parts[0]));
  attn_ctx_destroy(unit_ctx);
  attn_ctx_destroy(exact);
  return rc;
}
