/* npy_oracle.c — CLI test helper: reads a directory written by `attnrun --save` (inputs
 * and outputs), recomputes every output with the float64 oracle (kernels/ref), and exits
 * 0 iff all of O, LSE (and dQ, dK, dV, dsinks when present) are within tolerance.
 * usage: npy_oracle DIR [--causal] [--window L,R] [--softcap C] [--scale S] [--dtype T] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "npy.h"
#include "ref.h"

typedef struct {
  const char *dir;
  npy_header h[16];
  void *data[16];
  int n;
} loaded;

/* Loads DIR/name (NULL if absent and optional; exits if required and absent). */
static void *load(loaded *L, const char *name, npy_dtype dt, int required, npy_header **hout) {
  char path[2048], err[512];
  snprintf(path, sizeof path, "%s/%s", L->dir, name);
  if (access(path, F_OK) != 0) {
    if (!required) return NULL;
    fprintf(stderr, "npy_oracle: %s missing\n", path);
    exit(1);
  }
  npy_header *h = &L->h[L->n];
  if (npy_read_all(path, dt, h, &L->data[L->n], err, sizeof err)) {
    fprintf(stderr, "npy_oracle: %s\n", err);
    exit(1);
  }
  if (hout) *hout = h;
  return L->data[L->n++];
}

/* Compares got (float32) with ref (float64); prints and returns #wrong. */
static long compare(const char *name, const float *got, const double *ref, int64_t n, double tol) {
  double max_ref = 0, max_err = 0;
  long wrong = 0;
  for (int64_t i = 0; i < n; i++)
    if (isfinite(ref[i]) && fabs(ref[i]) > max_ref) max_ref = fabs(ref[i]);
  double denom = max_ref > 0 ? max_ref : 1;
  int64_t worst = 0;
  for (int64_t i = 0; i < n; i++) {
    double e = (double)got[i] == ref[i] ? 0 : fabs((double)got[i] - ref[i]);
    if (isnan(e)) e = INFINITY;
    if (e > max_err) max_err = e, worst = i;
    if (!(e <= tol * denom)) wrong++;
  }
  printf("%-6s n=%lld max_abs_err=%.3e rel=%.3e wrong=%ld", name, (long long)n, max_err,
         max_err / denom, wrong);
  if (wrong)
    printf("  worst [%lld] %.9g ref %.9g", (long long)worst, (double)got[worst], ref[worst]);
  printf("\n");
  return wrong;
}

/* Extra relative tolerance of a bf16/f16 run (--dtype): O rounded once on output; the
 * gradients the CLI's --check tolerance for the dtype (O's rounding enters through delta). */
static double o_extra, g_extra;

static void parse_flags(int argc, char **argv, attn_spec *s) {
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
      const char *t = argv[++i];
      if (!strcmp(t, "bf16")) o_extra = 0x1p-8, g_extra = 4e-2;
      else if (!strcmp(t, "f16")) o_extra = 0x1p-11, g_extra = 8e-3;
      else if (strcmp(t, "f32")) exit(2);
    } else if (!strcmp(argv[i], "--causal"))
      s->causal = 1;
    else if (!strcmp(argv[i], "--window") && i + 1 < argc) {
      long long l, r;
      if (sscanf(argv[++i], "%lld,%lld", &l, &r) != 2) exit(2);
      s->window_left = l, s->window_right = r;
    } else if (!strcmp(argv[i], "--softcap") && i + 1 < argc)
      s->softcap = strtof(argv[++i], NULL);
    else if (!strcmp(argv[i], "--scale") && i + 1 < argc)
      s->scale = strtof(argv[++i], NULL);
    else {
      fprintf(stderr, "npy_oracle: unknown flag %s\n", argv[i]);
      exit(2);
    }
  }
}

static double *dalloc(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: npy_oracle DIR [--causal] [--window L,R] [--softcap C] [--scale S] "
                    "[--dtype f32|bf16|f16]\n");
    return 2;
  }
  loaded L = {.dir = argv[1]};
  attn_spec spec = ATTN_SPEC_INIT;
  parse_flags(argc, argv, &spec);
  npy_header *hq, *hk, *hv, *hc = NULL;
  attn_ref_arrays a = {0};
  a.q = load(&L, "q.npy", NPY_F32, 1, &hq);
  a.k = load(&L, "k.npy", NPY_F32, 1, &hk);
  a.v = load(&L, "v.npy", NPY_F32, 1, &hv);
  a.dout = load(&L, "do.npy", NPY_F32, 0, NULL);
  spec.sinks = load(&L, "sinks.npy", NPY_F32, 0, NULL);
  spec.alibi_slopes = load(&L, "alibi.npy", NPY_F32, 0, NULL);
  spec.cu_seqlens_q = load(&L, "cu_seqlens_q.npy", NPY_I32, 0, &hc);
  spec.cu_seqlens_kv = load(&L, "cu_seqlens_kv.npy", NPY_I32, 0, NULL);
  if (spec.cu_seqlens_q) spec.num_seqs = (int32_t)(hc->count - 1);
  int64_t B = hq->shape[0], sq = hq->shape[1], skv = hk->shape[1];
  spec.num_heads_q = (int32_t)hq->shape[2], spec.num_heads_kv = (int32_t)hk->shape[2];
  spec.head_dim_qk = (int32_t)hq->shape[3], spec.head_dim_v = (int32_t)hv->shape[3];
  int64_t hqn = spec.num_heads_q, n_o = B * sq * hqn * spec.head_dim_v, n_lse = B * hqn * sq;
  attn_ref_problem p;
  attn_ref_problem_arrays(&p, &spec, B, sq, skv, &a);
  double *o = dalloc(n_o), *lse = dalloc(n_lse);
  attn_ref_fwd(&p, o, lse);
  long wrong = compare("O", load(&L, "o.npy", NPY_F32, 1, NULL), o, n_o, 2e-5 + o_extra);
  wrong += compare("LSE", load(&L, "lse.npy", NPY_F32, 1, NULL), lse, n_lse, 2e-5);
  float *dq = load(&L, "dq.npy", NPY_F32, 0, NULL);
  if (dq && a.dout) {
    int64_t n_dq = B * sq * hqn * spec.head_dim_qk, n_dk = hk->count, n_dv = hv->count;
    double *rq = dalloc(n_dq), *rk = dalloc(n_dk), *rv = dalloc(n_dv), *rs = dalloc(hqn);
    attn_ref_bwd(&p, rq, rk, rv, spec.sinks ? rs : NULL);
    wrong += compare("dQ", dq, rq, n_dq, 2e-4 + g_extra);
    wrong += compare("dK", load(&L, "dk.npy", NPY_F32, 1, NULL), rk, n_dk, 2e-4 + g_extra);
    wrong += compare("dV", load(&L, "dv.npy", NPY_F32, 1, NULL), rv, n_dv, 2e-4 + g_extra);
    if (spec.sinks)
      wrong += compare("dsinks", load(&L, "dsinks.npy", NPY_F32, 1, NULL), rs, hqn, 2e-4 + g_extra);
    free(rq), free(rk), free(rv), free(rs);
  }
  free(o), free(lse);
  for (int i = 0; i < L.n; i++)
    free(L.data[i]);
  printf("%s\n", wrong ? "FAILED" : "OK");
  return wrong ? 1 : 0;
}
