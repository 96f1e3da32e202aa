/* test_cuda_sm90_bwd.c — the Hopper backward (bwd_sm90_body.cuh: TMA, wgmma, warp
 * specialisation, dQ by atomics or TMA reduce-adds) vs the float64 oracle, at head dims 128,
 * 64, 256 and (Dqk, Dv) = (192, 128) (the last two: 64-key CTAs, the consumers splitting
 * rows for S^T / dP^T and columns for dK, dV, dQ; dQ mode 0 only, as that kernel adds dQ
 * by atomics), in both dQ modes (ATTN_SM90_DQ 0 and 1: without it in the environment, a child
 * process runs mode 1, as the tunable is read once a process; on the emulator mode 1 runs
 * the core cases only: shapes, GQA, empty rows, unseen keys) (the same case list at each; d = 64 has one swizzled column block, N = 64 products, a 4-stage
 * ring and consumers taking turns at dQ): dQ, dK, dV and d(sinks) on random
 * inputs, around its 128-key CTAs and 64-row query steps (several of each, ragged ends),
 * causal and not, Sq != Skv both ways, GQA / MQA, window, softcap, ALiBi, sinks, strided
 * [B,H,S,D] views, empty rows, NaN/Inf in keys no query sees and +inf scores exactly
 * where the mask must win. The float32 gradients
 * live in padded views (8 extra floats a row, 3 extra rows a batch) whose padding is
 * poisoned (NaN bits; -0.0 in the extra rows, which an add of 0 changes) and must come back
 * untouched. Each case checks the path it ran
 * (attn_cuda_last_bwd_path) against attn_cuda_bwd_path; varlen and block masks must run
 * mma.sync; a deterministic dQ runs sm90 (key CTAs in order through semaphores) and must
 * give the same bits twice (on the emulator, where CTAs run one after another, that holds
 * anyway: there each semaphore wait must hold at once, which checks the turn counts). bf16/f16 judged by the 2x same-precision rule (gpu_case.c).
 * Blocks of longer sequences (q_pos0 / k_pos0, which the oracle here does not model) are
 * checked against the mma.sync backward instead; so are the d = 64 cases, besides the
 * oracle (VS_MMA).
 * Exits 77 without a device; on a device that is not compute capability 9.0 every case
 * runs mma.sync (and still has to pass). Built for the GPU and for the emulator. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu_case.h"

static uint64_t next_seed = 1000;
static int E;        /* emulated: fewer, smaller cases */
static int dq_tma;   /* the dQ mode under test (ATTN_SM90_DQ) */
static int ran_sm90; /* cases the sm90 backward took (at the head dim cases() runs) */
static int cur_dv;   /* Dv of the cases run() and run_offsets() get with .Dv 0 (0: D) */

enum { PADC = 8, PADR = 3 }; /* padding of the gradient views: floats a row, rows a batch */

/* A padded float32 gradient view [B, S(+PADR), H, D(+PADC)], the real elements zeroed; the
 * padding columns poisoned with NaN bits, the padding rows with -0.0 (an add of +0.0
 * there, say a TMA box not clipped at S, changes those; it would leave a NaN as it was). */
#define POISON_COL 0xFFFFFFFFu
#define POISON_ROW 0x80000000u
typedef struct {
  float *dev;
  int64_t S, H, D, n;
  attn_cuda_view v;
} pad_grad;

static void pad_alloc(pad_grad *g, int64_t B, int64_t S, int64_t H, int64_t D) {
  g->S = S, g->H = H, g->D = D;
  g->v.ss = H * (D + PADC);
  g->v.sh = D + PADC;
  g->v.sb = (S + PADR) * g->v.ss;
  g->n = B * g->v.sb;
  g->dev = td_alloc((size_t)g->n * 4);
  uint32_t *h = tu_alloc((size_t)g->n * 4);
  for (int64_t i = 0; i < g->n; i++) h[i] = POISON_ROW;
  for (int64_t b = 0; b < B; b++)
    for (int64_t s = 0; s < S; s++)
      for (int64_t x = 0; x < H; x++)
        for (int64_t d = 0; d < D + PADC; d++)
          h[b * g->v.sb + s * g->v.ss + x * g->v.sh + d] = d < D ? 0u : POISON_COL;
  td_upload(g->dev, h, (size_t)g->n * 4);
  free(h);
  g->v.p = g->dev;
}

