/* test_cuda_sm90_fwd.c — the Hopper forward (fwd_sm90_body.cuh: TMA, wgmma, warp
 * specialisation) vs the float64 oracle, one shot and in block mode, at head dims 128, 64,
 * (Dqk, Dv) = (192, 128) and 256 (every case list runs at each built; the emulator trims
 * the 192 x 128 lists). At 256 the kernel's key tiles are 64 keys, so the same sizes cross
 * more tiles there.
 *
 * One shot: around its 128-row / 128-key tiles (and the 64-row consumer halves), Sq != Skv
 * both ways, every mask flag, GQA/MQA, strided views, empty rows, NaN/Inf in unseen keys,
 * +inf scores where the mask must win, a padded and poisoned O that must change only below
 * Sq and in the Dv columns; varlen and block masks must route to mma.sync.
 *
 * Block mode (attn_cuda_fwd_block, the state-carrying call of the ring): the sequence is
 * cut into 2 query parts x 3 key blocks (positions q_pos0 / k_pos0 within the whole
 * sequence, state rows at q_row0 = PADR + q_pos0 of a state with PADR poisoned rows on
 * either side), run from attn_cuda_state_init in a non-monotone key order (optionally one
 * key block split off into a second state and merged), then finalized (sinks enter
 * there) and judged against the oracle. The same chain runs three ways: every call on
 * the sm90 kernel, every call on mma.sync, and alternating, whose states must agree with
 * each other's conventions. After every call: the state rows outside the call and the
 * poisoned padding bit for bit unchanged, rows that see nothing of the block with l and
 * acc bit for bit and m to an ulp unchanged, O and LSE never written, and the path the
 * call took is the one attn_cuda_fwd_path names (sm90 on the emulator).
 *
 * bf16/f16 judged by the 2x same-precision rule (gpu_case.c). Exits 77 without a device;
 * on a device that is not compute capability 9.0 every case runs mma.sync (and must still
 * pass). Built for the GPU and for the emulator (ATTN_EMU_FULL=1: the GPU's case list). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_case.h"

static uint64_t next_seed = 2000;
static int E;                 /* emulated: fewer, smaller cases */
static int ran_sm90;          /* one-shot cases the sm90 forward took */
static int ran_sm90_block;    /* block calls the sm90 forward took */
static int ran_mla, ran_mla_block; /* the same at Dqk != Dv (192 x 128) */
static int ran_256, ran_256_block; /* the same at head dim 256 */

/* The forward of P just ran the family attn_cuda_fwd_path names for problem pb. */
static int check_path(const attn_cuda_problem *pb, const gc_case *c) {
  const char *want = attn_cuda_fwd_path(pb), *got = attn_cuda_last_fwd_path();
  char desc[600];
  gc_describe(c, desc, sizeof desc);
  TU_CHECK(!strcmp(want, got), "forward ran %s, expected %s: %s", got, want, desc);
  ran_mla += c->Dv && c->Dv != c->D && !strcmp(got, "sm90");
  ran_256 += c->D == 256 && !strcmp(got, "sm90");
  return !strcmp(got, "sm90");
}

/* ---- one shot ------------------------------------------------------------------------ */
enum { EXPECT_EMPTY_ROWS = GC_EXPECT_EMPTY_ROWS, EXPECT_UNSEEN_KEYS = GC_EXPECT_UNSEEN_KEYS, HOT = 4 };

/* Forward (and backward) of one case against the references; flags: NaN/Inf planted in
 * keys no query sees and the empty rows' exact values checked, or a hot key (HOT). */
static void run(gc_case c, int bwd, int flags) {
  if (!gc_have_dims(&c)) return;
  c.seed = next_seed++;
  gc_prob P;
  gc_out out = {0};
  gc_init(&P, &c);
  const int64_t empties = gc_empty_rows(&P);
  int64_t planted = 0;
  if (flags & (EXPECT_EMPTY_ROWS | EXPECT_UNSEEN_KEYS)) {
    planted = gc_plant_unseen(&P, NAN, -INFINITY, INFINITY, NAN);
    gc_sync(&P);
  }
  if (flags & HOT) {
    const int64_t masked = gc_make_hot(&P);
    gc_sync(&P);
    TU_CHECK(masked > 0 && masked < P.Sq, "case %s: the hot key is not masked for some rows only", c.name);
  }
  gc_expect_ok(gc_fwd(&P, &out), "attn_cuda_fwd", &c);
  ran_sm90 += check_path(&P.pb, &c);
  if (bwd) gc_expect_ok(gc_bwd(&P, &out, 0), "attn_cuda_bwd", &c);
  const int ok = gc_check(&P, &out, bwd, bwd ? "sm90 fwd + bwd" : "sm90 fwd");
  gc_expect_empty(&P, &out, &c, ok, empties, planted, flags);
  gc_out_free(&out);
  gc_free(&P);
}

