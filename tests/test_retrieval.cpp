// Tool retrieval (tool-calling.md §9, src/chat/retrieval.h) against the fixture block
// `retrieval_convention` of shared/fixtures/tool-calling (retrieval_eight_tools, needle2), and
// the index file: reuse, per-entry recomputation, damaged files, atomic rewrite. Also SHA-256.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <fstream>

#include "chat/retrieval.h"
#include "core/error.h"
#include "core/sha256.h"
#include "fixtures.h"

namespace {

using namespace needle;

std::string hex(const Sha256::Digest &d) {
    static const char *x = "0123456789abcdef";
    std::string s;
    for (uint8_t b : d) s += x[b >> 4], s += x[b & 15];
    return s;
}

std::shared_ptr<const Model> load_v2(const std::string &name) {
    return load_model(FileBytes::open(fixtures::v2("models/" + name + ".cact").c_str(), true), LoadOptions{});
}

std::string temp_path(const char *tag) {
    return "/tmp/needle_test_" + std::to_string(::getpid()) + "_" + tag + ".idx";
}

std::vector<uint8_t> file_bytes(const std::string &p) { return fixtures::read_bytes(p); }

}  // namespace

TEST_CASE("retrieval: sha256 test vectors and the fixture container's digest") {
    CHECK(hex(Sha256::of("")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    CHECK(hex(Sha256::of("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    CHECK(hex(Sha256::of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    Sha256 s;  // one million 'a', fed in uneven pieces
    const std::string piece(997, 'a');
    size_t left = 1000000;
    while (left) {
        const size_t n = std::min(left, piece.size());
        s.update(piece.data(), n);
        left -= n;
    }
    CHECK(hex(s.final()) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    const auto c = fixtures::read_json(fixtures::dir() + "/tool-calling/cases/retrieval_eight_tools.json");
    const std::vector<uint8_t> cact = fixtures::read_bytes(fixtures::v2("models/needle2.cact"));
    CHECK(hex(Sha256::of(std::string_view(reinterpret_cast<const char *>(cact.data()), cact.size()))) ==
          std::string(c["retrieval_convention"]["container_sha256"]));
}

TEST_CASE("retrieval: the fixture's retrieval_convention on needle2, and the index file") {
    if (fixtures::kSanitized) return;  // needle2 embeddings of 9 texts, several times: slow under ASan
    const auto c = fixtures::read_json(fixtures::dir() + "/tool-calling/cases/retrieval_eight_tools.json");
    const auto &rc = c["retrieval_convention"];
    const std::vector<std::string> texts = rc["tool_texts"];
    const std::vector<double> ref_scores = rc["scores"];
    const std::vector<uint32_t> want = rc["selected_in_declaration_order"];
    auto m = load_v2("needle2");

    // Head inputs are BOS + encode(text), as the fixture recorded them.
    const std::vector<std::vector<uint32_t>> tool_ids = rc["tool_input_ids"];
    for (size_t i = 0; i < texts.size(); ++i) {
        std::vector<uint32_t> ids{m->tokenizer()->bos_id()};
        m->tokenizer()->encode(texts[i], ids);
        CHECK(ids == tool_ids[i]);
    }
    const std::string path = temp_path("ret");
    std::remove(path.c_str());
    chat::ToolIndex idx(m, texts, path);
    CHECK(idx.size() == 8);
    CHECK(idx.dim() == 128);
    CHECK(idx.recomputed() == 8);
    std::vector<float> q(idx.dim());
    idx.embed(std::string(c["query"]), q.data());
    double worst = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
        double s = 0;
        for (uint32_t d = 0; d < idx.dim(); ++d) s += double(q[d]) * idx.embedding(i)[d];
        worst = std::max(worst, std::fabs(s - ref_scores[i]));
    }
    MESSAGE("max |score - ref| " << worst << " (margin 5th vs 6th " << double(rc["margin_5th_vs_6th"]) << ")");
    CHECK(worst < 1e-4);
    CHECK(idx.select(std::string(c["query"])) == want);

    // The file: header, fingerprint, one entry per tool in declaration order.
    const std::vector<uint8_t> f1 = file_bytes(path);
    CHECK(f1.size() == 8 + 4 + 32 + 4 + 4 + 8 * (32 + 4 * 128));
    CHECK(std::string(f1.begin(), f1.begin() + 8) == "NDLTIDX1");
    CHECK(std::equal(idx.fingerprint().begin(), idx.fingerprint().end(), f1.begin() + 12));
    const Sha256::Digest h0 = Sha256::of(texts[0]);
    CHECK(std::equal(h0.begin(), h0.end(), f1.begin() + 52));

    // A second build reads everything from the file (same bits) and leaves it alone.
    chat::ToolIndex again(m, texts, path);
    CHECK(again.recomputed() == 0);
    for (size_t i = 0; i < 8; ++i) CHECK(std::memcmp(again.embedding(i), idx.embedding(i), 4 * 128) == 0);
    CHECK(file_bytes(path) == f1);

    // One changed tool and a new order: only that one is embedded; the file lists the new set.
    std::vector<std::string> changed = texts;
    changed[3] = "{\"name\":\"open_window\",\"description\":\"Open a window.\",\"parameters\":{\"type\":\"object\","
                 "\"properties\":{},\"required\":[]}}";
    std::swap(changed[0], changed[1]);
    chat::ToolIndex third(m, changed, path);
    CHECK(third.recomputed() == 1);
    CHECK(std::memcmp(third.embedding(0), idx.embedding(1), 4 * 128) == 0);
    CHECK(file_bytes(path).size() == f1.size());
    chat::ToolIndex fourth(m, changed, path);
    CHECK(fourth.recomputed() == 0);

    // A damaged file (truncated, or another fingerprint) is rebuilt, not trusted.
    std::vector<uint8_t> bad = file_bytes(path);
    bad[20] ^= 1;
    {
        std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char *>(bad.data()), bad.size());
    }
    chat::ToolIndex fifth(m, changed, path);
    CHECK(fifth.recomputed() == 8);
    {
        std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char *>(bad.data()), 100);
    }
    chat::ToolIndex sixth(m, changed, path);
    CHECK(sixth.recomputed() == 8);
    CHECK(file_bytes(path).size() == f1.size());
    std::remove(path.c_str());
}

TEST_CASE("retrieval: selection order, ties and small catalogues") {
    auto m = load_v2("tiny");
    const std::vector<std::string> texts{"{\"name\":\"a\"}", "{\"name\":\"b\"}", "{\"name\":\"a\"}",
                                         "{\"name\":\"c\"}", "{\"name\":\"d\"}", "{\"name\":\"a\"}",
                                         "{\"name\":\"e\"}"};
    chat::ToolIndex idx(m, texts);  // no file
    CHECK(idx.recomputed() == 7);
    // Tools 0, 2 and 5 have one text, so equal scores: the lower indices win the ties.
    const float *a = idx.embedding(0);
    CHECK(std::memcmp(a, idx.embedding(2), 4 * idx.dim()) == 0);
    const std::vector<uint32_t> top2 = idx.select_embedding(a, 2);
    CHECK(top2 == std::vector<uint32_t>{0, 2});
    const std::vector<uint32_t> top5 = idx.select_embedding(a, 5);
    CHECK(top5.size() == 5);
    CHECK(std::is_sorted(top5.begin(), top5.end()));
    CHECK(std::count(top5.begin(), top5.end(), 5u) == 1);
    CHECK(idx.select("anything", 10).size() == 7);
    // A model without the head cannot retrieve.
    auto odd = load_v2("odd");
    CHECK_THROWS_AS(chat::ToolIndex(odd, texts), Error);
    // An unwritable index path is an I/O error.
    try {
        chat::ToolIndex bad(m, texts, "/nonexistent-dir/x.idx");
        FAIL("no error");
    } catch (const Error &e) {
        CHECK(e.code() == NEEDLE_E_IO);
    }
}