/* Gathers the real elements to out [B,S,H,D]; returns the padding words that changed. */
static int64_t pad_gather(pad_grad *g, int64_t B, float *out) {
  float *h = tu_alloc((size_t)g->n * 4);
  td_download(h, g->dev, (size_t)g->n * 4);
  int64_t changed = 0;
  for (int64_t b = 0; b < B; b++)
    for (int64_t s = 0; s < g->S + PADR; s++)
      for (int64_t x = 0; x < g->H; x++)
        for (int64_t d = 0; d < g->D + PADC; d++) {
          const float *p = h + b * g->v.sb + s * g->v.ss + x * g->v.sh + d;
          if (s < g->S && d < g->D) {
            out[((b * g->S + s) * g->H + x) * g->D + d] = *p;
          } else {
            uint32_t u;
            memcpy(&u, p, 4);
            changed += u != (s < g->S ? POISON_COL : POISON_ROW);
          }
        }
  free(h);
  td_free(g->dev);
  return changed;
}

/* The backward of P (after gc_fwd) into padded gradient views; out->dq, dk, dv, ds. */
static attn_status run_bwd(gc_prob *P, gc_out *out, int deterministic, int64_t *changed) {
  pad_grad dq, dk, dv;
  pad_alloc(&dq, P->B, P->Sq, P->Hq, P->D);
  pad_alloc(&dk, P->B, P->Skv, P->Hkv, P->D);
  pad_alloc(&dv, P->B, P->Skv, P->Hkv, P->Dv);
  if (!out->dq) out->dq = tu_alloc((size_t)gc_n_q(P) * 4);
  if (!out->dk) out->dk = tu_alloc((size_t)gc_n_k(P) * 4);
  if (!out->dv) out->dv = tu_alloc((size_t)gc_n_v(P) * 4);
  if (!out->ds) out->ds = tu_alloc((size_t)P->Hq * 4 + 4);
  const attn_status st = gc_bwd_views(P, dq.v, dk.v, dv.v, deterministic, out->ds);
  *changed = pad_gather(&dq, P->B, out->dq) + pad_gather(&dk, P->B, out->dk) + pad_gather(&dv, P->B, out->dv);
  return st;
}

/* max |a - b| over max(max |b|, floor) of n floats (NaN counts as 1). */
static double rel_diff(const float *a, const float *b, int64_t n, double floor) {
  double m = floor, e = 0.0;
  for (int64_t i = 0; i < n; i++) {
    const double d = fabs((double)a[i] - (double)b[i]);
    e = d > e || isnan(d) ? (isnan(d) ? 1e30 : d) : e;
    m = fabs((double)b[i]) > m ? fabs((double)b[i]) : m;
  }
  return m > 0.0 ? e / m : e;
}

/* The mma.sync backward on P's forward (out->o, lse on the device) against out, the sm90
 * one's gradients: an index or offset slip is an O(1) error; the two differ only by
 * float32 order and the rare bf16/f16 rounding flip of P or dS. dQ and dK are judged
 * against at least 1e-3 max |dV|: where every row sees one key, dS = P (dP - delta) is
 * rounding noise, and so are they. */
