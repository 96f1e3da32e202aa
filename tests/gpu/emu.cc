/* emu.cc — the coroutine scheduler and the PTX fragment semantics behind emu.h: CUDA
 * threads as x86-64 coroutines on one OS thread, collectives with two alternating
 * exchange buffers, named barriers counted per warp, ldmatrix / mma.m16n8k16 written from
 * the PTX ISA's layout tables, and the record of which thread stored each shared-memory
 * byte (read-only pages, for fence.proxy.async). */
#include "emu_internal.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <unordered_map>
#include <vector>

#if !defined(__x86_64__)
#error "the CUDA emulator's context switch is written for x86-64"
#endif

dim3 emu_threadIdx, emu_blockIdx, emu_blockDim, emu_gridDim;

/* ---- context switch: save callee-saved registers, swap stacks ----------------------- */
extern "C" void emu_ctx_switch(void **save_sp, void *load_sp);
__asm__(
    ".text\n"
    ".globl emu_ctx_switch\n"
    ".type emu_ctx_switch,@function\n"
    "emu_ctx_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size emu_ctx_switch, .-emu_ctx_switch\n");

namespace emu_detail {

emulator E;

[[noreturn]] void fail(const char *what) {
  fprintf(stderr, "emu: %s (block %u,%u,%u thread %d)\n", what, emu_blockIdx.x, emu_blockIdx.y,
          emu_blockIdx.z, E.cur);
  abort();
}

uint64_t next_rand() {
  E.rng ^= E.rng << 13;
  E.rng ^= E.rng >> 7;
  E.rng ^= E.rng << 17;
  return E.rng;
}

void set_thread_index(int t) {
  emu_threadIdx.x = (unsigned)t % emu_blockDim.x;
  emu_threadIdx.y = (unsigned)t / emu_blockDim.x % emu_blockDim.y;
  emu_threadIdx.z = (unsigned)t / (emu_blockDim.x * emu_blockDim.y);
}

/* Back to the scheduler; returns when this thread is picked again. */
void yield_to_scheduler() {
  thread_state &t = E.th[E.cur];
  emu_ctx_switch(&t.sp, E.sched_sp);
}

void block_on(const uint64_t *gen, uint64_t val) {
  thread_state &t = E.th[E.cur];
  t.wait_gen = gen;
  t.wait_val = val;
  while (*gen == val) yield_to_scheduler();
  t.wait_gen = nullptr;
}

extern "C" void emu_thread_entry() {
  (*E.body)();
  thread_state &t = E.th[E.cur];
  if (!t.copies.empty()) fail("thread exited with cp.async copies never waited for");
  if (!t.wgmma.empty()) fail("thread exited with wgmma operations never waited for");
  t.done = 1;
  named_lane_exited();
  yield_to_scheduler();
  fail("finished thread resumed");
}

void ensure_stacks(int n) {
  if ((int)E.th.size() >= n) return;
  size_t old = E.th.size();
  E.th.resize((size_t)n);
  for (size_t i = old; i < (size_t)n; i++) {
    void *m = mmap(nullptr, kStack + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) fail("cannot map a coroutine stack");
    mprotect(m, 4096, PROT_NONE); /* guard page below the stack */
    E.th[i].stack = (unsigned char *)m;
  }
}

void start_thread(thread_state &t) {
  /* The first switch into the thread pops six zero registers and "returns" into
   * emu_thread_entry with the stack aligned as after a call. */
  uintptr_t top = ((uintptr_t)(t.stack + 4096 + kStack)) & ~(uintptr_t)15;
  uint64_t *sp = (uint64_t *)(top - 8 - 8 - 48);
  for (int i = 0; i < 6; i++) sp[i] = 0;
  sp[6] = (uint64_t)(uintptr_t)&emu_thread_entry;
  sp[7] = 0;
  t.sp = sp;
  t.done = 0;
  t.wait_gen = nullptr;
  t.copies.clear();
  t.groups_committed = 0;
  t.wgmma.clear();
  t.wgmma_acc.clear();
  t.wgmma_groups = 0;
  t.wgmma_fenced = 0;
  t.wg_regs.clear();
  t.wg_snap.clear();
  memset(t.bar_arrived, 0, sizeof t.bar_arrived);
  t.store_pages = 0;
}

void run_block() {
  const int n = E.nthreads;
  for (int i = 0; i < n; i++) start_thread(E.th[i]);
  E.warps.assign((size_t)(n + 31) / 32, warp_state());
  E.wgs.assign((size_t)(n + 127) / 128, wg_state());
  E.mbars.clear();
  E.wgmma_inflight.clear();
  E.bar_count = 0;
  E.bar_or = 0;
  for (named_bar &b : E.named) b = named_bar{0, 0, 0};
  memset(E.smem, 0xFF, E.smem_bytes);
  memset(E.async_smem.data(), 0xFF, E.smem_bytes);
  /* the dynamic shared memory of a block starts 16-byte aligned, not necessarily more
   * (after static shared memory on a GPU): 1024 + 16 j, j = 1 .. 63 */
  E.smem_base = 1024 + 16 * (uint32_t)(1 + next_rand() % 63);
  E.launch_regs = (65536 / n < 255 ? 65536 / n : 255) & ~7;
  E.reg_pool = 0;
  E.reg_waiters = 0;
  for (wg_state &w : E.wgs) w.regs = E.launch_regs;
  int alive = n;
  std::vector<int> order((size_t)n);
  for (int i = 0; i < n; i++) order[i] = i;
  while (alive > 0) {
    /* A fresh shuffled order each round: warps interleave differently every run. */
    for (int i = n - 1; i > 0; i--) {
      int j = (int)(next_rand() % (uint64_t)(i + 1));
      int x = order[i];
      order[i] = order[j];
      order[j] = x;
    }
    int progress = 0;
    for (int k = 0; k < n; k++) {
      int i = order[k];
      thread_state &t = E.th[i];
      if (t.done) continue;
      if (t.wait_gen && *t.wait_gen == t.wait_val) continue;
      E.cur = i;
      set_thread_index(i);
      emu_ctx_switch(&E.sched_sp, t.sp);
      if (E.st.nopen) attribute_stores(); /* the slice's stores were thread i's */
      progress = 1;
      if (t.done) alive--;
    }
    if (!progress) {
      if (report_partial_warps())
        fail("deadlock: lanes of a warp wait at a named barrier the rest of the warp never executes "
             "(bar.sync / bar.arrive count whole warps)");
      if (E.reg_waiters)
        fprintf(stderr, "emu: %d warpgroup(s) wait in setmaxnreg.inc for registers the CTA's pool (%lld) "
                        "never gets\n", E.reg_waiters, (long long)E.reg_pool);
      fail("deadlock: threads wait at a barrier or warp collective that others left");
    }
  }
  tracker_disarm();
  for (const named_bar &b : E.named)
    if (b.count) fail("block ended with a named barrier phase half-filled");
  for (const auto &mb : E.mbars)
    if (!mb.second.copies.empty()) fail("block ended with TMA copies that no thread waited for");
  /* a bulk group (TMA store, reduce) still reading shared memory when its block ends reads
   * memory the next block may own: each thread waits for its groups before it exits */
  for (const wg_state &w : E.wgs)
    for (const bulk_thread &b : w.bulk)
      if (!b.stores.empty()) fail("block ended with TMA stores / reduces their thread never waited for");
  E.cur = -1;
}

/* ---- warp collectives ---------------------------------------------------------------- */
struct arrival {
  warp_state *w;
  int buf, lane;
};

arrival arrive(int op) {
  if (E.nthreads % 32) fail("warp collective in a block whose size is not a multiple of 32");
  warp_state &w = E.warps[(size_t)E.cur / 32];
  int buf = (int)(w.gen & 1);
  if (w.count == 0) w.op[buf] = op;
  else if (w.op[buf] != op) fail("lanes of a warp reached different collectives (divergence)");
  return {&w, buf, E.cur % 32};
}

void complete(arrival a) {
  uint64_t g = a.w->gen;
  if (++a.w->count == 32) {
    a.w->count = 0;
    a.w->gen++;
  } else {
    block_on(&a.w->gen, g);
  }
}

void check_smem(const void *p, size_t bytes, const char *what) {
  const unsigned char *c = (const unsigned char *)p;
  if (c < E.smem || c + bytes > E.smem + E.smem_bytes) {
    fprintf(stderr, "emu: %s at smem offset %lld (+%zu) outside the %zu-byte shared memory\n",
            what, (long long)(c - E.smem), bytes, E.smem_bytes);
    fail("shared memory out of bounds");
  }
}

unsigned char *smem_at(uint32_t addr, size_t bytes, const char *what) {
  if (addr < E.smem_base) {
    fprintf(stderr, "emu: %s at shared address %u, below the block's dynamic shared memory (%u)\n", what,
            addr, E.smem_base);
    fail("shared memory out of bounds");
  }
  unsigned char *p = E.smem + (addr - E.smem_base);
  check_smem(p, bytes, what);
  return p;
}

unsigned char *async_at(uint32_t addr) { return E.async_smem.data() + (addr - E.smem_base); }

/* ---- who stored to shared memory (store_tracker, emu_internal.h) ---------------------- */
struct sigaction prev_segv;

void on_segv(int sig, siginfo_t *si, void *ctx) {
  store_tracker &T = E.st;
  unsigned char *a = (unsigned char *)si->si_addr;
  if (T.armed && a >= T.lo && a < T.lo + (size_t)T.npages * kPage) {
    const int p = (int)((size_t)(a - T.lo) / kPage);
    if (!T.is_open[p] && T.nopen < kMaxPages) {
      T.is_open[p] = 1;
      T.open[T.nopen++] = p;
      mprotect(T.lo + (size_t)p * kPage, kPage, PROT_READ | PROT_WRITE);
      return;
    }
  }
  if (T.map && a >= T.map + kMaxPages * kPage && a < T.map + (kMaxPages + 1) * kPage) {
    static const char msg[] = "emu: a plain load or store past the end of the block's shared memory\n";
    if (write(2, msg, sizeof msg - 1) < 0) { /* nothing more to do */
    }
  }
  /* not ours: the previous action, at the access's second fault */
  (void)sig;
  (void)ctx;
  sigaction(SIGSEGV, &prev_segv, nullptr);
}

/* Maps the pages shared memory lives in (once) and places a launch's smem_bytes (+ 16
 * bytes of slack, as before) so that they end at the guard page. */
void tracker_place(size_t smem_bytes) {
  store_tracker &T = E.st;
  if (!T.map) {
    const int fd = memfd_create("emu_smem", 0);
    if (fd < 0 || ftruncate(fd, (off_t)((kMaxPages + 1) * kPage))) fail("cannot create shared memory");
    void *m = mmap(nullptr, (kMaxPages + 1) * kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    void *a = mmap(nullptr, kMaxPages * kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED || a == MAP_FAILED) fail("cannot map shared memory");
    close(fd);
    T.map = (unsigned char *)m;
    T.alias = (unsigned char *)a;
    mprotect(T.map + kMaxPages * kPage, kPage, PROT_NONE);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &prev_segv);
  }
  const size_t bytes = (smem_bytes + 16 + 15) & ~(size_t)15;
  unsigned char *end = T.map + kMaxPages * kPage;
  E.smem = end - bytes;
  T.lo = T.map + (size_t)(E.smem - T.map) / kPage * kPage;
  T.npages = (int)((size_t)(end - T.lo) / kPage);
  memset(E.smem, 0, bytes);
}

/* The block's first async-proxy operation: the pages read-only from here on; a byte that
 * differs between the views now was stored by some thread before (unknown: the first
 * fence.proxy.async by any thread publishes it, as the model did for every store). */
void tracker_arm(void) {
  store_tracker &T = E.st;
  if (T.armed) return;
  const size_t n = (size_t)T.npages * kPage, lo = (size_t)(T.lo - E.smem);
  T.shadow.assign(T.lo, T.lo + n);
  T.writer.assign(n, -1);
  T.unknown = 0;
  for (size_t i = 0; i < n; i++) {
    const size_t off = i - lo; /* wraps below E.smem: never written there */
    if (T.lo + i >= E.smem && off < E.smem_bytes && T.lo[i] != E.async_smem[off]) {
      T.writer[i] = -2;
      T.unknown = 1;
    }
  }
  T.nopen = 0;
  memset(T.is_open, 0, sizeof T.is_open);
  mprotect(T.lo, n, PROT_READ);
  T.armed = 1;
}

void tracker_disarm() {
  store_tracker &T = E.st;
  if (!T.armed) return;
  T.armed = 0;
  mprotect(T.lo, (size_t)T.npages * kPage, PROT_READ | PROT_WRITE);
}

void attribute_stores(void) {
  store_tracker &T = E.st;
  const int n = T.nopen;
  if (!n) return;
  int p0 = T.open[0], p1 = T.open[0];
  for (int k = 1; k < n; k++) {
    p0 = T.open[k] < p0 ? T.open[k] : p0;
    p1 = T.open[k] > p1 ? T.open[k] : p1;
  }
  /* one call: the pages between the open ones are read-only already */
  mprotect(T.lo + (size_t)p0 * kPage, (size_t)(p1 - p0 + 1) * kPage, PROT_READ);
  for (int k = 0; k < n; k++) {
    const int p = T.open[k];
    unsigned char *pg = T.lo + (size_t)p * kPage, *sh = T.shadow.data() + (size_t)p * kPage;
    int16_t *wr = T.writer.data() + (size_t)p * kPage;
    T.is_open[p] = 0;
    for (size_t i = 0; i < kPage; i += 8) {
      uint64_t x, y;
      memcpy(&x, pg + i, 8);
      memcpy(&y, sh + i, 8);
      if (x == y) continue;
      for (size_t j = i; j < i + 8; j++)
        if (pg[j] != sh[j]) {
          if (pg + j < E.smem) fail("a thread stored below the block's shared memory");
          wr[j] = (int16_t)E.cur;
          sh[j] = pg[j];
        }
    }
    E.th[E.cur].store_pages |= 1ull << p;
  }
  T.nopen = 0;
}

void publish_stores(void) {
  attribute_stores();
  store_tracker &T = E.st;
  if (T.unknown) {
    for (size_t i = 0; i < T.writer.size(); i++)
      if (T.writer[i] == -2) {
        E.async_smem[(size_t)(T.lo + i - E.smem)] = T.lo[i];
        T.writer[i] = -1;
      }
    T.unknown = 0;
  }
  thread_state &t = E.th[E.cur];
  const int16_t me = (int16_t)E.cur;
  for (uint64_t m = t.store_pages; m; m &= m - 1) {
    const size_t p = (size_t)__builtin_ctzll(m);
    int16_t *wr = T.writer.data() + p * kPage;
    const unsigned char *pg = T.lo + p * kPage;
    for (size_t i = 0; i < kPage; i++)
      if (wr[i] == me) {
        E.async_smem[(size_t)(pg + i - E.smem)] = pg[i];
        wr[i] = -1;
      }
  }
  t.store_pages = 0;
}

void smem_write(void *dst, const void *src, int fill, size_t n, int who) {
  store_tracker &T = E.st;
  unsigned char *d = (unsigned char *)dst;
  const size_t off = (size_t)(d - T.map), lo = (size_t)(T.lo - T.map);
  if (src) memcpy(T.alias + off, src, n);
  else memset(T.alias + off, fill, n);
  if (!T.armed) return;
  memcpy(T.shadow.data() + (off - lo), T.alias + off, n);
  for (size_t i = 0; i < n; i++) T.writer[off - lo + i] = (int16_t)who;
  if (who >= 0)
    for (size_t p = (off - lo) / kPage; p <= (off - lo + n - 1) / kPage; p++) E.th[who].store_pages |= 1ull << p;
}

int unfenced_writer(const unsigned char *p) {
  const store_tracker &T = E.st;
  if (p < T.lo || p >= T.lo + (size_t)T.npages * kPage) return -1;
  return T.writer[(size_t)(p - T.lo)];
}

uint16_t bits_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7FFFu + ((u >> 16) & 1u);                                          /* RNE */
  return (uint16_t)(u >> 16);
}

