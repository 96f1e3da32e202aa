/* test_kv_cache.c — attn_fwd and attn_fwd_block on a KV cache (spec->kv_cache): the keys
 * each batch uses (seqused_kv) on contiguous K/V, and paged K/V (a block table over
 * shuffled pages of sizes 1..256), every flag on and off, float32 / bf16 / f16, against
 * the float64 oracle run per batch on exactly its used keys. Rows past the used keys,
 * table entries past them (-1) and spare pages hold NaN / Inf, so a read of any of them
 * shows. Paged and contiguous agree bitwise where the arithmetic is the same; a cache
 * folded page range by page range agrees with one call; bad caches are refused with the
 * argument named and the outputs untouched. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_case.h"

static size_t esize(int dt) { return dt == ATTN_F32 ? 4 : 2; }
static void put(void *buf, int64_t x, int dt, float v) {
  if (dt == ATTN_F32) ((float *)buf)[x] = v;
  else ((uint16_t *)buf)[x] = tu_to_bits(v, dt);
}
static float get(const void *buf, int64_t x, int dt) {
  return dt == ATTN_F32 ? ((const float *)buf)[x] : tu_from_bits(((const uint16_t *)buf)[x], dt);
}

/* A paged copy of P's K and V: pool [num_pages][page][Hkv][D] in P's dtype, pages shuffled,
 * table [B][pps] (entries past a batch's used keys -1), spare pages poisoned. */
typedef struct {
  int64_t page, pps, num_pages;
  int32_t *table;
  void *kp, *vp;
  attn_tensor tk, tv;
} paged;

