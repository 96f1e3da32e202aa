/* group.c — attn_group_t: a duplicate of the caller's communicator split into TP groups
 * (consecutive ranks) and CP groups (strided by tp), the per-step record of the last ring
 * call, and how a sequence is cut over the CP ranks (attn_cp_shard_rows). */
#include "group.h"

#include <mpi.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ---- configuration -------------------------------------------------------------------- */
static attn_status group_config(const attn_group_config *in, attn_group_config *cfg) {
  *cfg = (attn_group_config)ATTN_GROUP_CONFIG_INIT;
  if (!in) return ATTN_OK;
  if (in->size < offsetof(attn_group_config, timeout_s) || in->size > (1u << 16) ||
      in->version < 1 || in->version > ATTN_GROUP_CONFIG_VERSION)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "cfg size=%zu version=%u is not valid; initialise with "
                      "ATTN_GROUP_CONFIG_INIT",
                      in->size, in->version);
  memcpy(cfg, in, in->size < sizeof *cfg ? in->size : sizeof *cfg);
  cfg->size = sizeof *cfg;
  if (!(cfg->timeout_s >= 0))
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "cfg.timeout_s=%g must be >= 0 (0: env ATTN_TIMEOUT, else 300 s)",
                      cfg->timeout_s);
  return ATTN_OK;
}

/* Local checks only: anything whose answer could differ between ranks is decided after
 * the ranks have agreed on the configuration. */
static attn_status check_local(attn_group_t *out, attn_ctx_t ctx, const void *mpi_comm) {
  if (!out) return attn__fail(ATTN_ERR_INVALID_ARG, "out (attn_group_t *) is NULL");
  *out = NULL;
  if (!ctx) return attn__fail(ATTN_ERR_INVALID_ARG, "ctx is NULL; create one with attn_ctx_create");
  if (!mpi_comm)
    return attn__fail(ATTN_ERR_INVALID_ARG, "mpi_comm is NULL; pass a pointer to an MPI_Comm");
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "MPI is %s; call MPI_Init (or MPI_Init_thread) before attn_group_create",
                      fin ? "already finalized" : "not initialised");
  return ATTN_OK;
}

/* Every rank must pass the same grid; then tp * cp must be the communicator size. */
static attn_status check_grid(attn__comm *world, const attn_group_config *cfg) {
  attn__fingerprint fp = {0};
  attn__fp_add(&fp, "attnrun_version", attn_version());
  attn__fp_add(&fp, "group tp", cfg->tp);
  attn__fp_add(&fp, "group cp", cfg->cp);
  ATTN_CHECK(attn__comm_agree(world, &fp));
  if (cfg->tp < 1 || cfg->cp < 1 || (int64_t)cfg->tp * cfg->cp != world->size)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "tp=%d x cp=%d does not match the communicator size %d; choose tp, cp >= "
                      "1 with tp * cp = %d (e.g. tp=%d cp=1)",
                      cfg->tp, cfg->cp, world->size, world->size, world->size);
  return ATTN_OK;
}

/* ---- lifetime ------------------------------------------------------------------------ */
static void comm_destroy(attn__comm *c) {
  if (c) c->ops->destroy(c);
}

attn_status attn_group_destroy(attn_group_t grp) {
  if (!grp) return ATTN_OK;
  comm_destroy(grp->cp_dev); /* before the MPI communicators the staged ones borrow */
  comm_destroy(grp->tp_dev);
  comm_destroy(grp->world_dev);
  comm_destroy(grp->cp);
  comm_destroy(grp->tp);
  comm_destroy(grp->world);
  free(grp->steps);
  free(grp);
  return ATTN_OK;
}

/* ---- the device transport ------------------------------------------------------------- */
/* Buffers in device memory travel over NCCL when the build has it and every rank of the
 * group has a GPU of its own, else over the MPI-staged transport (ranks that share a GPU:
 * NCCL refuses duplicate devices). ATTN_COMM=nccl|mpi-staged forces one. Every input of
 * the choice is agreed or allgathered first, so all ranks choose alike (or fail alike). */
enum { COMM_AUTO = 0, COMM_STAGED = 1, COMM_NCCL = 2, COMM_BAD = 3 };
#define DEV_ID_BYTES 192

#ifdef ATTN_HAVE_NCCL
static const int have_nccl = 1;
#else
static const int have_nccl = 0;
#endif

static int comm_request(void) {
  const char *e = getenv("ATTN_COMM");
  if (!e || !*e || !strcmp(e, "auto")) return COMM_AUTO;
  if (!strcmp(e, "mpi-staged") || !strcmp(e, "staged")) return COMM_STAGED;
  if (!strcmp(e, "nccl")) return COMM_NCCL;
  return COMM_BAD;
}

/* First pair of world ranks whose devices are the same (*a = -1: none). ids [size][N]. */
static void first_shared(const char *ids, int n, int *a, int *b) {
  *a = *b = -1;
  for (int i = 0; i < n && *a < 0; i++)
    for (int j = i + 1; j < n; j++)
      if (!strncmp(ids + (size_t)i * DEV_ID_BYTES, ids + (size_t)j * DEV_ID_BYTES, DEV_ID_BYTES)) {
        *a = i, *b = j;
        break;
      }
}

