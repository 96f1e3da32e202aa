/* test_ring.c — ring attention (attn_ring_fwd / attn_ring_bwd) against single-rank
 * attn_fwd / attn_bwd on the full problem, on 1..n ranks: O, LSE, dQ, dK, dV, dsinks for
 * both layouts, causal and not, windows, sinks, GQA, ALiBi, softcap, block masks, varlen
 * and uneven lengths; repeated runs bitwise identical; the per-step record (blocks the
 * mask excludes are neither computed nor sent); ranks that disagree fail together.
 *
 * Every rank regenerates the full inputs from fixed seeds, computes the single-rank
 * result, cuts its own shard, runs the ring and counts wrong elements; the verdict is
 * agreed with an MPI_Allreduce. Usage: test_ring
 * basic|features|varlen|random|errors|split|split_random (the split-KV parts: test_ring_split.c) */
#include "test_ring.h"

#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#define FWD_RTOL 1e-5
#define BWD_RTOL 1e-4

int g_rank, g_size;
static attn_ctx_t g_ctx;
attn_group_t g_grp;


/* The full problem, as every rank regenerates it, and its single-rank result. */
typedef struct {
  rcase c;
  attn_spec spec;
  float *q, *k, *v, *dout, *sinks, *alibi; /* [B,S,H,D] contiguous */
  int32_t *cu_q, *cu_kv;
  attn_block_mask bm;
  uint8_t *mask;
  float *o, *lse, *dq, *dk, *dv, *ds; /* single-rank results */
  attn_cp_shard qsh, ksh;
} full_prob;

/* A local [B, rows, H, D] tensor, contiguous or in [B, H, rows, D] order. */
static attn_tensor local_tensor(int64_t B, int64_t rows, int64_t H, int64_t D, int bhsd) {
  float *p = tu_falloc(B * rows * H * D);
  attn_tensor t = attn_tensor_f32(p, B, rows, H, D);
  if (bhsd) {
    int64_t st[4] = {H * rows * D, D, rows * D, 1};
    memcpy(t.stride, st, sizeof st);
  }
  return t;
}

static float *at(const attn_tensor *t, int64_t b, int64_t s, int64_t h) {
  return (float *)t->data + b * t->stride[0] + s * t->stride[1] + h * t->stride[2];
}

/* Global row of local row i of a shard. */
static int64_t global_row(const attn_cp_shard *sh, int64_t i) {
  return i < sh->len[0] ? sh->start[0] + i : sh->start[1] + (i - sh->len[0]);
}

/* The shard's rows of a full [B, S, H, D] array into t. */
static void put_rows(attn_tensor *t, const float *full, int64_t S, const attn_cp_shard *sh) {
  const int64_t B = t->shape[0], H = t->shape[2], D = t->shape[3];
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = 0; i < sh->rows; i++)
      for (int64_t h = 0; h < H; h++)
        memcpy(at(t, b, i, h), full + ((b * S + global_row(sh, i)) * H + h) * D,
               (size_t)D * sizeof(float));
}

static double max_abs(const float *x, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++)
    if (isfinite(x[i]) && fabs(x[i]) > m) m = fabs(x[i]);
  return m;
}

/* One element: wrong unless within thr (or the same infinity). Tracks the worst. */
typedef struct {
  int64_t wrong;
  double worst, got, ref;
  int64_t where;
} tally;

static void judge(tally *t, float got, float ref, double thr, int64_t where) {
  double d = isfinite(ref) ? (isfinite(got) ? fabs((double)got - ref) : INFINITY)
                           : (got == ref ? 0.0 : INFINITY);
  if (d > thr) t->wrong++;
  if (d > t->worst || (t->where < 0 && d > thr)) {
    t->worst = d;
    t->got = got;
    t->ref = ref;
    t->where = where;
  }
}

/* Worst error relative to max|ref| of the case so far: forward (O, LSE), backward. */
static double g_rel[2];

static int64_t report(const char *what, const char *name, const tally *t, double thr) {
  if (t->wrong)
    fprintf(stderr, "rank %d: %s %s: %lld wrong (tol %.3g); worst at flat %lld: got %.9g ref %.9g\n",
            g_rank, name, what, (long long)t->wrong, thr, (long long)t->where, t->got, t->ref);
  return t->wrong;
}

/* Local t against the shard's rows of the full array ref; tolerance rtol * max|ref|. */
static int64_t compare_rows(const char *what, const char *name, const attn_tensor *t,
                            const float *ref, int64_t S, const attn_cp_shard *sh, double rtol) {
  const int64_t B = t->shape[0], H = t->shape[2], D = t->shape[3];
  const double thr = rtol * max_abs(ref, B * S * H * D) + 1e-7;
  tally tl = {0, 0, 0, 0, -1};
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = 0; i < sh->rows; i++)
      for (int64_t h = 0; h < H; h++) {
        const float *g = at(t, b, i, h), *r = ref + ((b * S + global_row(sh, i)) * H + h) * D;
        for (int64_t d = 0; d < D; d++) judge(&tl, g[d], r[d], thr, ((b * S + global_row(sh, i)) * H + h) * D + d);
      }
  double rel = tl.worst / (thr / rtol), *worst = &g_rel[rtol != FWD_RTOL];
  if (rel > *worst) *worst = rel;
  return report(what, name, &tl, thr);
}

