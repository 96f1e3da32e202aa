/* test_short.c — short query tiles, where the CPU forward lays its work out differently:
 * the query heads of a GQA group share a tile's lanes (decode, short varlen sequences),
 * tiles compute only the lanes they use, and with fewer work items than threads each
 * item's keys are split over the threads and the states merged.
 * Usage: test_short flags|pair (one ctest entry each).
 *  - flags: all 128 flag combinations (tc_flags_case) on decode-like shapes, forward and
 *    backward against the float64 oracle, with 1 thread, with 7 (key splits), and on the
 *    scalar path with 3;
 *  - pair: the forward of a GQA problem, heads packed, is bitwise the forward of the same
 *    problem as MHA with K/V copied to every query head (one head a tile): packing moves
 *    work between lanes and nothing else. One thread (splits would change the rounding),
 *    and shapes where both sides take the same kernels (the row kernels for up to
 *    CPU_ROWS_MAX = 16 lanes a KV group, the tile kernels above; they round differently). */
#include <stdlib.h>
#include <string.h>

#include "test_case.h"

static uint64_t next_seed = 1;

typedef struct {
  int64_t B, Sq, Skv;
  int Hq, Hkv, Dqk, Dv;
  int32_t lq[3], lkv[3]; /* varlen split of Sq / Skv */
  int pair; /* both sides of the pair take the same kernels (rows or tiles) in every item */
} short_shape;

/* Lanes in use a KV group = packed heads x rows (u). Decode with groups of 4 and of 8
 * (u = 4, 8: row kernels, the KV groups of a batch in one item), 5 rows of a group of 6
 * (u = 30, narrow tiles), 50 rows fitting 2 heads of a group of 3 (packs of 2 + 1), 3 rows
 * of a group of 4 (u = 12: rows), 17 rows of a group of 2 (tiles on both sides of the
 * pair, rows with varlen), 2 rows of a group of 8 (u = 16, the most the row kernels take;
 * the MHA side packs 8 groups of 2 lanes); Dv past 64 with a last lane group of 1 or 2
 * (u = 5 and 6: the row kernels' P·V visits 64 columns at a time, every group alike). */
static const short_shape shapes[] = {
    {2, 1, 700, 8, 2, 64, 64, {1, 0, 0}, {300, 400, 0}, 1},
    {1, 1, 1000, 8, 1, 128, 128, {1, 0, 0}, {1, 999, 0}, 1},
    {1, 5, 333, 6, 1, 32, 40, {2, 0, 3}, {100, 33, 200}, 0},
    {1, 50, 300, 6, 2, 24, 16, {20, 1, 29}, {150, 50, 100}, 1},
    {1, 3, 500, 8, 2, 64, 32, {1, 2, 0}, {200, 300, 0}, 0},
    {1, 17, 400, 4, 2, 48, 48, {4, 0, 3}, {100, 100, 200}, 1},
    {1, 2, 600, 16, 2, 64, 64, {1, 1, 0}, {250, 350, 0}, 1},
    {1, 5, 300, 2, 2, 128, 128, {2, 0, 3}, {100, 0, 200}, 0},
    {1, 2, 400, 6, 2, 64, 96, {1, 0, 1}, {150, 50, 200}, 0},
};
#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))

static tc_case shape_case(const short_shape *s) {
  return (tc_case){.B = s->B, .Sq = s->Sq, .Skv = s->Skv, .Hq = s->Hq, .Hkv = s->Hkv,
                   .Dqk = s->Dqk, .Dv = s->Dv, .bwd = 1};
}

static void sweep_flags(void) {
  static const int threads[] = {1, 7, 3}, scalar[] = {0, 0, 1};
  for (int t = 0; t < 3; t++) {
    attn_ctx_t ctx = tc_ctx(scalar[t], threads[t]);
    for (int i = 0; i < NSHAPES; i++)
      for (int m = 0; m < 128; m++) {
        tc_case c = tc_flags_case(shape_case(&shapes[i]), m, shapes[i].lq, shapes[i].lkv);
        c.bwd = m % 8 == 0; /* the backward does not pack; a sample of it is enough */
        c.seed = next_seed++;
        tc_run(ctx, &c);
      }
    attn_ctx_destroy(ctx);
  }
}

/* Number of elements whose bits differ. */
static int64_t bits_differ(const float *a, const float *b, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) bad += memcmp(&a[i], &b[i], sizeof a[i]) != 0;
  return bad;
}

static void pair_case(attn_ctx_t ctx, tc_case gqa) {
  gqa.seed = next_seed++;
  gqa.bwd = 0;
  tc_case mha = gqa;
  mha.Hkv = gqa.Hq; /* same seed: the same Q, sinks, slopes and mask */
  tc_prob P, M;
  tc_init(&P, &gqa);
  tc_init(&M, &mha);
  const int64_t G = P.Hq / P.Hkv;
  for (int64_t b = 0; b < P.B; b++) /* M's head h reads P's KV head h / G */
    for (int64_t s = 0; s < P.Skv; s++)
      for (int64_t h = 0; h < P.Hq; h++) {
        memcpy(M.k + ((b * P.Skv + s) * P.Hq + h) * P.Dqk,
               P.k + ((b * P.Skv + s) * P.Hkv + h / G) * P.Dqk, (size_t)P.Dqk * sizeof(float));
        memcpy(M.v + ((b * P.Skv + s) * P.Hq + h) * P.Dv,
               P.v + ((b * P.Skv + s) * P.Hkv + h / G) * P.Dv, (size_t)P.Dv * sizeof(float));
      }
  tc_sync(&M);
  tc_out a, m;
  tc_lib(ctx, &P, &a, 0);
  tc_lib(ctx, &M, &m, 0);
  int ok = tc_check(&P, &a, 0, "packed vs oracle");
  int64_t dO = bits_differ(a.o, m.o, tc_n_o(&P)), dL = bits_differ(a.lse, m.lse, tc_n_lse(&P));
  TU_CHECK(dO == 0 && dL == 0, "GQA packed vs MHA copies: %lld of %lld O and %lld of %lld LSE "
           "elements differ in their bits", (long long)dO, (long long)tc_n_o(&P), (long long)dL,
           (long long)tc_n_lse(&P));
  if (!ok || dO || dL) {
    char desc[512];
    tc_describe(&gqa, desc, sizeof desc);
    fprintf(stderr, "  ^ in %s\n", desc);
  }
  tc_out_free(&a);
  tc_out_free(&m);
  tc_free(&P);
  tc_free(&M);
}

static void sweep_pairs(void) {
  attn_ctx_t ctx = tc_ctx(0, 1);
  for (int i = 0; i < NSHAPES; i++)
    for (int m = 0; m < 128 && shapes[i].pair; m += 3)
      pair_case(ctx, tc_flags_case(shape_case(&shapes[i]), m, shapes[i].lq, shapes[i].lkv));
  attn_ctx_destroy(ctx);
}

int main(int argc, char **argv) {
  static const tu_part parts[] = {{"flags", sweep_flags}, {"pair", sweep_pairs}};
  return tu_run_parts("test_short", argc, argv, parts, (int)(sizeof parts / sizeof parts[0]));
}
