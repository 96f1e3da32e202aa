/* emu_sm90.cc — the CUDA emulator's sm_90 model behind emu.h: mbarriers with transaction
 * counts, TMA tile loads and stores (bulk async-groups) with their swizzle and the
 * driver's tensor-map checks, the async proxy's view of shared memory and
 * fence.proxy.async, wgmma.mma_async (descriptors, canonical layouts, async groups) and
 * setmaxnreg, as the PTX ISA states them. Test-only. */
#include "emu_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

using namespace emu_detail;
/* ---- sm_90: mbarriers, TMA, wgmma ------------------------------------------------------ */
uint32_t emu_smem_addr(const void *p) {
  check_smem(p, 1, "shared address");
  return E.smem_base + (uint32_t)((const unsigned char *)p - E.smem);
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

const int64_t kMbarMax = (1 << 20) - 1; /* PTX ISA: the counts' range, +-(2^20 - 1) */

void mbar_maybe_complete(mbarrier &m) {
  if (m.tx > kMbarMax || m.tx < -kMbarMax) fail("mbarrier tx-count outside +-(2^20 - 1)");
  if (m.pending == 0 && m.tx == 0) {
    m.phase++;
    m.version++;
    m.pending = m.expected;
  }
}

/* Walks a TMA box at coordinates c: f(L, g) for each element x (x0 fastest), L = its
 * byte offset in the box (row-major), g = the global address of element c + x, or NULL
 * outside the tensor. */
template <class F> void box_walk(const emu_tmap &m, const int *c, F f) {
  uint32_t box[5] = {1, 1, 1, 1, 1};
  for (int i = 0; i < m.rank; i++) box[i] = m.box[i];
  const uint32_t eb = (uint32_t)m.elem_bytes;
  uint32_t L = 0;
  for (uint32_t x4 = 0; x4 < box[4]; x4++)
    for (uint32_t x3 = 0; x3 < box[3]; x3++)
      for (uint32_t x2 = 0; x2 < box[2]; x2++)
        for (uint32_t x1 = 0; x1 < box[1]; x1++)
          for (uint32_t x0 = 0; x0 < box[0]; x0++, L += eb) {
            const uint32_t x[5] = {x0, x1, x2, x3, x4};
            unsigned char *g = (unsigned char *)(uintptr_t)m.base;
            for (int i = 0; i < m.rank && g; i++) {
              const int64_t e = (int64_t)c[i] + x[i];
              if (e < 0 || e >= (int64_t)m.dims[i]) g = nullptr;
              else g += (uint64_t)e * m.strides[i];
            }
            f(L, g);
          }
}

/* A box's size in bytes (its inner width checked against the swizzle span); then
 * check_smem_box: the shared-memory end's alignment to the swizzle pattern and bounds. */
uint32_t box_bytes(const emu_tmap &map) {
  uint32_t bytes = (uint32_t)map.elem_bytes;
  for (int i = 0; i < map.rank; i++) bytes *= map.box[i];
  if (map.swizzle_bytes && map.box[0] * (uint32_t)map.elem_bytes > (uint32_t)map.swizzle_bytes)
    fail("TMA box inner dimension wider than its swizzle span");
  return bytes;
}

void check_smem_box(const void *p, const emu_tmap &map, uint32_t bytes, const char *what) {
  const uint32_t align = map.swizzle_bytes ? 128u * (uint32_t)map.swizzle_bytes / 16u : 128u;
  if (emu_smem_addr(p) % align) {
    fprintf(stderr, "emu: %s not aligned to its swizzle pattern\n", what);
    fail("TMA shared-memory box misaligned");
  }
  check_smem(p, bytes, what);
}

/* Lands one TMA box: element (x0..x4) of the box at coordinates c + x (0 outside the
 * tensor), at the swizzled address of its row-major offset in the box, in both views. */
void tma_land(const tma_copy &c) {
  const emu_tmap &m = c.map;
  const uint32_t base = emu_smem_addr(c.dst), eb = (uint32_t)m.elem_bytes;
  box_walk(m, c.c, [&](uint32_t L, const unsigned char *g) {
    const uint32_t a = emu_swizzle(base + L, m.swizzle_bytes);
    unsigned char *dst = smem_at(a, eb, "TMA load destination");
    smem_write(dst, g, 0, eb, -1);
    memcpy(async_at(a), dst, eb);
  });
}

/* A TMA store's box as one view of shared memory holds it now (async: what TMA reads), in
 * box order. */
std::vector<unsigned char> store_read(const bulk_store &s, int async) {
  const uint32_t base = emu_smem_addr(s.src), eb = (uint32_t)s.map.elem_bytes;
  std::vector<unsigned char> out(box_bytes(s.map));
  box_walk(s.map, s.c, [&](uint32_t L, const unsigned char *) {
    const uint32_t a = emu_swizzle(base + L, s.map.swizzle_bytes);
    const unsigned char *p = smem_at(a, eb, "TMA store source");
    memcpy(out.data() + L, async ? async_at(a) : p, eb);
  });
  return out;
}
} // namespace

