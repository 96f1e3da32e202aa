/* test_dtypes.c — bf16 and fp16 storage on the CPU backend (float32 accumulation and
 * state; gradients float32): every mask flag on and off, shapes around the tiles, head
 * dims, strided views, the block API, on the AVX-512 and the scalar paths. Each case is
 * judged three ways:
 *  - against the float64 oracle on the rounded inputs (O within its one rounding);
 *  - bitwise against the float32 path on the same values: O = round(O_f32), LSE equal;
 *  - the gradients bitwise against the float32 path's backward from the same rounded O
 *    and LSE: the bf16 / f16 path converts rows to float32 and then runs the float32
 *    kernels' arithmetic, in the same order.
 * And: the conversions of special values (NaN, Inf, subnormals, ties, overflow) against
 * the tests' own rounding; mixed dtypes rejected with a message naming the tensor.
 * With the AMX tiles off (cfg.cpu_amx = -1): test_bf16_tiles judges those.
 * Usage: test_dtypes flags|shapes|scalar|block|api (one ctest each). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_case.h"

static attn_ctx_t ctx;
static uint64_t next_seed = 9000;

static int64_t bits_differ(const float *a, const float *b, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) bad += memcmp(&a[i], &b[i], 4) != 0;
  return bad;
}

/* The float32 path on the values the low-precision run was given (P's rounded arrays):
 * forward (after rounding O) and backward (from lo's own O and LSE) bitwise. */
static void pair_f32(tc_prob *P, const tc_out *lo, int bwd) {
  const int dt = P->c.dtype;
  attn_tensor q = attn_tensor_f32(P->q, P->B, P->Sq, P->Hq, P->Dqk);
  attn_tensor k = attn_tensor_f32(P->k, P->B, P->Skv, P->Hkv, P->Dqk);
  attn_tensor v = attn_tensor_f32(P->v, P->B, P->Skv, P->Hkv, P->Dv);
  attn_tensor dO = attn_tensor_f32(P->dout, P->B, P->Sq, P->Hq, P->Dv);
  float *o = tu_falloc(tc_n_o(P)), *lse = tu_falloc(tc_n_lse(P));
  attn_tensor to = attn_tensor_f32(o, P->B, P->Sq, P->Hq, P->Dv);
  char desc[512];
  tc_describe(&P->c, desc, sizeof desc);
  attn_status st = attn_fwd(ctx, &P->spec, &q, &k, &v, &to, lse);
  TU_CHECK(st == ATTN_OK, "f32 forward: %s in %s", attn_last_error(), desc);
  for (int64_t i = 0; i < tc_n_o(P); i++) o[i] = tu_round(o[i], dt);
  int64_t bo = bits_differ(lo->o, o, tc_n_o(P)), bl = bits_differ(lo->lse, lse, tc_n_lse(P));
  TU_CHECK(bo == 0 && bl == 0, "%lld O and %lld LSE elements differ from the float32 path's "
           "(O rounded) in %s", (long long)bo, (long long)bl, desc);
  if (bwd) {
    /* the low-precision run's O (rounded, as float32) and LSE feed the float32 backward */
    attn_tensor tlo = attn_tensor_f32(lo->o, P->B, P->Sq, P->Hq, P->Dv);
    float *dq = tu_falloc(tc_n_q(P)), *dk = tu_falloc(tc_n_k(P)), *dv = tu_falloc(tc_n_v(P));
    float *ds = tu_falloc(P->Hq);
    attn_tensor tdq = attn_tensor_f32(dq, P->B, P->Sq, P->Hq, P->Dqk);
    attn_tensor tdk = attn_tensor_f32(dk, P->B, P->Skv, P->Hkv, P->Dqk);
    attn_tensor tdv = attn_tensor_f32(dv, P->B, P->Skv, P->Hkv, P->Dv);
    st = attn_bwd(ctx, &P->spec, &q, &k, &v, &tlo, lo->lse, &dO, &tdq, &tdk, &tdv, ds);
    TU_CHECK(st == ATTN_OK, "f32 backward: %s in %s", attn_last_error(), desc);
    int64_t bq = bits_differ(lo->dq, dq, tc_n_q(P)), bk = bits_differ(lo->dk, dk, tc_n_k(P));
    int64_t bv = bits_differ(lo->dv, dv, tc_n_v(P));
    int64_t bs = P->c.sinks ? bits_differ(lo->ds, ds, P->Hq) : 0;
    TU_CHECK(bq + bk + bv + bs == 0, "dQ %lld, dK %lld, dV %lld, dsinks %lld elements differ "
             "from the float32 backward's on the same values in %s", (long long)bq,
             (long long)bk, (long long)bv, (long long)bs, desc);
    free(dq);
    free(dk);
    free(dv);
    free(ds);
  }
  free(o);
  free(lse);
}