static void vs_mma(gc_prob *P, const gc_out *out, const char *what, const char *desc) {
  gc_out mma = {0};
  int64_t changed = 0;
  attn_cuda_set_hopper(0);
  const attn_status st = run_bwd(P, &mma, 0, &changed);
  attn_cuda_set_hopper(1);
  TU_CHECK(st == ATTN_OK, "mma.sync backward: %s: %s", attn_status_string(st), desc);
  TU_CHECK(!strcmp(attn_cuda_last_bwd_path(), "mma"), "the reference ran %s: %s",
           attn_cuda_last_bwd_path(), desc);
  TU_CHECK(changed == 0, "mma.sync backward wrote padding: %s", desc);
  const double ev = rel_diff(out->dv, mma.dv, gc_n_v(P), 0.0);
  double vmax = 0.0;
  for (int64_t i = 0; i < gc_n_v(P); i++)
    if (fabs((double)mma.dv[i]) > vmax) vmax = fabs((double)mma.dv[i]);
  const double eq = rel_diff(out->dq, mma.dq, gc_n_q(P), 1e-3 * vmax),
               ek = rel_diff(out->dk, mma.dk, gc_n_k(P), 1e-3 * vmax);
  const double tol = P->c.dtype == ATTN_BF16 ? 2e-2 : 4e-3;
  TU_CHECK(eq <= tol && ek <= tol && ev <= tol,
           "sm90 vs mma.sync backward%s%s: dQ %.2e dK %.2e dV %.2e of max (tol %.0e): %s",
           *what ? " " : "", what, eq, ek, ev, tol, desc);
  gc_out_free(&mma);
}

/* PLANT_UNSEEN: NaN/Inf in every key no query sees; HOT: a key whose score is +inf
 * (bf16 only) for exactly the queries that must not see it (as test_cuda_attn's run_hot);
 * VS_MMA: also against the mma.sync backward (vs_mma). */
enum { PLANT_UNSEEN = 1, EXPECT_EMPTY = 2, HOT = 4, VS_MMA = 8 };

/* One case: forward, then the backward (deterministic or not) against the references. */
static void run(gc_case c, int deterministic, int flags) {
  c.seed = next_seed++;
  if (!c.Dv) c.Dv = cur_dv;
  gc_prob P;
  gc_out out = {0};
  gc_init(&P, &c);
  char desc[600];
  gc_describe(&c, desc, sizeof desc);
  const int64_t empties = gc_empty_rows(&P);
  if (flags & PLANT_UNSEEN) {
    const int64_t planted = gc_plant_unseen(&P, NAN, INFINITY, -INFINITY, NAN);
    gc_sync(&P);
    TU_CHECK(planted > 0, "case %s has no unseen keys", c.name);
  }
  if (flags & HOT) {
    const int64_t hot = P.Skv / 2;
    int64_t masked = 0;
    for (int64_t j = 0; j < P.Skv; j++)
      for (int64_t b = 0; b < P.B; b++)
        for (int64_t h = 0; h < P.Hkv; h++)
          P.k[((b * P.Skv + j) * P.Hkv + h) * P.D] = j == hot ? tu_round(1e30f, ATTN_BF16) : 0.0f;
    for (int64_t i = 0; i < P.Sq; i++) {
      masked += !P.vis[i * P.Skv + hot];
      for (int64_t b = 0; b < P.B; b++)
        for (int64_t h = 0; h < P.Hq; h++)
          P.q[((b * P.Sq + i) * P.Hq + h) * P.D] = P.vis[i * P.Skv + hot] ? 0.0f : tu_round(1e10f, ATTN_BF16);
    }
    gc_sync(&P);
    TU_CHECK(masked > 0 && masked < P.Sq, "case %s: the hot key is not masked for some rows only", c.name);
  }
  TU_CHECK(!(flags & EXPECT_EMPTY) || empties > 0, "case %s has no empty rows", c.name);
  gc_expect_ok(gc_fwd(&P, &out), "attn_cuda_fwd", &c);
  int64_t changed = 0;
  gc_expect_ok(run_bwd(&P, &out, deterministic, &changed), "attn_cuda_bwd_block", &c);
  const char *want = attn_cuda_bwd_path(&P.pb, deterministic), *got = attn_cuda_last_bwd_path();
  TU_CHECK(!strcmp(want, got), "backward ran %s, expected %s: %s", got, want, desc);
  ran_sm90 += !strcmp(got, "sm90");
  TU_CHECK(changed == 0, "%lld padding words of dQ/dK/dV written: %s", (long long)changed, desc);
  gc_check(&P, &out, 1, deterministic ? "sm90 bwd (deterministic)" : "sm90 bwd");
  if (deterministic) { /* the same inputs again: the same bits */
    gc_out again = {0};
    int64_t changed2 = 0;
    gc_expect_ok(run_bwd(&P, &again, deterministic, &changed2), "attn_cuda_bwd_block (again)", &c);
    TU_CHECK(!memcmp(again.dq, out.dq, (size_t)gc_n_q(&P) * 4) && !memcmp(again.dk, out.dk, (size_t)gc_n_k(&P) * 4) &&
                 !memcmp(again.dv, out.dv, (size_t)gc_n_v(&P) * 4),
             "deterministic backward (%s) gave other bits the second time: %s", got, desc);
    gc_out_free(&again);
  }
  if ((flags & VS_MMA) && !strcmp(got, "sm90")) vs_mma(&P, &out, "", desc);
  if (empties) { /* rows that see nothing: dQ exactly 0 */
    int64_t bad = 0;
    for (int64_t i = 0; i < P.Sq; i++) {
      int any = 0;
      for (int64_t j = 0; j < P.Skv && !any; j++) any = P.vis[i * P.Skv + j];
      if (any) continue;
      for (int64_t b = 0; b < P.B; b++)
        for (int64_t h = 0; h < P.Hq; h++)
          for (int64_t d = 0; d < P.D; d++) bad += out.dq[((b * P.Sq + i) * P.Hq + h) * P.D + d] != 0.0f;
    }
    TU_CHECK(bad == 0, "%lld nonzero dQ values in empty rows of %s", (long long)bad, desc);
  }
  gc_out_free(&out);
  gc_free(&P);
}

