// Tool retrieval with the contrastive head (tool-calling.md §9, this project's [C] convention):
// every tool's canonical JSON text is embedded once (BOS + encode(text), the model's window as
// head window), each query likewise; the k best tools by dot product of the unit embeddings,
// ties to the lower declaration index, are returned in declaration order.
//
// Index file (optional `index_path`; all little-endian):
//   magic "NDLTIDX1", u32 version 1, 32-byte model fingerprint (sha256 of the contrastive head's
//   tensors as stored: probes, proj, bias records' bytes, in that order), u32 dim, u32 count,
//   then per tool a 32-byte sha256 of its canonical text and dim f32.
// An entry whose text hash is in the file is taken from it; the others are embedded, and the
// file is rewritten atomically (temporary file + rename) whenever it does not list exactly the
// current tools. A file that is unreadable, damaged or for another model is ignored (rebuilt);
// so is an entry whose row is not a finite unit vector (the format has no checksum). A path
// that is not a regular file (a FIFO, a directory, a device) is refused at once, without
// blocking and without replacing it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/sha256.h"
#include "model/model.h"

namespace needle {
namespace chat {

class ToolIndex {
public:
    // tool_texts: each tool's canonical JSON (tool-calling.md §3.3), in declaration order.
    // Throws Error(UNSUPPORTED) when the model has no contrastive head or no tokenizer,
    // Error(IO) when the index file cannot be written or is not a regular file.
    ToolIndex(std::shared_ptr<const Model> model, const std::vector<std::string> &tool_texts,
              const std::string &index_path = "");

    // Indices of the k best tools for `query` (the raw turn text), in declaration order
    // (all of them when there are at most k).
    std::vector<uint32_t> select(std::string_view query, uint32_t k = 5);
    // The same from a query embedding [dim] (unit vector).
    std::vector<uint32_t> select_embedding(const float *query, uint32_t k = 5) const;
    // Unit embedding [dim] of BOS + encode(text).
    void embed(std::string_view text, float *out);

    uint32_t dim() const { return dim_; }
    size_t size() const { return count_; }
    const float *embedding(size_t i) const { return emb_.data() + i * dim_; }
    size_t recomputed() const { return recomputed_; }  // tools embedded (not taken from the file)
    const Sha256::Digest &fingerprint() const { return fingerprint_; }

private:
    std::shared_ptr<const Model> model_;
    std::unique_ptr<Sequence> seq_;
    std::unique_ptr<Workspace> ws_;
    std::vector<uint32_t> ids_;
    uint32_t dim_ = 0;
    size_t count_ = 0, recomputed_ = 0;
    std::vector<float> emb_;  // [count][dim]
    std::vector<Sha256::Digest> text_hash_;
    Sha256::Digest fingerprint_{};

    // Entries of the file at `path` that match this model and dim: hash -> row in `rows`.
    bool read_file(const std::string &path, std::vector<Sha256::Digest> &hashes, std::vector<float> &rows) const;
    void write_file(const std::string &path) const;
};

}  // namespace chat
}  // namespace needle
