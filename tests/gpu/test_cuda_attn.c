/* test_cuda_attn.c — the CUDA flash kernels vs the float64 oracle: shapes (1, tile±1,
 * Sq != Skv both ways, GQA/MQA, B > 1, strided), every mask flag on and off, block masks
 * and varlen, the block API (chained / merged / split rows == one shot), empty rows and
 * NaN/Inf in unseen keys, deterministic backward bitwise repeatable, unsupported inputs.
 * bf16/fp16 judged by the 2x same-precision rule. Exits 77 when there is no device.
 * Usage: test_cuda_attn fwd|bwd|flags|windows|masks|block|empty|det|api|quick|dims|f32
 * (one ctest each; dims: head dim 256 and (Dqk, Dv) = (192, 128) on small shapes; f32: the
 * float32 SIMT kernels, judged against float32 tolerances). The Hopper kernels have their
 * own tests: test_cuda_sm90_fwd.c, test_cuda_sm90_bwd.c.
 * Built twice: on the CUDA runtime, and on the emulator (smaller cases) for CPU-only CI. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_case.h"

static uint64_t next_seed = 1;
static int E; /* emulated: fewer, smaller cases */

/* Forward (and backward) of one case against the references. */
static void run(gc_case c, int bwd) {
  if (!gc_have_dims(&c)) return;
  c.seed = next_seed++;
  gc_prob P;
  gc_out out = {0};
  gc_init(&P, &c);
  gc_expect_ok(gc_fwd(&P, &out), "attn_cuda_fwd", &c);
  if (bwd) gc_expect_ok(gc_bwd(&P, &out, (int)(c.seed & 1)), "attn_cuda_bwd", &c);
  gc_check(&P, &out, bwd, bwd ? ((c.seed & 1) ? "fwd+bwd (deterministic)" : "fwd+bwd") : "fwd");
  gc_out_free(&out);
  gc_free(&P);
}

static void both_dtypes(gc_case c, int bwd) {
  c.dtype = ATTN_BF16;
  run(c, bwd);
  c.dtype = ATTN_F16;
  run(c, bwd);
}

/* ---- shapes ------------------------------------------------------------------------- */
static void sweep_shapes(int bwd) {
  /* around the tiles: 64-key tiles, 128-row forward tiles, 128-key backward tiles */
  static const int64_t sizes[][2] = {{1, 1},     {63, 65},  {64, 64},   {65, 63},  {127, 129},
                                     {129, 127}, {128, 128}, {113, 203}, {203, 113}, {239, 1},
                                     {1, 239},   {2, 130},  {257, 255}};
  static const int64_t emu_sizes[][2] = {{1, 1}, {65, 63}, {129, 127}, {1, 130}, {130, 2}};
  /* (Dqk, Dv); the emulator runs the first two here and the others in the "dims" part */
  static const int dims[][2] = {{64, 64}, {128, 128}, {256, 256}, {192, 128}};
  const int n = E ? 5 : (int)(sizeof sizes / sizeof sizes[0]), nd = E ? 2 : 4;
  for (int i = 0; i < n; i++)
    for (int causal = 0; causal < 2; causal++)
      for (int di = 0; di < nd; di++) {
        gc_case c = {.name = "shape", .B = 2, .Sq = E ? emu_sizes[i][0] : sizes[i][0],
                     .Skv = E ? emu_sizes[i][1] : sizes[i][1], .Hq = 3, .Hkv = 1,
                     .D = dims[di][0], .Dv = dims[di][1], .causal = causal, .bhsd = i & 1};
        if (E && di && i > 2) continue;
        c.dtype = ((i + causal + di) & 1) ? ATTN_F16 : ATTN_BF16;
        run(c, bwd);
      }
  if (E) {
    both_dtypes((gc_case){.name = "GQA", .B = 1, .Sq = 70, .Skv = 150, .Hq = 4, .Hkv = 2,
                          .D = 64, .causal = 1}, bwd);
    return;
  }
  both_dtypes((gc_case){.name = "big", .B = 1, .Sq = 1023, .Skv = 1024, .Hq = 2, .Hkv = 1, .D = 128}, bwd);
  both_dtypes((gc_case){.name = "big causal", .B = 2, .Sq = 1000, .Skv = 1030, .Hq = 2, .Hkv = 2,
                        .D = 64, .causal = 1, .sinks = 1}, bwd);
  run((gc_case){.name = "decode", .B = 1, .Sq = 1, .Skv = 4096, .Hq = 8, .Hkv = 2, .D = 128,
                .dtype = ATTN_BF16}, bwd);
  run((gc_case){.name = "decode causal window", .B = 2, .Sq = 3, .Skv = 2000, .Hq = 4, .Hkv = 1,
                .D = 64, .causal = 1, .window = 1, .wl = 700, .wr = -1, .dtype = ATTN_F16}, bwd);
  run((gc_case){.name = "B>1 odd heads", .B = 3, .Sq = 127, .Skv = 129, .Hq = 5, .Hkv = 5,
                .D = 64, .dtype = ATTN_BF16}, bwd);
  run((gc_case){.name = "MQA", .B = 2, .Sq = 65, .Skv = 191, .Hq = 7, .Hkv = 1, .D = 128,
                .causal = 1, .dtype = ATTN_F16}, bwd);
  run((gc_case){.name = "GQA bhsd", .B = 1, .Sq = 200, .Skv = 200, .Hq = 6, .Hkv = 3, .D = 64,
                .window = 1, .wl = 70, .wr = 10, .bhsd = 1, .dtype = ATTN_BF16}, bwd);
  run((gc_case){.name = "long window", .B = 1, .Sq = 2048, .Skv = 2048, .Hq = 2, .Hkv = 1,
                .D = 128, .causal = 1, .window = 1, .wl = 100, .wr = 0, .dtype = ATTN_BF16}, bwd);
  run((gc_case){.name = "scale amp", .B = 1, .Sq = 300, .Skv = 300, .Hq = 2, .Hkv = 1, .D = 64,
                .scale = 0.3f, .amp = 2.0, .dtype = ATTN_F16}, bwd);
}

