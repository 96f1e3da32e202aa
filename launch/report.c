/* report.c — attnrun's output on rank 0: the header (build, grid, problem, one line per
 * rank, the estimate), the result table (per rank and for the job: time, TFLOP/s by the
 * peers' rule and of the tiles computed, compute / exposed-communication split, bytes
 * sent, peak memory, wrong elements), the check summary and footer, and the --json record. */
#include "report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "blas_check.h"

#ifndef ATTN_GIT_SHA
#define ATTN_GIT_SHA "unknown"
#endif

#define MIB (1024.0 * 1024.0)

int64_t report_peak_rss(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long long kb = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmHWM: %lld kB", &kb) == 1) break;
  if (f) fclose(f);
  if (kb < 0) {
    struct rusage ru;
    kb = getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : 0;
  }
  return (int64_t)kb * 1024;
}

const char *report_duration(double s, char *buf, size_t len) {
  if (s >= 86400 * 1.5)
    snprintf(buf, len, "%.1f days", s / 86400);
  else if (s >= 5400)
    snprintf(buf, len, "%.1f h", s / 3600);
  else if (s >= 90)
    snprintf(buf, len, "%.0f min", s / 60);
  else
    snprintf(buf, len, "%.2g s", s);
  return buf;
}

static double scale_of(const attn_spec *s) {
  return s->scale > 0 ? s->scale : 1.0 / sqrt((double)s->head_dim_qk);
}

static double mask_density(const attn_block_mask *bm) {
  int64_t n = bm->num_q_blocks * bm->num_k_blocks, on = 0;
  for (int64_t i = 0; i < n; i++)
    on += bm->mask[i] != 0;
  return n ? (double)on / (double)n : 0.0;
}

static int ranks_of(const report_data *d) { return d->e->size; }

static int hosts_of(const report_data *d) {
  int n = 0;
  for (int r = 0; r < ranks_of(d); r++) {
    int seen = 0;
    for (int q = 0; q < r && !seen; q++)
      seen = !strcmp(d->info[q].host, d->info[r].host);
    n += !seen;
  }
  return n;
}

/* ---- header ---------------------------------------------------------------------------- */

static void print_features(FILE *out, const run_args *a, const problem *p) {
  const attn_spec *s = &p->spec;
  if (s->causal) fprintf(out, " causal");
  if (s->window_left >= 0 || s->window_right >= 0)
    fprintf(out, " window=(%lld,%lld)", (long long)s->window_left, (long long)s->window_right);
  if (s->softcap > 0) fprintf(out, " softcap=%g", s->softcap);
  if (s->sinks) fprintf(out, " sinks%s", p->sinks_from_file ? "(file)" : "");
  if (s->alibi_slopes) fprintf(out, " alibi%s", p->alibi_from_file ? "(file)" : "");
  if (s->num_seqs) fprintf(out, " varlen=%d seqs", s->num_seqs);
  if (p->kv_used) {
    int64_t keys = 0;
    for (int64_t b = 0; b < p->batch; b++) keys += p->kv_used[b];
    fprintf(out, " kv_cache(used %s: %lld keys in all",
            a->cache_lens_random ? "random" : a->cache_lens_count ? "given" : "all",
            (long long)keys);
    if (p->page_size) fprintf(out, "; paged, %lld-row pages shuffled", (long long)p->page_size);
    fprintf(out, ")");
  }
  if (s->block_mask) {
    const attn_sparse_pattern *sp = &a->sparse_pattern;
    fprintf(out, " sparse(local=%d,stride=%d,global=%d,random=%d,block=%d: %.1f%% of tiles)",
            sp->local_blocks, sp->stride, sp->global_blocks, sp->random_blocks, a->sparse_block,
            100.0 * mask_density(s->block_mask));
  }
}

static const char *runs_string(const attn_cp_shard *sh, char *buf, size_t len) {
  size_t n = 0;
  buf[0] = '\0';
  for (int32_t r = 0; r < sh->count && n < len; r++)
    n += (size_t)snprintf(buf + n, len - n, "%s[%lld,%lld)", r ? "+" : "", (long long)sh->start[r],
                          (long long)(sh->start[r] + sh->len[r]));
  return buf;
}