static attn_status pick_transport(attn_group_t grp, int *nccl) {
  attn__comm *w = grp->world;
  char mine[DEV_ID_BYTES];
  memset(mine, 0, sizeof mine);
  attn_status local = grp->ctx->ops->device_id(grp->ctx, mine, sizeof mine - 1);
  const int req = comm_request();
  attn__fingerprint fp = {0};
  attn__fp_add(&fp, "ATTN_COMM (0 auto, 1 mpi-staged, 2 nccl, 3 not understood)", req);
  attn__fp_add(&fp, "device id known on this rank", local == ATTN_OK);
  ATTN_CHECK(attn__comm_agree(w, &fp));
  if (local != ATTN_OK) return local;
  if (req == COMM_BAD)
    return attn__fail(ATTN_ERR_INVALID_ARG,
                      "ATTN_COMM=%s is not a transport; use nccl, mpi-staged or auto",
                      getenv("ATTN_COMM"));
  char *ids = malloc((size_t)w->size * DEV_ID_BYTES);
  if (!ids) return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "device id table");
  attn_status st = w->ops->allgather(w, mine, ids, DEV_ID_BYTES);
  int a = -1, b = -1;
  if (st == ATTN_OK) first_shared(ids, w->size, &a, &b);
  free(ids);
  ATTN_CHECK(st);
  if (req == COMM_NCCL && !have_nccl)
    return attn__fail(ATTN_ERR_UNSUPPORTED,
                      "ATTN_COMM=nccl: this build has no NCCL (configure with NCCL found); use "
                      "ATTN_COMM=mpi-staged or auto");
  if (req == COMM_NCCL && a >= 0)
    return attn__fail(ATTN_ERR_UNSUPPORTED,
                      "ATTN_COMM=nccl: world ranks %d and %d share one GPU (%s), and NCCL needs "
                      "a GPU per rank; use ATTN_COMM=mpi-staged or auto",
                      a, b, mine);
  *nccl = req == COMM_NCCL || (req == COMM_AUTO && have_nccl && a < 0);
  attn__log(ATTN_LOG_INFO, "device transport: %s (%s; this rank's device %s)",
            *nccl ? "nccl" : "mpi-staged",
            req != COMM_AUTO ? "forced by ATTN_COMM"
            : a >= 0         ? "ranks share a GPU"
            : !have_nccl     ? "this build has no NCCL"
                             : "one GPU per rank",
            mine);
  return ATTN_OK;
}

static attn_status device_comms(attn_group_t grp, int32_t tp) {
  int nccl = 0;
  ATTN_CHECK(pick_transport(grp, &nccl));
  attn__comm *w = grp->world;
  attn_ctx_t ctx = grp->ctx;
  attn_status st = ATTN_ERR_UNSUPPORTED;
#ifdef ATTN_HAVE_NCCL
  if (nccl) st = attn__comm_nccl_create(w, ctx->cfg.device, ctx->cfg.stream, w->timeout_s, &grp->world_dev);
#endif
#ifdef ATTN_HAVE_CUDA
  if (!nccl) st = attn__comm_staged_create(w, ctx->cfg.stream, &grp->world_dev);
#endif
  if (st == ATTN_ERR_UNSUPPORTED && !grp->world_dev)
    return attn__fail(st, "backend %s has device memory but this build has no device transport",
                      ctx->ops->name);
  ATTN_CHECK(st);
  attn__comm *d = grp->world_dev;
  ATTN_CHECK(d->ops->split(d, w->rank / tp, w->rank, &grp->tp_dev));
  return d->ops->split(d, w->rank % tp, w->rank, &grp->cp_dev);
}

static attn_status group_split(attn_group_t grp, int32_t tp) {
  attn__comm *w = grp->world;
  ATTN_CHECK(w->ops->split(w, w->rank / tp, w->rank, &grp->tp));
  ATTN_CHECK(w->ops->split(w, w->rank % tp, w->rank, &grp->cp));
  grp->info = (attn_group_info){w->rank,       w->size,       grp->tp->rank,
                                grp->tp->size, grp->cp->rank, grp->cp->size};
  if (grp->tp->rank != w->rank % tp || grp->cp->rank != w->rank / tp)
    return attn__fail(ATTN_ERR_INTERNAL, "split gave tp_rank=%d cp_rank=%d for rank %d, tp=%d",
                      grp->tp->rank, grp->cp->rank, w->rank, tp);
  return ATTN_OK;
}

