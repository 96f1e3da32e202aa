/* decode.c — the benchmark's decode section: a few query rows (decode, speculative steps)
 * against a long K/V cache, B = 1, fp32 and bf16 storage. attnrun against the unfused BLAS
 * decode and the time to read K and V once (the memory floor), side by side in one run. */
#include "bench.h"
#include "ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* max |O - ref| / max|ref| on the sampled rows: fp32, and bf16 (O rounded to bf16) */
#define DECODE_TOL 2e-5
#define DECODE_TOL_BF16 (2e-5 + 0x1p-8)

typedef struct {
  attn_ctx_t ctx;
  attn_spec spec;
  int64_t sq, skv, hq, hkv, d;
  float *q, *k, *v, *o, *lse, *s;     /* q, o [1, Sq, Hq, d]; k, v [1, Skv, Hkv, d] */
  int unfused;
  attn_dtype dtype;                    /* ATTN_F32: q..o; ATTN_BF16: q16..o16 */
  uint16_t *q16, *k16, *v16, *o16;     /* bf16 copies, same shapes */
} decode_arg;

static void decode_run(void *p) {
  decode_arg *a = p;
  if (a->unfused) {
    unfused_decode(a->q, a->k, a->v, a->o, a->sq, a->skv, a->hq, a->hkv, a->d, a->s);
    return;
  }
  const int bf = a->dtype == ATTN_BF16;
  const attn_dtype t = a->dtype;
  const attn_device h = ATTN_DEVICE_HOST;
  attn_tensor q = attn_tensor_contig(bf ? (void *)a->q16 : a->q, t, h, 1, a->sq, a->hq, a->d);
  attn_tensor k = attn_tensor_contig(bf ? (void *)a->k16 : a->k, t, h, 1, a->skv, a->hkv, a->d);
  attn_tensor v = attn_tensor_contig(bf ? (void *)a->v16 : a->v, t, h, 1, a->skv, a->hkv, a->d);
  attn_tensor o = attn_tensor_contig(bf ? (void *)a->o16 : a->o, t, h, 1, a->sq, a->hq, a->d);
  attn_status st = attn_fwd(a->ctx, &a->spec, &q, &k, &v, &o, a->lse);
  if (st != ATTN_OK) {
    fprintf(stderr, "bench_cpu: decode attn_fwd: %s: %s\n", attn_status_string(st),
            attn_last_error());
    exit(1);
  }
}

typedef struct {
  const float *x;
  int64_t n;
  float sink; /* keeps the sum alive */
} read_arg;

static void read_run(void *p) {
  read_arg *r = p;
  r->sink += bench_read_sum(r->x, r->n);
}

/* Max |O - ref| / max|ref| over 6 (row, head) pairs, spread from the first to the last
 * row and head. */
static double decode_check(const decode_arg *a) {
  attn_ref_arrays arr = {a->q, a->k, a->v, NULL};
  attn_ref_problem rp;
  attn_ref_problem_arrays(&rp, &a->spec, 1, a->sq, a->skv, &arr);
  double *ref = malloc((size_t)a->d * sizeof(double)), lse, err = 0, mag = 0;
  for (int x = 0; x < 6; x++) {
    int64_t i = (x % 2 ? a->sq - 1 : x * (a->sq - 1) / 5), h = x * (a->hq - 1) / 5;
    attn_ref_fwd_row(&rp, 0, h, i, ref, &lse);
    const float *got = a->o + (i * a->hq + h) * a->d;
    for (int64_t c = 0; c < a->d; c++) {
      double e = fabs((double)got[c] - ref[c]);
      if (isnan(e)) e = INFINITY; /* NaN counts as the worst error */
      if (e > err) err = e;
      if (fabs(ref[c]) > mag) mag = fabs(ref[c]);
    }
  }
  free(ref);
  return err / (mag > 0 ? mag : 1);
}

