/* save.c — --save DIR for any number of ranks. Rank 0 creates each .npy file with its
 * header and full size; after a barrier every rank opens it and pwrites its rows (and
 * heads) at their offsets, so the files are the same bytes as a single rank's. DIR must be
 * visible to every rank (one host, or a shared file system). */
#include "save.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SAVE_SLACK_S 600.0 /* ranks write different amounts: allow for it in the waits */

static int path_of(char *path, size_t len, const char *dir, const char *name) {
  return snprintf(path, len, "%s/%s", dir, name) >= (int)len ? -1 : 0;
}

/* mkdir -p. */
static int make_dirs(const char *dir) {
  char path[PATH_MAX];
  if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) return -1;
  for (char *p = path + 1; *p; p++)
    if (*p == '/') {
      *p = '\0';
      if (mkdir(path, 0777) != 0 && errno != EEXIST) return -1;
      *p = '/';
    }
  return mkdir(path, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

/* Rank 0: the directory and every file, full size. */
static int create_all(const char *dir, const save_part *parts, int n, int64_t *offsets,
                      char *err, size_t errlen) {
  char path[PATH_MAX];
  if (make_dirs(dir) != 0) {
    snprintf(err, errlen, "--save %s: cannot create the directory: %s", dir, strerror(errno));
    return -1;
  }
  for (int i = 0; i < n; i++) {
    if (path_of(path, sizeof path, dir, parts[i].name) ||
        npy_create(path, parts[i].dtype, parts[i].ndim, parts[i].shape, &offsets[i], err, errlen))
      return -1;
  }
  return 0;
}

/* PART_ROWS: per batch and run, one write when every head is ours, else one per row.
 * A 3-D part [B, S, D] is one head. */
static int write_rows(int fd, const char *path, int64_t off, const save_part *p, char *err,
                      size_t errlen) {
  int64_t B = p->shape[0], S = p->shape[1], H = p->ndim == 4 ? p->shape[2] : 1;
  int64_t D = p->shape[p->ndim - 1];
  const float *src = p->data;
  int64_t row = p->hn * D;
  for (int64_t b = 0; b < B; b++)
    for (int32_t r = 0; r < p->sh->count; r++) {
      int64_t first = ((b * S + p->sh->start[r]) * H + p->h0) * D;
      if (p->hn == H) {
        if (npy_pwrite_range(fd, path, off, first, p->sh->len[r] * row, src, err, errlen)) return -1;
        src += p->sh->len[r] * row;
        continue;
      }
      for (int64_t i = 0; i < p->sh->len[r]; i++, src += row)
        if (npy_pwrite_range(fd, path, off, first + i * H * D, row, src, err, errlen)) return -1;
    }
  return 0;
}

/* PART_LSE: [B, H, S]; the local buffer is [B, hn, rows] with rows in run order. */
static int write_lse(int fd, const char *path, int64_t off, const save_part *p, char *err,
                     size_t errlen) {
  int64_t B = p->shape[0], H = p->shape[1], S = p->shape[2];
  const float *src = p->data;
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = p->h0; h < p->h0 + p->hn; h++)
      for (int32_t r = 0; r < p->sh->count; r++) {
        int64_t first = (b * H + h) * S + p->sh->start[r];
        if (npy_pwrite_range(fd, path, off, first, p->sh->len[r], src, err, errlen)) return -1;
        src += p->sh->len[r];
      }
  return 0;
}

static int write_part(const char *dir, const save_part *p, int64_t off, char *err,
                      size_t errlen) {
  char path[PATH_MAX];
  if (path_of(path, sizeof path, dir, p->name)) return -1;
  int fd = open(path, O_WRONLY);
  if (fd < 0) {
    snprintf(err, errlen, "%s: cannot open for writing: %s", path, strerror(errno));
    return -1;
  }
  int rc = p->kind == PART_ROWS  ? write_rows(fd, path, off, p, err, errlen)
           : p->kind == PART_LSE ? write_lse(fd, path, off, p, err, errlen)
                                 : npy_pwrite_range(fd, path, off, p->first, p->count, p->data,
                                                    err, errlen);
  if (close(fd) != 0 && rc == 0) {
    snprintf(err, errlen, "%s: close failed: %s", path, strerror(errno));
    rc = -1;
  }
  return rc;
}

int save_parts(const mpienv *e, const char *dir, const save_part *parts, int n, char *err,
               size_t errlen) {
  int64_t *offsets = calloc((size_t)n, sizeof *offsets);
  int rc = offsets ? 0 : -1;
  if (rc == 0 && e->rank == 0) rc = create_all(dir, parts, n, offsets, err, errlen);
  if (mpienv_max_int(e, rc, SAVE_SLACK_S, "--save: creating the files")) {
    if (rc == 0) snprintf(err, errlen, "--save %s: rank 0 could not create the files", dir);
    free(offsets);
    return -1;
  }
  MPI_Bcast(offsets, n, MPI_INT64_T, 0, MPI_COMM_WORLD);
  for (int i = 0; i < n && rc == 0; i++)
    if (parts[i].write) rc = write_part(dir, &parts[i], offsets[i], err, errlen);
  free(offsets);
  if (mpienv_max_int(e, rc, SAVE_SLACK_S, "--save: writing the files")) {
    if (rc == 0) snprintf(err, errlen, "--save %s: another rank failed to write its part", dir);
    return -1;
  }
  return 0;
}