attn_status attn_group_create(attn_group_t *out, attn_ctx_t ctx, const void *mpi_comm,
                              const attn_group_config *cfg_in) {
  ATTN_CHECK(check_local(out, ctx, mpi_comm));
  attn_group_config cfg;
  ATTN_CHECK(group_config(cfg_in, &cfg));
  attn_group_t grp = calloc(1, sizeof *grp);
  if (!grp) return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "group allocation failed");
  grp->ctx = ctx;
  attn_status st;
  ATTN_CHECK_GOTO(attn__comm_mpi_create(mpi_comm, cfg.timeout_s, &grp->world), st, fail);
  ATTN_CHECK_GOTO(check_grid(grp->world, &cfg), st, fail);
  ATTN_CHECK_GOTO(group_split(grp, cfg.tp), st, fail);
  if (ctx->ops && ctx->ops->device != ATTN_DEVICE_HOST) /* (tests pass a bare ctx) */
    ATTN_CHECK_GOTO(device_comms(grp, cfg.tp), st, fail);
  attn__clear_error();
  *out = grp;
  return ATTN_OK;
fail:
  attn_group_destroy(grp);
  return st;
}

attn_status attn_group_abort(attn_group_t grp) {
  if (!grp) return attn__fail(ATTN_ERR_INVALID_ARG, "grp is NULL");
  attn__comm *comms[6] = {grp->cp_dev, grp->tp_dev, grp->world_dev, grp->cp, grp->tp, grp->world};
  for (int i = 0; i < 6; i++)
    if (comms[i]) comms[i]->ops->abort(comms[i], "the group was aborted (attn_group_abort)");
  return ATTN_OK;
}

attn_status attn_group_get_info(attn_group_t grp, attn_group_info *out) {
  if (!grp) return attn__fail(ATTN_ERR_INVALID_ARG, "grp is NULL");
  if (!out) return attn__fail(ATTN_ERR_INVALID_ARG, "out (attn_group_info *) is NULL");
  *out = grp->info;
  return ATTN_OK;
}

/* ---- the per-step record ------------------------------------------------------------ */
attn_status attn__group_steps_reset(attn_group_t grp, int32_t n) {
  if (n < 0) return attn__fail(ATTN_ERR_INTERNAL, "steps_reset: n=%d", n);
  if (n > grp->steps_cap) {
    attn_ring_step *s = realloc(grp->steps, (size_t)n * sizeof *s);
    if (!s) return attn__fail(ATTN_ERR_OUT_OF_MEMORY, "step record of %d steps", n);
    grp->steps = s;
    grp->steps_cap = n;
  }
  if (n) memset(grp->steps, 0, (size_t)n * sizeof *grp->steps);
  grp->nsteps = 0;
  return ATTN_OK;
}

attn_status attn_group_last_steps(attn_group_t grp, attn_ring_step *steps, int32_t max,
                                  int32_t *count) {
  if (!grp) return attn__fail(ATTN_ERR_INVALID_ARG, "grp is NULL");
  if (!count) return attn__fail(ATTN_ERR_INVALID_ARG, "count (int32_t *) is NULL");
  if (max < 0 || (max > 0 && !steps))
    return attn__fail(ATTN_ERR_INVALID_ARG, "steps=%p max=%d: need max >= 0 and steps for max > 0",
                      (void *)steps, max);
  int32_t n = grp->nsteps < max ? grp->nsteps : max;
  if (n) memcpy(steps, grp->steps, (size_t)n * sizeof *steps);
  *count = grp->nsteps;
  return ATTN_OK;
}

/* ---- sequence layout over the CP ranks ------------------------------------------------ */
/* Start of chunk c of n over seq rows: floor(c * seq / n) without overflow. */
static int64_t chunk_start(int64_t c, int64_t n, int64_t seq) {
  return c * (seq / n) + (c * (seq % n)) / n;
}

attn_status attn_cp_shard_rows(attn_cp_layout layout, int32_t cp, int32_t cp_rank, int64_t seq,
                               attn_cp_shard *out) {
  if (!out) return attn__fail(ATTN_ERR_INVALID_ARG, "out (attn_cp_shard *) is NULL");
  memset(out, 0, sizeof *out);
  if (layout != ATTN_LAYOUT_CONTIGUOUS && layout != ATTN_LAYOUT_ZIGZAG)
    return attn__fail(ATTN_ERR_INVALID_ARG, "layout=%d is not contiguous (0) or zigzag (1)",
                      (int)layout);
  if (cp < 1 || cp_rank < 0 || cp_rank >= cp)
    return attn__fail(ATTN_ERR_INVALID_ARG, "cp=%d cp_rank=%d: need cp >= 1 and 0 <= cp_rank < cp",
                      cp, cp_rank);
  if (seq < 0) return attn__fail(ATTN_ERR_INVALID_ARG, "seq=%lld must be >= 0", (long long)seq);
  int64_t n = layout == ATTN_LAYOUT_ZIGZAG ? 2 * (int64_t)cp : cp;
  int64_t chunks[2] = {cp_rank, n - 1 - cp_rank};
  out->count = layout == ATTN_LAYOUT_ZIGZAG ? 2 : 1;
  for (int i = 0; i < out->count; i++) {
    out->start[i] = chunk_start(chunks[i], n, seq);
    out->len[i] = chunk_start(chunks[i] + 1, n, seq) - out->start[i];
    out->rows += out->len[i];
  }
  return ATTN_OK;
}