/* Poisoned O, one checked run, then timing. */
static bench_timing decode_measure(decode_arg *a, double budget_s, int min_reps, double *err) {
  const int64_t n = a->sq * a->hq * a->d;
  const int bf = a->dtype == ATTN_BF16 && !a->unfused;
  memset(a->o, 0xff, (size_t)n * sizeof(float));
  if (bf) memset(a->o16, 0xff, (size_t)n * sizeof(uint16_t));
  decode_run(a);
  for (int64_t i = 0; bf && i < n; i++) a->o[i] = bench_half_value(a->o16[i], ATTN_BF16);
  *err = decode_check(a);
  return bench_time(decode_run, a, budget_s, min_reps);
}

static void *alloc_or_die(size_t bytes) {
  void *p = malloc(bytes);
  if (!p) {
    fprintf(stderr, "bench_cpu: out of memory for the decode runs\n");
    exit(1);
  }
  return p;
}

/* x rounded to bf16 in place, and its bits in x16. */
static void to_bf16(float *x, uint16_t *x16, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    x16[i] = bench_half_bits(x[i], ATTN_BF16);
    x[i] = bench_half_value(x16[i], ATTN_BF16);
  }
}

static void print_header(void) {
  printf("\nDecode, attnrun, B=1, d=128: Sq query rows of Hq heads against Skv keys of Hkv heads "
         "(no mask), inputs rounded to bf16 so both storage\n  dtypes take the same values. "
         "'read': reading the cache's bytes once (a vectorised sum, the memory floor), fp32 "
         "and bf16;\n  per dtype: ms, GB/s of K+V, x read (read time / ours); GFLOP/s of fp32 "
         "(4·Sq·Skv·Hq·d: many rows make it compute-bound); '/unfused': its time (fp32) / "
         "ours (fp32).\n");
  printf("%3s %3s %3s %6s | %8s %7s %6s %7s %-9s| %8s %7s %6s %-9s| %8s %-9s| %7s %7s | %8s\n",
         "Hq", "Hkv", "Sq", "Skv", "f32 ms", "GB/s", "x read", "GFLOP/s", "err", "bf16 ms",
         "GB/s", "x read", "err", "unf. ms", "err", "read ms", "GB/s", "/unfused");
}

