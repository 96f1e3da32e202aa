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

/* ATTN_CUDA_FWD_KSPLIT=1: the key-split decode kernel asked for */
static int ksplit_asked(void) {
  const char *v = getenv("ATTN_CUDA_FWD_KSPLIT");
  return v && atoi(v) == 1;
}
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
    /* gc_fwd's tally (gpu_case.c) sees one-shot forwards only: the key-split kernel, where
     * asked for, must run these block calls too (varlen: the 8-warp kernel) */
    if (ksplit_asked() && !c.nseq)
      TU_CHECK(!strcmp(attn_cuda_last_fwd_form(), "ks"), "%s: a block call ran the %s kernel, not ks",
               c.name, attn_cuda_last_fwd_form());
  }
  TU_CHECK(splits == 1 ? split_calls == 0 : split_calls > 0, "%s: %d of the block calls split their keys (%d splits asked)",
           c.name, split_calls, splits);
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
  /* unsplit: the kernel itself reads and writes the carried state */
  block_case((gc_case){.name = "block decode unsplit", .B = 2, .Sq = 1, .Skv = E ? 500 : 2500,
                       .Hq = 8, .Hkv = 2, .D = 128, .causal = 1, .softcap = 20.0f,
                       .dtype = ATTN_BF16}, 1);
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
  /* the key-split decode kernel, where asked for, takes a decode step from the Hopper
   * forward (which would compute 128 rows for one) */
  if (ksplit_asked()) {
    attn_cuda_set_hopper(1);
    attn_cuda_problem mha = plan_problem(4, 8, 8, 1, 4096);
    TU_CHECK(!strcmp(attn_cuda_fwd_path(&mha), "mma"), "MHA decode with the key-split kernel asked "
             "for runs %s", attn_cuda_fwd_path(&mha));
    attn_cuda_set_hopper(0);
  }
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

/* ---- a KV cache: used lengths per batch and paged K/V (the mma.sync and float32 forwards) -- */
/* The oracle and the naive reference of P batch by batch on its first used[b] keys (a
 * one-batch case over exactly those keys; an empty cache: O = 0, LSE = the sink or -inf),
 * into P's reference arrays, which gc_check then reads. */
static void cache_refs(gc_prob *P, const int32_t *used) {
  const int64_t no = P->Sq * P->Hq * P->Dv, nl = P->Hq * P->Sq, qrow = P->Hq * P->D;
  const int64_t krow = P->Hkv * P->D, vrow = P->Hkv * P->Dv;
  P->ro = tu_dalloc(gc_n_o(P));
  P->rlse = tu_dalloc(gc_n_lse(P));
  P->no = tu_falloc(gc_n_o(P));
  P->nlse = tu_falloc(gc_n_lse(P));
  for (int64_t b = 0; b < P->B; b++) {
    if (used[b] == 0) {
      for (int64_t x = 0; x < no; x++) P->ro[b * no + x] = P->no[b * no + x] = 0.0f;
      for (int64_t x = 0; x < nl; x++) {
        const double lse = P->sinks ? P->sinks[x / P->Sq] : -INFINITY;
        P->rlse[b * nl + x] = lse;
        P->nlse[b * nl + x] = (float)lse;
      }
      continue;
    }
    gc_case cb = P->c; /* the same seed: the same sinks and slopes */
    cb.B = 1;
    cb.Skv = used[b];
    gc_prob S;
    gc_init(&S, &cb);
    memcpy(S.q, P->q + b * P->Sq * qrow, (size_t)(P->Sq * qrow) * 4);
    memcpy(S.k, P->k + b * P->Skv * krow, (size_t)(used[b] * krow) * 4);
    memcpy(S.v, P->v + b * P->Skv * vrow, (size_t)(used[b] * vrow) * 4);
    gc_ref(&S, 0);
    memcpy(P->ro + b * no, S.ro, (size_t)no * sizeof *S.ro);
    memcpy(P->rlse + b * nl, S.rlse, (size_t)nl * sizeof *S.rlse);
    memcpy(P->no + b * no, S.no, (size_t)no * 4);
    memcpy(P->nlse + b * nl, S.nlse, (size_t)nl * 4);
    gc_free(&S);
  }
}

/* P's K and V as pages of `page` rows in a pool [num_pages][page][Hkv][D] (device, the
 * dtype), shuffled by seed; spare pages and rows hold NaN (K) and Inf (V), table entries
 * past a batch's used keys are -1. */
typedef struct {
  int64_t page, pps, num_pages;
  int32_t *table; /* host [B][pps] */
  void *dk, *dv;  /* device pools */
} cache_pool;

