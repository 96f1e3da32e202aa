/* bind.c — CPU binding with hwloc. The ranks on one host (MPI_COMM_TYPE_SHARED) split
 * the host's allowed cores into consecutive, equal shares (the first ranks get one more
 * when they do not divide); with more ranks than cores each rank gets one core, shared
 * round-robin. The process (all its threads) is bound to the PUs of its share. */
#include "bind.h"

#include <hwloc.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The PUs of cores [first, first + count) of the allowed set. */
static hwloc_bitmap_t share_cpuset(hwloc_topology_t topo, int first, int count) {
  hwloc_const_bitmap_t allowed = hwloc_topology_get_allowed_cpuset(topo);
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  for (int c = first; c < first + count; c++) {
    hwloc_obj_t core = hwloc_get_obj_inside_cpuset_by_type(topo, allowed, HWLOC_OBJ_CORE, (unsigned)c);
    if (core) hwloc_bitmap_or(set, set, core->cpuset);
  }
  hwloc_bitmap_and(set, set, allowed);
  return set;
}

static int count_cores(hwloc_topology_t topo, hwloc_const_bitmap_t set) {
  int n = hwloc_get_nbobjs_inside_cpuset_by_type(topo, set, HWLOC_OBJ_CORE);
  return n > 0 ? n : 1;
}

/* This rank's share: cores [*first, *first + *count). */
static void my_share(int ncores, int local_rank, int local_size, int *first, int *count) {
  if (local_size > ncores) {
    *first = local_rank % ncores;
    *count = 1;
    return;
  }
  int per = ncores / local_size, extra = ncores % local_size;
  *first = local_rank * per + (local_rank < extra ? local_rank : extra);
  *count = per + (local_rank < extra);
}

static void describe(hwloc_const_bitmap_t set, bind_info *out) {
  if (hwloc_bitmap_list_snprintf(out->cpuset, sizeof out->cpuset, set) < 0)
    snprintf(out->cpuset, sizeof out->cpuset, "?");
}

static void bind_share(hwloc_topology_t topo, const mpienv *e, bind_info *out) {
  int ncores = count_cores(topo, hwloc_topology_get_allowed_cpuset(topo)), first, count;
  my_share(ncores, e->local_rank, e->local_size, &first, &count);
  hwloc_bitmap_t set = share_cpuset(topo, first, count);
  out->cores = count;
  out->host_cores = ncores;
  out->shared = e->local_size > ncores;
  if (hwloc_set_cpubind(topo, set, HWLOC_CPUBIND_PROCESS) == 0)
    snprintf(out->how, sizeof out->how, "%d of %d cores%s", count, ncores,
             out->shared ? " (shared)" : "");
  else
    snprintf(out->how, sizeof out->how, "not bound (hwloc refused)");
  describe(set, out);
  hwloc_bitmap_free(set);
}

static void keep_binding(hwloc_topology_t topo, bind_info *out) {
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  if (hwloc_get_cpubind(topo, set, HWLOC_CPUBIND_PROCESS) != 0)
    hwloc_bitmap_copy(set, hwloc_topology_get_allowed_cpuset(topo));
  out->cores = count_cores(topo, set);
  out->host_cores = count_cores(topo, hwloc_topology_get_allowed_cpuset(topo));
  snprintf(out->how, sizeof out->how, "launcher's binding (--no-bind)");
  describe(set, out);
  hwloc_bitmap_free(set);
}

/* Physical memory of the host: the OS's count (hwloc's NUMA total can miss memory that
 * was hot-plugged, as on some VMs), hwloc's when the OS does not say. */
static int64_t host_memory(hwloc_topology_t topo) {
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
  if (pages > 0 && size > 0) return (int64_t)pages * size;
  hwloc_obj_t root = hwloc_get_root_obj(topo);
  return root ? (int64_t)root->total_memory : 0;
}

void bind_rank(const mpienv *e, const run_args *a, bind_info *out) {
  memset(out, 0, sizeof *out);
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0 || hwloc_topology_load(topo) != 0) {
    snprintf(out->cpuset, sizeof out->cpuset, "?");
    snprintf(out->how, sizeof out->how, "not bound (no hwloc topology)");
    out->cores = out->host_cores = 1;
  } else {
    if (a->no_bind)
      keep_binding(topo, out);
    else
      bind_share(topo, e, out);
    out->node_mem = host_memory(topo);
    hwloc_topology_destroy(topo);
  }
  out->threads = a->threads > 0 ? a->threads : out->cores;
  omp_set_num_threads(out->threads);
}
