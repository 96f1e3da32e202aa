/* bench_cpu.c — the CPU benchmark: attnrun forward/backward against the machine's fast
 * SGEMM and a BLAS-based unfused attention, in one process at one thread count, plus the
 * peak RSS of a long forward (child process). `bench_cpu --help` lists the options. */
#define _GNU_SOURCE
#include "attnrun.h"
#include "bench.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef BENCH_HAVE_OPENBLAS
#define BENCH_HAVE_OPENBLAS 0
#endif
#if BENCH_HAVE_OPENBLAS
char *openblas_get_corename(void);
void openblas_set_num_threads(int num_threads);
#endif
#ifndef BENCH_GIT_SHA
#define BENCH_GIT_SHA "unknown"
#endif

#define MAX_LIST 8
typedef struct {
  int threads, heads, heads_large, min_reps, quick;
  double budget_s, mem_gib;
  int64_t seqs[MAX_LIST], dims[MAX_LIST], causals[MAX_LIST];
  int nseq, ndim, ncausal;
  int64_t rss_seq, dtype_seq, decode_kv;
  const char *json;
} options;

static FILE *g_json;
static const char *g_core = "unknown";
static char g_coretype[64]; /* OPENBLAS_CORETYPE as OpenBLAS saw it at load */
static int g_failed; /* a validation failed: exit status 1 */

static void die(const char *what) {
  fprintf(stderr, "bench_cpu: %s\n", what);
  exit(1);
}

static float *alloc_f32(int64_t count) {
  void *ptr = NULL;
  if (posix_memalign(&ptr, 64, (size_t)(count > 0 ? count : 1) * sizeof(float))) return NULL;
  return ptr;
}

static void poison(float *x, int64_t count) { memset(x, 0xff, (size_t)count * sizeof(float)); }


/* "4K", "1M" or the plain number; buf holds 24 chars. */
static const char *fmt_size(int64_t n, char *buf) {
  if (n >= 1024 * 1024 && n % (1024 * 1024) == 0) snprintf(buf, 24, "%lldM", (long long)(n >> 20));
  else if (n >= 1024 && n % 1024 == 0) snprintf(buf, 24, "%lldK", (long long)(n >> 10));
  else snprintf(buf, 24, "%lld", (long long)n);
  return buf;
}

/* ---- options ----------------------------------------------------------------------- */
static int64_t parse_size(const char *s) {
  char *end;
  long long v = strtoll(s, &end, 10);
  if (*end == 'K' || *end == 'k') v <<= 10, end++;
  else if (*end == 'M' || *end == 'm') v <<= 20, end++;
  if (end == s || *end != '\0' || v < 0) {
    fprintf(stderr, "bench_cpu: bad size '%s' (e.g. 4096, 4K, 1M)\n", s);
    exit(2);
  }
  return v;
}

static int parse_list(const char *s, int64_t *out) {
  char buf[256];
  int n = 0;
  snprintf(buf, sizeof buf, "%s", s);
  for (char *tok = strtok(buf, ","); tok && n < MAX_LIST; tok = strtok(NULL, ","))
    out[n++] = parse_size(tok);
  return n;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench_cpu [options]\n"
          "  --threads T      threads for attnrun, OpenMP and OpenBLAS (default 2)\n"
          "  --seq LIST       sequence lengths (default 1K,4K,16K)\n"
          "  --dims LIST      head dims (default 64,128)\n"
          "  --causal LIST    0,1 (default both)\n"
          "  --heads H        heads up to N = 4K (default 8)\n"
          "  --heads-large H  heads for N > 4K (default 2)\n"
          "  --reps R         at least R timed reps (default 3); more while under --budget\n"
          "  --budget S       seconds of timed reps per measurement (default 1.5)\n"
          "  --mem-gib G      memory for the unfused N×N scores (default 4)\n"
          "  --rss-seq N      peak-RSS forward at N (default 64K; 0: skip)\n"
          "  --dtype-seq N    float32 / bf16 / f16 storage side by side at N (default 4K;\n"
          "                   0: skip), over --dims and --causal\n"
          "  --decode-kv N    decode: 1, 4, 16 query rows against N keys (default 32K; 0:\n"
          "                   skip), GQA 32/8, MQA 8/1 and MHA 32/32, d = 128\n"
          "  --quick          a smoke run: N = 1K (unless --seq), RSS at 16K\n"
          "  --json FILE      also append JSON lines to FILE\n");
}