/* The forward into a padded O ([B][Sq + 5][Hq][Dv + 8], poisoned): only rows below Sq and
 * the Dv columns change (the sm90 TMA store clips at the tensor's end), bit for bit what
 * the same forward wrote into the dense O that gc_check judged. */
static void run_padded_o(gc_case c) {
  if (!gc_have_dims(&c)) return;
  gc_prob P;
  gc_out out = {0};
  c.seed = next_seed++;
  gc_init(&P, &c);
  gc_expect_ok(gc_fwd(&P, &out), "attn_cuda_fwd", &c);
  gc_check(&P, &out, 0, "fwd");
  gc_out_free(&out);
  const int64_t S = P.Sq, H = P.Hq, D = P.Dv, sh = D + 8, ss = H * sh, sb = (S + 5) * ss;
  const size_t n = (size_t)(P.B * sb), nd = (size_t)gc_n_o(&P);
  uint16_t *dense = tu_alloc(nd * 2), *pad = tu_alloc(n * 2);
  void *d_pad = td_alloc(n * 2);
  td_download(dense, P.d_o, nd * 2);
  td_memset(d_pad, 0xFF, n * 2);
  const attn_cuda_view v = {d_pad, sb, ss, sh}, dv = gc_view(&P, P.d_o, S, H, D);
  gc_expect_ok(attn_cuda_fwd(&P.pb, v, P.d_lse, S, P.d_ws, P.ws_bytes, NULL), "attn_cuda_fwd (padded O)", &c);
  td_sync();
  td_download(pad, d_pad, n * 2);
  int64_t bad = 0;
  for (int64_t b = 0; b < P.B; b++)
    for (int64_t r = 0; r < S + 5; r++)
      for (int64_t h = 0; h < H; h++)
        for (int64_t d = 0; d < sh; d++) {
          const uint16_t want = r < S && d < D ? dense[b * dv.sb + r * dv.ss + h * dv.sh + d] : 0xFFFF;
          bad += pad[b * sb + r * ss + h * sh + d] != want;
        }
  ran_sm90 += check_path(&P.pb, &c);
  TU_CHECK(bad == 0, "padded O: %lld elements differ from the dense O or overwrote padding", (long long)bad);
  td_free(d_pad);
  free(dense);
  free(pad);
  gc_free(&P);
}

/* The one-shot cases at head dims (D, Dv); on the emulator, T (Dqk != Dv: the MLA shape,
 * whose case list trims to keep the emulated run short) takes fewer. */
