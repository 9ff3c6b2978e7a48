// The container writer's given-weights mode (tools/cact_writer.h, issue 10): the trainer's
// exporter writes through it, so it must lay out exactly what the random mode lays out, keep
// FP16 values, honour per-tensor bits and refuse weights that are not the canon's.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "cact_writer.h"
#include "container/cact_v2.h"
#include "core/f16.h"

namespace {

using needle::writer::GivenTensor;
using needle::writer::GivenWeights;

// The canonical shapes of a geometry, read back from a random-weight file of it.
std::vector<std::vector<uint32_t>> canon_shapes(const needle::writer::Geometry &g) {
    const std::vector<uint8_t> f = needle::writer::write_cact_v2(g, 1);
    const needle::ContainerV2 c = needle::parse_cact_v2(f.data(), f.size());
    std::vector<std::vector<uint32_t>> out;
    for (const auto &t : c.tensors)
        if (t.dtype != needle::DType::RAW) out.emplace_back(t.shape, t.shape + t.ndim);
    return out;
}

// Weights with value v_i = ((i * 37) % 17 - 8) / 64 (exact in f16), bits 0 (class default).
GivenWeights given_for(const std::vector<std::vector<uint32_t>> &shapes) {
    GivenWeights w;
    for (const auto &s : shapes) {
        GivenTensor t;
        t.shape = s;
        size_t n = 1;
        for (uint32_t d : s) n *= d;
        for (size_t i = 0; i < n; ++i) t.values.push_back(float(int(i * 37 % 17) - 8) / 64.0f);
        w.tensors.push_back(std::move(t));
    }
    return w;
}

}  // namespace

TEST_CASE("writer: given weights keep the canon, FP16 values and per-tensor bits") {
    needle::writer::Geometry g = needle::writer::preset("tiny-edge");
    const auto shapes = canon_shapes(g);
    GivenWeights w = given_for(shapes);
    w.tensors[0].bits = 3;  // embedding at 3 bits instead of the class default 4
    const std::vector<uint8_t> f = needle::writer::write_cact_v2(g, w);
    const needle::ContainerV2 c = needle::parse_cact_v2(f.data(), f.size());
    REQUIRE(c.tensors.size() == shapes.size() + 1);  // + tokenizer
    CHECK(c.tensors[0].bits == 3);
    CHECK(c.tensors[c.canon.layer(0) + needle::kQProj].bits == g.bits_default);
    const auto &norm_in = c.tensors[c.canon.layer(0) + needle::kNormIn];
    REQUIRE(norm_in.dtype == needle::DType::F16);
    for (uint32_t i = 0; i < norm_in.shape[0]; ++i) {
        uint16_t h;
        std::memcpy(&h, norm_in.data + 2 * i, 2);
        CHECK(needle::f16_to_f32(h) == w.tensors[c.canon.layer(0)].values[i]);
    }
}

TEST_CASE("writer: given weights of the wrong count, shape or bits are refused") {
    needle::writer::Geometry g = needle::writer::preset("tiny-edge");
    const auto shapes = canon_shapes(g);
    GivenWeights w = given_for(shapes);
    w.tensors.pop_back();
    CHECK_THROWS_AS(needle::writer::write_cact_v2(g, w), std::invalid_argument);
    w = given_for(shapes);
    w.tensors.push_back(w.tensors.back());
    CHECK_THROWS_AS(needle::writer::write_cact_v2(g, w), std::invalid_argument);
    w = given_for(shapes);
    std::swap(w.tensors[2].shape[0], w.tensors[2].shape[1]);
    CHECK_THROWS_AS(needle::writer::write_cact_v2(g, w), std::invalid_argument);
    w = given_for(shapes);
    w.tensors[1].values.pop_back();
    CHECK_THROWS_AS(needle::writer::write_cact_v2(g, w), std::invalid_argument);
    w = given_for(shapes);
    w.tensors[0].bits = 6;
    CHECK_THROWS_AS(needle::writer::write_cact_v2(g, w), std::invalid_argument);
    g.with_heads = true;
    CHECK_THROWS_AS(needle::writer::write_cact_v2(g, given_for(shapes)), std::invalid_argument);
}