uint16_t bits_f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u);
  if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* rounds to >= 65520: inf */
  if (a < 0x38800000u) {                                   /* subnormal half or zero */
    float x;
    memcpy(&x, &a, 4);
    float q = nearbyintf(x * 16777216.0f); /* units of 2^-24, RNE */
    return (uint16_t)(sign | (uint32_t)q);
  }
  uint32_t r = a + 0xFFFu + ((a >> 13) & 1u);
  return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

} // namespace emu_detail

using namespace emu_detail;

/* ---- public entry points ------------------------------------------------------------- */
void emu_launch(dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()> &body) {
  const int n = (int)(block.x * block.y * block.z);
  if (n <= 0 || n > 1024) fail("block size out of range");
  /* sm_90's opt-in maximum (cudaFuncAttributeMaxDynamicSharedMemorySize), the most any
   * device allows; sm_80 allows 163 KB */
  if (smem_bytes > 227 * 1024) fail("more than the 227 KB of dynamic shared memory a block may have");
  ensure_stacks(n);
  tracker_place(smem_bytes);
  E.smem_bytes = smem_bytes;
  E.async_smem.assign(smem_bytes + 16, 0xFF);
  E.nthreads = n;
  E.body = &body;
  emu_blockDim = block;
  emu_gridDim = grid;
  const uint64_t nblocks = (uint64_t)grid.x * grid.y * grid.z;
  std::vector<uint64_t> order(nblocks);
  for (uint64_t i = 0; i < nblocks; i++) order[i] = i;
  for (uint64_t i = nblocks; i > 1; i--) {
    uint64_t j = next_rand() % i, x = order[i - 1];
    order[i - 1] = order[j];
    order[j] = x;
  }
  for (uint64_t k = 0; k < nblocks; k++) {
    uint64_t b = order[k];
    emu_blockIdx.x = (unsigned)(b % grid.x);
    emu_blockIdx.y = (unsigned)(b / grid.x % grid.y);
    emu_blockIdx.z = (unsigned)(b / ((uint64_t)grid.x * grid.y));
    run_block();
  }
  E.smem = nullptr;
  E.body = nullptr;
}

