// Every kernel of every instruction set this build has and this CPU runs, against the scalar
// reference table on random inputs whose sizes are not multiples of the vector width (tails),
// with strides, row offsets and ring wrap-around (issue 12: a wrong lane order or a missing tail
// in one ISA, NEON included under qemu, must fail here before it shows in the logits). Within an
// ISA, cq_matmul's contract is bitwise: a batched matmul row equals the matvec (cq-kernels.md §9).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "core/huge_pages.h"
#include "kernels/cpu_features.h"
#include "kernels/kernel_table.h"
#include "kernels/kernels.h"

using needle::CqMatrix;
using needle::KernelTable;
using needle::KvRing;

namespace {

std::vector<const KernelTable *> vector_tables() {  // every supported table but scalar
    const KernelTable *t[8];
    const int n = needle::supported_kernel_tables(t, 8);
    std::vector<const KernelTable *> out;
    for (int i = 0; i < n; ++i)
        if (std::string(t[i]->isa) != "scalar") out.push_back(t[i]);
    return out;
}

const KernelTable &ref() { return needle::scalar::table(); }

std::vector<float> randn(std::mt19937 &rng, size_t n, float sd = 1.0f) {
    std::normal_distribution<float> d(0.0f, sd);
    std::vector<float> v(n);
    for (float &x : v) x = d(rng);
    return v;
}

// Max |got - want| over n values, relative to max(1, max |want|). Lanes or tails gone wrong give
// errors of order 1; rounding (FMA against mul + add, another summation order) about 1e-6.
double rel_err(const float *got, const float *want, size_t n) {
    double mx = 1.0, err = 0.0;
    for (size_t i = 0; i < n; ++i) mx = std::max(mx, double(std::fabs(want[i])));
    for (size_t i = 0; i < n; ++i) {
        const double d = std::fabs(double(got[i]) - double(want[i]));
        err = std::max(err, std::isnan(d) ? 1e30 : d);
    }
    return err / mx;
}
constexpr double kTol = 2e-5;

// A random CQ matrix of `width` bits (ternary: width 2 with a book of {-a, 0, +a}) with its LUT.
struct RandomCq {
    std::vector<uint8_t> packed;
    std::vector<float> norms, lut, levels;
    CqMatrix m;
    RandomCq(std::mt19937 &rng, uint32_t rows, uint32_t cols, uint32_t group, uint32_t width, bool ternary) {
        m.rows = rows;
        m.cols = cols;
        m.group = group;
        m.ngroups = (cols + group - 1) / group;
        m.cols_pad = m.ngroups * group;
        m.width = width;
        m.row_bytes = m.cols_pad * width / 8;
        packed.resize(size_t(rows) * m.row_bytes);
        for (uint8_t &b : packed) b = uint8_t(rng());
        norms = randn(rng, size_t(rows) * m.ngroups, 0.5f);
        levels = randn(rng, size_t(1) << width);
        if (ternary) levels = {-0.7f, 0.0f, 0.7f, 0.0f};
        if (width == 2) {
            lut.resize(256 * 4);
            for (uint32_t b = 0; b < 256; ++b)
                for (uint32_t k = 0; k < 4; ++k) lut[4 * b + k] = levels[(b >> (2 * k)) & 3u];
        } else if (width == 4) {
            lut.resize(256 * 2);
            for (uint32_t b = 0; b < 256; ++b)
                for (uint32_t k = 0; k < 2; ++k) lut[2 * b + k] = levels[(b >> (4 * k)) & 15u];
        }
        m.packed = packed.data();
        m.norms = norms.data();
        m.lut = lut.empty() ? nullptr : lut.data();
        m.levels = levels.data();
    }
};

struct CqCase {
    uint32_t width;
    bool ternary;
    uint32_t group, cols, rows;
};
const CqCase kCqCases[] = {
    {2, false, 32, 70, 9},  {2, true, 64, 64, 5},   {3, false, 32, 45, 7},  {3, false, 128, 300, 6},
    {4, false, 64, 100, 11}, {4, false, 256, 256, 4}, {2, false, 128, 129, 13},
};

// P random prepared inputs (xh, stride xs) through k's cq_matmul of rows r0 .. r0+count-1 into
// got (stride ys): within rounding of scalar, columns past count untouched, and the bits of one
// position and one row at a time.
void check_matmul(const KernelTable &k, const CqMatrix &m, std::mt19937 &rng, uint32_t P, uint32_t xs, uint32_t ys,
                  uint32_t r0, uint32_t count, std::vector<float> &xh, std::vector<float> &got) {
    xh.assign(size_t(P) * xs, 0.0f);
    for (uint32_t p = 0; p < P; ++p) {
        const std::vector<float> x = randn(rng, m.cols);
        ref().cq_prepare_input(x.data(), m.cols, m.cols_pad, m.group, xh.data() + size_t(p) * xs);
    }
    got.assign(size_t(P) * ys, 7.0f);
    std::vector<float> want(size_t(P) * ys, 7.0f);
    k.cq_matmul(m, xh.data(), xs, P, r0, count, got.data(), ys);
    ref().cq_matmul(m, xh.data(), xs, P, r0, count, want.data(), ys);
    CHECK(rel_err(got.data(), want.data(), got.size()) < kTol);
    for (size_t i = 0; i < got.size(); ++i)  // columns past count untouched
        if (i % ys >= count) REQUIRE(got[i] == 7.0f);
    bool same = true;
    for (uint32_t p = 0; p < P; ++p)
        for (uint32_t r = r0; r < r0 + count; ++r) {
            float one = 0.0f;
            k.cq_matmul(m, xh.data() + size_t(p) * xs, xs, 1, r, 1, &one, 1);
            same = same && std::memcmp(&one, &got[size_t(p) * ys + (r - r0)], 4) == 0;
        }
    CHECK(same);
}

}  // namespace

