/* main.c — the attnrun CLI, on one rank or many (mpirun): flags → MPI → hwloc binding →
 * problem and grid → context and group → estimate and header → this rank's inputs →
 * timed passes → --check against the float64 oracle → --save → report.
 * Every rank parses the same argv and agrees on each decision before the next collective,
 * so a bad flag or an impossible grid ends every rank with the same code and no rank
 * waits in a collective. A library failure during the run (a timeout from a stalled peer,
 * say) prints the message with the rank and ends the job (MPI_Abort).
 * Exit status: 0 ok, 1 library or file error, 2 bad flags / impossible grid / refused
 * estimate, 3 --check found wrong elements on some rank. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "backend.h"
#include "bind.h"
#include "blas_check.h"
#include "check.h"
#include "estimate.h"
#include "gpu.h"
#include "grid.h"
#include "layer_run.h"
#include "mpienv.h"
#include "problem.h"
#include "report.h"
#include "run.h"
#include "save.h"

#define EXIT_LIB_ERROR 1
#define EXIT_USAGE 2
#define EXIT_WRONG 3
#define CHECK_SLACK_S 60.0 /* ranks finish their checks at different times */

typedef struct {
  mpienv e;
  run_args a;
  bind_info bind;
  backend_choice bc;
  gpu_info gpu;
  problem p;
  grid g;
  run_env env;
  run_result r;
  layer_job L;
  estimate est;
  double est_check_max; /* the slowest rank's estimated check, for the waits after it */
  char err[1024];
} app;

/* Every rank learns whether any failed; the lowest failing rank prints `msg` (and the short
 * usage for code 2). Returns 0 when none failed, else `code` on every rank. */
static int agree(app *x, int failed, int code, const char *msg) {
  mpienv *e = &x->e;
  int lowest = mpienv_max_int(e, failed ? e->size - e->rank : 0, CHECK_SLACK_S, "agreeing");
  if (!lowest) return 0;
  if (failed && e->size - e->rank == lowest) {
    if (e->size > 1)
      fprintf(stderr, "attnrun: rank %d (%s): %s\n", e->rank, e->host, msg);
    else
      fprintf(stderr, "attnrun: %s\n", msg);
    if (code == EXIT_USAGE) args_usage_short(stderr, "attnrun");
  }
  return code;
}

static _Noreturn void lib_fail(app *x, const char *what, attn_status st) {
  mpienv_abort(&x->e, EXIT_LIB_ERROR, "%s failed: %s: %s", what, attn_status_string(st),
               attn_last_error());
}

/* Global problem, grid, and this rank's shard of rows and heads. */
static int setup_problem(app *x) {
  int rc = problem_setup(&x->p, &x->a, x->err, sizeof x->err) ? -1 : 0;
  if ((rc = agree(x, rc != 0, EXIT_LIB_ERROR, x->err))) return rc;
  const problem *p = &x->p;
  rc = grid_choose(&x->a, &p->spec, p->seq_q, p->seq_kv, x->e.size, x->e.rank, &x->g, x->err,
                   sizeof x->err);
  if ((rc = agree(x, rc != 0, EXIT_USAGE, x->err))) return rc;
  attn_cp_shard qsh = problem_whole(p->seq_q), ksh = problem_whole(p->seq_kv);
  if (x->g.cp > 1) { /* split-kv: every CP rank holds all query rows */
    attn_status st = x->g.split_kv ? ATTN_OK
                                   : attn_cp_shard_rows(x->g.layout, x->g.cp, x->g.cp_rank,
                                                        p->seq_q, &qsh);
    if (st == ATTN_OK) st = attn_cp_shard_rows(x->g.layout, x->g.cp, x->g.cp_rank, p->seq_kv, &ksh);
    if (st != ATTN_OK) lib_fail(x, "attn_cp_shard_rows", st);
  }
  problem_set_shard(&x->p, &qsh, &ksh, x->g.hq0, x->g.hq, x->g.hk0, x->g.hk);
  return 0;
}

/* Backend and dtype (agreed), then this rank's CUDA device. */
static int choose_backend(app *x) {
  int rc = backend_choose(&x->e, &x->a, &x->bc, x->err, sizeof x->err);
  if ((rc = agree(x, rc != 0, EXIT_USAGE, x->err))) return rc;
  if (x->bc.backend == ATTN_BACKEND_CUDA)
    gpu_choose(&x->e, &x->a, x->bc.cuda_devices, &x->gpu);
  else
    gpu_none(&x->gpu);
  x->p.dtype = x->bc.dtype; /* inputs are rounded to it as they are generated or read */
  return 0;
}

