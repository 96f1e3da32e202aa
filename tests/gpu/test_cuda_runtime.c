/* test_cuda_runtime.c — the public API on a CUDA context (backend selection, validation,
 * the runtime adapter) against the CPU backend on the same bf16-rounded inputs: attn_fwd,
 * attn_bwd and the block API, in bf16 and in float32 (the SIMT kernels); and attn_stats
 * (tiles computed / skipped, FLOPs of computed tiles) against a brute-force count over all
 * tiles for several masks. Exits 77 when no CUDA device is visible. */
#include "attnrun.h"
#include "cuda_attn.h"
#include "gpu_test.h"
#include "traits.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define EXPECT(cond, ...)                                                  \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);      \
      fprintf(stderr, __VA_ARGS__);                                        \
      fprintf(stderr, " [%s]\n", attn_last_error());                       \
      failures++;                                                          \
    }                                                                      \
  } while (0)

/* Random bf16-representable values: host float copy and device bf16 copy. */
static float *rand_pair(size_t n, unsigned seed, uint16_t **dev) {
  float *h = malloc(n * sizeof(float));
  uint16_t *b = malloc(n * sizeof(uint16_t));
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    b[i] = gt_to_bf16(((seed >> 8) / 16777216.0f) * 2.0f - 1.0f);
    h[i] = gt_from_bf16(b[i]);
  }
  cudaMalloc((void **)dev, n * sizeof(uint16_t));
  cudaMemcpy(*dev, b, n * sizeof(uint16_t), cudaMemcpyHostToDevice);
  cudaDeviceSynchronize(); /* pageable H2D may still be in flight (see dev_fill) */
  free(b);
  return h;
}

/* A device copy of n host floats. */
static float *dev_copy(const float *h, size_t n) {
  float *d = NULL;
  cudaMalloc((void **)&d, n * sizeof(float));
  cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
  cudaDeviceSynchronize();
  return d;
}

static attn_tensor dev_tensor(void *p, attn_dtype t, int64_t b, int64_t s, int64_t h, int64_t d) {
  attn_tensor x = attn_tensor_f32(p, b, s, h, d);
  x.dtype = t;
  x.device = ATTN_DEVICE_CUDA;
  return x;
}

/* max |a - b| / max |b| over n floats; a is a bf16 device copy when bf16 != 0. */
static double rel_err_dev(const void *dev, int bf16, const float *ref, size_t n) {
  float *a = malloc(n * sizeof(float));
  if (bf16) {
    uint16_t *b = malloc(n * sizeof(uint16_t));
    cudaMemcpy(b, dev, n * sizeof(uint16_t), cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < n; i++) a[i] = gt_from_bf16(b[i]);
    free(b);
  } else {
    cudaMemcpy(a, dev, n * sizeof(float), cudaMemcpyDeviceToHost);
  }
  double err = 0, mx = 0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - ref[i]);
    if (!(e <= err)) err = e; /* NaN counts as the worst */
    if (fabs(ref[i]) > mx) mx = fabs(ref[i]);
  }
  free(a);
  return err / (mx > 0 ? mx : 1);
}

/* ---- attn_stats on the CUDA context against a brute-force count ---------------------------
 * The kernels' tile decisions restated element by element (DESIGN.md §2 visibility per
 * (query, key) pair, the block mask looked up per pair): a query tile (tile_rows rows from
 * its sequence's first row in the call) and a key tile (keys at multiples of tile_keys) are
 * computed iff some key of the tile lies within the band the tile's rows see and the block
 * mask is on for some (row of the tile, key of the tile within that band); every key tile
 * of the sequence's keys counts, computed or skipped. Backward: key tiles from the
 * sequence's first key, query steps from the first row that sees one of their keys. */
typedef struct {
  const char *name;
  int backward, f32, B, Hq, Hkv, D;
  int64_t sq, skv, q_pos0, k_pos0, seq_q, seq_kv; /* seq_q/seq_kv 0: sq / skv */
  int causal;
  int64_t wl, wr;
  int nseq;          /* varlen: sequences of lengths lq[], lk[] */
  int32_t lq[4], lk[4];
  int bq, bk;        /* block mask block sizes (0: none) */
  unsigned seed;     /* of the random blocks, each on with probability dens / 16 */
  int dens;
} stats_case;

