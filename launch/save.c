/* save.c — --save DIR for a single rank (the shard is the whole sequence): one .npy file
 * per tensor, in the layouts of DESIGN.md §2. */
#include "save.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int write4(const char *dir, const char *name, const float *data, int64_t d0, int64_t d1,
                  int64_t d2, int64_t d3, char *err, size_t errlen) {
  char path[PATH_MAX];
  int64_t shape[4] = {d0, d1, d2, d3};
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return npy_write(path, NPY_F32, 4, shape, data, err, errlen);
}

static int write1(const char *dir, const char *name, npy_dtype dt, const void *data, int64_t n,
                  char *err, size_t errlen) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return npy_write(path, dt, 1, &n, data, err, errlen);
}

static int same_dir(const char *x, const char *y) {
  char rx[PATH_MAX], ry[PATH_MAX];
  return x && y && realpath(x, rx) && realpath(y, ry) && strcmp(rx, ry) == 0;
}

static int save_inputs(const char *dir, const run_args *a, const problem *p, char *err,
                       size_t errlen) {
  const attn_spec *s = &p->spec;
  int64_t B = p->batch, hq = s->num_heads_q, hkv = s->num_heads_kv;
  if (write4(dir, "q.npy", p->q, B, p->seq_q, hq, s->head_dim_qk, err, errlen) ||
      write4(dir, "k.npy", p->k, B, p->seq_kv, hkv, s->head_dim_qk, err, errlen) ||
      write4(dir, "v.npy", p->v, B, p->seq_kv, hkv, s->head_dim_v, err, errlen))
    return -1;
  if (a->bwd && write4(dir, "do.npy", p->dout, B, p->seq_q, hq, s->head_dim_v, err, errlen))
    return -1;
  if (s->sinks && write1(dir, "sinks.npy", NPY_F32, s->sinks, hq, err, errlen)) return -1;
  if (s->alibi_slopes && write1(dir, "alibi.npy", NPY_F32, s->alibi_slopes, hq, err, errlen))
    return -1;
  if (s->num_seqs &&
      (write1(dir, "cu_seqlens_q.npy", NPY_I32, s->cu_seqlens_q, s->num_seqs + 1, err, errlen) ||
       write1(dir, "cu_seqlens_kv.npy", NPY_I32, s->cu_seqlens_kv, s->num_seqs + 1, err, errlen)))
    return -1;
  return 0;
}

int save_outputs(const run_args *a, const problem *p, const run_result *r, char *err,
                 size_t errlen) {
  const char *dir = a->save_dir;
  const attn_spec *s = &p->spec;
  int64_t B = p->batch, hq = s->num_heads_q, hkv = s->num_heads_kv;
  if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
    snprintf(err, errlen, "--save %s: cannot create the directory: %s", dir, strerror(errno));
    return -1;
  }
  if (!same_dir(dir, a->load_dir) && save_inputs(dir, a, p, err, errlen)) return -1;
  if (write4(dir, "o.npy", r->o, B, p->seq_q, hq, s->head_dim_v, err, errlen)) return -1;
  int64_t lse_shape[3] = {B, hq, p->seq_q};
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/lse.npy", dir);
  if (npy_write(path, NPY_F32, 3, lse_shape, r->lse, err, errlen)) return -1;
  if (!r->bwd.done) return 0;
  if (write4(dir, "dq.npy", r->dq, B, p->seq_q, hq, s->head_dim_qk, err, errlen) ||
      write4(dir, "dk.npy", r->dk, B, p->seq_kv, hkv, s->head_dim_qk, err, errlen) ||
      write4(dir, "dv.npy", r->dv, B, p->seq_kv, hkv, s->head_dim_v, err, errlen))
    return -1;
  return r->dsinks ? write1(dir, "dsinks.npy", NPY_F32, r->dsinks, hq, err, errlen) : 0;
}