static int same_runs(const attn_cp_shard *x, const attn_cp_shard *y) {
  if (x->count != y->count) return 0;
  for (int32_t r = 0; r < x->count; r++)
    if (x->start[r] != y->start[r] || x->len[r] != y->len[r]) return 0;
  return 1;
}

/* "cuda:0 0000:3b:00.0 nearest (x2)": a rank's device, and how many ranks share it. */
static void device_cell(const gpu_info *g, char *buf, size_t len) {
  if (g->ordinal < 0)
    snprintf(buf, len, "-");
  else if (g->sharing > 1)
    snprintf(buf, len, "cuda:%d %s %s, shared by %d", g->ordinal, g->bus_id, g->how, g->sharing);
  else
    snprintf(buf, len, "cuda:%d %s %s", g->ordinal, g->bus_id, g->how);
}

static void print_rank_lines(FILE *out, const report_data *d) {
  int cuda = d->bc->backend == ATTN_BACKEND_CUDA;
  fprintf(out, "#  %4s  %-16s %-10s %-24s %7s %3s %3s  %-26s %-26s %-*s%s\n", "rank", "host",
          "cpuset", "binding", "threads", "tp", "cp", "query rows", "key rows", cuda ? 12 : 0,
          "heads q|kv", cuda ? " device" : "");
  for (int r = 0; r < ranks_of(d); r++) {
    const rank_info *x = &d->info[r];
    char qb[64], kb[64], hb[48];
    runs_string(&x->qsh, qb, sizeof qb);
    if (same_runs(&x->qsh, &x->ksh))
      snprintf(kb, sizeof kb, "= query rows");
    else
      runs_string(&x->ksh, kb, sizeof kb);
    snprintf(hb, sizeof hb, "%d-%d|%d-%d", x->hq0, x->hq0 + x->hq - 1, x->hk0, x->hk0 + x->hk - 1);
    char dev[128] = "";
    if (cuda) device_cell(&x->gpu, dev, sizeof dev);
    fprintf(out, "#  %4d  %-16.16s %-10s %-24s %7d %3d %3d  %-26s %-26s %-*s%s%s\n", x->rank,
            x->host, x->bind.cpuset, x->bind.how, x->bind.threads, x->tp_rank, x->cp_rank, qb, kb,
            cuda ? 12 : 0, hb, cuda ? " " : "", dev);
  }
}

/* Sums and maxima of the ranks' estimates. */
static void estimate_totals(const report_data *d, estimate *sum, estimate *max) {
  memset(sum, 0, sizeof *sum);
  memset(max, 0, sizeof *max);
  double gf = INFINITY, gb = INFINITY;
  for (int r = 0; r < ranks_of(d); r++) {
    const estimate *e = &d->info[r].est;
    sum->flops_fwd += e->flops_fwd;
    sum->mem_bytes += e->mem_bytes;
    max->dev_bytes = fmax(max->dev_bytes, e->dev_bytes);
    max->flops_fwd = fmax(max->flops_fwd, e->flops_fwd);
    max->fwd_s = fmax(max->fwd_s, e->fwd_s);
    max->bwd_s = fmax(max->bwd_s, e->bwd_s);
    max->total_s = fmax(max->total_s, e->total_s);
    max->mem_bytes = fmax(max->mem_bytes, e->mem_bytes);
    gf = fmin(gf, e->gflops_fwd), gb = fmin(gb, e->gflops_bwd);
  }
  max->gflops_fwd = gf, max->gflops_bwd = gb; /* the slowest rank's rates */
}

static void print_estimate(FILE *out, const report_data *d) {
  estimate sum, max;
  char t1[32], t2[32], t3[32];
  estimate_totals(d, &sum, &max);
  fprintf(out,
          "# estimate: forward %.3g FLOP by the peers' rule; tiles to compute %.3g FLOP in all, "
          "%.3g on the busiest rank\n",
          d->flops_fwd, sum.flops_fwd, max.flops_fwd);
  if (max.gflops_fwd <= 0) {
    fprintf(out, "# estimate: no duration (the probe attn_fwd failed on some rank)\n");
  } else {
    fprintf(out, "# estimate: probe %.1f GFLOP/s per rank (slowest; forward", max.gflops_fwd);
    if (d->a->bwd) fprintf(out, ", %.1f backward", max.gflops_bwd);
    fprintf(out, ") -> ~%s per forward call", report_duration(max.fwd_s, t1, sizeof t1));
    if (d->a->bwd) fprintf(out, ", ~%s per backward", report_duration(max.bwd_s, t2, sizeof t2));
    fprintf(out, "; the run (%d warmup + %d iters%s) ~%s\n", d->a->warmup, d->a->iters,
            d->a->check_rows ? ", --check" : "", report_duration(max.total_s, t3, sizeof t3));
  }
  fprintf(out, "# estimate: memory ~%.0f MiB per rank (inputs, outputs, ring buffers), %.0f MiB in all",
          max.mem_bytes / MIB, sum.mem_bytes / MIB);
  if (max.dev_bytes > 0)
    fprintf(out, "; device memory ~%.0f MiB per rank (not checked against the device's size)",
            max.dev_bytes / MIB);
  fprintf(out, "\n");
}