static void run(tc_case c) {
  c.seed = next_seed++;
  tc_prob P;
  tc_out out;
  tc_init(&P, &c);
  tc_lib(ctx, &P, &out, c.bwd);
  if (tc_check(&P, &out, c.bwd, attn_ctx_backend_name(ctx))) pair_f32(&P, &out, c.bwd);
  tc_out_free(&out);
  tc_free(&P);
}

/* All 128 combinations of causal, window, softcap, sinks, alibi, varlen and block mask
 * (tc_flags_case), bf16 or f16 by the parity of the bits set, so each flag meets both
 * dtypes on and off. */
static void sweep_flags(int64_t B, int64_t Sq, int64_t Skv, int Hq, int Hkv, int Dqk, int Dv,
                        const int32_t *lq, const int32_t *lkv) {
  for (int m = 0; m < 128; m++) {
    tc_case shape = {.B = B, .Sq = Sq, .Skv = Skv, .Hq = Hq, .Hkv = Hkv, .Dqk = Dqk, .Dv = Dv,
                     .bwd = 1, .dtype = __builtin_popcount((unsigned)m) & 1 ? ATTN_F16 : ATTN_BF16};
    run(tc_flags_case(shape, m, lq, lkv));
  }
}

static void flags(void) {
  sweep_flags(1, 113, 203, 3, 1, 32, 24, (const int32_t[]){40, 1, 72},
              (const int32_t[]){70, 33, 100});
  sweep_flags(2, 203, 113, 4, 2, 128, 64, (const int32_t[]){100, 3, 100},
              (const int32_t[]){50, 60, 3});
}

/* Lengths around the 128-row / 128-key tiles, Sq != Skv both ways, GQA/MQA, the head dims
 * (odd ones take the masked vector tails of the converters), both dtypes. */
static void shapes(void) {
  static const int64_t sizes[][2] = {{1, 1},    {127, 129}, {129, 127}, {128, 128},
                                     {239, 1},  {1, 239},   {257, 255}, {2, 130}};
  static const int dims[][2] = {{64, 0}, {128, 0}, {256, 0}, {192, 128}, {7, 0}, {33, 65},
                                {16, 0}, {1, 17}};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    for (int causal = 0; causal < 2; causal++) {
      const int *d = dims[(i * 2 + (size_t)causal) % (sizeof dims / sizeof dims[0])];
      run((tc_case){.name = "shape", .B = 2, .Sq = sizes[i][0], .Skv = sizes[i][1], .Hq = 4,
                    .Hkv = causal ? 1 : 2, .Dqk = d[0], .Dv = d[1], .causal = causal,
                    .bwd = 1, .bhsd = (int)(i & 1), .dtype = (i + causal) & 1 ? ATTN_F16 : ATTN_BF16});
    }
  for (int dt = ATTN_BF16; dt <= ATTN_F16; dt++) {
    run((tc_case){.name = "big", .B = 1, .Sq = 1000, .Skv = 1030, .Hq = 2, .Hkv = 1,
                  .Dqk = 128, .causal = 1, .sinks = 1, .bwd = 1, .dtype = dt});
    run((tc_case){.name = "decode", .B = 2, .Sq = 1, .Skv = 3000, .Hq = 8, .Hkv = 2,
                  .Dqk = 64, .bwd = 1, .dtype = dt});
    run((tc_case){.name = "wide values", .B = 1, .Sq = 70, .Skv = 90, .Hq = 1, .Hkv = 1,
                  .Dqk = 64, .scale = 0.3f, .amp = 4.0, .bwd = 1, .dtype = dt});
  }
}

/* The block API on low-precision inputs: the keys in 3 blocks folded into a float32
 * state, finalize into a bf16/f16 O; the backward in the same 3 key blocks. Against the
 * oracle (a state round trip is not bitwise the one-shot path). */