/* ---- every flag on and off ---------------------------------------------------------- */
typedef struct {
  int64_t B, Sq, Skv;
  int Hq, Hkv, D;
  int32_t lq[3], lkv[3]; /* varlen split of Sq / Skv */
} flag_shape;

static void sweep_flags(void) {
  static const flag_shape shapes[] = {{1, 113, 203, 3, 1, 64, {40, 1, 72}, {70, 33, 100}},
                                      {2, 203, 113, 4, 2, 128, {100, 3, 100}, {50, 60, 3}}};
  static const flag_shape emu_shape = {1, 70, 90, 2, 1, 64, {30, 1, 39}, {40, 20, 30}};
  const int nshapes = E ? 1 : 2, step = E ? 9 : 1;
  for (int si = 0; si < nshapes; si++) {
    const flag_shape *fs = E ? &emu_shape : &shapes[si];
    for (int m = si % step; m < 128; m += step) {
      gc_case c = {.name = "flags", .B = fs->B, .Sq = fs->Sq, .Skv = fs->Skv, .Hq = fs->Hq,
                   .Hkv = fs->Hkv, .D = fs->D, .bhsd = (m >> 1) & 1,
                   .dtype = (m >> 2) & 1 ? ATTN_F16 : ATTN_BF16};
      c.causal = m & 1;
      if (m & 2) {
        c.window = 1;
        c.wl = (m & 64) ? 20 : 75;
        c.wr = (m & 1) ? -1 : 33;
      }
      if (m & 4) c.softcap = 1.5f, c.amp = 2.0;
      c.sinks = (m >> 3) & 1;
      c.alibi = (m >> 4) & 1;
      if (m & 32) c.nseq = 3, c.lq = fs->lq, c.lkv = fs->lkv;
      if (m & 64) c.bq = 32, c.bk = 48;
      run(c, 1);
    }
  }
}

/* ---- window edges at every alignment to the tiles ------------------------------------
 * Window widths around multiples of 16 and 64 with Skv - Sq in {0, 1, 17}, so that window
 * edges fall on, one before and one after the 16-row warp and 64/128-key tile borders. */
static void sweep_windows(void) {
  const char *every = getenv("ATTN_EMU_WINDOWS_EVERY"); /* emulator: every n-th case */
  const int emu_every = every && atoi(every) > 0 ? atoi(every) : 4;
  (void)emu_every;
  static const int64_t wls[] = {0, 1, 14, 15, 16, 17, 63, 64, 65, 130};
  static const int64_t wrs[] = {-1, 0, 1, 13, 14, 15, 30, 33, 64};
  static const int64_t offs[] = {0, 1, 17};
  int n = 0;
  for (size_t o = 0; o < 3; o++)
    for (size_t a = 0; a < sizeof wls / sizeof wls[0]; a++)
      for (size_t b = 0; b < sizeof wrs / sizeof wrs[0]; b++, n++) {
        if (E && n % emu_every) continue;
        gc_case c = {.name = "window", .B = 1, .Sq = E ? 150 : 250, .Hq = 2, .Hkv = 1,
                     .D = (n % 5 == 2) ? 128 : 64, .window = 1, .wl = wls[a], .wr = wrs[b],
                     .causal = n % 7 == 3, .dtype = n % 2 ? ATTN_F16 : ATTN_BF16};
        c.Skv = c.Sq + offs[o];
        run(c, 1);
      }
}

/* ---- block masks and varlen --------------------------------------------------------- */
static void sweep_masks(void) {
  static const int blocks[][2] = {{64, 64}, {16, 16}, {1, 1}, {100, 30}, {128, 64}, {7, 200}};
  static const int32_t lq[] = {130, 0, 77, 5}, lkv[] = {64, 9, 200, 130};
  const int nb = E ? 3 : (int)(sizeof blocks / sizeof blocks[0]);
  for (int i = 0; i < nb; i++)
    for (int causal = 0; causal < 2; causal++) {
      const int bi = E ? (int)(i * 2 % 6) : i;
      gc_case c = {.name = "mask", .B = E ? 1 : 2, .Sq = E ? 90 : 190, .Skv = E ? 140 : 257,
                   .Hq = 2, .Hkv = 1, .D = 64, .causal = causal, .bq = blocks[bi][0],
                   .bk = blocks[bi][1], .mask_short = causal && bi > 0,
                   .dtype = (i & 1) ? ATTN_F16 : ATTN_BF16};
      run(c, 1);
      if (E && causal) continue;
      c.nseq = 4, c.lq = lq, c.lkv = lkv, c.name = "mask varlen", c.D = 128;
      run(c, 1);
    }
  run((gc_case){.name = "varlen empty seqs", .Hq = 2, .Hkv = 2, .D = 64, .nseq = 4,
                .lq = (const int32_t[]){0, 65, 3, 0}, .lkv = (const int32_t[]){5, 64, 0, 0},
                .causal = 1, .sinks = 1, .dtype = ATTN_BF16}, 1);
  if (E) return;
  run((gc_case){.name = "varlen big", .Hq = 2, .Hkv = 1, .D = 128, .nseq = 3,
                .lq = (const int32_t[]){500, 63, 400}, .lkv = (const int32_t[]){700, 63, 129},
                .causal = 1, .alibi = 1, .dtype = ATTN_F16}, 1);
  static int32_t many_q[300], many_kv[300];
  for (int s = 0; s < 300; s++) {
    many_q[s] = (s * 37) % 23;
    many_kv[s] = (s * 53) % 29 + (s % 5 ? 1 : 0);
  }
  run((gc_case){.name = "varlen many", .Hq = 4, .Hkv = 2, .D = 64, .nseq = 300, .lq = many_q,
                .lkv = many_kv, .causal = 1, .dtype = ATTN_BF16}, 1);
}

