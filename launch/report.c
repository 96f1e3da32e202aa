/* report.c — attnrun's output: a header naming the problem and backend, a table of time
 * and GFLOP/s (peers' rule and tiles actually computed), peak memory, the --check summary,
 * and the --json record. */
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

static double scale_of(const attn_spec *s) {
  return s->scale > 0 ? s->scale : 1.0 / sqrt((double)s->head_dim_qk);
}

static double mask_density(const attn_block_mask *bm) {
  int64_t n = bm->num_q_blocks * bm->num_k_blocks, on = 0;
  for (int64_t i = 0; i < n; i++)
    on += bm->mask[i] != 0;
  return n ? (double)on / (double)n : 0.0;
}

static void print_features(FILE *out, const run_args *a, const problem *p) {
  const attn_spec *s = &p->spec;
  if (s->causal) fprintf(out, " causal");
  if (s->window_left >= 0 || s->window_right >= 0)
    fprintf(out, " window=(%lld,%lld)", (long long)s->window_left, (long long)s->window_right);
  if (s->softcap > 0) fprintf(out, " softcap=%g", s->softcap);
  if (s->sinks) fprintf(out, " sinks%s", p->sinks_from_file ? "(file)" : "");
  if (s->alibi_slopes) fprintf(out, " alibi%s", p->alibi_from_file ? "(file)" : "");
  if (s->num_seqs) fprintf(out, " varlen=%d seqs", s->num_seqs);
  if (s->block_mask) {
    const attn_sparse_pattern *sp = &a->sparse_pattern;
    fprintf(out, " sparse(local=%d,stride=%d,global=%d,random=%d,block=%d: %.1f%% of tiles)",
            sp->local_blocks, sp->stride, sp->global_blocks, sp->random_blocks, a->sparse_block,
            100.0 * mask_density(s->block_mask));
  }
}

void report_header(FILE *out, const report_data *d) {
  const problem *p = d->p;
  const attn_spec *s = &p->spec;
  fprintf(out, "# attnrun %s (git %s): single rank, backend %s, %d threads, BLAS core %s\n",
          attn_version_string(), ATTN_GIT_SHA, d->backend_name, d->threads, blas_core_name());
  fprintf(out, "# problem: B=%lld Sq=%lld Skv=%lld Hq=%d Hkv=%d Dqk=%d Dv=%d scale=%.6g",
          (long long)p->batch, (long long)p->seq_q, (long long)p->seq_kv, s->num_heads_q,
          s->num_heads_kv, s->head_dim_qk, s->head_dim_v, scale_of(s));
  print_features(out, d->a, p);
  fprintf(out, "%s\n", d->a->default_problem ? "  [the default problem]" : "");
  if (d->a->load_dir)
    fprintf(out, "# inputs: loaded from %s%s\n", d->a->load_dir,
            d->a->bwd && p->src[T_DO] == SRC_GENERATED ? " (dO generated: no do.npy)" : "");
  else
    fprintf(out, "# inputs: generated, seed %llu\n", (unsigned long long)p->seed);
  fflush(out);
}

static void table_row(FILE *out, const char *name, const run_timing *t) {
  double gf = t->flops / t->median_s * 1e-9, gfc = t->stats.flops_computed / t->median_s * 1e-9;
  fprintf(out, "  %-9s %12.3f %12.3f %10.1f %12.1f %10lld %10lld\n", name, t->median_s * 1e3,
          t->min_s * 1e3, gf, gfc, (long long)t->stats.tiles_computed,
          (long long)t->stats.tiles_skipped);
}

void report_table(FILE *out, const report_data *d) {
  const run_result *r = d->r;
  fprintf(out, "# %-9s %12s %12s %10s %12s %10s %10s\n", "pass", "median_ms", "min_ms", "GFLOP/s",
          "GFLOP/s_cmp", "tiles", "skipped");
  if (r->fwd.done) table_row(out, "forward", &r->fwd);
  if (r->bwd.done) table_row(out, "backward", &r->bwd);
  fprintf(out, "# GFLOP/s: peers' rule, forward 4*B*Hq*Sq*Skv*D (causal halved), backward 2.5x;"
               " GFLOP/s_cmp: tiles actually computed\n");
  fprintf(out, "# peak RSS: %.1f MiB\n", (double)d->peak_rss_bytes / 1048576.0);
}

void report_check(FILE *out, const check_report *c) {
  fprintf(out, "# check vs float64 oracle: %lld query rows", (long long)c->q_rows);
  if (c->k_rows) fprintf(out, ", %lld key rows", (long long)c->k_rows);
  fprintf(out, " (%.2f s)\n", c->seconds);
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
  fprintf(out, "%s: %lld wrong elements\n", c->wrong ? "FAILED" : "OK", (long long)c->wrong);
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
  json_sparse(f, a, s);
  json_bool(f, "bwd", a->bwd);
  json_int(f, "iters", a->iters);
  json_int(f, "warmup", a->warmup);
  json_int(f, "seed", (long long)a->seed);
  json_int(f, "check", a->check_rows);
  json_key_str(f, "backend", backends[a->backend]);
  json_bool(f, "scalar", a->scalar);
  json_int(f, "threads", a->threads);
  json_key_str(f, "load", a->load_dir);
  json_bool(f, "default_problem", a->default_problem);
  fprintf(f, "}");
}

static void json_timing(FILE *f, const char *prefix, const run_timing *t) {
  char key[64];
#define K(name) (snprintf(key, sizeof key, "%s%s", prefix, name), key)
  json_num(f, K("time_s"), t->median_s);
  json_num(f, K("time_min_s"), t->min_s);
  json_num(f, K("flops"), t->flops);
  json_num(f, K("gflops"), t->flops / t->median_s * 1e-9);
  json_num(f, K("flops_computed"), t->stats.flops_computed);
  json_num(f, K("gflops_computed"), t->stats.flops_computed / t->median_s * 1e-9);
  json_int(f, K("tiles_computed"), t->stats.tiles_computed);
  json_int(f, K("tiles_skipped"), t->stats.tiles_skipped);
#undef K
}

static void json_check(FILE *f, const check_report *c) {
  json_num(f, "max_abs_err", c->max_abs_err);
  json_num(f, "max_rel_err", c->max_rel_err);
  json_int(f, "wrong", c->wrong);
  json_int(f, "check_rows_q", c->q_rows);
  json_int(f, "check_rows_k", c->k_rows);
  json_num(f, "check_time_s", c->seconds);
}

int report_json(const char *path, const report_data *d) {
  FILE *f = fopen(path, "a");
  if (!f) return -1;
  char host[256] = "", stamp[32] = "";
  gethostname(host, sizeof host - 1);
  time_t now = time(NULL);
  strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
  fprintf(f, "{\"tool\":\"attnrun\"");
  json_key_str(f, "version", attn_version_string());
  json_key_str(f, "git_sha", ATTN_GIT_SHA);
  json_key_str(f, "timestamp", stamp);
  json_key_str(f, "host", host);
  json_key_str(f, "mode", "single");
  json_int(f, "ranks", 1);
  json_key_str(f, "backend_name", d->backend_name);
  json_int(f, "threads", d->threads);
  json_key_str(f, "blas_core", blas_core_name());
  json_config(f, d);
  if (d->r->fwd.done) json_timing(f, "", &d->r->fwd);
  if (d->r->bwd.done) json_timing(f, "bwd_", &d->r->bwd);
  if (d->check) json_check(f, d->check);
  json_int(f, "peak_rss_bytes", d->peak_rss_bytes);
  fprintf(f, "}\n");
  return fclose(f) == 0 ? 0 : -1;
}