unsigned char *emu_smem(void) { return E.smem; }

void emu_syncthreads(void) {
  uint64_t g = E.bar_gen;
  for (const pending_copy &c : E.th[E.cur].copies)
    if (c.group < 0) fail("__syncthreads with uncommitted cp.async copies");
  if (++E.bar_count == E.nthreads) {
    E.bar_count = 0;
    E.bar_or_result = E.bar_or;
    E.bar_or = 0;
    E.bar_gen++;
  } else {
    block_on(&E.bar_gen, g);
  }
}

namespace {
/* The live (not exited) lanes of warp w. */
uint32_t live_lanes(int w) {
  uint32_t m = 0;
  for (int l = 0; l < 32 && 32 * w + l < E.nthreads; l++)
    if (!E.th[(size_t)(32 * w + l)].done) m |= 1u << l;
  return m;
}

/* Warp w's arrival at named barrier id, once all its live lanes are in: 32 arrivals (PTX
 * ISA, barrier.cta: the barrier is executed per warp, as if all its threads were active;
 * a thread count must be a multiple of the warp size). */
void named_warp_arrives(int w, int id) {
  warp_state &ws = E.warps[(size_t)w];
  named_bar &b = E.named[id];
  const int count = ws.nb_count[id];
  if (b.count == 0) b.expected = count;
  else if (b.expected != count) fail("arrivals at a named barrier phase gave different counts");
  for (int l = 0; l < 32; l++)
    if ((ws.nb_lanes[id] >> l) & 1) E.th[(size_t)(32 * w + l)].bar_joined = b.gen;
  ws.nb_lanes[id] = 0;
  ws.nb_gen[id]++;
  b.count += 32;
  if (b.count == b.expected) {
    b.count = 0;
    b.gen++;
  }
}

/* One lane's arrival at named barrier id (kind 1 sync, 2 arrive): it waits for the other
 * live lanes of its warp (all must execute the same instruction: bar.sync / bar.arrive are
 * .aligned), then returns the phase its warp joined. */
uint64_t named_arrive(int id, int count, int kind) {
  if (id < 0 || id >= kNamedBars) fail("named barrier id outside 0-15");
  /* barrier 0 is __syncthreads' (bar.sync 0): the model keeps it apart, a GPU does not */
  if (id == 0) fail("named barrier 0 used with a count: it is the one __syncthreads uses");
  if (count <= 0 || count % 32 || count > E.nthreads) fail("named barrier count not a multiple of 32 within the block");
  thread_state &t = E.th[(size_t)E.cur];
  /* PTX ISA, barrier.cta: a warp that executed barrier.arrive must not execute another
   * barrier instruction on the same barrier before the barrier resets (unpredictable) */
  if (t.bar_arrived[id] == E.named[id].gen + 1)
    fail("a thread reused a named barrier it arrived at (bar.arrive) before the phase completed");
  const int w = E.cur / 32, lane = E.cur % 32;
  warp_state &ws = E.warps[(size_t)w];
  if (ws.nb_lanes[id] == 0) {
    ws.nb_kind[id] = kind;
    ws.nb_count[id] = count;
  } else if (ws.nb_kind[id] != kind || ws.nb_count[id] != count) {
    fprintf(stderr, "emu: named barrier %d: lanes of warp %d executed bar.%s %d and bar.%s %d\n", id, w,
            ws.nb_kind[id] == 1 ? "sync" : "arrive", ws.nb_count[id], kind == 1 ? "sync" : "arrive", count);
    fail("lanes of a warp executed different named-barrier instructions (they are per warp, .aligned)");
  }
  ws.nb_lanes[id] |= 1u << lane;
  const uint64_t g = ws.nb_gen[id];
  if (ws.nb_lanes[id] == live_lanes(w)) named_warp_arrives(w, id);
  else block_on(&ws.nb_gen[id], g);
  return t.bar_joined;
}

} // namespace