static int64_t compare_lse(const char *name, const float *lse, const float *ref, int64_t B,
                           int64_t H, int64_t S, const attn_cp_shard *sh) {
  const double thr = FWD_RTOL * max_abs(ref, B * H * S) + 1e-7;
  tally tl = {0, 0, 0, 0, -1};
  for (int64_t bh = 0; bh < B * H; bh++)
    for (int64_t i = 0; i < sh->rows; i++)
      judge(&tl, lse[bh * sh->rows + i], ref[bh * S + global_row(sh, i)], thr, bh * S + global_row(sh, i));
  if (tl.worst / (thr / FWD_RTOL) > g_rel[0]) g_rel[0] = tl.worst / (thr / FWD_RTOL);
  return report("lse", name, &tl, thr);
}

static void make_full(full_prob *F, const rcase *c) {
  memset(F, 0, sizeof *F);
  F->c = *c;
  const rcase *k = &F->c;
  const int Dv = k->Dv ? k->Dv : k->Dqk;
  attn_spec s = ATTN_SPEC_INIT;
  s.num_heads_q = k->Hq;
  s.num_heads_kv = k->Hkv;
  s.head_dim_qk = k->Dqk;
  s.head_dim_v = Dv;
  s.causal = k->causal;
  s.window_left = k->wl;
  s.window_right = k->wr;
  s.softcap = k->softcap;
  uint64_t seed = k->seed;
  F->q = tu_falloc(k->B * k->Sq * k->Hq * k->Dqk);
  F->k = tu_falloc(k->B * k->Skv * k->Hkv * k->Dqk);
  F->v = tu_falloc(k->B * k->Skv * k->Hkv * Dv);
  F->dout = tu_falloc(k->B * k->Sq * k->Hq * Dv);
  tu_fill(F->q, k->B * k->Sq * k->Hq * k->Dqk, -1.5, 1.5, seed + 1);
  tu_fill(F->k, k->B * k->Skv * k->Hkv * k->Dqk, -1.5, 1.5, seed + 2);
  tu_fill(F->v, k->B * k->Skv * k->Hkv * Dv, -1, 1, seed + 3);
  tu_fill(F->dout, k->B * k->Sq * k->Hq * Dv, -1, 1, seed + 4);
  if (k->sinks) {
    F->sinks = tu_falloc(k->Hq);
    tu_fill(F->sinks, k->Hq, -1, 2.5, seed + 5);
    s.sinks = F->sinks;
  }
  if (k->alibi) {
    F->alibi = tu_falloc(k->Hq);
    tu_fill(F->alibi, k->Hq, 0.002, 0.05, seed + 6);
    s.alibi_slopes = F->alibi;
  }
  if (k->nseq) {
    F->cu_q = tu_alloc((size_t)(k->nseq + 1) * sizeof(int32_t));
    F->cu_kv = tu_alloc((size_t)(k->nseq + 1) * sizeof(int32_t));
    for (int i = 0; i < k->nseq; i++) {
      F->cu_q[i + 1] = F->cu_q[i] + k->lq[i];
      F->cu_kv[i + 1] = F->cu_kv[i] + k->lkv[i];
    }
    s.cu_seqlens_q = F->cu_q;
    s.cu_seqlens_kv = F->cu_kv;
    s.num_seqs = k->nseq;
  }
  if (k->bmask) {
    F->bm = (attn_block_mask){32, 32, (k->Sq + 31) / 32, (k->Skv + 31) / 32, NULL};
    F->mask = tu_alloc((size_t)(F->bm.num_q_blocks * F->bm.num_k_blocks));
    attn_sparse_pattern p = {1, 5, 1, 2, seed + 7};
    if (attn_block_mask_fill(&F->bm, F->mask, &p) != ATTN_OK) {
      fprintf(stderr, "attn_block_mask_fill: %s\n", attn_last_error());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    s.block_mask = &F->bm;
  }
  F->spec = s;
}

static void single_rank(full_prob *F) {
  const rcase *c = &F->c;
  const int Dv = F->spec.head_dim_v;
  attn_tensor q = attn_tensor_f32(F->q, c->B, c->Sq, c->Hq, c->Dqk);
  attn_tensor k = attn_tensor_f32(F->k, c->B, c->Skv, c->Hkv, c->Dqk);
  attn_tensor v = attn_tensor_f32(F->v, c->B, c->Skv, c->Hkv, Dv);
  attn_tensor dout = attn_tensor_f32(F->dout, c->B, c->Sq, c->Hq, Dv);
  F->o = tu_falloc(c->B * c->Sq * c->Hq * Dv);
  F->lse = tu_falloc(c->B * c->Hq * c->Sq);
  F->dq = tu_falloc(c->B * c->Sq * c->Hq * c->Dqk);
  F->dk = tu_falloc(c->B * c->Skv * c->Hkv * c->Dqk);
  F->dv = tu_falloc(c->B * c->Skv * c->Hkv * Dv);
  F->ds = tu_falloc(c->Hq);
  attn_tensor o = attn_tensor_f32(F->o, c->B, c->Sq, c->Hq, Dv);
  attn_tensor dq = attn_tensor_f32(F->dq, c->B, c->Sq, c->Hq, c->Dqk);
  attn_tensor dk = attn_tensor_f32(F->dk, c->B, c->Skv, c->Hkv, c->Dqk);
  attn_tensor dv = attn_tensor_f32(F->dv, c->B, c->Skv, c->Hkv, Dv);
  if (attn_fwd(g_ctx, &F->spec, &q, &k, &v, &o, F->lse) != ATTN_OK ||
      attn_bwd(g_ctx, &F->spec, &q, &k, &v, &o, F->lse, &dout, &dq, &dk, &dv, F->ds) != ATTN_OK) {
    fprintf(stderr, "rank %d: single-rank %s failed: %s\n", g_rank, c->name, attn_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

static void free_full(full_prob *F) {
  float *fs[] = {F->q, F->k, F->v, F->dout, F->sinks, F->alibi, F->o, F->lse, F->dq, F->dk, F->dv, F->ds};
  for (size_t i = 0; i < sizeof fs / sizeof *fs; i++) free(fs[i]);
  free(F->cu_q);
  free(F->cu_kv);
  free(F->mask);
}

/* This rank's shard and the ring's outputs. */
typedef struct {
  attn_tensor q, k, v, dout, o, dq, dk, dv;
  float *lse, *ds;
} shard;

static void make_shard(shard *L, const full_prob *F) {
  const rcase *c = &F->c;
  const int64_t sq = F->qsh.rows, skv = F->ksh.rows, Dv = F->spec.head_dim_v;
  L->q = local_tensor(c->B, sq, c->Hq, c->Dqk, c->bhsd);
  L->k = local_tensor(c->B, skv, c->Hkv, c->Dqk, c->bhsd);
  L->v = local_tensor(c->B, skv, c->Hkv, Dv, c->bhsd);
  L->dout = local_tensor(c->B, sq, c->Hq, Dv, c->bhsd);
  L->o = local_tensor(c->B, sq, c->Hq, Dv, c->bhsd);
  L->dq = local_tensor(c->B, sq, c->Hq, c->Dqk, c->bhsd);
  L->dk = local_tensor(c->B, skv, c->Hkv, c->Dqk, c->bhsd);
  L->dv = local_tensor(c->B, skv, c->Hkv, Dv, c->bhsd);
  L->lse = tu_falloc(c->B * c->Hq * sq);
  L->ds = tu_falloc(c->Hq);
  put_rows(&L->q, F->q, c->Sq, &F->qsh);
  put_rows(&L->k, F->k, c->Skv, &F->ksh);
  put_rows(&L->v, F->v, c->Skv, &F->ksh);
  put_rows(&L->dout, F->dout, c->Sq, &F->qsh);
}

static void free_shard(shard *L) {
  attn_tensor *ts[] = {&L->q, &L->k, &L->v, &L->dout, &L->o, &L->dq, &L->dk, &L->dv};
  for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) free(ts[i]->data);
  free(L->lse);
  free(L->ds);
}

static int64_t numel(const attn_tensor *t) {
  return t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3];
}

typedef attn_status (*fwd_fn)(attn_group_t, const attn_spec *, attn_cp_layout, int64_t, int64_t,
                              const attn_tensor *, const attn_tensor *, const attn_tensor *,
                              attn_tensor *, float *);
typedef attn_status (*bwd_fn)(attn_group_t, const attn_spec *, attn_cp_layout, int64_t, int64_t,
                              const attn_tensor *, const attn_tensor *, const attn_tensor *,
                              const attn_tensor *, const float *, const attn_tensor *,
                              attn_tensor *, attn_tensor *, attn_tensor *, float *);

/* Outputs poisoned, then the forward and backward (ring or split-KV). 0 on success. */
static int run_ring(const full_prob *F, shard *L) {
  const rcase *c = &F->c;
  const fwd_fn fwd = c->split ? attn_split_kv_fwd : attn_ring_fwd;
  const bwd_fn bwd = c->split ? attn_split_kv_bwd : attn_ring_bwd;
  attn_tensor *outs[] = {&L->o, &L->dq, &L->dk, &L->dv};
  for (int i = 0; i < 4; i++) tu_poison(outs[i]->data, numel(outs[i]));
  tu_poison(L->lse, c->B * c->Hq * F->qsh.rows);
  tu_poison(L->ds, c->Hq);
  attn_status st = fwd(g_grp, &F->spec, c->layout, c->Sq, c->Skv, &L->q, &L->k, &L->v, &L->o,
                       L->lse);
  if (st == ATTN_OK)
    st = bwd(g_grp, &F->spec, c->layout, c->Sq, c->Skv, &L->q, &L->k, &L->v, &L->o, L->lse,
             &L->dout, &L->dq, &L->dk, &L->dv, L->ds);
  if (st != ATTN_OK)
    fprintf(stderr, "rank %d: %s: %s failed: %s: %s\n", g_rank, c->name,
            c->split ? "split-kv" : "ring", attn_status_string(st), attn_last_error());
  return st != ATTN_OK;
}

/* 1 (and a message) unless x [n] is bitwise the same on every rank. */
static int64_t differs_between_ranks(const char *what, const char *name, const float *x, int64_t n) {
  uint64_t h = 0xcbf29ce484222325ull, *all = tu_alloc((size_t)g_size * sizeof *all);
  const unsigned char *b = (const unsigned char *)x;
  for (int64_t i = 0; i < n * 4; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  MPI_Allgather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, MPI_COMM_WORLD);
  int64_t bad = 0;
  for (int p = 1; p < g_size && !bad; p++)
    if (all[p] != all[0]) {
      fprintf(stderr, "rank %d: %s: %s differs between ranks 0 and %d\n", g_rank, name, what, p);
      bad = 1;
    }
  free(all);
  return bad;
}

/* Local copies of the outputs (the tensors are contiguous in their own order). */
static void snapshot(const shard *L, const full_prob *F, float **out) {
  const attn_tensor *ts[] = {&L->o, &L->dq, &L->dk, &L->dv};
  for (int i = 0; i < 4; i++) {
    out[i] = tu_alloc((size_t)numel(ts[i]) * sizeof(float));
    memcpy(out[i], ts[i]->data, (size_t)numel(ts[i]) * sizeof(float));
  }
  int64_t nl = F->c.B * F->c.Hq * F->qsh.rows;
  out[4] = tu_alloc((size_t)(nl + F->c.Hq) * sizeof(float));
  memcpy(out[4], L->lse, (size_t)nl * sizeof(float));
  memcpy(out[4] + nl, L->ds, (size_t)F->c.Hq * sizeof(float));
}

static int64_t same_bits(const shard *L, const full_prob *F, float **prev) {
  float *now[5];
  snapshot(L, F, now);
  const attn_tensor *ts[] = {&L->o, &L->dq, &L->dk, &L->dv};
  int64_t bad = 0;
  for (int i = 0; i < 5; i++) {
    size_t n = i < 4 ? (size_t)numel(ts[i]) : (size_t)(F->c.B * F->c.Hq * F->qsh.rows + F->c.Hq);
    if (memcmp(now[i], prev[i], n * sizeof(float))) bad++;
    free(now[i]);
  }
  if (bad) fprintf(stderr, "rank %d: %s: a repeated run differs in %lld outputs\n", g_rank, F->c.name, (long long)bad);
  return bad;
}

/* The step record against what positions imply (contiguous causal, Sq == Skv): rank r
 * computes blocks y <= r only, and sends block r-s only while a later rank needs it. */
static int64_t check_steps(const full_prob *F, int fwd_window) {
  const int P = g_size, r = g_rank;
  attn_ring_step st[64];
  int32_t n = 0;
  if (attn_group_last_steps(g_grp, st, 64, &n) != ATTN_OK || n != P) {
    fprintf(stderr, "rank %d: %s: %d steps recorded, %d expected\n", r, F->c.name, n, P);
    return 1;
  }
  int64_t bad = 0, row_bytes = F->c.B * F->c.Hkv * (F->c.Dqk + F->spec.head_dim_v) * 4;
  for (int s = 0; s < P; s++) {
    int y = r - s, need = y >= 0 && (!fwd_window || s <= 1);
    int64_t sends = fwd_window ? (s == 0 && r + 1 < P ? F->c.wl * row_bytes : 0)
                               : (y >= 0 && r + 1 < P ? 1 : 0);
    int ok = st[s].computed == need && (fwd_window ? st[s].bytes == sends : (st[s].bytes > 0) == sends);
    if (!ok) {
      fprintf(stderr, "rank %d: %s: step %d computed=%d bytes=%lld (expected %d, %s%lld)\n", r,
              F->c.name, s, st[s].computed, (long long)st[s].bytes, need,
              fwd_window ? "" : "sends=", (long long)sends);
      bad++;
    }
  }
  return bad;
}

/* Split-KV's record: one step, computed on the last rank only (check_steps 3), sending
 * its state when there are other ranks. */
static int64_t check_split_steps(const full_prob *F) {
  attn_ring_step st[4];
  int32_t n = 0;
  int ok = attn_group_last_steps(g_grp, st, 4, &n) == ATTN_OK && n == 1 &&
           st[0].computed == (g_rank == g_size - 1) && (st[0].bytes > 0) == (g_size > 1);
  if (!ok)
    fprintf(stderr, "rank %d: %s: %d steps, computed=%d bytes=%lld (expected 1 step, computed=%d)\n",
            g_rank, F->c.name, n, n ? st[0].computed : -1, n ? (long long)st[0].bytes : -1LL,
            g_rank == g_size - 1);
  return !ok;
}

int run_case(const rcase *c) {
  full_prob F;
  shard L;
  make_full(&F, c);
  single_rank(&F);
  if (c->split)
    F.qsh = (attn_cp_shard){1, {0, 0}, {c->Sq, 0}, c->Sq};
  else
    attn_cp_shard_rows(c->layout, g_size, g_rank, c->Sq, &F.qsh);
  attn_cp_shard_rows(c->layout, g_size, g_rank, c->Skv, &F.ksh);
  make_shard(&L, &F);
  int64_t failed = run_ring(&F, &L), wrong = 0, steps_bad = 0;
  /* Agreed, so that every rank takes the same collectives below. */
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  wrong = g_rank == 0 ? failed : 0; /* counted once */
  if (!failed && c->check_steps) {
    /* The record is of the backward; run the forward alone to see its own record. */
    attn_tensor o2 = local_tensor(c->B, F.qsh.rows, c->Hq, F.spec.head_dim_v, 0);
    float *lse2 = tu_falloc(c->B * c->Hq * F.qsh.rows);
    const fwd_fn fwd = c->split ? attn_split_kv_fwd : attn_ring_fwd;
    if (fwd(g_grp, &F.spec, c->layout, c->Sq, c->Skv, &L.q, &L.k, &L.v, &o2, lse2) != ATTN_OK)
      steps_bad++;
    else
      steps_bad += c->split ? check_split_steps(&F) : check_steps(&F, c->check_steps == 2);
    free(o2.data);
    free(lse2);
  }
  if (!failed) {
    wrong += compare_rows("o", c->name, &L.o, F.o, c->Sq, &F.qsh, FWD_RTOL);
    wrong += compare_lse(c->name, L.lse, F.lse, c->B, c->Hq, c->Sq, &F.qsh);
    wrong += compare_rows("dq", c->name, &L.dq, F.dq, c->Sq, &F.qsh, BWD_RTOL);
    wrong += compare_rows("dk", c->name, &L.dk, F.dk, c->Skv, &F.ksh, BWD_RTOL);
    wrong += compare_rows("dv", c->name, &L.dv, F.dv, c->Skv, &F.ksh, BWD_RTOL);
    if (c->sinks) {
      tally tl = {0, 0, 0, 0, -1};
      double thr = BWD_RTOL * max_abs(F.ds, c->Hq) + 1e-7;
      for (int h = 0; h < c->Hq; h++) judge(&tl, L.ds[h], F.ds[h], thr, h);
      wrong += report("dsinks", c->name, &tl, thr);
      /* dsinks is the CP group's (ring: sum): bitwise the same on every rank. */
      wrong += differs_between_ranks("dsinks", c->name, L.ds, c->Hq);
    }
    if (c->split) { /* every rank holds the same query rows and their outputs */
      wrong += differs_between_ranks("o", c->name, L.o.data, numel(&L.o));
      wrong += differs_between_ranks("lse", c->name, L.lse, c->B * c->Hq * c->Sq);
      wrong += differs_between_ranks("dq", c->name, L.dq.data, numel(&L.dq));
    }
    float *prev[5];
    snapshot(&L, &F, prev);
    wrong += run_ring(&F, &L) ? 1 : same_bits(&L, &F, prev);
    for (int i = 0; i < 5; i++) free(prev[i]);
  }
  int64_t local[2] = {wrong, steps_bad}, total[2];
  double rel[2];
  MPI_Allreduce(local, total, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(g_rel, rel, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  g_rel[0] = g_rel[1] = 0;
  if (g_rank == 0)
    printf("%-4s %-40s np=%d  wrong=%lld  step-record errors=%lld  max rel err fwd %.1e bwd %.1e\n",
           total[0] || total[1] ? "FAIL" : "ok", c->name, g_size, (long long)total[0],
           (long long)total[1], rel[0], rel[1]);
  free_shard(&L);
  free_full(&F);
  return !total[0] && !total[1];
}

/* ---- the parts ------------------------------------------------------------------------ */
const rcase ring_base = {.layout = ATTN_LAYOUT_ZIGZAG, .B = 1, .Sq = 512, .Skv = 512, .Hq = 4,
                           .Hkv = 2, .Dqk = 32, .wl = -1, .wr = -1, .seed = 11};

static int part_basic(void) {
  int ok = 1;
  for (int layout = 0; layout < 2; layout++)
    for (int causal = 0; causal < 2; causal++) {
      rcase c = ring_base;
      static char names[4][64];
      snprintf(names[layout * 2 + causal], 64, "%s %s", layout ? "zigzag" : "contiguous",
               causal ? "causal" : "full");
      c.name = names[layout * 2 + causal];
      c.layout = layout;
      c.causal = causal;
      c.B = 2;
      c.Dqk = 64;
      c.check_steps = causal && !layout;
      c.seed = 100 + layout * 2 + causal;
      ok &= run_case(&c);
    }
  rcase u = ring_base;
  u.name = "uneven causal zigzag S=517, Dv=48";
  u.Sq = u.Skv = 517;
  u.Dv = 48;
  u.causal = 1;
  ok &= run_case(&u);
  u.name = "uneven contiguous Sq=300 < Skv=517 causal";
  u.layout = ATTN_LAYOUT_CONTIGUOUS;
  u.Sq = 300;
  ok &= run_case(&u);
  u.name = "zigzag Sq=517 > Skv=260 causal (empty rows)";
  u.layout = ATTN_LAYOUT_ZIGZAG;
  u.Sq = 517;
  u.Skv = 260;
  ok &= run_case(&u);
  u = ring_base;
  u.name = "zigzag bhsd strides, MQA";
  u.Hkv = 1;
  u.bhsd = 1;
  u.causal = 1;
  ok &= run_case(&u);
  return ok;
}

static int part_features(void) {
  int ok = 1;
  rcase c = ring_base;
  c.name = "contiguous causal window 40 < chunk";
  c.layout = ATTN_LAYOUT_CONTIGUOUS;
  c.Sq = c.Skv = 640;
  c.causal = 1;
  c.wl = 40;
  c.check_steps = 2;
  ok &= run_case(&c);
  c.name = "zigzag causal window 40 < chunk";
  c.layout = ATTN_LAYOUT_ZIGZAG;
  c.check_steps = 0;
  ok &= run_case(&c);
  c.name = "zigzag two-sided window (100, 33), no causal";
  c.causal = 0;
  c.wl = 100;
  c.wr = 33;
  ok &= run_case(&c);
  c.name = "contiguous window (300, 7) across chunks";
  c.layout = ATTN_LAYOUT_CONTIGUOUS;
  c.wl = 300;
  c.wr = 7;
  ok &= run_case(&c);
  c = ring_base;
  c.name = "zigzag causal sinks + GQA 6/2";
  c.Hq = 6;
  c.causal = 1;
  c.sinks = 1;
  ok &= run_case(&c);
  c.name = "contiguous alibi + softcap + sinks";
  c.layout = ATTN_LAYOUT_CONTIGUOUS;
  c.alibi = 1;
  c.softcap = 5.0f;
  ok &= run_case(&c);
  c.name = "zigzag causal window + alibi + sinks";
  c.layout = ATTN_LAYOUT_ZIGZAG;
  c.softcap = 0;
  c.wl = 70;
  ok &= run_case(&c);
  c = ring_base;
  c.name = "zigzag block-sparse mask, causal";
  c.Sq = c.Skv = 576;
  c.causal = 1;
  c.bmask = 1;
  ok &= run_case(&c);
  return ok;
}

static int part_varlen(void) {
  static const int32_t lq[] = {100, 37, 1, 250, 0, 61, 70};   /* 519 */
  static const int32_t lkv[] = {100, 37, 1, 250, 0, 61, 70};
  static const int32_t lkv2[] = {130, 20, 5, 250, 9, 40, 90}; /* 544 */
  int ok = 1;
  for (int layout = 0; layout < 2; layout++) {
    rcase c = ring_base;
    c.layout = layout;
    c.nseq = 7;
    c.lq = lq;
    c.lkv = lkv;
    c.Sq = c.Skv = 519;
    c.causal = 1;
    c.name = layout ? "varlen zigzag causal" : "varlen contiguous causal";
    ok &= run_case(&c);
    c.lkv = lkv2;
    c.Skv = 544;
    c.sinks = 1;
    c.name = layout ? "varlen zigzag causal Sq!=Skv per seq, sinks" : "varlen contiguous Sq!=Skv, sinks";
    ok &= run_case(&c);
    c.lkv = lkv;
    c.Skv = 519;
    c.sinks = 0;
    c.wl = 30;
    c.alibi = 1;
    c.name = layout ? "varlen zigzag causal window 30 + alibi" : "varlen contiguous window 30 + alibi";
    ok &= run_case(&c);
    c.causal = 0;
    c.wl = -1;
    c.alibi = 0;
    c.name = layout ? "varlen zigzag full" : "varlen contiguous full";
    ok &= run_case(&c);
  }
  return ok;
}

void random_flags(tu_rng *rng, rcase *c, int64_t left, int64_t wide_left) {
  int w = (int)tu_randint(rng, 0, 3);
  if (w == 1) c->wl = tu_randint(rng, 0, left);
  if (w == 2) c->wr = tu_randint(rng, 0, 64);
  if (w == 3) c->wl = tu_randint(rng, 0, wide_left), c->wr = tu_randint(rng, 0, 20);
  c->sinks = tu_randint(rng, 0, 2) == 0;
  c->alibi = tu_randint(rng, 0, 2) == 0;
  c->softcap = tu_randint(rng, 0, 3) == 0 ? 4.0f : 0.0f;
}

const char *case_name(char *buf, size_t n, const char *prefix, int i, const rcase *c) {
  snprintf(buf, n, "%s %d: %s S=%lld/%lld H=%d/%d D=%d/%d%s w=(%lld,%lld)%s%s%s%s%s%s", prefix, i,
           c->layout ? "zz" : "ct", (long long)c->Sq, (long long)c->Skv, c->Hq, c->Hkv, c->Dqk,
           c->Dv, c->causal ? " causal" : "", (long long)c->wl, (long long)c->wr,
           c->sinks ? " sinks" : "", c->alibi ? " alibi" : "", c->softcap > 0 ? " cap" : "",
           c->nseq ? " varlen" : "", c->bmask ? " bmask" : "", c->bhsd ? " bhsd" : "");
  return buf;
}

/* Random cases from one seed (the same on every rank): shapes, layouts and every mask
 * flag mixed, windows down to 0, varlen with empty and one-row sequences. */
static int part_random(void) {
  static int32_t lq[16], lkv[16];
  static char names[24][112];
  tu_rng rng = tu_rng_make(2024);
  int ok = 1;
  for (int n = 0; n < 24; n++) {
    rcase c = ring_base;
    c.seed = 1000 + (uint64_t)n;
    c.layout = (attn_cp_layout)tu_randint(&rng, 0, 1);
    c.causal = (int)tu_randint(&rng, 0, 1);
    c.Hkv = (int)tu_randint(&rng, 1, 2);
    c.Hq = c.Hkv * (int)tu_randint(&rng, 1, 3);
    c.Dqk = (int)tu_randint(&rng, 8, 40);
    c.Dv = (int)tu_randint(&rng, 0, 1) ? (int)tu_randint(&rng, 8, 40) : 0;
    c.Sq = tu_randint(&rng, 2 * g_size + 1, 420);
    c.Skv = tu_randint(&rng, 0, 1) ? c.Sq : tu_randint(&rng, 2 * g_size + 1, 420);
    random_flags(&rng, &c, 64, 150);
    if (tu_randint(&rng, 0, 2) == 0) { /* varlen: B = 1, random lengths summing to Sq / Skv */
      c.nseq = (int)tu_randint(&rng, 1, 16);
      int64_t tq = 0, tk = 0;
      for (int i = 0; i < c.nseq; i++) {
        lq[i] = (int32_t)tu_randint(&rng, 0, 60);
        lkv[i] = tu_randint(&rng, 0, 1) ? lq[i] : (int32_t)tu_randint(&rng, 0, 60);
        tq += lq[i];
        tk += lkv[i];
      }
      lq[c.nseq - 1] += (int32_t)(tq < 2 * g_size ? 2 * g_size : 0);
      lkv[c.nseq - 1] += (int32_t)(tk < 2 * g_size ? 2 * g_size : 0);
      c.Sq = tq + (tq < 2 * g_size ? 2 * g_size : 0);
      c.Skv = tk + (tk < 2 * g_size ? 2 * g_size : 0);
      c.lq = lq;
      c.lkv = lkv;
    } else {
      c.B = tu_randint(&rng, 1, 2);
      c.bmask = tu_randint(&rng, 0, 3) == 0;
    }
    c.name = case_name(names[n], sizeof names[n], "random", n, &c);
    ok &= run_case(&c);
  }
  return ok;
}

/* ---- errors: every rank fails, together, with one clear message ------------------------ */

/* The ring forward (and backward) on this rank's view of a problem; tweak edits it first. */
typedef struct {
  int heads_q;     /* this rank's Hq */
  int64_t seq;     /* this rank's global length */
  int64_t rows_delta; /* extra local query rows (a shard of the wrong size) */
  int null_o;      /* pass o = NULL */
} view;

static attn_status ring_with(const view *w, attn_status *bwd) {
  attn_spec s = ATTN_SPEC_INIT;
  s.num_heads_q = w->heads_q;
  s.num_heads_kv = 2;
  s.head_dim_qk = 32;
  s.causal = 1;
  attn_cp_shard sh;
  attn_cp_shard_rows(ATTN_LAYOUT_ZIGZAG, g_size, g_rank, w->seq, &sh);
  int64_t sq = sh.rows + w->rows_delta > 0 ? sh.rows + w->rows_delta : 1, skv = sh.rows > 0 ? sh.rows : 1;
  attn_tensor q = local_tensor(1, sq, w->heads_q, 32, 0), k = local_tensor(1, skv, 2, 32, 0);
  attn_tensor v = local_tensor(1, skv, 2, 32, 0), o = local_tensor(1, sq, w->heads_q, 32, 0);
  attn_tensor dq = local_tensor(1, sq, w->heads_q, 32, 0), dk = local_tensor(1, skv, 2, 32, 0);
  attn_tensor dv = local_tensor(1, skv, 2, 32, 0);
  tu_fill(q.data, numel(&q), -1, 1, 1);
  tu_fill(k.data, numel(&k), -1, 1, 2);
  tu_fill(v.data, numel(&v), -1, 1, 3);
  float *lse = tu_falloc(w->heads_q * sq);
  for (int64_t i = 0; i < w->heads_q * sq; i++) lse[i] = 1.0f;
  attn_status st = attn_ring_fwd(g_grp, &s, ATTN_LAYOUT_ZIGZAG, w->seq, w->seq, &q, &k, &v,
                                 w->null_o ? NULL : &o, lse);
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", attn_last_error());
  tu_fill(o.data, numel(&o), -1, 1, 4);
  *bwd = attn_ring_bwd(g_grp, &s, ATTN_LAYOUT_ZIGZAG, w->seq, w->seq, &q, &k, &v,
                       w->null_o ? NULL : &o, lse, &o, &dq, &dk, &dv, NULL);
  if (st != ATTN_OK) fprintf(stderr, "  rank %d: %s: %s\n", g_rank, attn_status_string(st), msg);
  attn_tensor *ts[] = {&q, &k, &v, &o, &dq, &dk, &dv};
  for (int i = 0; i < 7; i++) free(ts[i]->data);
  free(lse);
  return st;
}

/* Runs w on every rank; every rank's forward and backward must return `expected`.
 * Returns 1 on pass, agreed over the ranks. */
static int expect(const char *name, const view *w, attn_status expected) {
  attn_status bwd, fwd = ring_with(w, &bwd);
  int64_t bad = (fwd != expected) + (bwd != expected), total;
  if (bad)
    fprintf(stderr, "rank %d: %s: forward %s, backward %s, expected %s\n", g_rank, name,
            attn_status_string(fwd), attn_status_string(bwd), attn_status_string(expected));
  MPI_Allreduce(&bad, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0) printf("%-4s %-40s np=%d\n", total ? "FAIL" : "ok", name, g_size);
  return total == 0;
}

static int part_errors(void) {
  const int P = g_size, last = P - 1;
  int ok = 1;
  view w = {4, 512, 0, 0};
  ok &= expect("agreeing ranks: ok", &w, ATTN_OK);
  if (P > 1) {
    view x = w;
    if (g_rank == last) x.heads_q = 2;
    ok &= expect("one rank with other heads: MISMATCH", &x, ATTN_ERR_MISMATCH);
    x = w;
    if (g_rank == last) x.seq = 512 + 2 * P;
    ok &= expect("one rank with another seq: MISMATCH", &x, ATTN_ERR_MISMATCH);
    x = w;
    if (g_rank == 0) x.null_o = 1;
    ok &= expect("rank 0 passes o = NULL: all fail", &x, ATTN_ERR_MISMATCH);
    x = w;
    if (g_rank == last) x.rows_delta = 1;
    ok &= expect("one rank's shard a row long: all fail", &x, ATTN_ERR_MISMATCH);
    x = w;
    x.seq = P - 1; /* a rank without rows: the same error everywhere */
    ok &= expect("seq shorter than cp: INVALID_ARG", &x, ATTN_ERR_INVALID_ARG);
    x.seq = P; /* one row per rank is still a ring */
    ok &= expect("seq = cp, one row per rank: ok", &x, ATTN_OK);
  } else {
    view x = w;
    x.null_o = 1;
    ok &= expect("o = NULL: INVALID_ARG", &x, ATTN_ERR_INVALID_ARG);
  }
  ok &= expect("the group still works afterwards", &w, ATTN_OK);
  return ok;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  const char *part = argc > 1 ? argv[1] : "basic";
  attn_ctx_config cc = ATTN_CTX_CONFIG_INIT;
  cc.backend = ATTN_BACKEND_CPU;
  cc.num_threads = 1;
  attn_group_config gc = ATTN_GROUP_CONFIG_INIT;
  gc.cp = g_size;
  gc.timeout_s = 60; /* a hang shows as a timeout, well within the ctest limit */
  MPI_Comm world = MPI_COMM_WORLD;
  if (attn_ctx_create(&g_ctx, &cc) != ATTN_OK || attn_group_create(&g_grp, g_ctx, &world, &gc) != ATTN_OK) {
    fprintf(stderr, "rank %d: setup failed: %s\n", g_rank, attn_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int ok = !strcmp(part, "basic")      ? part_basic()
           : !strcmp(part, "features") ? part_features()
           : !strcmp(part, "varlen")   ? part_varlen()
           : !strcmp(part, "random")   ? part_random()
           : !strcmp(part, "errors")   ? part_errors()
           : !strcmp(part, "split")    ? part_split()
           : !strcmp(part, "split_random") ? part_split_random()
                                       : -1;
  if (ok < 0 && g_rank == 0)
    fprintf(stderr, "usage: test_ring basic|features|varlen|random|errors|split|split_random\n");
  attn_group_destroy(g_grp);
  attn_ctx_destroy(g_ctx);
  MPI_Finalize();
  if (g_rank == 0) printf("test_ring %s: %s\n", part, ok == 1 ? "passed" : "FAILED");
  return ok == 1 ? 0 : 1;
}