TEST_CASE("kernels: the scalar table is always supported, and last") {
    const KernelTable *t[8];
    const int n = needle::supported_kernel_tables(t, 8);
    REQUIRE(n >= 1);
    CHECK(std::string(t[n - 1]->isa) == "scalar");
    MESSAGE("kernel tables on this CPU: " << n << ", best " << std::string(t[0]->isa));
#if defined(__aarch64__)
    CHECK(std::string(t[0]->isa) == "neon");  // NEON is baseline on aarch64
#endif
}

TEST_CASE("kernels: fwht and cq_prepare_input match scalar") {
    std::mt19937 rng(1);
    for (const KernelTable *k : vector_tables()) {
        for (uint32_t m = 1; m <= 4096; m *= 2) {
            const std::vector<float> x = randn(rng, m);
            std::vector<float> a = x, b = x;
            k->fwht(a.data(), m);
            ref().fwht(b.data(), m);
            INFO(k->isa << " fwht m " << m);
            CHECK(rel_err(a.data(), b.data(), m) < kTol);
        }
        for (const uint32_t group : {32u, 64u, 256u})
            for (const uint32_t cols : {1u, 31u, 33u, 100u, 512u}) {
                const uint32_t pad = (cols + group - 1) / group * group;
                const std::vector<float> x = randn(rng, cols);
                std::vector<float> a(pad, 99.0f), b(pad, -99.0f);  // stale padding must be cleared
                k->cq_prepare_input(x.data(), cols, pad, group, a.data());
                ref().cq_prepare_input(x.data(), cols, pad, group, b.data());
                INFO(k->isa << " cq_prepare_input cols " << cols << " group " << group);
                CHECK(rel_err(a.data(), b.data(), pad) < kTol);
            }
    }
}

TEST_CASE("kernels: cq_matmul and cq_dequantize_row match scalar, matvec == matmul bitwise") {
    std::mt19937 rng(2);
    for (const KernelTable *k : vector_tables())
        for (const CqCase &c : kCqCases) {
            INFO(k->isa << " width " << c.width << (c.ternary ? " (ternary)" : "") << " group " << c.group << " cols "
                        << c.cols << " rows " << c.rows);
            const RandomCq w(rng, c.rows, c.cols, c.group, c.width, c.ternary);
            const uint32_t P = 35, xs = w.m.cols_pad + 3, ys = c.rows + 2;  // > kPosTile, odd strides
            std::vector<float> xh, got;
            check_matmul(*k, w.m, rng, P, xs, ys, 1, c.rows - 1, xh, got);  // rows 1.. (an offset row block)
            std::vector<float> da(c.cols), db(c.cols);
            for (uint32_t r = 0; r < c.rows; ++r) {
                k->cq_dequantize_row(w.m, r, da.data());
                ref().cq_dequantize_row(w.m, r, db.data());
                CHECK(rel_err(da.data(), db.data(), c.cols) < kTol);
            }
        }
}

