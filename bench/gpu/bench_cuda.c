/* bench_cuda.c — times the attnrun CUDA flash kernels, forward and backward, on the shapes
 * that bench/gpu/sdpa_bench.py times for PyTorch's SDPA (flash, cuDNN): bf16, head dims
 * 128 and 64, N = 1K..16K, causal and not, B = tokens / N so every shape fills the GPU;
 * --hd also takes 256 and (Dqk, Dv) pairs written DqkxDv (192x128), H = d_model / Dqk.
 *
 * Each shape is validated first (sampled rows of O and dQ against the float64 oracle),
 * then warmed up, then timed with CUDA events: median and min of --reps runs. FLOPs by the
 * peers' rule: forward 2*B*H*N^2*(Dqk+Dv) (= 4*B*H*N^2*D; causal: half), backward 2.5x
 * forward. The backward
 * timing includes zeroing the float32 dq/dk/dv accumulators and the delta/dsinks pass.
 * --path picks the kernels: mma (the mma.sync kernels), sm90 (the Hopper TMA + wgmma
 * kernels where the dispatcher takes them: bf16/f16 at the head dims they are built for;
 * with --det the backward's dQ in key-block order, through the workspace's semaphores), both, or auto (the
 * default: both for bf16 where sm90 applies, mma elsewhere);
 * both paths of a shape run side by side and the sm90 row says its speed relative to
 * mma's (a sm90 backward row times the sm90 backward; its forward also ran sm90).
 * Prints a table; --json FILE appends one JSON record per (shape, pass, path); sm90 records
 * carry "impl": "attnrun-sm90" ("attnrun-sm90-dqatomic" under ATTN_SM90_DQ=0, the backward's
 * dQ by atomics instead of TMA reduce-adds; "attnrun-sm90-ab<m>" under ATTN_SM90_ABLATE=m,
 * stages left out: not judged, and every record of such a run has "ablate"); an mma forward
 * record is named for the kernel the library says ran (attn_cuda_last_fwd_form):
 * "attnrun-mma4" for the 4-warp kernel (ATTN_CUDA_FWD_WARPS=4), "attnrun-mma2c" for the
 * two-CTA 8-warp kernel (ATTN_CUDA_FWD_CTAS=2), "attnrun-mma4x32" for the 4-warp kernel of
 * 32-row warps (ATTN_CUDA_FWD_WARP_ROWS=32), "attnrun-mma4s" for the 8-warp kernel with a
 * 4-buffer K/V ring (ATTN_CUDA_FWD_STAGES=4), "attnrun-mma-ab<m>" for the ablation kernel
 * (ATTN_MMA_ABLATE=m, bf16 d = 128 not causal; instance.h FA_AB_*: stages left out, judged
 * only at m = 0; every record of such a run has "mma_ablate"; run it with --no-bwd), else
 * "attnrun"; mma backward records are "attnrun", or "attnrun-mma4s" for the dK/dV kernel
 * with 4 step buffers (ATTN_CUDA_BWD_STAGES=4; attn_cuda_last_bwd_form).
 * Exit status: 0, 1 on a CUDA or check failure, 77 without a device. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_gpu.h"
#include "cuda_attn.h"
#include "ref.h"

typedef struct {
  const char *json, *dtype_name;
  int dtype, reps, warmup, bwd, det;
  const char *path; /* mma | sm90 | both | auto */
  int64_t tokens, model_dim;
  int nn, nd;
  int64_t ns[16];
  int dqk[4], dv[4]; /* head dim pairs */
} options;

/* Device buffers sized for the largest shape: tokens x model_dim elements per tensor. */
typedef struct {
  uint16_t *q, *k, *v, *o, *dout;
  float *dq, *dk, *dv, *lse, *delta;
  uint16_t *hq, *hk, *hv, *hdo; /* host copies (for the oracle) */
  void *ws; /* the workspace attn_cuda_workspace_bytes asks (the deterministic dQ's semaphores) */
  size_t ws_cap;
  cudaStream_t stream;
  cudaEvent_t ev[2];
} buffers;