static void block(void) {
  for (int dt = ATTN_BF16; dt <= ATTN_F16; dt++)
    for (int causal = 0; causal < 2; causal++) {
      tc_case c = {.name = "block", .B = 2, .Sq = 150, .Skv = 300, .Hq = 4, .Hkv = 2, .Dqk = 64,
                   .Dv = 32, .causal = causal, .sinks = 1, .alibi = causal, .bhsd = causal,
                   .dtype = dt, .seed = next_seed++};
      tc_prob P;
      tc_init(&P, &c);
      static const int64_t cuts[] = {0, 77, 200, 300};
      attn_state st = tc_fwd_blocks(ctx, &P, cuts, 3);
      tc_out out = {0};
      out.o = tu_falloc(tc_n_o(&P));
      out.lse = tu_falloc(tc_n_lse(&P));
      uint16_t *ob = tu_alloc((size_t)tc_n_o(&P) * 2);
      memset(ob, 0xFF, (size_t)tc_n_o(&P) * 2);
      attn_tensor to = attn_tensor_contig(ob, (attn_dtype)dt, ATTN_DEVICE_HOST, P.B, P.Sq, P.Hq, P.Dv);
      TU_CHECK(attn_state_finalize(ctx, &P.spec, &st, &to, out.lse) == ATTN_OK, "finalize: %s",
               attn_last_error());
      for (int64_t i = 0; i < tc_n_o(&P); i++) out.o[i] = tu_from_bits(ob[i], dt);
      /* backward: prepare once, then the same key blocks into float32 gradients */
      float *delta = tu_falloc(P.B * P.Hq * P.Sq);
      out.dq = calloc((size_t)tc_n_q(&P), 4);
      out.dk = calloc((size_t)tc_n_k(&P), 4);
      out.dv = calloc((size_t)tc_n_v(&P), 4);
      out.ds = calloc((size_t)P.Hq, 4);
      TU_CHECK(attn_bwd_prepare(ctx, &P.spec, &to, &P.tdo, out.lse, delta, out.ds) == ATTN_OK,
               "bwd_prepare: %s", attn_last_error());
      attn_tensor dq = attn_tensor_f32(out.dq, P.B, P.Sq, P.Hq, P.Dqk);
      for (int b = 0; b < 3; b++) {
        int64_t n = cuts[b + 1] - cuts[b];
        attn_tensor k = tc_rows(&P.tk, cuts[b], n), v = tc_rows(&P.tv, cuts[b], n);
        attn_tensor dk = attn_tensor_f32(out.dk, P.B, P.Skv, P.Hkv, P.Dqk);
        attn_tensor dv = attn_tensor_f32(out.dv, P.B, P.Skv, P.Hkv, P.Dv);
        dk = tc_rows(&dk, cuts[b], n);
        dv = tc_rows(&dv, cuts[b], n);
        attn_block_pos pos = {.q_row0 = 0, .q_pos0 = 0, .k_pos0 = cuts[b], .seq_q = P.Sq,
                              .seq_kv = P.Skv};
        attn_status s = attn_bwd_block(ctx, &P.spec, &P.tq, &k, &v, &P.tdo, out.lse, delta,
                                       P.Sq, &dq, &dk, &dv, &pos);
        TU_CHECK(s == ATTN_OK, "bwd_block %d: %s", b, attn_last_error());
      }
      out.fwd_status = out.bwd_status = ATTN_OK;
      tc_check(&P, &out, 1, "block API");
      free(delta);
      free(ob);
      free(st.m);
      free(st.l);
      free(st.acc);
      tc_out_free(&out);
      tc_free(&P);
    }
}

/* Special values and ties through the library's converters (AVX-512 or scalar rows).
 * Keys 0 and 1 have equal K rows; with causal Sq = Skv = 2, query 0 sees key 0 only
 * (O_0 = V_0 exactly: NaN, Inf, subnormals, signed zero, the largest values) and query 1
 * sees both with equal weights (O_1 = (V_0 + V_1) / 2 in float32 — 3e38 + 3e38 is inf —
 * rounded on output: ties to even, subnormal results, values near the top of f16). */
static void specials(int dt) {
  static const float v0[] = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 65520.0f, 6.0e-8f,
                             0x1p-24f, 0x1p-133f, 1.0f, 0x1.004p0f, 1.0f, 0x1.02p0f, 65504.0f,
                             3.0e38f, INFINITY, -INFINITY, NAN, 1e5f, -1e-40f, 0x1p-14f};
  static const float v1[] = {0.0f, -0.0f, -1.0f, 2.5f, 65472.0f, 1.0f, 6.0e-8f,
                             0x1p-23f, 0x1p-132f, 0x1.004p0f, 0x1.008p0f, 0x1.02p0f, 0x1.04p0f,
                             65504.0f, 3.0e38f, 1.0f, -1.0f, 0.0f, -1e5f, 1e-40f, 0x1.ffcp-15f};
  const int n = (int)(sizeof v0 / sizeof v0[0]);
  tc_case c = {.name = "specials", .B = 1, .Sq = 2, .Skv = 2, .Hq = 1, .Hkv = 1, .Dqk = 4,
               .Dv = n, .causal = 1, .dtype = dt, .seed = next_seed++};
  tc_prob P;
  tc_init(&P, &c);
  for (int d = 0; d < n; d++) P.v[d] = v0[d], P.v[n + d] = v1[d];
  for (int d = 0; d < 4; d++) P.k[4 + d] = P.k[d];
  tc_sync(&P); /* rounds V to the dtype (the tests' own rounding) */
  tc_out out;
  tc_lib(ctx, &P, &out, 0);
  int64_t bad = 0;
  const char *name = dt == ATTN_BF16 ? "bf16" : "f16";
  for (int d = 0; d < 2 * n; d++) {
    float a = P.v[d % n], b = P.v[n + d % n];
    float want = d < n ? a : tu_round((a + b) * 0.5f, dt); /* float32 acc, as the kernel */
    float got = out.o[d];
    int same = got == want || (isnan(got) && isnan(want));
    bad += !same;
    if (!same)
      fprintf(stderr, "  %s O[%d][%d] = %a, want %a (V %a, %a)\n", name, d / n, d % n,
              (double)got, (double)want, (double)a, (double)b);
  }
  TU_CHECK(bad == 0 && out.fwd_status == ATTN_OK, "%lld special values wrong (%s, %s)",
           (long long)bad, name, attn_ctx_backend_name(ctx));
  tc_out_free(&out);
  tc_free(&P);
}