static int create_context(app *x) {
  attn_ctx_config cfg = ATTN_CTX_CONFIG_INIT;
  cfg.backend = x->bc.backend, cfg.num_threads = x->bind.threads, cfg.force_scalar = x->a.scalar;
  cfg.device = x->gpu.ordinal >= 0 ? x->gpu.ordinal : 0;
  attn_status st = attn_ctx_create(&x->env.ctx, &cfg);
  snprintf(x->err, sizeof x->err, "attn_ctx_create failed: %s: %s", attn_status_string(st),
           attn_last_error());
  int rc = agree(x, st != ATTN_OK, EXIT_LIB_ERROR, x->err);
  if (rc) return rc;
  rc = backend_check_dtype(x->env.ctx, &x->bc, x->err, sizeof x->err);
  return agree(x, rc != 0, EXIT_USAGE, x->err);
}

/* Context (agreed: a rank without it must not enter the group's collectives), group, and
 * with --d-model the layer (agreed too: attn_layer_create fails on every rank alike). */
static int setup_library(app *x) {
  const char *what = "";
  x->env = (run_env){.a = &x->a, .e = &x->e, .g = &x->g, .t_start = mpienv_now()};
  int rc = choose_backend(x);
  if (!rc) rc = create_context(x);
  if (rc) return rc;
  x->env.dtype = x->bc.dtype;
  attn_status st;
  if ((st = run_env_create_group(&x->env, &what)) != ATTN_OK) lib_fail(x, what, st);
  attn_group_info gi;
  if (x->env.grp && (st = attn_group_get_info(x->env.grp, &gi)) != ATTN_OK)
    lib_fail(x, "attn_group_get_info", st);
  if (x->env.grp && (gi.tp_rank != x->g.tp_rank || gi.cp_rank != x->g.cp_rank))
    mpienv_abort(&x->e, EXIT_LIB_ERROR,
                 "the library placed this rank at tp_rank %d, cp_rank %d; attnrun expected %d, %d",
                 gi.tp_rank, gi.cp_rank, x->g.tp_rank, x->g.cp_rank);
  st = x->g.layer ? layer_setup(&x->L, &x->env, &x->p, &what) : ATTN_OK;
  snprintf(x->err, sizeof x->err, "%s failed: %s: %s", what, attn_status_string(st), attn_last_error());
  return agree(x, st != ATTN_OK, EXIT_LIB_ERROR, x->err);
}

static rank_info my_info(const app *x) {
  rank_info i;
  memset(&i, 0, sizeof i);
  i.rank = x->e.rank, i.tp_rank = x->g.tp_rank, i.cp_rank = x->g.cp_rank;
  snprintf(i.host, sizeof i.host, "%s", x->e.host);
  i.bind = x->bind;
  i.qsh = x->p.qsh, i.ksh = x->p.ksh;
  i.hq0 = x->p.hq0, i.hq = x->p.hq, i.hk0 = x->p.hk0, i.hk = x->p.hk;
  i.est = x->est;
  i.gpu = x->gpu;
  return i;
}

static report_data report_of(const app *x, const rank_info *info) {
  report_data d = {.a = &x->a, .p = &x->p, .g = &x->g, .e = &x->e,
                   .backend_name = attn_ctx_backend_name(x->env.ctx), .bc = &x->bc,
                   .d_model = x->a.d_model, .info = info};
  d.flops_fwd = x->a.d_model > 0 ? layer_flops_fwd(&x->p, x->a.d_model)
                                 : attn_flops_fwd(&x->p.spec, x->p.batch, x->p.seq_q, x->p.seq_kv);
  return d;
}

/* Memory the ranks of this host would need beyond 90% of it, as a fraction (0: fits). */
static double memory_excess(const app *x) {
  double need = x->est.mem_bytes * x->e.local_size, have = 0.9 * (double)x->bind.node_mem;
  return have > 0 && need > have ? need / have : 0.0;
}

/* What every rank needs to decide alike: the slowest rank's call and check, memory. */
typedef struct {
  double call_s, check_s, total_s, excess;
  int lowered; /* default --iters/--warmup lowered for long calls */
} run_plan;

