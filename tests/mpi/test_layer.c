/* test_layer.c — the tensor-parallel attention layer on tp x cp ranks against a float64
 * reference of the whole layer, exact agreement on the integer path, bitwise identity
 * across ranks and runs, and bad configurations failing on every rank without a hang.
 *
 * fault: forward and backward in a loop, as a training step would run them; ATTN_FAULT (set
 * by the test) makes a rank exit, die or stall inside a collective, and a rank that gets
 * an error prints it and calls MPI_Abort, so the job must end non-zero, naming the rank
 * (tests/mpi/expect_fail.cmake checks).
 *
 * Usage (under mpiexec): test_layer ref|exact|bitwise|bad|fault <tp> <cp>, tp*cp = ranks. */
#include "test_layer.h"

#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#define RTOL_FWD 2e-5 /* against the float64 reference */
#define RTOL_BWD 1e-4
#define ATOL 1e-6
/* bf16 / f16 attention inside the layer: Q, K, V and O rounded to it (the kernels' own
 * arithmetic float32) — extra relative tolerance against the float64 reference */
#define DT_RTOL_FWD(dt) ((dt) == ATTN_BF16 ? 1e-2 : (dt) == ATTN_F16 ? 1.5e-3 : 0.0)
#define DT_RTOL_BWD(dt) ((dt) == ATTN_BF16 ? 1e-2 : (dt) == ATTN_F16 ? 1.5e-3 : 0.0)
/* ... and against the single-rank layer: projections blocked differently over the ranks
 * can round an element of Q, K or V the other way (half a unit) */
#define DT_RTOL_SOLO(dt) ((dt) == ATTN_BF16 ? 0x1p-9 : (dt) == ATTN_F16 ? 0x1p-12 : 0.0)
#define RTOL_SOLO 1e-5 /* against the same layer run on one rank (fp32 both sides) */

typedef struct {
  int tp, cp, rank;
  attn_ctx_t ctx;
  attn_group_t grp;
  attn_group_info gi;
  MPI_Comm tp_comm; /* this rank's TP group, by tp_rank */
  attn_group_t solo; /* MPI_COMM_SELF, tp = cp = 1: the single-rank layer */
} env;