/* A block of a longer sequence (q_pos0, k_pos0, seq_q, seq_kv: what the ring hands the
 * kernels), which the oracle here does not model: the sm90 backward against the mma.sync
 * one (non-deterministic, tested against the oracle elsewhere) on the same forward. */
static void run_offsets(gc_case c, int64_t q_pos0, int64_t k_pos0, int64_t seq_q, int64_t seq_kv) {
  c.seed = next_seed++;
  if (!c.Dv) c.Dv = cur_dv;
  gc_prob P;
  gc_out out = {0};
  gc_init(&P, &c);
  P.pb.q_pos0 = q_pos0;
  P.pb.k_pos0 = k_pos0;
  P.pb.seq_q = seq_q;
  P.pb.seq_kv = seq_kv;
  char desc[600], what[120];
  gc_describe(&c, desc, sizeof desc);
  gc_expect_ok(gc_fwd(&P, &out), "attn_cuda_fwd", &c);
  int64_t changed = 0;
  gc_expect_ok(run_bwd(&P, &out, 0, &changed), "attn_cuda_bwd_block", &c);
  const char *got = attn_cuda_last_bwd_path();
  TU_CHECK(!strcmp(got, attn_cuda_bwd_path(&P.pb, 0)), "backward ran %s: %s", got, desc);
  ran_sm90 += !strcmp(got, "sm90");
  TU_CHECK(changed == 0, "padding words written: %s", desc);
  snprintf(what, sizeof what, "at q_pos0=%lld k_pos0=%lld seq %lld/%lld", (long long)q_pos0,
           (long long)k_pos0, (long long)seq_q, (long long)seq_kv);
  vs_mma(&P, &out, what, desc);
  gc_out_free(&out);
  gc_free(&P);
}