void report_header(FILE *out, const report_data *d) {
  const problem *p = d->p;
  const attn_spec *s = &p->spec;
  const grid *g = d->g;
  fprintf(out, "# attnrun %s (git %s): %d rank%s on %d host%s, mode %s", attn_version_string(),
          ATTN_GIT_SHA, ranks_of(d), ranks_of(d) > 1 ? "s" : "", hosts_of(d),
          hosts_of(d) > 1 ? "s" : "", grid_mode_name(g));
  if (!g->single) fprintf(out, " (tp=%d x cp=%d)", g->tp, g->cp);
  fprintf(out, ", %d thread%s on rank 0, BLAS core %s\n", d->info[0].bind.threads,
          d->info[0].bind.threads > 1 ? "s" : "", blas_core_name());
  fprintf(out, "# backend %s (%s): %s, dtype %s (%s)\n",
          d->bc->backend == ATTN_BACKEND_CUDA ? "cuda" : "cpu", d->bc->why, d->backend_name,
          backend_dtype_name(d->bc->dtype), d->bc->dtype_why);
  if (!g->single) fprintf(out, "# grid: %s\n", g->why);
  fprintf(out, "# problem: B=%lld Sq=%lld Skv=%lld Hq=%d Hkv=%d Dqk=%d Dv=%d scale=%.6g",
          (long long)p->batch, (long long)p->seq_q, (long long)p->seq_kv, s->num_heads_q,
          s->num_heads_kv, s->head_dim_qk, s->head_dim_v, scale_of(s));
  print_features(out, d->a, p);
  fprintf(out, "%s\n", d->a->default_problem ? "  [the default problem]" : "");
  if (d->d_model > 0)
    fprintf(out, "# layer: d_model=%lld: y = Attn(x W_q, x W_k, x W_v) W_o, heads over tp, rows over cp\n",
            (long long)d->d_model);
  if (d->a->load_dir)
    fprintf(out, "# inputs: loaded from %s%s, each rank reads its rows and heads\n", d->a->load_dir,
            d->a->bwd && p->src[T_DO] == SRC_GENERATED ? " (dO generated: no do.npy)" : "");
  else
    fprintf(out, "# inputs: generated, seed %llu; each rank generates only its rows and heads\n",
            (unsigned long long)p->seed);
  print_rank_lines(out, d);
  print_estimate(out, d);
  fflush(out);
}

/* ---- result table ---------------------------------------------------------------------- */

/* This rank's computed FLOPs: the attention tiles the library counted, plus (layer) the
 * projections; the estimate when the library counted nothing. */
static double cmp_flops(const rank_outcome *o, const rank_info *x, int bwd) {
  const run_timing *t = bwd ? &o->bwd : &o->fwd;
  if (t->stats.flops_computed <= 0) return bwd ? x->est.flops_bwd : x->est.flops_fwd;
  return t->stats.flops_computed + x->est.flops_proj * (bwd ? 2.0 : 1.0);
}

/* compute_ms, exposed_ms, exposed% — or dashes when the pass recorded no ring steps (the
 * layer with cp = 1 runs attention without a ring). */
static void split_cols(char *buf, size_t len, int steps, double comp, double wait, double ts) {
  if (steps == 0)
    snprintf(buf, len, "%11s %10s %8s", "-", "-", "-");
  else
    snprintf(buf, len, "%11.3f %10.3f %8.2f", comp * 1e3, wait * 1e3, 100.0 * wait / ts);
}