static options parse_args(int argc, char **argv) {
  options o = {2, 8, 2, 3, 0, 1.5, 4.0, {1024, 4096, 16384}, {64, 128}, {0, 1},
               3, 2, 2, 65536, 4096, 32768, NULL};
  int seq_given = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int used = 1;
    if (!strcmp(a, "--quick")) o.quick = 1, used = 0;
    else if (!strcmp(a, "--help") || !strcmp(a, "-h")) usage(stdout), exit(0);
    else if (!v) used = -1;
    else if (!strcmp(a, "--threads")) o.threads = (int)parse_size(v);
    else if (!strcmp(a, "--seq")) o.nseq = parse_list(v, o.seqs), seq_given = 1;
    else if (!strcmp(a, "--dims")) o.ndim = parse_list(v, o.dims);
    else if (!strcmp(a, "--causal")) o.ncausal = parse_list(v, o.causals);
    else if (!strcmp(a, "--heads")) o.heads = (int)parse_size(v);
    else if (!strcmp(a, "--heads-large")) o.heads_large = (int)parse_size(v);
    else if (!strcmp(a, "--reps")) o.min_reps = (int)parse_size(v);
    else if (!strcmp(a, "--budget")) o.budget_s = atof(v);
    else if (!strcmp(a, "--mem-gib")) o.mem_gib = atof(v);
    else if (!strcmp(a, "--rss-seq")) o.rss_seq = parse_size(v);
    else if (!strcmp(a, "--dtype-seq")) o.dtype_seq = parse_size(v);
    else if (!strcmp(a, "--decode-kv")) o.decode_kv = parse_size(v);
    else if (!strcmp(a, "--json")) o.json = v;
    else used = -1;
    if (used < 0) {
      fprintf(stderr, "bench_cpu: bad or incomplete option '%s'\n", a);
      usage(stderr);
      exit(2);
    }
    i += used;
  }
  if (o.quick) {
    if (!seq_given) o.nseq = 1, o.seqs[0] = 1024;
    if (o.rss_seq > 16384) o.rss_seq = 16384;
    if (o.dtype_seq > 1024) o.dtype_seq = 1024;
    if (o.decode_kv > 4096) o.decode_kv = 4096;
  }
  if (o.threads < 1 || o.heads < 1 || o.heads_large < 1 || o.min_reps < 1 ||
      o.min_reps > BENCH_MAX_REPS || !o.nseq || !o.ndim || !o.ncausal) {
    fprintf(stderr, "bench_cpu: threads, heads and every list must be positive, reps 1..%d\n",
            BENCH_MAX_REPS);
    exit(2);
  }
  return o;
}

/* ---- environment: thread counts and OpenBLAS's kernel, fixed before we start ---------- */
/* Debian's OpenBLAS 0.3.21 picks its SSE3 "Prescott" kernel on AVX-512 CPUs it does not
 * know, ~5x slower; OPENBLAS_CORETYPE is read only at load, so we set it and re-exec. */
static int blas_core_is_slow(void) {
#if BENCH_HAVE_OPENBLAS && defined(__x86_64__)
  static const char *fast[] = {"skylakex", "cooperlake", "sapphirerapids"};
  if (!__builtin_cpu_supports("avx512f")) return 0;
  for (size_t i = 0; i < sizeof fast / sizeof fast[0]; i++)
    if (!strcasecmp(g_core, fast[i])) return 0;
  return 1;
#else
  return 0;
#endif
}

static int set_env(const char *name, const char *value) {
  const char *cur = getenv(name);
  if (cur && !strcmp(cur, value)) return 0;
  setenv(name, value, 1);
  return 1;
}

static void fix_env(char **argv, int threads) {
  const char *ct = getenv("OPENBLAS_CORETYPE"), *again = getenv("ATTN_BENCH_REEXEC");
  snprintf(g_coretype, sizeof g_coretype, "%s%s", ct ? ct : "unset",
           again && !strcmp(again, "coretype") ? ", set by bench_cpu" : "");
#if BENCH_HAVE_OPENBLAS
  g_core = openblas_get_corename();
#endif
  char t[16];
  snprintf(t, sizeof t, "%d", threads);
  int threads_changed = set_env("OMP_NUM_THREADS", t) | set_env("OPENBLAS_NUM_THREADS", t);
  /* OpenMP threads that spin after a parallel region steal the cores from OpenBLAS's own
   * pthreads: the unfused baseline, which alternates the two, ran 2-4x slower. */
  if (!getenv("OMP_WAIT_POLICY")) threads_changed |= set_env("OMP_WAIT_POLICY", "passive");
  int core_changed = blas_core_is_slow() && set_env("OPENBLAS_CORETYPE", "SkylakeX");
  if ((threads_changed || core_changed) && !again) {
    /* The marker guards against a loop and says what we changed. */
    setenv("ATTN_BENCH_REEXEC", core_changed ? "coretype" : "threads", 1);
    execv("/proc/self/exe", argv);
    perror("bench_cpu: re-exec with the fixed environment failed; continuing");
  }
  if (blas_core_is_slow())
    fprintf(stderr,
            "bench_cpu: WARNING: OpenBLAS runs its '%s' kernel on this AVX-512 CPU; SGEMM "
            "and the unfused baseline are slow (OPENBLAS_CORETYPE=%s)\n",
            g_core, g_coretype);
#if BENCH_HAVE_OPENBLAS
  openblas_set_num_threads(threads);
#endif
  omp_set_num_threads(threads);
}

/* ---- SGEMM --------------------------------------------------------------------------- */
typedef struct {
  int m, n, k, trans_b;
  float *a, *b, *c; /* a [m,k]; b [k,n] or, trans_b, [n,k]; c [m,n] */
} sgemm_arg;

static void sgemm_run(void *p) {
  sgemm_arg *g = p;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, g->trans_b ? CblasTrans : CblasNoTrans, g->m, g->n,
              g->k, 1.0f, g->a, g->k, g->b, g->trans_b ? g->k : g->n, 0.0f, g->c, g->n);
}