/* Deadlock: warps that only some lanes brought to a named barrier (each reported). */
int emu_detail::report_partial_warps(void) {
  int n = 0;
  for (size_t w = 0; w < E.warps.size(); w++)
    for (int id = 0; id < kNamedBars; id++)
      if (E.warps[w].nb_lanes[id]) {
        fprintf(stderr, "emu: named barrier %d: warp %zu has lanes 0x%08x of 0x%08x at bar.%s %d\n", id, w,
                E.warps[w].nb_lanes[id], live_lanes((int)w), E.warps[w].nb_kind[id] == 1 ? "sync" : "arrive",
                E.warps[w].nb_count[id]);
        n++;
      }
  return n;
}

/* A lane exited: its warp's arrivals in progress may now have every live lane. */
void emu_detail::named_lane_exited(void) {
  const int w = E.cur / 32;
  if ((size_t)w >= E.warps.size()) return;
  warp_state &ws = E.warps[(size_t)w];
  const uint32_t live = live_lanes(w);
  for (int id = 0; id < kNamedBars; id++)
    if (ws.nb_lanes[id] && ws.nb_lanes[id] == live) named_warp_arrives(w, id);
}

void emu_named_bar_sync(int id, int count) {
  const uint64_t g = named_arrive(id, count, 1);
  if (E.named[id].gen == g) block_on(&E.named[id].gen, g);
}

