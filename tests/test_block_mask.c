/* test_block_mask.c — attn_block_mask_fill produces the documented pattern (local band,
 * strided, global, random blocks per query block, deterministic in the seed), rejects bad
 * arguments, and a filled mask drives attention exactly like the oracle. */
#include <stdlib.h>
#include <string.h>

#include "test_case.h"

/* The deterministic part of the documented pattern. */
static int fixed_pattern(int64_t qb, int64_t kb, const attn_sparse_pattern *p) {
  int64_t d = qb > kb ? qb - kb : kb - qb;
  return d <= p->local_blocks || (p->stride > 0 && d % p->stride == 0) ||
         qb < p->global_blocks || kb < p->global_blocks;
}

static void check_pattern(int64_t nq, int64_t nk, attn_sparse_pattern p) {
  attn_block_mask bm = {16, 32, nq, nk, NULL};
  uint8_t *m1 = tu_alloc((size_t)(nq * nk)), *m2 = tu_alloc((size_t)(nq * nk));
  memset(m1, 0xAB, (size_t)(nq * nk));
  attn_status st = attn_block_mask_fill(&bm, m1, &p);
  TU_CHECK(st == ATTN_OK, "fill: %s", attn_last_error());
  TU_CHECK(bm.mask == m1, "fill did not point bm->mask at the mask");
  int64_t bad_fixed = 0, bad_values = 0, too_many = 0, extras = 0;
  for (int64_t qb = 0; qb < nq; qb++) {
    int64_t row_extra = 0;
    for (int64_t kb = 0; kb < nk; kb++) {
      uint8_t v = m1[qb * nk + kb];
      bad_values += v > 1;
      int fixed = fixed_pattern(qb, kb, &p);
      if (fixed) bad_fixed += v != 1;
      else row_extra += v == 1;
    }
    too_many += row_extra > p.random_blocks;
    extras += row_extra;
  }
  char desc[160];
  snprintf(desc, sizeof desc, "%lldx%lld local=%d stride=%d global=%d random=%d seed=%llu",
           (long long)nq, (long long)nk, p.local_blocks, p.stride, p.global_blocks,
           p.random_blocks, (unsigned long long)p.seed);
  TU_CHECK(bad_values == 0, "%s: %lld bytes are neither 0 nor 1", desc, (long long)bad_values);
  TU_CHECK(bad_fixed == 0, "%s: %lld blocks of the local/strided/global pattern missing", desc,
           (long long)bad_fixed);
  TU_CHECK(too_many == 0, "%s: %lld query blocks have more than random_blocks extra blocks",
           desc, (long long)too_many);
  if (p.random_blocks == 0) TU_CHECK(extras == 0, "%s: blocks outside the pattern", desc);
  /* Deterministic in the seed; some other seed gives another draw. */
  attn_block_mask_fill(&bm, m2, &p);
  TU_CHECK(!memcmp(m1, m2, (size_t)(nq * nk)), "%s: same seed, different mask", desc);
  if (p.random_blocks > 0 && extras > 0) {
    int differs = 0;
    for (uint64_t s = 1; s <= 4 && !differs; s++) {
      attn_sparse_pattern p2 = p;
      p2.seed = p.seed + s;
      attn_block_mask_fill(&bm, m2, &p2);
      differs = memcmp(m1, m2, (size_t)(nq * nk)) != 0;
    }
    TU_CHECK(differs, "%s: the seed does not change the random blocks", desc);
  }
  free(m1);
  free(m2);
}

static void check_errors(void) {
  uint8_t m[16];
  attn_block_mask bm = {4, 4, 4, 4, NULL};
  attn_sparse_pattern p = {1, 0, 0, 0, 0};
  TU_CHECK(attn_block_mask_fill(NULL, m, &p) == ATTN_ERR_INVALID_ARG, "bm NULL");
  TU_CHECK(attn_block_mask_fill(&bm, NULL, &p) == ATTN_ERR_INVALID_ARG, "mask NULL");
  TU_CHECK(attn_block_mask_fill(&bm, m, NULL) == ATTN_ERR_INVALID_ARG, "pattern NULL");
  attn_block_mask b2 = bm;
  b2.num_k_blocks = 0;
  memset(m, 7, sizeof m);
  TU_CHECK(attn_block_mask_fill(&b2, m, &p) == ATTN_ERR_INVALID_ARG, "num_k_blocks 0");
  p.local_blocks = -1;
  TU_CHECK(attn_block_mask_fill(&bm, m, &p) == ATTN_ERR_INVALID_ARG, "local_blocks -1");
  TU_CHECK(m[0] == 7 && m[15] == 7, "a rejected fill wrote the mask");
  TU_CHECK(attn_last_error()[0] != 0, "no message for a rejected fill");
}

/* A BigBird-style mask from attn_block_mask_fill driving attention, vs the oracle. */
static void check_attention(void) {
  attn_ctx_t ctx = tc_ctx(0, 2);
  tc_case c = {.name = "filled mask", .B = 1, .Sq = 512, .Skv = 512, .Hq = 2, .Hkv = 1,
               .Dqk = 32, .bwd = 1, .seed = 31};
  tc_prob P;
  tc_out out;
  tc_init(&P, &c);
  uint8_t mask[64];
  attn_block_mask bm = {64, 64, 8, 8, NULL};
  attn_sparse_pattern pat = {1, 0, 1, 1, 12345};
  TU_CHECK(attn_block_mask_fill(&bm, mask, &pat) == ATTN_OK, "fill: %s", attn_last_error());
  P.spec.block_mask = &bm;
  tc_lib(ctx, &P, &out, 1);
  tc_check(&P, &out, 1, "attn_block_mask_fill mask");
  attn_stats st;
  attn_ctx_last_stats(ctx, &st);
  int64_t ones = 0;
  for (int x = 0; x < 64; x++) ones += mask[x];
  TU_CHECK(ones < 64, "pattern filled every block");
  tc_out_free(&out);
  tc_free(&P);
  /* Forward again to read the forward's tile statistics: zero blocks are skipped. */
  tc_init(&P, &c);
  P.spec.block_mask = &bm;
  tc_lib(ctx, &P, &out, 0);
  attn_ctx_last_stats(ctx, &st);
  TU_CHECK(st.tiles_skipped > 0, "mask with %lld zero blocks: %lld tiles skipped",
           (long long)(64 - ones), (long long)st.tiles_skipped);
  tc_out_free(&out);
  tc_free(&P);
  attn_ctx_destroy(ctx);
}

int main(void) {
  check_pattern(8, 8, (attn_sparse_pattern){1, 0, 0, 0, 1});
  check_pattern(8, 8, (attn_sparse_pattern){0, 0, 0, 0, 1});
  check_pattern(16, 16, (attn_sparse_pattern){0, 3, 0, 0, 1});
  check_pattern(10, 20, (attn_sparse_pattern){2, 5, 1, 0, 1});
  check_pattern(20, 10, (attn_sparse_pattern){0, 0, 2, 0, 1});
  check_pattern(32, 32, (attn_sparse_pattern){1, 0, 1, 3, 99});
  check_pattern(7, 300, (attn_sparse_pattern){1, 4, 2, 5, 7});
  check_pattern(1, 1, (attn_sparse_pattern){0, 0, 0, 1, 3});
  check_errors();
  check_attention();
  return tu_finish("test_block_mask");
}