/* Max |c - ref| / sum|a*b| over a few elements (ref in double). */
static double sgemm_check(const sgemm_arg *g) {
  double worst = 0;
  for (int e = 0; e < 5; e++) {
    int64_t i = (int64_t)e * (g->m - 1) / 4, j = (int64_t)(4 - e) * (g->n - 1) / 4;
    double ref = 0, mag = 0;
    for (int64_t x = 0; x < g->k; x++) {
      double bv = g->trans_b ? g->b[j * g->k + x] : g->b[x * g->n + j];
      ref += (double)g->a[i * g->k + x] * bv;
      mag += fabs((double)g->a[i * g->k + x] * bv);
    }
    double err = fabs(g->c[i * g->n + j] - ref) / (mag > 0 ? mag : 1);
    if (isnan(err)) err = INFINITY;
    if (err > worst) worst = err;
  }
  return worst;
}

/* Returns the median GFLOP/s of C[m,n] = A[m,k] · B (Bᵀ when trans_b); prints a table
 * row and a JSON line unless label is NULL. */
static double bench_sgemm(const char *label, const char *phase, int m, int n, int k,
                          int trans_b, const options *o) {
  sgemm_arg g = {m, n, k, trans_b, alloc_f32((int64_t)m * k), alloc_f32((int64_t)k * n),
                 alloc_f32((int64_t)m * n)};
  if (!g.a || !g.b || !g.c) die("out of memory for SGEMM");
  bench_fill(g.a, (int64_t)m * k, 101, 1.0f);
  bench_fill(g.b, (int64_t)k * n, 102, 1.0f);
  poison(g.c, (int64_t)m * n);
  sgemm_run(&g);
  double err = sgemm_check(&g);
  int bad = !(err <= 1e-5);
  g_failed |= bad;
  bench_timing t = bench_time(sgemm_run, &g, o->budget_s, o->min_reps);
  double flops = 2.0 * m * n * k, gf = flops / t.med * 1e-9;
  if (label)
    printf("  %-24s %5d %5d %5d %9.2f %9.2f %9.1f %9.1f %8.1e%s\n", label, m, n, k, t.med * 1e3,
         t.min * 1e3, gf, flops / t.min * 1e-9, err, bad ? " FAIL" : "");
  if (label && g_json)
    fprintf(g_json,
            "{\"kind\":\"sgemm\",\"phase\":\"%s\",\"m\":%d,\"n\":%d,\"k\":%d,\"trans_b\":%d,\"threads\":%d,"
            "\"blas_core\":\"%s\",\"reps\":%d,\"time_med_s\":%.6g,\"time_min_s\":%.6g,"
            "\"gflops\":%.2f,\"gflops_max\":%.2f,\"max_rel_err\":%.3g}\n",
            phase, m, n, k, trans_b, o->threads, g_core, t.reps, t.med, t.min, gf,
            flops / t.min * 1e-9, err);
  free(g.a), free(g.b), free(g.c);
  return gf;
}

/* ---- attention: attnrun and the unfused baseline ---------------------------------------- */
enum { IMPL_OURS, IMPL_UNFUSED };
enum { DIR_FWD, DIR_BWD };
#define UNIT_AMP 1.7320508f /* sqrt(3) */
static const double TOL[2] = {2e-5, 2e-4}; /* fwd, bwd: max error / max|ref| */

typedef struct {
  attn_ctx_t ctx;
  attn_spec spec;
  bench_problem *p;
  int impl, dir;
  float *s, *ds; /* unfused scratch, [n, n] each */
  attn_stats stats;
  attn_dtype dtype; /* of q, k, v, dout, o; not F32: they are lp[] */
  uint16_t *lp[5];  /* q, k, v, dout, o [1, n, h, d] in dtype (bf16 / f16 bits) */
} attn_arg;

typedef struct {
  bench_timing t;
  double err, gflops, gflops_computed;
  int with_k;
} result;

static void attn_run(void *arg) {
  attn_arg *a = arg;
  bench_problem *p = a->p;
  if (a->impl == IMPL_UNFUSED) {
    if (a->dir == DIR_FWD) unfused_fwd(p, a->s);
    else unfused_bwd(p, a->s, a->ds);
    return;
  }
  void *in[5] = {p->q, p->k, p->v, p->dout, p->o};
  attn_tensor t[5]; /* q, k, v, dout, o */
  for (int i = 0; i < 5; i++)
    t[i] = attn_tensor_contig(a->dtype == ATTN_F32 ? in[i] : (void *)a->lp[i], a->dtype,
                              ATTN_DEVICE_HOST, 1, p->n, p->h, p->d);
  attn_tensor q = t[0], k = t[1], v = t[2], g = t[3], o = t[4];
  attn_tensor dq = attn_tensor_f32(p->dq, 1, p->n, p->h, p->d);
  attn_tensor dk = attn_tensor_f32(p->dk, 1, p->n, p->h, p->d);
  attn_tensor dv = attn_tensor_f32(p->dv, 1, p->n, p->h, p->d);
  attn_status st = a->dir == DIR_FWD
                       ? attn_fwd(a->ctx, &a->spec, &q, &k, &v, &o, p->lse)
                       : attn_bwd(a->ctx, &a->spec, &q, &k, &v, &o, p->lse, &g, &dq, &dk, &dv,
                                  NULL);
  if (st != ATTN_OK) {
    fprintf(stderr, "bench_cpu: attn_%s: %s: %s\n", a->dir == DIR_FWD ? "fwd" : "bwd",
            attn_status_string(st), attn_last_error());
    exit(1);
  }
  attn_ctx_last_stats(a->ctx, &a->stats);
}