void emu_named_bar_arrive(int id, int count) {
  const uint64_t g = named_arrive(id, count, 2);
  if (E.named[id].gen == g) E.th[(size_t)E.cur].bar_arrived[id] = g + 1;
}

int emu_syncthreads_or(int pred) {
  if (pred) E.bar_or = 1;
  emu_syncthreads();
  return E.bar_or_result;
}

float emu_shfl_xor(float v, int lane_mask) {
  arrival a = arrive(OP_SHFL);
  a.w->slot[a.buf][a.lane].f = v;
  complete(a);
  return a.w->slot[a.buf][a.lane ^ lane_mask].f;
}

int emu_any(int pred) {
  arrival a = arrive(OP_ANY);
  a.w->slot[a.buf][a.lane].u[0] = pred != 0;
  complete(a);
  int any = 0;
  for (int l = 0; l < 32; l++) any |= (int)a.w->slot[a.buf][l].u[0];
  return any;
}

void emu_syncwarp(void) {
  arrival a = arrive(OP_SYNCWARP);
  complete(a);
}

/* ldmatrix.x4: lane l gives the address of row (l % 8) of matrix (l / 8). Lane t receives,
 * from each matrix i, row t/4, elements 2(t%4) and 2(t%4)+1 (low half first); with .trans
 * the elements at rows 2(t%4) and 2(t%4)+1 of column t/4. */