/* ---- the attention problem's files ------------------------------------------------- */

typedef struct {
  save_part *parts;
  int n;
} part_list;

static void add_rows(part_list *l, const char *name, const problem *p, int is_q, int64_t dim,
                     const float *data, int write) {
  const attn_spec *s = &p->spec;
  save_part x = {.name = name, .dtype = NPY_F32, .ndim = 4, .kind = PART_ROWS, .data = data,
                 .write = write};
  x.shape[0] = p->batch;
  x.shape[1] = is_q ? p->seq_q : p->seq_kv;
  x.shape[2] = is_q ? s->num_heads_q : s->num_heads_kv;
  x.shape[3] = dim;
  x.sh = is_q ? &p->qsh : &p->ksh;
  x.h0 = is_q ? p->hq0 : p->hk0;
  x.hn = is_q ? p->hq : p->hk;
  l->parts[l->n++] = x;
}

static void add_flat(part_list *l, const char *name, npy_dtype dt, int64_t len, int64_t first,
                     int64_t count, const void *data, int write) {
  save_part x = {.name = name, .dtype = dt, .ndim = 1, .kind = PART_FLAT, .first = first,
                 .count = count, .data = data, .write = write};
  x.shape[0] = len;
  l->parts[l->n++] = x;
}

static int same_dir(const char *x, const char *y) {
  char rx[PATH_MAX], ry[PATH_MAX];
  return x && y && realpath(x, rx) && realpath(y, ry) && strcmp(rx, ry) == 0;
}

/* A KV head replicated over TP ranks (Hkv < tp) is written by the first rank holding it:
 * the one whose first query head is the KV head's first. True whenever KV is split. */
static int kv_writer(const problem *p) {
  return p->hq0 == p->hk0 * (p->spec.num_heads_q / p->spec.num_heads_kv);
}

/* Query-side rows (q, dO, O, LSE, dQ): split-KV gives every CP rank all of them, the same
 * bits, so CP rank 0 writes them. */
static int q_writer(const grid *g) { return !g->split_kv || g->cp_rank == 0; }

static void add_inputs(part_list *l, const mpienv *e, const grid *g, const run_args *a,
                       const problem *p) {
  const attn_spec *s = &p->spec;
  int kw = kv_writer(p), qw = q_writer(g), r0 = e->rank == 0;
  int64_t hq = s->num_heads_q, nseq = s->num_seqs + 1;
  add_rows(l, "q.npy", p, 1, s->head_dim_qk, p->q, qw);
  add_rows(l, "k.npy", p, 0, s->head_dim_qk, p->k, kw);
  add_rows(l, "v.npy", p, 0, s->head_dim_v, p->v, kw);
  if (a->bwd) add_rows(l, "do.npy", p, 1, s->head_dim_v, p->dout, qw);
  if (s->sinks) add_flat(l, "sinks.npy", NPY_F32, hq, 0, hq, s->sinks, r0);
  if (s->alibi_slopes) add_flat(l, "alibi.npy", NPY_F32, hq, 0, hq, s->alibi_slopes, r0);
  if (s->num_seqs) {
    add_flat(l, "cu_seqlens_q.npy", NPY_I32, nseq, 0, nseq, s->cu_seqlens_q, r0);
    add_flat(l, "cu_seqlens_kv.npy", NPY_I32, nseq, 0, nseq, s->cu_seqlens_kv, r0);
  }
}

static void add_outputs(part_list *l, const grid *g, const problem *p, const run_result *r) {
  const attn_spec *s = &p->spec;
  const int qw = q_writer(g);
  add_rows(l, "o.npy", p, 1, s->head_dim_v, r->o, qw);
  save_part lse = {.name = "lse.npy", .dtype = NPY_F32, .ndim = 3, .kind = PART_LSE,
                   .sh = &p->qsh, .h0 = p->hq0, .hn = p->hq, .data = r->lse, .write = qw};
  lse.shape[0] = p->batch, lse.shape[1] = s->num_heads_q, lse.shape[2] = p->seq_q;
  l->parts[l->n++] = lse;
  if (!r->bwd.done) return;
  add_rows(l, "dq.npy", p, 1, s->head_dim_qk, r->dq, qw);
  add_rows(l, "dk.npy", p, 0, s->head_dim_qk, r->dk, kv_writer(p));
  add_rows(l, "dv.npy", p, 0, s->head_dim_v, r->dv, kv_writer(p));
  if (r->dsinks) /* the CP group's (summed, or split-KV's replicated): written by CP rank 0 */
    add_flat(l, "dsinks.npy", NPY_F32, s->num_heads_q, p->hq0, p->hq, r->dsinks,
             g->cp_rank == 0);
}

int save_outputs(const mpienv *e, const grid *g, const run_args *a, const problem *p,
                 const run_result *r, char *err, size_t errlen) {
  save_part parts[16];
  part_list l = {parts, 0};
  /* every rank must agree on the file list: rank 0's view of the directories decides */
  int inputs = e->rank == 0 ? !same_dir(a->save_dir, a->load_dir) : 0;
  MPI_Bcast(&inputs, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (inputs) add_inputs(&l, e, g, a, p);
  add_outputs(&l, g, p, r);
  return save_parts(e, a->save_dir, parts, l.n, err, errlen);
}
