/* bench_cuda_decode.c — times the attnrun CUDA forward on decode steps (a few query rows
 * per head against a long K/V cache: bf16, head dim 128, GQA and MHA, B x Skv up to 256K
 * cached tokens), in three forms side by side: plain (one query head a CTA, unsplit), the
 * dispatcher's plan (packed GQA, split-KV: kernels/cuda/README.md, "Decode"), and the plan
 * on a paged KV cache (pages of 16 rows in shuffled order through a block table, with the
 * used lengths given: what an inference server hands over; "paged16"). A decode step
 * is bound by reading the cache, so next to each it times a device-to-device copy of the
 * same K and V bytes (cudaMemcpyAsync: the bytes read once and written once) and reports
 * the cache bytes read per second and that rate over the copy's read rate (half its bytes
 * per second: 1.0 reads the cache as fast as the copy does). sdpa_bench.py decode times
 * torch's SDPA on the same shapes; its compare prints both. Records of a run whose forwards
 * took the mma.sync kernel with the 4-buffer K/V ring (ATTN_CUDA_FWD_STAGES=4; what
 * attn_cuda_last_fwd_form says ran) have "-4s" after their impl names, and of one whose
 * forwards took the key-split decode kernel (ATTN_CUDA_FWD_KSPLIT=1) "-ks".
 *
 * Each shape is validated first (4 sampled rows of O against the float64 oracle), then
 * warmed up, then timed with CUDA events: median and min of --reps runs.
 * Usage: bench_cuda_decode [--json FILE] [--sq 1] [--reps 20] [--warmup 5]
 *                          [--shapes B/Hq/Hkv/Skv,...] (sdpa_bench.py decode's syntax; Skv a
 *                          multiple of the page, 16; default: the seven below)
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

#define HD 128
#define MAX_REPS 256
#define PAGE 16 /* rows a page of the paged form (vLLM's default) */

typedef struct {
  int64_t B, Hq, Hkv, Skv;
} shape;

#define MAX_SHAPES 16
/* Llama-3-8B-like 32/8 heads from one to 32 sequences, a 128K cache, MHA, and MQA. */
static const shape default_shapes[] = {{1, 32, 8, 8192},  {1, 32, 8, 32768},  {1, 32, 8, 131072},
                               {8, 32, 8, 32768}, {32, 32, 8, 8192},  {1, 32, 32, 32768},
                               {1, 16, 1, 65536}};

/* Host copies [B, S, H, D] for the oracle. */
typedef struct {
  const uint16_t *q, *k, *v;
  int64_t Sq, Skv, Hq, Hkv;
} host_in;

static void fetch(void *user, int which, int64_t b, int64_t s, int64_t h, float *out) {
  const host_in *c = user;
  const int q = which == ATTN_REF_Q;
  const uint16_t *src = q ? c->q : which == ATTN_REF_K ? c->k : c->v;
  const int64_t S = q ? c->Sq : c->Skv, H = q ? c->Hq : c->Hkv;
  const uint16_t *row = src + ((b * S + s) * H + h) * HD;
  for (int d = 0; d < HD; d++) out[d] = from_bits(row[d], ATTN_BF16);
}

typedef struct {
  const attn_cuda_problem *pb;
  attn_cuda_view o;
  float *lse;
  void *ws;
  size_t ws_bytes;
  const void *copy_src; /* the copy reference when set */
  void *copy_dst;
  size_t copy_bytes;
  cudaStream_t stream;
} run_args;

static void run_once(const run_args *a) {
  if (a->copy_src) {
    CHECK_CUDA(cudaMemcpyAsync(a->copy_dst, a->copy_src, a->copy_bytes, cudaMemcpyDeviceToDevice,
                               a->stream));
    return;
  }
  if (attn_cuda_fwd(a->pb, a->o, a->lse, a->pb->sq, a->ws, a->ws_bytes, a->stream) != ATTN_OK) {
    fprintf(stderr, "attn_cuda_fwd: %s\n", attn_last_error());
    exit(1);
  }
}

static void time_runs(const run_args *a, int warmup, int reps, cudaEvent_t ev[2], double *med,
                      double *mn) {
  double t[MAX_REPS];
  for (int i = 0; i < warmup + reps; i++) {
    CHECK_CUDA(cudaEventRecord(ev[0], a->stream));
    run_once(a);
    CHECK_CUDA(cudaEventRecord(ev[1], a->stream));
    CHECK_CUDA(cudaEventSynchronize(ev[1]));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, ev[0], ev[1]));
    if (i >= warmup) t[i - warmup] = ms;
  }
  *med = sorted_median(t, reps);
  *mn = t[0];
}