void emu_ldmatrix_x4(uint32_t r[4], const void *smem_row, int trans) {
  arrival a = arrive(trans ? OP_LDSM_T : OP_LDSM);
  if (((uintptr_t)smem_row & 15) != 0) fail("ldmatrix row address not 16-byte aligned");
  check_smem(smem_row, 16, "ldmatrix row");
  a.w->slot[a.buf][a.lane].ptr = smem_row;
  complete(a);
  const warp_slot *s = a.w->slot[a.buf];
  const int t = a.lane;
  for (int i = 0; i < 4; i++) {
    if (!trans) {
      const unsigned char *row = (const unsigned char *)s[i * 8 + t / 4].ptr;
      memcpy(&r[i], row + (t % 4) * 4, 4);
    } else {
      const unsigned char *r0 = (const unsigned char *)s[i * 8 + 2 * (t % 4)].ptr;
      const unsigned char *r1 = (const unsigned char *)s[i * 8 + 2 * (t % 4) + 1].ptr;
      uint16_t lo, hi;
      memcpy(&lo, r0 + (t / 4) * 2, 2);
      memcpy(&hi, r1 + (t / 4) * 2, 2);
      r[i] = (uint32_t)lo | ((uint32_t)hi << 16);
    }
  }
}

/* mma.sync.m16n8k16.row.col.f32.{bf16,f16}: with g = lane/4, c = lane%4,
 *   A (16x16): a0 = A[g][2c..2c+1], a1 = A[g+8][2c..], a2 = A[g][2c+8..], a3 = A[g+8][2c+8..]
 *   B (16x8):  b0 = B[2c..2c+1][g], b1 = B[2c+8..2c+9][g]
 *   C/D (16x8): d0,d1 = D[g][2c..2c+1], d2,d3 = D[g+8][2c..2c+1]. */