/* ---- the wider head dims: 256 and (Dqk, Dv) = (192, 128) ------------------------------
 * Their own part so that the emulator runs them on small shapes: around their tiles
 * (fewer keys per backward CTA at 256), GQA, varlen, every mask flag in a few
 * combinations, NaN/Inf in unseen keys, the block API (in check_block). */
static void run_empty(gc_case c, int expect);
static void run_hot(gc_case c);
static void check_block_case(gc_case c);
enum { EXPECT_EMPTY_ROWS = GC_EXPECT_EMPTY_ROWS, EXPECT_UNSEEN_KEYS = GC_EXPECT_UNSEEN_KEYS };

static void sweep_wide_dims(void) {
  static const int dims[][2] = {{256, 256}, {192, 128}};
  static const int64_t sizes[][2] = {{1, 1}, {63, 65}, {65, 129}, {129, 63}, {31, 33}};
  static const int32_t lq[] = {40, 1, 30}, lkv[] = {33, 65, 20};
  for (int di = 0; di < 2; di++) {
    const int D = dims[di][0], Dv = dims[di][1];
    for (int i = 0; i < (E ? 4 : 5); i++)
      for (int causal = 0; causal < 2; causal++) {
        gc_case c = {.name = "wide shape", .B = 1, .Sq = sizes[i][0], .Skv = sizes[i][1],
                     .Hq = 2, .Hkv = 1, .D = D, .Dv = Dv, .causal = causal, .bhsd = i & 1,
                     .dtype = ((i + causal + di) & 1) ? ATTN_F16 : ATTN_BF16};
        run(c, 1);
      }
    /* flag combinations: window + sinks, ALiBi + softcap + varlen, block mask + GQA */
    run((gc_case){.name = "wide window sinks", .B = 2, .Sq = 70, .Skv = 90, .Hq = 2, .Hkv = 2,
                  .D = D, .Dv = Dv, .window = 1, .wl = 20, .wr = 5, .sinks = 1,
                  .dtype = ATTN_BF16}, 1);
    run((gc_case){.name = "wide varlen alibi softcap", .Hq = 3, .Hkv = 1, .D = D, .Dv = Dv,
                  .nseq = 3, .lq = lq, .lkv = lkv, .causal = 1, .alibi = 1, .softcap = 1.5f,
                  .amp = 2.0, .dtype = ATTN_F16}, 1);
    run((gc_case){.name = "wide block mask GQA", .B = 1, .Sq = 80, .Skv = 100, .Hq = 4, .Hkv = 2,
                  .D = D, .Dv = Dv, .bq = 32, .bk = 16, .causal = di, .dtype = ATTN_BF16}, 1);
    run_empty((gc_case){.name = "wide empty rows", .B = 1, .Sq = 90, .Skv = 40, .Hq = 2,
                        .Hkv = 1, .D = D, .Dv = Dv, .causal = 1, .sinks = di,
                        .dtype = di ? ATTN_F16 : ATTN_BF16}, EXPECT_EMPTY_ROWS);
    check_block_case((gc_case){.name = "wide block API", .B = 1, .Sq = 50, .Skv = 70, .Hq = 2,
                               .Hkv = 1, .D = D, .Dv = Dv, .causal = 1, .sinks = 1,
                               .dtype = ATTN_BF16});
    if (E) continue;
    both_dtypes((gc_case){.name = "wide big", .B = 1, .Sq = 700, .Skv = 1030, .Hq = 2, .Hkv = 1,
                          .D = D, .Dv = Dv, .causal = 1}, 1);
  }
}

/* ---- float32 (the SIMT kernels): head dims at run time, every feature --------------------
 * Tiles are 32 rows x 32 keys; head dims any multiple of 8 up to 256, Dqk != Dv too. Judged
 * like the CPU backend: relative to max|ref| (gc_check). */