static void sweep_one_shot(int D, int Dv) {
  const int T = E && D != Dv;
  static const int64_t sizes[][2] = {{1, 1},     {64, 64},   {65, 63},   {127, 129}, {129, 127},
                                     {128, 128}, {200, 333}, {333, 200}, {256, 1},   {1, 300},
                                     {1000, 1030}};
  static const int64_t emu_sizes[][2] = {{1, 1}, {65, 63}, {129, 200}, {200, 129}, {1, 130}};
  const int n = E ? (T ? 3 : 5) : (int)(sizeof sizes / sizeof sizes[0]);
  for (int i = 0; i < n; i++)
    for (int causal = 0; causal < 2; causal++) {
      gc_case c = {.name = "sm90 shape", .B = 1 + (i & 1), .Sq = E ? emu_sizes[i][0] : sizes[i][0],
                   .Skv = E ? emu_sizes[i][1] : sizes[i][1], .Hq = 2, .Hkv = 1, .D = D, .Dv = Dv,
                   .causal = causal, .bhsd = i % 3 == 1,
                   .dtype = ((i + causal) & 1) ? ATTN_F16 : ATTN_BF16};
      run(c, i == 2, 0);
    }
  /* every flag: window (both sides, left only), softcap, sinks, ALiBi, GQA / MQA */
  for (int m = 0; m < 32; m += E ? (T ? 7 : 3) : 1) {
    gc_case c = gc_flags_case("sm90 flags", m, E ? 150 : 300, E ? 170 : 280, 130);
    c.D = D, c.Dv = Dv;
    run(c, 0, 0);
  }
  /* many key tiles per CTA: every stage of the K/V ring reused, the pipelined steady
   * state, the warpgroups' first and last tiles apart (window), a CTA with one warpgroup idle */
  for (int m = T; m < 4; m += T ? 2 : 1) {
    gc_case c = {.name = "sm90 ring", .B = 1, .Sq = E ? 130 : 700, .Skv = E ? 700 : 1600,
                 .Hq = 2, .Hkv = 1, .D = D, .Dv = Dv, .causal = m & 1, .dtype = m & 1 ? ATTN_F16 : ATTN_BF16};
    if (m & 2) c.window = 1, c.wl = E ? 300 : 500, c.wr = (m & 1) ? -1 : 70, c.sinks = 1;
    run(c, 0, 0);
  }
  run((gc_case){.name = "sm90 causal Sq>Skv", .B = 1, .Sq = E ? 200 : 400, .Skv = 70, .Hq = 2,
                .Hkv = 1, .D = D, .Dv = Dv, .causal = 1, .sinks = 1, .dtype = ATTN_BF16}, 1, EXPECT_EMPTY_ROWS);
  run((gc_case){.name = "sm90 window off the end", .B = 1, .Sq = E ? 150 : 300, .Skv = 100,
                .Hq = 2, .Hkv = 2, .D = D, .Dv = Dv, .window = 1, .wl = 10, .wr = 5, .alibi = 1,
                .dtype = ATTN_F16}, 1, EXPECT_EMPTY_ROWS);
  run((gc_case){.name = "sm90 narrow window", .B = 1, .Sq = E ? 70 : 150, .Skv = E ? 300 : 500,
                .Hq = 2, .Hkv = 1, .D = D, .Dv = Dv, .window = 1, .wl = 3, .wr = 0, .softcap = 5.0f,
                .dtype = ATTN_BF16}, 1, EXPECT_UNSEEN_KEYS);
  run((gc_case){.name = "sm90 hot window", .B = 1, .Sq = E ? 130 : 200, .Skv = E ? 150 : 230,
                .Hq = 2, .Hkv = 2, .D = D, .Dv = Dv, .window = 1, .wl = 40, .wr = 17, .sinks = 1,
                .dtype = ATTN_BF16}, 1, HOT);
  run_padded_o((gc_case){.name = "sm90 padded O", .B = 2, .Sq = E ? 130 : 333, .Skv = 150,
                         .Hq = 2, .Hkv = 1, .D = D, .Dv = Dv, .causal = 1, .dtype = ATTN_BF16});
  /* routed to mma.sync: varlen, block masks */
  static const int32_t lq[] = {70, 1, 60}, lkv[] = {90, 33, 20};
  run((gc_case){.name = "sm90 -> mma varlen", .Hq = 2, .Hkv = 1, .D = D, .Dv = Dv, .nseq = 3, .lq = lq,
                .lkv = lkv, .causal = 1, .dtype = ATTN_BF16}, 0, 0);
  run((gc_case){.name = "sm90 -> mma block mask", .B = 1, .Sq = 150, .Skv = 140, .Hq = 2, .Hkv = 1,
                .D = D, .Dv = Dv, .bq = 32, .bk = 64, .dtype = ATTN_F16}, 0, 0);
  if (!E) /* (the float64 oracle of one takes seconds on the host: f16 at 128 only) */
    for (int dt = 0; dt < (D == 128 ? 2 : 1); dt++)
      run((gc_case){.name = "sm90 big", .B = 2, .Sq = 2048, .Skv = 2048, .Hq = 4, .Hkv = 2,
                    .D = D, .Dv = Dv, .causal = 1, .sinks = 1, .dtype = dt ? ATTN_F16 : ATTN_BF16}, 0, 0);
}