static void rank_row(FILE *out, const report_data *d, const char *name, int r, int bwd) {
  const rank_outcome *o = &d->out[r];
  const run_timing *t = bwd ? &o->bwd : &o->fwd;
  double flops = d->flops_fwd * (bwd ? 2.5 : 1.0) / ranks_of(d), ts = t->median_s;
  char wrong[24] = "-", split[48];
  if (o->checked) snprintf(wrong, sizeof wrong, "%lld", (long long)o->check.wrong);
  split_cols(split, sizeof split, d->g->single ? 1 : t->split.steps, t->split.compute_s,
             t->split.wait_s, t->mean_s);
  fprintf(out, "  %-10s %5d %11.3f %9.4f %11.4f %s %10.2f %9.1f %7s\n", name, r, ts * 1e3,
          flops / ts * 1e-12, cmp_flops(o, &d->info[r], bwd) / ts * 1e-12, split,
          t->split.bytes / MIB, (double)o->peak_rss / MIB, wrong);
}

typedef struct {
  double compute_mean, compute_max, wait_mean, wait_frac_max, bytes, cmp, peak;
  int64_t wrong;
} job_sums;

static job_sums job_totals(const report_data *d, int bwd) {
  job_sums j = {0};
  int n = ranks_of(d);
  for (int r = 0; r < n; r++) {
    const rank_outcome *o = &d->out[r];
    const run_timing *t = bwd ? &o->bwd : &o->fwd;
    j.compute_mean += t->split.compute_s / n;
    j.compute_max = fmax(j.compute_max, t->split.compute_s);
    j.wait_mean += t->split.wait_s / n;
    j.wait_frac_max = fmax(j.wait_frac_max, t->split.wait_s / t->mean_s);
    j.bytes += t->split.bytes;
    j.cmp += cmp_flops(o, &d->info[r], bwd);
    j.peak = fmax(j.peak, (double)o->peak_rss);
    j.wrong += o->checked ? o->check.wrong : 0;
  }
  return j;
}

static void job_rows(FILE *out, const report_data *d, const char *name, int bwd) {
  const run_timing *t0 = bwd ? &d->out[0].bwd : &d->out[0].fwd;
  double ts = t0->job_median_s, flops = d->flops_fwd * (bwd ? 2.5 : 1.0);
  job_sums j = job_totals(d, bwd);
  char wrong[24] = "-", split[48];
  if (d->check) snprintf(wrong, sizeof wrong, "%lld", (long long)j.wrong);
  split_cols(split, sizeof split, d->g->single ? 1 : t0->split.steps, j.compute_mean,
             j.wait_mean, t0->job_mean_s);
  fprintf(out, "  %-10s %5s %11.3f %9.4f %11.4f %s %10.2f %9.1f %7s\n", name, "job", ts * 1e3,
          flops / ts * 1e-12, j.cmp / ts * 1e-12, split, j.bytes / MIB, j.peak / MIB, wrong);
  if (!d->g->single && t0->split.steps == 0) {
    fprintf(out, "# %s: job min %.3f ms; no ring steps recorded (cp=1): no compute/exposed split\n",
            name, t0->job_min_s * 1e3);
    return;
  }
  fprintf(out,
          "# %s: job min %.3f ms; imbalance %.3f (slowest rank's compute / mean); exposed "
          "communication %.2f%% of the time on average, %.2f%% on the worst rank\n",
          name, t0->job_min_s * 1e3, j.compute_mean > 0 ? j.compute_max / j.compute_mean : 1.0,
          100.0 * j.wait_mean / t0->job_mean_s, 100.0 * j.wait_frac_max);
}