static void die(const char *what, attn_status st) {
  fprintf(stderr, "test_layer: %s: %s: %s\n", what, attn_status_string(st), attn_last_error());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

static void env_init(env *E, int tp, int cp) {
  memset(E, 0, sizeof *E);
  E->tp = tp;
  E->cp = cp;
  MPI_Comm_rank(MPI_COMM_WORLD, &E->rank);
  attn_ctx_config cc = ATTN_CTX_CONFIG_INIT;
  cc.backend = ATTN_BACKEND_CPU;
  cc.num_threads = 1;
  attn_status st = attn_ctx_create(&E->ctx, &cc);
  if (st != ATTN_OK) die("attn_ctx_create", st);
  attn_group_config gc = ATTN_GROUP_CONFIG_INIT;
  gc.tp = tp;
  gc.cp = cp;
  MPI_Comm world = MPI_COMM_WORLD;
  st = attn_group_create(&E->grp, E->ctx, &world, &gc);
  if (st != ATTN_OK) die("attn_group_create", st);
  st = attn_group_get_info(E->grp, &E->gi);
  if (st != ATTN_OK) die("attn_group_get_info", st);
  TU_CHECK(E->gi.tp_size == tp && E->gi.cp_size == cp && E->gi.tp_rank == E->rank % tp &&
               E->gi.cp_rank == E->rank / tp,
           "rank %d: group info tp %d/%d cp %d/%d (TP groups must be consecutive ranks)",
           E->rank, E->gi.tp_rank, E->gi.tp_size, E->gi.cp_rank, E->gi.cp_size);
  MPI_Comm_split(MPI_COMM_WORLD, E->rank / tp, E->rank % tp, &E->tp_comm);
  attn_group_config one = ATTN_GROUP_CONFIG_INIT;
  MPI_Comm self = MPI_COMM_SELF;
  st = attn_group_create(&E->solo, E->ctx, &self, &one);
  if (st != ATTN_OK) die("attn_group_create (MPI_COMM_SELF)", st);
}

static void env_free(env *E) {
  MPI_Comm_free(&E->tp_comm);
  attn_group_destroy(E->solo);
  attn_group_destroy(E->grp);
  attn_ctx_destroy(E->ctx);
}

/* ---- one run of the layer ------------------------------------------------------------ */

typedef struct {
  float *y, *dx, *dwqkv, *dwo; /* poisoned before the run */
} outs;

static void outs_alloc(outs *o, const tl_prob *P, const tl_slice *s) {
  int64_t n = P->c.B * s->rows * P->c.d;
  o->y = tu_falloc(n);
  o->dx = tu_falloc(n);
  o->dwqkv = tu_falloc(P->c.d * s->cols);
  o->dwo = tu_falloc(s->h.hq * P->Dv * P->c.d);
}

static void outs_free(outs *o) {
  free(o->y);
  free(o->dx);
  free(o->dwqkv);
  free(o->dwo);
}

static int heads_equal(attn_layer_heads a, attn_layer_heads b) {
  return a.hq0 == b.hq0 && a.hq == b.hq && a.hk0 == b.hk0 && a.hk == b.hk;
}

/* Forward and backward on an existing layer; dies on a failing status. */
static void run_on(attn_layer_t L, const tl_prob *P, const tl_slice *s, outs *o) {
  int64_t n = P->c.B * s->rows * P->c.d;
  tu_poison(o->y, n);
  tu_poison(o->dx, n);
  tu_poison(o->dwqkv, P->c.d * s->cols);
  tu_poison(o->dwo, s->h.hq * P->Dv * P->c.d);
  attn_status st = attn_layer_fwd(L, P->c.B, P->c.S, s->x, s->wqkv, s->wo, o->y);
  if (st != ATTN_OK) die("attn_layer_fwd", st);
  st = attn_layer_bwd(L, s->dy, o->dx, o->dwqkv, o->dwo);
  if (st != ATTN_OK) die("attn_layer_bwd", st);
}

static attn_layer_t make_layer_on(attn_group_t grp, const tl_prob *P, const tl_slice *s) {
  attn_layer_config cfg = tl_config(P);
  attn_layer_t L = NULL;
  attn_status st = attn_layer_create(&L, grp, &cfg);
  if (st != ATTN_OK) die("attn_layer_create", st);
  attn_layer_heads h;
  st = attn_layer_get_heads(L, &h);
  TU_CHECK(st == ATTN_OK && heads_equal(h, s->h),
           "%s: heads hq0=%d hq=%d hk0=%d hk=%d, expected %d %d %d %d", P->c.name, h.hq0, h.hq,
           h.hk0, h.hk, s->h.hq0, s->h.hq, s->h.hk0, s->h.hk);
  return L;
}

static attn_layer_t make_layer(env *E, const tl_prob *P, const tl_slice *s) {
  return make_layer_on(E->grp, P, s);
}

static void run_layer(env *E, const tl_prob *P, const tl_slice *s, outs *o) {
  attn_layer_t L = make_layer(E, P, s);
  run_on(L, P, s, o);
  attn_layer_destroy(L);
}

/* ---- comparison with the reference ---------------------------------------------------- */

typedef struct {
  double *y, *dx, *dwqkv, *dwo;
} refs;

static void refs_make(refs *r, const tl_prob *P, const tl_slice *s) {
  int64_t n = P->c.B * s->rows * P->c.d;
  r->y = tu_dalloc(n);
  r->dx = tu_dalloc(n);
  r->dwqkv = tu_dalloc(P->c.d * s->cols);
  r->dwo = tu_dalloc(s->h.hq * P->Dv * P->c.d);
  tl_slice_ref(P, s, r->y, r->dx, r->dwqkv, r->dwo);
}

static void refs_free(refs *r) {
  free(r->y);
  free(r->dx);
  free(r->dwqkv);
  free(r->dwo);
}

static double rel_err(const float *got, const double *ref, int64_t n) {
  double e = 0, m = tu_max_abs(ref, n);
  for (int64_t i = 0; i < n; i++) e = fmax(e, fabs(got[i] - ref[i]));
  return m > 0 ? e / m : e;
}

/* Compares every output of this rank; returns the worst relative errors (fwd, bwd). */
static void compare(const env *E, const tl_prob *P, const tl_slice *s, const outs *o,
                    double err[2]) {
  refs r;
  refs_make(&r, P, s);
  int64_t n = P->c.B * s->rows * P->c.d, nw = P->c.d * s->cols, no = s->h.hq * P->Dv * P->c.d;
  char what[160];
  snprintf(what, sizeof what, "%s rank %d y", P->c.name, E->rank);
  const double fwd = RTOL_FWD + DT_RTOL_FWD(P->c.adt), bwd = RTOL_BWD + DT_RTOL_BWD(P->c.adt);
  tu_compare(what, o->y, r.y, n, NULL, fwd, ATOL);
  snprintf(what, sizeof what, "%s rank %d dx", P->c.name, E->rank);
  tu_compare(what, o->dx, r.dx, n, NULL, bwd, ATOL);
  snprintf(what, sizeof what, "%s rank %d dw_qkv", P->c.name, E->rank);
  tu_compare(what, o->dwqkv, r.dwqkv, nw, NULL, bwd, ATOL);
  snprintf(what, sizeof what, "%s rank %d dw_o", P->c.name, E->rank);
  tu_compare(what, o->dwo, r.dwo, no, NULL, bwd, ATOL);
  err[0] = rel_err(o->y, r.y, n);
  err[1] = fmax(fmax(rel_err(o->dx, r.dx, n), rel_err(o->dwqkv, r.dwqkv, nw)),
                rel_err(o->dwo, r.dwo, no));
  refs_free(&r);
}

/* ---- TP layer == single-rank layer ------------------------------------------------------ */

static double *to_double(const float *x, int64_t n) {
  double *d = tu_dalloc(n);
  for (int64_t i = 0; i < n; i++) d[i] = x[i];
  return d;
}

/* The whole layer on this rank alone (MPI_COMM_SELF); its outputs, cut to this rank's rows
 * and heads exactly as the reference is, must match the distributed run to fp32 rounding. */
static double compare_solo(env *E, const tl_prob *P, const tl_slice *s, const outs *o) {
  const tl_case *c = &P->c;
  tl_slice full;
  tl_slice_make(P, 1, 0, 1, 0, &full);
  outs f;
  outs_alloc(&f, P, &full);
  attn_layer_t L = make_layer_on(E->solo, P, &full);
  run_on(L, P, &full, &f);
  attn_layer_destroy(L);
  int64_t d = c->d, nq = c->Hq * c->Dqk, nk = c->Hkv * c->Dqk, nv = c->Hkv * P->Dv;
  tl_prob Q = *P; /* the solo run as the "reference" */
  Q.y = to_double(f.y, c->B * c->S * d);
  Q.dx = to_double(f.dx, c->B * c->S * d);
  Q.dwo = to_double(f.dwo, c->Hq * P->Dv * d);
  Q.dwq = tu_dalloc(d * nq), Q.dwk = tu_dalloc(d * nk), Q.dwv = tu_dalloc(d * nv);
  for (int64_t r = 0; r < d; r++)
    for (int64_t j = 0; j < full.cols; j++) {
      double v = f.dwqkv[r * full.cols + j];
      if (j < nq) Q.dwq[r * nq + j] = v;
      else if (j < nq + nk) Q.dwk[r * nk + j - nq] = v;
      else Q.dwv[r * nv + j - nq - nk] = v;
    }
  refs r;
  refs_make(&r, &Q, s);
  int64_t n = c->B * s->rows * d, nw = d * s->cols, no = s->h.hq * P->Dv * d;
  const float *got[4] = {o->y, o->dx, o->dwqkv, o->dwo};
  const double *want[4] = {r.y, r.dx, r.dwqkv, r.dwo};
  const int64_t len[4] = {n, n, nw, no};
  const char *names[4] = {"y", "dx", "dw_qkv", "dw_o"};
  double worst = 0;
  for (int k = 0; k < 4; k++) {
    char what[160];
    snprintf(what, sizeof what, "%s rank %d %s vs the single-rank layer", c->name, E->rank,
             names[k]);
    tu_compare(what, got[k], want[k], len[k], NULL, RTOL_SOLO + DT_RTOL_SOLO(c->adt), ATOL);
    worst = fmax(worst, rel_err(got[k], want[k], len[k]));
  }
  refs_free(&r);
  void *ps[] = {Q.y, Q.dx, Q.dwo, Q.dwq, Q.dwk, Q.dwv};
  for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) free(ps[i]);
  outs_free(&f);
  tl_slice_free(&full);
  return worst;
}