int emu_tmap_encode(emu_tmap *m, const void *base, int rank, int elem_bytes, const uint64_t *dims,
                    const uint64_t *strides, const uint32_t *box, int swizzle_bytes) {
  if (rank < 1 || rank > 5 || (uintptr_t)base % 16) return -1;
  if (elem_bytes != 1 && elem_bytes != 2 && elem_bytes != 4 && elem_bytes != 8) return -1;
  if (swizzle_bytes != 0 && swizzle_bytes != 32 && swizzle_bytes != 64 && swizzle_bytes != 128) return -1;
  for (int i = 0; i < rank; i++) {
    if (dims[i] < 1 || dims[i] > ((uint64_t)1 << 32) || box[i] < 1 || box[i] > 256) return -1;
    if (i && (strides[i - 1] % 16 || strides[i - 1] >= ((uint64_t)1 << 40))) return -1;
  }
  const uint32_t inner = box[0] * (uint32_t)elem_bytes;
  if (inner % 16 || (swizzle_bytes && inner > (uint32_t)swizzle_bytes)) return -1;
  memset(m, 0, sizeof *m);
  m->base = base;
  m->rank = rank;
  m->elem_bytes = elem_bytes;
  m->swizzle_bytes = swizzle_bytes;
  for (int i = 0; i < rank; i++) {
    m->dims[i] = dims[i];
    m->box[i] = box[i];
    m->strides[i] = i ? strides[i - 1] : (uint64_t)elem_bytes;
  }
  return 0;
}

void emu_mbar_init(uint64_t *bar, int count) {
  tracker_arm();
  check_smem(bar, 8, "mbarrier");
  if ((uintptr_t)bar % 8) fail("mbarrier not 8-byte aligned");
  if (count < 1 || count > kMbarMax) fail("mbarrier.init count outside 1 .. 2^20 - 1");
  mbarrier m;
  m.expected = m.pending = count;
  m.tx = 0;
  m.phase = m.version = 0;
  m.seen.assign((size_t)E.nthreads, -2);
  E.mbars[emu_smem_addr(bar)] = m;
}

void emu_mbar_arrive(uint64_t *bar, uint32_t tx_bytes) {
  mbarrier &m = mbar_at(bar);
  m.tx += tx_bytes;
  if (m.pending <= 0) fail("mbarrier arrival past its count");
  m.pending--;
  mbar_maybe_complete(m);
}

/* try_wait.parity sees only the parity of the current phase, so the phase a thread means
 * is taken from its own history: the next one of that parity after the phase its last
 * wait returned for (the same phase again, when the barrier has not moved since: a
 * re-wait returns at once, on the GPU as here). A wait whose phase is two or more behind
 * the current one would hang (two behind) or pass by aliasing (three): an abort. */