void report_table(FILE *out, const report_data *d) {
  const char *names[2] = {d->d_model > 0 ? "layer_fwd" : "forward",
                          d->d_model > 0 ? "layer_bwd" : "backward"};
  fprintf(out, "#\n# %-10s %5s %11s %9s %11s %11s %10s %8s %10s %9s %7s\n", "pass", "rank",
          "time_ms", "TFLOP/s", "TFLOP/s_cmp", "compute_ms", "exposed_ms", "exposed%", "sent_MiB",
          "peak_MiB", "wrong");
  for (int bwd = 0; bwd < 2; bwd++) {
    if (!(bwd ? d->out[0].bwd.done : d->out[0].fwd.done)) continue;
    for (int r = 0; r < ranks_of(d); r++)
      rank_row(out, d, names[bwd], r, bwd);
    job_rows(out, d, names[bwd], bwd);
  }
  fprintf(out,
          "# time: median over --iters (job: the slowest rank per iteration); TFLOP/s: peers' "
          "rule, forward 4*B*Hq*Sq*Skv*D (causal halved%s), backward 2.5x, a rank's share = 1/%d; "
          "TFLOP/s_cmp: tiles actually computed; compute / exposed (time blocked on the ring "
          "exchange) and sent: mean per call, from the ring's step record%s (exposed%%: of the "
          "mean time); peak: VmHWM\n",
          d->p->spec.window_left >= 0 || d->p->spec.window_right >= 0 || d->p->spec.block_mask
              ? "; it ignores windows and sparsity, TFLOP/s_cmp does not"
              : "",
          ranks_of(d), d->d_model > 0 ? " (the layer: its attention ring only; the "
                                        "projections and the W_o AllReduce are in time_ms)" : "");
  fflush(out);
}

/* ---- check and footer ---------------------------------------------------------------- */

static void print_check(FILE *out, const report_data *d) {
  const check_report *c = d->check;
  fprintf(out, "# check vs float64 oracle over the full sequence: %lld query rows", (long long)c->q_rows);
  if (c->k_rows) fprintf(out, ", %lld key rows", (long long)c->k_rows);
  fprintf(out, "%s (%.2f s%s)\n", ranks_of(d) > 1 ? " per rank" : "", c->seconds,
          ranks_of(d) > 1 ? " on the slowest rank" : "");
  for (int i = 0; i < CK_COUNT; i++) {
    const check_tensor *t = &c->t[i];
    if (!t->used) continue;
    double rel = t->max_abs_err / (t->max_ref > 0 ? t->max_ref : 1.0);
    fprintf(out,
            "#   %-6s max_abs_err %.3e  rel %.3e  (tol %.0e x max|ref| %.3g)  wrong %lld/%lld\n",
            check_tensor_name[i], t->max_abs_err, rel, t->tol, t->max_ref, (long long)t->wrong,
            (long long)t->count);
    if (t->wrong) fprintf(out, "#          worst: %s\n", t->worst);
  }
  if (c->dsinks_skipped)
    fprintf(out, "#   dsinks not checked: it needs every row (problem too big)\n");
}

void report_footer(FILE *out, const report_data *d) {
  if (!d->check) {
    fprintf(out, "OK: not checked (--check N compares N sampled rows per rank with the float64 oracle)\n");
    fflush(out);
    return;
  }
  print_check(out, d);
  if (!d->check->wrong) {
    fprintf(out, "OK: 0 wrong elements\n");
    fflush(out);
    return;
  }
  fprintf(out, "FAILED: %lld wrong elements", (long long)d->check->wrong);
  if (ranks_of(d) > 1) {
    fprintf(out, " (on rank");
    for (int r = 0; r < ranks_of(d); r++)
      if (d->out[r].check.wrong) fprintf(out, " %d", r);
    fprintf(out, ")");
  }
  fprintf(out, "\n");
  fflush(out);
}

/* ---- JSON ---------------------------------------------------------------------------- */

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; s && *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      fprintf(f, "\\%c", ch);
    else if (ch < 0x20)
      fprintf(f, "\\u%04x", ch);
    else
      fputc(ch, f);
  }
  fputc('"', f);
}

static void json_num(FILE *f, const char *key, double v) {
  fprintf(f, ",\"%s\":", key);
  if (isfinite(v))
    fprintf(f, "%.9g", v);
  else
    fprintf(f, "null");
}

static void json_int(FILE *f, const char *key, long long v) { fprintf(f, ",\"%s\":%lld", key, v); }
static void json_bool(FILE *f, const char *key, int v) {
  fprintf(f, ",\"%s\":%s", key, v ? "true" : "false");
}
static void json_key_str(FILE *f, const char *key, const char *v) {
  fprintf(f, ",\"%s\":", key);
  if (v)
    json_str(f, v);
  else
    fprintf(f, "null");
}

static void json_sparse(FILE *f, const run_args *a, const attn_spec *s) {
  fprintf(f, ",\"sparse\":");
  if (!s->block_mask) {
    fprintf(f, "null");
    return;
  }
  const attn_sparse_pattern *sp = &a->sparse_pattern;
  fprintf(f,
          "{\"local\":%d,\"stride\":%d,\"global\":%d,\"random\":%d,\"block\":%d,\"density\":%.6g}",
          sp->local_blocks, sp->stride, sp->global_blocks, sp->random_blocks, a->sparse_block,
          mask_density(s->block_mask));
}