/* ---- cases ------------------------------------------------------------------------------- */

static const int32_t varlen_lens[3] = {7, 12, 5};

/* The sweep for a tp-wide group; returns the number of cases written to cs. */
static int make_cases(int tp, tl_case *cs) {
  int n = 0;
  tl_case base = {0};
  base.B = 1;
  base.S = 24;
  base.d = 16;
  base.Dqk = 8;
  base.wl = base.wr = -1;
  base.layout = ATTN_LAYOUT_ZIGZAG;
  base.seed = 11;

  tl_case c = base; /* MHA, RoPE, causal, zigzag */
  c.name = "mha_rope_causal", c.Hq = c.Hkv = 2 * tp, c.rope = 10000.0f, c.causal = 1;
  cs[n++] = c;
  c = base; /* GQA, KV split, no RoPE, window, Dv != Dqk, contiguous, batch 2 */
  c.name = "gqa_split_window", c.Hq = 2 * tp, c.Hkv = tp, c.Dv = 4, c.wl = 5, c.wr = 3;
  c.B = 2, c.layout = ATTN_LAYOUT_CONTIGUOUS, c.seed = 12;
  cs[n++] = c;
  c = base; /* every query head shares one KV head: replicated when tp > 1; sinks */
  c.name = "mqa_rope_sinks", c.Hq = 2 * tp, c.Hkv = 1, c.rope = 500.0f, c.causal = 1;
  c.sinks = 1, c.S = 21, c.seed = 13;
  cs[n++] = c;
  if (tp >= 4 && tp % 2 == 0) { /* two KV heads, each shared by tp/2 ranks */
    c = base;
    c.name = "gqa_replicated_pairs", c.Hq = tp, c.Hkv = 2, c.rope = 10000.0f;
    c.causal = 1, c.seed = 14;
    cs[n++] = c;
  }
  c = base; /* ALiBi + softcap, odd d_model, head dims 6 / 10 */
  c.name = "alibi_softcap_dims", c.Hq = tp, c.Hkv = tp, c.Dqk = 6, c.Dv = 10, c.d = 12;
  c.alibi = 1, c.softcap = 5.0f, c.causal = 1, c.rope = 100.0f, c.B = 2, c.seed = 15;
  cs[n++] = c;
  c = base; /* varlen: three packed sequences (the reference restarts RoPE positions) */
  c.name = "varlen_rope_causal", c.Hq = 2 * tp, c.Hkv = tp, c.rope = 10000.0f, c.causal = 1;
  c.nseq = 3, c.lens = varlen_lens, c.seed = 16;
  cs[n++] = c;
  c = base; /* more rows than one 128-row query tile, uneven zigzag chunks */
  c.name = "rows_past_one_tile", c.Hq = 2 * tp, c.Hkv = tp, c.rope = 10000.0f, c.causal = 1;
  c.S = 301, c.seed = 17;
  cs[n++] = c;
  c = base; /* the attention in bf16 / f16 (attention_dtype), GQA, RoPE */
  c.name = "gqa_rope_bf16", c.Hq = 2 * tp, c.Hkv = tp, c.rope = 10000.0f, c.causal = 1;
  c.adt = ATTN_BF16, c.S = 40, c.seed = 18;
  cs[n++] = c;
  c.name = "gqa_window_sinks_f16", c.adt = ATTN_F16, c.wl = 9, c.wr = 2, c.causal = 0;
  c.sinks = 1, c.seed = 19;
  cs[n++] = c;
  return n;
}