static void paged_make(paged *pg, const tc_prob *P, const int32_t *used, int64_t page,
                       uint64_t seed) {
  const int dt = P->c.dtype;
  pg->page = page;
  pg->pps = (P->Skv + page - 1) / page;
  pg->num_pages = P->B * pg->pps + 3;
  const int64_t krow = P->Hkv * P->Dqk, vrow = P->Hkv * P->Dv;
  pg->kp = tu_alloc((size_t)(pg->num_pages * page * krow) * esize(dt));
  pg->vp = tu_alloc((size_t)(pg->num_pages * page * vrow) * esize(dt));
  for (int64_t x = 0; x < pg->num_pages * page * krow; x++) put(pg->kp, x, dt, NAN);
  for (int64_t x = 0; x < pg->num_pages * page * vrow; x++) put(pg->vp, x, dt, INFINITY);
  int32_t *perm = tu_alloc((size_t)pg->num_pages * sizeof *perm);
  for (int64_t i = 0; i < pg->num_pages; i++) perm[i] = (int32_t)i;
  tu_rng r = tu_rng_make(seed);
  for (int64_t i = pg->num_pages - 1; i > 0; i--) {
    int64_t j = tu_randint(&r, 0, i);
    int32_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  pg->table = tu_alloc((size_t)(P->B * pg->pps) * sizeof *pg->table);
  for (int64_t b = 0; b < P->B; b++) {
    const int64_t u = used ? used[b] : P->Skv;
    for (int64_t i = 0; i < pg->pps; i++)
      pg->table[b * pg->pps + i] = i * page < u ? perm[b * pg->pps + i] : -1;
    for (int64_t j = 0; j < u; j++) {
      const int64_t row = (int64_t)pg->table[b * pg->pps + j / page] * page + j % page;
      const float *ks = P->k + (b * P->Skv + j) * krow, *vs = P->v + (b * P->Skv + j) * vrow;
      for (int64_t x = 0; x < krow; x++) put(pg->kp, row * krow + x, dt, ks[x]);
      for (int64_t x = 0; x < vrow; x++) put(pg->vp, row * vrow + x, dt, vs[x]);
    }
  }
  free(perm);
  pg->tk = attn_tensor_contig(pg->kp, (attn_dtype)dt, ATTN_DEVICE_HOST, pg->num_pages, page,
                              P->Hkv, P->Dqk);
  pg->tv = attn_tensor_contig(pg->vp, (attn_dtype)dt, ATTN_DEVICE_HOST, pg->num_pages, page,
                              P->Hkv, P->Dv);
}

static void paged_free(paged *pg) {
  free(pg->table);
  free(pg->kp);
  free(pg->vp);
}

/* Used lengths of the batches: some full, some empty, some shorter than the queries. */
static void draw_used(tu_rng *r, const tc_prob *P, int32_t *used) {
  for (int64_t b = 0; b < P->B; b++) {
    const int64_t kind = (b + tu_randint(r, 0, 3)) % 4;
    used[b] = (int32_t)(kind == 0   ? P->Skv
                        : kind == 1 ? tu_randint(r, 0, P->Skv)
                        : kind == 2 ? tu_randint(r, 0, P->Sq < P->Skv ? P->Sq : P->Skv)
                                    : tu_randint(r, P->Skv / 2, P->Skv));
  }
}

/* NaN in K and Inf in V of every row past a batch's used keys (contiguous copies). */
static void poison_unused(tc_prob *P, const int32_t *used) {
  for (int64_t b = 0; b < P->B; b++)
    for (int64_t j = used[b]; j < P->Skv; j++) {
      float *k = P->k + (b * P->Skv + j) * P->Hkv * P->Dqk;
      float *v = P->v + (b * P->Skv + j) * P->Hkv * P->Dv;
      for (int64_t x = 0; x < P->Hkv * P->Dqk; x++) k[x] = NAN;
      for (int64_t x = 0; x < P->Hkv * P->Dv; x++) v[x] = INFINITY;
    }
  tc_sync(P);
}

/* The oracle, batch by batch over its used keys alone: o [B,Sq,Hq,Dv], lse [B,Hq,Sq]. */
static void ref_cache(const tc_prob *P, const int32_t *used, double *o, double *lse) {
  attn_spec s = P->spec;
  s.kv_cache = NULL;
  const int64_t no = P->Sq * P->Hq * P->Dv, nl = P->Hq * P->Sq;
  for (int64_t b = 0; b < P->B; b++) {
    attn_ref_arrays a = {P->q + b * P->Sq * P->Hq * P->Dqk, P->k + b * P->Skv * P->Hkv * P->Dqk,
                         P->v + b * P->Skv * P->Hkv * P->Dv, NULL};
    attn_ref_problem rp;
    attn_ref_problem_arrays(&rp, &s, 1, P->Sq, used ? used[b] : P->Skv, &a);
    attn_ref_fwd(&rp, o + b * no, lse + b * nl);
  }
}

/* attn_fwd into poisoned outputs: o as float [B,Sq,Hq,Dv], lse [B,Hq,Sq]. */
static attn_status run_fwd(attn_ctx_t ctx, tc_prob *P, const attn_kv_cache *kc,
                           const attn_tensor *k, const attn_tensor *v, float *o, float *lse) {
  const int dt = P->c.dtype;
  const int64_t n = tc_n_o(P);
  void *ob = tu_alloc((size_t)n * esize(dt));
  for (int64_t x = 0; x < n; x++) put(ob, x, dt, tu_poison_value());
  tu_poison(lse, tc_n_lse(P));
  attn_tensor to = attn_tensor_contig(ob, (attn_dtype)dt, ATTN_DEVICE_HOST, P->B, P->Sq, P->Hq, P->Dv);
  attn_spec s = P->spec;
  s.kv_cache = kc;
  attn_status st = attn_fwd(ctx, &s, &P->tq, k, v, &to, lse);
  for (int64_t x = 0; x < n; x++) o[x] = get(ob, x, dt);
  free(ob);
  return st;
}

static int check_out(const tc_prob *P, const char *tag, attn_status st, const float *o,
                     const float *lse, const double *ro, const double *rl) {
  const int before = tu_failures;
  TU_CHECK(st == ATTN_OK, "%s: %s: %s", tag, attn_status_string(st), attn_last_error());
  if (st != ATTN_OK) return 0;
  int64_t do4[4] = {P->B, P->Sq, P->Hq, P->Dv}, dl4[4] = {1, P->B, P->Hq, P->Sq};
  tu_compare("O", o, ro, tc_n_o(P), do4, TC_FWD_RTOL + TC_O_RTOL(P->c.dtype), 1e-6);
  tu_compare("LSE", lse, rl, tc_n_lse(P), dl4, TC_FWD_RTOL, 2e-6);
  return tu_failures == before;
}

static void report(const tc_prob *P, const char *tag, int64_t page, const int32_t *used) {
  char d[512];
  tc_describe(&P->c, d, sizeof d);
  fprintf(stderr, "  case %s (%s) page=%lld used=[", d, tag, (long long)page);
  for (int64_t b = 0; b < P->B; b++) fprintf(stderr, "%s%d", b ? "," : "", used ? used[b] : -1);
  fprintf(stderr, "]\n");
}

/* One cache case: used lengths on contiguous K/V, then paged with `page` rows a page (0:
 * contiguous only), each against the oracle; paged and contiguous bitwise on one thread
 * (no key splits) where both take the same arithmetic. unit: the contexts take the bf16
 * tile products (cfg.cpu_amx 0), which test_bf16_tiles judges by the 2x rule: bf16 then
 * gets the bitwise check alone, where paging keeps them (pages of whole tiles). */
static void run_case(attn_ctx_t ctx, attn_ctx_t ctx1, const tc_case *c, int64_t page,
                     int with_used, int unit) {
  tc_prob P;
  tc_init(&P, c);
  tu_rng r = tu_rng_make(c->seed ^ 0x6b76ull);
  int32_t *used = tu_alloc((size_t)P.B * sizeof *used);
  draw_used(&r, &P, used);
  if (!with_used)
    for (int64_t b = 0; b < P.B; b++) used[b] = (int32_t)P.Skv;
  poison_unused(&P, used);
  double *ro = tu_dalloc(tc_n_o(&P)), *rl = tu_dalloc(tc_n_lse(&P));
  ref_cache(&P, used, ro, rl);
  float *o = tu_falloc(tc_n_o(&P)), *lse = tu_falloc(tc_n_lse(&P));
  float *o1 = tu_falloc(tc_n_o(&P)), *lse1 = tu_falloc(tc_n_lse(&P));
  attn_kv_cache kc = {NULL, 0, with_used ? used : NULL};
  const int before = tu_failures, judge = !(unit && P.c.dtype == ATTN_BF16);
  attn_status st = run_fwd(ctx, &P, &kc, &P.tk, &P.tv, o, lse);
  if (judge) check_out(&P, "seqused_kv", st, o, lse, ro, rl);
  if (page > 0) {
    paged pg;
    paged_make(&pg, &P, used, page, c->seed + 7);
    /* without used lengths the paged keys are pps * page: only when that is Skv */
    attn_kv_cache kp = {pg.table, (int32_t)pg.pps, with_used || P.Skv % page ? used : NULL};
    st = run_fwd(ctx, &P, &kp, &pg.tk, &pg.tv, o, lse);
    if (judge) check_out(&P, "paged", st, o, lse, ro, rl);
    TU_CHECK(st == ATTN_OK, "paged: %s: %s", attn_status_string(st), attn_last_error());
    if (st == ATTN_OK && (judge || page % 128 == 0)) {
      run_fwd(ctx1, &P, &kp, &pg.tk, &pg.tv, o, lse);
      run_fwd(ctx1, &P, &kc, &P.tk, &P.tv, o1, lse1);
      TU_CHECK(!memcmp(o, o1, (size_t)tc_n_o(&P) * sizeof *o) &&
                   !memcmp(lse, lse1, (size_t)tc_n_lse(&P) * sizeof *lse),
               "paged and contiguous differ in their bits (one thread)");
    }
    paged_free(&pg);
  }
  if (tu_failures != before) report(&P, "cache", page, used);
  free(o), free(lse), free(o1), free(lse1), free(ro), free(rl), free(used);
  tc_free(&P);
}

static const int64_t pages[] = {1, 16, 48, 128, 256, 7, 32, 64};
#define NPAGES ((int)(sizeof pages / sizeof pages[0]))

/* Every flag but varlen (which takes no cache), on three shapes: decode (the row
 * kernels), a few rows, and a prefill of more than a tile; page sizes in turn. */
static void flags_sweep(int dtype) {
  attn_ctx_t ctx = tc_ctx_amx(0, 2, -1), ctx1 = tc_ctx_amx(0, 1, -1);
  const tc_case shapes[] = {
      {.B = 3, .Sq = 1, .Skv = 300, .Hq = 8, .Hkv = 2, .Dqk = 64},
      {.B = 2, .Sq = 5, .Skv = 200, .Hq = 4, .Hkv = 4, .Dqk = 32, .Dv = 48},
      {.B = 2, .Sq = 150, .Skv = 257, .Hq = 2, .Hkv = 1, .Dqk = 64},
  };
  int n = 0;
  for (int m = 0; m < 128; m++) {
    if (m & 32) continue;
    for (int s = 0; s < 3; s++, n++) {
      tc_case c = tc_flags_case(shapes[s], m, NULL, NULL);
      c.name = "kv_cache";
      c.dtype = dtype;
      c.seed = 7000 + (uint64_t)n;
      run_case(ctx, ctx1, &c, pages[n % NPAGES], n % 5 != 4, 0);
    }
  }
  attn_ctx_destroy(ctx);
  attn_ctx_destroy(ctx1);
}

static void part_flags(void) { flags_sweep(ATTN_F32); }
static void part_dtypes(void) {
  flags_sweep(ATTN_BF16);
  flags_sweep(ATTN_F16);
}

/* The scalar path; pages of one or several whole tiles (every key used), on the bf16
 * tile products where the CPU has them; decode. */
static void part_paths(void) {
  attn_ctx_t sc = tc_ctx_amx(1, 2, -1), sc1 = tc_ctx_amx(1, 1, -1), ctx = tc_ctx(0, 2),
             ctx1 = tc_ctx(0, 1);
  const tc_case base = {.B = 2, .Sq = 130, .Skv = 512, .Hq = 4, .Hkv = 2, .Dqk = 64, .causal = 1};
  for (int i = 0; i < 6; i++) {
    tc_case c = base;
    c.name = "kv_cache paths";
    c.seed = 7500 + (uint64_t)i;
    c.dtype = i % 3 == 0 ? ATTN_F32 : i % 3 == 1 ? ATTN_BF16 : ATTN_F16;
    c.sinks = i & 1;
    run_case(sc, sc1, &c, i < 3 ? 16 : 256, 1, 0);
    run_case(ctx, ctx1, &c, i < 3 ? 128 : 512, 0, 1); /* 512 / page: every key used */
    c.Sq = 1;
    run_case(ctx, ctx1, &c, 64, 0, 1);
  }
  attn_ctx_destroy(sc);
  attn_ctx_destroy(sc1);
  attn_ctx_destroy(ctx);
  attn_ctx_destroy(ctx1);
}

/* attn_fwd_block over page ranges of the cache (two blocks, each with its own table of
 * the pages it holds; the used lengths global), merged, finalized: against the oracle. */
static void part_blocks(void) {
  attn_ctx_t ctx = tc_ctx_amx(0, 2, -1);
  for (int i = 0; i < 8; i++) {
    tc_case c = {.name = "kv_cache blocks", .B = 3, .Sq = i < 4 ? 1 : 40, .Skv = 320, .Hq = 4,
                 .Hkv = 2, .Dqk = 32, .causal = i & 1, .sinks = (i >> 1) & 1,
                 .dtype = i < 6 ? ATTN_F32 : ATTN_BF16, .seed = 7600 + (uint64_t)i};
    if (i == 5) c.window = 1, c.wl = 50, c.wr = -1;
    tc_prob P;
    tc_init(&P, &c);
    tu_rng r = tu_rng_make(c.seed);
    int32_t used[3];
    draw_used(&r, &P, used);
    poison_unused(&P, used);
    double *ro = tu_dalloc(tc_n_o(&P)), *rl = tu_dalloc(tc_n_lse(&P));
    ref_cache(&P, used, ro, rl);
    paged pg;
    paged_make(&pg, &P, used, 32, c.seed + 1);
    const int64_t cut = 4; /* pages in block 0 */
    int32_t *t0 = tu_alloc((size_t)(P.B * pg.pps) * sizeof *t0), *t1 = t0 + P.B * cut;
    for (int64_t b = 0; b < P.B; b++)
      for (int64_t j = 0; j < pg.pps; j++) {
        const int32_t e = pg.table[b * pg.pps + j];
        if (j < cut) t0[b * cut + j] = e;
        else t1[b * (pg.pps - cut) + j - cut] = e;
      }
    attn_kv_cache k0 = {t0, (int32_t)cut, used}, k1 = {t1, (int32_t)(pg.pps - cut), used};
    const int64_t ns = P.B * P.Hq * P.Sq;
    attn_state st = {tu_falloc(ns), tu_falloc(ns), tu_falloc(ns * P.Dv), P.B, P.Hq, P.Sq, P.Dv};
    attn_status s = attn_state_init(ctx, &st);
    attn_spec sp = P.spec;
    const int64_t skv = pg.pps * pg.page;
    attn_block_pos p0 = {0, 0, 0, P.Sq, skv}, p1 = {0, 0, cut * pg.page, P.Sq, skv};
    sp.kv_cache = &k1; /* the later block first: the merge order must not matter */
    if (s == ATTN_OK) s = attn_fwd_block(ctx, &sp, &st, &P.tq, &pg.tk, &pg.tv, &p1);
    sp.kv_cache = &k0;
    if (s == ATTN_OK) s = attn_fwd_block(ctx, &sp, &st, &P.tq, &pg.tk, &pg.tv, &p0);
    float *o = tu_falloc(tc_n_o(&P)), *lse = tu_falloc(tc_n_lse(&P));
    void *ob = tu_alloc((size_t)tc_n_o(&P) * esize(c.dtype));
    attn_tensor to = attn_tensor_contig(ob, (attn_dtype)c.dtype, ATTN_DEVICE_HOST, P.B, P.Sq, P.Hq, P.Dv);
    if (s == ATTN_OK) s = attn_state_finalize(ctx, &P.spec, &st, &to, lse);
    for (int64_t x = 0; x < tc_n_o(&P); x++) o[x] = get(ob, x, c.dtype);
    if (!check_out(&P, "blocks", s, o, lse, ro, rl)) report(&P, "blocks", 32, used);
    free(ob), free(o), free(lse), free(st.m), free(st.l), free(st.acc), free(t0), free(ro), free(rl);
    paged_free(&pg);
    tc_free(&P);
  }
  attn_ctx_destroy(ctx);
}

/* Random shapes (tc_random_case without varlen), page sizes and used lengths. */
static void part_random(void) {
  attn_ctx_t ctx = tc_ctx_amx(0, 2, -1), ctx1 = tc_ctx_amx(0, 1, -1);
  int count;
  tu_rng r = tc_random_rng(&count, 40);
  for (int i = 0; i < count; i++) {
    int32_t lq[4], lkv[4];
    tc_case c = tc_random_case(&r, lq, lkv);
    c.nseq = 0, c.lq = c.lkv = NULL, c.bwd = 0;
    if (c.Skv < 1) c.Skv = 1;
    c.name = "kv_cache random";
    run_case(ctx, ctx1, &c, pages[tu_randint(&r, 0, NPAGES - 1)], (int)tu_randint(&r, 0, 3) != 0, 0);
  }
  attn_ctx_destroy(ctx);
  attn_ctx_destroy(ctx1);
}

/* Bad caches: each call fails with its status and a message naming the argument, and
 * leaves o and lse as they were. */
static void part_bad(void) {
  attn_ctx_t ctx = tc_ctx(0, 2);
  tc_case c = {.name = "kv_cache bad", .B = 2, .Sq = 3, .Skv = 64, .Hq = 2, .Hkv = 1, .Dqk = 16, .seed = 7700};
  tc_prob P;
  tc_init(&P, &c);
  int32_t used[2] = {64, 10};
  paged pg;
  paged_make(&pg, &P, used, 16, 7701);
  float *o = tu_falloc(tc_n_o(&P)), *lse = tu_falloc(tc_n_lse(&P));
  attn_tensor to = attn_tensor_f32(o, P.B, P.Sq, P.Hq, P.Dv);
  struct {
    const char *what, *needle;
    attn_status want;
    attn_kv_cache kc;
    int varlen, bwd, vpages; /* v with one page fewer */
  } cases[] = {
      {"used past the keys", "seqused_kv[1]=65", ATTN_ERR_INVALID_ARG, {NULL, 0, (int32_t[]){64, 65}}, 0, 0, 0},
      {"used negative", "seqused_kv[0]=-1", ATTN_ERR_INVALID_ARG, {NULL, 0, (int32_t[]){-1, 3}}, 0, 0, 0},
      {"table entry outside the pool", "block_table[1][0]", ATTN_ERR_INVALID_ARG, {pg.table, 4, used}, 0, 0, 0},
      {"table without pages_per_seq", "pages_per_seq=0", ATTN_ERR_INVALID_ARG, {pg.table, 0, NULL}, 0, 0, 0},
      {"pages_per_seq without a table", "block_table is NULL", ATTN_ERR_INVALID_ARG, {NULL, 4, NULL}, 0, 0, 0},
      {"paged varlen", "varlen", ATTN_ERR_UNSUPPORTED, {pg.table, 4, NULL}, 1, 0, 0},
      {"used with varlen", "cu_seqlens_kv", ATTN_ERR_INVALID_ARG, {NULL, 0, (int32_t[]){3}}, 1, 0, 0},
      {"v with fewer pages", "v shape", ATTN_ERR_INVALID_ARG, {pg.table, 4, used}, 0, 0, 1},
      {"backward", "attn_bwd", ATTN_ERR_UNSUPPORTED, {NULL, 0, used}, 0, 1, 0},
  };
  const int32_t saved = pg.table[4];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    tu_poison(o, tc_n_o(&P));
    tu_poison(lse, tc_n_lse(&P));
    attn_spec s = P.spec;
    attn_kv_cache kc = cases[i].kc;
    s.kv_cache = &kc;
    const int paged_in = kc.block_table != NULL;
    attn_tensor k = paged_in ? pg.tk : P.tk, v = paged_in ? pg.tv : P.tv;
    if (i == 2) pg.table[4] = (int32_t)pg.num_pages; /* batch 1's first page: past the pool */
    if (cases[i].vpages) v.shape[0]--;
    int32_t cu[2] = {0, 3}, cuk[2] = {0, 64};
    attn_tensor q = P.tq;
    if (cases[i].varlen) {
      s.num_seqs = 1, s.cu_seqlens_q = cu, s.cu_seqlens_kv = cuk;
      q.shape[0] = 1, k.shape[0] = paged_in ? k.shape[0] : 1, v.shape[0] = paged_in ? v.shape[0] : 1;
      to.shape[0] = 1;
    }
    attn_status st;
    if (cases[i].bwd) {
      float *g = tu_falloc(tc_n_q(&P) + 2 * tc_n_k(&P));
      attn_tensor dq = attn_tensor_f32(g, P.B, P.Sq, P.Hq, P.Dqk);
      attn_tensor dk = attn_tensor_f32(g + tc_n_q(&P), P.B, P.Skv, P.Hkv, P.Dqk);
      attn_tensor dv = attn_tensor_f32(g + tc_n_q(&P) + tc_n_k(&P), P.B, P.Skv, P.Hkv, P.Dv);
      st = attn_bwd(ctx, &s, &q, &k, &v, &to, lse, &to, &dq, &dk, &dv, NULL);
      TU_CHECK(tu_count_poison(g, tc_n_q(&P) + 2 * tc_n_k(&P)) == tc_n_q(&P) + 2 * tc_n_k(&P),
               "%s: the gradients were written", cases[i].what);
      free(g);
    } else {
      st = attn_fwd(ctx, &s, &q, &k, &v, &to, lse);
    }
    to.shape[0] = P.B;
    pg.table[4] = saved;
    TU_CHECK(st == cases[i].want, "%s: got %s (%s), want %s", cases[i].what, attn_status_string(st),
             attn_last_error(), attn_status_string(cases[i].want));
    TU_CHECK(strstr(attn_last_error(), cases[i].needle) != NULL, "%s: message \"%s\" does not name \"%s\"",
             cases[i].what, attn_last_error(), cases[i].needle);
    TU_CHECK(tu_count_poison(o, tc_n_o(&P)) == tc_n_o(&P) && tu_count_poison(lse, tc_n_lse(&P)) == tc_n_lse(&P),
             "%s: outputs were written", cases[i].what);
  }
  free(o), free(lse);
  paged_free(&pg);
  tc_free(&P);
  attn_ctx_destroy(ctx);
}

int main(int argc, char **argv) {
  static const tu_part parts[] = {{"flags", part_flags},   {"dtypes", part_dtypes},
                                  {"paths", part_paths},   {"blocks", part_blocks},
                                  {"random", part_random}, {"bad", part_bad}};
  return tu_run_parts("test_kv_cache", argc, argv, parts, (int)(sizeof parts / sizeof parts[0]));
}
