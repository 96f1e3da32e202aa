/* test_paths.c — the AVX-512 path against the forced scalar path (both against the oracle
 * and against each other within fp32 rounding), bitwise-identical repeat runs at the same
 * thread count, one thread vs two, and tile skipping reported by attn_ctx_last_stats. */
#include <stdlib.h>
#include <string.h>

#include "test_case.h"

#define PATH_RTOL 2e-5

static int same_bits(const float *a, const float *b, int64_t n) {
  return n == 0 || memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

static void check_repeat(tc_prob *P, const tc_out *a, const tc_out *b, const char *what) {
  int ok = same_bits(a->o, b->o, tc_n_o(P)) && same_bits(a->lse, b->lse, tc_n_lse(P)) &&
           same_bits(a->dq, b->dq, tc_n_q(P)) && same_bits(a->dk, b->dk, tc_n_k(P)) &&
           same_bits(a->dv, b->dv, tc_n_v(P)) &&
           (!P->c.sinks || same_bits(a->ds, b->ds, P->Hq));
  char desc[512];
  tc_describe(&P->c, desc, sizeof desc);
  TU_CHECK(ok, "%s: repeat run is not bitwise identical in %s", what, desc);
}

static void paths_case(attn_ctx_t scalar, attn_ctx_t simd, attn_ctx_t simd2, attn_ctx_t one,
                       tc_case c) {
  tc_prob P;
  tc_out s, v, v2, v3, t1;
  c.bwd = 1;
  tc_init(&P, &c);
  tc_lib(scalar, &P, &s, 1);
  tc_lib(simd, &P, &v, 1);
  tc_check(&P, &s, 1, attn_ctx_backend_name(scalar));
  tc_check(&P, &v, 1, attn_ctx_backend_name(simd));
  tc_check_pair(&P, &v, &s, 1, PATH_RTOL, "simd vs scalar");
  /* Same context twice, a fresh context with the same threads: identical bits. */
  tc_lib(simd, &P, &v2, 1);
  tc_lib(simd2, &P, &v3, 1);
  check_repeat(&P, &v, &v2, "same context");
  check_repeat(&P, &v, &v3, "fresh context");
  tc_out s2;
  tc_lib(scalar, &P, &s2, 1);
  check_repeat(&P, &s, &s2, "scalar");
  /* One thread: also correct. */
  tc_lib(one, &P, &t1, 1);
  tc_check(&P, &t1, 1, "1 thread");
  tc_out_free(&s);
  tc_out_free(&s2);
  tc_out_free(&v);
  tc_out_free(&v2);
  tc_out_free(&v3);
  tc_out_free(&t1);
  tc_free(&P);
}

static void check_backend_names(attn_ctx_t scalar, attn_ctx_t simd) {
  const char *force = getenv("ATTN_FORCE_SCALAR");
  int forced = force && atoi(force) != 0;
  TU_CHECK(!strcmp(attn_ctx_backend_name(scalar), "cpu-scalar"),
           "force_scalar=1 context is %s", attn_ctx_backend_name(scalar));
#if defined(__x86_64__) && defined(__GNUC__)
  int avx512 = __builtin_cpu_supports("avx512f") && !forced;
#else
  int avx512 = 0;
#endif
  const char *want = avx512 ? "cpu-avx512" : "cpu-scalar";
  TU_CHECK(!strcmp(attn_ctx_backend_name(simd), want), "default context is %s, expected %s",
           attn_ctx_backend_name(simd), want);
  printf("paths: %s vs %s\n", attn_ctx_backend_name(simd), attn_ctx_backend_name(scalar));
}

/* A causal problem skips the tiles above the diagonal; a block mask skips its zero blocks. */
static void check_stats(attn_ctx_t ctx) {
  tc_prob P;
  tc_out out;
  tc_init(&P, &(tc_case){.B = 1, .Sq = 512, .Skv = 512, .Hq = 1, .Hkv = 1, .Dqk = 64,
                         .causal = 1, .seed = 77});
  tc_lib(ctx, &P, &out, 0);
  attn_stats st;
  TU_CHECK(attn_ctx_last_stats(ctx, &st) == ATTN_OK, "attn_ctx_last_stats: %s", attn_last_error());
  double full = attn_flops_fwd(&P.spec, 1, 512, 512) * 2; /* non-causal count */
  TU_CHECK(st.tiles_skipped > 0 && st.tiles_computed > 0,
           "causal 512x512: tiles computed %lld skipped %lld", (long long)st.tiles_computed,
           (long long)st.tiles_skipped);
  TU_CHECK(st.flops_computed > 0 && st.flops_computed < 0.75 * full,
           "causal 512x512: flops computed %g of %g", st.flops_computed, full);
  tc_out_free(&out);
  tc_free(&P);
}

int main(void) {
  attn_ctx_t scalar = tc_ctx(1, 2), simd = tc_ctx(0, 2), simd2 = tc_ctx(0, 2), one = tc_ctx(0, 1);
  check_backend_names(scalar, simd);
  static const int dims[][2] = {{1, 0}, {7, 0}, {64, 0}, {72, 0}, {128, 0}, {256, 0}, {192, 128}, {16, 100}};
  uint64_t seed = 900;
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
    tc_case c = {.name = "paths", .B = 2, .Sq = 130, .Skv = 97, .Hq = 4, .Hkv = 2,
                 .Dqk = dims[i][0], .Dv = dims[i][1], .causal = (int)(i & 1), .seed = seed++};
    paths_case(scalar, simd, simd2, one, c);
  }
  static const int32_t lq[] = {64, 1, 100}, lkv[] = {80, 65, 33};
  paths_case(scalar, simd, simd2, one,
             (tc_case){.name = "paths flags", .B = 1, .Sq = 200, .Skv = 260, .Hq = 3, .Hkv = 1,
                       .Dqk = 64, .causal = 1, .window = 1, .wl = 90, .wr = -1,
                       .softcap = 4.0f, .sinks = 1, .alibi = 1, .seed = seed++});
  paths_case(scalar, simd, simd2, one,
             (tc_case){.name = "paths alibi both sides", .B = 1, .Sq = 150, .Skv = 230, .Hq = 4,
                       .Hkv = 4, .Dqk = 32, .window = 1, .wl = 60, .wr = 70, .softcap = 2.0f,
                       .alibi = 1, .sinks = 1, .amp = 2.0, .seed = seed++});
  paths_case(scalar, simd, simd2, one,
             (tc_case){.name = "paths varlen mask", .Hq = 2, .Hkv = 2, .Dqk = 128, .nseq = 3,
                       .lq = lq, .lkv = lkv, .bq = 32, .bk = 64, .window = 1, .wl = 50,
                       .wr = 20, .seed = seed++});
  paths_case(scalar, simd, simd2, one,
             (tc_case){.name = "paths long", .B = 1, .Sq = 600, .Skv = 700, .Hq = 2, .Hkv = 1,
                       .Dqk = 128, .causal = 1, .sinks = 1, .seed = seed++});
  check_stats(simd);
  attn_ctx_destroy(scalar);
  attn_ctx_destroy(simd);
  attn_ctx_destroy(simd2);
  attn_ctx_destroy(one);
  return tu_finish("test_paths");
}