static void sweep_f32(void) {
  static const int dims[][2] = {{64, 64}, {40, 40}, {256, 256}, {192, 128}, {8, 72}, {128, 128}};
  static const int64_t sizes[][2] = {{1, 1}, {31, 33}, {33, 31}, {65, 64}, {2, 97}, {100, 3}};
  static const int32_t lq[] = {40, 1, 31}, lkv[] = {33, 65, 0};
  for (int di = 0; di < 6; di++)
    for (int i = 0; i < 6; i++) {
      gc_case c = {.name = "f32 shape", .B = 1 + (i & 1), .Sq = sizes[i][0], .Skv = sizes[i][1],
                   .Hq = 3, .Hkv = (i % 3) ? 1 : 3, .D = dims[di][0], .Dv = dims[di][1],
                   .causal = (i + di) & 1, .bhsd = i == 2, .dtype = ATTN_F32};
      run(c, 1);
    }
  /* every flag on and off, in combinations over one shape (as sweep_flags) */
  for (int m = 0; m < 128; m++) { /* cheap on the emulator too: few warp collectives */
    gc_case c = {.name = "f32 flags", .B = 1, .Sq = 70, .Skv = 72, .Hq = 4, .Hkv = 2,
                 .D = (m & 8) ? 32 : 64, .Dv = (m & 16) ? 48 : 64, .bhsd = (m >> 1) & 1,
                 .dtype = ATTN_F32, .causal = m & 1};
    if (m & 2) c.window = 1, c.wl = (m & 64) ? 20 : 45, c.wr = (m & 1) ? -1 : 13;
    if (m & 4) c.softcap = 1.5f, c.amp = 2.0;
    c.sinks = (m >> 3) & 1;
    c.alibi = (m >> 4) & 1;
    if (m & 32) c.nseq = 3, c.lq = lq, c.lkv = lkv, c.Sq = 72, c.Skv = 98;
    if (m & 64) c.bq = 16, c.bk = 24, c.mask_short = m & 1;
    run(c, 1);
  }
  run_empty((gc_case){.name = "f32 empty rows", .B = 1, .Sq = 70, .Skv = 40, .Hq = 2, .Hkv = 1,
                      .D = 64, .causal = 1, .sinks = 1, .dtype = ATTN_F32}, EXPECT_EMPTY_ROWS);
  run_empty((gc_case){.name = "f32 unseen keys", .B = 1, .Sq = 40, .Skv = 130, .Hq = 1, .Hkv = 1,
                      .D = 96, .Dv = 32, .window = 1, .wl = 3, .wr = 0, .softcap = 5.0f,
                      .dtype = ATTN_F32}, EXPECT_UNSEEN_KEYS);
  run_empty((gc_case){.name = "f32 unseen key block in a tile", .B = 1, .Sq = 128, .Skv = 96,
                      .Hq = 1, .Hkv = 1, .D = 64, .bq = 64, .bk = 16,
                      .mask_bits = (const uint8_t[]){1, 0, 1, 1, 0, 1, /**/ 1, 0, 0, 1, 1, 1},
                      .dtype = ATTN_F32}, EXPECT_UNSEEN_KEYS);
  run_hot((gc_case){.name = "f32 hot causal", .B = 1, .Sq = 70, .Skv = 70, .Hq = 2, .Hkv = 1,
                    .D = 64, .causal = 1, .dtype = ATTN_F32});
  check_block_case((gc_case){.name = "f32 block API", .B = 2, .Sq = 50, .Skv = 75, .Hq = 2,
                             .Hkv = 1, .D = 72, .Dv = 40, .causal = 1, .sinks = 1, .alibi = 1,
                             .dtype = ATTN_F32});
  check_block_case((gc_case){.name = "f32 block API varlen", .Hq = 2, .Hkv = 2, .D = 256,
                             .nseq = 3, .lq = lq, .lkv = lkv, .window = 1, .wl = 9, .wr = 4,
                             .dtype = ATTN_F32});
  if (E) return;
  run((gc_case){.name = "f32 big", .B = 1, .Sq = 700, .Skv = 1030, .Hq = 2, .Hkv = 1, .D = 128,
                .causal = 1, .dtype = ATTN_F32}, 1);
}

/* ---- the block API ------------------------------------------------------------------- */
static void *alloc_state(attn_state *st, const gc_prob *P, int64_t rows) {
  const int64_t n = P->B * P->Hq * rows;
  float *buf = td_alloc((size_t)(n * (2 + P->Dv)) * 4);
  attn_state s = {buf, buf + n, buf + 2 * n, P->B, P->Hq, rows, P->Dv};
  *st = s;
  gc_expect_ok(attn_cuda_state_init(st, NULL), "attn_cuda_state_init", &P->c);
  return buf;
}

/* A problem for q rows [q0, q1) x keys [k0, k1) of P. */
static attn_cuda_problem block_problem(const gc_prob *P, int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
  attn_cuda_problem b = P->pb;
  b.sq = q1 - q0;
  b.skv = k1 - k0;
  b.q_row0 = b.q_pos0 = q0;
  b.k_pos0 = k0;
  const size_t e = gc_elem_bytes(P);
  b.q.p = (char *)b.q.p + q0 * b.q.ss * e;
  b.k.p = (char *)b.k.p + k0 * b.k.ss * e;
  b.v.p = (char *)b.v.p + k0 * b.v.ss * e;
  return b;
}

/* Chained O and LSE equal the one-shot ones up to the rounding a different order of tiles
 * gives: within twice the naive same-precision error (the 2x rule's scale). */
static void same_as_one_shot(gc_prob *P, const gc_out *chained, const gc_out *one) {
  if (!P->ro) gc_ref(P, 0);
  const int64_t n = gc_n_o(P), nl = gc_n_lse(P);
  double err_o = 0, err_l = 0, naive_o = 0, naive_l = 0, max_o = 0, max_l = 0;
  for (int64_t x = 0; x < n; x++) {
    err_o = fmax(err_o, fabs((double)chained->o[x] - one->o[x]));
    naive_o = fmax(naive_o, fabs((double)P->no[x] - P->ro[x]));
    max_o = fmax(max_o, fabs(P->ro[x]));
  }
  for (int64_t x = 0; x < nl; x++) {
    if (isinf(P->rlse[x])) {
      TU_CHECK(chained->lse[x] == one->lse[x], "LSE[%lld]: chained %g, one shot %g", (long long)x,
               (double)chained->lse[x], (double)one->lse[x]);
      continue;
    }
    err_l = fmax(err_l, fabs((double)chained->lse[x] - one->lse[x]));
    naive_l = fmax(naive_l, fabs((double)P->nlse[x] - P->rlse[x]));
    max_l = fmax(max_l, fabs(P->rlse[x]));
  }
  char desc[600];
  gc_describe(&P->c, desc, sizeof desc);
  TU_CHECK(err_o <= 2 * naive_o + 1e-4 * max_o + 1e-6 && err_l <= 2 * naive_l + 1e-4 * max_l + 1e-6,
           "chained vs one shot: O %.3e (naive %.3e), LSE %.3e (naive %.3e) in %s", err_o, naive_o,
           err_l, naive_l, desc);
}