typedef struct {
  const stats_case *c;
  int32_t cq[5], ck[5]; /* prefix sums */
  const uint8_t *bm;
  int64_t nqb, nkb;
} bf_geo;

/* Sequence s's global query / key range. */
static void bf_seq(const bf_geo *g, int s, int64_t *qa, int64_t *qb, int64_t *ka, int64_t *kb) {
  const stats_case *c = g->c;
  if (!c->nseq) {
    *qa = 0, *qb = c->seq_q ? c->seq_q : c->sq, *ka = 0, *kb = c->seq_kv ? c->seq_kv : c->skv;
    return;
  }
  *qa = g->cq[s], *qb = g->cq[s + 1], *ka = g->ck[s], *kb = g->ck[s + 1];
}

/* Local query row r sees local key j (sequence s): window, causal, sequence, no mask. */
static int bf_band(const bf_geo *g, int s, int64_t r, int64_t j) {
  const stats_case *c = g->c;
  int64_t qa, qb, ka, kb;
  bf_seq(g, s, &qa, &qb, &ka, &kb);
  const int64_t i = c->q_pos0 + r, k = c->k_pos0 + j;
  if (i < qa || i >= qb || k < ka || k >= kb) return 0;
  const int64_t d = (k - ka) - ((i - qa) + (kb - ka) - (qb - qa)); /* key - diagonal */
  return !(c->causal && d > 0) && !(c->wl >= 0 && d < -c->wl) && !(c->wr >= 0 && d > c->wr);
}

static int bf_mask(const bf_geo *g, int s, int64_t r, int64_t j) {
  if (!g->bm) return 1;
  int64_t qa, qb, ka, kb;
  bf_seq(g, s, &qa, &qb, &ka, &kb);
  const int64_t x = (g->c->q_pos0 + r - qa) / g->c->bq, y = (g->c->k_pos0 + j - ka) / g->c->bk;
  return x < g->nqb && y < g->nkb && g->bm[x * g->nkb + y];
}

/* The call's local rows [r0, r1) and keys [c0, c1) of sequence s. */
static void bf_local(const bf_geo *g, int s, int64_t *r0, int64_t *r1, int64_t *c0, int64_t *c1) {
  int64_t qa, qb, ka, kb;
  bf_seq(g, s, &qa, &qb, &ka, &kb);
  const stats_case *c = g->c;
  *r0 = qa - c->q_pos0 > 0 ? qa - c->q_pos0 : 0;
  *r1 = qb - c->q_pos0 < c->sq ? qb - c->q_pos0 : c->sq;
  *c0 = ka - c->k_pos0 > 0 ? ka - c->k_pos0 : 0;
  *c1 = kb - c->k_pos0 < c->skv ? kb - c->k_pos0 : c->skv;
}

static int64_t fdiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

/* sm90: the Hopper forward, whose key tiles end at the tile's last visible key. */
static void bf_fwd_tile(const bf_geo *g, int s, int64_t R0, int64_t R1, int64_t c0, int64_t c1,
                        int BN, int sm90, attn_stats *out) {
  int64_t kmin = INT64_MAX, kmax = -1;
  for (int64_t r = R0; r < R1; r++)
    for (int64_t j = c0; j < c1; j++)
      if (bf_band(g, s, r, j)) kmin = j < kmin ? j : kmin, kmax = j > kmax ? j : kmax;
  const int64_t origin = sm90 && kmax >= 0 ? (kmax + 1) % BN : 0;
  int64_t cell = INT64_MIN, width = 0;
  int on = 0;
  for (int64_t j = c0; j <= c1; j++) {
    const int64_t id = j < c1 ? fdiv(j - origin, BN) : INT64_MAX;
    if (id != cell && cell != INT64_MIN) { /* the tile `cell` ends */
      out->tiles_computed += on;
      out->tiles_skipped += !on;
      if (on) out->flops_computed += 2.0 * (double)(R1 - R0) * (double)width * (2 * g->c->D);
      on = 0, width = 0;
    }
    if (j == c1) break;
    cell = id;
    if (j < kmin || j > kmax) continue;
    width++;
    for (int64_t r = R0; r < R1 && !on; r++) on = bf_mask(g, s, r, j);
  }
}