/* Max |O - ref| / max |ref| over 4 sampled (batch, head) rows of the last query row. */
static double check_rows(const attn_cuda_problem *pb, const host_in *hin, const uint16_t *d_o) {
  attn_spec spec = ATTN_SPEC_INIT;
  spec.num_heads_q = (int32_t)pb->Hq;
  spec.num_heads_kv = (int32_t)pb->Hkv;
  spec.head_dim_qk = spec.head_dim_v = HD;
  attn_ref_problem rp = {&spec, pb->B, pb->sq, pb->skv, fetch, (void *)hin};
  double err = 0, mag = 0, ref[HD], lse;
  uint16_t got[HD];
  for (int r = 0; r < 4; r++) {
    const int64_t b = r % pb->B, h = (r * 11) % pb->Hq, i = pb->sq - 1;
    attn_ref_fwd_row(&rp, b, h, i, ref, &lse);
    CHECK_CUDA(cudaMemcpy(got, d_o + ((b * pb->sq + i) * pb->Hq + h) * HD, sizeof got,
                          cudaMemcpyDeviceToHost));
    for (int d = 0; d < HD; d++) {
      const double g = from_bits(got[d], ATTN_BF16);
      err = fmax(err, isfinite(g) ? fabs(g - ref[d]) : INFINITY);
      mag = fmax(mag, fabs(ref[d]));
    }
  }
  return mag > 0 ? err / mag : err;
}

/* pb's K and V (host hk, hv [B, Skv, Hkv, HD], nk elements each) as a paged cache in pool
 * (device, 2 * nk elements: K pages, then V pages): logical page j of batch b at a
 * shuffled pool page, the block table and used lengths (Skv each) allocated here. */