static void check_block_case(gc_case c) {
  if (!gc_have_dims(&c)) return;
  c.seed = next_seed++;
  gc_prob P;
  gc_out out = {0}, one = {0};
  gc_init(&P, &c);
  gc_expect_ok(gc_fwd(&P, &one), "attn_cuda_fwd", &c);
  const int64_t ks[4] = {0, P.Skv / 3, P.Skv / 3 + 1 + P.Skv / 4, P.Skv}; /* 3 key blocks */
  const int64_t qs[3] = {0, P.Sq / 2 + 1 > P.Sq ? P.Sq : P.Sq / 2 + 1, P.Sq};
  attn_state a, b;
  void *ba = alloc_state(&a, &P, P.Sq), *bb = alloc_state(&b, &P, P.Sq);
  /* state a: q halves x key blocks 2, 0; state b: key block 1 (split-KV), then merged */
  for (int qi = 0; qi < 2; qi++) {
    if (qs[qi] == qs[qi + 1]) continue;
    const int order[3] = {2, 0, 1};
    for (int x = 0; x < 3; x++) {
      const int ki = order[x];
      if (ks[ki] == ks[ki + 1]) continue;
      attn_cuda_problem bp = block_problem(&P, qs[qi], qs[qi + 1], ks[ki], ks[ki + 1]);
      gc_expect_ok(attn_cuda_fwd_block(&bp, ki == 1 ? &b : &a, P.d_ws, P.ws_bytes, NULL),
                   "attn_cuda_fwd_block", &c);
    }
  }
  gc_expect_ok(attn_cuda_state_merge(&a, &b, NULL), "attn_cuda_state_merge", &c);
  gc_expect_ok(gc_finalize(&P, &a, &out), "attn_cuda_finalize", &c);
  gc_check(&P, &out, 0, "chained fwd_block + merge + finalize");
  same_as_one_shot(&P, &out, &one);

  /* backward over the same key blocks and q halves, accumulating into one dq/dk/dv */
  const int64_t nq = gc_n_q(&P), nk = gc_n_k(&P), nv = gc_n_v(&P), nl = gc_n_lse(&P);
  float *dq = td_alloc((size_t)nq * 4), *dk = td_alloc((size_t)nk * 4), *dv = td_alloc((size_t)nv * 4);
  float *delta = td_alloc((size_t)nl * 4), *ds = td_alloc((size_t)P.Hq * 4);
  td_memset(dq, 0, (size_t)nq * 4);
  td_memset(dk, 0, (size_t)nk * 4);
  td_memset(dv, 0, (size_t)nv * 4);
  td_memset(ds, 0, (size_t)P.Hq * 4);
  const attn_cuda_view o = gc_view(&P, P.d_o, P.Sq, P.Hq, P.Dv);
  const attn_cuda_view dO = gc_view(&P, P.ddo, P.Sq, P.Hq, P.Dv);
  gc_expect_ok(attn_cuda_bwd_prepare(&P.pb, o, dO, P.d_lse, delta, P.sinks ? ds : NULL, NULL),
               "attn_cuda_bwd_prepare", &c);
  const attn_cuda_view vq = gc_view(&P, dq, P.Sq, P.Hq, P.D), vk = gc_view(&P, dk, P.Skv, P.Hkv, P.D),
                       vv = gc_view(&P, dv, P.Skv, P.Hkv, P.Dv);
  for (int qi = 0; qi < 2; qi++)
    for (int ki = 0; ki < 3; ki++) {
      if (qs[qi] == qs[qi + 1] || ks[ki] == ks[ki + 1]) continue;
      attn_cuda_problem bp = block_problem(&P, qs[qi], qs[qi + 1], ks[ki], ks[ki + 1]);
      attn_cuda_view bq = vq, bk = vk, bv = vv, bo = dO;
      bq.p = (float *)bq.p + qs[qi] * bq.ss;
      bo.p = (char *)bo.p + qs[qi] * bo.ss * gc_elem_bytes(&P);
      bk.p = (float *)bk.p + ks[ki] * bk.ss;
      bv.p = (float *)bv.p + ks[ki] * bv.ss;
      gc_expect_ok(attn_cuda_bwd_block(&bp, bo, P.d_lse, delta, P.Sq, bq, bk, bv, (qi + ki) & 1,
                                       P.d_ws, P.ws_bytes, NULL),
                   "attn_cuda_bwd_block", &c);
    }
  td_sync();
  out.dq = tu_alloc((size_t)nq * 4);
  out.dk = tu_alloc((size_t)nk * 4);
  out.dv = tu_alloc((size_t)nv * 4);
  out.ds = tu_alloc((size_t)P.Hq * 4 + 4);
  gc_download_f32(&P, dq, P.Sq, P.Hq, P.D, out.dq);
  gc_download_f32(&P, dk, P.Skv, P.Hkv, P.D, out.dk);
  gc_download_f32(&P, dv, P.Skv, P.Hkv, P.Dv, out.dv);
  td_download(out.ds, ds, (size_t)P.Hq * 4);
  gc_check(&P, &out, 1, "blocked bwd_prepare + bwd_block");
  void *bufs[] = {ba, bb, dq, dk, dv, delta, ds};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) td_free(bufs[i]);
  gc_out_free(&out);
  gc_out_free(&one);
  gc_free(&P);
}

