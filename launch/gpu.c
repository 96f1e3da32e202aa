/* gpu.c — CUDA device choice with hwloc. The topology is loaded with the important I/O
 * objects (PCI devices, not every bridge); each visible device's PCI bus id (from
 * attn_device_pci_bus_id: no CUDA headers here) finds its PCI object, and the cpuset of
 * the nearest non-I/O ancestor is its locality. A rank scores each device by how many of
 * its bound PUs lie in that locality; among the best it takes local rank modulo their
 * number, so ranks sharing a socket spread over that socket's devices, and more ranks
 * than devices share them round-robin. */
#include "gpu.h"

#include <hwloc.h>
#include <stdlib.h>
#include <string.h>

#include "attnrun.h"

#define GPU_MAX 64

typedef struct {
  int count;
  char bus[GPU_MAX][24];
  hwloc_bitmap_t near[GPU_MAX]; /* NULL when hwloc has no PCI object for the bus id */
} gpu_table;

static hwloc_topology_t load_io_topology(void) {
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return NULL;
  hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(topo) != 0) {
    hwloc_topology_destroy(topo);
    return NULL;
  }
  return topo;
}

static void table_fill(hwloc_topology_t topo, int count, gpu_table *t) {
  memset(t, 0, sizeof *t);
  t->count = count < GPU_MAX ? count : GPU_MAX;
  for (int d = 0; d < t->count; d++) {
    if (attn_device_pci_bus_id(d, t->bus[d], sizeof t->bus[d]) != ATTN_OK) {
      snprintf(t->bus[d], sizeof t->bus[d], "?");
      continue;
    }
    hwloc_obj_t pci = topo ? hwloc_get_pcidev_by_busidstring(topo, t->bus[d]) : NULL;
    hwloc_obj_t anc = pci ? hwloc_get_non_io_ancestor_obj(topo, pci) : NULL;
    if (anc && anc->cpuset) t->near[d] = hwloc_bitmap_dup(anc->cpuset);
  }
}

static void table_free(gpu_table *t) {
  for (int d = 0; d < t->count; d++)
    if (t->near[d]) hwloc_bitmap_free(t->near[d]);
}

static void near_string(const gpu_table *t, int d, char *buf, size_t len) {
  if (!t->near[d] || hwloc_bitmap_list_snprintf(buf, len, t->near[d]) < 0) snprintf(buf, len, "?");
}

/* PUs of the rank's binding within device d's locality (0 when unknown). */
static int score(const gpu_table *t, int d, hwloc_const_bitmap_t mine) {
  if (!t->near[d] || !mine) return 0;
  hwloc_bitmap_t x = hwloc_bitmap_alloc();
  hwloc_bitmap_and(x, t->near[d], mine);
  int w = hwloc_bitmap_weight(x);
  hwloc_bitmap_free(x);
  return w > 0 ? w : 0;
}

/* The best-scoring devices into best[]; returns how many, and the best score. */
static int nearest(const gpu_table *t, hwloc_const_bitmap_t mine, int *best, int *top) {
  int n = 0;
  *top = -1;
  for (int d = 0; d < t->count; d++) {
    int s = score(t, d, mine);
    if (s > *top) *top = s, n = 0;
    if (s == *top) best[n++] = d;
  }
  return n;
}

static void pick(hwloc_topology_t topo, const mpienv *e, const gpu_table *t, gpu_info *out) {
  hwloc_bitmap_t mine = hwloc_bitmap_alloc();
  if (!topo || hwloc_get_cpubind(topo, mine, HWLOC_CPUBIND_PROCESS) != 0) {
    hwloc_bitmap_free(mine);
    mine = NULL;
  }
  int best[GPU_MAX], top, n = nearest(t, mine, best, &top);
  out->ordinal = best[e->local_rank % n];
  if (top > 0)
    snprintf(out->how, sizeof out->how, "nearest%s", n > 1 ? " (tied: by local rank)" : "");
  else
    snprintf(out->how, sizeof out->how, "local rank %d mod %d (no locality)", e->local_rank, n);
  if (mine) hwloc_bitmap_free(mine);
}

/* How many ranks of this host use the same device. */
static int32_t sharing(const mpienv *e, int32_t ordinal) {
  int32_t *all = calloc((size_t)e->local_size, sizeof *all), n = 0;
  mpienv_node_allgather_int(e, ordinal, all, "choosing the devices");
  for (int r = 0; r < e->local_size; r++)
    n += all[r] == ordinal;
  free(all);
  return n;
}

void gpu_choose(const mpienv *e, const run_args *a, int count, gpu_info *out) {
  memset(out, 0, sizeof *out);
  hwloc_topology_t topo = load_io_topology();
  gpu_table t;
  table_fill(topo, count, &t);
  if (a->given & GIVEN_DEVICE) {
    out->ordinal = a->device;
    snprintf(out->how, sizeof out->how, "--device");
  } else {
    pick(topo, e, &t, out);
  }
  snprintf(out->bus_id, sizeof out->bus_id, "%s", out->ordinal < t.count ? t.bus[out->ordinal] : "?");
  if (out->ordinal < t.count) near_string(&t, out->ordinal, out->near, sizeof out->near);
  table_free(&t);
  if (topo) hwloc_topology_destroy(topo);
  out->sharing = sharing(e, out->ordinal);
}

void gpu_none(gpu_info *out) {
  memset(out, 0, sizeof *out);
  out->ordinal = -1;
  snprintf(out->bus_id, sizeof out->bus_id, "-");
  snprintf(out->near, sizeof out->near, "-");
  snprintf(out->how, sizeof out->how, "cpu backend");
}

void gpu_list(FILE *out) {
  int count = 0;
  attn_status st = attn_device_count(ATTN_BACKEND_CUDA, &count);
  fprintf(out, "cuda devices: %d", count);
  if (st != ATTN_OK) fprintf(out, " (%s)", attn_last_error());
  fprintf(out, "\n");
  if (count == 0) return;
  hwloc_topology_t topo = load_io_topology();
  gpu_table t;
  table_fill(topo, count, &t);
  for (int d = 0; d < t.count; d++) {
    char near[64];
    near_string(&t, d, near, sizeof near);
    fprintf(out, "  cuda:%d  pci %s  nearest cpus %s\n", d, t.bus[d], near);
  }
  table_free(&t);
  if (topo) hwloc_topology_destroy(topo);
}
