// The SIMD attention kernels of kernels_simd.cpp, included inside its ISA namespace (they use
// its Vec, W, load, vfma, dot and axpy): one query against the keys lo..hi of a KV ring.
#pragma once

// Softmax attention over a ring of float rows or int8 rows with per-slot scales (f32 rings have
// scale 1, an exact multiply: their bits are those of plain f32 attention).
//
// Keys are taken W at a time (one per lane of the score vector): key t's products with q are
// summed over the dim / W chunks into one vector, and haddp sums the W vectors into the W
// scores at once (no horizontal sum per key). The output stays in dim / W registers across the
// keys. Every step depends only on q and the keys lo..hi, so a query gives the same bits in a
// decode step and inside a prefill chunk. Dims that are not a multiple of W take the per-key
// path (dot / axpy).
// Lane t of the result = the sum of the lanes of part[t] (xsimd::haddp, whose AVX-512 form in
// xsimd 8.1 returns the lanes in another order: ours is a transpose-and-add tree, 45 shuffles
// and adds for 16 vectors).
inline Vec sum_lanes(const Vec *part) {
#if defined(__AVX512F__)
    // The tree leaves lane 4q + m holding input (0, 2, 1, 3)[m] + (0, 8, 4, 12)[q]: feed it the
    // inputs in that order so that lane t ends up with part[t].
    static constexpr uint8_t kAt[16] = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15};
    __m512 r[16], s[8], v[4], w[2];
    for (uint32_t t = 0; t < 16; ++t) r[kAt[t]] = part[t];
    for (uint32_t i = 0; i < 8; ++i)
        s[i] = _mm512_add_ps(_mm512_shuffle_f32x4(r[i], r[i + 8], 0x44), _mm512_shuffle_f32x4(r[i], r[i + 8], 0xEE));
    for (uint32_t i = 0; i < 4; ++i)
        v[i] = _mm512_add_ps(_mm512_shuffle_f32x4(s[i], s[i + 4], 0x88), _mm512_shuffle_f32x4(s[i], s[i + 4], 0xDD));
    for (uint32_t i = 0; i < 2; ++i)
        w[i] = _mm512_add_ps(_mm512_shuffle_ps(v[i], v[i + 2], 0x44), _mm512_shuffle_ps(v[i], v[i + 2], 0xEE));
    return Vec(_mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xDD)));
#else
    return xsimd::haddp(part);
#endif
}

template <uint32_t C, class T>
inline Vec key_dot(const Vec *qv, const T *row) {
    Vec a = qv[0] * load(row);
    for (uint32_t c = 1; c < C; ++c) a = vfma(qv[c], load(row + c * W), a);
    return a;
}

// Scores of keys 0 .. (multiples of W) of `rows` queries (q + r * q_stride into scores +
// r * s_stride): key block outer, query inner, so a block of W keys is read from L2 once and
// from L1 by the other queries of the group. Per query the bits of one call alone; vmx[r] is
// query r's lane-wise max. Returns the first key not done.
template <uint32_t C, class T>
uint32_t attention_scores_rows(const float *q, size_t q_stride, uint32_t rows, const KvRing<T> &k, uint32_t lo,
                               uint32_t n, float *scores, size_t s_stride, Vec *vmx) {
    const Vec vsc(std::sqrt(float(k.dim)));
    uint32_t slot0 = lo % k.ring, j = 0;
    for (; j + W <= n; j += W) {
        alignas(64) float ks[W];
        const T *row[W];
        uint32_t slot = slot0;
        for (uint32_t t = 0; t < W; ++t) {
            row[t] = k.base + size_t(slot) * k.dim;
            ks[t] = k.scales ? k.scales[slot] : 1.0f;
            slot = slot + 1 == k.ring ? 0 : slot + 1;
        }
        slot0 = slot;
        for (uint32_t r = 0; r < rows; ++r) {
            Vec qv[C], part[W];
            for (uint32_t c = 0; c < C; ++c) qv[c] = load(q + r * q_stride + c * W);
            for (uint32_t t = 0; t < W; ++t) part[t] = key_dot<C>(qv, row[t]);
            const Vec s = sum_lanes(part) * Vec::load_aligned(ks) / vsc;
            s.store_unaligned(scores + r * s_stride + j);
            vmx[r] = xsimd::max(vmx[r], s);
        }
    }
    return j;
}