/* Agrees on the estimate; lowers the default iterations when one call is long. */
static run_plan plan(app *x) {
  run_plan pl = {0};
  estimate *est = &x->est;
  pl.call_s = mpienv_max_double(&x->e, est->fwd_s + est->bwd_s, CHECK_SLACK_S, "the estimate");
  pl.check_s = mpienv_max_double(&x->e, est->check_s, CHECK_SLACK_S, "the estimate");
  pl.excess = mpienv_max_double(&x->e, memory_excess(x), CHECK_SLACK_S, "the estimate");
  x->est_check_max = pl.check_s;
  if (pl.call_s > ARGS_LONG_CALL_S && !(x->a.given & (GIVEN_ITERS | GIVEN_WARMUP))) {
    x->a.iters = 1, x->a.warmup = 0;
    pl.lowered = 1;
  }
  est->total_s = (x->a.warmup + x->a.iters) * (est->fwd_s + est->bwd_s) + est->check_s;
  pl.total_s = (x->a.warmup + x->a.iters) * pl.call_s + pl.check_s;
  return pl;
}

/* The run is refused (exit 2) when the estimate exceeds ARGS_REFUSE_S or the host's
 * memory, unless --force. */
static int refuse(const app *x, const run_plan *pl) {
  if (x->a.force || (pl->total_s <= ARGS_REFUSE_S && pl->excess == 0)) return 0;
  char t[32];
  if (x->e.rank == 0 && pl->excess > 0)
    fprintf(stderr,
            "attnrun: the ranks of a host would need %.1fx its memory (estimate above). Use "
            "more hosts, fewer --heads or a shorter --seq (a --window saves time, not "
            "memory); or add --force to try anyway.\n",
            pl->excess / 0.9);
  if (x->e.rank == 0 && pl->total_s > ARGS_REFUSE_S)
    fprintf(stderr,
            "attnrun: this run would take ~%s by the estimate above, more than the %.0f min "
            "limit. Make it smaller: a sliding --window (e.g. --window 4096), fewer --heads, a "
            "shorter --seq, fewer --check rows, more ranks%s; or add --force to run it "
            "anyway.\n",
            report_duration(pl->total_s, t, sizeof t), ARGS_REFUSE_S / 60,
            x->bc.backend == ATTN_BACKEND_CUDA ? " or GPUs" : " or a GPU (--backend cuda)");
  return EXIT_USAGE;
}

/* Estimate, gather the per-rank lines, print the header; refuse too long a run. */
static int header(app *x, rank_info **info) {
  const bind_info *b = &x->bind;
  double cores = b->shared ? (double)b->host_cores / x->e.local_size : b->cores;
  estimate_rank(&x->env, &x->p, x->a.d_model, cores, x->gpu.sharing, &x->est);
  run_plan pl = plan(x);
  rank_info mine = my_info(x);
  *info = x->e.rank == 0 ? calloc((size_t)x->e.size, sizeof **info) : NULL;
  mpienv_gather(&x->e, &mine, *info, (int)sizeof mine, CHECK_SLACK_S, "the header");
  if (x->e.rank == 0) {
    report_data d = report_of(x, *info);
    report_header(stdout, &d);
    if (pl.lowered)
      printf("# one call takes ~%.0f s by the estimate: --iters 1 --warmup 0 (give --iters to "
             "change)\n", pl.call_s);
    fflush(stdout);
  }
  return refuse(x, &pl);
}

/* This rank's inputs and poisoned outputs (attention); agreed. */
static int inputs(app *x) {
  if (x->g.layer) return 0;
  int rc = problem_fill_inputs(&x->p, x->a.bwd, x->err, sizeof x->err);
  if (rc == 0 && run_alloc_outputs(&x->a, &x->p, &x->r)) {
    snprintf(x->err, sizeof x->err, "out of memory for the outputs; use a smaller problem");
    rc = -1;
  }
  return agree(x, rc != 0, EXIT_LIB_ERROR, x->err);
}

/* The timed passes. Every rank leaves them with the same verdict (run_timed agrees after
 * each call), so a failure that every rank meets (UNSUPPORTED, say) ends the job with the
 * lowest failing rank's message and exit 1 everywhere; a timeout (a peer gone or stalled)
 * ends it at once. */
static int run_passes(app *x) {
  const char *what = "";
  attn_status st = x->g.layer ? layer_run(&x->env, &x->L, &x->p, &x->r, &what)
                              : run_attention(&x->env, &x->p, &x->r, &what);
  if (st == ATTN_ERR_TIMEOUT) lib_fail(x, what, st);
  int mine = st != ATTN_OK && !x->r.fwd.peer_failed && !x->r.bwd.peer_failed;
  snprintf(x->err, sizeof x->err, "%s failed: %s: %s", what, attn_status_string(st), attn_last_error());
  int rc = agree(x, mine, EXIT_LIB_ERROR, x->err);
  return rc ? rc : st != ATTN_OK ? EXIT_LIB_ERROR : 0;
}