static void pool_make(cache_pool *pl, const gc_prob *P, const int32_t *used, int64_t page,
                      uint64_t seed) {
  const int64_t krow = P->Hkv * P->D, vrow = P->Hkv * P->Dv;
  const size_t e = gc_elem_bytes(P);
  pl->page = page;
  pl->pps = ceil_div(P->Skv, page);
  pl->num_pages = P->B * pl->pps + 3;
  const int64_t nk = pl->num_pages * page * krow, nv = pl->num_pages * page * vrow;
  void *hk = tu_alloc((size_t)nk * e), *hv = tu_alloc((size_t)nv * e);
  const uint16_t knan = tu_to_bits(NAN, P->c.dtype), vinf = tu_to_bits(INFINITY, P->c.dtype);
  for (int64_t x = 0; x < nk; x++)
    if (e == 4) ((float *)hk)[x] = NAN;
    else ((uint16_t *)hk)[x] = knan;
  for (int64_t x = 0; x < nv; x++)
    if (e == 4) ((float *)hv)[x] = INFINITY;
    else ((uint16_t *)hv)[x] = vinf;
  int32_t *perm = tu_alloc((size_t)pl->num_pages * sizeof *perm);
  for (int64_t i = 0; i < pl->num_pages; i++) perm[i] = (int32_t)i;
  tu_rng r = tu_rng_make(seed);
  for (int64_t i = pl->num_pages - 1; i > 0; i--) {
    const int64_t j = tu_randint(&r, 0, i);
    const int32_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  pl->table = tu_alloc((size_t)(P->B * pl->pps) * sizeof *pl->table);
  for (int64_t b = 0; b < P->B; b++) {
    for (int64_t i = 0; i < pl->pps; i++)
      pl->table[b * pl->pps + i] = i * page < used[b] ? perm[b * pl->pps + i] : -1;
    for (int64_t j = 0; j < used[b]; j++) {
      const int64_t row = (int64_t)pl->table[b * pl->pps + j / page] * page + j % page;
      for (int64_t x = 0; x < krow; x++) {
        const float k = P->k[(b * P->Skv + j) * krow + x];
        if (e == 4) ((float *)hk)[row * krow + x] = k;
        else ((uint16_t *)hk)[row * krow + x] = tu_to_bits(k, P->c.dtype);
      }
      for (int64_t x = 0; x < vrow; x++) {
        const float v = P->v[(b * P->Skv + j) * vrow + x];
        if (e == 4) ((float *)hv)[row * vrow + x] = v;
        else ((uint16_t *)hv)[row * vrow + x] = tu_to_bits(v, P->c.dtype);
      }
    }
  }
  pl->dk = td_alloc((size_t)nk * e);
  pl->dv = td_alloc((size_t)nv * e);
  td_upload(pl->dk, hk, (size_t)nk * e);
  td_upload(pl->dv, hv, (size_t)nv * e);
  free(hk), free(hv), free(perm);
}

static void pool_free(cache_pool *pl) {
  td_free(pl->dk);
  td_free(pl->dv);
  free(pl->table);
}

static int32_t *upload_i32(const int32_t *x, int64_t n) {
  int32_t *d = td_alloc((size_t)n * 4 + 4);
  td_upload(d, x, (size_t)n * 4);
  return d;
}

/* The problem of pages [p0, p1) of the pool (table device copy of those columns, *dtab). */
static attn_cuda_problem pool_problem(const gc_prob *P, const cache_pool *pl, const int32_t *dused,
                                      int64_t p0, int64_t p1, int32_t **dtab) {
  int32_t *t = tu_alloc((size_t)(P->B * (p1 - p0)) * sizeof *t);
  for (int64_t b = 0; b < P->B; b++)
    for (int64_t i = p0; i < p1; i++) t[b * (p1 - p0) + i - p0] = pl->table[b * pl->pps + i];
  *dtab = upload_i32(t, P->B * (p1 - p0));
  free(t);
  attn_cuda_problem pb = P->pb;
  const int64_t page = pl->page;
  pb.k = (attn_cuda_view){pl->dk, page * P->Hkv * P->D, P->Hkv * P->D, P->D};
  pb.v = (attn_cuda_view){pl->dv, page * P->Hkv * P->Dv, P->Hkv * P->Dv, P->Dv};
  pb.seq_kv = pl->pps * page;
  pb.k_pos0 = p0 * page;
  pb.skv = (p1 - p0) * page;
  pb.kv_used = dused;
  pb.block_table = *dtab;
  pb.pages_per_seq = p1 - p0;
  pb.page_size = page;
  pb.num_pages = pl->num_pages;
  return pb;
}

/* One cache case: used lengths drawn (some full, some empty, some below the queries),
 * K/V past them poisoned. The contiguous cache (kv_used) and the paged one (block table,
 * pages of `page` rows), each in the four forms where bf16/f16, against the per-batch
 * references; paged equals contiguous bitwise (the same tiles, the same arithmetic); then
 * the paged cache in two block calls (page ranges, the later first) folded into a state. */
static void cache_case(gc_case c, int64_t page, int splits) {
  if (!gc_have_dims(&c)) return;
  c.seed = next_seed++;
  set_form(PACKED_SPLIT, splits);
  const int before = tu_failures;
  gc_prob P;
  gc_init(&P, &c);
  int32_t *used = tu_alloc((size_t)P.B * sizeof *used);
  tu_rng r = tu_rng_make(c.seed * 13 + 5);
  for (int64_t b = 0; b < P.B; b++) {
    const int64_t kind = (b + tu_randint(&r, 0, 3)) % 4;
    used[b] = (int32_t)(kind == 0   ? P.Skv
                        : kind == 1 ? (b == 1 ? 0 : tu_randint(&r, 1, P.Skv))
                        : kind == 2 ? tu_randint(&r, 0, P.Sq < P.Skv ? P.Sq : P.Skv)
                                    : tu_randint(&r, P.Skv / 2, P.Skv));
  }
  used[0] = (int32_t)P.Skv; /* a full cache, and an empty one */
  if (P.B >= 3) used[1] = 0;
  for (int64_t b = 0; b < P.B; b++)
    for (int64_t j = used[b]; j < P.Skv; j++) {
      for (int64_t x = 0; x < P.Hkv * P.D; x++) P.k[(b * P.Skv + j) * P.Hkv * P.D + x] = NAN;
      for (int64_t x = 0; x < P.Hkv * P.Dv; x++) P.v[(b * P.Skv + j) * P.Hkv * P.Dv + x] = INFINITY;
    }
  gc_sync(&P);
  cache_refs(&P, used);
  int32_t *dused = upload_i32(used, P.B);
  cache_pool pl;
  pool_make(&pl, &P, used, page, c.seed + 7);
  int32_t *dtab;
  const attn_cuda_problem contiguous = P.pb, paged = pool_problem(&P, &pl, dused, 0, pl.pps, &dtab);
  const size_t ws = attn_cuda_workspace_bytes(&paged);
  if (ws > P.ws_bytes) {
    td_free(P.d_ws);
    P.d_ws = td_alloc(ws);
    P.ws_bytes = ws;
  }
  const int nforms = c.dtype == ATTN_F32 ? 1 : NFORMS;
  for (int f = 0; f < nforms; f++) {
    gc_out oc = {0}, op = {0};
    int pc[2], pp[2];
    set_form(f, splits);
    P.pb = contiguous;
    P.pb.kv_used = dused;
    gc_expect_ok(gc_fwd(&P, &oc), "attn_cuda_fwd (kv_used)", &c);
    attn_cuda_last_fwd_plan(&pc[0], &pc[1]);
    if (c.dtype != ATTN_F32) expect_plan(&P.pb, f, splits, &c);
    gc_check(&P, &oc, 0, form_name[f]);
    P.pb = paged;
    gc_expect_ok(gc_fwd(&P, &op), "attn_cuda_fwd (paged)", &c);
    attn_cuda_last_fwd_plan(&pp[0], &pp[1]);
    if (c.dtype != ATTN_F32) expect_plan(&P.pb, f, splits, &c);
    attn_cuda_set_hopper(1); /* which the Hopper forward declines */
    TU_CHECK(!strcmp(attn_cuda_fwd_path(&P.pb), c.dtype == ATTN_F32 ? "f32" : "mma"),
             "%s: a cache runs %s", c.name, attn_cuda_fwd_path(&P.pb));
    attn_cuda_set_hopper(0);
    gc_check(&P, &op, 0, form_name[f]);
    /* the used keys bound both walks alike: the same plan is the same arithmetic */
    if (pc[0] == pp[0] && pc[1] == pp[1]) {
      const int64_t bad = count_unequal(oc.o, op.o, gc_n_o(&P)) + count_unequal(oc.lse, op.lse, gc_n_lse(&P));
      TU_CHECK(bad == 0, "%s (%s): paged vs contiguous: %lld elements of O / LSE differ", c.name,
               form_name[f], (long long)bad);
    }
    gc_out_free(&oc);
    gc_out_free(&op);
  }
  /* block mode: pages [cut, pps) first, then [0, cut), into one state */
  if (pl.pps >= 2) {
    const int64_t n = P.B * P.Hq * P.Sq, cut = pl.pps / 2;
    float *buf = td_alloc((size_t)(n * (2 + P.Dv)) * 4);
    attn_state st = {buf, buf + n, buf + 2 * n, P.B, P.Hq, P.Sq, P.Dv};
    gc_expect_ok(attn_cuda_state_init(&st, NULL), "attn_cuda_state_init", &c);
    const int64_t range[2][2] = {{cut, pl.pps}, {0, cut}};
    set_form(PACKED_SPLIT, splits);
    for (int x = 0; x < 2; x++) {
      int32_t *bt;
      attn_cuda_problem bp = pool_problem(&P, &pl, dused, range[x][0], range[x][1], &bt);
      gc_expect_ok(attn_cuda_fwd_block(&bp, &st, P.d_ws, P.ws_bytes, NULL), "attn_cuda_fwd_block (paged)", &c);
      td_sync();
      td_free(bt);
    }
    gc_out out = {0};
    P.pb = paged;
    gc_expect_ok(gc_finalize(&P, &st, &out), "attn_cuda_finalize", &c);
    gc_check(&P, &out, 0, "paged, two block calls + finalize");
    gc_out_free(&out);
    td_free(buf);
  }
  /* the backward takes no cache */
  P.pb = paged;
  float *g = td_alloc((size_t)gc_n_q(&P) * 4);
  const attn_status st = attn_cuda_bwd_block(&P.pb, gc_view(&P, P.ddo, P.Sq, P.Hq, P.Dv), P.d_lse,
                                             P.d_lse, P.Sq, gc_view(&P, g, P.Sq, P.Hq, P.D),
                                             gc_view(&P, g, P.Skv, P.Hkv, P.D),
                                             gc_view(&P, g, P.Skv, P.Hkv, P.Dv), 0, P.d_ws,
                                             P.ws_bytes, NULL);
  TU_CHECK(st == ATTN_ERR_UNSUPPORTED && strstr(attn_last_error(), "KV cache"),
           "%s: the backward on a cache gave %s: %s", c.name, attn_status_string(st), attn_last_error());
  td_free(g);
  if (tu_failures != before) {
    fprintf(stderr, "  cache case %s page=%lld used=[", c.name, (long long)page);
    for (int64_t b = 0; b < P.B; b++) fprintf(stderr, "%s%d", b ? "," : "", used[b]);
    fprintf(stderr, "]\n");
  }
  P.pb = contiguous;
  td_free(dtab);
  td_free(dused);
  pool_free(&pl);
  free(used);
  gc_free(&P);
  attn_cuda_set_decode(-1, -1);
}

static void check_cache(void) {
  cache_case((gc_case){.name = "cache decode GQA 4", .B = 4, .Sq = 1, .Skv = E ? 700 : 4000,
                       .Hq = 8, .Hkv = 2, .D = 128, .dtype = ATTN_BF16}, 16, 3);
  cache_case((gc_case){.name = "cache speculative causal window alibi softcap sinks", .B = 3,
                       .Sq = 4, .Skv = E ? 400 : 2500, .Hq = 4, .Hkv = 1, .D = 64, .causal = 1,
                       .window = 1, .wl = 150, .wr = 0, .alibi = 1, .softcap = 30.0f,
                       .sinks = 1, .dtype = ATTN_F16}, 64, 4);
  cache_case((gc_case){.name = "cache chunked prefill causal", .B = 3, .Sq = E ? 70 : 300,
                       .Skv = E ? 250 : 1000, .Hq = 4, .Hkv = 2, .D = 64, .causal = 1,
                       .dtype = ATTN_BF16}, 7, 2);
  cache_case((gc_case){.name = "cache f32", .B = 3, .Sq = 2, .Skv = E ? 200 : 1500, .Hq = 4,
                       .Hkv = 2, .D = 64, .causal = 1, .sinks = 1, .dtype = ATTN_F32}, 32, 1);
  if (E) return;
  cache_case((gc_case){.name = "cache decode 256 pages of 256", .B = 2, .Sq = 1, .Skv = 3000,
                       .Hq = 8, .Hkv = 1, .D = 256, .dtype = ATTN_BF16}, 256, 4);
  cache_case((gc_case){.name = "cache 192x128 pages of 1", .B = 3, .Sq = 2, .Skv = 600, .Hq = 4,
                       .Hkv = 2, .D = 192, .Dv = 128, .causal = 1, .dtype = ATTN_F16}, 1, 3);
}

static void all(void) {
  sweep_decode();
  check_block();
  check_empty();
  check_auto();
  check_cache();
}

int main(int argc, char **argv) {
  /* the mma.sync forward's forms, compared with each other bitwise: the Hopper forward,
   * which would take the plain one on compute 9.0 (its own tests: test_cuda_sm90_fwd), is
   * off but where a case turns it on */
  attn_cuda_set_hopper(0);
  static const tu_part parts[] = {{"shapes", sweep_decode}, {"block", check_block},
                                  {"empty", check_empty},   {"auto", check_auto},
                                  {"cache", check_cache},   {"all", all}};
  return gc_run_parts("test_cuda_decode", argc, argv, parts, (int)(sizeof parts / sizeof parts[0]),
                      "all", &E);
}