void emu_mbar_wait(uint64_t *bar, int parity) {
  mbarrier &m = mbar_at(bar);
  const int64_t seen = m.seen[(size_t)E.cur];
  const int64_t c0 = (int64_t)m.phase;
  int64_t want = (((seen + 1) & 1) == (parity & 1)) ? seen + 1 : seen + 2;
  if (want == seen + 2 && c0 == seen + 1) want = seen; /* the phase it saw, again */
  for (;;) {
    std::vector<tma_copy> landing;
    landing.swap(m.copies);
    for (const tma_copy &c : landing) {
      tma_land(c);
      m.tx -= c.bytes;
      mbar_maybe_complete(m);
    }
    if ((int64_t)m.phase >= want + 2) {
      fprintf(stderr, "emu: mbarrier at shared address %u: parity-%d wait for phase %lld (this thread's last "
                      "wait returned for phase %lld) with %llu phases completed\n",
              emu_smem_addr(bar), parity & 1, (long long)want, (long long)seen, (unsigned long long)m.phase);
      fail("mbarrier parity wait on a phase two or more behind the current one (parity aliasing)");
    }
    /* the phase of parity p has completed iff the current (incomplete) one has the other */
    if ((int)(m.phase & 1) != (parity & 1)) break;
    block_on(&m.version, m.version);
  }
  m.seen[(size_t)E.cur] = (int64_t)m.phase - 1;
}

namespace {
/* A TMA load may not overwrite what the async proxy still reads: operands of a wgmma in
 * flight (in any thread) or the box of a TMA store not yet past its wait_group.read. */
void check_tma_overwrite(uint32_t dst, uint32_t bytes) {
  auto &fl = E.wgmma_inflight;
  for (size_t i = 0; i < fl.size();) {
    if (fl[i]->retired == 128) {
      fl[i] = fl.back();
      fl.pop_back();
      continue;
    }
    for (uint32_t a : fl[i]->addr)
      if (a - dst < bytes) {
        fprintf(stderr, "emu: shared address %u\n", a);
        fail("TMA load overwrites shared memory that a wgmma.mma_async in flight reads");
      }
    i++;
  }
  for (const wg_state &w : E.wgs)
    for (const bulk_thread &b : w.bulk)
      for (const bulk_store &st : b.stores) {
        const uint32_t s0 = emu_smem_addr(st.src), s1 = s0 + box_bytes(st.map);
        if (s0 < dst + bytes && dst < s1)
          fail("TMA load overwrites the box of a TMA store before its cp.async.bulk.wait_group.read");
      }
}
} // namespace

void emu_tma_load(void *smem_dst, const emu_tmap *map, const int *coords, uint64_t *bar) {
  tracker_arm();
  mbarrier &m = mbar_at(bar);
  tma_copy c;
  c.dst = (unsigned char *)smem_dst;
  c.map = *map;
  c.bytes = box_bytes(*map);
  for (int i = 0; i < 5; i++) c.c[i] = i < map->rank ? coords[i] : 0;
  check_smem_box(smem_dst, *map, c.bytes, "TMA load destination");
  check_tma_overwrite(emu_smem_addr(smem_dst), c.bytes);
  smem_write(smem_dst, nullptr, 0xFF, c.bytes, -1); /* reads before the mbarrier wait see NaN (both views) */
  memset(async_at(emu_smem_addr(smem_dst)), 0xFF, c.bytes);
  m.copies.push_back(c);
  m.version++;
}

/* ---- TMA stores: bulk async-groups (emu.h) ---------------------------------------------- */
namespace {
wg_state &my_wg(void) { return E.wgs[(size_t)E.cur / 128]; }
bulk_thread &my_bulk(void) { return my_wg().bulk[E.cur % 128]; }
} // namespace

/* The executing thread's stores so far (the bytes whose last store is its own) become
 * visible to the async proxy; other threads' stores do not. */