/* Poisoned outputs, one validated run, then timing. */
static result measure(attn_arg *a, double flops, double flops_computed, const options *o) {
  bench_problem *p = a->p;
  int64_t count = p->n * p->h * p->d;
  result r = {{0, 0, 0}, 0, 0, 0, 0};
  if (a->dir == DIR_FWD) poison(p->o, count), poison(p->lse, p->h * p->n);
  else poison(p->dq, count), poison(p->dk, count), poison(p->dv, count);
  if (a->dtype != ATTN_F32 && a->dir == DIR_FWD) memset(a->lp[4], 0xff, (size_t)count * 2);
  attn_run(a);
  if (a->dtype != ATTN_F32 && a->dir == DIR_FWD) /* O as float32 for the check */
    for (int64_t i = 0; i < count; i++) p->o[i] = bench_half_value(a->lp[4][i], a->dtype);
  r.err = a->dir == DIR_FWD ? bench_check_fwd(p) : bench_check_bwd(p, &r.with_k);
  r.t = bench_time(attn_run, a, o->budget_s, o->min_reps);
  if (a->impl == IMPL_OURS) flops_computed = a->stats.flops_computed;
  r.gflops = flops / r.t.med * 1e-9;
  r.gflops_computed = flops_computed / r.t.med * 1e-9;
  return r;
}

/* The targets, as a fraction of SGEMM(4096x4096x128); 0: none. */
static double target_of(int dir, int64_t n, int64_t d, int causal) {
  if (n < 4096) return 0;
  if (dir == DIR_FWD) return d == 128 ? (causal ? 0.60 : 0.70) : d == 64 ? 0.55 : 0;
  return d == 128 ? 0.45 : 0;
}

static void json_attn(const char *impl, int dir, const bench_problem *p, const options *o,
                      const result *r, double flops, double sgemm_gf, double ratio_unf) {
  if (!g_json) return;
  fprintf(g_json,
          "{\"kind\":\"attn\",\"impl\":\"%s\",\"dir\":\"%s\",\"batch\":1,\"seq\":%lld,"
          "\"heads\":%lld,\"head_dim\":%lld,\"causal\":%d,\"threads\":%d,\"reps\":%d,"
          "\"flops\":%.6g,\"time_med_s\":%.6g,\"time_min_s\":%.6g,\"gflops\":%.2f,"
          "\"gflops_computed\":%.2f,\"max_rel_err\":%.3g,\"checked_dk_dv\":%d,"
          "\"sgemm_ref_gflops\":%.2f,\"ratio_sgemm\":%.4f,\"ratio_unfused\":%.4f,"
          "\"git\":\"%s\"}\n",
          impl, dir == DIR_FWD ? "fwd" : "bwd", (long long)p->n, (long long)p->h,
          (long long)p->d, p->causal, o->threads, r->t.reps, flops, r->t.med, r->t.min,
          r->gflops, r->gflops_computed, r->err, r->with_k, sgemm_gf, r->gflops / sgemm_gf,
          ratio_unf, BENCH_GIT_SHA);
}

static void print_row(int dir, const bench_problem *p, const result *ours, const result *unf,
                      double unf_need, double sgemm_gf, int *misses) {
  char nb[24], ub[64], tb[48] = "";
  int bad = !(ours->err <= TOL[dir]);
  double r_sgemm = ours->gflops / sgemm_gf, r_unf = unf ? unf->t.med / ours->t.med : 0;
  if (unf)
    snprintf(ub, sizeof ub, "%9.2f %8.1f %8.1e%s", unf->t.med * 1e3, unf->gflops, unf->err,
             unf->err <= TOL[dir] ? " " : "!");
  else
    snprintf(ub, sizeof ub, "n/a (needs %.1f GiB)", unf_need / (1 << 30)); /* > --mem-gib */
  double tgt = target_of(dir, p->n, p->d, p->causal);
  if (tgt > 0) {
    int miss = r_sgemm < tgt;
    snprintf(tb, sizeof tb, ">=%.2f %s", tgt, miss ? "MISS" : "ok");
    *misses += miss;
  }
  if (unf && r_unf < 1) strcat(tb, " slower-than-unfused"), ++*misses;
  printf("%5s %2lld %4lld %-3s %-3s| %9.2f %9.2f %8.1f %8.1f %8.1e%s| %-28s| %6.1f %6.2f ",
         fmt_size(p->n, nb), (long long)p->h, (long long)p->d, p->causal ? "yes" : "no",
         dir == DIR_FWD ? "fwd" : "bwd", ours->t.med * 1e3, ours->t.min * 1e3, ours->gflops,
         ours->gflops_computed, ours->err, bad ? "!" : " ", ub, sgemm_gf, r_sgemm);
  if (unf) printf("%8.2f  %s\n", r_unf, tb);
  else printf("%8s  %s\n", "-", tb);
  g_failed |= bad;
}

