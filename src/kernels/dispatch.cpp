// The one dispatch point: detects the CPU, honours NEEDLE_FORCE_ISA, and routes the public
// kernel functions of kernels.h to the chosen table. Large CQ matmuls are split over rows with
// core/parallel.h here (in whatever arena the caller runs); rows are independent, so results do
// not depend on the thread count or the split.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/huge_pages.h"
#include "core/parallel.h"
#include "kernels/cpu_features.h"
#include "kernels/kernel_table.h"
#include "kernels/kernels.h"

namespace needle {
namespace {

struct Candidate {
    const char *name;
    bool supported;
    const KernelTable &(*table)();
};

// Best first. __builtin_cpu_supports also checks that the OS enabled the AVX / AVX-512 register
// state (libgcc reads XCR0), which xsimd 8.1's own detection does not.
int candidates(Candidate *out) {
    int n = 0;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
#if defined(NEEDLE_HAVE_ISA_avx512)
    out[n++] = {"avx512", __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                              __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"),
                isa_avx512::table};
#endif
#if defined(NEEDLE_HAVE_ISA_avx2)
    out[n++] = {"avx2", __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"), isa_avx2::table};
#endif
#if defined(NEEDLE_HAVE_ISA_sse4_2)
    out[n++] = {"sse4_2", bool(__builtin_cpu_supports("sse4.2")), isa_sse4_2::table};
#endif
#elif defined(__aarch64__) && defined(NEEDLE_HAVE_ISA_neon)
    // A later dot-product path would come first here, on cpu_features().asimddp.
    out[n++] = {"neon", cpu_features().neon, isa_neon::table};
#endif
    out[n++] = {"scalar", true, scalar::table};
    return n;
}

// NEEDLE_FORCE_ISA as pick() read it (written once, before active_kernels() returns).
char g_requested[32] = "";

const KernelTable *pick() {
    Candidate c[8];
    const int n = candidates(c);
    const char *forced = std::getenv("NEEDLE_FORCE_ISA");
    if (forced) std::snprintf(g_requested, sizeof g_requested, "%s", forced);
    if (forced && *forced) {
        // A forced ISA is honoured only if this CPU runs it; otherwise the best one is used.
        for (int i = 0; i < n; ++i)
            if (std::strcmp(c[i].name, forced) == 0 && c[i].supported) return &c[i].table();
    }
    for (int i = 0; i < n; ++i)
        if (c[i].supported) return &c[i].table();
    return &scalar::table();
}

// Below this many multiply-adds a matmul runs on the calling thread: handing a small decode
// matvec to another core costs more than it saves.
constexpr uint64_t kParallelMinWork = uint64_t(1) << 18;
// Target work per task.
constexpr uint64_t kTaskWork = uint64_t(1) << 16;

}  // namespace

// The table in use: picked at first use; replaced only by use_kernel_isa (tests).
std::atomic<const KernelTable *> g_active{nullptr};

const KernelTable &active_kernels() {
    const KernelTable *t = g_active.load(std::memory_order_acquire);
    if (!t) {
        static const KernelTable *first = pick();  // thread-safe once
        const KernelTable *none = nullptr;
        g_active.compare_exchange_strong(none, first, std::memory_order_acq_rel);
        t = g_active.load(std::memory_order_acquire);
    }
    return *t;
}

bool use_kernel_isa(const char *name) {
    Candidate c[8];
    const int n = candidates(c);
    for (int i = 0; i < n; ++i)
        if (std::strcmp(c[i].name, name) == 0 && c[i].supported) {
            active_kernels();  // the first pick happens before, so it cannot undo this
            g_active.store(&c[i].table(), std::memory_order_release);
            return true;
        }
    return false;
}

const char *kernel_isa() { return active_kernels().isa; }

int supported_kernel_tables(const KernelTable **out, int max) {
    Candidate c[8];
    const int n = candidates(c);
    int k = 0;
    for (int i = 0; i < n && k < max; ++i)
        if (c[i].supported) out[k++] = &c[i].table();
    return k;
}

const char *kernel_isa_requested() {
    active_kernels();  // the choice reads the variable
    return g_requested;
}

void cq_prepare_input(const float *x, uint32_t cols, uint32_t cols_pad, uint32_t group, float *xh) {
    active_kernels().cq_prepare_input(x, cols, cols_pad, group, xh);
}

void cq_matmul(const CqMatrix &w, const float *xh, size_t xh_stride, size_t n_pos, uint32_t r0,
               uint32_t count, float *y, size_t y_stride) {
    const CqProduct one{&w, r0, count, y, y_stride};
    cq_matmul_many(&one, 1, xh, xh_stride, n_pos);
}

namespace {

// Runs run(product, lo, hi) over rows [lo, hi) of every product, split in whole row blocks of
// each matrix (the kernels' own row blocking: 4 rows in the stored form, block_rows in the
// rows-in-lanes form; blocks counted from row 0, so no two tasks compute one block) over all
// products at once: one fork and join for, say, the q, k, v and gate projections of a decode
// step. Rows are independent: no bit depends on the split. A side job (cq_matmul_many) runs
// first in the range that starts at block 0 (the calling thread's first sub-chunk): the split
// stays even, and the other thread, done first, takes row blocks from the back of the caller's
// share. (As a piece of its own it made the shares uneven, e.g. 56 + 41 of 97 pieces; as the
// last piece a long job left the other thread waiting.)
template <class Run>
void split_rows(const KernelTable &k, const CqProduct *products, uint32_t n_products, size_t n_pos, const Run &run,
                const FunctionRef<void()> *side) {
    auto block_of = [&](const CqProduct &p) { return p.w->blocked && p.w->block_rows == k.cq_block_rows ? p.w->block_rows : 4u; };
    uint64_t work = 0;
    uint32_t blocks = 0;
    for (uint32_t i = 0; i < n_products; ++i) {
        const CqProduct &p = products[i];
        if (!p.count) continue;
        const uint32_t rb = block_of(p);
        work += uint64_t(p.w->cols_pad) * n_pos * p.count;
        blocks += (p.r0 + p.count - 1) / rb - p.r0 / rb + 1;
    }
    auto run_blocks = [&](uint32_t b0, uint32_t b1) {  // blocks [b0, b1) of the concatenation
        if (side && b0 == 0) (*side)();
        uint32_t first = 0;
        for (uint32_t i = 0; i < n_products && b0 < b1; ++i) {
            const CqProduct &p = products[i];
            if (!p.count) continue;
            const uint32_t rb = block_of(p), fb = p.r0 / rb;
            const uint32_t nb = (p.r0 + p.count - 1) / rb - fb + 1;
            if (b0 < first + nb) {
                const uint32_t lo = std::max(p.r0, (fb + b0 - first) * rb);
                const uint32_t hi = std::min(p.r0 + p.count, (fb + std::min(b1, first + nb) - first) * rb);
                run(p, lo, hi);
                b0 = std::min(b1, first + nb);
            }
            first += nb;
        }
    };
    if (work < kParallelMinWork || blocks < 2) {
        run_blocks(0, blocks);
        return;
    }
    const uint32_t grain = uint32_t(std::max<uint64_t>(1, kTaskWork * blocks / work));
    parallel_for(0, blocks, grain, run_blocks);
}

// Quantised-input buffer of the FAST path, per layout (on the caller's stack: a decode step
// allocates nothing). Positions are taken in tiles that fit; each tile is quantised once, by
// the calling thread, and then shared by every product and every task.
constexpr size_t kFastBytes = 32768;

}  // namespace

void cq_matmul_many(const CqProduct *products, uint32_t n_products, const float *xh, size_t xh_stride,
                    size_t n_pos, const FunctionRef<void()> *side) {
    const KernelTable &k = active_kernels();
    bool need2 = false, need4 = false;
    uint32_t cols_pad = 0, group = 0;
    for (uint32_t i = 0; i < n_products; ++i)
        if (products[i].count && products[i].w->fast) {
            (cq_fast_layout(*products[i].w) == 2 ? need2 : need4) = true;
            cols_pad = products[i].w->cols_pad, group = products[i].w->group;
        }
    const uint32_t ng = group ? cols_pad / group : 0;
    const size_t s2 = size_t(ng) * cq_fast_group_bytes(group, 2), s4 = size_t(ng) * cq_fast_group_bytes(group, 4);
    if ((!need2 && !need4) || std::max(s2, s4) > kFastBytes) {  // exact (or an input too wide to quantise here)
        split_rows(k, products, n_products, n_pos, [&](const CqProduct &p, uint32_t lo, uint32_t hi) {
            k.cq_matmul(*p.w, xh, xh_stride, n_pos, lo, hi - lo, p.y + (lo - p.r0), p.y_stride);
        }, side);
        return;
    }
    // FAST (cq_fast.h): every product of one call reads the same prepared input, so one group
    // size; the layouts its matrices need are quantised once per tile of positions.
    if (n_pos == 0 && side) (*side)();  // no tile below to carry it
    alignas(64) int8_t q2[kFastBytes], q4[kFastBytes];
    alignas(64) float scale[kFastBytes / 8];
    alignas(64) int32_t sum[kFastBytes / 8];
    const size_t tile = std::max<size_t>(1, kFastBytes / std::max(s2, s4));
    for (size_t p0 = 0; p0 < n_pos; p0 += tile) {
        const size_t P = std::min(tile, n_pos - p0);
        const float *x = xh + p0 * xh_stride;
        k.cq_fast_quantize(x, xh_stride, P, cols_pad, group, need2 ? q2 : nullptr, s2, need4 ? q4 : nullptr, s4,
                           scale, sum);
        CqFastInput in;
        in.q2 = need2 ? q2 : nullptr, in.q4 = need4 ? q4 : nullptr;
        in.q2_stride = s2, in.q4_stride = s4, in.scale = scale, in.sum = sum, in.ngroups = ng;
        split_rows(k, products, n_products, P, [&](const CqProduct &p, uint32_t lo, uint32_t hi) {
            float *y = p.y + (lo - p.r0) + p0 * p.y_stride;
            if (p.w->fast) k.cq_matmul_fast(*p.w, in, P, lo, hi - lo, y, p.y_stride);
            else k.cq_matmul(*p.w, x, xh_stride, P, lo, hi - lo, y, p.y_stride);
        }, p0 == 0 ? side : nullptr);
    }
}

namespace {

// The rows-in-lanes copy of one matrix (layout: cq_matrix.h) at dst, w.block_rows set.
// Portable: a 2- or 4-bit word is 4 bytes of the stored row (same LSB-first order); a 3-bit
// index is widened to a nibble.
void block_matrix(const CqMatrix &w, uint8_t *dst) {
    const uint32_t RB = w.block_rows, words = cq_block_words(w);
    const uint32_t gbytes = w.group * w.width / 8, nb = (w.rows + RB - 1) / RB;
    const size_t rec = cq_block_record_bytes(w);
    const KernelTable &k = active_kernels();
    for (uint32_t b = 0; b < nb; ++b) {
        if (k.cq_block_rows_fast && k.cq_block_rows_fast(w, b, dst + size_t(b) * w.ngroups * rec)) continue;
        for (uint32_t g = 0; g < w.ngroups; ++g) {
            uint8_t *r = dst + (size_t(b) * w.ngroups + g) * rec;
            float *nrm = reinterpret_cast<float *>(r);
            uint32_t *wd = reinterpret_cast<uint32_t *>(r + 4 * size_t(RB));
            for (uint32_t i = 0; i < RB; ++i) {
                const uint32_t row = b * RB + i;
                if (row >= w.rows) {  // padding lanes: zero norm and indices
                    nrm[i] = 0.0f;
                    for (uint32_t j = 0; j < words; ++j) wd[size_t(j) * RB + i] = 0;
                    continue;
                }
                nrm[i] = w.norms[size_t(row) * w.ngroups + g];
                const uint8_t *src = w.packed + size_t(row) * w.row_bytes + size_t(g) * gbytes;
                for (uint32_t j = 0; j < words; ++j) {
                    uint32_t v = 0;
                    if (w.width != 3) {
                        if (4 * j + 4 <= gbytes) std::memcpy(&v, src + 4 * j, 4);  // little-endian hosts only
                        else for (uint32_t q = 0; 4 * j + q < gbytes; ++q) v |= uint32_t(src[4 * j + q]) << (8 * q);
                    } else {  // columns 8j .. 8j+7 are bytes 3j .. 3j+2 (a group is whole bytes)
                        const uint32_t bits = uint32_t(src[3 * j]) | uint32_t(src[3 * j + 1]) << 8 | uint32_t(src[3 * j + 2]) << 16;
                        for (uint32_t c = 0; c < 8; ++c) v |= ((bits >> (3 * c)) & 7u) << (4 * c);
                    }
                    wd[size_t(j) * RB + i] = v;
                }
            }
        }
    }
}

size_t blocked_bytes(const CqMatrix &w) {
    const size_t nb = (w.rows + w.block_rows - 1) / w.block_rows;
    return (nb * w.ngroups * cq_block_record_bytes(w) + 63) & ~size_t(63);
}

}  // namespace

uint8_t *CqBlockStore::reserve(size_t bytes) {
    reset();
    if (!bytes) return nullptr;
    // Streamed by every matmul of every step: 2 MB pages where the system gives them
    // (huge_pages.h). The copy writes every byte right after, so no separate populate step.
    base_ = static_cast<uint8_t *>(huge_alloc(bytes));
    bytes_ = bytes;
    return base_;
}

void CqBlockStore::reset() {
    huge_free(base_, bytes_);
    base_ = nullptr, bytes_ = 0;
}

void cq_block_matrices(CqMatrix *const *ms, size_t n, CqBlockStore &store) {
    const uint32_t RB = active_kernels().cq_block_rows;
    store.reset();
    if (!RB) return;
    size_t total = 0;
    for (size_t i = 0; i < n; ++i) {
        ms[i]->block_rows = RB;
        total += blocked_bytes(*ms[i]);
    }
    uint8_t *p = store.reserve(total);  // every byte of the copies is written below
    std::vector<uint8_t *> at(n);
    for (size_t i = 0; i < n; ++i) at[i] = p, p += blocked_bytes(*ms[i]);
    // ~1 ms per 4 MB of copy on one core: large models share the matrices out (a small one
    // would pay more for waking the worker threads than it saves).
    auto run = [&](uint32_t b, uint32_t e) {
        for (uint32_t i = b; i < e; ++i) block_matrix(*ms[i], at[i]);
    };
    if (total >= (size_t(4) << 20)) parallel_for(0, uint32_t(n), 1, run);
    else run(0, uint32_t(n));
    for (size_t i = 0; i < n; ++i) ms[i]->blocked = at[i];
}

void cq_dequantize_row(const CqMatrix &w, uint32_t r, float *out) { active_kernels().cq_dequantize_row(w, r, out); }
void fwht(float *x, uint32_t m) { active_kernels().fwht(x, m); }
void rms_unit(const float *x, uint32_t n, float *y) { active_kernels().rms_unit(x, n, y); }
void zcrms(const float *x, const float *gamma, uint32_t n, float *y) { active_kernels().zcrms(x, gamma, n, y); }
void rope(float *x, uint32_t dim, const float *c, const float *s) { active_kernels().rope(x, dim, c, s); }
void sinkhorn(float *m, uint32_t n, uint32_t count) { active_kernels().sinkhorn(m, n, count); }
void silu(const float *x, uint32_t n, float *y) { active_kernels().silu(x, n, y); }
void sigmoid_gate(float *x, const float *g, uint32_t n) { active_kernels().sigmoid_gate(x, g, n); }
void mhc_mix(const float *R, const float *hp, const float *y, uint32_t N, uint32_t D, float *X, float *Xs) {
    active_kernels().mhc_mix(R, hp, y, N, D, X, Xs);
}
void pool_probe(const float *q, const float *cells, size_t cell_stride, const uint32_t *tokens, uint32_t n,
                uint32_t D, double inv_sqrt_d, double *a) {
    active_kernels().pool_probe(q, cells, cell_stride, tokens, n, D, inv_sqrt_d, a);
}
void attention_head(const float *q, const KvRing<float> &k, const KvRing<float> &v, uint32_t lo, uint32_t hi,
                    float *scores, float *out) {
    active_kernels().attention_rows(q, 0, 1, k, v, lo, hi, scores, 0, out, 0);
}
void attention_head(const float *q, const KvRing<int8_t> &k, const KvRing<int8_t> &v, uint32_t lo, uint32_t hi,
                    float *scores, float *out) {
    active_kernels().attention_rows_i8(q, 0, 1, k, v, lo, hi, scores, 0, out, 0);
}
void attention_rows(const float *q, size_t q_stride, uint32_t rows, const KvRing<float> &k, const KvRing<float> &v,
                    uint32_t lo, uint32_t hi, float *scores, size_t s_stride, float *out, size_t o_stride) {
    active_kernels().attention_rows(q, q_stride, rows, k, v, lo, hi, scores, s_stride, out, o_stride);
}
void attention_rows(const float *q, size_t q_stride, uint32_t rows, const KvRing<int8_t> &k,
                    const KvRing<int8_t> &v, uint32_t lo, uint32_t hi, float *scores, size_t s_stride, float *out,
                    size_t o_stride) {
    active_kernels().attention_rows_i8(q, q_stride, rows, k, v, lo, hi, scores, s_stride, out, o_stride);
}

void quantize_i8(const float *x, uint32_t n, int8_t *q, float *scale) {
    float amax = 0.0f;
    for (uint32_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float s = amax / 127.0f;
    *scale = s;
    for (uint32_t i = 0; i < n; ++i) q[i] = s > 0.0f ? int8_t(std::lround(x[i] / s)) : int8_t(0);
}

}  // namespace needle