static void part_ref(env *E) {
  tl_case cs[10];
  int n = make_cases(E->tp, cs);
  for (int i = 0; i < n; i++) {
    double t0 = MPI_Wtime(), err[3], worst[3];
    tl_prob P;
    tl_init(&P, &cs[i]);
    tl_ref(&P);
    tl_slice s;
    tl_slice_make(&P, E->tp, E->gi.tp_rank, E->cp, E->gi.cp_rank, &s);
    outs o;
    outs_alloc(&o, &P, &s);
    run_layer(E, &P, &s, &o);
    compare(E, &P, &s, &o, err);
    err[2] = compare_solo(E, &P, &s, &o);
    if (P.c.adt) { /* the dtype took effect: float32 attention gives other bits */
      tl_prob Q = P;
      Q.c.adt = 0;
      outs f;
      outs_alloc(&f, &Q, &s);
      run_layer(E, &Q, &s, &f);
      TU_CHECK(memcmp(o.y, f.y, (size_t)(P.c.B * s.rows * P.c.d) * 4) != 0,
               "%s: y is the float32 layer's bit for bit: attention_dtype ignored", P.c.name);
      outs_free(&f);
    }
    MPI_Reduce(err, worst, 3, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (E->rank == 0)
      printf("  %-22s tp=%d cp=%d  vs float64: y %.1e grads %.1e; vs one rank %.1e (%.2f s)\n",
             cs[i].name, E->tp, E->cp, worst[0], worst[1], worst[2], MPI_Wtime() - t0);
    outs_free(&o);
    tl_slice_free(&s);
    tl_free(&P);
  }
}

/* ---- exactness: integer inputs, W_q = 0 -------------------------------------------------------
 * Scores are all 0, so softmax weights are exactly 1/S (S a power of two, no mask, no
 * sinks): O is the exact mean of V, and y = O · W_o summed over the TP ranks is exact in
 * float. So y and dW_o = O^T dy must equal the float64 reference bit for bit, on every
 * grid; this pins the projections, head slicing, the W_o path and the AllReduce. */
static void check_exact(const char *what, const float *got, const double *ref, int64_t n) {
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n; i++) {
    TU_CHECK((double)(float)ref[i] == ref[i], "%s[%lld]: reference %.17g is not a float",
             what, (long long)i, ref[i]);
    if ((double)got[i] != ref[i] && bad++ == 0) first = i;
  }
  TU_CHECK(bad == 0, "%s: %lld inexact element(s); first [%lld] = %.9g, exact %.17g", what,
           (long long)bad, (long long)first, first >= 0 ? got[first] : 0.0,
           first >= 0 ? ref[first] : 0.0);
}