static void check_block(void) {
  static const int32_t lq[] = {50, 0, 61}, lkv[] = {80, 30, 47};
  check_block_case((gc_case){.name = "block", .B = 2, .Sq = E ? 70 : 150, .Skv = E ? 100 : 211,
                             .Hq = 2, .Hkv = 1, .D = 64, .dtype = ATTN_BF16});
  check_block_case((gc_case){.name = "block causal sinks", .B = 1, .Sq = E ? 90 : 200,
                             .Skv = E ? 90 : 260, .Hq = 2, .Hkv = 2, .D = 128, .causal = 1,
                             .sinks = 1, .alibi = 1, .dtype = ATTN_F16});
  check_block_case((gc_case){.name = "block varlen window", .Hq = 2, .Hkv = 1, .D = 64,
                             .nseq = 3, .lq = lq, .lkv = lkv, .window = 1, .wl = 20, .wr = 5,
                             .softcap = 2.0f, .dtype = ATTN_BF16});
  if (E) return;
  check_block_case((gc_case){.name = "block mask", .B = 1, .Sq = 300, .Skv = 300, .Hq = 4,
                             .Hkv = 2, .D = 128, .causal = 1, .bq = 64, .bk = 32, .dtype = ATTN_BF16});
}

/* ---- empty rows, NaN/Inf in unseen keys, hot keys ------------------------------------ */

static void run_empty(gc_case c, int expect) {
  if (!gc_have_dims(&c)) return;
  c.seed = next_seed++;
  gc_prob P;
  gc_out out = {0};
  gc_init(&P, &c);
  const int64_t empties = gc_empty_rows(&P);
  const int64_t planted = gc_plant_unseen(&P, NAN, -INFINITY, INFINITY, NAN);
  gc_sync(&P);
  gc_expect_ok(gc_fwd(&P, &out), "attn_cuda_fwd", &c);
  gc_expect_ok(gc_bwd(&P, &out, (int)(c.seed & 1)), "attn_cuda_bwd", &c);
  gc_expect_empty(&P, &out, &c, gc_check(&P, &out, 1, "NaN/Inf in unseen keys"), empties, planted, expect);
  gc_out_free(&out);
  gc_free(&P);
}

/* Keys masked for some queries of a tile but visible to others: their scores overflow to
 * +inf exactly where the mask must win (see tests/test_empty.c). bf16 only: f16 cannot
 * hold the 1e30 key. */
static void run_hot(gc_case c) {
  if (!gc_have_dims(&c)) return;
  c.seed = next_seed++;
  gc_prob P;
  gc_out out = {0};
  gc_init(&P, &c);
  gc_make_hot(&P);
  gc_sync(&P);
  gc_expect_ok(gc_fwd(&P, &out), "attn_cuda_fwd", &c);
  gc_expect_ok(gc_bwd(&P, &out, 0), "attn_cuda_bwd", &c);
  gc_check(&P, &out, 1, "masked +inf scores");
  gc_out_free(&out);
  gc_free(&P);
}