static void bench_config(attn_ctx_t ctx, int64_t n, int64_t d, int causal, const options *o,
                         int *misses) {
  int64_t h = n > 4096 ? o->heads_large : o->heads, count = n * h * d;
  bench_problem p = {n, h, d, causal, alloc_f32(count), alloc_f32(count), alloc_f32(count),
                     alloc_f32(count), alloc_f32(count), alloc_f32(count), alloc_f32(count),
                     alloc_f32(count), alloc_f32(h * n)};
  if (!p.q || !p.k || !p.v || !p.dout || !p.o || !p.dq || !p.dk || !p.dv || !p.lse)
    die("out of memory for the attention inputs");
  bench_fill(p.q, count, 1, UNIT_AMP);
  bench_fill(p.k, count, 2, UNIT_AMP);
  bench_fill(p.v, count, 3, UNIT_AMP);
  bench_fill(p.dout, count, 4, UNIT_AMP);
  attn_arg a = {ctx, ATTN_SPEC_INIT, &p, IMPL_OURS, DIR_FWD, NULL, NULL, {0, 0, 0}, ATTN_F32,
                {NULL}};
  a.spec.num_heads_q = a.spec.num_heads_kv = (int32_t)h;
  a.spec.head_dim_qk = a.spec.head_dim_v = (int32_t)d;
  a.spec.causal = causal;
  const double flops[2] = {attn_flops_fwd(&a.spec, 1, n, n),
                           2.5 * attn_flops_fwd(&a.spec, 1, n, n)};
  const double unf_flops[2] = {4.0 * h * n * n * d, 10.0 * h * n * n * d}; /* full N×N */
  const double need[2] = {4.0 * n * n, 8.0 * n * n}, budget = o->mem_gib * (1 << 30);
  /* The reference for the ratios, measured next to this config (the machine may be shared). */
  const double sgemm_gf = bench_sgemm(NULL, NULL, 4096, 4096, 128, 1, o);

  result ours[2], unf[2];
  for (int dir = DIR_FWD; dir <= DIR_BWD; dir++) {
    a.dir = dir;
    ours[dir] = measure(&a, flops[dir], 0, o);
  }
  a.impl = IMPL_UNFUSED;
  a.s = need[DIR_FWD] <= budget ? alloc_f32(n * n) : NULL;
  a.ds = a.s && need[DIR_BWD] <= budget ? alloc_f32(n * n) : NULL;
  for (int dir = DIR_FWD; dir <= DIR_BWD; dir++) {
    int fits = dir == DIR_FWD ? a.s != NULL : a.ds != NULL;
    a.dir = dir;
    if (fits) unf[dir] = measure(&a, flops[dir], unf_flops[dir], o);
    double r_unf = fits ? unf[dir].t.med / ours[dir].t.med : 0;
    print_row(dir, &p, &ours[dir], fits ? &unf[dir] : NULL, need[dir], sgemm_gf, misses);
    json_attn("attnrun", dir, &p, o, &ours[dir], flops[dir], sgemm_gf, r_unf);
    if (fits) json_attn("unfused", dir, &p, o, &unf[dir], flops[dir], sgemm_gf, 1);
  }
  fflush(stdout);
  free(a.s), free(a.ds);
  free(p.q), free(p.k), free(p.v), free(p.dout), free(p.o), free(p.dq), free(p.dk), free(p.dv);
  free(p.lse);
}

/* ---- storage dtypes: one problem in float32, bf16 and f16 -------------------------------- */
/* Inputs rounded to bf16 first, so all runs take the same values (bf16 values are f16
 * values too, but for the few below f16's normal range, |x| < 6e-5, which lose bits under
 * 2^-25). err: O against the float64 oracle, within its rounding on output. f32, bf16 and
 * f16 run on ctx (float32 arithmetic: the bf16 tiles off); the last two columns are bf16
 * on the bf16 tile products, AMX (units[0]) and AVX512-BF16 (units[1]; NULL: not on this
 * CPU), whose P (and dS) are rounded to bf16 as well. */