void emu_fence_proxy_async(void) {
  tracker_arm();
  const int me = E.cur % 128;
  my_wg().fenced[me / 32] |= 1u << (me % 32);
  publish_stores();
}

void emu_tma_store(const emu_tmap *map, const void *smem_src, const int *coords) {
  tracker_arm();
  wg_state &w = my_wg();
  const int base = E.cur / 128 * 128, nthr = E.nthreads - base < 128 ? E.nthreads - base : 128;
  for (int t = 0; t < nthr; t++)
    if (!((w.fenced[t / 32] >> (t % 32)) & 1)) {
      fprintf(stderr, "emu: thread %d of the warpgroup: no fence.proxy.async since the last bulk commit\n",
              t);
      fail("TMA store of shared memory without fence.proxy.async");
    }
  bulk_store s;
  s.src = (const unsigned char *)smem_src;
  s.map = *map;
  s.group = -1;
  for (int i = 0; i < 5; i++) s.c[i] = i < map->rank ? coords[i] : 0;
  check_smem_box(smem_src, *map, box_bytes(*map), "TMA store source");
  s.data = store_read(s, 1);
  const std::vector<unsigned char> now = store_read(s, 0);
  if (now != s.data) {
    attribute_stores();
    const uint32_t base = emu_smem_addr(smem_src), eb = (uint32_t)map->elem_bytes;
    int who = -1;
    box_walk(*map, s.c, [&](uint32_t L, const unsigned char *) {
      const unsigned char *g = smem_at(emu_swizzle(base + L, map->swizzle_bytes), eb, "TMA store source");
      for (uint32_t b = 0; b < eb && who < 0; b++)
        if (now[L + b] != s.data[L + b]) who = unfenced_writer(g + b);
    });
    fprintf(stderr, "emu: a byte of the box stored by thread %d (-1: none known) without a fence.proxy.async "
                    "of its own since\n", who);
    fail("TMA store of shared memory written by threads after the last fence.proxy.async");
  }
  my_bulk().stores.push_back(s);
}

void emu_bulk_commit(void) {
  bulk_thread &b = my_bulk();
  for (bulk_store &s : b.stores)
    if (s.group < 0) s.group = b.groups;
  b.groups++;
  wg_state &w = my_wg();
  for (uint32_t &f : w.fenced) f = 0;
}

/* Retires the thread's bulk groups but the newest pending_groups: each box must still be
 * what it was at the issue; then it is written to global memory, clipped to the tensor. */
void emu_bulk_wait_read(int pending_groups) {
  bulk_thread &b = my_bulk();
  const int limit = b.groups - pending_groups;
  std::vector<bulk_store> keep;
  for (const bulk_store &s : b.stores) {
    if (s.group < 0 || s.group >= limit) {
      keep.push_back(s);
      continue;
    }
    if (store_read(s, 0) != s.data || store_read(s, 1) != s.data)
      fail("shared memory of a TMA store changed before cp.async.bulk.wait_group.read");
    const uint32_t eb = (uint32_t)s.map.elem_bytes;
    box_walk(s.map, s.c, [&](uint32_t L, unsigned char *g) {
      if (g) memcpy(g, s.data.data() + L, eb);
    });
  }
  b.stores.swap(keep);
}

