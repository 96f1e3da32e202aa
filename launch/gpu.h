/* gpu.h — which CUDA device each rank uses: the one nearest its bound cores by hwloc (the
 * device's PCI bus id, from the library, matched to hwloc's PCI object and the cpuset of
 * its nearest non-I/O ancestor); ranks of a host that tie spread over the tied devices by
 * local rank; --device N overrides. Also --list-devices. */
#ifndef ATTNRUN_LAUNCH_GPU_H
#define ATTNRUN_LAUNCH_GPU_H

#include <stdint.h>
#include <stdio.h>

#include "args.h"
#include "mpienv.h"

typedef struct {
  int32_t ordinal;  /* CUDA device ordinal; -1: this rank runs on the CPU */
  int32_t sharing;  /* ranks of this host on the same device (they share it) */
  char bus_id[24];  /* "0000:3b:00.0", or "?" */
  char near[64];    /* the cpuset nearest the device, or "?" when hwloc does not know */
  char how[48];     /* "nearest of 4", "--device", "local rank 1 mod 2 (no locality)" */
} gpu_info;

/* Chooses this rank's device among `count` visible ones (collective over the host's
 * ranks: *sharing). Never fails: without hwloc's PCI view the choice is by local rank. */
void gpu_choose(const mpienv *e, const run_args *a, int count, gpu_info *out);

/* No device: this rank runs on the CPU (ordinal -1, dashes in the table). */
void gpu_none(gpu_info *out);

/* --list-devices: one line per visible CUDA device (ordinal, bus id, nearest cpuset). */
void gpu_list(FILE *out);

#endif
