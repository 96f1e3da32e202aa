/* grid.h — how attnrun spreads a problem over the ranks: tp x cp (DESIGN.md §4), the
 * ring layout, this rank's heads and grid coordinates, and why (for --mode auto). */
#ifndef ATTNRUN_LAUNCH_GRID_H
#define ATTNRUN_LAUNCH_GRID_H

#include <stddef.h>
#include <stdint.h>

#include "args.h"
#include "attnrun.h"

#define GRID_LONG_SEQ 32768 /* auto: from this many keys on, cp before tp */

typedef struct {
  int single;  /* one rank, plain attn_fwd/attn_bwd, no group */
  int layer;   /* --d-model: attn_layer_* */
  int split_kv; /* cp > 1 with every query row on every CP rank: attn_split_kv_* */
  int32_t tp, cp;
  int32_t tp_rank, cp_rank; /* world rank = cp_rank * tp + tp_rank (TP groups consecutive) */
  attn_cp_layout layout;
  int32_t hq0, hq, hk0, hk; /* this rank's query heads and KV heads */
  char why[640];            /* the choice, in words (auto grid, layout) */
} grid;

/* Chooses and validates the grid for `ranks` ranks; `rank` is this rank. Every rank gets
 * the same answer for the same flags and shape. 0, or -1 with the reason in err (an
 * impossible grid: exit 2). */
int grid_choose(const run_args *a, const attn_spec *spec, int64_t seq_q, int64_t seq_kv,
                int ranks, int rank, grid *g, char *err, size_t errlen);

/* "ring", "tp", "tp x ring", "split-kv", "tp x split-kv", "single"; the ring ones with
 * " layer" for --d-model. */
const char *grid_mode_name(const grid *g);

#endif
