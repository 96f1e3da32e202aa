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
  attn_group_info info;
  attn_ring_step *steps; /* [steps_cap] record of the last ring call */
  int32_t nsteps, steps_cap;
};

/* Clears the step record (nsteps = 0) and makes room for n zeroed steps; the ring code
 * fills steps[0..n) and sets nsteps. */
attn_status attn__group_steps_reset(attn_group_t grp, int32_t n);

#endif