// The rows-in-lanes path (AVX2, AVX-512: the copy made at load) runs positions two at a time
// and a lone one last: an odd position count and an offset, partial row range give the same
// bits as one position and one row at a time, and scalar's values within rounding.
TEST_CASE("kernels: rows-in-lanes cq_matmul (each ISA's copy) matches scalar, matvec == matmul bitwise") {
    const std::string initial = needle::kernel_isa();
    int blocked = 0;
    for (const char *isa : {"avx2", "avx512"}) {
        if (!needle::use_kernel_isa(isa)) continue;
        const KernelTable &k = needle::active_kernels();
        std::mt19937 rng(12);
        for (CqCase c : kCqCases) {
            c.rows += 24;  // several row blocks and a partial one
            INFO(isa << " width " << c.width << (c.ternary ? " (ternary)" : "") << " group " << c.group << " cols "
                     << c.cols << " rows " << c.rows);
            RandomCq w(rng, c.rows, c.cols, c.group, c.width, c.ternary);
            needle::CqBlockStore store;
            CqMatrix *mp = &w.m;
            needle::cq_block_matrices(&mp, 1, store);
            REQUIRE(w.m.blocked != nullptr);
            const uint32_t P = 7, xs = w.m.cols_pad + 3, ys = c.rows + 2, r0 = 3, count = c.rows - 5;
            std::vector<float> xh, got;
            check_matmul(k, w.m, rng, P, xs, ys, r0, count, xh, got);
            // Two positions from an odd offset: the pair pass, not the lone-position one.
            std::vector<float> two(size_t(2) * ys, 7.0f);
            k.cq_matmul(w.m, xh.data() + size_t(3) * xs, xs, 2, r0, count, two.data(), ys);
            CHECK(std::memcmp(two.data(), got.data() + size_t(3) * ys, size_t(2) * ys * 4) == 0);
        }
        ++blocked;
    }
    REQUIRE(needle::use_kernel_isa(initial.c_str()));
    MESSAGE("rows-in-lanes ISAs compared: " << blocked);
}

// The side job of cq_matmul_many (the mHC Sinkhorn and probe pooling of a layer run beside its
// q/k/v/gate matmuls): run exactly once by the time the call returns, whether the region is
// serial (little work), parallel, empty (no positions, no rows) or FAST, and the products keep
// the bits of a call without it.
TEST_CASE("kernels: cq_matmul_many runs its side job once, serial or parallel, exact or FAST, same products") {
    std::mt19937 rng(31);
    for (const bool fast : {false, true})
        for (const uint32_t rows : {20u, 700u})  // 700 x 512 x 1 >= 2^18 multiply-adds: parallel
            for (const uint32_t n_pos : {0u, 1u, 3u, 40u}) {
                INFO((fast ? "FAST" : "exact") << " rows " << rows << " positions " << n_pos);
                RandomCq a(rng, rows, 512, 128, 2, false), b(rng, rows / 2, 512, 128, 4, false);
                needle::CqBlockStore store;
                CqMatrix *ms[] = {&a.m, &b.m};
                needle::cq_block_matrices(ms, 2, store);
                a.m.fast = b.m.fast = fast;
                std::vector<float> xh(size_t(std::max(n_pos, 1u)) * 512);
                for (uint32_t p = 0; p < n_pos; ++p) {
                    const std::vector<float> x = randn(rng, 512);
                    needle::cq_prepare_input(x.data(), 512, 512, 128, xh.data() + size_t(p) * 512);
                }
                const size_t ny = size_t(std::max(n_pos, 1u)) * rows;
                std::vector<float> y1(ny, 7.0f), y2(ny, 7.0f), z1(ny, 7.0f), z2(ny, 7.0f);
                const needle::CqProduct plain[] = {{&a.m, 0, rows, y1.data(), rows}, {&b.m, 1, rows / 2 - 1, z1.data(), rows}};
                const needle::CqProduct with[] = {{&a.m, 0, rows, y2.data(), rows}, {&b.m, 1, rows / 2 - 1, z2.data(), rows}};
                needle::cq_matmul_many(plain, 2, xh.data(), 512, n_pos);
                int runs = 0;
                auto job = [&] { ++runs; };
                const needle::FunctionRef<void()> side(job);
                needle::cq_matmul_many(with, 2, xh.data(), 512, n_pos, &side);
                CHECK(runs == 1);
                CHECK(std::memcmp(y1.data(), y2.data(), ny * 4) == 0);
                CHECK(std::memcmp(z1.data(), z2.data(), ny * 4) == 0);
                // No rows at all: the job still runs.
                const needle::CqProduct none[] = {{&a.m, 0, 0, y2.data(), rows}};
                needle::cq_matmul_many(none, 1, xh.data(), 512, n_pos, &side);
                CHECK(runs == 2);
            }
}