/* The case list at head dim d; vs (VS_MMA or 0) is added to the oracle cases' flags. */
static void cases(int d, int vs) {
  /* around the tiles: 128-key CTAs, 64-row steps; Sq != Skv both ways; GQA / MQA */
  static const int64_t sizes[][2] = {{1, 1},     {63, 65},   {64, 128},  {65, 129}, {130, 257},
                                     {257, 130}, {200, 333}, {333, 200}, {1, 300},  {300, 1},
                                     {1000, 1030}};
  static const int64_t emu_sizes[][2] = {{1, 1}, {70, 150}, {150, 130}, {1, 140}, {130, 65}};
  const int n = E ? 5 : (int)(sizeof sizes / sizeof sizes[0]);
  const int core = E && dq_tma; /* the emulator's second dQ mode: the core cases */
  for (int i = 0; i < n; i++)
    for (int causal = 0; causal < 2; causal++) {
      gc_case c = {.name = "sm90 bwd shape", .B = 1 + (i & 1), .Sq = E ? emu_sizes[i][0] : sizes[i][0],
                   .Skv = E ? emu_sizes[i][1] : sizes[i][1], .Hq = i == 1 ? 4 : 2,
                   .Hkv = i == 1 ? 2 : 1, .D = d, .causal = causal, .bhsd = i % 3 == 2,
                   .dtype = ((i + causal) & 1) ? ATTN_F16 : ATTN_BF16};
      run(c, 0, vs);
    }
  run((gc_case){.name = "sm90 bwd causal Sq>Skv", .B = 1, .Sq = E ? 200 : 400, .Skv = 70, .Hq = 2,
                .Hkv = 1, .D = d, .causal = 1, .sinks = 1, .dtype = ATTN_BF16},
      0, vs | EXPECT_EMPTY);
  run((gc_case){.name = "sm90 bwd causal unseen", .B = 2, .Sq = E ? 60 : 100, .Skv = E ? 200 : 400,
                .Hq = 3, .Hkv = 1, .D = d, .causal = 1, .window = 1, .wl = 40, .wr = -1,
                .sinks = 1, .alibi = 1, .dtype = ATTN_F16}, 0, vs | PLANT_UNSEEN);
  if (core) return;
  /* every flag: window (both sides, left only), softcap, sinks, ALiBi, GQA / MQA */
  for (int m = 0; m < 32; m += E ? 5 : d > 128 ? 3 : 1) {
    gc_case c = gc_flags_case("sm90 bwd flags", m, E ? 130 : 300, E ? 150 : 280, 70);
    c.D = d;
    run(c, 0, vs);
  }
  run((gc_case){.name = "sm90 bwd window off the end", .B = 1, .Sq = E ? 150 : 300, .Skv = 100,
                .Hq = 2, .Hkv = 2, .D = d, .window = 1, .wl = 10, .wr = 5, .alibi = 1,
                .dtype = ATTN_F16}, 0, vs | EXPECT_EMPTY);
  run((gc_case){.name = "sm90 bwd narrow window", .B = 1, .Sq = E ? 70 : 150, .Skv = E ? 300 : 500,
                .Hq = 2, .Hkv = 1, .D = d, .window = 1, .wl = 3, .wr = 0, .softcap = 5.0f,
                .dtype = ATTN_BF16}, 0, vs | PLANT_UNSEEN);
  run((gc_case){.name = "sm90 bwd hot window", .B = 1, .Sq = E ? 130 : 200, .Skv = E ? 150 : 230,
                .Hq = 2, .Hkv = 2, .D = d, .window = 1, .wl = 40, .wr = 17, .sinks = 1,
                .dtype = ATTN_BF16}, 0, vs | HOT);
  run((gc_case){.name = "sm90 bwd hot causal", .B = 1, .Sq = E ? 100 : 300, .Skv = E ? 140 : 300,
                .Hq = 4, .Hkv = 1, .D = d, .causal = 1, .dtype = ATTN_BF16}, 0, vs | HOT);
  /* blocks of longer sequences: causal offset and window relative to positions */
  run_offsets((gc_case){.name = "sm90 bwd positions causal", .B = 1, .Sq = 100, .Skv = 150, .Hq = 2,
                        .Hkv = 1, .D = d, .causal = 1, .dtype = ATTN_BF16}, 130, 40, 400, 380);
  run_offsets((gc_case){.name = "sm90 bwd positions window", .B = 2, .Sq = 70, .Skv = 200, .Hq = 2,
                        .Hkv = 2, .D = d, .window = 1, .wl = 50, .wr = 20, .alibi = 1,
                        .dtype = ATTN_F16}, 64, 0, 300, 300);
  /* a deterministic dQ (key CTAs in order per 64-row tile): several key CTAs and tiles,
   * causal (CTAs start at different tiles) and not, GQA, a window, empty rows (the same
   * in either dQ mode: mode 0 runs them) */
  if (!dq_tma) {
  run((gc_case){.name = "sm90 bwd deterministic causal", .B = 1, .Sq = E ? 70 : 200, .Skv = E ? 140 : 333,
                .Hq = 2, .Hkv = 1, .D = d, .causal = 1, .dtype = ATTN_BF16}, 1, 0);
  run((gc_case){.name = "sm90 bwd deterministic", .B = 2, .Sq = E ? 130 : 300, .Skv = E ? 150 : 290,
                .Hq = 4, .Hkv = 2, .D = d, .sinks = 1, .dtype = ATTN_F16}, 1, 0);
  run((gc_case){.name = "sm90 bwd deterministic window", .B = 1, .Sq = E ? 150 : 300, .Skv = E ? 140 : 280,
                .Hq = 2, .Hkv = 2, .D = d, .window = 1, .wl = 30, .wr = 10, .dtype = ATTN_F16},
      1, 0);
  run((gc_case){.name = "sm90 bwd deterministic Sq>Skv", .B = 1, .Sq = E ? 200 : 400, .Skv = 70, .Hq = 2,
                .Hkv = 1, .D = d, .causal = 1, .dtype = ATTN_BF16}, 1, EXPECT_EMPTY);
  }
  /* routed to mma.sync: varlen, block masks */
  static const int32_t lq[] = {70, 1, 60}, lkv[] = {90, 33, 20};
  run((gc_case){.name = "sm90 bwd -> mma varlen", .Hq = 2, .Hkv = 1, .D = d, .nseq = 3, .lq = lq,
                .lkv = lkv, .causal = 1, .dtype = ATTN_BF16}, 0, 0);
  run((gc_case){.name = "sm90 bwd -> mma block mask", .B = 1, .Sq = 150, .Skv = 140, .Hq = 2,
                .Hkv = 1, .D = d, .bq = 32, .bk = 64, .dtype = ATTN_F16}, 0, 0);
  /* big shapes: both in the default dQ mode; in mode 1 the first, at d = 128 only (the
   * float64 oracle of one takes 5-15 s on the host, and device-check runs every GPU test
   * in one stage of 240 s); past 128 one of half the size */
  if (!E && d > 128) {
    run((gc_case){.name = "sm90 bwd big", .B = 1, .Sq = 1024, .Skv = 1100, .Hq = 4, .Hkv = 2,
                  .D = d, .causal = 1, .sinks = 1, .dtype = ATTN_BF16}, 0, 0);
  } else if (!E && (!dq_tma || d == 128)) {
    run((gc_case){.name = "sm90 bwd big", .B = 2, .Sq = 2048, .Skv = 2048, .Hq = 4, .Hkv = 2,
                  .D = d, .causal = 1, .sinks = 1, .dtype = ATTN_BF16}, 0, 0);
    if (!dq_tma)
      run((gc_case){.name = "sm90 bwd big", .B = 1, .Sq = 1500, .Skv = 2100, .Hq = 8, .Hkv = 1,
                    .D = d, .window = 1, .wl = 300, .wr = 100, .dtype = ATTN_F16}, 0, 0);
  }
}