static void bf_bwd_tile(const bf_geo *g, int s, int64_t K0, int64_t K1, int64_t r0, int64_t r1,
                        int BM, attn_stats *out) {
  int64_t qmin = INT64_MAX, qmax = -1;
  for (int64_t r = r0; r < r1; r++)
    for (int64_t j = K0; j < K1; j++)
      if (bf_band(g, s, r, j)) qmin = r < qmin ? r : qmin, qmax = r > qmax ? r : qmax;
  const int64_t origin = qmax >= 0 ? qmin : 0;
  int64_t total = 0, last = INT64_MIN, done = 0;
  for (int64_t r = r0; r < r1; r++)
    if (fdiv(r - origin, BM) != last) last = fdiv(r - origin, BM), total++;
  for (int64_t qa = qmin; qmax >= 0 && qa <= qmax; qa += BM) {
    const int64_t qe = qa + BM < qmax + 1 ? qa + BM : qmax + 1;
    int on = 0;
    for (int64_t r = qa; r < qe && !on; r++)
      for (int64_t j = K0; j < K1 && !on; j++) on = bf_mask(g, s, r, j);
    done += on;
    if (on) out->flops_computed += 2.0 * (double)(qe - qa) * (double)(K1 - K0) * (5 * g->c->D);
  }
  out->tiles_computed += done;
  out->tiles_skipped += total - done;
}

/* The brute-force stats of c at the kernels' tile shapes for D = 128 bf16 and float32
 * (traits.h; sm90: the Hopper forward's 128 x 128, the Hopper backward's 64-row steps
 * over 128 keys; pack: the bf16 forward's packed GQA, 128 / pack positions a tile). */
static attn_stats bf_count(const bf_geo *g, int sm90, int pack) {
  const stats_case *c = g->c;
  const int rows = c->f32 ? 32 : c->backward ? (sm90 ? 64 : 32) : 128 / pack;
  /* the sm90 forward's key tiles: 176 at d = 128 not causal, 64 at 256, else 128 */
  const int keys = c->f32 ? 32 : c->backward ? 128 : sm90 ? FA_SM90_FWD_BN(c->D, c->D, c->causal) : 64;
  attn_stats out = {0, 0, 0};
  for (int s = 0; s < (c->nseq ? c->nseq : 1); s++) {
    int64_t r0, r1, c0, c1;
    bf_local(g, s, &r0, &r1, &c0, &c1);
    if (r1 <= r0 || (c->backward && c1 <= c0)) continue;
    if (!c->backward)
      for (int64_t R0 = r0; R0 < r1; R0 += rows)
        bf_fwd_tile(g, s, R0, R0 + rows < r1 ? R0 + rows : r1, c0, c1 > c0 ? c1 : c0, keys, sm90,
                    &out);
    else
      for (int64_t K0 = c0; K0 < c1; K0 += keys)
        bf_bwd_tile(g, s, K0, K0 + keys < c1 ? K0 + keys : c1, r0, r1, rows, &out);
  }
  const double heads = (double)c->B * c->Hq;
  out.tiles_computed *= c->B * c->Hq, out.tiles_skipped *= c->B * c->Hq;
  out.flops_computed *= heads;
  return out;
}

static void *dev_fill(size_t bytes, const void *host) {
  void *d = NULL;
  cudaMalloc(&d, bytes ? bytes : 1);
  if (host) cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice);
  else cudaMemset(d, 0, bytes);
  cudaDeviceSynchronize(); /* both may still be in flight; our streams do not wait for them */
  return d;
}

/* One case: the call on ctx (its spec arrays in device memory) and the stats it reports
 * against bf_count. */
