/* emu_internal.h — the CUDA emulator's shared state (threads, warps, warpgroups,
 * mbarriers, named barriers) and helpers, for its two sources: emu.cc (scheduler, warp
 * collectives, mma.sync, cp.async) and emu_sm90.cc (mbarriers, TMA, wgmma). Test-only. */
#ifndef ATTN_EMU_INTERNAL_H
#define ATTN_EMU_INTERNAL_H

#include "emu.h"

#include <stdint.h>

#include <memory>
#include <utility>
#include <unordered_map>
#include <vector>

namespace emu_detail {

const size_t kStack = 512 * 1024;
const int kMaxGroups = 8;

struct pending_copy {
  void *dst;
  const void *src;
  int bytes, src_bytes;
  int group;
};

/* The operands of one warpgroup-wide wgmma.mma_async, read once at the issue: A [64][16]
 * and B [n][16] as floats, and the shared addresses and bits of the elements read from
 * shared memory (re-read at the waits: they must not change before). */
struct wgmma_operands {
  std::vector<float> a, b;
  std::vector<uint32_t> addr;
  std::vector<uint16_t> bits;
  unsigned warps_checked = 0; /* warps of the group whose wait has re-read them */
  int retired = 0;            /* threads whose wait has retired it: in flight below 128 */
};

/* A wgmma.mma_async in flight: the warpgroup's operands, and this thread's A registers
 * as they were at the issue (a_src NULL when A came from shared memory). */
struct wgmma_op {
  float *d;
  int n, scale_d, group;
  std::shared_ptr<wgmma_operands> ops;
  const uint32_t *a_src;
  uint32_t a_val[4];
};

struct thread_state {
  void *sp;
  unsigned char *stack; /* mapping: guard page + kStack */
  int done;
  const uint64_t *wait_gen; /* blocked until *wait_gen != wait_val */
  uint64_t wait_val;
  std::vector<pending_copy> copies;
  int groups_committed;
  std::vector<wgmma_op> wgmma;
  std::unordered_map<float *, std::vector<float>> wgmma_acc; /* accumulators in flight */
  int wgmma_groups, wgmma_fenced;
  /* the registers (accumulators, A fragments) its wgmma issues have used, (address,
   * 32-bit words), and their values at its last wgmma.fence (wg_snap, concatenated) */
  std::vector<std::pair<const uint32_t *, int>> wg_regs;
  std::vector<uint32_t> wg_snap;
  uint64_t bar_arrived[16]; /* named barrier id: 1 + the phase this thread bar.arrive'd in, or 0 */
  uint64_t store_pages;     /* shared-memory pages holding its stores not yet fenced (bit p) */
  uint64_t bar_joined;      /* named barriers: the phase its warp's last arrival joined */
};

/* Who wrote shared memory (the generic proxy), for fence.proxy.async, which publishes only
 * the executing thread's stores. Thread stores are plain host stores, so the pages of the
 * block's shared memory are kept read-only: a thread's first store to a page in its time
 * slice faults, the page opens, and when the slice ends (or the thread fences) the open
 * pages are compared with their shadow: the bytes that changed are that thread's. Shared
 * memory ends at a no-access guard page (an overrun by a plain load or store faults). */
const size_t kPage = 4096;
const int kMaxPages = 64;
struct store_tracker {
  unsigned char *map = nullptr;   /* kMaxPages pages, then the guard page */
  unsigned char *alias = nullptr; /* the same kMaxPages pages, always writable */
  unsigned char *lo = nullptr;  /* the first page of the block's shared memory */
  int npages = 0;
  volatile int armed = 0;
  volatile int nopen = 0;
  int unknown = 0; /* some writer is -2: stored before arming, by an unknown thread */
  int open[kMaxPages]; /* pages opened in the running slice */
  unsigned char is_open[kMaxPages];
  std::vector<unsigned char> shadow; /* [npages * kPage] the generic view at the last attribution */
  std::vector<int16_t> writer;       /* [npages * kPage] the thread of an unfenced store, or -1 */
  /* Armed (the pages read-only) at a block's first sm_90 operation (mbarrier.init, TMA,
   * wgmma, fence.proxy.async, setmaxnreg): blocks of kernels without any pay nothing. */
};

struct tma_copy {
  unsigned char *dst;
  emu_tmap map;
  int c[5];
  uint32_t bytes;
};

struct mbarrier {
  int expected, pending;
  int64_t tx;
  uint64_t phase;   /* completed phases */
  uint64_t version; /* bumped at each completion and each TMA issue: what waiters watch */
  std::vector<tma_copy> copies;
  /* per thread: the phase its last wait returned for (-2: none yet; phase -1 is the one
   * "completed" before init, which a parity-1 wait on a fresh barrier finds) */
  std::vector<int64_t> seen;
};

struct wg_slot {
  uint32_t a[4];
  uint64_t da, db;
  int n, scale_d, trans_a, trans_b, bf16, has_a;
};

/* A TMA store in flight: the box as read at the issue, its bulk group (-1: uncommitted). */
struct bulk_store {
  const unsigned char *src;
  emu_tmap map;
  int c[5], group;
  std::vector<unsigned char> data; /* the box, in box order (unswizzled) */
};

/* A thread's cp.async.bulk state (kept with its warpgroup's: reset with every block). */
struct bulk_thread {
  std::vector<bulk_store> stores;
  int groups = 0;
};

struct wg_state {
  int count;
  uint64_t gen;
  wg_slot slot[2][128];
  std::shared_ptr<wgmma_operands> ops[2]; /* built by the last arrival */
  uint32_t fenced[4];      /* threads with fence.proxy.async since the last bulk commit */
  bulk_thread bulk[128];
  int regs;                /* setmaxnreg: the per-thread register count of its warps */
  int nreg_count, nreg_req[128];
  uint64_t nreg_gen;
};

struct warp_slot {
  uint32_t u[8];
  const void *ptr;
  float f;
};

struct warp_state {
  int count;
  uint64_t gen;
  int op[2];
  warp_slot slot[2][32];
  /* named barriers count whole warps: per id, the lanes at its arrival in progress, the
   * instruction (1 sync, 2 arrive) and count they executed, bumped when it completes */
  uint32_t nb_lanes[16];
  int nb_kind[16], nb_count[16];
  uint64_t nb_gen[16];
};

enum { OP_SHFL = 1, OP_ANY, OP_SYNCWARP, OP_LDSM, OP_LDSM_T, OP_MMA_BF16, OP_MMA_F16 };

/* A named barrier (bar.sync / bar.arrive id, count): arrivals in threads, 32 per warp. */
struct named_bar {
  int count, expected;
  uint64_t gen;
};
const int kNamedBars = 16;

struct emulator {
  std::vector<thread_state> th;
  std::vector<warp_state> warps;
  std::vector<wg_state> wgs;
  std::unordered_map<uint32_t, mbarrier> mbars; /* by shared address */
  std::vector<std::shared_ptr<wgmma_operands>> wgmma_inflight; /* not retired by every thread */
  int nthreads = 0, cur = -1;
  void *sched_sp = nullptr;
  const std::function<void()> *body = nullptr;
  unsigned char *smem = nullptr; /* the generic proxy's view */
  std::vector<unsigned char> async_smem; /* the async proxy's (emu.h) */
  size_t smem_bytes = 0;
  uint32_t smem_base = 0; /* shared address of smem[0] */
  int launch_regs = 0;    /* setmaxnreg: each warp's count at launch, the CTA's pool */
  int64_t reg_pool = 0;
  uint64_t reg_pool_gen = 0;
  int reg_waiters = 0; /* warpgroups blocked in setmaxnreg.inc */
  int bar_count = 0;
  uint64_t bar_gen = 0;
  int bar_or = 0, bar_or_result = 0;
  named_bar named[kNamedBars];
  store_tracker st;
  uint64_t rng = 0x9E3779B97F4A7C15ull;
  size_t stacks_mapped = 0;
};

extern emulator E;

[[noreturn]] void fail(const char *what);
/* Blocks the current thread until *gen != val (other threads run meanwhile). */
void block_on(const uint64_t *gen, uint64_t val);
/* Named barriers (emu.cc): a lane exited (its warp's arrivals may be complete now); the
 * warps only some of whose lanes are at a named barrier, reported (their number). */
void named_lane_exited(void);
int report_partial_warps(void);
/* Aborts with a message unless [p, p + bytes) lies in the block's shared memory. */
void check_smem(const void *p, size_t bytes, const char *what);
/* The generic view's byte at shared address addr ([addr, addr + bytes) bounds-checked), and
 * the async view's. */
unsigned char *smem_at(uint32_t addr, size_t bytes, const char *what);
unsigned char *async_at(uint32_t addr);
/* Shared memory for a launch (mapped once, ending at the guard page); arming (once a
 * block, at its first sm_90 operation); at block end writable again. */
void tracker_place(size_t smem_bytes);
void tracker_arm(void);
void tracker_disarm(void);
/* The running thread's stores since its slice began are attributed to it (store_tracker). */
void attribute_stores(void);
/* fence.proxy.async by the running thread: its attributed stores reach the async view. */
void publish_stores(void);
/* The emulator's own writes of shared memory, past the page protection: n bytes of src
 * (fill, where src is NULL) at dst, as thread who's store (cp.async: the generic proxy) or,
 * who -1, as no thread's (a TMA load, which writes the async view too, or poison). */
void smem_write(void *dst, const void *src, int fill, size_t n, int who);
/* The thread whose store to shared byte p is not yet fenced, or -1. */
int unfenced_writer(const unsigned char *p);

} // namespace emu_detail

#endif