TEST_CASE("kernels: rms_unit, zcrms and rope match scalar (also in place)") {
    std::mt19937 rng(3);
    for (const KernelTable *k : vector_tables())
        for (const uint32_t n : {1u, 3u, 4u, 7u, 8u, 9u, 15u, 16u, 17u, 63u, 64u, 65u, 100u, 257u, 1024u}) {
            INFO(k->isa << " n " << n);
            const std::vector<float> x = randn(rng, n, 3.0f), g = randn(rng, n, 0.2f);
            std::vector<float> a(n), b(n);
            k->rms_unit(x.data(), n, a.data());
            ref().rms_unit(x.data(), n, b.data());
            CHECK(rel_err(a.data(), b.data(), n) < kTol);
            k->zcrms(x.data(), g.data(), n, a.data());
            ref().zcrms(x.data(), g.data(), n, b.data());
            CHECK(rel_err(a.data(), b.data(), n) < kTol);
            a = x;
            b = x;
            k->zcrms(a.data(), g.data(), n, a.data());
            ref().zcrms(b.data(), g.data(), n, b.data());
            CHECK(rel_err(a.data(), b.data(), n) < kTol);
            if (n % 2 == 0) {
                const std::vector<float> cs = randn(rng, n / 2), sn = randn(rng, n / 2);
                a = x;
                b = x;
                k->rope(a.data(), n, cs.data(), sn.data());
                ref().rope(b.data(), n, cs.data(), sn.data());
                CHECK(rel_err(a.data(), b.data(), n) < kTol);
            }
        }
}

TEST_CASE("kernels: sinkhorn (doubly stochastic), silu and the sigmoid gate match scalar (also in place)") {
    std::mt19937 rng(5);
    std::vector<const KernelTable *> all = vector_tables();
    all.push_back(&ref());
    for (const KernelTable *k : all) {
        for (const uint32_t n : {1u, 2u, 3u, 4u, 5u, 8u, 17u, 64u}) {
            INFO(k->isa << " sinkhorn n " << n);
            const std::vector<float> m0 = randn(rng, size_t(n) * n, 2.0f);
            std::vector<float> a = m0, b = m0;
            k->sinkhorn(a.data(), n, 1);
            ref().sinkhorn(b.data(), n, 1);
            CHECK(rel_err(a.data(), b.data(), a.size()) < kTol);
            // The last half-round normalises the columns (sums 1 up to rounding); the rows have
            // converged to within 1e-2 after 20 rounds on these inputs (3 x 3 is the slowest).
            for (uint32_t i = 0; i < n; ++i) {
                double row = 0.0, col = 0.0;
                for (uint32_t j = 0; j < n; ++j) row += a[i * n + j], col += a[j * n + i];
                CHECK(std::fabs(col - 1.0) < 1e-5);
                CHECK(std::fabs(row - 1.0) < 2e-2);
            }
        }
        // Several matrices in one call: each gets the bits of a call of its own.
        for (const uint32_t n : {3u, 4u})
            for (const uint32_t count : {2u, 4u, 5u, 9u}) {
                INFO(k->isa << " sinkhorn n " << n << " count " << count);
                const std::vector<float> m0 = randn(rng, size_t(count) * n * n, 2.0f);
                std::vector<float> a = m0, b = m0;
                k->sinkhorn(a.data(), n, count);
                for (uint32_t c = 0; c < count; ++c) k->sinkhorn(b.data() + size_t(c) * n * n, n, 1);
                CHECK(std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0);
            }
        for (const uint32_t n : {1u, 3u, 7u, 8u, 9u, 16u, 17u, 63u, 100u, 1024u}) {
            INFO(k->isa << " silu n " << n);
            std::vector<float> x = randn(rng, n, 4.0f);
            x[0] = 0.0f;
            if (n > 2) x[1] = 30.0f, x[2] = -30.0f;
            std::vector<float> a(n), b(n);
            k->silu(x.data(), n, a.data());
            ref().silu(x.data(), n, b.data());
            CHECK(rel_err(a.data(), b.data(), n) < kTol);
            CHECK(a[0] == 0.0f);
            if (n > 2) {
                CHECK(std::fabs(a[1] - 30.0f) < 1e-5f);
                CHECK(std::fabs(a[2]) < 1e-10f);
            }
            k->silu(x.data(), n, x.data());
            CHECK(std::memcmp(x.data(), a.data(), sizeof(float) * n) == 0);
            // The output gate: o *= sigmoid(g) in place; sigmoid(0) = 0.5, saturated at +-30.
            const std::vector<float> o = randn(rng, n, 2.0f);
            std::vector<float> go = randn(rng, n, 4.0f);
            go[0] = 0.0f;
            if (n > 2) go[1] = 30.0f, go[2] = -30.0f;
            a = o, b = o;
            k->sigmoid_gate(a.data(), go.data(), n);
            ref().sigmoid_gate(b.data(), go.data(), n);
            CHECK(rel_err(a.data(), b.data(), n) < kTol);
            CHECK(a[0] == 0.5f * o[0]);
            if (n > 2) {
                CHECK(a[1] == o[1]);
                CHECK(std::fabs(a[2]) < 1e-12f);
            }
            for (uint32_t i = 0; i < n; ++i) CHECK(b[i] == o[i] * (1.0f / (1.0f + std::exp(-go[i]))));
        }
    }
}

