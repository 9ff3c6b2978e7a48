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

// Scores of keys j0 .. (multiples of W) into scores; returns the first key not done and the
// lane-wise max so far. C = dim / W chunks, a compile-time count (unrolled, q in registers).
template <uint32_t C, class T>
uint32_t attention_scores(const float *q, const KvRing<T> &k, uint32_t lo, uint32_t n, float *scores, Vec &vmx) {
    Vec qv[C];
    for (uint32_t c = 0; c < C; ++c) qv[c] = load(q + c * W);
    const Vec vsc(std::sqrt(float(k.dim)));
    uint32_t slot0 = lo % k.ring, j = 0;
    for (; j + W <= n; j += W) {
        Vec part[W];
        alignas(64) float ks[W];
        uint32_t slot = slot0;
        for (uint32_t t = 0; t < W; ++t) {
            part[t] = key_dot<C>(qv, k.base + size_t(slot) * k.dim);
            ks[t] = k.scales ? k.scales[slot] : 1.0f;
            slot = slot + 1 == k.ring ? 0 : slot + 1;
        }
        slot0 = slot;
        const Vec s = sum_lanes(part) * Vec::load_aligned(ks) / vsc;
        s.store_unaligned(scores + j);
        vmx = xsimd::max(vmx, s);
    }
    return j;
}

// out = sum_j scores[j] * v_j, the output in C registers.
template <uint32_t C, class T>
void attention_values(const float *scores, const KvRing<T> &v, uint32_t lo, uint32_t n, float *out) {
    Vec acc[C];
    for (uint32_t c = 0; c < C; ++c) acc[c] = Vec(0.0f);
    uint32_t slot = lo % v.ring;
    for (uint32_t j = 0; j < n; ++j) {
        const T *vr = v.base + size_t(slot) * v.dim;
        const Vec wj(scores[j]);
        for (uint32_t c = 0; c < C; ++c) acc[c] = vfma(wj, load(vr + c * W), acc[c]);
        slot = slot + 1 == v.ring ? 0 : slot + 1;
    }
    for (uint32_t c = 0; c < C; ++c) acc[c].store_unaligned(out + c * W);
}

template <class T>
void attention_rows(const float *q, const KvRing<T> &k, const KvRing<T> &v, uint32_t lo, uint32_t hi,
                    float *scores, float *out) {
    const float sc = std::sqrt(float(k.dim));
    const uint32_t n = hi - lo + 1;
    uint32_t j = 0;
    Vec vmxv(-INFINITY);
    if (k.dim % W == 0) switch (k.dim / W) {  // v2/v3 head widths 32, 48, 64 (and 24/W on SSE, NEON)
        case 1: j = attention_scores<1>(q, k, lo, n, scores, vmxv); break;
        case 2: j = attention_scores<2>(q, k, lo, n, scores, vmxv); break;
        case 3: j = attention_scores<3>(q, k, lo, n, scores, vmxv); break;
        case 4: j = attention_scores<4>(q, k, lo, n, scores, vmxv); break;
        case 6: j = attention_scores<6>(q, k, lo, n, scores, vmxv); break;
        case 8: j = attention_scores<8>(q, k, lo, n, scores, vmxv); break;
        case 12: j = attention_scores<12>(q, k, lo, n, scores, vmxv); break;
        case 16: j = attention_scores<16>(q, k, lo, n, scores, vmxv); break;
        default: break;  // other widths: the per-key path below
        }
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
    if (v.dim % W == 0) switch (v.dim / W) {
        case 1: attention_values<1>(scores, v, lo, n, out); return;
        case 2: attention_values<2>(scores, v, lo, n, out); return;
        case 3: attention_values<3>(scores, v, lo, n, out); return;
        case 4: attention_values<4>(scores, v, lo, n, out); return;
        case 6: attention_values<6>(scores, v, lo, n, out); return;
        case 8: attention_values<8>(scores, v, lo, n, out); return;
        case 12: attention_values<12>(scores, v, lo, n, out); return;
        case 16: attention_values<16>(scores, v, lo, n, out); return;
        default: break;
        }
    for (uint32_t d = 0; d < v.dim; ++d) out[d] = 0.0f;
    for (j = 0; j < n; ++j) axpy(scores[j], v.base + size_t((lo + j) % v.ring) * v.dim, out, v.dim);
}
