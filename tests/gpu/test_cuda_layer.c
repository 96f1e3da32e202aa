/* test_cuda_layer.c — the tensor-parallel attention layer (attn_layer_fwd / _bwd) on a CUDA
 * context under mpiexec, against the CPU layer on the same float32 inputs and the float64
 * reference of tests/mpi/test_layer_ref.c: projections through cuBLAS (float32), RoPE on the
 * device, bf16 attention kernels, the W_O AllReduce (and the ring inside the layer when
 * cp > 1) over the device transport. Each rank compares its y, dx, dw_qkv, dw_o (and
 * d(sinks)); wrong elements are counted per rank and the verdict agreed by an allreduce.
 *
 * Usage: test_cuda_layer <tp> <cp>. Built against libattnrun (label gpu, exits 77 without a
 * CUDA device) and the emulated library variant (ATTN_TEST_EMULATED, label emu). */
#include "attnrun.h"
#include "gpu_test.h"
#include "test_layer.h"

#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

/* Relative to max |ref|: Q/K/V and dO are rounded to bf16 for the kernels (2^-9), P inside
 * them, so the layer's outputs carry about 1e-2 of relative error; float32 elsewhere. */
#define TOL 3e-2

static int g_rank, g_size;
static attn_ctx_t g_gpu, g_cpu;
static attn_group_t g_ggrp, g_cgrp;

