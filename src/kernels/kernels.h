// Numeric kernels: Cactus-Quants matmul over rotated activations, FWHT, norms, RoPE,
// attention. Kernels know nothing of models: they take pointers, sizes and strides.
// Each call goes to the table of the active instruction set (dispatch.cpp).
//
// Specs: cq-kernels.md (CQ, FWHT), model-v2.md §2 (norms, RoPE, softmax).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/parallel.h"
#include "kernels/cq_matrix.h"
#include "kernels/kv_ring.h"

namespace needle {

// xh[0..cols_pad) := per-group normalised FWHT of x[0..cols) zero-padded (cq-kernels.md §6).
// One prepared vector serves every CQ matrix with the same (cols, group).
void cq_prepare_input(const float *x, uint32_t cols, uint32_t cols_pad, uint32_t group, float *xh);

// Y[p][r - r0] = W[r] . x_p for rows r0..r0+count-1 and positions p < n_pos, where the prepared
// inputs are xh + p*xh_stride (cols_pad floats each) and outputs y + p*y_stride.
// Each weight group is decoded once and applied to every position; the per-position result
// does not depend on n_pos, count or threading (cq-kernels.md §7.1, §9): matvec == matmul, bitwise.
void cq_matmul(const CqMatrix &w, const float *xh, size_t xh_stride, size_t n_pos, uint32_t r0,
               uint32_t count, float *y, size_t y_stride);

// One product of cq_matmul_many: rows r0..r0+count-1 of *w into y (y_stride floats per position).
struct CqProduct {
    const CqMatrix *w;
    uint32_t r0, count;
    float *y;
    size_t y_stride;
};

// cq_matmul of several matrices over the same prepared inputs (same cols_pad), as one parallel
// region: the same bits as one cq_matmul per product. `side`, if given, is a job independent of
// the products (it reads and writes none of their inputs or outputs), run once, at the start of
// the region's first range of rows (the calling thread's, as a rule): per-position work such as
// the mHC Sinkhorn then costs its share of the threads, the other one taking more of the rows,
// instead of a serial stretch on one. It must not call cq_matmul_many itself (the FAST path
// keeps ~96 KB of quantised inputs on the stack per call).
void cq_matmul_many(const CqProduct *products, uint32_t n_products, const float *xh, size_t xh_stride,
                    size_t n_pos, const FunctionRef<void()> *side = nullptr);

// Owner of the rows-in-lanes copies of a model's CQ matrices: one anonymous mapping, 2 MB
// aligned so that the kernel can back it with huge pages (a 4 KB page fault per 4 KB of copy
// cost more than the copying itself). It counts in RSS as the process's own memory; the mapped
// file's pages of those matrices are no longer read by cq_matmul (cq_dequantize_row still reads
// `packed`).
class CqBlockStore {
public:
    CqBlockStore() = default;
    CqBlockStore(const CqBlockStore &) = delete;
    CqBlockStore &operator=(const CqBlockStore &) = delete;
    ~CqBlockStore() { reset(); }
    // Frees the copies; then reserves `bytes` (64-byte aligned, uninitialised). Throws std::bad_alloc.
    uint8_t *reserve(size_t bytes);
    void reset();
    size_t bytes() const { return bytes_; }  // size of the copies (0: the kernels read the stored form)

private:
    uint8_t *base_ = nullptr;  // huge_alloc(bytes_) (core/huge_pages.h)
    size_t bytes_ = 0;
};

// Makes the active kernels' rows-in-lanes copy (cq_matrix.h) of each of the n matrices in
// `store` and points each matrix's `blocked` / `block_rows` at it. A no-op (bytes 0) for kernels
// that read the stored form (scalar, sse4_2, neon). Call once at load, before any cq_matmul;
// the store must outlive the matrices' use. Throws std::bad_alloc only.
void cq_block_matrices(CqMatrix *const *ms, size_t n, CqBlockStore &store);

// w[0..cols) := reconstructed row r (norm applied before the rotation, cq-kernels.md §10).
void cq_dequantize_row(const CqMatrix &w, uint32_t r, float *out);

// In-place normalised Walsh-Hadamard transform, Sylvester order; m a power of two (§4).
void fwht(float *x, uint32_t m);

// y = x * (1 / sqrt(mean(x^2) + 1e-6))  (model-v2.md §2 rms_unit). y may alias x.
void rms_unit(const float *x, uint32_t n, float *y);

// y = (1 + gamma) * x / sqrt(mean(x^2) + 1e-6)  (model-v2.md §2 zcrms). y may alias x.
void zcrms(const float *x, const float *gamma, uint32_t n, float *y);

// Half-split RoPE of one head vector x[dim] at the angles given by cos/sin[dim/2]
// (model-v2.md §2.1): pairs (i, i + dim/2).
void rope(float *x, uint32_t dim, const float *cos_row, const float *sin_row);

// Single-query attention over keys at positions lo..hi (inclusive) of a KV ring (kv_ring.h):
// out[v.dim] = softmax_j(q . k_j / sqrt(k.dim)) weighted sum of v_j. scores: hi-lo+1 floats.
// The int8 form reads rows as scale * int8 (model-v2.md §4.4: an optional, not bit-faithful cache).
void attention_head(const float *q, const KvRing<float> &k, const KvRing<float> &v, uint32_t lo,
                    uint32_t hi, float *scores, float *out);
void attention_head(const float *q, const KvRing<int8_t> &k, const KvRing<int8_t> &v, uint32_t lo,
                    uint32_t hi, float *scores, float *out);

// `rows` queries sharing one KV ring and one key range (the query heads of a GQA group at one
// position): query r at q + r * q_stride, its scores at scores + r * s_stride (hi - lo + 1
// floats), its output at out + r * o_stride. Query r gets the bits attention_head gives it;
// the SIMD kernels read each key block once for the whole group.
void attention_rows(const float *q, size_t q_stride, uint32_t rows, const KvRing<float> &k, const KvRing<float> &v,
                    uint32_t lo, uint32_t hi, float *scores, size_t s_stride, float *out, size_t o_stride);
void attention_rows(const float *q, size_t q_stride, uint32_t rows, const KvRing<int8_t> &k,
                    const KvRing<int8_t> &v, uint32_t lo, uint32_t hi, float *scores, size_t s_stride, float *out,
                    size_t o_stride);

// Symmetric int8 of x[0..n): scale = max|x| / 127 (0 for an all-zero x), q[i] = round(x[i] / scale)
// to nearest, ties away from zero. The same code for every ISA, so an int8 cache is identical
// whichever kernels wrote it.
void quantize_i8(const float *x, uint32_t n, int8_t *q, float *scale);

// Log-domain Sinkhorn on `count` matrices m + k*n*n, each n x n, n <= 64 (model-v2.md §2.2 =
// model-v3.md §2.3): 20 rounds of row then column log-sum-exp subtraction, then exp. Each
// matrix gets the bits it would get alone (a kernel may interleave matrices for throughput,
// never mix them), so a position's routing is the same in a decode step and a prefill chunk.
void sinkhorn(float *m, uint32_t n, uint32_t count = 1);

// y[i] = x[i] * sigmoid(x[i]) for i < n (SiLU, model-v2.md §2); y may alias x.
void silu(const float *x, uint32_t n, float *y);

// x[i] *= sigmoid(g[i]) for i < n: the attention output gate (model-v2.md §5.5 o ⊙ σ(gl),
// model-v3.md §1.3 step 7). The scalar table calls the inline sigmoid below (libm's exp); the
// vector tables xsimd's exp, a few ulp from it. Each position alone, so a decode step and a
// prefill chunk give a position the same bits.
void sigmoid_gate(float *x, const float *g, uint32_t n);

// One probe's online softmax pooling of n cells in position order (model-v2.md §7.2, in
// double): cell i is cells + i*cell_stride (D floats), skipped when tokens[i] == 0 (PAD);
// z = dot(cell, q) * inv_sqrt_d; a = [running max, denominator, D weighted sums] is rescaled on a
// new maximum and accumulated. Every ISA gives the scalar reference's bits (its dot order, no
// fused multiply-add), so do one call over n cells and n calls over one; exps are libm's.
void pool_probe(const float *q, const float *cells, size_t cell_stride, const uint32_t *tokens, uint32_t n,
                uint32_t D, double inv_sqrt_d, double *a);

// mHC lane mixing (model-v2.md §3 steps 5.8-5.9 = model-v3.md §1.3): the lanes X [N][D] become
// X_k := ((0 + R[k][0] X_0) + R[k][1] X_1 + ... + R[k][N-1] X_{N-1}) + hp[k] y, every X_j taken
// from before the update (Xs [N][D] is scratch for that snapshot), each product rounded, no
// fused multiply-add: every ISA gives the scalar reference's bits. R [N][N], hp [N], y [D].
void mhc_mix(const float *R, const float *hp, const float *y, uint32_t N, uint32_t D, float *X, float *Xs);

inline float sigmoid(float z);

// Name of the kernel instruction set in use: "avx512", "avx2", "sse4_2", "neon" or "scalar".
// Chosen once per process: the best this CPU runs, or NEEDLE_FORCE_ISA when it names a lower one.
const char *kernel_isa();
// NEEDLE_FORCE_ISA as read when the kernels were chosen ("" if unset or empty; at most 31 bytes).
// Differs from kernel_isa() exactly when the request was refused (an unknown name, an ISA not in
// this build or not run by this CPU): the best ISA runs then, and nothing is printed.
const char *kernel_isa_requested();

}  // namespace needle

#include <cmath>
inline float needle::sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }
