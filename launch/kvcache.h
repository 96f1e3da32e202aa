/* kvcache.h — --page-size / --cache-lens: the run's KV cache (attn_kv_cache): each
 * batch's used keys, a block table over shuffled pages, and K/V scattered into the pages
 * in context memory. */
#ifndef ATTNRUN_LAUNCH_KVCACHE_H
#define ATTNRUN_LAUNCH_KVCACHE_H

#include "args.h"
#include "problem.h"

/* The cache's host arrays into p (p->kv_cache, p->spec.kv_cache); nothing without one.
 * 0, or -1 with a message in err. */
int kvcache_setup(problem *p, const run_args *a, char *err, size_t errlen);

/* Tensor `which` (T_K or T_V) of this shard as pages in ctx's memory, in dtype t:
 * [num_pages, page_size, hk, D], pages the table does not reach NaN. */
attn_status kvcache_pool(attn_ctx_t ctx, const problem *p, int which, attn_dtype t, void **dev);

void kvcache_free(problem *p);

#endif