/* ---- block mode ---------------------------------------------------------------------- */
enum { PADR = 5 }; /* poisoned state rows before and after the real ones, per (b, h) */

/* A float32 state of P's rows at PADR .. PADR + Sq - 1 of PADR + Sq + PADR rows, every
 * padding word NaN bits (0xFFFFFFFF), the real rows initialised. */
typedef struct {
  float *dev;
  attn_state st;
  int64_t n; /* floats: m, l, acc */
} pstate;

static void pstate_make(pstate *s, const gc_prob *P, int64_t pad) {
  const int64_t rows = P->Sq + 2 * pad, n = P->B * P->Hq * rows;
  s->n = n * (2 + P->Dv);
  s->dev = td_alloc((size_t)s->n * 4);
  attn_state st = {s->dev, s->dev + n, s->dev + 2 * n, P->B, P->Hq, rows, P->Dv};
  s->st = st;
  gc_expect_ok(attn_cuda_state_init(&s->st, NULL), "attn_cuda_state_init", &P->c);
  td_sync();
  float *h = tu_alloc((size_t)s->n * 4);
  td_download(h, s->dev, (size_t)s->n * 4);
  for (int64_t bh = 0; bh < P->B * P->Hq; bh++)
    for (int64_t r = 0; r < rows; r++) {
      if (r >= pad && r < pad + P->Sq) continue;
      const int64_t row = bh * rows + r;
      memset(h + row, 0xFF, 4);
      memset(h + n + row, 0xFF, 4);
      memset(h + 2 * n + row * P->Dv, 0xFF, (size_t)P->Dv * 4);
    }
  td_upload(s->dev, h, (size_t)s->n * 4);
  free(h);
}

static float *pstate_get(const pstate *s) {
  float *h = tu_alloc((size_t)s->n * 4);
  td_sync();
  td_download(h, s->dev, (size_t)s->n * 4);
  return h;
}

/* Words of the state that the call for rows [q0, q1) x keys [k0, k1) changed but must not
 * have: every word of other rows (padding included), and of rows that see nothing of the
 * keys l and acc bit for bit, m to an ulp (m goes through log2 units and back). Counts
 * those rows in *blind. */
static int64_t state_changes(const gc_prob *P, const float *was, const float *now, int64_t q0,
                             int64_t q1, int64_t k0, int64_t k1, int64_t *blind) {
  const int64_t rows = P->Sq + 2 * PADR, n = P->B * P->Hq * rows;
  int64_t bad = 0;
  for (int64_t bh = 0; bh < P->B * P->Hq; bh++)
    for (int64_t r = 0; r < rows; r++) {
      const int64_t i = r - PADR, row = bh * rows + r;
      int sees = 0;
      if (i >= q0 && i < q1)
        for (int64_t j = k0; j < k1 && !sees; j++) sees = P->vis[i * P->Skv + j];
      if (sees) continue;
      const int inside = i >= q0 && i < q1;
      *blind += inside;
      if (inside && was[row] != now[row]) {
        const float d = fabsf(now[row] - was[row]);
        bad += !(d <= 0x1p-22f * fabsf(was[row]));
      } else if (!inside) {
        bad += memcmp(was + row, now + row, 4) != 0;
      }
      bad += memcmp(was + n + row, now + n + row, 4) != 0;
      bad += memcmp(was + 2 * n + row * P->Dv, now + 2 * n + row * P->Dv, (size_t)P->Dv * 4) != 0;
    }
  return bad;
}

/* The problem of query rows [q0, q1) x keys [k0, k1) of P: positions within the whole
 * sequence, state rows from PADR + q0. */
static attn_cuda_problem block_problem(const gc_prob *P, int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
  attn_cuda_problem b = P->pb;
  b.sq = q1 - q0;
  b.skv = k1 - k0;
  b.q_pos0 = q0;
  b.q_row0 = PADR + q0;
  b.k_pos0 = k0;
  const size_t e = gc_elem_bytes(P);
  b.q.p = (char *)b.q.p + q0 * b.q.ss * e;
  b.k.p = (char *)b.k.p + k0 * b.k.ss * e;
  b.v.p = (char *)b.v.p + k0 * b.v.ss * e;
  return b;
}

