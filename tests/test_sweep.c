/* test_sweep.c — library vs float64 oracle over shapes, head dims and every mask flag,
 * forward and backward, with random inputs and poisoned outputs.
 * Usage: test_sweep shapes|dims|flags|flags_scalar|masks|random (one ctest entry each;
 * flags_scalar runs the flag sweep on the forced scalar path; random: random problems). */
#include <stdlib.h>
#include <string.h>

#include "test_case.h"

static attn_ctx_t ctx;
static uint64_t next_seed = 1;

static void run(tc_case c) {
  c.seed = next_seed++;
  tc_run(ctx, &c);
}

/* Awkward lengths around the tiles (64 and 128 rows), Sq != Skv both ways, B > 1, GQA/MQA,
 * odd heads. */
static void sweep_shapes(void) {
  static const int64_t sizes[][2] = {{1, 1},     {63, 63},   {64, 64},   {65, 65},
                                     {127, 129}, {129, 127}, {113, 203}, {203, 113},
                                     {239, 1},   {1, 239},   {2, 130},   {130, 2},
                                     {128, 128}, {257, 255}};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    for (int causal = 0; causal < 2; causal++) {
      tc_case c = {.name = "shape", .B = 2, .Sq = sizes[i][0], .Skv = sizes[i][1], .Hq = 3,
                   .Hkv = 1, .Dqk = 32, .causal = causal, .bwd = 1, .bhsd = (int)(i & 1)};
      run(c);
    }
  /* Large shapes: forward and one backward. */
  run((tc_case){.name = "big", .B = 1, .Sq = 1023, .Skv = 1024, .Hq = 2, .Hkv = 1, .Dqk = 64});
  run((tc_case){.name = "big causal", .B = 1, .Sq = 1023, .Skv = 1024, .Hq = 2, .Hkv = 2,
                .Dqk = 64, .causal = 1, .sinks = 1});
  run((tc_case){.name = "big bwd", .B = 1, .Sq = 1024, .Skv = 1023, .Hq = 1, .Hkv = 1,
                .Dqk = 64, .causal = 1, .bwd = 1});
  run((tc_case){.name = "decode", .B = 1, .Sq = 1, .Skv = 4096, .Hq = 8, .Hkv = 2,
                .Dqk = 128, .bwd = 1});
  run((tc_case){.name = "decode causal", .B = 2, .Sq = 3, .Skv = 4096, .Hq = 4, .Hkv = 1,
                .Dqk = 64, .causal = 1, .window = 1, .wl = 1000, .wr = -1, .bwd = 1});
  run((tc_case){.name = "B>1 odd heads", .B = 3, .Sq = 127, .Skv = 129, .Hq = 5, .Hkv = 5,
                .Dqk = 16, .bwd = 1});
  run((tc_case){.name = "MQA", .B = 2, .Sq = 65, .Skv = 191, .Hq = 7, .Hkv = 1, .Dqk = 24,
                .causal = 1, .bwd = 1});
  run((tc_case){.name = "GQA", .B = 1, .Sq = 200, .Skv = 200, .Hq = 6, .Hkv = 3, .Dqk = 40,
                .window = 1, .wl = 70, .wr = 10, .bwd = 1, .bhsd = 1});
  run((tc_case){.name = "long window", .B = 1, .Sq = 2048, .Skv = 2048, .Hq = 2, .Hkv = 1,
                .Dqk = 64, .causal = 1, .window = 1, .wl = 100, .wr = 0, .bwd = 1});
  /* Every short-tile lane count (the row kernels take up to 16 lanes, in groups of 1-4
   * over column chunks; a GQA group of 3 packs its heads) at Dv past 64, against three
   * key tiles (the second rescales what the first wrote). */
  for (int sq = 1; sq <= 17; sq++)
    for (int g = 0; g < 2; g++)
      run((tc_case){.name = "lanes", .B = 1, .Sq = sq, .Skv = 300, .Hq = g ? 3 : 1, .Hkv = 1,
                    .Dqk = 64, .Dv = g ? 80 : 128, .causal = sq & 1, .bwd = sq % 4 == 0});
}

/* Every head dim class: 1, odd, the fast paths, 72, 256, and Dqk != Dv both ways. */
static void sweep_dims(void) {
  static const int dims[][2] = {{1, 0},   {7, 0},    {16, 0},  {64, 0},  {72, 0},
                                {128, 0}, {256, 0},  {192, 128}, {128, 192}, {64, 1},
                                {1, 64},  {7, 256},  {256, 7}, {96, 32}, {33, 65}};
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
    for (int causal = 0; causal < 2; causal++) {
      tc_case c = {.name = "dims", .B = 1, .Sq = 65, .Skv = 127, .Hq = 2, .Hkv = 1,
                   .Dqk = dims[i][0], .Dv = dims[i][1], .causal = causal, .bwd = 1,
                   .sinks = causal, .softcap = causal ? 0.0f : 3.0f, .bhsd = (int)(i & 1)};
      run(c);
    }
  run((tc_case){.name = "dims big", .B = 1, .Sq = 300, .Skv = 300, .Hq = 2, .Hkv = 1,
                .Dqk = 256, .causal = 1, .bwd = 1});
  run((tc_case){.name = "dims 192/128", .B = 1, .Sq = 257, .Skv = 300, .Hq = 2, .Hkv = 1,
                .Dqk = 192, .Dv = 128, .window = 1, .wl = 64, .wr = 64, .bwd = 1});
  run((tc_case){.name = "scale", .B = 1, .Sq = 70, .Skv = 70, .Hq = 1, .Hkv = 1, .Dqk = 64,
                .scale = 0.3f, .amp = 2.0, .bwd = 1});
}

