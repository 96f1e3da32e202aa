/* emu.cc — the coroutine scheduler and the PTX fragment semantics behind emu.h: CUDA
 * threads as x86-64 coroutines on one OS thread, collectives with two alternating
 * exchange buffers, ldmatrix / mma.m16n8k16 written from the PTX ISA's layout tables. */
#include "emu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

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

namespace {

const size_t kStack = 512 * 1024;
const int kMaxGroups = 8;

struct pending_copy {
  void *dst;
  const void *src;
  int bytes, src_bytes;
  int group;
};

/* A wgmma.mma_async in flight: its operands as taken at the issue. */
struct wgmma_op {
  float *d;
  int n, scale_d, trans_b, bf16, group;
  uint64_t da, db;
  std::vector<float> a; /* [64][16] when A came from registers */
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
};

struct wg_slot {
  uint32_t a[4];
  uint64_t da, db;
  int n, scale_d, trans_b, bf16, has_a;
};

struct wg_state {
  int count;
  uint64_t gen;
  wg_slot slot[2][128];
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
};

enum { OP_SHFL = 1, OP_ANY, OP_SYNCWARP, OP_LDSM, OP_LDSM_T, OP_MMA_BF16, OP_MMA_F16 };

struct emulator {
  std::vector<thread_state> th;
  std::vector<warp_state> warps;
  std::vector<wg_state> wgs;
  std::unordered_map<uint32_t, mbarrier> mbars; /* by shared address */
  int nthreads = 0, cur = -1;
  void *sched_sp = nullptr;
  const std::function<void()> *body = nullptr;
  unsigned char *smem = nullptr;
  size_t smem_bytes = 0;
  int bar_count = 0;
  uint64_t bar_gen = 0;
  int bar_or = 0, bar_or_result = 0;
  uint64_t rng = 0x9E3779B97F4A7C15ull;
  size_t stacks_mapped = 0;
};

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
}

void run_block() {
  const int n = E.nthreads;
  for (int i = 0; i < n; i++) start_thread(E.th[i]);
  E.warps.assign((size_t)(n + 31) / 32, warp_state());
  E.wgs.assign((size_t)(n + 127) / 128, wg_state());
  E.mbars.clear();
  E.bar_count = 0;
  E.bar_or = 0;
  memset(E.smem, 0xFF, E.smem_bytes);
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
      progress = 1;
      if (t.done) alive--;
    }
    if (!progress) fail("deadlock: threads wait at a barrier or warp collective that others left");
  }
  for (const auto &mb : E.mbars)
    if (!mb.second.copies.empty()) fail("block ended with TMA copies that no thread waited for");
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

} // namespace

/* ---- public entry points ------------------------------------------------------------- */
void emu_launch(dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()> &body) {
  const int n = (int)(block.x * block.y * block.z);
  if (n <= 0 || n > 1024) fail("block size out of range");
  ensure_stacks(n);
  std::vector<unsigned char> smem(smem_bytes + 16);
  E.smem = smem.data();
  E.smem_bytes = smem_bytes;
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
  memset(smem_dst, 0xFF, (size_t)bytes); /* reads before the wait see NaN */
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
      if (c.src_bytes) memcpy(c.dst, c.src, (size_t)c.src_bytes);
      memset((unsigned char *)c.dst + c.src_bytes, 0, (size_t)(c.bytes - c.src_bytes));
    } else {
      keep.push_back(c);
    }
  }
  t.copies.swap(keep);
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

/* ---- sm_90: mbarriers, TMA, wgmma ------------------------------------------------------ */
uint32_t emu_smem_addr(const void *p) {
  check_smem(p, 1, "shared address");
  return (uint32_t)((const unsigned char *)p - E.smem);
}

/* Swizzle<B,4,3>: the 16-byte chunk bits [4, 4+B) XOR the 128-byte row bits [7, 7+B),
 * B = 3, 2, 1 for the 128-, 64- and 32-byte modes (a pattern of 8, 4 or 2 rows). */
uint32_t emu_swizzle(uint32_t addr, int swizzle_bytes) {
  const uint32_t bits = swizzle_bytes == 128 ? 7 : swizzle_bytes == 64 ? 3 : swizzle_bytes == 32 ? 1 : 0;
  return addr ^ (((addr >> 7) & bits) << 4);
}