enum { MODE_MMA, MODE_SM90, MODE_MIXED };      /* run_chain: the kernel of each call */
enum { MERGE = 1, BLIND_ROWS = 2, PLANT = 4 }; /* run_block flags */

/* The block calls of P (query parts qs[0..2] x key blocks ks[0..3], keys in the order 2,
 * 0, 1; with MERGE key block 1 into s2, merged later) on the kernels of `mode`, with
 * the checks of the module comment after every call. Returns the rows that saw nothing of
 * a call's keys. */
static int64_t run_chain(gc_prob *P, const int64_t *qs, const int64_t *ks, int mode, int flags,
                         pstate *s, pstate *s2) {
  static const int order[3] = {2, 0, 1};
  int64_t blind = 0, calls = 0;
  char desc[600];
  gc_describe(&P->c, desc, sizeof desc);
  for (int qi = 0; qi < 2; qi++)
    for (int x = 0; x < 3; x++) {
      const int ki = order[x];
      if (qs[qi] == qs[qi + 1] || ks[ki] == ks[ki + 1]) continue;
      pstate *into = (flags & MERGE) && ki == 1 ? s2 : s;
      const attn_cuda_problem bp = block_problem(P, qs[qi], qs[qi + 1], ks[ki], ks[ki + 1]);
      const int sm90 = mode == MODE_SM90 || (mode == MODE_MIXED && (calls & 1));
      float *was = pstate_get(into);
      attn_cuda_set_hopper(sm90);
      gc_expect_ok(attn_cuda_fwd_block(&bp, &into->st, P->d_ws, P->ws_bytes, NULL),
                   "attn_cuda_fwd_block", &P->c);
      const char *want = sm90 ? attn_cuda_fwd_path(&bp) : "mma", *got = attn_cuda_last_fwd_path();
      TU_CHECK(!strcmp(want, got), "block call %lld ran %s, expected %s: %s", (long long)calls,
               got, want, desc);
      ran_sm90_block += !strcmp(got, "sm90");
      ran_mla_block += P->Dv != P->D && !strcmp(got, "sm90");
      ran_256_block += P->D == 256 && !strcmp(got, "sm90");
      float *now = pstate_get(into);
      const int64_t bad = state_changes(P, was, now, qs[qi], qs[qi + 1], ks[ki], ks[ki + 1], &blind);
      TU_CHECK(bad == 0, "block call rows [%lld, %lld) x keys [%lld, %lld) (%s): %lld state words "
               "changed that must not: %s", (long long)qs[qi], (long long)qs[qi + 1],
               (long long)ks[ki], (long long)ks[ki + 1], got, (long long)bad, desc);
      free(was);
      free(now);
      calls++;
    }
  attn_cuda_set_hopper(1);
  return blind;
}

/* The real rows of a padded state, as a dense host state [B,Hq,Sq] m, l then acc. */
static float *dense_rows(const gc_prob *P, const float *h) {
  const int64_t rows = P->Sq + 2 * PADR, n = P->B * P->Hq * rows, nd = P->B * P->Hq * P->Sq;
  float *d = tu_alloc((size_t)(nd * (2 + P->Dv)) * 4);
  for (int64_t bh = 0; bh < P->B * P->Hq; bh++)
    for (int64_t i = 0; i < P->Sq; i++) {
      const int64_t src = bh * rows + PADR + i, dst = bh * P->Sq + i;
      d[dst] = h[src];
      d[nd + dst] = h[n + src];
      memcpy(d + 2 * nd + dst * P->Dv, h + 2 * n + src * P->Dv, (size_t)P->Dv * 4);
    }
  return d;
}

/* Finalizes a chain's state(s) (s2 merged into s first when given) into P's O and LSE;
 * returns the dense host state (after the merge) for state comparisons. */