/* Mixed dtypes: an error naming the tensor, outputs untouched. */
static void api(void) {
  float f[64 * 4] = {0};
  uint16_t h[64 * 4] = {0}, oh[64 * 4];
  memset(oh, 0x5A, sizeof oh);
  attn_spec s = ATTN_SPEC_INIT;
  s.num_heads_q = s.num_heads_kv = 1;
  s.head_dim_qk = 4;
  attn_tensor qb = attn_tensor_contig(h, ATTN_BF16, ATTN_DEVICE_HOST, 1, 64, 1, 4);
  attn_tensor kh = attn_tensor_contig(h, ATTN_F16, ATTN_DEVICE_HOST, 1, 64, 1, 4);
  attn_tensor kb = qb, vb = qb;
  attn_tensor of = attn_tensor_contig(f, ATTN_F32, ATTN_DEVICE_HOST, 1, 64, 1, 4);
  attn_tensor ob = attn_tensor_contig(oh, ATTN_BF16, ATTN_DEVICE_HOST, 1, 64, 1, 4);
  float lse[64];
  attn_status st = attn_fwd(ctx, &s, &qb, &kh, &vb, &ob, lse);
  TU_CHECK(st == ATTN_ERR_INVALID_ARG && strstr(attn_last_error(), "k dtype"),
           "bf16 q with f16 k: %s: %s", attn_status_string(st), attn_last_error());
  st = attn_fwd(ctx, &s, &qb, &kb, &vb, &of, lse);
  TU_CHECK(st == ATTN_ERR_INVALID_ARG && strstr(attn_last_error(), "o dtype"),
           "bf16 q with f32 o: %s: %s", attn_status_string(st), attn_last_error());
  uint16_t chk[64 * 4];
  memset(chk, 0x5A, sizeof chk);
  TU_CHECK(!memcmp(oh, chk, sizeof oh), "a refused call wrote o");
  attn_tensor dqb = ob;
  st = attn_bwd(ctx, &s, &qb, &kb, &vb, &ob, lse, &qb, &dqb, &of, &of, NULL);
  TU_CHECK(st == ATTN_ERR_INVALID_ARG && strstr(attn_last_error(), "dq dtype"),
           "bf16 dq: %s: %s", attn_status_string(st), attn_last_error());
  for (int dt = ATTN_F32; dt <= ATTN_F16; dt++)
    TU_CHECK(attn_ctx_supports_dtype(ctx, (attn_dtype)dt) == ATTN_OK, "dtype %d: %s", dt,
             attn_last_error());
  for (int dt = ATTN_BF16; dt <= ATTN_F16; dt++) specials(dt);
}

/* The scalar path: a flag sweep, the shapes and the API cases. */
static void scalar(void) {
  sweep_flags(1, 113, 203, 3, 1, 32, 24, (const int32_t[]){40, 1, 72},
              (const int32_t[]){70, 33, 100});
  shapes();
  api();
}

int main(int argc, char **argv) {
  static const tu_part parts[] = {{"flags", flags}, {"shapes", shapes}, {"scalar", scalar},
                                  {"block", block}, {"api", api}};
  /* AMX off: bf16 then runs the float32 arithmetic, which the bitwise pairs pin down (the
   * AMX tiles are test_bf16_tiles's) */
  ctx = tc_ctx_amx(argc > 1 && !strcmp(argv[1], "scalar"), 2, -1);
  printf("backend %s\n", attn_ctx_backend_name(ctx));
  int rc = tu_run_parts("test_dtypes", argc, argv, parts, (int)(sizeof parts / sizeof parts[0]));
  attn_ctx_destroy(ctx);
  return rc;
}