static void stats_case_run(attn_ctx_t ctx, const stats_case *c) {
  bf_geo g = {c, {0}, {0}, NULL, 0, 0};
  for (int s = 0; s < c->nseq; s++)
    g.cq[s + 1] = g.cq[s] + c->lq[s], g.ck[s + 1] = g.ck[s] + c->lk[s];
  const int64_t seq_q = c->nseq ? g.cq[c->nseq] : c->seq_q ? c->seq_q : c->sq;
  const int64_t seq_kv = c->nseq ? g.ck[c->nseq] : c->seq_kv ? c->seq_kv : c->skv;
  uint8_t *bm = NULL;
  attn_block_mask mask = {0, 0, 0, 0, NULL};
  if (c->bq) {
    g.nqb = (seq_q + c->bq - 1) / c->bq, g.nkb = (seq_kv + c->bk - 1) / c->bk;
    bm = malloc((size_t)(g.nqb * g.nkb));
    unsigned x = c->seed;
    for (int64_t i = 0; i < g.nqb * g.nkb; i++)
      x = x * 1664525u + 1013904223u, bm[i] = (int)(x >> 28) < c->dens;
    g.bm = bm;
    mask = (attn_block_mask){c->bq, c->bk, g.nqb, g.nkb, dev_fill((size_t)(g.nqb * g.nkb), bm)};
  }
  attn_spec sp = ATTN_SPEC_INIT;
  sp.num_heads_q = c->Hq, sp.num_heads_kv = c->Hkv, sp.head_dim_qk = c->D, sp.causal = c->causal;
  sp.window_left = c->wl, sp.window_right = c->wr;
  sp.block_mask = c->bq ? &mask : NULL;
  if (c->nseq) {
    sp.num_seqs = c->nseq;
    sp.cu_seqlens_q = dev_fill(sizeof(int32_t) * (size_t)(c->nseq + 1), g.cq);
    sp.cu_seqlens_kv = dev_fill(sizeof(int32_t) * (size_t)(c->nseq + 1), g.ck);
  }
  const attn_dtype dt = c->f32 ? ATTN_F32 : ATTN_BF16;
  const size_t es = c->f32 ? 4 : 2, nq = (size_t)c->B * c->sq * c->Hq * c->D;
  const size_t nk = (size_t)c->B * c->skv * c->Hkv * c->D;
  void *q = dev_fill(nq * es, NULL), *k = dev_fill(nk * es, NULL), *v = dev_fill(nk * es, NULL);
  void *o = dev_fill(nq * es, NULL), *dout = dev_fill(nq * es, NULL);
  const size_t nrow = (size_t)c->B * c->Hq * c->sq * 4; /* bytes of [B, Hq, sq] float32 */
  float *lse = dev_fill(nrow, NULL), *delta = dev_fill(nrow, NULL);
  float *dq = dev_fill(nq * 4, NULL), *dk = dev_fill(nk * 4, NULL), *dv = dev_fill(nk * 4, NULL);
  attn_tensor tq = dev_tensor(q, dt, c->B, c->sq, c->Hq, c->D);
  attn_tensor tk = dev_tensor(k, dt, c->B, c->skv, c->Hkv, c->D);
  attn_tensor tv = dev_tensor(v, dt, c->B, c->skv, c->Hkv, c->D);
  attn_tensor to = dev_tensor(o, dt, c->B, c->sq, c->Hq, c->D);
  attn_tensor tdo = dev_tensor(dout, dt, c->B, c->sq, c->Hq, c->D);
  attn_tensor tdq = dev_tensor(dq, ATTN_F32, c->B, c->sq, c->Hq, c->D);
  attn_tensor tdk = dev_tensor(dk, ATTN_F32, c->B, c->skv, c->Hkv, c->D);
  attn_tensor tdv = dev_tensor(dv, ATTN_F32, c->B, c->skv, c->Hkv, c->D);
  const int block = c->q_pos0 || c->k_pos0 || c->seq_q || c->seq_kv;
  attn_block_pos pos = {0, c->q_pos0, c->k_pos0, seq_q, seq_kv};
  attn_status st;
  if (!c->backward && !block) {
    st = attn_fwd(ctx, &sp, &tq, &tk, &tv, &to, lse);
  } else if (!c->backward) {
    float *m = dev_fill(nrow, NULL), *l = dev_fill(nrow, NULL);
    attn_state state = {m, l, dq, c->B, c->Hq, c->sq, c->D}; /* dq: room for acc [B,Hq,sq,D] */
    st = attn_state_init(ctx, &state);
    if (st == ATTN_OK) st = attn_fwd_block(ctx, &sp, &state, &tq, &tk, &tv, &pos);
    cudaDeviceSynchronize();
    cudaFree(m);
    cudaFree(l);
  } else if (!block) {
    st = attn_bwd(ctx, &sp, &tq, &tk, &tv, &to, lse, &tdo, &tdq, &tdk, &tdv, NULL);
  } else {
    st = attn_bwd_block(ctx, &sp, &tq, &tk, &tv, &tdo, lse, delta, c->sq, &tdq, &tdk, &tdv, &pos);
  }
  /* The tile counts follow the kernel family that ran (the Hopper kernels' tiles differ):
   * the dispatcher's record of this call, which must agree with the rules (bf16 without
   * varlen or a block mask, where the Hopper kernels are on by default on sm_90). */
  const char *ran = c->f32 ? "f32" : c->backward ? attn_cuda_last_bwd_path() : attn_cuda_last_fwd_path();
  int sm90 = !strcmp(ran, "sm90");
  EXPECT(!sm90 || (!c->nseq && !c->bq), "%s: ran sm90 with varlen or a block mask", c->name);
  /* a bf16 forward that packed its GQA group ran mma.sync (kernels/cuda/README.md, "Decode") */
  int pack = 1, nsplit = 1;
  if (!c->backward && !c->f32) attn_cuda_last_fwd_plan(&pack, &nsplit);
  if (pack > 1) sm90 = 0;
  attn_stats got = {-1, -1, -1}, want = bf_count(&g, sm90, pack);
  EXPECT(st == ATTN_OK, "%s: the call failed", c->name);
  EXPECT(attn_ctx_last_stats(ctx, &got) == ATTN_OK, "%s: attn_ctx_last_stats", c->name);
  printf("stats %-26s computed %5lld skipped %5lld flops %.6g (brute force %lld %lld %.6g)\n",
         c->name, (long long)got.tiles_computed, (long long)got.tiles_skipped, got.flops_computed,
         (long long)want.tiles_computed, (long long)want.tiles_skipped, want.flops_computed);
  EXPECT(got.tiles_computed == want.tiles_computed && got.tiles_skipped == want.tiles_skipped &&
             got.flops_computed == want.flops_computed,
         "%s: stats differ from the brute-force count", c->name);
  EXPECT(want.tiles_computed > 0, "%s: the case computes nothing (a weak case)", c->name);
  if (!c->causal && c->wl < 0 && c->wr < 0 && !c->bq && !c->nseq && !block) { /* dense */
    const double rule = attn_flops_fwd(&sp, c->B, c->sq, c->skv) * (c->backward ? 2.5 : 1.0);
    EXPECT(got.flops_computed == rule, "%s: dense FLOPs %.6g, the peers' rule says %.6g",
           c->name, got.flops_computed, rule);
  }
  cudaDeviceSynchronize();
  void *bufs[] = {q, k, v, o, dout, lse, delta, dq, dk, dv, (void *)mask.mask,
                  (void *)sp.cu_seqlens_q, (void *)sp.cu_seqlens_kv};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
  free(bm);
}