void emu_mma_16816(float d[4], const uint32_t a_in[4], uint32_t b0, uint32_t b1, int is_bf16) {
  arrival a = arrive(is_bf16 ? OP_MMA_BF16 : OP_MMA_F16);
  warp_slot &mine = a.w->slot[a.buf][a.lane];
  for (int i = 0; i < 4; i++) mine.u[i] = a_in[i];
  mine.u[4] = b0;
  mine.u[5] = b1;
  complete(a);
  const warp_slot *s = a.w->slot[a.buf];
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; l++) {
    int g = l / 4, c = l % 4;
    auto half = [&](uint32_t w, int hi) {
      uint16_t h = (uint16_t)(hi ? w >> 16 : w & 0xFFFF);
      return is_bf16 ? emu_bf16_to_float(h) : emu_f16_to_float(h);
    };
    for (int e = 0; e < 2; e++) {
      A[g][2 * c + e] = half(s[l].u[0], e);
      A[g + 8][2 * c + e] = half(s[l].u[1], e);
      A[g][2 * c + 8 + e] = half(s[l].u[2], e);
      A[g + 8][2 * c + 8 + e] = half(s[l].u[3], e);
      B[2 * c + e][g] = half(s[l].u[4], e);
      B[2 * c + 8 + e][g] = half(s[l].u[5], e);
    }
  }
  const int g = a.lane / 4, c = a.lane % 4;
  const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * c, 2 * c + 1, 2 * c, 2 * c + 1};
  for (int i = 0; i < 4; i++) {
    float acc = d[i];
    for (int k = 0; k < 16; k++) acc += A[rows[i]][k] * B[k][cols[i]];
    d[i] = acc;
  }
}

