/* block_mask.c — builds Longformer/BigBird-style tile masks (local, strided, global,
 * random blocks) for attn_spec.block_mask. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* splitmix64: a counter-based draw, so a pattern depends only on (seed, qb, t). */
static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

attn_status attn_block_mask_fill(attn_block_mask *bm, uint8_t *mask,
                                 const attn_sparse_pattern *p) {
  if (!bm) return attn__fail(ATTN_ERR_INVALID_ARG, "bm (attn_block_mask *) is NULL");
  if (!mask) return attn__fail(ATTN_ERR_INVALID_ARG, "mask is NULL");
  if (!p) return attn__fail(ATTN_ERR_INVALID_ARG, "p (attn_sparse_pattern *) is NULL");
  if (bm->block_q <= 0 || bm->block_k <= 0 || bm->num_q_blocks <= 0 || bm->num_k_blocks <= 0)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "block_q=%d block_k=%d num_q_blocks=%lld num_k_blocks=%lld must be positive",
                      bm->block_q, bm->block_k, (long long)bm->num_q_blocks,
                      (long long)bm->num_k_blocks);
  if (p->local_blocks < 0 || p->stride < 0 || p->global_blocks < 0 || p->random_blocks < 0)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "pattern local=%d stride=%d global=%d random=%d must be >= 0",
                      p->local_blocks, p->stride, p->global_blocks, p->random_blocks);
  const int64_t nq = bm->num_q_blocks, nk = bm->num_k_blocks;
  for (int64_t qb = 0; qb < nq; qb++) {
    uint8_t *row = mask + qb * nk; /* [nk] */
    for (int64_t kb = 0; kb < nk; kb++) {
      int64_t dist = llabs(qb - kb);
      row[kb] = dist <= p->local_blocks || (p->stride > 0 && dist % p->stride == 0) ||
                qb < p->global_blocks || kb < p->global_blocks;
    }
    for (int32_t t = 0; t < p->random_blocks; t++)
      row[mix64(p->seed ^ mix64((uint64_t)qb * 1000003u + (uint64_t)t)) % (uint64_t)nk] = 1;
  }
  bm->mask = mask;
  return ATTN_OK;
}
