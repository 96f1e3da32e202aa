/* main.c — the attnrun CLI, single rank: flags → inputs (counter RNG or .npy) → runtime
 * (timed forward, backward) → --check against the float64 oracle → --save → report.
 * Exit status: 0 ok, 1 library or file error, 2 bad flags, 3 --check found wrong elements. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "blas_check.h"
#include "check.h"
#include "problem.h"
#include "report.h"
#include "run.h"
#include "save.h"

#define EXIT_LIB_ERROR 1
#define EXIT_USAGE 2
#define EXIT_WRONG 3

static int lib_error(const char *what, attn_status st) {
  fprintf(stderr, "attnrun: %s failed: %s: %s\n", what, attn_status_string(st), attn_last_error());
  return EXIT_LIB_ERROR;
}

static int io_error(const char *msg) {
  fprintf(stderr, "attnrun: %s\n", msg);
  return EXIT_LIB_ERROR;
}

/* Runs forward (and backward); returns 0 or an exit code. */
static int run_passes(const run_args *a, const problem *p, run_result *r) {
  attn_status st = run_forward(a, p, r);
  if (st != ATTN_OK) return lib_error("attn_fwd", st);
  if (a->bwd && (st = run_backward(a, p, r)) != ATTN_OK) return lib_error("attn_bwd", st);
  return 0;
}

/* Check, save and report after the passes; returns the exit code. */
static int finish(const run_args *a, const problem *p, run_result *r, report_data *d) {
  char err[1024];
  check_report check;
  if (a->check_rows > 0) {
    if (getenv("ATTNRUN_CHECK_SELFTEST")) check_selftest_perturb(r);
    check_run(a, p, r, &check);
    d->check = &check;
  }
  if (a->save_dir && save_outputs(a, p, r, err, sizeof err)) return io_error(err);
  d->peak_rss_bytes = report_peak_rss();
  report_table(stdout, d);
  if (d->check) report_check(stdout, d->check);
  if (a->json_path && report_json(a->json_path, d)) {
    snprintf(err, sizeof err, "--json %s: cannot append the record", a->json_path);
    return io_error(err);
  }
  return d->check && d->check->wrong ? EXIT_WRONG : 0;
}

static int run_problem(const run_args *a, problem *p) {
  char err[1024];
  if (problem_setup(p, a, err, sizeof err) || problem_fill_inputs(p, a->bwd, err, sizeof err))
    return io_error(err);
  run_result r;
  attn_status st = run_ctx_create(a, &r);
  if (st != ATTN_OK) {
    run_free(&r);
    return lib_error("attn_ctx_create", st);
  }
  report_data d = {.a = a,
                   .p = p,
                   .r = &r,
                   .backend_name = attn_ctx_backend_name(r.ctx),
                   .threads = a->threads ? a->threads : omp_get_max_threads()};
  report_header(stdout, &d);
  int rc = run_alloc_outputs(a, p, &r) ? io_error("out of memory for the outputs") : 0;
  if (rc == 0) rc = run_passes(a, p, &r);
  if (rc == 0) rc = finish(a, p, &r, &d);
  run_free(&r);
  return rc;
}

int main(int argc, char **argv) {
  blas_check_coretype(argv);
  run_args a;
  char err[1024];
  switch (args_parse(argc, argv, &a, err, sizeof err)) {
  case ARGS_HELP:
    args_usage(stdout, "attnrun");
    return 0;
  case ARGS_ERROR:
    fprintf(stderr, "attnrun: %s\n", err);
    args_usage_short(stderr, "attnrun");
    return EXIT_USAGE;
  case ARGS_OK:
    break;
  }
  if (a.threads > 0) omp_set_num_threads(a.threads);
  problem p;
  int rc = run_problem(&a, &p);
  problem_free(&p);
  return rc;
}