/* All 128 combinations of causal, window, softcap, sinks, alibi, varlen, block mask, on
 * two shapes: Sq < Skv with MQA and Dqk != Dv, and Sq > Skv with B = 2 (1 with varlen),
 * GQA and the 128/64 dims. */
typedef struct {
  int64_t B, Sq, Skv;
  int Hq, Hkv, Dqk, Dv;
  int32_t lq[3], lkv[3]; /* varlen split of Sq / Skv */
} flag_shape;

static void sweep_flags_on(const flag_shape *fs) {
  const tc_case shape = {.B = fs->B, .Sq = fs->Sq, .Skv = fs->Skv, .Hq = fs->Hq, .Hkv = fs->Hkv,
                         .Dqk = fs->Dqk, .Dv = fs->Dv, .bwd = 1};
  for (int m = 0; m < 128; m++) run(tc_flags_case(shape, m, fs->lq, fs->lkv));
}

static void sweep_flags(void) {
  static const flag_shape shapes[] = {
      {1, 113, 203, 3, 1, 32, 24, {40, 1, 72}, {70, 33, 100}},
      {2, 203, 113, 4, 2, 128, 64, {100, 3, 100}, {50, 60, 3}}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) sweep_flags_on(&shapes[i]);
}

/* Block masks: tile-aligned, unaligned, larger than the tile, short (blocks past the end
 * are invisible), with varlen, and the documented pattern from attn_block_mask_fill. */
static void sweep_masks(void) {
  static const int blocks[][2] = {{64, 64}, {16, 16}, {1, 1}, {100, 30}, {128, 64}, {7, 200}};
  static const int32_t lq[] = {130, 0, 77, 5}, lkv[] = {64, 9, 200, 130};
  for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++)
    for (int causal = 0; causal < 2; causal++) {
      tc_case c = {.name = "mask", .B = 2, .Sq = 190, .Skv = 257, .Hq = 2, .Hkv = 1,
                   .Dqk = 32, .causal = causal, .bq = blocks[i][0], .bk = blocks[i][1],
                   .bwd = 1, .mask_short = causal && i > 0};
      run(c);
      c.nseq = 4, c.lq = lq, c.lkv = lkv, c.name = "mask varlen";
      run(c);
    }
  run((tc_case){.name = "varlen empty seqs", .Hq = 2, .Hkv = 2, .Dqk = 16, .nseq = 4,
                .lq = (const int32_t[]){0, 65, 3, 0}, .lkv = (const int32_t[]){5, 64, 0, 0},
                .causal = 1, .sinks = 1, .bwd = 1});
  run((tc_case){.name = "varlen big", .Hq = 2, .Hkv = 1, .Dqk = 64, .nseq = 3,
                .lq = (const int32_t[]){500, 63, 400}, .lkv = (const int32_t[]){700, 63, 129},
                .causal = 1, .alibi = 1, .bwd = 1});
}

/* Random problems (tc_random_case) on a context of 1-7 threads, the scalar path now and
 * then; bf16 with the float32 arithmetic (cfg.cpu_amx = -1: tc_check's bound is that
 * path's; test_bf16_tiles random judges the tile units). ATTN_TEST_SEED picks another set
 * and ATTN_TEST_COUNT its size (default 160). */
static void sweep_random(void) {
  int total;
  tu_rng r = tc_random_rng(&total, 160);
  int32_t lq[4], lkv[4];
  for (int n = 0; n < total; n++) {
    tc_case c = tc_random_case(&r, lq, lkv);
    c.dtype = (int)tu_randint(&r, 0, 1) ? c.dtype : ATTN_F32;
    attn_ctx_t rc = tc_ctx_amx(tu_randint(&r, 0, 7) == 0, (int)tu_randint(&r, 1, 7), -1);
    c.seed = next_seed++;
    if (!tc_run(rc, &c)) fprintf(stderr, "  ^ random problem %d (ATTN_TEST_SEED picks the set)\n", n);
    attn_ctx_destroy(rc);
  }
}

int main(int argc, char **argv) {
  static const tu_part parts[] = {{"shapes", sweep_shapes}, {"dims", sweep_dims},
                                  {"flags", sweep_flags},   {"flags_scalar", sweep_flags},
                                  {"masks", sweep_masks},   {"random", sweep_random}};
  ctx = tc_ctx(argc > 1 && !strcmp(argv[1], "flags_scalar"), 2);
  printf("backend %s\n", attn_ctx_backend_name(ctx));
  int rc = tu_run_parts("test_sweep", argc, argv, parts, (int)(sizeof parts / sizeof parts[0]));
  attn_ctx_destroy(ctx);
  return rc;
}