static void part_exact(env *E) {
  tl_case c = {0};
  c.B = 2, c.S = 16, c.d = 16, c.Dqk = 4, c.wl = c.wr = -1, c.integer = 1, c.seed = 21;
  c.layout = ATTN_LAYOUT_ZIGZAG;
  int hkv[2] = {E->tp, 1}; /* KV split, then one KV head (replicated when tp > 1) */
  for (int v = 0; v < 2; v++) {
    c.name = v ? "exact_mqa_rope" : "exact_mha";
    c.Hq = 2 * E->tp, c.Hkv = hkv[v], c.Dv = v ? 8 : 0, c.rope = v ? 10000.0f : 0.0f;
    tl_prob P;
    tl_init(&P, &c);
    tl_ref(&P);
    tl_slice s;
    tl_slice_make(&P, E->tp, E->gi.tp_rank, E->cp, E->gi.cp_rank, &s);
    outs o;
    outs_alloc(&o, &P, &s);
    run_layer(E, &P, &s, &o);
    refs r;
    refs_make(&r, &P, &s);
    char what[96];
    snprintf(what, sizeof what, "%s rank %d y", c.name, E->rank);
    check_exact(what, o.y, r.y, c.B * s.rows * c.d);
    snprintf(what, sizeof what, "%s rank %d dw_o", c.name, E->rank);
    check_exact(what, o.dwo, r.dwo, s.h.hq * P.Dv * c.d);
    double err[2];
    compare(E, &P, &s, &o, err); /* the rest within tolerance */
    if (E->rank == 0) printf("  %-22s tp=%d cp=%d  y and dw_o exact\n", c.name, E->tp, E->cp);
    refs_free(&r);
    outs_free(&o);
    tl_slice_free(&s);
    tl_free(&P);
  }
}

/* ---- bitwise: across TP ranks, across runs, across layer objects ------------------------ */

/* Every TP rank holds the same array (bitwise). */
static void same_over_tp(const env *E, const char *what, const float *x, int64_t n) {
  float *all = tu_alloc((size_t)(n * E->tp) * sizeof(float));
  MPI_Allgather(x, (int)n, MPI_FLOAT, all, (int)n, MPI_FLOAT, E->tp_comm);
  for (int r = 1; r < E->tp; r++)
    TU_CHECK(!memcmp(all, all + r * n, (size_t)n * sizeof(float)),
             "%s differs between TP ranks 0 and %d (cp rank %d)", what, r, E->gi.cp_rank);
  free(all);
}