/* ---- wgmma ---------------------------------------------------------------------------- */
namespace {
/* Shared address of element (mn, k) of an operand, from its descriptor, by the PTX ISA's
 * canonical layouts (T = 8 16-bit elements = 16 bytes, W = swizzle bytes):
 *   K-major,  none: 8x16-byte core matrices: (mn%8)*16 + (mn/8)*SBO + (k%8)*2 + (k/8)*LBO
 *   K-major,  W:    rows of W bytes:         (mn%8)*W  + (mn/8)*SBO + k*2
 *   MN-major, none:                          (mn%8)*2  + (mn/8)*SBO + (k%8)*16 + (k/8)*LBO
 *   MN-major, W:    W/2 elements a row:      (mn%(W/2))*2 + (mn/(W/2))*LBO + (k%8)*W + (k/8)*SBO
 * then the swizzle of the mode on the resulting shared address. Base offset 0 means the
 * swizzle pattern (8 rows of W bytes) starts at an 8 W-aligned address: a K-major start
 * may only be stepped along k within the pattern's first row (its 16 k, 32 bytes, inside
 * the row), an MN-major one starts on the pattern itself. */
uint32_t desc_addr(uint64_t desc, int mn, int k, int mn_major) {
  const uint32_t start = (uint32_t)(desc & 0x3FFF) << 4;
  const uint32_t lbo = (uint32_t)((desc >> 16) & 0x3FFF) << 4;
  const uint32_t sbo = (uint32_t)((desc >> 32) & 0x3FFF) << 4;
  if ((desc >> 49) & 7) fail("wgmma descriptor base offset != 0 is not modelled");
  const int mode = (int)(desc >> 62);
  const uint32_t W = mode == 1 ? 128 : mode == 2 ? 64 : mode == 3 ? 32 : 0;
  if (W && start % (8 * W) > (mn_major ? 0u : W - 32))
    fail("wgmma descriptor start off its swizzle pattern's first row with base offset 0");
  uint32_t off;
  if (!mn_major)
    off = W ? (mn % 8) * W + (mn / 8) * sbo + k * 2
            : (mn % 8) * 16 + (mn / 8) * sbo + (k % 8) * 2 + (k / 8) * lbo;
  else
    off = W ? (mn % (W / 2)) * 2 + (mn / (W / 2)) * lbo + (k % 8) * W + (k / 8) * sbo
            : (mn % 8) * 2 + (mn / 8) * sbo + (k % 8) * 16 + (k / 8) * lbo;
  return emu_swizzle(start + off, (int)W);
}

float half_to_float(uint16_t h, int bf16) { return bf16 ? emu_bf16_to_float(h) : emu_f16_to_float(h); }

/* One operand from shared memory, rows mn < rows, into out [rows][16]; its addresses and
 * bits go to o. The bytes must be the same in both views: a thread store without a
 * fence.proxy.async since would be invisible to (or race with) the async proxy. */
void read_operand(wgmma_operands &o, std::vector<float> &out, uint64_t desc, int rows, int mn_major, int bf16) {
  out.assign((size_t)rows * 16, 0.0f);
  for (int mn = 0; mn < rows; mn++)
    for (int k = 0; k < 16; k++) {
      const uint32_t a = desc_addr(desc, mn, k, mn_major);
      uint16_t h, ha;
      memcpy(&h, smem_at(a, 2, "wgmma operand"), 2);
      memcpy(&ha, async_at(a), 2);
      if (h != ha) {
        attribute_stores();
        const unsigned char *g = smem_at(a, 2, "wgmma operand");
        const int w0 = unfenced_writer(g), w1 = unfenced_writer(g + 1);
        const int who = w0 >= 0 ? w0 : w1;
        fprintf(stderr, "emu: wgmma operand element (%d, %d) at shared address %u, stored by thread %d "
                        "(-1: none known) without a fence.proxy.async of its own since\n", mn, k, a, who);
        fail("wgmma reads shared memory that threads wrote without a fence.proxy.async after");
      }
      o.addr.push_back(a);
      o.bits.push_back(h);
      out[(size_t)mn * 16 + k] = half_to_float(h, bf16);
    }
}

/* The warpgroup's operands of an issue (slots of all 128 threads), once, by its last
 * arrival. */
std::shared_ptr<wgmma_operands> build_operands(const wg_slot *all) {
  const wg_slot &s = all[0];
  for (int l = 0; l < 128; l++)
    if (all[l].db != s.db || all[l].n != s.n || all[l].scale_d != s.scale_d || all[l].trans_a != s.trans_a ||
        all[l].trans_b != s.trans_b || all[l].bf16 != s.bf16 || all[l].has_a != s.has_a ||
        (!s.has_a && all[l].da != s.da))
      fail("threads of a warpgroup issued different wgmma operations");
  auto o = std::make_shared<wgmma_operands>();
  if (s.has_a) {
    /* the m16n8k16 A fragment of each warp's 16 rows: a0 = A[g][2c..], a1 = A[g+8][2c..],
     * a2 = A[g][2c+8..], a3 = A[g+8][2c+8..], low half first */
    o->a.assign(64 * 16, 0.0f);
    for (int l = 0; l < 128; l++) {
      const int r = 16 * (l / 32) + (l % 32) / 4, c = l % 4;
      for (int e = 0; e < 2; e++)
        for (int j = 0; j < 4; j++) {
          const uint16_t h = (uint16_t)(e ? all[l].a[j] >> 16 : all[l].a[j] & 0xFFFF);
          o->a[(size_t)(r + (j & 1) * 8) * 16 + 2 * c + (j >> 1) * 8 + e] = half_to_float(h, s.bf16);
        }
    }
  } else {
    read_operand(*o, o->a, s.da, 64, s.trans_a, s.bf16);
  }
  read_operand(*o, o->b, s.db, s.n, s.trans_b, s.bf16);
  return o;
}

/* The NaN the accumulators hold while in flight, a signalling one: a store to them, or
 * arithmetic on them (which quiets it), shows as another value. */
const uint32_t kInFlight = 0x7F80F11Fu;

/* The issuing thread's share of one op: rows 16w + g and + 8 of the warpgroup's 64, the
 * columns 8i + 2c + {0, 1} (w = warp in the group, g = lane / 4, c = lane % 4). */
void wgmma_execute(const wgmma_op &op, std::vector<float> &acc) {
  const int t = E.cur % 128, w = t / 32, g = (t % 32) / 4, c = t % 4;
  const wgmma_operands &o = *op.ops;
  for (int i = 0; i < op.n / 8; i++)
    for (int e = 0; e < 4; e++) {
      const int row = 16 * w + g + (e >> 1) * 8, col = 8 * i + 2 * c + (e & 1);
      float s = op.scale_d ? acc[4 * i + e] : 0.0f;
      for (int k = 0; k < 16; k++) s += o.a[(size_t)row * 16 + k] * o.b[(size_t)col * 16 + k];
      acc[4 * i + e] = s;
    }
}

/* At the wait that retires op: its shared-memory operands (re-read once per warp) and this
 * thread's A registers are as at the issue, its accumulators untouched. */
void check_unchanged(const wgmma_op &op) {
  wgmma_operands &o = *op.ops;
  const unsigned warp = 1u << ((E.cur % 128) / 32);
  if (!(o.warps_checked & warp)) {
    o.warps_checked |= warp;
    for (size_t i = 0; i < o.addr.size(); i++) {
      uint16_t h, ha;
      memcpy(&h, smem_at(o.addr[i], 2, "wgmma operand"), 2);
      memcpy(&ha, async_at(o.addr[i]), 2);
      if (h != o.bits[i] || ha != o.bits[i]) {
        fprintf(stderr, "emu: wgmma operand at shared address %u\n", o.addr[i]);
        fail("shared memory read by a wgmma.mma_async changed before its wgmma.wait_group");
      }
    }
  }
  if (op.a_src && memcmp(op.a_src, op.a_val, sizeof op.a_val))
    fail("A-fragment registers of a wgmma.mma_async changed before its wgmma.wait_group");
  for (int i = 0; i < op.n / 2; i++) {
    uint32_t u;
    memcpy(&u, &op.d[i], 4);
    if (u != kInFlight) fail("accumulator registers of a wgmma.mma_async written before its wgmma.wait_group");
  }
}
} // namespace

