/* group.h — the distributed group behind attn_group_t: the world, TP and CP
 * communicators, and the per-step record of the last ring call. */
#ifndef ATTN_GROUP_H
#define ATTN_GROUP_H

#include "../comm/comm.h"

struct attn_group_s {
  attn_ctx_t ctx;
  attn__comm *world; /* duplicate of the caller's communicator */
  attn__comm *tp;    /* consecutive ranks: world rank / tp == cp index */
  attn__comm *cp;    /* ranks with the same tp_rank, strided by tp */
  /* The same three groups over a device transport (NCCL or MPI-staged) when the context's
   * memory is device memory; NULL on a host context. Host data (agreement, verdicts)
   * always travels over the MPI communicators above. */
  attn__comm *world_dev, *tp_dev, *cp_dev;
  attn_group_info info;
  attn_ring_step *steps; /* [steps_cap] record of the last ring call */
  int32_t nsteps, steps_cap;
};

/* The communicators for buffers in the context's memory. */
static inline attn__comm *attn__group_tp_data(attn_group_t g) { return g->tp_dev ? g->tp_dev : g->tp; }
static inline attn__comm *attn__group_cp_data(attn_group_t g) { return g->cp_dev ? g->cp_dev : g->cp; }

/* Clears the step record (nsteps = 0) and makes room for n zeroed steps; the ring code
 * fills steps[0..n) and sets nsteps. */
attn_status attn__group_steps_reset(attn_group_t grp, int32_t n);

#endif