namespace {
mbarrier &mbar_at(uint64_t *bar) {
  if ((uintptr_t)bar % 8) fail("mbarrier not 8-byte aligned");
  auto it = E.mbars.find(emu_smem_addr(bar));
  if (it == E.mbars.end()) fail("mbarrier used before mbarrier.init");
  return it->second;
}

void mbar_maybe_complete(mbarrier &m) {
  if (m.pending == 0 && m.tx == 0) {
    m.phase++;
    m.version++;
    m.pending = m.expected;
  }
}

/* Lands one TMA box: element (x0..x4) of the box at coordinates c + x (0 outside the
 * tensor), at the swizzled address of its row-major offset in the box. */
void tma_land(const tma_copy &c) {
  const emu_tmap &m = c.map;
  uint32_t box[5] = {1, 1, 1, 1, 1};
  for (int i = 0; i < m.rank; i++) box[i] = m.box[i];
  const uint32_t base = (uint32_t)(c.dst - E.smem), eb = (uint32_t)m.elem_bytes;
  uint32_t L = 0;
  for (uint32_t x4 = 0; x4 < box[4]; x4++)
    for (uint32_t x3 = 0; x3 < box[3]; x3++)
      for (uint32_t x2 = 0; x2 < box[2]; x2++)
        for (uint32_t x1 = 0; x1 < box[1]; x1++)
          for (uint32_t x0 = 0; x0 < box[0]; x0++, L += eb) {
            const uint32_t x[5] = {x0, x1, x2, x3, x4};
            const unsigned char *src = (const unsigned char *)m.base;
            int inside = 1;
            for (int i = 0; i < m.rank; i++) {
              const int64_t g = (int64_t)c.c[i] + x[i];
              if (g < 0 || g >= (int64_t)m.dims[i]) inside = 0;
              else src += (uint64_t)g * m.strides[i];
            }
            unsigned char *dst = E.smem + emu_swizzle(base + L, m.swizzle_bytes);
            if (inside) memcpy(dst, src, eb);
            else memset(dst, 0, eb);
          }
}
} // namespace

void emu_mbar_init(uint64_t *bar, int count) {
  check_smem(bar, 8, "mbarrier");
  if ((uintptr_t)bar % 8) fail("mbarrier not 8-byte aligned");
  if (count < 1) fail("mbarrier.init count must be positive");
  mbarrier m;
  m.expected = m.pending = count;
  m.tx = 0;
  m.phase = m.version = 0;
  E.mbars[emu_smem_addr(bar)] = m;
}

void emu_mbar_arrive(uint64_t *bar, uint32_t tx_bytes) {
  mbarrier &m = mbar_at(bar);
  m.tx += tx_bytes;
  if (m.pending <= 0) fail("mbarrier arrival past its count");
  m.pending--;
  mbar_maybe_complete(m);
}

void emu_mbar_wait(uint64_t *bar, int parity) {
  mbarrier &m = mbar_at(bar);
  for (;;) {
    std::vector<tma_copy> landing;
    landing.swap(m.copies);
    for (const tma_copy &c : landing) {
      tma_land(c);
      m.tx -= c.bytes;
      mbar_maybe_complete(m);
    }
    /* the phase of parity p has completed iff the current (incomplete) one has the other */
    if ((int)(m.phase & 1) != (parity & 1)) return;
    block_on(&m.version, m.version);
  }
}

void emu_tma_load(void *smem_dst, const emu_tmap *map, const int *coords, uint64_t *bar) {
  mbarrier &m = mbar_at(bar);
  tma_copy c;
  c.dst = (unsigned char *)smem_dst;
  c.map = *map;
  c.bytes = (uint32_t)map->elem_bytes;
  for (int i = 0; i < 5; i++) c.c[i] = i < map->rank ? coords[i] : 0;
  for (int i = 0; i < map->rank; i++) c.bytes *= map->box[i];
  if (map->swizzle_bytes && map->box[0] * (uint32_t)map->elem_bytes > (uint32_t)map->swizzle_bytes)
    fail("TMA box inner dimension wider than its swizzle span");
  const uint32_t align = map->swizzle_bytes ? 128u * (uint32_t)map->swizzle_bytes / 16u : 128u;
  if (emu_smem_addr(smem_dst) % align) fail("TMA destination not aligned to its swizzle pattern");
  check_smem(smem_dst, c.bytes, "TMA destination");
  memset(smem_dst, 0xFF, c.bytes); /* reads before the mbarrier wait see NaN */
  m.copies.push_back(c);
  m.version++;
}