/* Ranks sharing a replicated KV head hold the same dW_k | dW_v columns (bitwise). */
static void same_kv_grads(const env *E, const tl_prob *P, const tl_slice *s,
                          const float *dwqkv) {
  int64_t d = P->c.d, n = d * s->cols, c0 = s->h.hq * P->c.Dqk;
  float *all = tu_alloc((size_t)(n * E->tp) * sizeof(float));
  int *hk0 = tu_alloc((size_t)E->tp * sizeof(int));
  MPI_Allgather(dwqkv, (int)n, MPI_FLOAT, all, (int)n, MPI_FLOAT, E->tp_comm);
  MPI_Allgather(&s->h.hk0, 1, MPI_INT, hk0, 1, MPI_INT, E->tp_comm);
  for (int r = 0; r < E->tp; r++) {
    if (r == E->gi.tp_rank || hk0[r] != s->h.hk0) continue;
    for (int64_t row = 0; row < d; row++)
      TU_CHECK(!memcmp(dwqkv + row * s->cols + c0, all + r * n + row * s->cols + c0,
                       (size_t)(s->cols - c0) * sizeof(float)),
               "%s: dW_kv row %lld differs between TP ranks %d and %d sharing KV head %d",
               P->c.name, (long long)row, E->gi.tp_rank, r, s->h.hk0);
  }
  free(all);
  free(hk0);
}

static void part_bitwise(env *E) {
  tl_case cs[10];
  make_cases(E->tp, cs);
  for (int i = 0; i < 3; i += 2) { /* mha_rope_causal, mqa_rope_sinks */
    tl_prob P;
    tl_init(&P, &cs[i]);
    tl_slice s;
    tl_slice_make(&P, E->tp, E->gi.tp_rank, E->cp, E->gi.cp_rank, &s);
    outs a, b, c;
    outs_alloc(&a, &P, &s);
    outs_alloc(&b, &P, &s);
    outs_alloc(&c, &P, &s);
    attn_layer_t L = make_layer(E, &P, &s);
    run_on(L, &P, &s, &a);
    run_on(L, &P, &s, &b); /* the same layer again: cached RoPE table and workspace */
    attn_layer_destroy(L);
    run_layer(E, &P, &s, &c); /* a fresh layer */
    int64_t n = P.c.B * s.rows * P.c.d, nw = P.c.d * s.cols, no = s.h.hq * P.Dv * P.c.d;
    const outs *rep[2] = {&b, &c};
    for (int k = 0; k < 2; k++) {
      const char *run = k ? "fresh layer" : "second run";
      TU_CHECK(!memcmp(a.y, rep[k]->y, n * 4), "%s: y differs in the %s", P.c.name, run);
      TU_CHECK(!memcmp(a.dx, rep[k]->dx, n * 4), "%s: dx differs in the %s", P.c.name, run);
      TU_CHECK(!memcmp(a.dwqkv, rep[k]->dwqkv, nw * 4), "%s: dw_qkv differs in the %s",
               P.c.name, run);
      TU_CHECK(!memcmp(a.dwo, rep[k]->dwo, no * 4), "%s: dw_o differs in the %s", P.c.name,
               run);
    }
    same_over_tp(E, "y", a.y, n);
    same_over_tp(E, "dx", a.dx, n);
    same_kv_grads(E, &P, &s, a.dwqkv);
    if (E->rank == 0)
      printf("  %-22s tp=%d cp=%d  bitwise over runs, layers and TP ranks\n", P.c.name,
             E->tp, E->cp);
    outs_free(&a);
    outs_free(&b);
    outs_free(&c);
    tl_slice_free(&s);
    tl_free(&P);
  }
}

/* ---- bad configurations: every rank fails, nobody hangs -------------------------------- */

/* st is this rank's result: it must fail; want (when not ATTN_OK) is the exact status;
 * keyword (when set) must appear in the message of a rank that returned want. */
static void expect_fail(const env *E, const char *what, attn_status st, attn_status want,
                        const char *keyword) {
  TU_CHECK(st != ATTN_OK, "%s: rank %d returned ATTN_OK", what, E->rank);
  if (want != ATTN_OK)
    TU_CHECK(st == want, "%s: rank %d returned %s, expected %s (%s)", what, E->rank,
             attn_status_string(st), attn_status_string(want), attn_last_error());
  if (keyword && st == want)
    TU_CHECK(strstr(attn_last_error(), keyword) != NULL, "%s: rank %d message lacks '%s': %s",
             what, E->rank, keyword, attn_last_error());
  if (E->rank == 0) printf("  bad: %-34s -> %s: %s\n", what, attn_status_string(st),
                           attn_last_error());
}

static attn_status try_create(env *E, const attn_layer_config *cfg) {
  attn_layer_t L = (attn_layer_t)(uintptr_t)1; /* must come back NULL */
  attn_status st = attn_layer_create(&L, E->grp, cfg);
  if (st == ATTN_OK) attn_layer_destroy(L);
  else TU_CHECK(L == NULL, "attn_layer_create failed but left *out set");
  return st;
}

