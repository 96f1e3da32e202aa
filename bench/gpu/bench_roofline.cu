/* bench_roofline.cu — what this GPU's SMs sustain on the instructions the mma.sync flash
 * forward is made of, each alone, measured in one run: the ceilings its kernels are judged
 * against (the 8-warp forward ran at about 107 TFLOP/s on an H200, torch's mma.sync flash
 * kernel at 344, on 2026-12-04, and nothing here said which resource bound ours).
 *
 *   mma      mma.sync m16n8k16 bf16 (f32 accumulators) from registers: FLOP/clk/SM by warps
 *            an SM and independent accumulator chains a warp; one warp, one chain: latency.
 *   ldsm     ldmatrix.x4 from padded rows (the kernels' 136-element row stride, no bank
 *            conflicts): bytes/clk/SM, alone (per 0) and feeding 2 MMAs a load (a 16-row warp,
 *            the 8-warp kernel: S = Q K^T, O += P V) or 4 (a 32-row warp, FlashAttention-2's).
 *   ex2      ex2.approx.ftz.f32 (the online softmax's MUFU op): results/clk/SM.
 *   stream   one CTA of 256 threads a stream of 32 KiB tiles (a 64-key K+V tile at d = 128)
 *            from device memory into a ring of shared-memory buffers, waited for tile by tile
 *            behind a CTA barrier as the forward does, by cp.async (16 B a thread) or, on
 *            sm_90, by the bulk-copy engine (cp.async.bulk onto an mbarrier, as TMA lands):
 *            GB/s by CTAs and buffers, against a device-to-device copy's read rate (the decode
 *            steps read their cache at 0.3 of it on 2026-12-04).
 *
 * Clocks: CTA 0 reads clock64 and %globaltimer at its start and end, so per-clock figures
 * use the SM clock the kernel ran at. Each figure is the median of --reps launches.
 * Usage: bench_roofline [--json FILE] [--reps 5] [--quick] (quick: short launches, a smoke
 * test). Prints a table; --json appends "mode": "roofline" records (label, value, unit),
 * which sdpa_bench.py compare prints. Exit status: 0, 1 on a CUDA error, 77 without a device. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_gpu.h"     /* CHECK_CUDA, sorted_median, BENCH_GIT_SHA */
#include "device_sm90.cuh" /* the kernels' own primitives (device.cuh; mbarriers on sm_90a) */

#define ROW 136            /* elements a shared-memory row: 128 + the kernels' 8 of padding */
#define TILE (32 * 1024)   /* bytes a streamed tile */
#define STREAM_THREADS 256 /* threads a streaming CTA */
#define MAX_REPS 64

/* CTA 0's clock64 and %globaltimer (ns) at its start and end */
struct probe {
  unsigned long long c0, c1, t0, t1;
};

__device__ __forceinline__ unsigned long long gtime(void) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void probe_begin(probe *p) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    p->t0 = gtime();
    p->c0 = clock64();
  }
}
__device__ __forceinline__ void probe_end(probe *p) {
  __syncthreads();
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    p->c1 = clock64();
    p->t1 = gtime();
  }
}
/* small bf16 pairs (2^-7 and a lane-dependent neighbour): products stay far from overflow */
__device__ __forceinline__ uint32_t small_pair(int i) { return 0x3c003c00u + (uint32_t)(i & 7); }

/* CH independent m16n8k16 chains a warp, iters rounds */
template <int CH> __global__ void __launch_bounds__(512) k_mma(int iters, float *sink, probe *pr) {
  probe_begin(pr);
  const int lane = (int)threadIdx.x % 32;
  const uint32_t a[4] = {small_pair(lane), small_pair(lane + 1), small_pair(lane + 2), small_pair(lane + 3)};
  const uint32_t b0 = small_pair(lane + 4), b1 = small_pair(lane + 5);
  float c[CH][4];
  for (int j = 0; j < CH; j++)
    for (int e = 0; e < 4; e++) c[j][e] = 0.0f;
  for (int i = 0; i < iters; i++) {
#pragma unroll
    for (int j = 0; j < CH; j++) fa_mma_bf16(c[j], a, b0, b1);
  }
  float s = 0.0f;
  for (int j = 0; j < CH; j++) s += c[j][0] + c[j][1] + c[j][2] + c[j][3];
  if (s == -1.0f) sink[threadIdx.x] = s; /* never: keeps the chains live */
  probe_end(pr);
}