/* ---- wgmma ---------------------------------------------------------------------------- */
namespace {
/* Byte offset of element (mn, k) of an operand from its descriptor's start address, by
 * the PTX ISA's canonical layouts (T = 8 16-bit elements = 16 bytes, W = swizzle bytes):
 *   K-major,  none: 8x16-byte core matrices: (mn%8)*16 + (mn/8)*SBO + (k%8)*2 + (k/8)*LBO
 *   K-major,  W:    rows of W bytes:         (mn%8)*W  + (mn/8)*SBO + k*2
 *   MN-major, none:                          (mn%8)*2  + (mn/8)*SBO + (k%8)*16 + (k/8)*LBO
 *   MN-major, W:    W/2 elements a row:      (mn%(W/2))*2 + (mn/(W/2))*LBO + (k%8)*W + (k/8)*SBO
 * then the swizzle of the mode on the resulting shared address. */
float desc_elem(uint64_t desc, int mn, int k, int mn_major, int bf16) {
  const uint32_t start = (uint32_t)(desc & 0x3FFF) << 4;
  const uint32_t lbo = (uint32_t)((desc >> 16) & 0x3FFF) << 4;
  const uint32_t sbo = (uint32_t)((desc >> 32) & 0x3FFF) << 4;
  if ((desc >> 49) & 7) fail("wgmma descriptor base offset != 0 is not modelled");
  const int mode = (int)(desc >> 62);
  const uint32_t W = mode == 1 ? 128 : mode == 2 ? 64 : mode == 3 ? 32 : 0;
  uint32_t off;
  if (!mn_major)
    off = W ? (mn % 8) * W + (mn / 8) * sbo + k * 2
            : (mn % 8) * 16 + (mn / 8) * sbo + (k % 8) * 2 + (k / 8) * lbo;
  else
    off = W ? (mn % (W / 2)) * 2 + (mn / (W / 2)) * lbo + (k % 8) * W + (k / 8) * sbo
            : (mn % 8) * 2 + (mn / 8) * sbo + (k % 8) * 16 + (k / 8) * lbo;
  const uint32_t addr = emu_swizzle(start + off, (int)W);
  check_smem(E.smem + addr, 2, "wgmma operand");
  uint16_t h;
  memcpy(&h, E.smem + addr, 2);
  return bf16 ? emu_bf16_to_float(h) : emu_f16_to_float(h);
}

/* The issuing thread's share of one op: rows 16w + g and + 8 of the warpgroup's 64, the
 * columns 8i + 2c + {0, 1} (w = warp in the group, g = lane / 4, c = lane % 4). */
void wgmma_execute(const wgmma_op &op, std::vector<float> &acc) {
  const int t = E.cur % 128, w = t / 32, g = (t % 32) / 4, c = t % 4;
  for (int i = 0; i < op.n / 8; i++)
    for (int e = 0; e < 4; e++) {
      const int row = 16 * w + g + (e >> 1) * 8, col = 8 * i + 2 * c + (e & 1);
      float s = op.scale_d ? acc[4 * i + e] : 0.0f;
      for (int k = 0; k < 16; k++) {
        const float a = op.a.empty() ? desc_elem(op.da, row, k, 0, op.bf16) : op.a[row * 16 + k];
        s += a * desc_elem(op.db, col, k, op.trans_b, op.bf16);
      }
      acc[4 * i + e] = s;
    }
}
} // namespace

void emu_wgmma_fence(void) { E.th[E.cur].wgmma_fenced = 1; }