static float *finish(gc_prob *P, pstate *s, pstate *s2, gc_out *out) {
  const int64_t nd = P->B * P->Hq * P->Sq, nf = nd * (2 + P->Dv);
  float *hs = pstate_get(s), *dense = dense_rows(P, hs), *dev = td_alloc((size_t)nf * 4);
  free(hs);
  attn_state st = {dev, dev + nd, dev + 2 * nd, P->B, P->Hq, P->Sq, P->Dv};
  td_upload(dev, dense, (size_t)nf * 4);
  if (s2) {
    float *h2 = pstate_get(s2), *d2 = dense_rows(P, h2), *dev2 = td_alloc((size_t)nf * 4);
    attn_state st2 = {dev2, dev2 + nd, dev2 + 2 * nd, P->B, P->Hq, P->Sq, P->Dv};
    td_upload(dev2, d2, (size_t)nf * 4);
    gc_expect_ok(attn_cuda_state_merge(&st, &st2, NULL), "attn_cuda_state_merge", &P->c);
    td_sync();
    td_download(dense, dev, (size_t)nf * 4);
    td_free(dev2);
    free(h2);
    free(d2);
  }
  gc_expect_ok(gc_finalize(P, &st, out), "attn_cuda_finalize", &P->c);
  td_free(dev);
  return dense;
}

/* Two dense states of the same rows (the sm90 and the mma.sync chains): the same rows
 * empty (m = -inf, l = 0, acc = 0 exactly), m + ln l and acc / l equal up to float32 order
 * and P's rounding (acc / l within twice the naive same-precision O error). */
static void same_states(gc_prob *P, const float *a, const float *b) {
  const int64_t nd = P->B * P->Hq * P->Sq;
  double naive = 0.0, maxo = 0.0, worst_o = 0.0, worst_lse = 0.0;
  for (int64_t x = 0; x < gc_n_o(P); x++) {
    naive = fmax(naive, fabs((double)P->no[x] - P->ro[x]));
    maxo = fmax(maxo, fabs(P->ro[x]));
  }
  int64_t bad_empty = 0;
  for (int64_t r = 0; r < nd; r++) {
    const float *acc_a = a + 2 * nd + r * P->Dv, *acc_b = b + 2 * nd + r * P->Dv;
    if (a[r] == -INFINITY || b[r] == -INFINITY) {
      int nz = a[r] != b[r] || a[nd + r] != 0.0f || b[nd + r] != 0.0f;
      for (int64_t d = 0; d < P->Dv; d++) nz |= acc_a[d] != 0.0f || acc_b[d] != 0.0f;
      bad_empty += nz;
      continue;
    }
    const double la = a[r] + log((double)a[nd + r]), lb = b[r] + log((double)b[nd + r]);
    const double e = fabs(la - lb) / (1.0 + fabs(lb));
    worst_lse = e > worst_lse || isnan(e) ? (isnan(e) ? INFINITY : e) : worst_lse;
    for (int64_t d = 0; d < P->Dv; d++) {
      const double eo = fabs((double)acc_a[d] / a[nd + r] - (double)acc_b[d] / b[nd + r]);
      worst_o = eo > worst_o || isnan(eo) ? (isnan(eo) ? INFINITY : eo) : worst_o;
    }
  }
  char desc[600];
  gc_describe(&P->c, desc, sizeof desc);
  TU_CHECK(bad_empty == 0 && worst_lse <= 1e-5 && worst_o <= 2 * naive + 1e-4 * maxo + 1e-6,
           "sm90 vs mma.sync block state: %lld empty rows differ, m + ln l %.2e (tol 1e-5), "
           "acc / l %.2e (tol %.2e): %s", (long long)bad_empty, worst_lse, worst_o,
           2 * naive + 1e-4 * maxo + 1e-6, desc);
}