int bench_decode(attn_ctx_t ctx, int64_t skv, int threads, double budget_s, int min_reps,
                 FILE *json, const char *git) {
  static const int64_t heads[][2] = {{32, 8}, {8, 1}, {32, 32}}, sqs[] = {1, 4, 16};
  const int64_t d = 128, max_hq = 32, max_sq = 16;
  const int64_t kv_n = skv * max_hq * d, q_n = max_sq * max_hq * d;
  int failed = 0;
  float *k = alloc_or_die((size_t)kv_n * sizeof(float));
  float *v = alloc_or_die((size_t)kv_n * sizeof(float));
  float *q = alloc_or_die((size_t)q_n * sizeof(float));
  float *o = alloc_or_die((size_t)q_n * sizeof(float));
  float *lse = alloc_or_die((size_t)(max_sq * max_hq) * sizeof(float));
  float *s = alloc_or_die((size_t)(max_sq * max_hq * (skv + d)) * sizeof(float));
  uint16_t *k16 = alloc_or_die((size_t)kv_n * 2), *v16 = alloc_or_die((size_t)kv_n * 2);
  uint16_t *q16 = alloc_or_die((size_t)q_n * 2), *o16 = alloc_or_die((size_t)q_n * 2);
  bench_fill(q, q_n, 11, 1.7320508f);
  bench_fill(k, kv_n, 12, 1.7320508f);
  bench_fill(v, kv_n, 13, 1.7320508f);
  to_bf16(q, q16, q_n);
  to_bf16(k, k16, kv_n);
  to_bf16(v, v16, kv_n);
  print_header();
  for (size_t c = 0; c < sizeof heads / sizeof heads[0]; c++) {
    const int64_t hq = heads[c][0], hkv = heads[c][1], kv_floats = skv * hkv * d;
    read_arg rk = {k, kv_floats, 0}, rv = {v, kv_floats, 0};
    bench_timing tk = bench_time(read_run, &rk, budget_s, min_reps);
    bench_timing tv = bench_time(read_run, &rv, budget_s, min_reps);
    const double read_s = tk.med + tv.med, bytes = 2.0 * (double)kv_floats * sizeof(float);
    const double read_bf16_s = tk.med; /* bf16 K + V: as many bytes as fp32 K */
    for (size_t x = 0; x < sizeof sqs / sizeof sqs[0]; x++) {
      decode_arg a = {ctx, ATTN_SPEC_INIT, sqs[x], skv, hq, hkv, d, q, k, v, o, lse, s, 0,
                      ATTN_F32, q16, k16, v16, o16};
      a.spec.num_heads_q = (int32_t)hq;
      a.spec.num_heads_kv = (int32_t)hkv;
      a.spec.head_dim_qk = a.spec.head_dim_v = (int32_t)d;
      double err_ours, err_bf, err_unf;
      bench_timing ours = decode_measure(&a, budget_s, min_reps, &err_ours);
      a.dtype = ATTN_BF16;
      bench_timing bf = decode_measure(&a, budget_s, min_reps, &err_bf);
      a.dtype = ATTN_F32, a.unfused = 1;
      bench_timing unf = decode_measure(&a, budget_s, min_reps, &err_unf);
      int bad = !(err_ours <= DECODE_TOL), bad_bf = !(err_bf <= DECODE_TOL_BF16);
      int bad_unf = !(err_unf <= DECODE_TOL);
      failed |= bad | bad_bf;
      const double gflop = attn_flops_fwd(&a.spec, 1, a.sq, skv) * 1e-9;
      printf("%3lld %3lld %3lld %6lld | %8.2f %7.1f %6.2f %7.1f %8.1e%s| %8.2f %7.1f %6.2f %8.1e%s| %8.2f %8.1e%s| %7.2f %7.1f | %8.2f\n",
             (long long)hq, (long long)hkv, (long long)a.sq, (long long)skv, ours.med * 1e3,
             bytes / ours.med * 1e-9, read_s / ours.med, gflop / ours.med, err_ours, bad ? "!" : " ",
             bf.med * 1e3, bytes / 2 / bf.med * 1e-9, read_bf16_s / bf.med, err_bf, bad_bf ? "!" : " ",
             unf.med * 1e3, err_unf, bad_unf ? "!" : " ", read_s * 1e3, bytes / read_s * 1e-9,
             unf.med / ours.med);
      if (json)
        fprintf(json,
                "{\"kind\":\"decode\",\"seq_q\":%lld,\"seq_kv\":%lld,\"heads_q\":%lld,"
                "\"heads_kv\":%lld,\"head_dim\":%lld,\"threads\":%d,\"reps\":%d,"
                "\"time_med_s\":%.6g,\"time_min_s\":%.6g,\"kv_gbps\":%.3f,\"gflops\":%.2f,"
                "\"read_time_s\":%.6g,\"ratio_read\":%.4f,\"unfused_time_s\":%.6g,"
                "\"ratio_unfused\":%.4f,\"max_rel_err\":%.3g,\"unfused_err\":%.3g,"
                "\"bf16_time_med_s\":%.6g,\"bf16_read_time_s\":%.6g,\"bf16_ratio_read\":%.4f,"
                "\"bf16_max_rel_err\":%.3g,\"git\":\"%s\"}\n",
                (long long)a.sq, (long long)skv, (long long)hq, (long long)hkv, (long long)d,
                threads, ours.reps, ours.med, ours.min, bytes / ours.med * 1e-9, gflop / ours.med, read_s,
                read_s / ours.med, unf.med, unf.med / ours.med, err_ours, err_unf, bf.med, read_bf16_s,
                read_bf16_s / bf.med, err_bf, git);
    }
    fflush(stdout);
  }
  free(k), free(v), free(q), free(o), free(lse), free(s);
  free(k16), free(v16), free(q16), free(o16);
  return failed;
}