static void check_empty(void) {
  static const int32_t lq[] = {50, 70, 0, 30}, lkv[] = {0, 100, 40, 90};
  static const uint8_t holes[] = {1, 1, 0, 0, 1, /**/ 0, 0, 0, 0, 0, /**/ 0, 1, 1, 0, 0,
                                  /**/ 1, 0, 0, 0, 1};
  /* 2 x 6 blocks of 64 x 32: key block 1 is off for every row, inside the 64-key tile whose
   * block 0 is on (a mixed tile: its keys are tested one by one), block 4 off for row
   * block 0 only */
  static const uint8_t half_tile[] = {1, 0, 1, 1, 0, 1, /**/ 1, 0, 0, 1, 1, 1};
  for (int sinks = 0; sinks < 2; sinks++) {
    const int dt = sinks ? ATTN_F16 : ATTN_BF16;
    run_empty((gc_case){.name = "causal Sq>Skv", .B = 2, .Sq = E ? 100 : 200, .Skv = 70, .Hq = 2,
                        .Hkv = 1, .D = 64, .causal = 1, .sinks = sinks, .dtype = dt}, EXPECT_EMPTY_ROWS);
    run_empty((gc_case){.name = "window off the end", .B = 1, .Sq = E ? 150 : 300, .Skv = 100,
                        .Hq = 2, .Hkv = 2, .D = 64, .window = 1, .wl = 10, .wr = 5,
                        .sinks = sinks, .alibi = 1, .dtype = dt}, EXPECT_EMPTY_ROWS);
    run_empty((gc_case){.name = "narrow window", .B = 1, .Sq = E ? 70 : 150, .Skv = E ? 200 : 400,
                        .Hq = 2, .Hkv = 1, .D = 128, .window = 1, .wl = 3, .wr = 0,
                        .sinks = sinks, .softcap = 5.0f, .dtype = dt}, EXPECT_UNSEEN_KEYS);
    run_empty((gc_case){.name = "varlen empty kv", .Hq = 2, .Hkv = 1, .D = 64, .nseq = 4,
                        .lq = lq, .lkv = lkv, .causal = 1, .sinks = sinks, .dtype = dt}, EXPECT_EMPTY_ROWS | EXPECT_UNSEEN_KEYS);
    run_empty((gc_case){.name = "sparse blocks", .B = 1, .Sq = 256, .Skv = 300, .Hq = 1,
                        .Hkv = 1, .D = 64, .bq = 64, .bk = 64, .mask_bits = holes,
                        .sinks = sinks, .dtype = dt}, EXPECT_EMPTY_ROWS | EXPECT_UNSEEN_KEYS);
    run_empty((gc_case){.name = "unseen key block in a tile", .B = 1, .Sq = 128, .Skv = 192,
                        .Hq = 2, .Hkv = 1, .D = 64, .bq = 64, .bk = 32, .mask_bits = half_tile,
                        .sinks = sinks, .dtype = dt}, EXPECT_UNSEEN_KEYS);
    if (E) continue;
    run_empty((gc_case){.name = "window both sides", .B = 1, .Sq = 500, .Skv = 260, .Hq = 1,
                        .Hkv = 1, .D = 64, .window = 1, .wl = 0, .wr = 2, .causal = 1,
                        .sinks = sinks, .dtype = dt}, EXPECT_EMPTY_ROWS);
    run_empty((gc_case){.name = "sparse blocks unaligned", .B = 2, .Sq = 100, .Skv = 150,
                        .Hq = 1, .Hkv = 1, .D = 128, .bq = 25, .bk = 30, .mask_bits = holes,
                        .causal = 1, .sinks = sinks, .dtype = dt}, EXPECT_EMPTY_ROWS | EXPECT_UNSEEN_KEYS);
    run_empty((gc_case){.name = "short mask", .B = 1, .Sq = 130, .Skv = 200, .Hq = 1, .Hkv = 1,
                        .D = 64, .bq = 64, .bk = 64, .mask_short = 1, .sinks = sinks, .dtype = dt}, EXPECT_EMPTY_ROWS | EXPECT_UNSEEN_KEYS);
  }
  run_hot((gc_case){.name = "hot causal", .B = 1, .Sq = E ? 130 : 256, .Skv = E ? 130 : 256,
                    .Hq = 2, .Hkv = 1, .D = 64, .causal = 1, .dtype = ATTN_BF16});
  run_hot((gc_case){.name = "hot window", .B = 1, .Sq = 200, .Skv = 230, .Hq = 2, .Hkv = 2,
                    .D = 128, .window = 1, .wl = 40, .wr = 17, .sinks = 1, .dtype = ATTN_BF16});
}

/* ---- determinism --------------------------------------------------------------------- */
static void check_det(void) {
  gc_case cs[] = {{.name = "det", .B = 2, .Sq = E ? 100 : 700, .Skv = E ? 150 : 900, .Hq = 4,
                   .Hkv = 2, .D = 64, .causal = 1, .sinks = 1, .dtype = ATTN_BF16},
                  {.name = "det varlen", .Hq = 2, .Hkv = 1, .D = 128, .nseq = 3,
                   .lq = (const int32_t[]){90, 1, 70}, .lkv = (const int32_t[]){60, 50, 100},
                   .alibi = 1, .dtype = ATTN_F16},
                  {.name = "det f32", .B = 1, .Sq = 80, .Skv = 100, .Hq = 4, .Hkv = 1, .D = 64,
                   .Dv = 32, .causal = 1, .sinks = 1, .dtype = ATTN_F32}};
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
    gc_case c = cs[i];
    if (!gc_have_dims(&c)) continue;
    c.seed = next_seed++;
    gc_prob P;
    gc_out a = {0}, b = {0}, f = {0};
    gc_init(&P, &c);
    gc_expect_ok(gc_fwd(&P, &a), "attn_cuda_fwd", &c);
    gc_expect_ok(gc_bwd(&P, &a, 1), "attn_cuda_bwd deterministic", &c);
    gc_expect_ok(gc_bwd(&P, &b, 1), "attn_cuda_bwd deterministic", &c);
    gc_expect_ok(gc_bwd(&P, &f, 0), "attn_cuda_bwd", &c);
    const int64_t nq = gc_n_q(&P), nk = gc_n_k(&P), nv = gc_n_v(&P);
    TU_CHECK(!memcmp(a.dq, b.dq, (size_t)nq * 4) && !memcmp(a.dk, b.dk, (size_t)nk * 4) &&
                 !memcmp(a.dv, b.dv, (size_t)nv * 4) && !memcmp(a.ds, b.ds, (size_t)P.Hq * 4),
             "deterministic backward differs between two runs (%s)", c.name);
    /* the atomic (fused) dQ agrees with the deterministic one up to summation order */
    double worst = 0, maxabs = 0;
    for (int64_t x = 0; x < nq; x++) {
      worst = fmax(worst, fabs((double)a.dq[x] - f.dq[x]));
      maxabs = fmax(maxabs, fabs((double)a.dq[x]));
    }
    TU_CHECK(worst <= 1e-5 * maxabs + 1e-7, "atomic dQ vs deterministic dQ: %.3e (max %.3e) in %s",
             worst, maxabs, c.name);
    TU_CHECK(!memcmp(a.dk, f.dk, (size_t)nk * 4) && !memcmp(a.dv, f.dv, (size_t)nv * 4),
             "dK/dV differ between the atomic and deterministic paths (%s)", c.name);
    gc_check(&P, &a, 1, "deterministic");
    gc_out_free(&a);
    gc_out_free(&b);
    gc_out_free(&f);
    gc_free(&P);
  }
}