void emu_wgmma_commit(void) {
  thread_state &t = E.th[E.cur];
  for (wgmma_op &op : t.wgmma)
    if (op.group < 0) op.group = t.wgmma_groups;
  t.wgmma_groups++;
}

void emu_wgmma_wait(int pending_groups) {
  thread_state &t = E.th[E.cur];
  const int limit = t.wgmma_groups - pending_groups;
  std::vector<wgmma_op> keep;
  for (const wgmma_op &op : t.wgmma) {
    if (op.group < 0) fail("wgmma.wait_group with an uncommitted wgmma.mma_async");
    if (op.group < limit) wgmma_execute(op, t.wgmma_acc[op.d]);
    else keep.push_back(op);
  }
  t.wgmma.swap(keep);
  for (auto it = t.wgmma_acc.begin(); it != t.wgmma_acc.end();) {
    int busy = 0;
    for (const wgmma_op &op : t.wgmma) busy |= op.d == it->first;
    if (busy) {
      ++it;
      continue;
    }
    memcpy(it->first, it->second.data(), it->second.size() * 4);
    it = t.wgmma_acc.erase(it);
  }
  t.wgmma_fenced = 0;
}

void emu_wgmma(float *d, int n, uint64_t desc_a, const uint32_t *a_regs, uint64_t desc_b,
               int scale_d, int trans_b, int is_bf16) {
  if (E.nthreads % 128) fail("wgmma in a block whose size is not a multiple of 128");
  if (n % 8 || n < 8 || n > 256) fail("wgmma N must be a multiple of 8 up to 256");
  thread_state &t = E.th[E.cur];
  if (!t.wgmma_fenced) fail("wgmma.mma_async without a wgmma.fence since the last wait");
  wg_state &w = E.wgs[(size_t)E.cur / 128];
  const int buf = (int)(w.gen & 1), me = E.cur % 128;
  wg_slot &s = w.slot[buf][me];
  for (int i = 0; i < 4; i++) s.a[i] = a_regs ? a_regs[i] : 0;
  s.da = desc_a;
  s.db = desc_b;
  s.n = n;
  s.scale_d = scale_d != 0;
  s.trans_b = trans_b;
  s.bf16 = is_bf16;
  s.has_a = a_regs != nullptr;
  const uint64_t gen = w.gen;
  if (++w.count == 128) {
    w.count = 0;
    w.gen++;
  } else {
    block_on(&w.gen, gen);
  }
  const wg_slot *all = w.slot[buf];
  for (int l = 0; l < 128; l++)
    if (all[l].db != s.db || all[l].n != n || all[l].scale_d != s.scale_d ||
        all[l].trans_b != trans_b || all[l].bf16 != is_bf16 || all[l].has_a != s.has_a ||
        (!s.has_a && all[l].da != desc_a))
      fail("threads of a warpgroup issued different wgmma operations");
  wgmma_op op;
  op.d = d;
  op.n = n;
  op.scale_d = s.scale_d;
  op.trans_b = trans_b;
  op.bf16 = is_bf16;
  op.group = -1;
  op.da = desc_a;
  op.db = desc_b;
  if (s.has_a) {
    /* the m16n8k16 A fragment of each warp's 16 rows: a0 = A[g][2c..], a1 = A[g+8][2c..],
     * a2 = A[g][2c+8..], a3 = A[g+8][2c+8..], low half first */
    op.a.assign(64 * 16, 0.0f);
    for (int l = 0; l < 128; l++) {
      const int r = 16 * (l / 32) + (l % 32) / 4, c = l % 4;
      for (int e = 0; e < 2; e++)
        for (int j = 0; j < 4; j++) {
          const uint16_t h = (uint16_t)(e ? all[l].a[j] >> 16 : all[l].a[j] & 0xFFFF);
          op.a[(r + (j & 1) * 8) * 16 + 2 * c + (j >> 1) * 8 + e] =
              is_bf16 ? emu_bf16_to_float(h) : emu_f16_to_float(h);
        }
    }
  }
  if (!t.wgmma_acc.count(d)) t.wgmma_acc[d].assign(d, d + n / 2);
  for (int i = 0; i < n / 2; i++) d[i] = NAN; /* in flight until the wait */
  t.wgmma.push_back(op);
}