static attn_layer_config good_config(int tp) {
  attn_layer_config cfg = ATTN_LAYER_CONFIG_INIT;
  cfg.d_model = 16;
  cfg.spec.num_heads_q = 2 * tp;
  cfg.spec.num_heads_kv = tp;
  cfg.spec.head_dim_qk = 8;
  cfg.spec.causal = 1;
  cfg.rope_theta = 10000.0f;
  return cfg;
}

/* Configurations invalid on every rank: INVALID_ARG everywhere, naming the argument. */
static void bad_uniform(env *E) {
  int tp = E->tp, last = E->tp * E->cp - 1;
  attn_layer_config c;
  if (tp >= 2) {
    c = good_config(tp), c.spec.num_heads_q = tp + 1, c.spec.num_heads_kv = 1;
    expect_fail(E, "Hq % tp != 0", try_create(E, &c), ATTN_ERR_INVALID_ARG, "num_heads_q");
    c = good_config(tp), c.spec.num_heads_q = tp * (tp + 1), c.spec.num_heads_kv = tp + 1;
    expect_fail(E, "Hkv >= tp, Hkv % tp != 0", try_create(E, &c), ATTN_ERR_INVALID_ARG,
                "num_heads_kv");
  }
  if (tp >= 3) {
    c = good_config(tp), c.spec.num_heads_q = tp * (tp - 1), c.spec.num_heads_kv = tp - 1;
    expect_fail(E, "Hkv < tp, tp % Hkv != 0", try_create(E, &c), ATTN_ERR_INVALID_ARG,
                "num_heads_kv");
  }
  c = good_config(tp), c.spec.head_dim_qk = 7;
  expect_fail(E, "RoPE with odd Dqk", try_create(E, &c), ATTN_ERR_INVALID_ARG, "head_dim_qk");
  c = good_config(tp), c.d_model = 0;
  expect_fail(E, "d_model = 0", try_create(E, &c), ATTN_ERR_INVALID_ARG, "d_model");
  c = good_config(tp), c.rope_theta = -1.0f;
  expect_fail(E, "rope_theta < 0", try_create(E, &c), ATTN_ERR_INVALID_ARG, "rope_theta");
  c = good_config(tp), c.layout = (attn_cp_layout)7;
  expect_fail(E, "layout = 7", try_create(E, &c), ATTN_ERR_INVALID_ARG, "layout");
  c = good_config(tp), c.attention_dtype = 7;
  expect_fail(E, "attention_dtype = 7", try_create(E, &c), ATTN_ERR_UNSUPPORTED, "attention_dtype");
  c = good_config(tp), c.spec.num_heads_kv = 0;
  expect_fail(E, "Hkv = 0", try_create(E, &c), ATTN_ERR_INVALID_ARG, "num_heads_kv");
  expect_fail(E, "cfg NULL", try_create(E, NULL), ATTN_ERR_INVALID_ARG, "cfg");
  if (last == 0) return;
  c = good_config(tp), c.d_model = E->rank == 0 ? 24 : 16;
  expect_fail(E, "d_model differs on rank 0", try_create(E, &c), ATTN_ERR_MISMATCH, NULL);
  c = good_config(tp), c.spec.head_dim_qk = E->rank == last ? 7 : 8;
  expect_fail(E, "odd Dqk on the last rank only", try_create(E, &c),
              E->rank == last ? ATTN_ERR_INVALID_ARG : ATTN_OK, "head_dim_qk");
}