static void alloc_buffers(buffers *b, const options *o) {
  const int64_t n = o->tokens * o->model_dim;
  CHECK_CUDA(cudaStreamCreate(&b->stream));
  CHECK_CUDA(cudaEventCreate(&b->ev[0]));
  CHECK_CUDA(cudaEventCreate(&b->ev[1]));
  uint16_t **dev[] = {&b->q, &b->k, &b->v, &b->o, &b->dout};
  for (int i = 0; i < 5; i++) CHECK_CUDA(cudaMalloc((void **)dev[i], (size_t)n * 2));
  float **f[] = {&b->dq, &b->dk, &b->dv};
  for (int i = 0; i < 3; i++) CHECK_CUDA(cudaMalloc((void **)f[i], (size_t)n * 4));
  CHECK_CUDA(cudaMalloc((void **)&b->lse, (size_t)n * 4)); /* >= tokens x heads */
  CHECK_CUDA(cudaMalloc((void **)&b->delta, (size_t)n * 4));
  uint16_t **h[] = {&b->hq, &b->hk, &b->hv, &b->hdo};
  for (int i = 0; i < 4; i++) {
    *h[i] = malloc((size_t)n * 2);
    if (!*h[i]) {
      fprintf(stderr, "host allocation of %lld bytes failed\n", (long long)n * 2);
      exit(1);
    }
    fill_random(*h[i], n, 11 + (uint64_t)i, o->dtype);
    CHECK_CUDA(cudaMemcpy(*dev[i == 3 ? 4 : i], *h[i], (size_t)n * 2, cudaMemcpyHostToDevice));
  }
}

/* ---- validation against the float64 oracle on sampled rows ------------------------------ */
typedef struct {
  const buffers *b;
  int64_t N, H, Dqk, Dv;
  int dtype;
} fetch_ctx;

static void fetch(void *user, int which, int64_t bb, int64_t s, int64_t h, float *out) {
  const fetch_ctx *c = user;
  const uint16_t *src = which == ATTN_REF_Q ? c->b->hq : which == ATTN_REF_K ? c->b->hk
                        : which == ATTN_REF_V ? c->b->hv : c->b->hdo;
  const int64_t D = which == ATTN_REF_Q || which == ATTN_REF_K ? c->Dqk : c->Dv;
  const uint16_t *row = src + ((bb * c->N + s) * c->H + h) * D;
  for (int64_t d = 0; d < D; d++) out[d] = from_bits(row[d], c->dtype);
}

/* Max |got - ref| / max |ref| over 4 sampled rows of O (and dQ after a backward). */
static double check_rows(const buffers *b, const attn_spec *spec, int64_t B, int64_t N,
                         int64_t H, int64_t Dqk, int64_t Dv, int dtype, int bwd) {
  fetch_ctx fc = {b, N, H, Dqk, Dv, dtype};
  const int64_t D = bwd ? Dqk : Dv;
  attn_ref_problem rp = {spec, B, N, N, fetch, &fc};
  const int64_t rows[4] = {0, N / 3, 2 * N / 3, N - 1};
  double err = 0.0, mag = 0.0, ref[256], delta, dsink;
  uint16_t got16[256];
  float got32[256];
  for (int r = 0; r < 4; r++) {
    const int64_t bb = r % B, h = (r * 7) % H, i = rows[r], at = ((bb * N + i) * H + h) * D;
    if (!bwd) {
      attn_ref_fwd_row(&rp, bb, h, i, ref, &delta);
      CHECK_CUDA(cudaMemcpy(got16, b->o + at, (size_t)D * 2, cudaMemcpyDeviceToHost));
    } else {
      attn_ref_bwd_qrow(&rp, bb, h, i, ref, &delta, &dsink);
      CHECK_CUDA(cudaMemcpy(got32, b->dq + at, (size_t)D * 4, cudaMemcpyDeviceToHost));
    }
    for (int64_t d = 0; d < D; d++) {
      const double g = bwd ? (double)got32[d] : (double)from_bits(got16[d], dtype);
      err = fmax(err, isfinite(g) ? fabs(g - ref[d]) : INFINITY);
      mag = fmax(mag, fabs(ref[d]));
    }
  }
  return mag > 0 ? err / mag : err;
}

