/* bind.h — where each rank runs: hwloc binds the ranks on a host to equal shares of its
 * cores, OpenMP threads follow the share, and the result is described for the header
 * (like mpirun --report-bindings). */
#ifndef ATTNRUN_LAUNCH_BIND_H
#define ATTNRUN_LAUNCH_BIND_H

#include <stdint.h>

#include "args.h"
#include "mpienv.h"

typedef struct {
  char cpuset[64];   /* PUs this rank may run on, as a list ("0-3,8") */
  char how[48];      /* "bound to 2 of 8 cores", "launcher's binding", ... */
  int32_t threads;   /* OpenMP threads (--threads, else the cores of the share) */
  int32_t cores;     /* cores in the share */
  int32_t host_cores; /* cores this host allows */
  int32_t shared;    /* ranks on this host share cores (more ranks than cores) */
  int64_t node_mem;  /* bytes of memory on this host (0 unknown) */
} bind_info;

/* Binds this rank (unless --no-bind) and sets the OpenMP thread count. Never fails: when
 * hwloc cannot bind, `how` says so and the process keeps its binding. */
void bind_rank(const mpienv *e, const run_args *a, bind_info *out);

#endif