// out_r = sum_j scores_r[j] * v_j for R queries at once: each V row is loaded once for the R
// of them, and the R * C accumulators (independent FMA chains) stay in registers across the
// keys. Per query the sum runs over j in order, as for R = 1: the same bits.
template <uint32_t R, uint32_t C, class T>
void attention_values(const float *scores, size_t s_stride, const KvRing<T> &v, uint32_t lo, uint32_t n,
                      float *out, size_t o_stride) {
    Vec acc[R][C];
    for (uint32_t r = 0; r < R; ++r)
        for (uint32_t c = 0; c < C; ++c) acc[r][c] = Vec(0.0f);
    uint32_t slot = lo % v.ring;
    for (uint32_t j = 0; j < n; ++j) {
        const T *vr = v.base + size_t(slot) * v.dim;
        for (uint32_t c = 0; c < C; ++c) {
            const Vec x = load(vr + c * W);
            for (uint32_t r = 0; r < R; ++r) acc[r][c] = vfma(Vec(scores[r * s_stride + j]), x, acc[r][c]);
        }
        slot = slot + 1 == v.ring ? 0 : slot + 1;
    }
    for (uint32_t r = 0; r < R; ++r)
        for (uint32_t c = 0; c < C; ++c) acc[r][c].store_unaligned(out + r * o_stride + c * W);
}

// Values of `rows` queries, R at a time where R * C accumulators fit the register file (32
// vectors on AVX-512, 16 elsewhere, leaving room for the loaded row).
template <uint32_t C, class T>
void attention_values_rows(const float *scores, size_t s_stride, uint32_t rows, const KvRing<T> &v, uint32_t lo,
                           uint32_t n, float *out, size_t o_stride) {
#if defined(__AVX512F__)
    constexpr uint32_t kRegs = 32;
#else
    constexpr uint32_t kRegs = 16;
#endif
    uint32_t r = 0;
    if (4 * C + 4 <= kRegs)
        for (; r + 4 <= rows; r += 4) attention_values<4, C>(scores + r * s_stride, s_stride, v, lo, n, out + r * o_stride, o_stride);
    if (2 * C + 2 <= kRegs)
        for (; r + 2 <= rows; r += 2) attention_values<2, C>(scores + r * s_stride, s_stride, v, lo, n, out + r * o_stride, o_stride);
    for (; r < rows; ++r) attention_values<1, C>(scores + r * s_stride, s_stride, v, lo, n, out + r * o_stride, o_stride);
}

// softmax of query r's scores in place, then the weights scores[j] / sum * v-scale_j: keys j0..
// are still to be scored (the per-key path), vmxv is the lane-wise max of keys 0..j0.
template <class T>
void attention_softmax(const float *q, const KvRing<T> &k, const KvRing<T> &v, uint32_t lo, uint32_t n, uint32_t j,
                       Vec vmxv, float *scores) {
    const float sc = std::sqrt(float(k.dim));
    float mx = -INFINITY;
    {
        alignas(64) float m[W];
        vmxv.store_aligned(m);
        for (uint32_t t = 0; t < W; ++t) mx = m[t] > mx ? m[t] : mx;
    }
    for (; j < n; ++j) {
        const uint32_t slot = (lo + j) % k.ring;
        const float ks = k.scales ? k.scales[slot] : 1.0f;
        scores[j] = dot(q, k.base + size_t(slot) * k.dim, k.dim) * ks / sc;
        mx = scores[j] > mx ? scores[j] : mx;
    }
    // exp over W scores at a time (xsimd's exp is within a few ulp of libm's expf).
    const Vec vmx(mx);
    Vec vsum(0.0f);
    for (j = 0; j + W <= n; j += W) {
        const Vec e = xsimd::exp(load(scores + j) - vmx);
        e.store_unaligned(scores + j);
        vsum += e;
    }
    float sum = xsimd::hadd(vsum);
    for (; j < n; ++j) {
        scores[j] = std::exp(scores[j] - mx);
        sum += scores[j];
    }
    // Weights scores[j] / sum * scale_j, W at a time (a true division, as in the scalar kernel).
    const Vec vs(sum);
    for (j = 0; j + W <= n; j += W) {
        Vec e = load(scores + j) / vs;
        if (v.scales) {
            alignas(64) float s8[W];
            for (uint32_t t = 0; t < W; ++t) s8[t] = v.scales[(lo + j + t) % v.ring];
            e = e * Vec::load_aligned(s8);
        }
        e.store_unaligned(scores + j);
    }
    for (; j < n; ++j) scores[j] = scores[j] / sum * (v.scales ? v.scales[(lo + j) % v.ring] : 1.0f);
}