/* ---- timing --------------------------------------------------------------------------- */
typedef struct {
  const attn_cuda_problem *pb;
  buffers *b;
  int64_t n_q, n_lse;
  int bwd, det;
} run_args;

static attn_status run_once(const run_args *a) {
  const attn_cuda_problem *pb = a->pb;
  buffers *b = a->b;
  const size_t need = attn_cuda_workspace_bytes(pb);
  if (need > b->ws_cap) { /* grows on a shape's first (untimed, validating) call */
    CHECK_CUDA(cudaStreamSynchronize(b->stream));
    if (b->ws) CHECK_CUDA(cudaFree(b->ws));
    CHECK_CUDA(cudaMalloc(&b->ws, need));
    b->ws_cap = need;
  }
  /* o, dout [B, N, H, Dv]: the q strides scaled to Dv */
  const int64_t r = pb->Dv, qd = pb->Dqk;
  attn_cuda_view o = {b->o, pb->q.sb / qd * r, pb->q.ss / qd * r, pb->q.sh / qd * r};
  if (!a->bwd) return attn_cuda_fwd(pb, o, b->lse, pb->sq, b->ws, b->ws_cap, b->stream);
  attn_cuda_view dout = {b->dout, o.sb, o.ss, o.sh};
  attn_cuda_view dq = {b->dq, pb->q.sb, pb->q.ss, pb->q.sh};
  attn_cuda_view dk = {b->dk, pb->k.sb, pb->k.ss, pb->k.sh};
  attn_cuda_view dv = {b->dv, pb->v.sb, pb->v.ss, pb->v.sh};
  CHECK_CUDA(cudaMemsetAsync(b->dq, 0, (size_t)a->n_q * 4, b->stream));
  CHECK_CUDA(cudaMemsetAsync(b->dk, 0, (size_t)a->n_q * 4, b->stream));
  CHECK_CUDA(cudaMemsetAsync(b->dv, 0, (size_t)a->n_q * 4, b->stream));
  attn_status st = attn_cuda_bwd_prepare(pb, o, dout, b->lse, b->delta, NULL, b->stream);
  if (st != ATTN_OK) return st;
  return attn_cuda_bwd_block(pb, dout, b->lse, b->delta, pb->sq, dq, dk, dv, a->det, b->ws, b->ws_cap,
                             b->stream);
}

static void time_runs(const run_args *a, int warmup, int reps, double *med, double *mn) {
  double t[256];
  if (reps > 256) reps = 256;
  for (int i = 0; i < warmup + reps; i++) {
    CHECK_CUDA(cudaEventRecord(a->b->ev[0], a->b->stream));
    if (run_once(a) != ATTN_OK) {
      fprintf(stderr, "launch failed: %s\n", attn_last_error());
      exit(1);
    }
    CHECK_CUDA(cudaEventRecord(a->b->ev[1], a->b->stream));
    CHECK_CUDA(cudaEventSynchronize(a->b->ev[1]));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a->b->ev[0], a->b->ev[1]));
    if (i >= warmup) t[i - warmup] = ms;
  }
  *med = sorted_median(t, reps);
  *mn = t[0];
}

static void parse_list(const char *s, int64_t *out, int *n, int max) {
  *n = 0;
  while (*s && *n < max) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*end == 'K' || *end == 'k') v *= 1024, end++;
    out[(*n)++] = v;
    s = *end == ',' ? end + 1 : end;
    if (end == s && *s != ',') break;
  }
}

/* "128,64,192x128": head dims D (Dqk = Dv) or DqkxDv, at most 4. */
static void parse_dims(const char *s, options *o) {
  o->nd = 0;
  while (*s && o->nd < 4) {
    char *end;
    o->dqk[o->nd] = o->dv[o->nd] = (int)strtol(s, &end, 10);
    if (*end == 'x') o->dv[o->nd] = (int)strtol(end + 1, &end, 10);
    o->nd++;
    if (*end != ',') break;
    s = end + 1;
  }
}