// The mHC lane mixing is bit-exact across ISAs (each product rounded, summed in lane order from
// 0, no fused multiply-add); checked against a direct sum from a snapshot too, for lane counts in
// registers (1-8) and past them, and widths with a tail.
TEST_CASE("kernels: mhc_mix gives the scalar bits in every ISA") {
    std::mt19937 rng(9);
    std::vector<const KernelTable *> all = vector_tables();
    all.push_back(&ref());
    for (const KernelTable *k : all)
        for (uint32_t N : {1u, 3u, 4u, 8u, 9u})
            for (uint32_t D : {5u, 37u, 512u}) {
                INFO(k->isa << " N " << N << " D " << D);
                const std::vector<float> X0 = randn(rng, size_t(N) * D), R = randn(rng, size_t(N) * N, 0.5f),
                                         hp = randn(rng, N), y = randn(rng, D);
                std::vector<float> X = X0, Xs(size_t(N) * D, -1.0f);
                k->mhc_mix(R.data(), hp.data(), y.data(), N, D, X.data(), Xs.data());
                bool same = true;
                for (uint32_t q = 0; q < N; ++q)
                    for (uint32_t c = 0; c < D; ++c) {
                        float want = 0.0f;
                        for (uint32_t j = 0; j < N; ++j) want += R[q * N + j] * X0[size_t(j) * D + c];
                        want += hp[q] * y[c];
                        same = same && std::memcmp(&want, &X[size_t(q) * D + c], 4) == 0;
                    }
                CHECK(same);
            }
}

// Probe pooling (model-v2.md §7.2) is bit-exact across ISAs: same dot order, no fused multiply-add,
// libm exps. Checked against a direct softmax too, and one call over n cells against n calls.
TEST_CASE("kernels: pool_probe gives the scalar bits in every ISA, in one call or per cell") {
    std::mt19937 rng(6);
    std::vector<const KernelTable *> all = vector_tables();
    all.push_back(&ref());
    for (const KernelTable *k : all)
        for (const uint32_t D : {1u, 7u, 8u, 9u, 33u, 100u, 512u})
            for (const uint32_t n : {1u, 5u, 64u, 97u}) {
                INFO(k->isa << " D " << D << " n " << n);
                const std::vector<float> q = randn(rng, D), cells = randn(rng, size_t(n) * (D + 3), 2.0f);
                std::vector<uint32_t> tok(n, 7);
                for (uint32_t i = 3; i < n; i += 11) tok[i] = 0;  // PAD cells
                std::vector<double> a(D + 2, 0.0), b(D + 2, 0.0), c(D + 2, 0.0);
                a[0] = b[0] = c[0] = -INFINITY;
                const double isd = 1.0 / std::sqrt(double(D));
                k->pool_probe(q.data(), cells.data(), D + 3, tok.data(), n, D, isd, a.data());
                ref().pool_probe(q.data(), cells.data(), D + 3, tok.data(), n, D, isd, b.data());
                for (uint32_t i = 0; i < n; ++i)
                    k->pool_probe(q.data(), cells.data() + size_t(i) * (D + 3), D + 3, tok.data() + i, 1, D, isd,
                                  c.data());
                CHECK(std::memcmp(a.data(), b.data(), sizeof(double) * a.size()) == 0);
                CHECK(std::memcmp(a.data(), c.data(), sizeof(double) * a.size()) == 0);
                // The pooled mean against a two-pass softmax in long double.
                std::vector<long double> z(n);
                long double mx = -INFINITY, den = 0, num = 0;
                for (uint32_t i = 0; i < n; ++i) {
                    long double dot = 0;
                    for (uint32_t d = 0; d < D; ++d) dot += (long double)cells[i * (D + 3) + d] * q[d];
                    z[i] = dot * isd;
                    if (tok[i]) mx = std::max(mx, z[i]);
                }
                for (uint32_t i = 0; i < n; ++i)
                    if (tok[i]) {
                        const long double e = std::exp(z[i] - mx);
                        den += e, num += e * cells[i * (D + 3) + D - 1];
                    }
                CHECK(std::fabs(double(a[0] - mx)) < 1e-12 * (1 + std::fabs(double(mx))));
                CHECK(std::fabs(a[1 + D] / a[1] - double(num / den)) < 1e-12);
            }
}