/* The cases, forward and backward each, on a context with its own (non-default) stream. */
static void stats_tests(void) {
  static const stats_case cases[] = {
      {"dense sq<skv", 0, 0, 2, 2, 1, 128, 150, 200, 0, 0, 0, 0, 0, -1, -1, 0, {0}, {0}, 0, 0, 0, 0},
      {"causal sq<skv", 0, 0, 1, 2, 2, 128, 130, 270, 0, 0, 0, 0, 1, -1, -1, 0, {0}, {0}, 0, 0, 0, 0},
      {"causal sq>skv (empty rows)", 0, 0, 1, 2, 1, 128, 270, 100, 0, 0, 0, 0, 1, -1, -1, 0, {0}, {0}, 0, 0, 0, 0},
      {"window 40,10", 0, 0, 1, 2, 1, 128, 200, 300, 0, 0, 0, 0, 0, 40, 10, 0, {0}, {0}, 0, 0, 0, 0},
      {"causal window 30", 0, 0, 1, 2, 1, 128, 260, 260, 0, 0, 0, 0, 1, 30, -1, 0, {0}, {0}, 0, 0, 0, 0},
      {"causal mask 32x48 sparse", 0, 0, 1, 2, 1, 128, 250, 250, 0, 0, 0, 0, 1, -1, -1, 0, {0}, {0}, 32, 48, 7, 2},
      {"mask 64x64 window", 0, 0, 1, 2, 2, 128, 180, 220, 0, 0, 0, 0, 0, 60, 60, 0, {0}, {0}, 64, 64, 3, 8},
      {"mask 128x64 half", 0, 0, 1, 2, 1, 128, 256, 320, 0, 0, 0, 0, 0, -1, -1, 0, {0}, {0}, 128, 64, 5, 8},
      {"varlen causal", 0, 0, 1, 2, 1, 128, 260, 300, 0, 0, 0, 0, 1, -1, -1, 3, {70, 150, 40}, {90, 120, 90}, 0, 0, 0, 0},
      {"varlen mask window", 0, 0, 1, 2, 1, 128, 260, 300, 0, 0, 0, 0, 0, 50, 5, 3, {70, 150, 40}, {90, 120, 90}, 32, 32, 11, 3},
      {"block pos causal mask", 0, 0, 1, 2, 1, 128, 100, 150, 200, 60, 400, 400, 1, -1, -1, 0, {0}, {0}, 32, 32, 5, 3},
      {"f32 causal mask", 0, 1, 1, 3, 1, 32, 150, 170, 0, 0, 0, 0, 1, -1, -1, 0, {0}, {0}, 24, 40, 9, 6},
      {"f32 varlen window", 0, 1, 1, 2, 1, 32, 160, 160, 0, 0, 0, 0, 1, 20, -1, 2, {100, 60}, {90, 70}, 0, 0, 0, 0},
  };

  attn_ctx_t ctx = NULL;
  cudaStream_t stream = NULL;
  EXPECT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess, "stream");
  attn_ctx_config cfg = ATTN_CTX_CONFIG_INIT;
  cfg.backend = ATTN_BACKEND_CUDA;
  cfg.stream = stream;
  EXPECT(attn_ctx_create(&ctx, &cfg) == ATTN_OK, "cuda context on a stream");
  if (!ctx) return;
  for (int bwd = 0; bwd < 2; bwd++)
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      stats_case c = cases[i];
      c.backward = bwd;
      stats_case_run(ctx, &c);
    }
  attn_ctx_destroy(ctx);
  cudaStreamDestroy(stream);
}