enum { DT_AMX = 3, DT_DP = 4, DT_COLS = 5 };
static void bench_dtypes(attn_ctx_t ctx, attn_ctx_t units[2], int64_t n, int64_t d, int causal,
                         const options *o) {
  static const double tol[DT_COLS][2] = {{2e-5, 2e-4},
                                         {2e-5 + 0x1p-8, 4e-2},
                                         {2e-5 + 0x1p-11, 8e-3},
                                         {2e-5 + 0x1p-7, 4e-2},
                                         {2e-5 + 0x1p-7, 4e-2}};
  int64_t h = o->heads, count = n * h * d;
  bench_problem p = {n, h, d, causal, alloc_f32(count), alloc_f32(count), alloc_f32(count),
                     alloc_f32(count), alloc_f32(count), alloc_f32(count), alloc_f32(count),
                     alloc_f32(count), alloc_f32(h * n)};
  attn_arg a = {ctx, ATTN_SPEC_INIT, &p, IMPL_OURS, DIR_FWD, NULL, NULL, {0, 0, 0}, ATTN_F32,
                {NULL}};
  for (int i = 0; i < 5; i++) a.lp[i] = malloc((size_t)count * 2);
  if (!p.q || !p.k || !p.v || !p.dout || !p.o || !p.dq || !p.dk || !p.dv || !p.lse || !a.lp[0] ||
      !a.lp[1] || !a.lp[2] || !a.lp[3] || !a.lp[4])
    die("out of memory for the dtype runs");
  float *in[4] = {p.q, p.k, p.v, p.dout};
  for (int i = 0; i < 4; i++) {
    bench_fill(in[i], count, (uint64_t)i + 1, UNIT_AMP);
    for (int64_t x = 0; x < count; x++) in[i][x] = bench_half_value(bench_half_bits(in[i][x], ATTN_BF16), ATTN_BF16);
  }
  a.spec.num_heads_q = a.spec.num_heads_kv = (int32_t)h;
  a.spec.head_dim_qk = a.spec.head_dim_v = (int32_t)d;
  a.spec.causal = causal;
  const double flops[2] = {attn_flops_fwd(&a.spec, 1, n, n), 2.5 * attn_flops_fwd(&a.spec, 1, n, n)};
  static const char *names[DT_COLS] = {"f32", "bf16", "f16", "bf16-amx", "bf16-dp"};
  result r[DT_COLS][2];
  for (int dt = ATTN_F32; dt < DT_COLS; dt++) {
    if (dt >= DT_AMX && !units[dt - DT_AMX]) continue;
    a.ctx = dt >= DT_AMX ? units[dt - DT_AMX] : ctx;
    a.dtype = dt >= DT_AMX ? ATTN_BF16 : (attn_dtype)dt;
    for (int i = 0; i < 4 && dt != ATTN_F32; i++)
      for (int64_t x = 0; x < count; x++) a.lp[i][x] = bench_half_bits(in[i][x], a.dtype);
    for (int dir = DIR_FWD; dir <= DIR_BWD; dir++) {
      a.dir = dir;
      r[dt][dir] = measure(&a, flops[dir], 0, o);
    }
  }
  char nb[24];
  for (int dir = DIR_FWD; dir <= DIR_BWD; dir++) {
    printf("%5s %2lld %4lld %-3s %-3s|", fmt_size(n, nb), (long long)h, (long long)d,
           causal ? "yes" : "no", dir == DIR_FWD ? "fwd" : "bwd");
    for (int dt = ATTN_F32; dt < DT_COLS; dt++) {
      if (dt >= DT_AMX && !units[dt - DT_AMX]) continue;
      const result *x = &r[dt][dir];
      int bad = !(x->err <= tol[dt][dir]);
      g_failed |= bad;
      printf(" %9.2f %8.1f %6.2f %8.1e%s|", x->t.med * 1e3, x->gflops,
             r[ATTN_F32][dir].t.med / x->t.med, x->err, bad ? "!" : " ");
      if (g_json)
        fprintf(g_json,
                "{\"kind\":\"dtype\",\"dtype\":\"%s\",\"dir\":\"%s\",\"seq\":%lld,"
                "\"heads\":%lld,\"head_dim\":%lld,\"causal\":%d,\"threads\":%d,"
                "\"reps\":%d,\"time_med_s\":%.6g,\"gflops\":%.2f,\"speed_vs_f32\":%.4f,"
                "\"max_rel_err\":%.3g,\"git\":\"%s\"}\n",
                names[dt], dir == DIR_FWD ? "fwd" : "bwd", (long long)n, (long long)h,
                (long long)d, causal, o->threads, x->t.reps, x->t.med, x->gflops,
                r[ATTN_F32][dir].t.med / x->t.med, x->err, BENCH_GIT_SHA);
    }
    printf("\n");
  }
  fflush(stdout);
  for (int i = 0; i < 5; i++) free(a.lp[i]);
  free(p.q), free(p.k), free(p.v), free(p.dout), free(p.o), free(p.dq), free(p.dk), free(p.dv);
  free(p.lse);
}

/* ---- peak RSS of a long forward, in a child process ------------------------------------- */
static int64_t vm_hwm_bytes(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long long kb = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmHWM: %lld kB", &kb) == 1) break;
  if (f) fclose(f);
  return kb < 0 ? -1 : kb * 1024;
}

/* cpu_amx: cfg.cpu_amx (1: AMX, 2: AVX512-BF16 required, then NULL without it). */
static attn_ctx_t make_ctx_amx(int threads, int cpu_amx) {
  attn_ctx_config cfg = ATTN_CTX_CONFIG_INIT;
  cfg.backend = ATTN_BACKEND_CPU;
  cfg.num_threads = threads;
  cfg.cpu_amx = cpu_amx;
  attn_ctx_t ctx = NULL;
  attn_status st = attn_ctx_create(&ctx, &cfg);
  if (st == ATTN_ERR_UNSUPPORTED && cpu_amx >= 1) return NULL;
  if (st != ATTN_OK) {
    fprintf(stderr, "bench_cpu: attn_ctx_create: %s\n", attn_last_error());
    exit(1);
  }
  return ctx;
}

static attn_ctx_t make_ctx(int threads) { return make_ctx_amx(threads, 0); }

/* argv: N H D CAUSAL THREADS. Prints "RSS peak base time err flops_computed". */
static int rss_child_main(char **argv) {
  int64_t base = vm_hwm_bytes();
  int64_t n = parse_size(argv[0]), h = parse_size(argv[1]), d = parse_size(argv[2]);
  int causal = atoi(argv[3]), threads = atoi(argv[4]);
  attn_ctx_t ctx = make_ctx(threads);
  int64_t count = n * h * d;
  bench_problem p = {n, h, d, causal, alloc_f32(count), alloc_f32(count), alloc_f32(count),
                     NULL, alloc_f32(count), NULL, NULL, NULL, alloc_f32(h * n)};
  if (!p.q || !p.k || !p.v || !p.o || !p.lse) die("out of memory in the RSS child");
  bench_fill(p.q, count, 1, UNIT_AMP);
  bench_fill(p.k, count, 2, UNIT_AMP);
  bench_fill(p.v, count, 3, UNIT_AMP);
  attn_arg a = {ctx, ATTN_SPEC_INIT, &p, IMPL_OURS, DIR_FWD, NULL, NULL, {0, 0, 0}, ATTN_F32,
                {NULL}};
  a.spec.num_heads_q = a.spec.num_heads_kv = (int32_t)h;
  a.spec.head_dim_qk = a.spec.head_dim_v = (int32_t)d;
  a.spec.causal = causal;
  double t0 = bench_now_s();
  attn_run(&a);
  double t = bench_now_s() - t0;
  int64_t peak = vm_hwm_bytes();
  printf("RSS %lld %lld %.6f %.6g %.6g\n", (long long)peak, (long long)base, t,
         bench_check_fwd(&p), a.stats.flops_computed);
  attn_ctx_destroy(ctx);
  return 0;
}