// Up to kMaxGroupRows queries (the heads of one GQA group at one position) against keys
// lo..hi of one KV ring: query r at q + r * q_stride, its scores row at scores + r * s_stride
// (hi - lo + 1 floats), its output at out + r * o_stride. Each query gets the bits it gets alone.
constexpr uint32_t kMaxGroupRows = 16;  // queries per pass of attention_group (their maxima on the stack)

template <class T>
void attention_group(const float *q, size_t q_stride, uint32_t rows, const KvRing<T> &k, const KvRing<T> &v,
                     uint32_t lo, uint32_t hi, float *scores, size_t s_stride, float *out, size_t o_stride) {
    const uint32_t n = hi - lo + 1;
    uint32_t j = 0;
    Vec vmx[kMaxGroupRows];
    for (uint32_t r = 0; r < rows; ++r) vmx[r] = Vec(-INFINITY);
#define NEEDLE_SCORES(c) j = attention_scores_rows<c>(q, q_stride, rows, k, lo, n, scores, s_stride, vmx); break
    if (k.dim % W == 0) switch (k.dim / W) {  // v2/v3 head widths 32, 48, 64 (and 24/W on SSE, NEON)
        case 1: NEEDLE_SCORES(1);
        case 2: NEEDLE_SCORES(2);
        case 3: NEEDLE_SCORES(3);
        case 4: NEEDLE_SCORES(4);
        case 6: NEEDLE_SCORES(6);
        case 8: NEEDLE_SCORES(8);
        case 12: NEEDLE_SCORES(12);
        case 16: NEEDLE_SCORES(16);
        default: break;  // other widths: the per-key path of attention_softmax
        }
#undef NEEDLE_SCORES
    for (uint32_t r = 0; r < rows; ++r) attention_softmax(q + r * q_stride, k, v, lo, n, j, vmx[r], scores + r * s_stride);
#define NEEDLE_VALUES(c) attention_values_rows<c>(scores, s_stride, rows, v, lo, n, out, o_stride); return
    if (v.dim % W == 0) switch (v.dim / W) {
        case 1: NEEDLE_VALUES(1);
        case 2: NEEDLE_VALUES(2);
        case 3: NEEDLE_VALUES(3);
        case 4: NEEDLE_VALUES(4);
        case 6: NEEDLE_VALUES(6);
        case 8: NEEDLE_VALUES(8);
        case 12: NEEDLE_VALUES(12);
        case 16: NEEDLE_VALUES(16);
        default: break;
        }
#undef NEEDLE_VALUES
    for (uint32_t r = 0; r < rows; ++r) {
        float *o = out + r * o_stride;
        const float *sr = scores + r * s_stride;
        for (uint32_t d = 0; d < v.dim; ++d) o[d] = 0.0f;
        for (j = 0; j < n; ++j) axpy(sr[j], v.base + size_t((lo + j) % v.ring) * v.dim, o, v.dim);
    }
}

// Any number of queries, kMaxGroupRows at a time.
template <class T>
void attention_rows(const float *q, size_t q_stride, uint32_t rows, const KvRing<T> &k, const KvRing<T> &v,
                    uint32_t lo, uint32_t hi, float *scores, size_t s_stride, float *out, size_t o_stride) {
    for (uint32_t r = 0; r < rows; r += kMaxGroupRows)
        attention_group(q + r * q_stride, q_stride, std::min(kMaxGroupRows, rows - r), k, v, lo, hi,
                        scores + r * s_stride, s_stride, out + r * o_stride, o_stride);
}