int main(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("no CUDA device: skipped\n");
    return 77;
  }
  const int B = 2, S = 300, H = 4, Hkv = 2, D = 128;
  attn_ctx_t gpu = NULL, cpu = NULL;
  attn_ctx_config cfg = ATTN_CTX_CONFIG_INIT;
  EXPECT(attn_ctx_create(&gpu, &cfg) == ATTN_OK, "auto backend");
  EXPECT(gpu && !strcmp(attn_ctx_backend_name(gpu), "cuda"), "auto picks cuda, got %s",
         gpu ? attn_ctx_backend_name(gpu) : "none");
  cfg.backend = ATTN_BACKEND_CPU;
  EXPECT(attn_ctx_create(&cpu, &cfg) == ATTN_OK, "cpu backend");
  if (!gpu || !cpu) return 1;
  stats_tests();
  { /* context memory: a round trip host -> device -> device -> host */
    float src[301], back[301];
    for (int i = 0; i < 301; i++) src[i] = (float)i * 0.5f - 7.0f, back[i] = NAN;
    void *a = NULL, *b = NULL;
    EXPECT(attn_ctx_device(gpu) == ATTN_DEVICE_CUDA, "cuda context memory is device memory");
    EXPECT(attn_ctx_alloc(gpu, sizeof src, &a) == ATTN_OK && attn_ctx_alloc(gpu, sizeof src, &b) == ATTN_OK,
           "alloc");
    EXPECT(attn_ctx_copy(gpu, a, src, sizeof src, ATTN_COPY_HOST_TO_CTX) == ATTN_OK, "copy in");
    EXPECT(attn_ctx_copy(gpu, b, a, sizeof src, ATTN_COPY_CTX_TO_CTX) == ATTN_OK, "copy within");
    EXPECT(attn_ctx_copy(gpu, back, b, sizeof src, ATTN_COPY_CTX_TO_HOST) == ATTN_OK, "copy out");
    EXPECT(!memcmp(src, back, sizeof src), "round trip through device memory differs");
    EXPECT(attn_ctx_sync(gpu) == ATTN_OK && attn_ctx_free(gpu, a) == ATTN_OK &&
               attn_ctx_free(gpu, b) == ATTN_OK,
           "sync and free");
  }

  size_t nq = (size_t)B * S * H * D, nk = (size_t)B * S * Hkv * D;
  uint16_t *dq16, *dk16, *dv16, *ddo16, *do16;
  float *q = rand_pair(nq, 1, &dq16), *k = rand_pair(nk, 2, &dk16), *v = rand_pair(nk, 3, &dv16);
  float *dout = rand_pair(nq, 4, &ddo16);
  float *o = malloc(nq * 4), *lse = malloc((size_t)B * H * S * 4);
  float *gq = malloc(nq * 4), *gk = malloc(nk * 4), *gv = malloc(nk * 4);
  cudaMalloc((void **)&do16, nq * 2);
  float *dlse, *dgq, *dgk, *dgv;
  cudaMalloc((void **)&dlse, (size_t)B * H * S * 4);
  cudaMalloc((void **)&dgq, nq * 4);
  cudaMalloc((void **)&dgk, nk * 4);
  cudaMalloc((void **)&dgv, nk * 4);

  for (int causal = 0; causal < 2; causal++) {
    attn_spec sp = ATTN_SPEC_INIT;
    sp.num_heads_q = H, sp.num_heads_kv = Hkv, sp.head_dim_qk = D, sp.causal = causal;
    sp.window_left = causal ? 100 : -1;
    attn_tensor tq = attn_tensor_f32(q, B, S, H, D), tk = attn_tensor_f32(k, B, S, Hkv, D);
    attn_tensor tv = attn_tensor_f32(v, B, S, Hkv, D), to = attn_tensor_f32(o, B, S, H, D);
    attn_tensor tdo = attn_tensor_f32(dout, B, S, H, D), tgq = attn_tensor_f32(gq, B, S, H, D);
    attn_tensor tgk = attn_tensor_f32(gk, B, S, Hkv, D), tgv = attn_tensor_f32(gv, B, S, Hkv, D);
    EXPECT(attn_fwd(cpu, &sp, &tq, &tk, &tv, &to, lse) == ATTN_OK, "cpu fwd");
    EXPECT(attn_bwd(cpu, &sp, &tq, &tk, &tv, &to, lse, &tdo, &tgq, &tgk, &tgv, NULL) == ATTN_OK,
           "cpu bwd");

    attn_tensor gq_ = dev_tensor(dq16, ATTN_BF16, B, S, H, D);
    attn_tensor gk_ = dev_tensor(dk16, ATTN_BF16, B, S, Hkv, D);
    attn_tensor gv_ = dev_tensor(dv16, ATTN_BF16, B, S, Hkv, D);
    attn_tensor go_ = dev_tensor(do16, ATTN_BF16, B, S, H, D);
    attn_tensor gdo = dev_tensor(ddo16, ATTN_BF16, B, S, H, D);
    attn_tensor gdq = dev_tensor(dgq, ATTN_F32, B, S, H, D);
    attn_tensor gdk = dev_tensor(dgk, ATTN_F32, B, S, Hkv, D);
    attn_tensor gdv = dev_tensor(dgv, ATTN_F32, B, S, Hkv, D);
    cudaMemset(do16, 0xff, nq * 2); /* poison */
    cudaDeviceSynchronize();
    EXPECT(attn_fwd(gpu, &sp, &gq_, &gk_, &gv_, &go_, dlse) == ATTN_OK, "cuda fwd");
    EXPECT(attn_bwd(gpu, &sp, &gq_, &gk_, &gv_, &go_, dlse, &gdo, &gdq, &gdk, &gdv, NULL) ==
               ATTN_OK,
           "cuda bwd");
    EXPECT(cudaDeviceSynchronize() == cudaSuccess, "sync");
    double eo = rel_err_dev(do16, 1, o, nq), el = rel_err_dev(dlse, 0, lse, (size_t)B * H * S);
    double eq = rel_err_dev(dgq, 0, gq, nq), ek = rel_err_dev(dgk, 0, gk, nk);
    double ev = rel_err_dev(dgv, 0, gv, nk);
    printf("causal=%d: O %.2e LSE %.2e dQ %.2e dK %.2e dV %.2e (vs cpu on the same inputs)\n",
           causal, eo, el, eq, ek, ev);
    /* bf16 output rounding is 2^-9 relative; P is rounded to bf16 inside the kernels. */
    EXPECT(eo < 1.6e-2 && el < 1e-3, "forward off: O %.2e LSE %.2e", eo, el);
    EXPECT(eq < 3e-2 && ek < 3e-2 && ev < 3e-2, "backward off: %.2e %.2e %.2e", eq, ek, ev);

    /* float32 device tensors on the CUDA context: the same inputs, float32 accuracy. */
    float *fq = dev_copy(q, nq), *fk = dev_copy(k, nk), *fv = dev_copy(v, nk);
    float *fdo = dev_copy(dout, nq), *fo = NULL;
    cudaMalloc((void **)&fo, nq * 4);
    cudaMemset(fo, 0xff, nq * 4); /* poison */
    cudaDeviceSynchronize();
    attn_tensor fq_ = dev_tensor(fq, ATTN_F32, B, S, H, D), fk_ = dev_tensor(fk, ATTN_F32, B, S, Hkv, D);
    attn_tensor fv_ = dev_tensor(fv, ATTN_F32, B, S, Hkv, D), fo_ = dev_tensor(fo, ATTN_F32, B, S, H, D);
    attn_tensor fdo_ = dev_tensor(fdo, ATTN_F32, B, S, H, D);
    EXPECT(attn_fwd(gpu, &sp, &fq_, &fk_, &fv_, &fo_, dlse) == ATTN_OK, "cuda f32 fwd");
    EXPECT(attn_bwd(gpu, &sp, &fq_, &fk_, &fv_, &fo_, dlse, &fdo_, &gdq, &gdk, &gdv, NULL) ==
               ATTN_OK,
           "cuda f32 bwd");
    EXPECT(cudaDeviceSynchronize() == cudaSuccess, "sync");
    eo = rel_err_dev(fo, 0, o, nq), el = rel_err_dev(dlse, 0, lse, (size_t)B * H * S);
    eq = rel_err_dev(dgq, 0, gq, nq), ek = rel_err_dev(dgk, 0, gk, nk), ev = rel_err_dev(dgv, 0, gv, nk);
    printf("causal=%d f32: O %.2e LSE %.2e dQ %.2e dK %.2e dV %.2e (vs cpu)\n", causal, eo, el, eq,
           ek, ev);
    /* both sides are float32 within ~1e-6 of float64: 1e-4 leaves room and still tells
     * float32 from a bf16 path (1e-2) */
    EXPECT(eo < 1e-4 && el < 1e-4 && eq < 1e-4 && ek < 1e-4 && ev < 1e-4,
           "f32 off: O %.2e LSE %.2e dQ %.2e dK %.2e dV %.2e", eo, el, eq, ek, ev);
    cudaFree(fq);
    cudaFree(fk);
    cudaFree(fv);
    cudaFree(fdo);
    cudaFree(fo);

    /* Validation on the CUDA context: host tensors are not taken. */
    EXPECT(attn_fwd(gpu, &sp, &tq, &tk, &tv, &to, lse) == ATTN_ERR_UNSUPPORTED, "host f32 rejected");
    attn_tensor bad = gdq; /* dq must be float32 */
    bad.dtype = ATTN_BF16;
    EXPECT(attn_bwd(gpu, &sp, &gq_, &gk_, &gv_, &go_, dlse, &gdo, &bad, &gdk, &gdv, NULL) ==
               ATTN_ERR_INVALID_ARG,
           "bf16 dq rejected");
  }
  attn_ctx_destroy(gpu);
  attn_ctx_destroy(cpu);
  printf("test_cuda_runtime: %s\n", failures ? "FAILED" : "all passed");
  return failures ? 1 : 0;
}
