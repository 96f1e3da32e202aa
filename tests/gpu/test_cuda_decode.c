/* test_cuda_decode.c — the mma.sync forward's decode forms (packed GQA and split-KV,
 * kernels/cuda/dispatch.c) vs the float64 oracle and against each other. Every case runs
 * in four forms — plain, packed, split, packed and split — on the same inputs: each is
 * judged by the 2x same-precision rule, and checked to have run as asked
 * (attn_cuda_last_fwd_plan); packed equals unpacked bitwise where both walk the same key
 * tiles (the same arithmetic per row), split agrees with unsplit within the rule's scale.
 * Shapes: decode steps (Sq 1-4) with GQA groups 2-16, MQA and a group of 6, multi-position
 * packing under causal, varlen decode with empty caches and empty sequences, every mask
 * flag, block masks, BHSD views, head dims 64-256; then the block API (splits fold into a
 * carried state), NaN/Inf in unseen keys, the backward from a packed / split forward's
 * LSE, and the automatic plan. Exits 77 without a device; built on the GPU and on the
 * emulator (smaller cases). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_case.h"
#include "traits.h"

static uint64_t next_seed = 1;
static int E; /* emulated: fewer, smaller cases */

enum { PLAIN, PACKED, SPLIT, PACKED_SPLIT, NFORMS };
static const char *form_name[NFORMS] = {"plain", "packed", "split", "packed+split"};