/* Every case at each built head-dim pair in the dQ mode the process reads (dq_tma); 0, 1 or 77. */
static int run_mode(void) {
  if (!td_available()) {
    printf("test_cuda_sm90_bwd: no CUDA device, skipped\n");
    return 77;
  }
  /* ATTN_EMU_FULL=1 runs the GPU's full case list on the emulator too (slow). */
  E = td_emulated() && !(getenv("ATTN_EMU_FULL") && atoi(getenv("ATTN_EMU_FULL")));
  const char *dims = attn_cuda_head_dims();
  printf("test_cuda_sm90_bwd on %s, dQ mode %s (ATTN_SM90_DQ=%d); head dims built: %s\n", td_name(),
         dq_tma ? "tma" : "atomic", dq_tma, dims);
  static const int dim[4][2] = {{128, 128}, {64, 64}, {256, 256}, {192, 128}};
  int any = 0;
  attn_cuda_set_hopper(1);
  for (int i = 0; i < 4; i++) {
    if (!gc_have_dims(&(gc_case){.D = dim[i][0], .Dv = dim[i][1], .dtype = ATTN_BF16})) {
      printf("test_cuda_sm90_bwd: head dims %d x %d not built, their cases skipped\n", dim[i][0], dim[i][1]);
      continue;
    }
    if (dq_tma && dim[i][0] > 128) {
      printf("test_cuda_sm90_bwd: head dims %d x %d add dQ by atomics in either mode: mode 0 runs them\n",
             dim[i][0], dim[i][1]);
      continue;
    }
    cur_dv = dim[i][1];
    any = 1;
    ran_sm90 = 0;
    cases(dim[i][0], dim[i][0] == 64 ? VS_MMA : 0);
    printf("test_cuda_sm90_bwd: %d cases ran the sm90 backward at head dims %d x %d, dQ mode %d\n",
           ran_sm90, dim[i][0], dim[i][1], dq_tma);
    /* the emulator models compute capability 9.0: every case that may take sm90 must */
    TU_CHECK(!td_emulated() || ran_sm90 >= 10, "only %d cases ran the sm90 backward at %d x %d",
             ran_sm90, dim[i][0], dim[i][1]);
  }
  attn_cuda_set_hopper(-1);
  cur_dv = 0;
  if (!any) {
    printf("test_cuda_sm90_bwd: head dims 64, 128, 256 and 192 x 128 not built, skipped\n");
    return 77;
  }
  return tu_finish(dq_tma ? "test_cuda_sm90_bwd (dQ mode tma)" : "test_cuda_sm90_bwd (dQ mode atomic)");
}

/* ATTN_SM90_DQ set: that mode alone. Unset: a child runs mode 1, the default (the tunable
 * is read once a process, before any device work), then this process mode 0. */
int main(void) {
  const char *env = getenv("ATTN_SM90_DQ");
  if (env && *env) {
    dq_tma = atoi(env) == 1;
    return run_mode();
  }
  fflush(stdout);
  const pid_t child = fork();
  if (child < 0) {
    perror("test_cuda_sm90_bwd: fork");
    return 1;
  }
  if (child == 0) {
    setenv("ATTN_SM90_DQ", "1", 1);
    dq_tma = 1;
    exit(run_mode());
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status)) {
    fprintf(stderr, "test_cuda_sm90_bwd: the dQ mode 1 process did not exit normally\n");
    return 1;
  }
  setenv("ATTN_SM90_DQ", "0", 1);
  const int tma_rc = WEXITSTATUS(status), atomic_rc = run_mode();
  if (tma_rc == 77 || atomic_rc == 77) return tma_rc == atomic_rc ? 77 : 1;
  return tma_rc || atomic_rc;
}