// A group of `rows` queries through table t; each output row of the group must have the bits the
// same query gets alone (rows = 1) from t.
template <class T>
static void check_attention_group(const KernelTable &t, const KernelTable &ref_t, const std::vector<float> &q,
                                  uint32_t rows, const KvRing<T> &kr, const KvRing<T> &vr, uint32_t lo, uint32_t hi) {
    const uint32_t dim = kr.dim, ring = kr.ring, qs = dim + 3, ss = ring + 5, os = dim + 1;  // padded strides
    std::vector<float> sa(size_t(rows) * ss, 0.0f), oa(size_t(rows) * os, 5.0f), s1(ring), o1(dim), sb(ring), ob(dim);
    auto run = [&](const KernelTable &k, const float *qq, size_t q_stride, uint32_t n, float *sc, size_t s_stride,
                   float *o, size_t o_stride) {
        if constexpr (std::is_same_v<T, int8_t>) k.attention_rows_i8(qq, q_stride, n, kr, vr, lo, hi, sc, s_stride, o, o_stride);
        else k.attention_rows(qq, q_stride, n, kr, vr, lo, hi, sc, s_stride, o, o_stride);
    };
    run(t, q.data(), qs, rows, sa.data(), ss, oa.data(), os);
    for (uint32_t r = 0; r < rows; ++r) {
        INFO("row " << r << " of " << rows);
        run(t, q.data() + size_t(r) * qs, 0, 1, s1.data(), 0, o1.data(), 0);
        run(ref_t, q.data() + size_t(r) * qs, 0, 1, sb.data(), 0, ob.data(), 0);
        CHECK(std::memcmp(oa.data() + size_t(r) * os, o1.data(), sizeof(float) * dim) == 0);
        CHECK(rel_err(o1.data(), ob.data(), dim) < kTol);
        CHECK(oa[size_t(r) * os + dim] == 5.0f);  // the stride gap is not written
    }
}

TEST_CASE("kernels: attention_rows (GQA groups, f32 and int8 rings, wrapped) matches scalar, each row alone") {
    std::mt19937 rng(4);
    std::uniform_int_distribution<int> i8(-127, 127);
    for (const KernelTable *k : vector_tables())
        for (const uint32_t dim : {4u, 9u, 16u, 33u, 64u, 72u, 128u})
            for (const uint32_t ring : {1u, 7u, 40u})
                for (const uint32_t rows : {1u, 2u, 3u, 5u, 17u}) {
                    // Keys lo..hi: the whole ring, ending past its end (wrap-around).
                    const uint32_t hi = ring + ring / 2 + 2, lo = hi + 1 - ring;
                    INFO(k->isa << " dim " << dim << " ring " << ring << " keys " << lo << ".." << hi << " rows " << rows);
                    const std::vector<float> q = randn(rng, size_t(rows) * (dim + 3)),
                                             kf = randn(rng, size_t(ring) * dim), vf = randn(rng, size_t(ring) * dim);
                    std::vector<int8_t> k8(size_t(ring) * dim), v8(size_t(ring) * dim);
                    for (int8_t &x : k8) x = int8_t(i8(rng));
                    for (int8_t &x : v8) x = int8_t(i8(rng));
                    const std::vector<float> ks = randn(rng, ring, 0.01f), vs = randn(rng, ring, 0.01f);
                    check_attention_group(*k, ref(), q, rows, KvRing<float>{kf.data(), nullptr, dim, ring},
                                          KvRing<float>{vf.data(), nullptr, dim, ring}, lo, hi);
                    // Each int8 row ends the allocation exactly: a kernel reading past a row's end
                    // shows under ASan (x86) here.
                    check_attention_group(*k, ref(), q, rows, KvRing<int8_t>{k8.data(), ks.data(), dim, ring},
                                          KvRing<int8_t>{v8.data(), vs.data(), dim, ring}, lo, hi);
                }
}