static void usage(void) {
  fprintf(stderr,
          "usage: bench_cuda [--json FILE] [--dtype bf16|f16] [--n 1K,2K,..] [--hd 128,64,256,192x128]\n"
          "                  [--tokens 16384] [--model-dim 2048] [--reps 10] [--warmup 3]\n"
          "                  [--no-bwd] [--det] [--path mma|sm90|both|auto]\n");
  exit(2);
}

static options parse(int argc, char **argv) {
  options o = {.dtype_name = "bf16", .dtype = ATTN_BF16, .reps = 10, .warmup = 3, .bwd = 1,
               .tokens = 16384, .model_dim = 2048, .nn = 5, .nd = 2,
               .ns = {1024, 2048, 4096, 8192, 16384}, .dqk = {128, 64}, .dv = {128, 64}};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--json") && v) o.json = argv[++i];
    else if (!strcmp(a, "--dtype") && v) {
      o.dtype_name = argv[++i];
      o.dtype = !strcmp(v, "f16") ? ATTN_F16 : ATTN_BF16;
    } else if (!strcmp(a, "--n") && v) parse_list(argv[++i], o.ns, &o.nn, 16);
    else if (!strcmp(a, "--hd") && v) parse_dims(argv[++i], &o);
    else if (!strcmp(a, "--tokens") && v) o.tokens = atoll(argv[++i]);
    else if (!strcmp(a, "--model-dim") && v) o.model_dim = atoll(argv[++i]);
    else if (!strcmp(a, "--reps") && v) o.reps = atoi(argv[++i]);
    else if (!strcmp(a, "--warmup") && v) o.warmup = atoi(argv[++i]);
    else if (!strcmp(a, "--no-bwd")) o.bwd = 0;
    else if (!strcmp(a, "--det")) o.det = 1;
    else if (!strcmp(a, "--path") && v) o.path = argv[++i];
    else usage();
  }
  if (o.reps < 1 || o.tokens < 1 || o.model_dim < 1) usage();
  if (!o.path) o.path = "auto";
  if (strcmp(o.path, "mma") && strcmp(o.path, "sm90") && strcmp(o.path, "both") && strcmp(o.path, "auto"))
    usage();
  return o;
}