static void check(app *x, rank_outcome *mine) {
  if (x->a.check_rows <= 0) return;
  if (x->e.rank == 0 && x->est_check_max > 3.0)
    fprintf(stderr, "attnrun: checking %lld rows per rank against the float64 oracle (~%.0f s)\n",
            (long long)x->a.check_rows, x->est_check_max);
  if (getenv("ATTNRUN_CHECK_SELFTEST") && x->e.rank == x->e.size - 1)
    check_selftest_perturb(x->g.layer ? NULL : &x->r, x->g.layer ? x->L.y : NULL,
                           x->g.layer ? x->L.dx : NULL);
  if (x->g.layer)
    layer_check(&x->env, &x->L, &x->p, &mine->check);
  else
    check_run(&x->a, &x->p, &x->r, &mine->check);
  mine->checked = 1;
}

static int save(app *x) {
  if (!x->a.save_dir) return 0;
  int rc = x->g.layer ? layer_save(&x->e, &x->g, &x->a, &x->L, &x->p, x->a.bwd, x->err, sizeof x->err)
                      : save_outputs(&x->e, &x->g, &x->a, &x->p, &x->r, x->err, sizeof x->err);
  return agree(x, rc != 0, EXIT_LIB_ERROR, x->err);
}

/* Gathers every rank's outcome; rank 0 prints the table, check and footer, and --json. */
static int finish(app *x, const rank_info *info, const rank_outcome *mine) {
  double slack = CHECK_SLACK_S + 10.0 * x->est_check_max;
  rank_outcome *all = x->e.rank == 0 ? calloc((size_t)x->e.size, sizeof *all) : NULL;
  mpienv_gather(&x->e, mine, all, (int)sizeof *mine, slack, "the results");
  int64_t wrong = mpienv_sum_i64(&x->e, mine->checked ? mine->check.wrong : 0, slack, "the check");
  int rc = wrong ? EXIT_WRONG : 0;
  if (x->e.rank == 0) {
    check_report merged;
    check_report *ranks = malloc((size_t)x->e.size * sizeof *ranks);
    for (int r = 0; r < x->e.size; r++)
      ranks[r] = all[r].check;
    check_merge(ranks, x->e.size, &merged);
    report_data d = report_of(x, info);
    d.out = all;
    d.check = mine->checked ? &merged : NULL;
    report_table(stdout, &d);
    report_footer(stdout, &d);
    if (x->a.json_path && report_json(x->a.json_path, &d)) {
      fprintf(stderr, "attnrun: --json %s: cannot append the record\n", x->a.json_path);
      rc = rc ? rc : EXIT_LIB_ERROR;
    }
    free(ranks);
  }
  free(all);
  return rc;
}

static int run_all(app *x) {
  rank_info *info = NULL;
  rank_outcome mine;
  memset(&mine, 0, sizeof mine);
  int rc = setup_problem(x);
  if (!rc) rc = setup_library(x);
  if (!rc) rc = header(x, &info);
  if (!rc) rc = inputs(x);
  if (!rc) rc = run_passes(x);
  if (!rc) {
    check(x, &mine);
    rc = save(x);
  }
  if (!rc) {
    mine.fwd = x->r.fwd, mine.bwd = x->r.bwd;
    mine.peak_rss = report_peak_rss();
    rc = finish(x, info, &mine);
  }
  free(info);
  return rc;
}

int main(int argc, char **argv) {
  blas_check_coretype(argv); /* may re-execute the program: before MPI starts */
  static app x;
  mpienv_init(&x.e, &argc, &argv);
  switch (args_parse(argc, argv, &x.a, x.err, sizeof x.err)) {
  case ARGS_HELP:
    if (x.e.rank == 0) args_usage(stdout, "attnrun");
    return mpienv_finish(&x.e, 0);
  case ARGS_ERROR: /* every rank parsed the same argv: all stop here, rank 0 says why */
    if (x.e.rank == 0) {
      fprintf(stderr, "attnrun: %s\n", x.err);
      args_usage_short(stderr, "attnrun");
    }
    return mpienv_finish(&x.e, EXIT_USAGE);
  case ARGS_OK:
    break;
  }
  if (x.a.list_devices) {
    if (x.e.rank == 0) gpu_list(stdout);
    return mpienv_finish(&x.e, 0);
  }
  mpienv_set_timeout(&x.e, x.a.timeout_s);
  bind_rank(&x.e, &x.a, &x.bind);
  int rc = run_all(&x);
  if (x.g.layer) layer_free(&x.L);
  run_free(&x.r);
  run_env_free(&x.env);
  problem_free(&x.p);
  return mpienv_finish(&x.e, rc);
}
