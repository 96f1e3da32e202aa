/* kvcache.c — the run's KV cache: used lengths (given or drawn from the seed), a block
 * table over pages shuffled by the seed, and the K/V pools (see kvcache.h). */
#include "kvcache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctxbuf.h"
#include "err.h"
#include "rng.h"

#define SPARE_PAGES 2 /* pages no batch owns: NaN, so a stray read shows */

int kvcache_setup(problem *p, const run_args *a, char *err, size_t errlen) {
  if (!args_kv_cache(a)) return 0;
  const int64_t B = p->batch, P = a->page_size > 0 ? a->page_size : 0;
  p->kv_used = malloc((size_t)B * sizeof *p->kv_used);
  if (!p->kv_used) return launch_fail(err, errlen, "out of memory for the cache lengths");
  for (int64_t b = 0; b < B; b++)
    p->kv_used[b] = a->cache_lens_random
                        ? (int32_t)(rng_bits(p->seed, RNG_VARLEN, (1u << 30) + (uint64_t)b) %
                                    (uint64_t)(p->seq_kv + 1))
                    : a->cache_lens_count ? a->cache_lens[a->cache_lens_count > 1 ? b : 0]
                                          : (int32_t)p->seq_kv;
  p->kv_cache = (attn_kv_cache)ATTN_KV_CACHE_INIT;
  p->kv_cache.seqused_kv = p->kv_used;
  if (P) {
    const int64_t pps = (p->seq_kv + P - 1) / P, n = B * pps;
    if (n + SPARE_PAGES > INT32_MAX) return launch_fail(err, errlen, "--page-size %lld: too many pages", (long long)P);
    p->page_size = P, p->pages_per_seq = pps, p->num_pages = n + SPARE_PAGES;
    p->block_table = malloc((size_t)n * sizeof *p->block_table);
    if (!p->block_table) return launch_fail(err, errlen, "out of memory for the block table");
    for (int64_t i = 0; i < n; i++) p->block_table[i] = (int32_t)i;
    for (int64_t i = n - 1; i > 0; i--) { /* the pages in a seeded order */
      int64_t j = (int64_t)(rng_bits(p->seed, RNG_VARLEN, (1u << 31) + (uint64_t)i) % (uint64_t)(i + 1));
      int32_t x = p->block_table[i];
      p->block_table[i] = p->block_table[j];
      p->block_table[j] = x;
    }
    for (int64_t b = 0; b < B; b++) /* entries past the used keys: read by nobody */
      for (int64_t i = 0; i < pps; i++)
        if (i * P >= p->kv_used[b]) p->block_table[b * pps + i] = -1;
    p->kv_cache.block_table = p->block_table;
    p->kv_cache.pages_per_seq = (int32_t)pps;
  }
  p->spec.kv_cache = &p->kv_cache;
  return 0;
}

attn_status kvcache_pool(attn_ctx_t ctx, const problem *p, int which, attn_dtype t, void **dev) {
  const int64_t D = which == T_K ? p->spec.head_dim_qk : p->spec.head_dim_v, row = p->hk * D;
  const int64_t P = p->page_size, n = p->num_pages * P * row;
  const float *src = which == T_K ? p->k : p->v; /* [B, kv_rows, hk, D] */
  float *pool = malloc((size_t)n * sizeof *pool); /* [num_pages, P, hk, D] */
  if (!pool) return ATTN_ERR_OUT_OF_MEMORY;
  for (int64_t x = 0; x < n; x++) pool[x] = NAN;
  for (int64_t b = 0; b < p->batch; b++)
    for (int64_t j = 0; j < p->kv_used[b]; j++) {
      const int64_t page = p->block_table[b * p->pages_per_seq + j / P];
      memcpy(pool + (page * P + j % P) * row, src + (b * p->kv_rows + j) * row,
             (size_t)row * sizeof *pool);
    }
  attn_status st = ctxbuf_put(ctx, pool, n, t, dev);
  free(pool);
  return st;
}

void kvcache_free(problem *p) {
  free(p->kv_used);
  free(p->block_table);
  p->kv_used = p->block_table = NULL;
}