static void json_config(FILE *f, const report_data *d) {
  const run_args *a = d->a;
  const problem *p = d->p;
  const attn_spec *s = &p->spec;
  static const char *const backends[] = {"auto", "cpu", "cuda"};
  fprintf(f, ",\"config\":{\"batch\":%lld", (long long)p->batch);
  json_int(f, "seq_q", p->seq_q);
  json_int(f, "seq_kv", p->seq_kv);
  json_int(f, "heads_q", s->num_heads_q);
  json_int(f, "heads_kv", s->num_heads_kv);
  json_int(f, "head_dim_qk", s->head_dim_qk);
  json_int(f, "head_dim_v", s->head_dim_v);
  json_num(f, "scale", scale_of(s));
  json_bool(f, "causal", s->causal);
  json_int(f, "window_left", s->window_left);
  json_int(f, "window_right", s->window_right);
  json_num(f, "softcap", s->softcap);
  json_bool(f, "sinks", s->sinks != NULL);
  json_bool(f, "alibi", s->alibi_slopes != NULL);
  json_int(f, "varlen_seqs", s->num_seqs);
  int64_t keys = 0;
  for (int64_t b = 0; d->p->kv_used && b < d->p->batch; b++) keys += d->p->kv_used[b];
  json_int(f, "page_size", d->p->page_size);
  json_int(f, "cache_keys", d->p->kv_used ? keys : -1);
  json_sparse(f, a, s);
  json_bool(f, "bwd", a->bwd);
  json_int(f, "iters", a->iters);
  json_int(f, "warmup", a->warmup);
  json_int(f, "seed", (long long)a->seed);
  json_int(f, "check", a->check_rows);
  json_key_str(f, "backend", backends[a->backend]);
  json_key_str(f, "dtype", (a->given & GIVEN_DTYPE) ? backend_dtype_name(a->dtype) : NULL);
  if (a->given & GIVEN_DEVICE)
    json_int(f, "device", a->device);
  else
    fprintf(f, ",\"device\":null");
  json_bool(f, "scalar", a->scalar);
  json_int(f, "threads", a->threads);
  json_key_str(f, "load", a->load_dir);
  json_bool(f, "default_problem", a->default_problem);
  json_int(f, "d_model", d->d_model);
  fprintf(f, "}");
}

static void json_timing(FILE *f, const char *prefix, const report_data *d, int bwd) {
  const run_timing *t = bwd ? &d->out[0].bwd : &d->out[0].fwd;
  double flops = d->flops_fwd * (bwd ? 2.5 : 1.0), ts = t->job_median_s;
  job_sums j = job_totals(d, bwd);
  char key[64];
#define K(name) (snprintf(key, sizeof key, "%s%s", prefix, name), key)
  json_num(f, K("time_s"), ts);
  json_num(f, K("time_min_s"), t->job_min_s);
  json_num(f, K("flops"), flops);
  json_num(f, K("gflops"), flops / ts * 1e-9);
  json_num(f, K("flops_computed"), j.cmp);
  json_num(f, K("gflops_computed"), j.cmp / ts * 1e-9);
  json_int(f, K("tiles_computed"), t->stats.tiles_computed);
  json_int(f, K("tiles_skipped"), t->stats.tiles_skipped);
  json_num(f, K("imbalance"), j.compute_mean > 0 ? j.compute_max / j.compute_mean : 1.0);
  json_num(f, K("exposed_frac"), j.wait_mean / t->job_mean_s);
  json_num(f, K("exposed_frac_max"), j.wait_frac_max);
#undef K
}

static void json_split(FILE *f, const char *prefix, const run_timing *t) {
  char key[64];
#define K(name) (snprintf(key, sizeof key, "%s%s", prefix, name), key)
  json_num(f, K("time_s"), t->median_s);
  json_num(f, K("compute_s"), t->split.compute_s);
  json_num(f, K("exposed_s"), t->split.wait_s);
  json_num(f, K("sent_bytes"), t->split.bytes);
  json_int(f, K("steps"), t->split.steps);
  json_num(f, K("flops_computed"), t->stats.flops_computed);
#undef K
}