static void bench_rss(const options *o) {
  const int64_t n = o->rss_seq, h = 8, d = 128;
  const int causal = 1; /* halves the time; the memory needed is the same */
  char a[5][24], nb[24];
  snprintf(a[0], 24, "%lld", (long long)n), snprintf(a[1], 24, "%lld", (long long)h);
  snprintf(a[2], 24, "%lld", (long long)d), snprintf(a[3], 24, "%d", causal);
  snprintf(a[4], 24, "%d", o->threads);
  int fd[2];
  if (pipe(fd)) die("pipe");
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fd[1], 1);
    close(fd[0]);
    execl("/proc/self/exe", "bench_cpu", "--rss-child", a[0], a[1], a[2], a[3], a[4],
          (char *)NULL);
    _exit(127);
  }
  close(fd[1]);
  FILE *f = fdopen(fd[0], "r");
  long long peak = -1, base = -1;
  double t = 0, err = 1, fc = 0;
  int got = f ? fscanf(f, "RSS %lld %lld %lf %lf %lf", &peak, &base, &t, &err, &fc) : 0;
  if (f) fclose(f);
  int wst = 0;
  waitpid(pid, &wst, 0);
  printf("\nPeak RSS of one forward, N=%s H=%lld d=%lld causal, B=1 (child process, VmHWM):\n",
         fmt_size(n, nb), (long long)h, (long long)d);
  if (got != 5 || !WIFEXITED(wst) || WEXITSTATUS(wst) != 0) {
    printf("  FAILED: the child did not report (status %d)\n", wst);
    g_failed = 1;
    return;
  }
  const double mib = 1 << 20, data = 4.0 * n * h * d * 4 + 4.0 * h * n;
  const double budget = data + 64 * mib, flops = 4.0 * h * n * n * d / (causal ? 2 : 1);
  int over = peak > budget, bad = !(err <= TOL[DIR_FWD]);
  printf("  peak %.1f MiB = Q+K+V+O+LSE %.1f MiB + %.1f MiB (of which %.1f MiB at process "
         "start)\n  target <= data + 64 MiB = %.1f MiB: %s\n",
         peak / mib, data / mib, (peak - data) / mib, base / mib, budget / mib,
         over ? "OVER" : "ok");
  printf("  forward %.2f s, %.1f GFLOP/s (peers' rule), %.1f computed, err %.1e%s\n", t,
         flops / t * 1e-9, fc / t * 1e-9, err, bad ? " FAIL" : "");
  printf("  the unfused baseline would need %.1f GiB for one head's N×N scores (%.1f GiB "
         "backward)\n", 4.0 * n * n / (1 << 30), 8.0 * n * n / (1 << 30));
  g_failed |= bad;
  if (g_json)
    fprintf(g_json,
            "{\"kind\":\"rss\",\"seq\":%lld,\"heads\":%lld,\"head_dim\":%lld,\"causal\":%d,"
            "\"threads\":%d,\"peak_rss_bytes\":%lld,\"start_rss_bytes\":%lld,\"data_bytes\":%.0f,"
            "\"budget_bytes\":%.0f,\"within\":%s,\"time_s\":%.6g,\"gflops\":%.2f,"
            "\"max_rel_err\":%.3g}\n",
            (long long)n, (long long)h, (long long)d, causal, o->threads, peak, base, data,
            budget, over ? "false" : "true", t, flops / t * 1e-9, err);
}