/* The thread's wgmma registers as they are at the fence: a wgmma.mma_async issued after it
 * must find its accumulators (unless in flight: chained, implicitly ordered) and A
 * fragments unchanged (PTX ISA, wgmma.fence: it must sit between a register access and the
 * wgmma.mma_async that accesses the same registers). Registers are known from the
 * thread's earlier issues: a loop's first iteration goes unchecked. */
void emu_wgmma_fence(void) {
  thread_state &t = E.th[E.cur];
  t.wgmma_fenced = 1;
  t.wg_snap.clear();
  for (const auto &r : t.wg_regs) t.wg_snap.insert(t.wg_snap.end(), r.first, r.first + r.second);
}

namespace {
/* At an issue: the registers [p, p + words) against their values at the fence (when
 * known), then known for the next fence. */
void check_fenced_regs(thread_state &t, const uint32_t *p, int words, const char *what) {
  size_t off = 0;
  for (const auto &r : t.wg_regs) {
    if (r.first == p && r.second == words) {
      if (off + (size_t)words <= t.wg_snap.size() && memcmp(t.wg_snap.data() + off, p, (size_t)words * 4)) {
        fprintf(stderr, "emu: wgmma.mma_async %s registers at %p (%d words)\n", what, (const void *)p, words);
        fail("wgmma registers written between the wgmma.fence and the wgmma.mma_async that uses them");
      }
      return;
    }
    off += (size_t)r.second;
  }
  if (t.wg_regs.size() < 64) t.wg_regs.push_back({p, words});
}
} // namespace

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
    if (op.group < limit) {
      check_unchanged(op);
      wgmma_execute(op, t.wgmma_acc[op.d]);
      op.ops->retired++;
    } else {
      keep.push_back(op);
    }
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
               int scale_d, int trans_a, int trans_b, int is_bf16) {
  if (E.nthreads % 128) fail("wgmma in a block whose size is not a multiple of 128");
  if (n % 8 || n < 8 || n > 256) fail("wgmma N must be a multiple of 8 up to 256");
  if (a_regs && trans_a) fail("wgmma with A from registers cannot transpose A");
  tracker_arm();
  thread_state &t = E.th[E.cur];
  if (!t.wgmma_fenced) fail("wgmma.mma_async without a wgmma.fence since the last wait");
  if (!t.wgmma_acc.count(d)) check_fenced_regs(t, (const uint32_t *)d, n / 2, "accumulator");
  if (a_regs) check_fenced_regs(t, a_regs, 4, "A-fragment");
  wg_state &w = E.wgs[(size_t)E.cur / 128];
  const int buf = (int)(w.gen & 1), me = E.cur % 128;
  wg_slot &s = w.slot[buf][me];
  for (int i = 0; i < 4; i++) s.a[i] = a_regs ? a_regs[i] : 0;
  s.da = desc_a;
  s.db = desc_b;
  s.n = n;
  s.scale_d = scale_d != 0;
  s.trans_a = trans_a;
  s.trans_b = trans_b;
  s.bf16 = is_bf16;
  s.has_a = a_regs != nullptr;
  const uint64_t gen = w.gen;
  if (++w.count == 128) {
    w.ops[buf] = build_operands(w.slot[buf]);
    E.wgmma_inflight.push_back(w.ops[buf]);
    w.count = 0;
    w.gen++;
  } else {
    block_on(&w.gen, gen);
  }
  wgmma_op op;
  op.d = d;
  op.n = n;
  op.scale_d = s.scale_d;
  op.group = -1;
  op.ops = w.ops[buf];
  op.a_src = a_regs;
  for (int i = 0; i < 4; i++) op.a_val[i] = s.a[i];
  if (!t.wgmma_acc.count(d)) t.wgmma_acc[d].assign(d, d + n / 2);
  for (int i = 0; i < n / 2; i++) memcpy(&d[i], &kInFlight, 4); /* in flight until the wait */
  t.wgmma.push_back(op);
}