static void json_gpu(FILE *f, const gpu_info *g) {
  if (g->ordinal < 0) {
    fprintf(f, ",\"device\":null");
    return;
  }
  json_int(f, "device", g->ordinal);
  json_key_str(f, "device_bus_id", g->bus_id);
  json_key_str(f, "device_near", g->near);
  json_key_str(f, "device_how", g->how);
  json_int(f, "device_sharing", g->sharing);
}

static void json_ranks(FILE *f, const report_data *d) {
  fprintf(f, ",\"per_rank\":[");
  for (int r = 0; r < ranks_of(d); r++) {
    const rank_info *x = &d->info[r];
    const rank_outcome *o = &d->out[r];
    fprintf(f, "%s{\"rank\":%d", r ? "," : "", r);
    json_key_str(f, "host", x->host);
    json_key_str(f, "cpuset", x->bind.cpuset);
    json_int(f, "threads", x->bind.threads);
    json_int(f, "tp_rank", x->tp_rank);
    json_int(f, "cp_rank", x->cp_rank);
    json_int(f, "q_rows", x->qsh.rows);
    json_int(f, "kv_rows", x->ksh.rows);
    json_num(f, "est_total_s", x->est.total_s);
    json_num(f, "est_mem_bytes", x->est.mem_bytes);
    json_gpu(f, &x->gpu);
    if (o->fwd.done) json_split(f, "fwd_", &o->fwd);
    if (o->bwd.done) json_split(f, "bwd_", &o->bwd);
    json_int(f, "peak_rss_bytes", o->peak_rss);
    if (o->checked) json_int(f, "wrong", o->check.wrong);
    fprintf(f, "}");
  }
  fprintf(f, "]");
}

static void json_check(FILE *f, const check_report *c) {
  json_num(f, "max_abs_err", c->max_abs_err);
  json_num(f, "max_rel_err", c->max_rel_err);
  json_int(f, "wrong", c->wrong);
  json_int(f, "check_rows_q", c->q_rows);
  json_int(f, "check_rows_k", c->k_rows);
  json_num(f, "check_time_s", c->seconds);
}

static void json_grid(FILE *f, const report_data *d) {
  const grid *g = d->g;
  json_key_str(f, "mode", grid_mode_name(g));
  json_int(f, "ranks", ranks_of(d));
  json_int(f, "hosts", hosts_of(d));
  json_int(f, "tp", g->tp);
  json_int(f, "cp", g->cp);
  json_key_str(f, "layout", g->cp > 1 || g->split_kv ? (g->layout == ATTN_LAYOUT_ZIGZAG ? "zigzag" : "contiguous") : NULL);
  json_key_str(f, "grid_why", g->why);
}

int report_json(const char *path, const report_data *d) {
  FILE *f = fopen(path, "a");
  if (!f) return -1;
  char stamp[32] = "";
  time_t now = time(NULL);
  int64_t peak = 0;
  for (int r = 0; r < ranks_of(d); r++)
    peak = d->out[r].peak_rss > peak ? d->out[r].peak_rss : peak;
  strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
  fprintf(f, "{\"tool\":\"attnrun\"");
  json_key_str(f, "version", attn_version_string());
  json_key_str(f, "git_sha", ATTN_GIT_SHA);
  json_key_str(f, "timestamp", stamp);
  json_key_str(f, "host", d->info[0].host);
  json_grid(f, d);
  json_key_str(f, "backend_name", d->backend_name);
  json_key_str(f, "backend", d->bc->backend == ATTN_BACKEND_CUDA ? "cuda" : "cpu");
  json_key_str(f, "backend_why", d->bc->why);
  json_key_str(f, "dtype", backend_dtype_name(d->bc->dtype));
  json_key_str(f, "dtype_why", d->bc->dtype_why);
  json_int(f, "threads", d->info[0].bind.threads);
  json_key_str(f, "blas_core", blas_core_name());
  json_config(f, d);
  if (d->out[0].fwd.done) json_timing(f, "", d, 0);
  if (d->out[0].bwd.done) json_timing(f, "bwd_", d, 1);
  if (d->check) json_check(f, d->check);
  json_int(f, "peak_rss_bytes", peak);
  json_ranks(f, d);
  fprintf(f, "}\n");
  return fclose(f) == 0 ? 0 : -1;
}