/* ---- unsupported inputs: status and message, nothing launched ------------------------- */
static void expect_fail(attn_status got, attn_status want, const char *needle, const char *what) {
  TU_CHECK(got == want, "%s: status %s, expected %s (%s)", what, attn_status_string(got),
           attn_status_string(want), attn_last_error());
  TU_CHECK(got == ATTN_OK || strstr(attn_last_error(), needle), "%s: message \"%s\" lacks \"%s\"",
           what, attn_last_error(), needle);
}

static void check_api(void) {
  gc_case c = {.name = "api", .B = 1, .Sq = 20, .Skv = 20, .Hq = 2, .Hkv = 1, .D = 64,
               .dtype = ATTN_BF16, .seed = 99};
  gc_prob P;
  gc_init(&P, &c);
  attn_cuda_view o = gc_view(&P, P.d_o, P.Sq, P.Hq, P.Dv);
  attn_cuda_problem p = P.pb;
  p.dtype = ATTN_F32;
  p.Dqk = p.Dv = 12;
  expect_fail(attn_cuda_fwd(&p, o, NULL, 0, NULL, 0, NULL), ATTN_ERR_UNSUPPORTED, "multiples of 8",
              "f32 head dim 12");
  p.Dqk = p.Dv = 264;
  expect_fail(attn_cuda_check(&p), ATTN_ERR_UNSUPPORTED, "multiples of 8", "f32 head dim 264");
  p.Dqk = 200;
  p.Dv = 56;
  expect_fail(attn_cuda_check(&p), ATTN_OK, "", "f32 head dims 200x56");
  p = P.pb;
  p.Dqk = 192;
  p.Dv = 128;
  const int have_192 = gc_have_dims(&(gc_case){.D = 192, .Dv = 128, .dtype = ATTN_BF16});
  expect_fail(attn_cuda_check(&p), have_192 ? ATTN_OK : ATTN_ERR_UNSUPPORTED,
              "head_dim_v=128", "192x128");
  p.Dqk = 128;
  p.Dv = 64;
  expect_fail(attn_cuda_check(&p), ATTN_ERR_UNSUPPORTED, "head_dim_v=64", "128x64 (not built)");
  p = P.pb;
  p.Dqk = p.Dv = 96;
  expect_fail(attn_cuda_check(&p), ATTN_ERR_UNSUPPORTED, "head_dim=96", "head dim 96");
  p = P.pb;
  p.Dv = 32;
  expect_fail(attn_cuda_check(&p), ATTN_ERR_UNSUPPORTED, "head_dim_v=32", "Dqk != Dv");
  p = P.pb;
  p.q.p = (uint16_t *)p.q.p + 1;
  expect_fail(attn_cuda_check(&p), ATTN_ERR_UNSUPPORTED, "aligned", "misaligned q");
  p = P.pb;
  p.k.ss = 65;
  expect_fail(attn_cuda_check(&p), ATTN_ERR_UNSUPPORTED, "multiples of 8", "odd k stride");
  p = P.pb;
  int32_t *cu = td_alloc(8);
  p.cu_seqlens_q = p.cu_seqlens_kv = cu;
  p.num_seqs = 1;
  expect_fail(attn_cuda_fwd(&p, o, NULL, 0, NULL, 0, NULL), ATTN_ERR_INVALID_ARG, "workspace",
              "varlen without workspace");
  TU_CHECK(attn_cuda_workspace_bytes(&p) > 0, "varlen needs a workspace");
  td_free(cu);
  p = P.pb;
  p.Hq = 70000;
  p.Hkv = 70000;
  expect_fail(attn_cuda_check(&p), ATTN_ERR_UNSUPPORTED, "65535", "grid limit");
  expect_fail(attn_cuda_check(&P.pb), ATTN_OK, "", "a supported problem");
  gc_free(&P);
}

/* ---- a quick pass for compute-sanitizer ---------------------------------------------- */
static void quick(void) {
  static const int32_t lq[] = {33, 0, 70}, lkv[] = {40, 9, 65};
  both_dtypes((gc_case){.name = "quick", .B = 1, .Sq = 130, .Skv = 129, .Hq = 2, .Hkv = 1,
                        .D = 64, .causal = 1, .sinks = 1}, 1);
  run((gc_case){.name = "quick 128", .B = 2, .Sq = 70, .Skv = 200, .Hq = 2, .Hkv = 2, .D = 128,
                .window = 1, .wl = 30, .wr = 30, .alibi = 1, .dtype = ATTN_BF16}, 1);
  run((gc_case){.name = "quick varlen mask", .Hq = 2, .Hkv = 1, .D = 128, .nseq = 3, .lq = lq,
                .lkv = lkv, .bq = 16, .bk = 32, .softcap = 3.0f, .dtype = ATTN_F16}, 1);
}

static void sweep_fwd(void) { sweep_shapes(0); }
static void sweep_bwd(void) { sweep_shapes(1); }

int main(int argc, char **argv) {
  static const tu_part parts[] = {
      {"quick", quick},         {"fwd", sweep_fwd},       {"bwd", sweep_bwd},
      {"flags", sweep_flags},   {"masks", sweep_masks},   {"windows", sweep_windows},
      {"block", check_block},   {"empty", check_empty},   {"det", check_det},
      {"api", check_api},       {"dims", sweep_wide_dims}, {"f32", sweep_f32}};
  /* ATTN_EMU_FULL=1 runs the GPU's full case lists on the emulator too (slow). */
  return gc_run_parts("test_cuda_attn", argc, argv, parts, (int)(sizeof parts / sizeof parts[0]),
                      "quick", &E);
}
