// Tool retrieval (retrieval.h, tool-calling.md §9).
#include "chat/retrieval.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string_view>
#include <unordered_map>

#include "core/error.h"
#include "model/probe_heads.h"

namespace needle {
namespace chat {

namespace {

constexpr char kMagic[8] = {'N', 'D', 'L', 'T', 'I', 'D', 'X', '1'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeader = 8 + 4 + 32 + 4 + 4;
constexpr uint64_t kMaxFileBytes = uint64_t(1) << 28;  // a larger file is not ours: rebuild
constexpr uint32_t kChunk = 32;                          // prefill chunk of the embeddings

struct File {
    std::FILE *f;
    ~File() {
        if (f) std::fclose(f);
    }
};
struct Fd {
    int fd;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

}  // namespace

ToolIndex::ToolIndex(std::shared_ptr<const Model> model, const std::vector<std::string> &tool_texts,
                     const std::string &index_path)
    : model_(std::move(model)) {
    const Model &m = *model_;
    dim_ = m.probe_head_dim(ProbeHead::Contrastive);
    if (dim_ == 0) fail(NEEDLE_E_UNSUPPORTED, "tool retrieval: the model has no contrastive head");
    if (!m.tokenizer()) fail(NEEDLE_E_UNSUPPORTED, "tool retrieval: the model has no tokenizer");
    Sha256 fp;
    for (const Model::ByteSpan &t : m.probe_head_tensors(ProbeHead::Contrastive)) fp.update(t.data, t.size);
    fingerprint_ = fp.final();
    SequenceOptions opt;  // the model's window, no sinks: tool texts and queries are short
    opt.probe_heads = true;
    seq_ = m.new_sequence(opt);
    ws_ = m.new_workspace(std::min(kChunk, m.info().max_seq_len));

    count_ = tool_texts.size();
    emb_.assign(count_ * dim_, 0.0f);
    text_hash_.resize(count_);
    for (size_t i = 0; i < count_; ++i) text_hash_[i] = Sha256::of(tool_texts[i]);

    std::vector<Sha256::Digest> file_hashes;
    std::vector<float> file_rows;
    const bool have_file = !index_path.empty() && read_file(index_path, file_hashes, file_rows);
    bool exact = have_file && file_hashes.size() == count_;
    // Hash -> first row of the file: one lookup per tool (linear in the tool count).
    std::unordered_map<std::string_view, size_t> row_of;
    row_of.reserve(file_hashes.size());
    for (size_t j = 0; j < file_hashes.size(); ++j)
        row_of.emplace(std::string_view(reinterpret_cast<const char *>(file_hashes[j].data()), 32), j);
    for (size_t i = 0; i < count_; ++i) {
        const auto it = row_of.find(std::string_view(reinterpret_cast<const char *>(text_hash_[i].data()), 32));
        const size_t j = it == row_of.end() ? file_hashes.size() : it->second;
        if (j < file_hashes.size()) {
            std::copy_n(file_rows.data() + j * dim_, dim_, emb_.data() + i * dim_);
            exact = exact && j == i;
        } else {
            embed(tool_texts[i], emb_.data() + i * dim_);
            ++recomputed_;
            exact = false;
        }
    }
    if (!index_path.empty() && !exact) write_file(index_path);
}

void ToolIndex::embed(std::string_view text, float *out) {
    const Model &m = *model_;
    ids_.clear();
    ids_.push_back(m.tokenizer()->bos_id());
    m.tokenizer()->encode(text, ids_);
    // Past max_seq_len only the first max_seq_len tokens are embedded.
    const size_t n = std::min<size_t>(ids_.size(), m.info().max_seq_len);
    seq_->reset();
    feed(m, *seq_, *ws_, ids_.data(), n, nullptr);
    contrastive_embedding(m, *seq_, out);
}

std::vector<uint32_t> ToolIndex::select(std::string_view query, uint32_t k) {
    std::vector<float> q(dim_);
    embed(query, q.data());
    return select_embedding(q.data(), k);
}

std::vector<uint32_t> ToolIndex::select_embedding(const float *query, uint32_t k) const {
    std::vector<double> score(count_);
    for (size_t i = 0; i < count_; ++i) {
        double s = 0.0;
        for (uint32_t d = 0; d < dim_; ++d) s += double(query[d]) * double(emb_[i * dim_ + d]);
        score[i] = s;
    }
    std::vector<uint32_t> order(count_);
    std::iota(order.begin(), order.end(), 0u);
    // Highest score first; equal scores keep the lower declaration index first.
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return score[a] > score[b]; });
    order.resize(std::min<size_t>(k, count_));
    std::sort(order.begin(), order.end());
    return order;
}

bool ToolIndex::read_file(const std::string &path, std::vector<Sha256::Digest> &hashes, std::vector<float> &rows) const {
    // Opened as the model loader opens a container (load.cpp): O_NONBLOCK so that a FIFO (or a
    // device that waits) cannot block needle_chat_create until a writer comes, then anything
    // but a regular file is refused. Refused, not rebuilt: the rebuild would rename a new file
    // over it, replacing whatever the caller put at that path.
    Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
    if (f.fd < 0) return false;  // missing or unreadable: built (and written) afresh
    struct stat st;
    if (::fstat(f.fd, &st) != 0) return false;
    if (!S_ISREG(st.st_mode)) fail(NEEDLE_E_IO, strf("tool index: '%s' is not a regular file", path.c_str()));
    if (st.st_size < off_t(kHeader) || uint64_t(st.st_size) > kMaxFileBytes) return false;
    std::vector<uint8_t> b(static_cast<size_t>(st.st_size));
    for (size_t got = 0; got < b.size();) {
        const ssize_t r = ::read(f.fd, b.data() + got, b.size() - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;  // shrank or failed under us: damaged, rebuilt
        got += size_t(r);
    }
    uint32_t version, dim, count;
    std::memcpy(&version, b.data() + 8, 4);
    std::memcpy(&dim, b.data() + 44, 4);
    std::memcpy(&count, b.data() + 48, 4);
    if (std::memcmp(b.data(), kMagic, 8) != 0 || version != kVersion || dim != dim_ ||
        std::memcmp(b.data() + 12, fingerprint_.data(), 32) != 0)
        return false;
    const uint64_t entry = 32 + uint64_t(4) * dim;
    if ((b.size() - kHeader) % entry != 0 || (b.size() - kHeader) / entry != count) return false;
    hashes.clear();
    rows.clear();
    hashes.reserve(count);
    rows.reserve(size_t(count) * dim);
    std::vector<float> row(dim);
    for (uint32_t i = 0; i < count; ++i) {
        const uint8_t *e = b.data() + kHeader + i * entry;
        std::memcpy(row.data(), e + 32, size_t(4) * dim);
        // The format has no checksum: a row that is not a finite unit vector (what embed writes)
        // is damaged; it is left out, so that tool is embedded again.
        double norm2 = 0.0;
        for (float v : row) norm2 += double(v) * double(v);
        if (!std::isfinite(norm2) || std::fabs(norm2 - 1.0) > 1e-3) continue;
        hashes.emplace_back();
        std::memcpy(hashes.back().data(), e, 32);
        rows.insert(rows.end(), row.begin(), row.end());
    }
    return true;
}

void ToolIndex::write_file(const std::string &path) const {
    static std::atomic<uint32_t> serial{0};
    const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(serial++);
    std::vector<uint8_t> b(kHeader);
    std::memcpy(b.data(), kMagic, 8);
    const uint32_t count = uint32_t(count_);
    std::memcpy(b.data() + 8, &kVersion, 4);
    std::memcpy(b.data() + 12, fingerprint_.data(), 32);
    std::memcpy(b.data() + 44, &dim_, 4);
    std::memcpy(b.data() + 48, &count, 4);
    for (size_t i = 0; i < count_; ++i) {
        b.insert(b.end(), text_hash_[i].begin(), text_hash_[i].end());
        const uint8_t *row = reinterpret_cast<const uint8_t *>(embedding(i));
        b.insert(b.end(), row, row + size_t(4) * dim_);
    }
    bool ok = false;
    {
        File f{std::fopen(tmp.c_str(), "wb")};
        ok = f.f && std::fwrite(b.data(), 1, b.size(), f.f) == b.size() && std::fflush(f.f) == 0 &&
             ::fsync(::fileno(f.f)) == 0;
        if (f.f && std::fclose(f.f) != 0) ok = false;
        f.f = nullptr;
    }
    if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(tmp.c_str());
        fail(NEEDLE_E_IO, strf("tool index: cannot write '%s'", path.c_str()));
    }
}

}  // namespace chat
}  // namespace needle