/* ---- setmaxnreg (emu.h) ---------------------------------------------------------------- */
void emu_setmaxnreg(int n, int inc) {
  tracker_arm();
  if (n < 24 || n > 256 || n % 8) fail("setmaxnreg count must be a multiple of 8 in 24-256");
  if (E.nthreads % 128) fail("setmaxnreg in a block whose size is not a multiple of 128");
  wg_state &w = my_wg();
  const int me = E.cur % 128, req = inc ? n : -n;
  w.nreg_req[me] = req;
  const uint64_t gen = w.nreg_gen;
  if (++w.nreg_count < 128) {
    block_on(&w.nreg_gen, gen);
    return;
  }
  w.nreg_count = 0;
  for (int l = 0; l < 128; l++)
    if (w.nreg_req[l] != req) fail("threads of a warpgroup executed different setmaxnreg instructions");
  if (inc ? n < w.regs : n > w.regs) {
    fprintf(stderr, "emu: setmaxnreg.%s %d with the warpgroup at %d registers\n", inc ? "inc" : "dec", n, w.regs);
    fail("setmaxnreg.inc below or .dec above the warpgroup's register count");
  }
  if (inc) {
    const int64_t need = 128 * (int64_t)(n - w.regs);
    E.reg_waiters++;
    while (E.reg_pool < need) block_on(&E.reg_pool_gen, E.reg_pool_gen);
    E.reg_waiters--;
    E.reg_pool -= need;
  } else {
    E.reg_pool += 128 * (int64_t)(w.regs - n);
    E.reg_pool_gen++;
  }
  w.regs = n;
  w.nreg_gen++;
}