/* One block-mode case: the chains on sm90, mma.sync and alternating (module comment). */
static void run_block(gc_case c, int flags) {
  if (!gc_have_dims(&c)) return;
  c.seed = next_seed++;
  gc_prob P;
  gc_init(&P, &c);
  if (flags & PLANT) {
    TU_CHECK(gc_plant_unseen(&P, INFINITY, NAN, NAN, -INFINITY) > 0, "case %s has no unseen keys", c.name);
    gc_sync(&P);
  }
  gc_ref(&P, 0);
  const int64_t ks[4] = {0, P.Skv / 3, P.Skv / 3 + 1 + P.Skv / 4, P.Skv};
  const int64_t qs[3] = {0, P.Sq / 2 + 1 > P.Sq ? P.Sq : P.Sq / 2 + 1, P.Sq};
  char desc[600];
  gc_describe(&c, desc, sizeof desc);
  float *dense[3] = {NULL, NULL, NULL};
  static const char *tags[3] = {"block mode (mma.sync)", "block mode (sm90)", "block mode (sm90 + mma.sync)"};
  for (int mode = MODE_MMA; mode <= MODE_MIXED; mode++) {
    pstate s, s2;
    pstate_make(&s, &P, PADR);
    if (flags & MERGE) pstate_make(&s2, &P, PADR);
    td_memset(P.d_o, 0xFF, (size_t)gc_n_o(&P) * gc_elem_bytes(&P));
    td_memset(P.d_lse, 0xFF, (size_t)gc_n_lse(&P) * 4);
    const int64_t blind = run_chain(&P, qs, ks, mode, flags, &s, &s2);
    TU_CHECK(!(flags & BLIND_ROWS) || blind > 0, "case %s: no call has rows that see nothing", c.name);
    /* block mode writes neither O nor LSE */
    const size_t ob = (size_t)gc_n_o(&P) * gc_elem_bytes(&P), lb = (size_t)gc_n_lse(&P) * 4;
    unsigned char *raw = tu_alloc(ob + lb);
    td_download(raw, P.d_o, ob);
    td_download(raw + ob, P.d_lse, lb);
    size_t written = 0;
    for (size_t x = 0; x < ob + lb; x++) written += raw[x] != 0xFF;
    free(raw);
    TU_CHECK(written == 0, "block mode wrote %zu bytes of O / LSE: %s", written, desc);
    gc_out out = {0};
    dense[mode] = finish(&P, &s, (flags & MERGE) ? &s2 : NULL, &out);
    if (gc_check(&P, &out, 0, tags[mode])) {
      const int64_t bad = gc_empty_wrong(&P, &out);
      TU_CHECK(bad == 0, "%s: %lld wrong exact values in empty rows: %s", tags[mode], (long long)bad, desc);
    }
    gc_out_free(&out);
    td_free(s.dev);
    if (flags & MERGE) td_free(s2.dev);
  }
  same_states(&P, dense[MODE_SM90], dense[MODE_MMA]);
  same_states(&P, dense[MODE_MIXED], dense[MODE_MMA]);
  for (int i = 0; i < 3; i++) free(dense[i]);
  gc_free(&P);
}

static void sweep_block(int D, int Dv) {
  const int T = E && D != Dv; /* as in sweep_one_shot */
  /* every flag (window, softcap + f16, sinks + [B,H,S,D], ALiBi, GQA / MQA), causal and not */
  for (int m = 0; m < 32; m += E ? (T ? 9 : 5) : 1) {
    gc_case c = gc_flags_case("sm90 block flags", m, E ? 150 : 300, E ? 170 : 280, 60);
    c.D = D, c.Dv = Dv;
    run_block(c, m % 3 == 0 ? MERGE : 0);
  }
  run_block((gc_case){.name = "sm90 block API", .B = 1, .Sq = 90, .Skv = 150, .Hq = 2, .Hkv = 1,
                      .D = D, .Dv = Dv, .causal = 1, .sinks = 1, .dtype = ATTN_BF16}, MERGE | BLIND_ROWS);
  /* several work tiles per CTA (the state loaded at each) and key blocks of several tiles */
  run_block((gc_case){.name = "sm90 block long", .B = 2, .Sq = E ? 300 : 700, .Skv = E ? 700 : 1500,
                      .Hq = 2, .Hkv = 1, .D = D, .Dv = Dv, .alibi = 1, .dtype = ATTN_F16}, 0);
  run_block((gc_case){.name = "sm90 block long causal", .B = 1, .Sq = E ? 300 : 900,
                      .Skv = E ? 500 : 1100, .Hq = 3, .Hkv = 1, .D = D, .Dv = Dv, .causal = 1, .sinks = 1,
                      .softcap = 3.0f, .dtype = ATTN_BF16}, MERGE | BLIND_ROWS);
  /* rows empty in every block, rows empty in some */
  run_block((gc_case){.name = "sm90 block causal Sq>Skv", .B = 1, .Sq = E ? 200 : 400, .Skv = 70,
                      .Hq = 2, .Hkv = 1, .D = D, .Dv = Dv, .causal = 1, .sinks = 1, .dtype = ATTN_BF16},
            BLIND_ROWS);
  run_block((gc_case){.name = "sm90 block window off the end", .B = 1, .Sq = E ? 150 : 300,
                      .Skv = 100, .Hq = 2, .Hkv = 2, .D = D, .Dv = Dv, .window = 1, .wl = 10, .wr = 5,
                      .alibi = 1, .dtype = ATTN_F16}, BLIND_ROWS | MERGE);
  run_block((gc_case){.name = "sm90 block narrow window", .B = 1, .Sq = E ? 70 : 150,
                      .Skv = E ? 300 : 500, .Hq = 2, .Hkv = 1, .D = D, .Dv = Dv, .window = 1, .wl = 3,
                      .wr = 0, .softcap = 5.0f, .dtype = ATTN_BF16}, BLIND_ROWS | PLANT);
  /* routed to mma.sync in block mode too: varlen, block masks */
  static const int32_t lq[] = {70, 1, 60}, lkv[] = {90, 33, 20};
  run_block((gc_case){.name = "sm90 block -> mma varlen", .Hq = 2, .Hkv = 1, .D = D, .Dv = Dv, .nseq = 3,
                      .lq = lq, .lkv = lkv, .causal = 1, .dtype = ATTN_BF16}, 0);
  run_block((gc_case){.name = "sm90 block -> mma block mask", .B = 1, .Sq = 150, .Skv = 140,
                      .Hq = 2, .Hkv = 1, .D = D, .Dv = Dv, .bq = 32, .bk = 64, .dtype = ATTN_F16}, 0);
}