/* ---- main ------------------------------------------------------------------------------- */
int main(int argc, char **argv) {
  if (argc == 7 && !strcmp(argv[1], "--rss-child")) return rss_child_main(argv + 2);
  options o = parse_args(argc, argv);
  fix_env(argv, o.threads);
  if (o.json && !(g_json = fopen(o.json, "a"))) die("cannot open the --json file");
  attn_ctx_t ctx = make_ctx(o.threads);
  printf("attnrun %s (%s) bench_cpu: backend %s, threads %d (OMP_NUM_THREADS=%s, "
         "OPENBLAS_NUM_THREADS=%s, OMP_WAIT_POLICY=%s),\n  OpenBLAS core %s "
         "(OPENBLAS_CORETYPE=%s)\n",
         attn_version_string(), BENCH_GIT_SHA, attn_ctx_backend_name(ctx), o.threads,
         getenv("OMP_NUM_THREADS"), getenv("OPENBLAS_NUM_THREADS"), getenv("OMP_WAIT_POLICY"),
         g_core, g_coretype);
  printf("FLOPs: SGEMM 2·M·N·K. Attention by the peers' rule: fwd 4·B·H·N²·d (causal: half), "
         "bwd 2.5 × fwd, for attnrun and unfused alike;\n  'computed' = FLOPs of the tiles "
         "attnrun computed (attn_ctx_last_stats); unfused computes the full N×N product.\n"
         "Time: one validated run (sampled rows vs float64), one warm-up, then the median "
         "and min of >= %d reps (CLOCK_MONOTONIC); GFLOP/s from the median.\n"
         "err: max |out - ref| / max|ref| on sampled rows (fwd: O; bwd: dQ, and dK, dV where "
         "N²d <= 2^27); '!' marks err above %.0e (fwd) / %.0e (bwd).\n\n",
         o.min_reps, TOL[0], TOL[1]);
  if (g_json)
    fprintf(g_json,
            "{\"kind\":\"env\",\"version\":\"%s\",\"git\":\"%s\",\"backend\":\"%s\","
            "\"threads\":%d,\"blas_core\":\"%s\",\"openblas_coretype\":\"%s\","
            "\"omp_wait_policy\":\"%s\"}\n",
            attn_version_string(), BENCH_GIT_SHA, attn_ctx_backend_name(ctx), o.threads, g_core,
            g_coretype, getenv("OMP_WAIT_POLICY"));

  printf("SGEMM (cblas_sgemm)            M     N     K    med ms    min ms   GFLOP/s   max GF/s  err\n");
  bench_sgemm("square", "start", 2048, 2048, 2048, 0, &o);
  double sgemm_gf = bench_sgemm("attention-shaped Q.K^T", "start", 4096, 4096, 128, 1, &o);

  printf("\nAttention, B=1, Hq=Hkv=H, fp32. 'SGEMM': GFLOP/s of SGEMM(4096x4096x128) measured "
         "just before each config; '/SGEMM': ours over it;\n  '/unfused': speed-up over "
         "unfused (its time / ours).\n");
  printf("%5s %2s %4s %-3s %-3s| %9s %9s %8s %8s %-9s| %9s %8s %-9s| %6s %6s %8s  %s\n",
         "N", "H", "d", "cau", "dir", "ours ms", "min ms", "GFLOP/s", "comp.", "err",
         "unf. ms", "GFLOP/s", "err", "SGEMM", "/SGEMM", "/unfused", "target (x SGEMM)");
  int misses = 0;
  for (int i = 0; i < o.nseq; i++)
    for (int j = 0; j < o.ndim; j++)
      for (int c = 0; c < o.ncausal; c++)
        bench_config(ctx, o.seqs[i], o.dims[j], (int)o.causals[c], &o, &misses);
  if (o.dtype_seq > 0) {
    attn_ctx_t exact = make_ctx_amx(o.threads, -1);
    attn_ctx_t units[2] = {make_ctx_amx(o.threads, 1), make_ctx_amx(o.threads, 2)};
    printf("\nStorage dtypes, attnrun, B=1, Hq=Hkv=H: the same inputs (rounded to bf16) as float32, "
           "bf16 and f16 tensors, in one run;\n  per dtype: median ms, GFLOP/s, speed over "
           "float32 (its time / this one), err (fwd O; bwd dQ, dK, dV, float32 outputs).\n"
           "  f32, bf16, f16: float32 arithmetic (cfg.cpu_amx = -1); bf16-amx, bf16-dp: the tile "
           "products on AMX%s, on AVX512-BF16 dot products%s, forward and backward (P and dS in "
           "bf16).\n",
           units[0] ? "" : " (not on this CPU)", units[1] ? "" : " (not on this CPU)");
    printf("%5s %2s %4s %-3s %-3s|%10s %8s %6s %-9s|%10s %8s %6s %-9s|%10s %8s %6s %-9s|%s%s\n",
           "N", "H", "d", "cau", "dir", "f32 ms", "GFLOP/s", "x f32", "err", "bf16 ms",
           "GFLOP/s", "x f32", "err", "f16 ms", "GFLOP/s", "x f32", "err",
           units[0] ? "  amx ms  GFLOP/s  x f32 err      |" : "",
           units[1] ? "   dp ms  GFLOP/s  x f32 err      |" : "");
    for (int j = 0; j < o.ndim; j++)
      for (int c = 0; c < o.ncausal; c++)
        bench_dtypes(exact, units, o.dtype_seq, o.dims[j], (int)o.causals[c], &o);
    attn_ctx_destroy(exact);
    attn_ctx_destroy(units[0]);
    attn_ctx_destroy(units[1]);
  }
  if (o.decode_kv > 0) {
    g_failed |= bench_decode(ctx, o.decode_kv, o.threads, o.budget_s, o.min_reps, g_json,
                             BENCH_GIT_SHA);
  }
  attn_ctx_destroy(ctx);
  /* The machine may be shared: a second reference measurement shows drift. */
  printf("\nSGEMM again after the attention runs (drift check):\n");
  double again = bench_sgemm("attention-shaped Q.K^T", "end", 4096, 4096, 128, 1, &o);
  if (fabs(again - sgemm_gf) > 0.1 * sgemm_gf)
    printf("  WARNING: the reference moved by more than 10%% during the run (%.1f -> %.1f "
           "GFLOP/s): the machine is busy, ratios are unreliable\n", sgemm_gf, again);
  if (o.rss_seq > 0) bench_rss(&o);
  printf("\n%s; %d target(s) missed.\n", g_failed ? "VALIDATION FAILED" : "all runs validated",
         misses);
  if (g_json) fclose(g_json);
  return g_failed;
}