/* A warp walks a 64-row x 128-column tile of padded rows as the forward's S = Q K^T does:
 * for each 16-column chunk, 4 ldmatrix.x4 (16 rows each: B fragments of two 8-key
 * n-blocks), each feeding R MMAs (0: loads only; 2: one 16-row m-tile; 4: two). */
template <int R> __global__ void __launch_bounds__(512) k_mix(int iters, float *sink, probe *pr) {
  extern __shared__ uint16_t tile[]; /* [64][ROW] */
  for (int i = (int)threadIdx.x; i < 64 * ROW; i += (int)blockDim.x) tile[i] = (uint16_t)(0x3c00 + (i & 7));
  __syncthreads();
  probe_begin(pr);
  const int lane = (int)threadIdx.x % 32;
  const uint16_t *base = tile + (lane & 15) * ROW + (lane >> 4) * 8;
  const uint32_t a0[4] = {small_pair(lane), small_pair(lane + 1), small_pair(lane + 2), small_pair(lane + 3)};
  const uint32_t a1[4] = {small_pair(lane + 4), small_pair(lane + 5), small_pair(lane + 6), small_pair(lane + 7)};
  float c[R == 4 ? 16 : 8][4];
  for (int j = 0; j < (R == 4 ? 16 : 8); j++)
    for (int e = 0; e < 4; e++) c[j][e] = 0.0f;
  /* the fragments of chunk kk + 1 load while chunk kk's MMAs run (two sets, as ptxas
   * schedules the forward's own loads ahead of their MMAs) */
  uint32_t x = 0, b[2][4][4];
#define LOAD_CHUNK(set, kk_)                                                                 \
  for (int n = 0; n < 4; n++) fa_ldsm_x4(b[set][n], base + n * 16 * ROW + (kk_) * 16)
#pragma unroll
  LOAD_CHUNK(0, 0);
  for (int i = 0; i < iters; i++) {
#pragma unroll
    for (int kk = 0; kk < 8; kk++) {
#pragma unroll
      LOAD_CHUNK((kk + 1) & 1, (kk + 1) & 7); /* (after chunk 7: the next round's chunk 0) */
#pragma unroll
      for (int n = 0; n < 4; n++) {
        const uint32_t *f = b[kk & 1][n];
        if (R == 0) x ^= f[0] ^ f[1] ^ f[2] ^ f[3];
        if (R >= 2) {
          fa_mma_bf16(c[2 * n], a0, f[0], f[1]);
          fa_mma_bf16(c[2 * n + 1], a0, f[2], f[3]);
        }
        if (R == 4) {
          fa_mma_bf16(c[8 + 2 * n], a1, f[0], f[1]);
          fa_mma_bf16(c[8 + 2 * n + 1], a1, f[2], f[3]);
        }
      }
    }
  }
#undef LOAD_CHUNK
  float s = 0.0f;
  for (int j = 0; j < (R == 4 ? 16 : 8); j++) s += c[j][0] + c[j][1] + c[j][2] + c[j][3];
  if (s == -1.0f || x == 0x9E3779B9u) sink[threadIdx.x] = s; /* never: keeps x and c live */
  probe_end(pr);
}

