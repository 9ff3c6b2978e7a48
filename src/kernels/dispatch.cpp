// The one dispatch point: detects the CPU, honours NEEDLE_FORCE_ISA, and routes the public
// kernel functions of kernels.h to the chosen table. Large CQ matmuls are split over rows with
// core/parallel.h here (in whatever arena the caller runs); rows are independent, so results do
// not depend on the thread count or the split.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

#include "core/parallel.h"
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
#if defined(__linux__)
    out[n++] = {"neon", (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0, isa_neon::table};
#else
    out[n++] = {"neon", true, isa_neon::table};
#endif
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

const KernelTable &active_kernels() {
    static const KernelTable *t = pick();
    return *t;
}

const char *kernel_isa() { return active_kernels().isa; }

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

void cq_matmul_many(const CqProduct *products, uint32_t n_products, const float *xh, size_t xh_stride,
                    size_t n_pos) {
    const KernelTable &k = active_kernels();
    // Work is split in blocks of kRowBlock rows (the kernels' own row blocking, so no task
    // ends in a short block that decodes its groups for fewer rows) over all products at once:
    // one fork and join for, say, the q, k, v and gate projections of a decode step.
    constexpr uint32_t kRowBlock = 4;
    uint64_t work = 0;
    uint32_t blocks = 0;
    for (uint32_t i = 0; i < n_products; ++i) {
        work += uint64_t(products[i].w->cols_pad) * n_pos * products[i].count;
        blocks += (products[i].count + kRowBlock - 1) / kRowBlock;
    }
    auto run_blocks = [&](uint32_t b0, uint32_t b1) {  // blocks [b0, b1) of the concatenation
        uint32_t first = 0;
        for (uint32_t i = 0; i < n_products && b0 < b1; ++i) {
            const CqProduct &p = products[i];
            const uint32_t nb = (p.count + kRowBlock - 1) / kRowBlock;
            if (b0 < first + nb) {
                const uint32_t lo = (b0 - first) * kRowBlock;
                const uint32_t hi = std::min(p.count, (std::min(b1, first + nb) - first) * kRowBlock);
                k.cq_matmul(*p.w, xh, xh_stride, n_pos, p.r0 + lo, hi - lo, p.y + lo, p.y_stride);
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

void cq_dequantize_row(const CqMatrix &w, uint32_t r, float *out) { active_kernels().cq_dequantize_row(w, r, out); }
void fwht(float *x, uint32_t m) { active_kernels().fwht(x, m); }
void rms_unit(const float *x, uint32_t n, float *y) { active_kernels().rms_unit(x, n, y); }
void zcrms(const float *x, const float *gamma, uint32_t n, float *y) { active_kernels().zcrms(x, gamma, n, y); }
void rope(float *x, uint32_t dim, const float *c, const float *s) { active_kernels().rope(x, dim, c, s); }
void attention_head(const float *q, const KvRing<float> &k, const KvRing<float> &v, uint32_t lo, uint32_t hi,
                    float *scores, float *out) {
    active_kernels().attention_head(q, k, v, lo, hi, scores, out);
}
void attention_head(const float *q, const KvRing<int8_t> &k, const KvRing<int8_t> &v, uint32_t lo, uint32_t hi,
                    float *scores, float *out) {
    active_kernels().attention_head_i8(q, k, v, lo, hi, scores, out);
}

void quantize_i8(const float *x, uint32_t n, int8_t *q, float *scale) {
    float amax = 0.0f;
    for (uint32_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float s = amax / 127.0f;
    *scale = s;
    for (uint32_t i = 0; i < n; ++i) q[i] = s > 0.0f ? int8_t(std::lround(x[i] / s)) : int8_t(0);
}

}  // namespace needle