int main(void) {
  if (!td_available()) {
    printf("test_cuda_sm90_fwd: no CUDA device, skipped\n");
    return 77;
  }
  E = td_emulated() && !(getenv("ATTN_EMU_FULL") && atoi(getenv("ATTN_EMU_FULL")));
  const char *dims = attn_cuda_head_dims();
  printf("test_cuda_sm90_fwd on %s; head dims built: %s\n", td_name(), dims);
  if (!gc_have_dims(&(gc_case){.D = 128, .dtype = ATTN_BF16})) {
    printf("test_cuda_sm90_fwd: head dim 128 not built, skipped\n");
    return 77;
  }
  attn_cuda_set_hopper(1);
  /* no packed GQA (it would send the small GQA cases to mma.sync): this test is the sm90
   * kernel's, test_cuda_decode the decode forms' */
  attn_cuda_set_decode(0, 1);
  /* the head dims with sm90 instances (64, 192 x 128 and 256: if built) */
  static const int hd[][2] = {{128, 128}, {64, 64}, {192, 128}, {256, 256}};
  for (int i = 0; i < 4; i++) {
    sweep_one_shot(hd[i][0], hd[i][1]);
    sweep_block(hd[i][0], hd[i][1]);
  }
  attn_cuda_set_hopper(-1);
  attn_cuda_set_decode(-1, -1);
  printf("test_cuda_sm90_fwd: %d one-shot cases and %d block calls ran the sm90 forward "
         "(%d and %d at 192 x 128, %d and %d at 256)\n", ran_sm90, ran_sm90_block, ran_mla,
         ran_mla_block, ran_256, ran_256_block);
  /* the emulator models compute capability 9.0: every case that may take sm90 must */
  TU_CHECK(!td_emulated() || (ran_sm90 >= 20 && ran_sm90_block >= 50),
           "only %d one-shot cases and %d block calls ran the sm90 forward", ran_sm90, ran_sm90_block);
  TU_CHECK(!td_emulated() || !gc_have_dims(&(gc_case){.D = 192, .Dv = 128, .dtype = ATTN_BF16}) ||
               (ran_mla >= 10 && ran_mla_block >= 20),
           "only %d one-shot cases and %d block calls ran the sm90 forward at 192 x 128", ran_mla,
           ran_mla_block);
  TU_CHECK(!td_emulated() || !gc_have_dims(&(gc_case){.D = 256, .dtype = ATTN_BF16}) ||
               (ran_256 >= 20 && ran_256_block >= 50),
           "only %d one-shot cases and %d block calls ran the sm90 forward at 256", ran_256,
           ran_256_block);
  return tu_finish("test_cuda_sm90_fwd");
}