void emu_cp_async(void *smem_dst, const void *gmem_src, int bytes, int src_bytes) {
  if (bytes != 4 && bytes != 8 && bytes != 16) fail("cp.async size must be 4, 8 or 16");
  if (src_bytes != 0 && src_bytes != bytes) fail("cp.async src size must be 0 or the size");
  if (((uintptr_t)smem_dst % (uintptr_t)bytes) || ((uintptr_t)gmem_src % (uintptr_t)bytes))
    fail("cp.async addresses not aligned to the copy size");
  check_smem(smem_dst, (size_t)bytes, "cp.async destination");
  smem_write(smem_dst, nullptr, 0xFF, (size_t)bytes, E.cur); /* reads before the wait see NaN */
  E.th[E.cur].copies.push_back({smem_dst, gmem_src, bytes, src_bytes, -1});
}

void emu_cp_commit(void) {
  thread_state &t = E.th[E.cur];
  for (pending_copy &c : t.copies)
    if (c.group < 0) c.group = t.groups_committed;
  t.groups_committed++;
}

void emu_cp_wait(int pending_groups) {
  thread_state &t = E.th[E.cur];
  if (pending_groups > kMaxGroups) fail("cp.async.wait_group count too large");
  int limit = t.groups_committed - pending_groups; /* groups < limit complete */
  std::vector<pending_copy> keep;
  for (const pending_copy &c : t.copies) {
    if (c.group >= 0 && c.group < limit) {
      if (c.src_bytes) smem_write(c.dst, c.src, 0, (size_t)c.src_bytes, E.cur);
      if (c.bytes > c.src_bytes)
        smem_write((unsigned char *)c.dst + c.src_bytes, nullptr, 0, (size_t)(c.bytes - c.src_bytes), E.cur);
    } else {
      keep.push_back(c);
    }
  }
  t.copies.swap(keep);
}

void emu_atomic_add2(float *p, float a, float b) {
  if ((uintptr_t)p % 8) fail("float2 atomicAdd at an address that is not 8-byte aligned");
  p[0] += a;
  p[1] += b;
}

void emu_sem_wait(const int32_t *sem, int want) {
  if (*sem == want) return;
  char msg[160];
  snprintf(msg, sizeof msg,
           "semaphore wait for %d finds %d: the CTAs before this one (all finished) never make it %d",
           want, (int)*sem, want);
  fail(msg);
}

uint32_t emu_pack_bf16(float lo, float hi) {
  return (uint32_t)bits_f32_to_bf16(lo) | ((uint32_t)bits_f32_to_bf16(hi) << 16);
}

uint32_t emu_pack_f16(float lo, float hi) {
  return (uint32_t)bits_f32_to_f16(lo) | ((uint32_t)bits_f32_to_f16(hi) << 16);
}

float emu_bf16_to_float(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

float emu_f16_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  float f;
  if (e == 0) {
    f = ldexpf((float)m, -24);
    uint32_t u;
    memcpy(&u, &f, 4);
    u |= sign;
    memcpy(&f, &u, 4);
    return f;
  }
  uint32_t u = e == 31 ? sign | 0x7F800000u | (m << 13) : sign | ((e + 112) << 23) | (m << 13);
  memcpy(&f, &u, 4);
  return f;
}

void *emu_device_alloc(size_t bytes) {
  void *p = nullptr;
  if (posix_memalign(&p, 256, bytes ? bytes : 1)) return nullptr;
  return p;
}

void emu_device_free(void *p) { free(p); }