static void die(const char *what) {
  fprintf(stderr, "rank %d: %s: %s\n", g_rank, what, attn_last_error());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

static float *up(const float *x, int64_t n) {
  void *d = NULL;
  if (attn_ctx_alloc(g_gpu, (size_t)n * 4, &d) != ATTN_OK) die("attn_ctx_alloc");
  if (x) {
    if (attn_ctx_copy(g_gpu, d, x, (size_t)n * 4, ATTN_COPY_HOST_TO_CTX) != ATTN_OK) die("upload");
  } else {
    float *nan = tu_falloc(n); /* poisoned: unwritten outputs show */
    if (attn_ctx_copy(g_gpu, d, nan, (size_t)n * 4, ATTN_COPY_HOST_TO_CTX) != ATTN_OK) die("upload");
    free(nan);
  }
  return d;
}

static float *down(float *d, int64_t n) {
  float *x = tu_falloc(n);
  if (attn_ctx_copy(g_gpu, x, d, (size_t)n * 4, ATTN_COPY_CTX_TO_HOST) != ATTN_OK) die("download");
  attn_ctx_free(g_gpu, d);
  return x;
}

/* Wrong elements: |got - ref| > TOL * max|ref|; prints the worst. */
static int64_t count_wrong(const char *name, const char *what, const char *vs, const float *got,
                           const double *ref, int64_t n, double *rel) {
  double mx = 0, worst = 0;
  int64_t wrong = 0, at = -1;
  for (int64_t i = 0; i < n; i++)
    if (fabs(ref[i]) > mx) mx = fabs(ref[i]);
  const double thr = TOL * (mx > 0 ? mx : 1);
  for (int64_t i = 0; i < n; i++) {
    double d = isfinite(got[i]) ? fabs((double)got[i] - ref[i]) : INFINITY;
    if (d > thr) wrong++;
    if (d > worst || (at < 0 && d > thr)) worst = d, at = i;
  }
  if (worst / (mx > 0 ? mx : 1) > *rel) *rel = worst / (mx > 0 ? mx : 1);
  if (wrong)
    fprintf(stderr, "rank %d: %s: %s vs %s: %lld of %lld wrong (tol %.2g x %.3g); worst at %lld: "
            "got %.7g ref %.7g\n", g_rank, name, what, vs, (long long)wrong, (long long)n, TOL,
            mx, (long long)at, at >= 0 ? got[at] : 0.0, at >= 0 ? ref[at] : 0.0);
  return wrong;
}

static double *widen(const float *x, int64_t n) {
  double *d = tu_dalloc(n);
  for (int64_t i = 0; i < n; i++) d[i] = x[i];
  return d;
}

typedef struct {
  float *y, *dx, *dwqkv, *dwo, *ds; /* host */
} louts;

/* The layer on the CPU context (host arrays). */
static void layer_cpu(const tl_prob *P, const tl_slice *s, louts *o) {
  attn_layer_config cfg = tl_config(P);
  const int64_t B = P->c.B, d = P->c.d, hqdv = s->h.hq * P->Dv;
  *o = (louts){tu_falloc(B * s->rows * d), tu_falloc(B * s->rows * d), tu_falloc(d * s->cols),
               tu_falloc(hqdv * d), tu_falloc(s->h.hq)};
  attn_layer_t L = NULL;
  if (attn_layer_create(&L, g_cgrp, &cfg) != ATTN_OK ||
      attn_layer_fwd(L, B, P->c.S, s->x, s->wqkv, s->wo, o->y) != ATTN_OK ||
      attn_layer_bwd(L, s->dy, o->dx, o->dwqkv, o->dwo) != ATTN_OK ||
      (P->c.sinks && attn_layer_get_dsinks(L, o->ds) != ATTN_OK))
    die("cpu layer");
  attn_layer_destroy(L);
}

/* The layer on the CUDA context: the same arrays in device memory, spec arrays too. */
static attn_status layer_gpu(const tl_prob *P, const tl_slice *s, louts *o) {
  attn_layer_config cfg = tl_config(P);
  const int64_t B = P->c.B, d = P->c.d, hqdv = s->h.hq * P->Dv, n = B * s->rows * d;
  float *sinks = P->sinks ? up(P->sinks, P->c.Hq) : NULL;
  float *alibi = P->alibi ? up(P->alibi, P->c.Hq) : NULL;
  cfg.spec.sinks = sinks;
  cfg.spec.alibi_slopes = alibi;
  float *x = up(s->x, n), *dy = up(s->dy, n), *wqkv = up(s->wqkv, d * s->cols);
  float *wo = up(s->wo, hqdv * d), *y = up(NULL, n), *dx = up(NULL, n);
  float *dwqkv = up(NULL, d * s->cols), *dwo = up(NULL, hqdv * d), *ds = up(NULL, s->h.hq);
  attn_layer_t L = NULL;
  attn_status st = attn_layer_create(&L, g_ggrp, &cfg);
  if (st == ATTN_OK) st = attn_layer_fwd(L, B, P->c.S, x, wqkv, wo, y);
  if (st == ATTN_OK) st = attn_layer_bwd(L, dy, dx, dwqkv, dwo);
  if (st == ATTN_OK && P->c.sinks) st = attn_layer_get_dsinks(L, ds);
  if (st != ATTN_OK)
    fprintf(stderr, "rank %d: %s: cuda layer: %s: %s\n", g_rank, P->c.name, attn_status_string(st),
            attn_last_error());
  attn_layer_destroy(L);
  *o = (louts){down(y, n), down(dx, n), down(dwqkv, d * s->cols), down(dwo, hqdv * d),
               down(ds, s->h.hq)};
  attn_ctx_free(g_gpu, x), attn_ctx_free(g_gpu, dy), attn_ctx_free(g_gpu, wqkv);
  attn_ctx_free(g_gpu, wo), attn_ctx_free(g_gpu, sinks), attn_ctx_free(g_gpu, alibi);
  return st;
}

static void louts_free(louts *o) {
  free(o->y), free(o->dx), free(o->dwqkv), free(o->dwo), free(o->ds);
}

static int run_case(const tl_case *c, int tp, int cp) {
  tl_prob P;
  tl_init(&P, c);
  tl_ref(&P);
  tl_slice s;
  const int tp_rank = g_rank % tp, cp_rank = g_rank / tp;
  tl_slice_make(&P, tp, tp_rank, cp, cp_rank, &s);
  const int64_t B = c->B, d = c->d, n = B * s.rows * d, nw = d * s.cols, no = s.h.hq * P.Dv * d;
  louts cpu, gpu;
  layer_cpu(&P, &s, &cpu);
  int64_t failed = layer_gpu(&P, &s, &gpu) != ATTN_OK, wrong = 0;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  double rel[2] = {0, 0}; /* worst vs the cpu layer, vs the float64 reference */
  if (!failed) {
    double *ry = tu_dalloc(n), *rdx = tu_dalloc(n), *rw = tu_dalloc(nw), *ro = tu_dalloc(no);
    tl_slice_ref(&P, &s, ry, rdx, rw, ro);
    const float *got[4] = {gpu.y, gpu.dx, gpu.dwqkv, gpu.dwo}, *cref[4] = {cpu.y, cpu.dx, cpu.dwqkv, cpu.dwo};
    const double *fref[4] = {ry, rdx, rw, ro};
    const int64_t len[4] = {n, n, nw, no};
    const char *what[4] = {"y", "dx", "dw_qkv", "dw_o"};
    for (int i = 0; i < 4; i++) {
      double *w = widen(cref[i], len[i]);
      wrong += count_wrong(c->name, what[i], "cpu layer", got[i], w, len[i], &rel[0]);
      wrong += count_wrong(c->name, what[i], "float64 reference", got[i], fref[i], len[i], &rel[1]);
      free(w);
    }
    if (c->sinks) {
      double *w = widen(cpu.ds, s.h.hq);
      wrong += count_wrong(c->name, "dsinks", "cpu layer", gpu.ds, w, s.h.hq, &rel[0]);
      free(w);
    }
    free(ry), free(rdx), free(rw), free(ro);
  }
  int64_t total = 0;
  double worst[2];
  wrong += g_rank == 0 ? failed : 0;
  MPI_Allreduce(&wrong, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(rel, worst, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (g_rank == 0)
    printf("%-4s %-40s tp=%d cp=%d wrong=%lld  max rel err vs cpu layer %.1e, vs float64 %.1e\n",
           total ? "FAIL" : "ok", c->name, tp, cp, (long long)total, worst[0], worst[1]);
  louts_free(&cpu);
  louts_free(&gpu);
  tl_slice_free(&s);
  tl_free(&P);
  return total == 0;
}

static int part_layer(int tp, int cp) {
  const int64_t S = EMULATED ? 64 : 512, d = EMULATED ? 64 : 256, B = EMULATED ? 1 : 2;
  tl_case cs[3];
  memset(cs, 0, sizeof cs);
  cs[0] = (tl_case){.name = "causal GQA, RoPE", .B = B, .S = S, .d = d, .Hq = 4, .Hkv = 2,
                    .Dqk = 64, .rope = 10000.0f, .causal = 1, .wl = -1, .wr = -1,
                    .layout = ATTN_LAYOUT_ZIGZAG, .seed = 31};
  cs[1] = cs[0];
  cs[1].name = "causal window 24 + sinks, RoPE";
  cs[1].wl = 24;
  cs[1].sinks = 1;
  cs[1].seed = 32;
  cs[2] = cs[0];
  cs[2].name = "full, MQA (replicated KV), no RoPE";
  cs[2].Hkv = 1;
  cs[2].causal = 0;
  cs[2].rope = 0;
  cs[2].layout = ATTN_LAYOUT_CONTIGUOUS;
  cs[2].seed = 33;
  int ok = 1;
  for (int i = 0; i < 3; i++) ok &= run_case(&cs[i], tp, cp);
  return ok;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  const int tp = argc > 2 ? atoi(argv[1]) : g_size, cp = argc > 2 ? atoi(argv[2]) : 1;
  if (tp < 1 || cp < 1 || tp * cp != g_size) {
    if (g_rank == 0) fprintf(stderr, "usage: test_cuda_layer <tp> <cp> with tp * cp = ranks\n");
    MPI_Finalize();
    return 2;
  }
  attn_ctx_config cc = ATTN_CTX_CONFIG_INIT;
  cc.backend = ATTN_BACKEND_CUDA;
  int mine = attn_ctx_create(&g_gpu, &cc) == ATTN_OK, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all) {
    if (g_rank == 0) printf("no CUDA device on every rank: skipped\n");
    attn_ctx_destroy(g_gpu);
    MPI_Finalize();
    return 77;
  }
  cc.backend = ATTN_BACKEND_CPU;
  cc.num_threads = 1;
  attn_group_config gc = ATTN_GROUP_CONFIG_INIT;
  gc.tp = tp;
  gc.cp = cp;
  gc.timeout_s = 120;
  MPI_Comm world = MPI_COMM_WORLD;
  if (attn_ctx_create(&g_cpu, &cc) != ATTN_OK || attn_group_create(&g_cgrp, g_cpu, &world, &gc) != ATTN_OK ||
      attn_group_create(&g_ggrp, g_gpu, &world, &gc) != ATTN_OK)
    die("set-up");
  int ok = part_layer(tp, cp);
  attn_group_destroy(g_ggrp);
  attn_group_destroy(g_cgrp);
  attn_ctx_destroy(g_cpu);
  attn_ctx_destroy(g_gpu);
  MPI_Finalize();
  if (g_rank == 0) printf("test_cuda_layer tp=%d cp=%d: %s\n", tp, cp, ok ? "passed" : "FAILED");
  return ok ? 0 : 1;
}