// NEEDLE_EXPECT_CPU_FEATURES="asimddp -sve" (names present, "-name" absent) checks the detection
// against a known CPU: scripts/cross-arm64.sh runs this under qemu-aarch64 with QEMU_CPU set to a
// core with and one without the dot product.
TEST_CASE("kernels: cpu features from the OS (arm64: getauxval)") {
    const needle::CpuFeatures &f = needle::cpu_features();
    const std::string names = needle::cpu_feature_names();
    MESSAGE("cpu features: " << (names.empty() ? std::string("(none beyond the baseline)") : names));
#if defined(__aarch64__)
    CHECK(f.neon);
    CHECK(names.rfind("neon", 0) == 0);
#else
    CHECK(!f.neon);
    CHECK(names.empty());
#endif
    CHECK(f.asimddp == ((" " + names + " ").find(" asimddp ") != std::string::npos));
    if (const char *want = std::getenv("NEEDLE_EXPECT_CPU_FEATURES")) {
        std::istringstream in(want);
        std::string w;
        int n = 0;
        while (in >> w) {
            const bool absent = w[0] == '-';
            const std::string name = absent ? w.substr(1) : w;
            INFO("expected " << (absent ? "absent: " : "present: ") << name);
            CHECK(((" " + names + " ").find(" " + name + " ") == std::string::npos) == absent);
            ++n;
        }
        CHECK(n > 0);
    }
}

// The large-buffer allocator of the KV rings, workspaces and rows-in-lanes weights.
TEST_CASE("huge pages: huge_alloc and HugeVector give aligned, usable memory of any size, overflow is bad_alloc") {
    using needle::huge_alloc, needle::huge_free, needle::HugeVector, needle::HugePageAllocator;
    for (const size_t bytes : {size_t(1), size_t(100), (size_t(2) << 20) - 1, size_t(2) << 20, size_t(5) << 20}) {
        INFO("bytes " << bytes);
        auto *p = static_cast<unsigned char *>(huge_alloc(bytes));
        REQUIRE(p != nullptr);
        CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0);
#if defined(__linux__)
        // A mapped block starts on a 2 MB boundary, so its whole 2 MB parts can be huge pages.
        if (bytes >= (size_t(2) << 20)) CHECK(reinterpret_cast<uintptr_t>(p) % (size_t(2) << 20) == 0);
#endif
        std::memset(p, 0xA5, bytes);
        CHECK(p[0] == 0xA5);
        CHECK(p[bytes - 1] == 0xA5);
        huge_free(p, bytes);
    }
    huge_free(nullptr, 123);  // like free(NULL)
    HugeVector<float> v(size_t(3) << 20, 1.5f);  // 12 MB: mapped
    CHECK(reinterpret_cast<uintptr_t>(v.data()) % 64 == 0);
    CHECK(std::count(v.begin(), v.end(), 1.5f) == long(v.size()));
    v.assign(1000, 0.0f);  // shrinking keeps the block; growing past it moves to a new one
    CHECK(std::count(v.begin(), v.end(), 0.0f) == 1000);
    v.assign(size_t(1) << 20, 2.0f);
    CHECK(v.back() == 2.0f);
    HugeVector<int8_t> small(10, int8_t(3));  // operator new
    CHECK(small[9] == 3);
    CHECK_THROWS_AS(HugePageAllocator<float>().allocate(size_t(-1) / 2), std::bad_alloc);
    CHECK_THROWS_AS(huge_alloc(size_t(-1) - 100), std::bad_alloc);
}