/* ---- TMA reduce-add (emu.h) -------------------------------------------------------------- */
namespace {
/* A box-shaped scratch target for the store model's bookkeeping of a reduce: the store it
 * records writes there at its wait. Kept for the process (a pending store points at it). */
unsigned char *reduce_scratch(uint32_t bytes) {
  static std::vector<std::vector<unsigned char>> pool;
  if (pool.empty() || pool.back().size() < bytes) pool.emplace_back(bytes);
  return pool.back().data();
}
} // namespace

void emu_tma_reduce_add(const emu_tmap *map, const void *smem_src, const int *coords) {
  if (map->elem_bytes != 4) fail("TMA reduce-add is modelled for float32 only");
  const uint32_t bytes = box_bytes(*map);
  /* a source still read by an earlier store / reduce of this thread must not have changed */
  for (const bulk_store &s : my_bulk().stores)
    if (s.src == (const unsigned char *)smem_src && (store_read(s, 0) != s.data || store_read(s, 1) != s.data))
      fail("shared memory of a TMA reduce changed before cp.async.bulk.wait_group.read");
  /* the store model: fence check, the box as it is now, checked again at the wait */
  emu_tmap scratch = *map;
  scratch.base = reduce_scratch(bytes);
  uint64_t stride = 4;
  for (int i = 0; i < map->rank; i++) {
    scratch.dims[i] = map->box[i];
    scratch.strides[i] = stride;
    stride *= map->box[i];
  }
  const int zero[5] = {0, 0, 0, 0, 0};
  emu_tma_store(&scratch, smem_src, zero);
  /* the adds, clipped to the tensor */
  int c[5] = {0, 0, 0, 0, 0};
  for (int i = 0; i < map->rank; i++) c[i] = coords[i];
  const uint32_t base = emu_smem_addr(smem_src);
  box_walk(*map, c, [&](uint32_t L, unsigned char *g) {
    if (!g) return;
    float x, y;
    memcpy(&x, async_at(emu_swizzle(base + L, map->swizzle_bytes)), 4); /* the async proxy's view */
    memcpy(&y, g, 4);
    y += x;
    memcpy(g, &y, 4);
  });
}