int main(int argc, char **argv) {
  options o = parse(argc, argv);
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("bench_cuda: no CUDA device\n");
    return 77;
  }
  struct cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  buffers b;
  memset(&b, 0, sizeof b);
  alloc_buffers(&b, &o);
  FILE *js = o.json ? fopen(o.json, "a") : NULL;
  if (o.json && !js) {
    fprintf(stderr, "cannot open %s\n", o.json);
    return 1;
  }
  char date[32];
  time_t now = time(NULL);
  strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
  printf("attnrun CUDA kernels on %s (sm_%d%d, %d SMs), %s, %lld tokens x d_model %lld; "
         "FLOPs: fwd 2*B*H*N^2*(Dqk+Dv) (causal /2), bwd 2.5x\n",
         prop.name, prop.major, prop.minor, prop.multiProcessorCount, o.dtype_name,
         (long long)o.tokens, (long long)o.model_dim);
  printf("%-4s %-5s %-7s %6s %3s %3s %-6s %10s %10s %8s %9s\n", "pass", "path", "hd", "N", "B", "H",
         "causal", "median ms", "min ms", "TFLOP/s", "check");
  int failed = 0;
  /* the sm90 backward's dQ mode (kernels/cuda/bwd_sm90_body.cuh): its own name in the
   * records when it is the atomics (mode 0, not the default), so both modes can sit in one
   * file */
  const char *dq = getenv("ATTN_SM90_DQ");
  const char *impl90 = dq && *dq && atoi(dq) != 1 ? "attnrun-sm90-dqatomic" : "attnrun-sm90";
  /* ATTN_SM90_ABLATE=m: the sm90 backward with stages left out (bwd_sm90_body.cuh G_AB_*),
   * for timing by difference; its gradients are wrong, so its rows ("attnrun-sm90-ab<m>")
   * are not judged */
  const char *abl = getenv("ATTN_SM90_ABLATE");
  const int ablate = abl ? atoi(abl) : 0;
  char impl90_ab[48], ab_field[32] = ""; /* every record of such a run says its mask */
  snprintf(impl90_ab, sizeof impl90_ab, "%s-ab%d", impl90, ablate);
  if (abl) snprintf(ab_field, sizeof ab_field, ", \"ablate\": %d", ablate);
  /* ATTN_MMA_ABLATE=m: the mma.sync forward's ablation kernel (instance.h FA_AB_*), for the
   * rows it takes (dispatch.c fwd_ablation); wrong unless m = 0, so judged only then */
  const char *mabl = getenv("ATTN_MMA_ABLATE");
  const int mma_ablate = mabl ? atoi(mabl) : 0;
  char impl_ab[48];
  snprintf(impl_ab, sizeof impl_ab, "attnrun-mma-ab%d", mma_ablate);
  if (mabl) snprintf(ab_field, sizeof ab_field, ", \"mma_ablate\": %d", mma_ablate);
  for (int di = 0; di < o.nd; di++)
    for (int ni = 0; ni < o.nn; ni++)
      for (int causal = 0; causal < 2; causal++)
        for (int pass = 0; pass < 1 + o.bwd; pass++)
          for (int sm90 = 0; sm90 < 2; sm90++) {
            const int64_t D = o.dqk[di], Dv = o.dv[di], N = o.ns[ni], H = o.model_dim / D;
            const int64_t B = o.tokens / N > 0 ? o.tokens / N : 1;
            attn_spec spec = ATTN_SPEC_INIT;
            spec.num_heads_q = spec.num_heads_kv = (int32_t)H;
            spec.head_dim_qk = (int32_t)D;
            spec.head_dim_v = (int32_t)Dv;
            spec.causal = causal;
            attn_cuda_problem pb;
            memset(&pb, 0, sizeof pb);
            pb.B = B;
            pb.Hq = pb.Hkv = H;
            pb.Dqk = D;
            pb.Dv = Dv;
            pb.sq = pb.skv = pb.seq_q = pb.seq_kv = N;
            pb.scale = 1.0f / sqrtf((float)D);
            pb.causal = causal;
            pb.window_left = pb.window_right = -1;
            pb.dtype = o.dtype;
            attn_cuda_view in = {NULL, N * H * D, H * D, D};
            in.p = b.q;
            pb.q = in;
            in.p = b.k;
            pb.k = in;
            attn_cuda_view vin = {b.v, N * H * Dv, H * Dv, Dv};
            pb.v = vin;
            /* paths of this (pass, dims, dtype): sm90 only where the dispatcher takes the Hopper
             * kernels once they are switched on (both directions for a backward row) */
            attn_cuda_set_hopper(1);
            const int can90 = !strcmp(attn_cuda_fwd_path(&pb), "sm90") &&
                              (!pass || !strcmp(attn_cuda_bwd_path(&pb, o.det), "sm90"));
            const int want90 = can90 && (!strcmp(o.path, "sm90") || !strcmp(o.path, "both") ||
                                         (!strcmp(o.path, "auto") && o.dtype == ATTN_BF16));
            const int want_mma = !want90 || strcmp(o.path, "sm90");
            if (sm90 ? !want90 : !want_mma) continue;
            attn_cuda_set_hopper(sm90);
            run_args ra = {&pb, &b, B * N * H * D, B * H * N, 0, o.det};
            /* validate: one forward (and backward) before timing */
            if (run_once(&ra) != ATTN_OK) {
              fprintf(stderr, "hd=%lld: %s\n", (long long)D, attn_last_error());
              failed = 1;
              continue;
            }
            if (sm90 && strcmp(attn_cuda_last_fwd_path(), "sm90")) {
              fprintf(stderr, "hd=%lld N=%lld: the sm90 forward did not run (%s ran; ATTN_DEBUG=INFO says why)\n",
                      (long long)D, (long long)N, attn_cuda_last_fwd_path());
              failed = 1;
              continue;
            }
            /* the mma.sync forward kernel that ran (names a forward row: not the variable set) */
            const char *form = attn_cuda_last_fwd_form();
            ra.bwd = pass;
            if (pass && run_once(&ra) != ATTN_OK) {
              fprintf(stderr, "bwd hd=%lld: %s\n", (long long)D, attn_last_error());
              failed = 1;
              continue;
            }
            if (sm90 && pass && strcmp(attn_cuda_last_bwd_path(), "sm90")) {
              fprintf(stderr, "hd=%lld N=%lld: the sm90 backward did not run (%s ran; ATTN_DEBUG=INFO says why)\n",
                      (long long)D, (long long)N, attn_cuda_last_bwd_path());
              failed = 1;
              continue;
            }
            CHECK_CUDA(cudaStreamSynchronize(b.stream));
            const double rel = check_rows(&b, &spec, B, N, H, D, Dv, o.dtype, pass);
            const int fwd_mma = !sm90 && !pass, mma_ab = fwd_mma && !strcmp(form, "ab");
            const char *impl_mma = fwd_mma && !strcmp(form, "4w")     ? "attnrun-mma4"
                                   : fwd_mma && !strcmp(form, "2cta") ? "attnrun-mma2c"
                                   : fwd_mma && !strcmp(form, "4x32") ? "attnrun-mma4x32"
                                   : fwd_mma && !strcmp(form, "4s")   ? "attnrun-mma4s"
                                   : !sm90 && pass && !strcmp(attn_cuda_last_bwd_form(), "4s")
                                       ? "attnrun-mma4s"
                                       : "attnrun";
            const int ablated = (ablate && sm90 && pass) || (mma_ab && mma_ablate),
                      ok = ablated || rel <= (pass ? 3e-2 : 2e-2);
            failed |= !ok;
            double med, mn;
            time_runs(&ra, o.warmup, o.reps, &med, &mn);
            const double flops = 2.0 * B * H * (double)N * N * (double)(D + Dv) * (causal ? 0.5 : 1.0) *
                                 (pass ? 2.5 : 1.0);
            char hd[32];
            if (D == Dv) snprintf(hd, sizeof hd, "%lld", (long long)D);
            else snprintf(hd, sizeof hd, "%lldx%lld", (long long)D, (long long)Dv);
            const double tf = flops / (med * 1e-3) / 1e12;
            static double mma_ms; /* the mma row of the same shape, just before */
            char rel_mma[32] = "";
            if (!sm90) mma_ms = med;
            else if (want_mma && mma_ms > 0) snprintf(rel_mma, sizeof rel_mma, "  %.2fx mma", mma_ms / med);
            printf("%-4s %-5s %-7s %6lld %3lld %3lld %-6s %10.3f %10.3f %8.1f %9s%s\n", pass ? "bwd" : "fwd",
                   sm90 ? "sm90" : "mma", hd, (long long)N, (long long)B, (long long)H,
                   causal ? "yes" : "no", med, mn, tf, ablated ? "ablated" : ok ? "ok" : "FAIL", rel_mma);
            if (!ok) fprintf(stderr, "  check: max relative error %.3e on sampled rows\n", rel);
            fflush(stdout);
            if (js)
              fprintf(js,
                      "{\"impl\": \"%s\", \"pass\": \"%s\", \"dtype\": \"%s\", \"hd\": %lld, "
                      "\"hd_v\": %lld, \"N\": %lld, \"B\": %lld, \"H\": %lld, \"causal\": %d, \"deterministic\": %d, "
                      "\"ms_median\": %.5f, \"ms_min\": %.5f, \"tflops\": %.2f, \"flops\": %.6e, "
                      "\"check\": \"%s\", \"check_rel_err\": %.3e, \"device\": \"%s\", "
                      "\"git\": \"%s\", \"date\": \"%s\"%s}\n",
                      mma_ab ? impl_ab : ablated ? impl90_ab : sm90 ? impl90 : impl_mma, pass ? "bwd" : "fwd", o.dtype_name, (long long)D, (long long)Dv, (long long)N, (long long)B,
                      (long long)H, causal, o.det, med, mn, tf, flops, ablated ? "ablated" : ok ? "ok" : "fail", rel,
                      prop.name, BENCH_GIT_SHA, date, ab_field);
          }
  attn_cuda_set_hopper(-1);
  if (js) fclose(js);
  return failed;
}