/* Bad calls on a good layer, then a good call still works. */
static void bad_calls(env *E) {
  int last = E->tp * E->cp - 1;
  tl_case c = {0};
  c.name = "bad_calls", c.B = 1, c.S = 16, c.d = 16, c.Hq = 2 * E->tp, c.Hkv = E->tp;
  c.Dqk = 8, c.wl = c.wr = -1, c.rope = 10000.0f, c.causal = 1, c.seed = 31;
  c.layout = ATTN_LAYOUT_ZIGZAG;
  tl_prob P;
  tl_init(&P, &c);
  tl_slice s;
  tl_slice_make(&P, E->tp, E->gi.tp_rank, E->cp, E->gi.cp_rank, &s);
  outs o;
  outs_alloc(&o, &P, &s);
  attn_layer_t L = make_layer(E, &P, &s);
  attn_status st = attn_layer_fwd(L, 0, c.S, s.x, s.wqkv, s.wo, o.y);
  expect_fail(E, "fwd batch = 0", st, ATTN_ERR_INVALID_ARG, "batch");
  st = attn_layer_bwd(L, s.dy, o.dx, o.dwqkv, o.dwo);
  expect_fail(E, "bwd without a forward", st, ATTN_ERR_INVALID_ARG, "attn_layer_fwd");
  if (E->cp > 1) {
    st = attn_layer_fwd(L, 1, 1, s.x, s.wqkv, s.wo, o.y);
    expect_fail(E, "fwd seq too short for cp", st, ATTN_OK, NULL);
  }
  if (last > 0) {
    st = attn_layer_fwd(L, 1, E->rank == 0 ? c.S + 2 : c.S, s.x, s.wqkv, s.wo, o.y);
    expect_fail(E, "fwd seq_global differs on rank 0", st, ATTN_ERR_MISMATCH, NULL);
    st = attn_layer_fwd(L, 1, c.S, E->rank == last ? NULL : s.x, s.wqkv, s.wo, o.y);
    expect_fail(E, "fwd x NULL on the last rank", st,
                E->rank == last ? ATTN_ERR_INVALID_ARG : ATTN_OK, "x is NULL");
  }
  run_on(L, &P, &s, &o); /* still usable */
  attn_layer_destroy(L);
  outs_free(&o);
  tl_slice_free(&s);
  tl_free(&P);
}

static void part_fault(env *E) {
  tl_case c = {0};
  c.name = "fault", c.B = 1, c.S = 32, c.d = 16, c.Hq = 2 * E->tp, c.Hkv = E->tp;
  c.Dqk = 8, c.wl = c.wr = -1, c.rope = 10000.0f, c.causal = 1, c.seed = 41;
  c.layout = ATTN_LAYOUT_ZIGZAG;
  tl_prob P;
  tl_init(&P, &c);
  tl_slice s;
  tl_slice_make(&P, E->tp, E->gi.tp_rank, E->cp, E->gi.cp_rank, &s);
  outs o;
  outs_alloc(&o, &P, &s);
  attn_layer_t L = make_layer(E, &P, &s);
  for (int it = 0; it < 8; it++) {
    attn_status st = attn_layer_fwd(L, c.B, c.S, s.x, s.wqkv, s.wo, o.y);
    if (st == ATTN_OK) st = attn_layer_bwd(L, s.dy, o.dx, o.dwqkv, o.dwo);
    if (st != ATTN_OK) {
      fprintf(stderr, "test_layer: rank %d: layer step %d: %s: %s\n", E->rank, it,
              attn_status_string(st), attn_last_error());
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
  }
  attn_layer_destroy(L);
  outs_free(&o);
  tl_slice_free(&s);
  tl_free(&P);
}

static void part_bad(env *E) {
  bad_uniform(E);
  bad_calls(E);
  TU_CHECK(attn_layer_destroy(NULL) == ATTN_OK, "attn_layer_destroy(NULL) must be ATTN_OK");
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int tp = argc > 2 ? atoi(argv[2]) : size, cp = argc > 3 ? atoi(argv[3]) : 1;
  const char *part = argc > 1 ? argv[1] : "";
  int known = !strcmp(part, "ref") || !strcmp(part, "exact") || !strcmp(part, "bitwise") ||
              !strcmp(part, "bad") || !strcmp(part, "fault");
  if (!known || tp < 1 || cp < 1 || tp * cp != size) {
    if (rank == 0)
      fprintf(stderr, "usage: test_layer ref|exact|bitwise|bad|fault <tp> <cp> (tp*cp = %d)\n",
              size);
    MPI_Finalize();
    return 2;
  }
  double t0 = MPI_Wtime();
  env E;
  env_init(&E, tp, cp);
  if (!strcmp(part, "ref")) part_ref(&E);
  else if (!strcmp(part, "exact")) part_exact(&E);
  else if (!strcmp(part, "bitwise")) part_bitwise(&E);
  else if (!strcmp(part, "fault")) part_fault(&E);
  else part_bad(&E);
  int total = 0;
  MPI_Allreduce(&tu_failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  env_free(&E);
  if (rank == 0)
    printf("test_layer %s tp=%d cp=%d: %s (%d failure(s) over all ranks, %.1f s)\n", part, tp,
           cp, total ? "FAILED" : "passed", total, MPI_Wtime() - t0);
  MPI_Finalize();
  return total ? 1 : 0;
}