static attn_cuda_problem paged_problem(const attn_cuda_problem *pb, const uint16_t *hk,
                                       const uint16_t *hv, uint16_t *pool, int64_t nk,
                                       uint64_t seed) {
  const int64_t pps = pb->skv / PAGE, pages = pb->B * pps, prow = PAGE * pb->Hkv * HD;
  int32_t *perm = malloc((size_t)pages * 4), *used = malloc((size_t)pb->B * 4);
  uint16_t *hp = malloc((size_t)nk * 2);
  if (!perm || !used || !hp) {
    fprintf(stderr, "host allocation failed\n");
    exit(1);
  }
  for (int64_t i = 0; i < pages; i++) perm[i] = (int32_t)i;
  for (int64_t i = pages - 1; i > 0; i--) { /* Fisher-Yates on a 64-bit LCG */
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    const int64_t j = (int64_t)((seed >> 33) % (uint64_t)(i + 1));
    const int32_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  for (int x = 0; x < 2; x++) {
    const uint16_t *src = x ? hv : hk;
    for (int64_t i = 0; i < pages; i++)
      memcpy(hp + perm[i] * prow, src + i * prow, (size_t)prow * 2);
    CHECK_CUDA(cudaMemcpy(pool + x * nk, hp, (size_t)nk * 2, cudaMemcpyHostToDevice));
  }
  for (int64_t b = 0; b < pb->B; b++) used[b] = (int32_t)pb->skv;
  attn_cuda_problem p = *pb;
  int32_t *d_table, *d_used;
  CHECK_CUDA(cudaMalloc((void **)&d_table, (size_t)pages * 4));
  CHECK_CUDA(cudaMalloc((void **)&d_used, (size_t)pb->B * 4));
  CHECK_CUDA(cudaMemcpy(d_table, perm, (size_t)pages * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_used, used, (size_t)pb->B * 4, cudaMemcpyHostToDevice));
  p.k = (attn_cuda_view){pool, prow, pb->Hkv * HD, HD};
  p.v = (attn_cuda_view){pool + nk, prow, pb->Hkv * HD, HD};
  p.block_table = d_table;
  p.kv_used = d_used;
  p.pages_per_seq = pps;
  p.page_size = PAGE;
  p.num_pages = pages;
  free(perm), free(used), free(hp);
  return p;
}

/* "B/Hq/Hkv/Skv,..." into out (at most MAX_SHAPES); the count, or -1 with a message. */
static int parse_shapes(const char *s, shape *out) {
  int n = 0;
  while (*s) {
    long long b, hq, hkv, skv;
    int used = 0;
    if (n == MAX_SHAPES || sscanf(s, "%lld/%lld/%lld/%lld%n", &b, &hq, &hkv, &skv, &used) != 4 ||
        b < 1 || hkv < 1 || hq < hkv || hq % hkv || skv < PAGE || skv % PAGE ||
        (s[used] != ',' && s[used] != '\0')) {
      fprintf(stderr, "bench_cuda_decode: --shapes wants up to %d of B/Hq/Hkv/Skv (Hq a multiple of "
              "Hkv, Skv a multiple of %d), at '%s'\n", MAX_SHAPES, PAGE, s);
      return -1;
    }
    out[n++] = (shape){b, hq, hkv, skv};
    s += used + (s[used] == ',');
  }
  return n;
}

int main(int argc, char **argv) {
  const char *json = NULL;
  int64_t sq = 1;
  int reps = 20, warmup = 5, nshapes = (int)(sizeof default_shapes / sizeof default_shapes[0]);
  shape shapes[MAX_SHAPES];
  memcpy(shapes, default_shapes, sizeof default_shapes);
  for (int i = 1; i < argc; i++) {
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(argv[i], "--json") && v) json = argv[++i];
    else if (!strcmp(argv[i], "--sq") && v) sq = atoll(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && v) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--warmup") && v) warmup = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--shapes") && v) {
      if ((nshapes = parse_shapes(argv[++i], shapes)) < 1) return 2;
    } else {
      fprintf(stderr, "usage: bench_cuda_decode [--json FILE] [--sq 1] [--reps 20] [--warmup 5] "
              "[--shapes B/Hq/Hkv/Skv,...]\n");
      return 2;
    }
  }
  if (sq < 1 || sq > 64 || reps < 1 || reps > MAX_REPS || warmup < 0) {
    fprintf(stderr, "bench_cuda_decode: --sq 1..64, --reps 1..%d, --warmup >= 0\n", MAX_REPS);
    return 2;
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("bench_cuda_decode: no CUDA device\n");
    return 77;
  }
  struct cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  FILE *js = json ? fopen(json, "a") : NULL;
  if (json && !js) {
    fprintf(stderr, "cannot open %s\n", json);
    return 1;
  }
  char date[32];
  time_t now = time(NULL);
  strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
  printf("attnrun CUDA decode on %s (%d SMs), bf16, head dim %d, Sq %lld; GB/s = K+V bytes read "
         "/ time; vs copy = that over the same bytes' device copy (read rate)\n",
         prop.name, prop.multiProcessorCount, HD, (long long)sq);
  printf("%-10s %3s %3s %3s %7s %10s %10s %8s %8s %5s %6s %7s %s\n", "form", "B", "Hq", "Hkv", "Skv",
         "median ms", "min ms", "GB/s", "vs copy", "pack", "splits", "check", "path");
  cudaStream_t stream;
  cudaEvent_t ev[2];
  CHECK_CUDA(cudaStreamCreate(&stream));
  CHECK_CUDA(cudaEventCreate(&ev[0]));
  CHECK_CUDA(cudaEventCreate(&ev[1]));
  int failed = 0;
  for (int si = 0; si < nshapes; si++) {
    const shape sh = shapes[si];
    const int64_t nq = sh.B * sq * sh.Hq * HD, nk = sh.B * sh.Skv * sh.Hkv * HD;
    uint16_t *hq = malloc((size_t)nq * 2), *hk = malloc((size_t)nk * 2), *hv = malloc((size_t)nk * 2);
    if (!hq || !hk || !hv) {
      fprintf(stderr, "host allocation failed\n");
      return 1;
    }
    fill_random(hq, nq, 1 + si, ATTN_BF16);
    fill_random(hk, nk, 100 + si, ATTN_BF16);
    fill_random(hv, nk, 200 + si, ATTN_BF16);
    uint16_t *q, *kv, *o, *copy;
    float *lse;
    CHECK_CUDA(cudaMalloc((void **)&q, (size_t)nq * 2));
    CHECK_CUDA(cudaMalloc((void **)&kv, (size_t)nk * 4)); /* K, then V */
    CHECK_CUDA(cudaMalloc((void **)&copy, (size_t)nk * 4));
    CHECK_CUDA(cudaMalloc((void **)&o, (size_t)nq * 2));
    CHECK_CUDA(cudaMalloc((void **)&lse, (size_t)(sh.B * sh.Hq * sq) * 4));
    CHECK_CUDA(cudaMemcpy(q, hq, (size_t)nq * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(kv, hk, (size_t)nk * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(kv + nk, hv, (size_t)nk * 2, cudaMemcpyHostToDevice));
    attn_cuda_problem pb;
    memset(&pb, 0, sizeof pb);
    pb.B = sh.B;
    pb.Hq = sh.Hq;
    pb.Hkv = sh.Hkv;
    pb.Dqk = pb.Dv = HD;
    pb.sq = pb.seq_q = sq;
    pb.skv = pb.seq_kv = sh.Skv;
    pb.scale = 1.0f / sqrtf((float)HD);
    pb.causal = 1; /* bottom-right: the step's rows see the cache and each other */
    pb.window_left = pb.window_right = -1;
    pb.dtype = ATTN_BF16;
    pb.q = (attn_cuda_view){q, sq * sh.Hq * HD, sh.Hq * HD, HD};
    pb.k = (attn_cuda_view){kv, sh.Skv * sh.Hkv * HD, sh.Hkv * HD, HD};
    pb.v = (attn_cuda_view){kv + nk, sh.Skv * sh.Hkv * HD, sh.Hkv * HD, HD};
    host_in hin = {hq, hk, hv, sq, sh.Skv, sh.Hq, sh.Hkv};
    const double kv_bytes = (double)nk * 4;
    run_args copy_run = {&pb, pb.q, lse, NULL, 0, kv, copy, (size_t)nk * 4, stream};
    double copy_med, copy_min;
    time_runs(&copy_run, warmup, reps, ev, &copy_med, &copy_min);
    const double copy_read = kv_bytes / (copy_med * 1e-3) / 1e9; /* GB/s read by the copy */
    /* the paged form's pool: the same pages of PAGE rows, shuffled (in the copy buffer,
     * whose job is done), its table and the used lengths (every key) */
    const attn_cuda_problem paged = paged_problem(&pb, hk, hv, copy, nk, 7 + si);
    for (int form = 0; form < 3; form++) {
      attn_cuda_set_decode(form ? -1 : 0, form ? -1 : 1);
      const attn_cuda_problem *fp = form == 2 ? &paged : &pb;
      size_t ws_bytes = attn_cuda_workspace_bytes(fp);
      void *ws = NULL;
      if (ws_bytes) CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
      run_args ra = {fp, {o, sq * sh.Hq * HD, sh.Hq * HD, HD}, lse, ws, ws_bytes, NULL, NULL, 0, stream};
      CHECK_CUDA(cudaMemsetAsync(o, 0xFF, (size_t)nq * 2, stream)); /* poison, in order */
      run_once(&ra);
      CHECK_CUDA(cudaStreamSynchronize(stream));
      int pack, nsplit;
      attn_cuda_last_fwd_plan(&pack, &nsplit);
      const char *form_ran = attn_cuda_last_fwd_form();
      const char *sfx = !strcmp(form_ran, "4s") ? "-4s" : !strcmp(form_ran, "ks") ? "-ks" : "";
      /* which kernels ran: the plain form (one head a CTA, unsplit) takes the sm90 forward
       * where the dispatcher allows it, the packed and split forms mma.sync */
      const char *path = attn_cuda_last_fwd_path();
      const double rel = check_rows(&pb, &hin, o);
      const int ok = rel <= 2e-2;
      failed |= !ok;
      double med, mn;
      time_runs(&ra, warmup, reps, ev, &med, &mn);
      const double gbps = kv_bytes / (med * 1e-3) / 1e9;
      const char *name = form == 2 ? "paged" : form ? "planned" : "plain";
      char label[16];
      snprintf(label, sizeof label, "%s%s", name, sfx);
      printf("%-10s %3lld %3lld %3lld %7lld %10.4f %10.4f %8.0f %8.2f %5d %6d %7s %s\n", label,
             (long long)sh.B, (long long)sh.Hq, (long long)sh.Hkv, (long long)sh.Skv, med, mn,
             gbps, gbps / copy_read, pack, nsplit, ok ? "ok" : "FAIL", path);
      if (!ok) fprintf(stderr, "  check: max relative error %.3e on sampled rows\n", rel);
      fflush(stdout);
      if (js)
        fprintf(js,
                "{\"impl\": \"%s%s\", \"mode\": \"decode\", \"pass\": \"fwd\", \"dtype\": \"bf16\", "
                "\"hd\": %d, \"B\": %lld, \"Hq\": %lld, \"Hkv\": %lld, \"Sq\": %lld, \"Skv\": %lld, "
                "\"causal\": 1, \"ms_median\": %.5f, \"ms_min\": %.5f, \"kv_gbps\": %.1f, "
                "\"copy_read_gbps\": %.1f, \"pack\": %d, \"nsplit\": %d, \"path\": \"%s\", \"check\": \"%s\", "
                "\"check_rel_err\": %.3e, \"device\": \"%s\", \"git\": \"%s\", \"date\": \"%s\"}\n",
                form == 2 ? "attnrun-paged16" : form ? "attnrun" : "attnrun-plain", sfx, HD, (long long)sh.B, (long long)sh.Hq,
                (long long)sh.Hkv, (long long)sq, (long long)sh.Skv, med, mn, gbps, copy_read,
                pack, nsplit, path, ok ? "ok" : "fail", rel, prop.name, BENCH_GIT_SHA, date);
      if (ws) CHECK_CUDA(cudaFree(ws));
    }
    attn_cuda_set_decode(-1, -1);
    void *dev[] = {q, kv, copy, o, lse, (void *)paged.kv_used, (void *)paged.block_table};
    for (int i = 0; i < 7; i++) CHECK_CUDA(cudaFree(dev[i]));
    free(hq);
    free(hk);
    free(hv);
  }
  if (js) fclose(js);
  return failed;
}