/* CH independent ex2 chains a thread (x -> 2^x - 1.5 stays in [-1.5, 0]) */
template <int CH> __global__ void __launch_bounds__(512) k_ex2(int iters, float *sink, probe *pr) {
  probe_begin(pr);
  float x[CH];
  for (int j = 0; j < CH; j++) x[j] = -1.0f - 0.01f * (float)((threadIdx.x + j) & 15);
  for (int i = 0; i < iters; i++) {
#pragma unroll
    for (int j = 0; j < CH; j++) {
      float y;
      asm volatile("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x[j]));
      x[j] = y - 1.5f;
    }
  }
  float s = 0.0f;
  for (int j = 0; j < CH; j++) s += x[j];
  if (s == 1.0f) sink[threadIdx.x] = s;
  probe_end(pr);
}

/* Tile t of CTA b's stream into buffer t % ST by cp.async (16 B a thread, 8 a thread a
 * tile); ST - 1 tiles in flight; one word of each landed tile is read (a consumer). */
template <int ST>
__global__ void __launch_bounds__(STREAM_THREADS) k_stream(const char *src, int tiles, float *sink, probe *pr) {
  extern __shared__ __align__(128) char ring[]; /* [ST][TILE] */
  probe_begin(pr);
  const char *g = src + (size_t)blockIdx.x * tiles * TILE;
  const int tid = (int)threadIdx.x;
  uint32_t acc = 0;
#define ISSUE(t_)                                                                               \
  do {                                                                                          \
    if ((t_) < tiles)                                                                           \
      for (int i_ = tid; i_ < TILE / 16; i_ += STREAM_THREADS)                                  \
        fa_cp_async16(ring + ((t_) % ST) * TILE + i_ * 16, g + (size_t)(t_) * TILE + i_ * 16, 1); \
    fa_cp_commit();                                                                             \
  } while (0)
  for (int t = 0; t < ST - 1; t++) ISSUE(t);
  for (int t = 0; t < tiles; t++) {
    fa_cp_wait_group<ST - 2>();
    __syncthreads(); /* tile t landed everywhere; buffer (t - 1) % ST is free */
    ISSUE(t + ST - 1);
    acc += *(const volatile uint32_t *)(ring + (t % ST) * TILE + tid * 4);
  }
#undef ISSUE
  if (acc == 0x12345678u) sink[tid] = (float)acc;
  probe_end(pr);
}

/* The same stream by the bulk-copy engine (sm_90: cp.async.bulk global -> shared onto an
 * mbarrier, four 8 KiB copies a tile issued by thread 0; every thread waits on the tile's
 * barrier, and the CTA barrier after it frees the buffer computed last). */
template <int ST>
__global__ void __launch_bounds__(STREAM_THREADS) k_bulk(const char *src, int tiles, float *sink, probe *pr) {
#if FA_SM90_DEVICE
  extern __shared__ __align__(128) char ring[]; /* [ST][TILE] */
  __shared__ __align__(8) uint64_t bar[ST];
  probe_begin(pr);
  const char *g = src + (size_t)blockIdx.x * tiles * TILE;
  const int tid = (int)threadIdx.x;
  if (tid == 0)
    for (int s = 0; s < ST; s++) fa_mbar_init(&bar[s], 1);
  fa_mbar_init_fence();
  __syncthreads();
#define ISSUE(t_)                                                                                 \
  do {                                                                                            \
    if (tid == 0 && (t_) < tiles) {                                                               \
      const uint32_t b_ = fa_smem_addr(&bar[(t_) % ST]);                                          \
      fa_mbar_arrive_expect_tx(&bar[(t_) % ST], TILE);                                            \
      for (int q_ = 0; q_ < 4; q_++)                                                              \
        asm volatile(                                                                             \
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "  \
            "[%3];\n" ::"r"(fa_smem_addr(ring + ((t_) % ST) * TILE + q_ * (TILE / 4))),              \
            "l"(g + (size_t)(t_) * TILE + q_ * (TILE / 4)), "r"(TILE / 4), "r"(b_)                \
            : "memory");                                                                          \
    }                                                                                             \
  } while (0)
  for (int t = 0; t < ST - 1; t++) ISSUE(t);
  uint32_t acc = 0;
  for (int t = 0; t < tiles; t++) {
    fa_mbar_wait(&bar[t % ST], (t / ST) & 1);
    __syncthreads(); /* everyone is past tile t - 1: its buffer takes tile t + ST - 1 */
    ISSUE(t + ST - 1);
    acc += *(const volatile uint32_t *)(ring + (t % ST) * TILE + tid * 4);
  }
#undef ISSUE
  if (acc == 0x12345678u) sink[tid] = (float)acc;
  probe_end(pr);
#else
  (void)src, (void)tiles, (void)sink, (void)pr;
#endif
}

/* ---- host ------------------------------------------------------------------------------- */
static FILE *g_json;
static char g_dev[256];
static int g_reps = 5;
static probe *g_probe; /* device */
static float *g_sink;

typedef struct {
  double ms;      /* median launch time */
  double sm_mhz;  /* CTA 0's clock over its time, that launch */
  double cycles;  /* CTA 0's clocks, that launch */
} timing;

typedef void (*launch_fn)(const void *arg);

/* one warm-up launch, then g_reps timed ones: the median's time and CTA 0's clock */
static timing time_launches(launch_fn fn, const void *arg) {
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  fn(arg);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  double ms[MAX_REPS], mhz[MAX_REPS], cyc[MAX_REPS], sorted[MAX_REPS];
  for (int r = 0; r < g_reps; r++) {
    CHECK_CUDA(cudaEventRecord(e0));
    fn(arg);
    CHECK_CUDA(cudaEventRecord(e1));
    CHECK_CUDA(cudaEventSynchronize(e1));
    CHECK_CUDA(cudaGetLastError());
    float t;
    CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
    probe p;
    CHECK_CUDA(cudaMemcpy(&p, g_probe, sizeof p, cudaMemcpyDeviceToHost));
    ms[r] = sorted[r] = t;
    cyc[r] = (double)(p.c1 - p.c0);
    mhz[r] = p.t1 > p.t0 ? cyc[r] / (double)(p.t1 - p.t0) * 1e3 : 0.0;
  }
  timing out = {sorted_median(sorted, g_reps), 0, 0};
  int pick = 0; /* the launch nearest the median: its clock */
  for (int r = 1; r < g_reps; r++)
    if (fabs(ms[r] - out.ms) < fabs(ms[pick] - out.ms)) pick = r;
  out.sm_mhz = mhz[pick];
  out.cycles = cyc[pick];
  CHECK_CUDA(cudaEventDestroy(e0));
  CHECK_CUDA(cudaEventDestroy(e1));
  return out;
}

/* one result: a table line and a JSON record */
static void emit(const char *test, const char *label, double value, const char *unit, const timing *t,
                 const char *extra) {
  printf("%-7s %-44s %12.2f %-16s %8.3f ms %6.0f MHz\n", test, label, value, unit, t->ms, t->sm_mhz);
  if (!g_json) return;
  time_t now = time(NULL);
  char date[32];
  strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
  fprintf(g_json,
          "{\"mode\": \"roofline\", \"test\": \"%s\", \"label\": \"%s\", \"value\": %.4g, \"unit\": \"%s\", "
          "\"ms_median\": %.5f, \"sm_mhz\": %.0f%s%s, \"device\": \"%s\", \"git\": \"%s\", \"date\": \"%s\"}\n",
          test, label, value, unit, t->ms, t->sm_mhz, extra ? ", " : "", extra ? extra : "", g_dev,
          BENCH_GIT_SHA, date);
  fflush(g_json);
}

typedef struct {
  void (*kern)(int, float *, probe *);
  int ctas, threads, iters;
  size_t smem;
} compute_launch;

static void launch_compute(const void *arg) {
  const compute_launch *a = (const compute_launch *)arg;
  a->kern<<<a->ctas, a->threads, a->smem>>>(a->iters, g_sink, g_probe);
}

typedef struct {
  void (*kern)(const char *, int, float *, probe *);
  const char *src;
  int ctas, tiles;
  size_t smem;
} stream_launch;

/* Each launch reads the next bytes of the buffer (wrapping), so a stream smaller than the L2
 * cache still comes from device memory. */
static size_t g_buf, g_off;
static void launch_stream(const void *arg) {
  const stream_launch *a = (const stream_launch *)arg;
  const size_t bytes = (size_t)a->ctas * a->tiles * TILE;
  if (g_off + bytes > g_buf) g_off = 0;
  a->kern<<<a->ctas, STREAM_THREADS, a->smem>>>(a->src + g_off, a->tiles, g_sink, g_probe);
  g_off += bytes;
}

typedef struct {
  void *dst;
  const void *src;
  size_t bytes;
} copy_launch;

static void launch_copy(const void *arg) {
  const copy_launch *a = (const copy_launch *)arg;
  CHECK_CUDA(cudaMemcpyAsync(a->dst, a->src, a->bytes, cudaMemcpyDeviceToDevice, 0));
}

static void set_smem(const void *kern, size_t smem) {
  CHECK_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
}

int main(int argc, char **argv) {
  const char *json = NULL;
  int quick = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json") && i + 1 < argc) {
      json = argv[++i];
    } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
      g_reps = atoi(argv[++i]);
      if (g_reps < 1 || g_reps > MAX_REPS) {
        fprintf(stderr, "bench_roofline: --reps %s: give 1 to %d\n", argv[i], MAX_REPS);
        return 2;
      }
    } else if (!strcmp(argv[i], "--quick")) {
      quick = 1;
    } else {
      fprintf(stderr, "usage: bench_roofline [--json FILE] [--reps N] [--quick]\n");
      return 2;
    }
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("bench_roofline: no CUDA device: skipped\n");
    return 77;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  snprintf(g_dev, sizeof g_dev, "%s", prop.name);
  for (char *c = g_dev; *c; c++)
    if (*c == '"' || *c == '\\') *c = '\'';
  const int nsm = prop.multiProcessorCount;
  if (json && !(g_json = fopen(json, "a"))) {
    fprintf(stderr, "bench_roofline: --json %s: cannot open for appending\n", json);
    return 1;
  }
  printf("# bench_roofline on %s (sm_%d%d, %d SMs), git %s\n", g_dev, prop.major, prop.minor, nsm, BENCH_GIT_SHA);
  CHECK_CUDA(cudaMalloc((void **)&g_probe, sizeof(probe)));
  CHECK_CUDA(cudaMalloc((void **)&g_sink, 1024 * sizeof(float)));
  const int scale = quick ? 1 : 64;
  /* the compute kernels ask for over half an SM's shared memory: one CTA an SM */
  const size_t one_per_sm = prop.sharedMemPerMultiprocessor / 2 + 1024;
  char label[128], extra[256];

  /* mma.sync: warps an SM (one CTA an SM) x chains a warp */
  static const int mma_warps[] = {4, 8, 16};
  void (*mma_k[])(int, float *, probe *) = {k_mma<1>, k_mma<2>, k_mma<4>, k_mma<8>};
  for (int w = 0; w < 3; w++)
    for (int c = 0; c < 4; c++) {
      const int ch = 1 << c, iters = 2048 * scale / ch;
      compute_launch a = {mma_k[c], nsm, 32 * mma_warps[w], iters, one_per_sm};
      set_smem((const void *)mma_k[c], one_per_sm);
      timing t = time_launches(launch_compute, &a);
      const double mmas = (double)iters * ch * mma_warps[w]; /* an SM */
      snprintf(label, sizeof label, "mma.sync bf16, %d warps/SM, %d chains/warp", mma_warps[w], ch);
      snprintf(extra, sizeof extra, "\"warps\": %d, \"chains\": %d, \"tflops\": %.1f, \"cycles_per_mma_warp\": %.2f",
               mma_warps[w], ch, mmas * nsm * 4096.0 / (t.ms * 1e-3) / 1e12, t.cycles / ((double)iters * ch));
      emit("mma", label, mmas * 4096.0 / t.cycles, "FLOP/clk/SM", &t, extra);
    }
  /* one warp, one chain: the latency of a dependent mma */
  {
    compute_launch a = {k_mma<1>, 1, 32, 2048 * scale, one_per_sm};
    timing t = time_launches(launch_compute, &a);
    emit("mma", "mma.sync bf16, one warp, one chain (latency)", t.cycles / (2048.0 * scale), "clk/mma", &t, NULL);
  }

  /* ldmatrix alone and feeding 2 / 4 MMAs a load */
  const size_t tile_smem = one_per_sm; /* the tile: 64 * ROW * 2 bytes of it */
  void (*mix_k[])(int, float *, probe *) = {k_mix<0>, k_mix<2>, k_mix<4>};
  static const int mix_r[] = {0, 2, 4};
  static const int mix_warps[] = {4, 8, 16};
  for (int r = 0; r < 3; r++)
    for (int w = 0; w < 3; w++) {
      const int iters = 64 * scale;
      compute_launch a = {mix_k[r], nsm, 32 * mix_warps[w], iters, tile_smem};
      set_smem((const void *)mix_k[r], tile_smem);
      timing t = time_launches(launch_compute, &a);
      const double loads = (double)iters * 32 * mix_warps[w], mmas = loads * mix_r[r]; /* an SM */
      snprintf(label, sizeof label, "ldmatrix.x4 + %d mma/load, %d warps/SM", mix_r[r], mix_warps[w]);
      snprintf(extra, sizeof extra,
               "\"warps\": %d, \"mma_per_load\": %d, \"flop_per_clk_sm\": %.1f, \"tflops\": %.1f",
               mix_warps[w], mix_r[r], mmas * 4096.0 / t.cycles, mmas * nsm * 4096.0 / (t.ms * 1e-3) / 1e12);
      emit("ldsm", label, loads * 512.0 / t.cycles, "B/clk/SM", &t, extra);
    }

  /* ex2 */
  for (int c = 0; c < 2; c++) {
    const int ch = c ? 8 : 1, iters = 1024 * scale / ch;
    void (*k)(int, float *, probe *) = c ? k_ex2<8> : k_ex2<1>;
    compute_launch a = {k, nsm, 256, iters, one_per_sm};
    set_smem((const void *)k, one_per_sm);
    timing t = time_launches(launch_compute, &a);
    snprintf(label, sizeof label, "ex2.approx.ftz.f32, 8 warps/SM, %d chain%s", ch, ch > 1 ? "s" : "");
    emit("ex2", label, (double)iters * ch * 256 / t.cycles, "ex2/clk/SM", &t, NULL);
  }

  /* streams: a device copy's read rate, then the ring by cp.async / bulk copies */
  size_t free_b = 0, total_b = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
  size_t buf = (size_t)1 << 30;
  while (buf > (size_t)TILE * 4 * nsm && buf * 2 > free_b / 2) buf /= 2;
  if (quick) buf = (size_t)TILE * 8 * nsm;
  char *src = NULL, *dst = NULL;
  CHECK_CUDA(cudaMalloc((void **)&src, buf));
  CHECK_CUDA(cudaMalloc((void **)&dst, buf));
  CHECK_CUDA(cudaMemset(src, 1, buf));
  g_buf = buf;
  double copy_gbps;
  {
    copy_launch a = {dst, src, buf};
    timing t = time_launches(launch_copy, &a);
    copy_gbps = (double)buf / (t.ms * 1e-3) / 1e9;
    snprintf(label, sizeof label, "device copy, %zu MiB (bytes read / time)", buf >> 20);
    emit("stream", label, copy_gbps, "GB/s", &t, NULL);
  }
  const int cta_counts[] = {1, 8, 32, nsm / 2, nsm, 2 * nsm};
  for (int kind = 0; kind < 2; kind++) {
    if (kind == 1 && prop.major < 9) break; /* the bulk engine: sm_90 on */
    for (int st = 2; st <= 4; st += 2)
      for (int ci = 0; ci < 6; ci++) {
        const int ctas = cta_counts[ci];
        /* a CTA's share: the buffer split, at most 16 MiB (one CTA's stream stays short) */
        int tiles = (int)(buf / TILE / (size_t)ctas);
        if (tiles > 512) tiles = 512;
        if (tiles < 2) continue;
        const size_t smem = (size_t)st * TILE;
        void (*k)(const char *, int, float *, probe *) =
            kind == 0 ? (st == 2 ? k_stream<2> : k_stream<4>) : (st == 2 ? k_bulk<2> : k_bulk<4>);
        set_smem((const void *)k, smem);
        stream_launch a = {k, src, ctas, tiles, smem};
        timing t = time_launches(launch_stream, &a);
        const double bytes = (double)ctas * tiles * TILE, gbps = bytes / (t.ms * 1e-3) / 1e9;
        snprintf(label, sizeof label, "%s, %d buffers, %d CTAs", kind ? "bulk copy" : "cp.async", st, ctas);
        snprintf(extra, sizeof extra, "\"kind\": \"%s\", \"stages\": %d, \"ctas\": %d, \"gbps_per_cta\": %.2f, "
                 "\"vs_copy\": %.3f", kind ? "bulk" : "cp.async", st, ctas, gbps / ctas, gbps / copy_gbps);
        emit("stream", label, gbps, "GB/s", &t, extra);
      }
  }
  CHECK_CUDA(cudaFree(src));
  CHECK_CUDA(cudaFree(dst));
  CHECK_CUDA(cudaFree(g_probe));
  CHECK_CUDA(cudaFree(g_sink));
  if (g_json) fclose(g_json);
  return 0;
}