/* Forces form f (splits: the split forms' count). */
static void set_form(int f, int splits) {
  attn_cuda_set_decode(f == PACKED || f == PACKED_SPLIT ? 2 : 0,
                       f == SPLIT || f == PACKED_SPLIT ? splits : 1);
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* What form f must run with on problem pb: the whole group packed (its largest divisor up
 * to a tile's rows), and the splits clamped to the key tiles (per sequence, on average). */
static void expected_plan(const attn_cuda_problem *pb, int f, int splits, int *pack, int *nsplit) {
  const int64_t group = pb->Hq / pb->Hkv;
  *pack = 1;
  if ((f == PACKED || f == PACKED_SPLIT) && group > 1) {
    *pack = (int)(group < FA_FWD_BM ? group : FA_FWD_BM);
    while (group % *pack) (*pack)--;
  }
  const int64_t kv = pb->num_seqs ? ceil_div(pb->skv, pb->num_seqs) : pb->skv;
  const int64_t ktiles = ceil_div(kv, FA_FWD_BN(pb->Dqk, pb->Dv));
  const int64_t want = f == SPLIT || f == PACKED_SPLIT ? splits : 1;
  *nsplit = (int)(want < ktiles ? want : ktiles);
}

static void expect_plan(const attn_cuda_problem *pb, int f, int splits, const gc_case *c) {
  int pack, nsplit, want_pack, want_split;
  attn_cuda_last_fwd_plan(&pack, &nsplit);
  expected_plan(pb, f, splits, &want_pack, &want_split);
  TU_CHECK(pack == want_pack && nsplit == want_split,
           "%s: %s ran with pack %d, %d splits; wanted %d, %d", c->name, form_name[f], pack,
           nsplit, want_pack, want_split);
}

/* Largest |a - b| over n floats (equal infinities count 0). */
static double max_diff(const float *a, const float *b, int64_t n) {
  double d = 0;
  for (int64_t i = 0; i < n; i++)
    if (a[i] != b[i]) d = fmax(d, fabs((double)a[i] - b[i]));
  return d;
}

static int64_t count_unequal(const float *a, const float *b, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) bad += !(a[i] == b[i]);
  return bad;
}

/* Split vs unsplit O and LSE: within twice the naive same-precision error (the 2x rule's
 * scale) plus 1e-4 of the largest reference value, as chained blocks vs one shot. */
static void expect_close(gc_prob *P, const gc_out *a, const gc_out *b, const char *what) {
  const int64_t n = gc_n_o(P), nl = gc_n_lse(P);
  double naive_o = 0, naive_l = 0, max_o = 0, max_l = 0;
  for (int64_t x = 0; x < n; x++) {
    naive_o = fmax(naive_o, fabs((double)P->no[x] - P->ro[x]));
    max_o = fmax(max_o, fabs(P->ro[x]));
  }
  for (int64_t x = 0; x < nl; x++)
    if (!isinf(P->rlse[x])) {
      naive_l = fmax(naive_l, fabs((double)P->nlse[x] - P->rlse[x]));
      max_l = fmax(max_l, fabs(P->rlse[x]));
    }
  const double eo = max_diff(a->o, b->o, n), el = max_diff(a->lse, b->lse, nl);
  TU_CHECK(eo <= 2 * naive_o + 1e-4 * max_o + 1e-6 && el <= 2 * naive_l + 1e-4 * max_l + 1e-6,
           "%s in %s: O %.3e (naive %.3e), LSE %.3e (naive %.3e)", what, P->c.name, eo, naive_o,
           el, naive_l);
}

/* 1 when every query position of a sequence falls in one CTA both packed and unpacked, so
 * both split the same key range at the same tiles. */
static int same_ranges(const gc_prob *P, int pack) {
  int64_t most = P->Sq;
  if (P->c.nseq) {
    most = 0;
    for (int s = 0; s < P->c.nseq; s++) most = P->c.lq[s] > most ? P->c.lq[s] : most;
  }
  return most <= FA_FWD_BM / pack;
}

/* The four forms of case c (splits for the split ones); the backward after the packed
 * split forward when bwd is set. */
static void run_forms(gc_case c, int splits, int bwd) {
  if (!gc_have_dims(&c)) return;
  c.seed = next_seed++;
  gc_prob P;
  gc_out out[NFORMS];
  memset(out, 0, sizeof out);
  set_form(PACKED_SPLIT, splits); /* the largest workspace: tables for the pack, partials */
  gc_init(&P, &c);
  gc_ref(&P, 0);
  for (int f = 0; f < NFORMS; f++) {
    set_form(f, splits);
    gc_expect_ok(gc_fwd(&P, &out[f]), "attn_cuda_fwd", &c);
    expect_plan(&P.pb, f, splits, &c);
    gc_check(&P, &out[f], 0, form_name[f]);
  }
  const int64_t no = gc_n_o(&P), nl = gc_n_lse(&P);
  int pack, nsplit;
  expected_plan(&P.pb, PACKED, splits, &pack, &nsplit);
  for (int f = PLAIN; f <= SPLIT; f += SPLIT) {
    if (f == SPLIT && !same_ranges(&P, pack)) continue;
    const int64_t bad = count_unequal(out[f].o, out[f + 1].o, no) +
                        count_unequal(out[f].lse, out[f + 1].lse, nl);
    TU_CHECK(bad == 0, "%s: %s vs %s: %lld elements of O / LSE differ", c.name, form_name[f + 1],
             form_name[f], (long long)bad);
  }
  expect_close(&P, &out[SPLIT], &out[PLAIN], "split vs plain");
  expect_close(&P, &out[PACKED_SPLIT], &out[PACKED], "packed+split vs packed");
  if (bwd) {
    gc_out g = {0};
    set_form(PACKED_SPLIT, splits);
    gc_expect_ok(gc_fwd(&P, &g), "attn_cuda_fwd", &c);
    gc_expect_ok(gc_bwd(&P, &g, 0), "attn_cuda_bwd", &c);
    gc_check(&P, &g, 1, "backward from the packed+split forward");
    gc_out_free(&g);
  }
  for (int f = 0; f < NFORMS; f++) gc_out_free(&out[f]);
  gc_free(&P);
  attn_cuda_set_decode(-1, -1);
}

static void sweep_decode(void) {
  static const int32_t lq[] = {1, 1, 0, 1, 1}, lkv_emu[] = {300, 1, 50, 0, 200},
                       lkv[] = {1500, 1, 50, 0, 900};
  static const int32_t cq[] = {20, 5, 40}, ckv[] = {200, 5, 300};
  run_forms((gc_case){.name = "decode GQA 4", .B = 1, .Sq = 1, .Skv = E ? 700 : 4096, .Hq = 8,
                      .Hkv = 2, .D = 128, .dtype = ATTN_BF16}, 3, 1);
  run_forms((gc_case){.name = "decode MQA causal sinks", .B = 2, .Sq = 1, .Skv = E ? 300 : 2000,
                      .Hq = 16, .Hkv = 1, .D = 64, .causal = 1, .sinks = 1, .dtype = ATTN_F16},
            5, 0);
  run_forms((gc_case){.name = "speculative window alibi softcap BHSD", .B = 1, .Sq = 4,
                      .Skv = E ? 500 : 3000, .Hq = 8, .Hkv = 2, .D = 64, .causal = 1,
                      .window = 1, .wl = E ? 200 : 1000, .wr = -1, .alibi = 1, .softcap = 30.0f,
                      .bhsd = 1, .dtype = ATTN_BF16}, 4, 1);
  run_forms((gc_case){.name = "group 6 causal, several positions a CTA", .B = 1,
                      .Sq = E ? 50 : 300, .Skv = E ? 60 : 320, .Hq = 6, .Hkv = 1, .D = 64,
                      .causal = 1, .dtype = ATTN_F16}, 2, 0);
  run_forms((gc_case){.name = "varlen decode, empty caches", .Hq = 4, .Hkv = 1, .D = 128,
                      .nseq = 5, .lq = lq, .lkv = E ? lkv_emu : lkv, .causal = 1, .sinks = 1,
                      .dtype = ATTN_BF16}, 3, 0);
  run_forms((gc_case){.name = "varlen chunked prefill", .Hq = 8, .Hkv = 2, .D = 64, .nseq = 3,
                      .lq = cq, .lkv = ckv, .causal = 1, .alibi = 1, .dtype = ATTN_F16}, 3, 1);
  run_forms((gc_case){.name = "decode block mask", .B = 1, .Sq = 3, .Skv = E ? 400 : 2000,
                      .Hq = 4, .Hkv = 2, .D = 64, .bq = 2, .bk = 32, .dtype = ATTN_BF16}, 3, 0);
  if (E) return;
  run_forms((gc_case){.name = "decode 256", .B = 1, .Sq = 2, .Skv = 1500, .Hq = 4, .Hkv = 1,
                      .D = 256, .dtype = ATTN_BF16}, 3, 0);
  run_forms((gc_case){.name = "decode 192x128", .B = 2, .Sq = 1, .Skv = 1200, .Hq = 8,
                      .Hkv = 2, .D = 192, .Dv = 128, .causal = 1, .dtype = ATTN_F16}, 4, 0);
  run_forms((gc_case){.name = "decode 32K", .B = 1, .Sq = 1, .Skv = 32768, .Hq = 32, .Hkv = 8,
                      .D = 128, .dtype = ATTN_BF16}, 16, 0);
  run_forms((gc_case){.name = "decode MHA", .B = 4, .Sq = 1, .Skv = 5000, .Hq = 8, .Hkv = 8,
                      .D = 64, .sinks = 1, .dtype = ATTN_BF16}, 7, 0);
}

/* ---- the block API: key blocks folded into a carried state by split calls -------------- */
static void block_case(gc_case c, int splits) {
  if (!gc_have_dims(&c)) return;
  c.seed = next_seed++;
  set_form(PACKED_SPLIT, splits);
  gc_prob P;
  gc_out out = {0};
  gc_init(&P, &c);
  const int64_t n = P.B * P.Hq * P.Sq;
  float *buf = td_alloc((size_t)(n * (2 + P.Dv)) * 4);
  attn_state st = {buf, buf + n, buf + 2 * n, P.B, P.Hq, P.Sq, P.Dv};
  gc_expect_ok(attn_cuda_state_init(&st, NULL), "attn_cuda_state_init", &c);
  const int64_t ks[4] = {0, P.Skv / 3, P.Skv / 3 + 1 + P.Skv / 4, P.Skv};
  const int order[3] = {1, 2, 0};
  const size_t e = gc_elem_bytes(&P);
  int split_calls = 0;
  for (int x = 0; x < 3; x++) {
    const int64_t k0 = ks[order[x]], k1 = ks[order[x] + 1];
    if (k0 == k1) continue;
    attn_cuda_problem b = P.pb;
    b.skv = k1 - k0;
    b.k_pos0 = k0;
    b.k.p = (char *)b.k.p + k0 * b.k.ss * e;
    b.v.p = (char *)b.v.p + k0 * b.v.ss * e;
    gc_expect_ok(attn_cuda_fwd_block(&b, &st, P.d_ws, P.ws_bytes, NULL), "attn_cuda_fwd_block", &c);
    int pack, nsplit;
    attn_cuda_last_fwd_plan(&pack, &nsplit);
    split_calls += nsplit > 1;
  }
  TU_CHECK(split_calls > 0, "%s: no block call split its keys", c.name);
  gc_expect_ok(gc_finalize(&P, &st, &out), "attn_cuda_finalize", &c);
  gc_check(&P, &out, 0, "split fwd_block x 3 + finalize");
  gc_expect_empty(&P, &out, &c, 1, gc_empty_rows(&P), 0, 0);
  td_free(buf);
  gc_out_free(&out);
  gc_free(&P);
  attn_cuda_set_decode(-1, -1);
}

static void check_block(void) {
  static const int32_t lq[] = {1, 2, 1}, lkv[] = {300, 0, 200};
  block_case((gc_case){.name = "block decode", .B = 1, .Sq = 2, .Skv = E ? 600 : 3000, .Hq = 8,
                       .Hkv = 2, .D = 64, .causal = 1, .sinks = 1, .dtype = ATTN_F16}, 3);
  block_case((gc_case){.name = "block varlen decode", .Hq = 4, .Hkv = 2, .D = 128, .nseq = 3,
                       .lq = lq, .lkv = lkv, .alibi = 1, .dtype = ATTN_BF16}, 2);
}

/* ---- NaN/Inf in unseen keys and empty rows, packed and split ---------------------------- */
static void empty_case(gc_case c, int splits, int expect) {
  if (!gc_have_dims(&c)) return;
  c.seed = next_seed++;
  set_form(PACKED_SPLIT, splits);
  gc_prob P;
  gc_out out = {0};
  gc_init(&P, &c);
  const int64_t empties = gc_empty_rows(&P);
  const int64_t planted = gc_plant_unseen(&P, NAN, -INFINITY, INFINITY, NAN);
  gc_sync(&P);
  gc_expect_ok(gc_fwd(&P, &out), "attn_cuda_fwd", &c);
  expect_plan(&P.pb, PACKED_SPLIT, splits, &c);
  gc_expect_empty(&P, &out, &c, gc_check(&P, &out, 0, "NaN/Inf in unseen keys, packed+split"),
                  empties, planted, expect);
  gc_out_free(&out);
  gc_free(&P);
  attn_cuda_set_decode(-1, -1);
}

static void check_empty(void) {
  static const int32_t lq[] = {1, 3, 1, 0}, lkv[] = {0, 400, 250, 60};
  empty_case((gc_case){.name = "varlen decode empty kv", .Hq = 4, .Hkv = 1, .D = 64, .nseq = 4,
                       .lq = lq, .lkv = lkv, .causal = 1, .sinks = 1, .dtype = ATTN_BF16}, 3,
             GC_EXPECT_EMPTY_ROWS | GC_EXPECT_UNSEEN_KEYS);
  empty_case((gc_case){.name = "decode narrow window", .B = 2, .Sq = 2, .Skv = E ? 500 : 2000,
                       .Hq = 8, .Hkv = 2, .D = 128, .causal = 1, .window = 1, .wl = 90, .wr = 0,
                       .dtype = ATTN_F16}, 4, GC_EXPECT_UNSEEN_KEYS);
}

/* ---- the automatic plan ------------------------------------------------------------------ */
static attn_cuda_problem plan_problem(int64_t B, int64_t Hq, int64_t Hkv, int64_t sq, int64_t skv) {
  attn_cuda_problem p;
  memset(&p, 0, sizeof p);
  p.B = B;
  p.Hq = Hq;
  p.Hkv = Hkv;
  p.Dqk = p.Dv = 128;
  p.sq = p.seq_q = sq;
  p.skv = p.seq_kv = skv;
  p.scale = 0.088f;
  p.dtype = ATTN_BF16;
  return p;
}

static void check_auto(void) {
  attn_cuda_set_decode(-1, -1);
  int pack, nsplit;
  attn_cuda_problem d = plan_problem(1, 32, 8, 1, 16384);
  attn_cuda_fwd_plan(&d, &pack, &nsplit);
  TU_CHECK(pack == 4 && nsplit > 1, "decode 32/8 heads at 16K keys: pack %d, %d splits (want 4, > 1)",
           pack, nsplit);
  attn_cuda_problem big = plan_problem(8, 32, 8, 4096, 4096);
  attn_cuda_fwd_plan(&big, &pack, &nsplit);
  TU_CHECK(pack == 1 && nsplit == 1, "prefill 8 x 32 heads x 4K: pack %d, %d splits (want 1, 1)",
           pack, nsplit);
  attn_cuda_problem few_keys = plan_problem(1, 8, 8, 1, 64);
  attn_cuda_fwd_plan(&few_keys, &pack, &nsplit);
  TU_CHECK(pack == 1 && nsplit == 1, "MHA decode at 64 keys: pack %d, %d splits (want 1, 1)", pack,
           nsplit);
  attn_cuda_problem f32 = d;
  f32.dtype = ATTN_F32;
  attn_cuda_fwd_plan(&f32, &pack, &nsplit);
  TU_CHECK(pack == 1 && nsplit == 1, "float32: pack %d, %d splits (want 1, 1)", pack, nsplit);
  /* the automatic plan runs, and a workspace too small for its partial states runs unsplit */
  gc_case c = {.name = "auto decode", .B = 1, .Sq = 1, .Skv = E ? 2048 : 16384, .Hq = 8,
               .Hkv = 2, .D = 128, .dtype = ATTN_BF16, .seed = next_seed++};
  gc_prob P;
  gc_out out = {0};
  gc_init(&P, &c);
  attn_cuda_fwd_plan(&P.pb, &pack, &nsplit);
  TU_CHECK(pack == 4 && nsplit > 1, "auto decode: pack %d, %d splits", pack, nsplit);
  gc_expect_ok(gc_fwd(&P, &out), "attn_cuda_fwd", &c);
  int ran_pack, ran_split;
  attn_cuda_last_fwd_plan(&ran_pack, &ran_split);
  TU_CHECK(ran_pack == pack && ran_split == nsplit, "auto decode ran %d, %d (plan %d, %d)",
           ran_pack, ran_split, pack, nsplit);
  gc_check(&P, &out, 0, "auto plan");
  const size_t full = P.ws_bytes;
  P.ws_bytes = 0;
  gc_expect_ok(gc_fwd(&P, &out), "attn_cuda_fwd without workspace", &c);
  attn_cuda_last_fwd_plan(&ran_pack, &ran_split);
  TU_CHECK(ran_pack == pack && ran_split == 1, "no workspace ran %d, %d (want %d, 1)", ran_pack,
           ran_split, pack);
  gc_check(&P, &out, 0, "auto plan, no workspace");
  P.ws_bytes = full;
  gc_out_free(&out);
  gc_free(&P);
}

static void all(void) {
  sweep_decode();
  check_block();
  check_empty();
  check_auto();
}

int main(int argc, char **argv) {
  static const tu_part parts[] = {{"shapes", sweep_decode}, {"block", check_block},
                                  {"empty", check_empty},   {"auto", check_auto},
                                  {"all", all}};
  return gc_run_parts("test_cuda_decode", argc, argv, parts, (int)(sizeof parts / sizeof parts[0]),
                      "all", &E);
}
