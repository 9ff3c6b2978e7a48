// Sequence copy / save / load (state_io.h) and the Model / Sequence defaults they rely on.
#include "model/state_io.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace needle {

namespace {

constexpr char kMagic[8] = {'N', 'D', 'L', 'S', 'T', 'A', 'T', '1'};
constexpr uint32_t kVersion = 1;
constexpr size_t kFixedBytes = 8 + 4 + 4 + 8 + 5 * 4 + 4;  // magic .. span count

struct Fields {
    uint32_t version, format, window, kv_type, sinks, heads, pos, spans;
    uint64_t fingerprint;
};

Fields fields_of(const Model &m, const Sequence &s) {
    const SequenceOptions &o = s.options;
    return Fields{kVersion, m.info().format_version, uint32_t(o.kv_window), uint32_t(o.kv_type),
                  o.sink_tokens, o.probe_heads ? 1u : 0u, s.pos, 0, m.fingerprint()};
}

// Visits seq's spans with a lambda (the visitor is a plain function pointer plus context).
template <class F>
void each_span(const Sequence &seq, uint32_t at, F &&f) {
    const_cast<Sequence &>(seq).visit_state(at, [](void *ctx, const StateSpan &sp) { (*static_cast<F *>(ctx))(sp); }, &f);
}

void put32(uint8_t *&p, uint32_t v) { std::memcpy(p, &v, 4), p += 4; }
void put64(uint8_t *&p, uint64_t v) { std::memcpy(p, &v, 8), p += 8; }

// Bounds-checked reader over the blob.
struct Reader {
    const uint8_t *p, *end;
    bool take(void *out, size_t n) {
        if (size_t(end - p) < n) return false;
        std::memcpy(out, p, n);
        p += n;
        return true;
    }
};

[[noreturn]] void bad(const std::string &what) { fail(NEEDLE_E_FORMAT, "state blob: " + what); }

}  // namespace

uint64_t hash64(const void *data, size_t n, uint64_t h) {
    const uint8_t *p = static_cast<const uint8_t *>(data);
    constexpr uint64_t prime = 0x100000001b3ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        std::memcpy(&w, p + i, 8);
        h = (h ^ w) * prime;
    }
    for (; i < n; ++i) h = (h ^ p[i]) * prime;
    return (h ^ n) * prime;
}

void Sequence::visit_state(uint32_t, StateVisitor, void *) {
    fail(NEEDLE_E_UNSUPPORTED, "this model's states cannot be copied or saved");
}

void Model::probe_head_output(const Sequence &, ProbeHead h, float *) const {
    fail(NEEDLE_E_UNSUPPORTED, h == ProbeHead::Confidence ? "this model has no confidence head"
                                                          : "this model has no contrastive head");
}

uint64_t Model::fingerprint() const {
    std::call_once(fingerprint_once_, [&] {
        fingerprint_ = file_ ? hash64(file_->data(), file_->size()) : 0;
        // The hash read every page: back to the pages the forward pass touches (load_model).
        if (file_) file_->release_pages(file_->data(), file_->size());
    });
    return fingerprint_;
}

void copy_sequence(Sequence &dst, const Sequence &src) {
    // Same model and options: the two walks yield the same spans in the same order. Source
    // spans are gathered 64 at a time on the stack (no allocation), then copied.
    constexpr size_t kBatch = 64;
    StateSpan from[kBatch];
    for (size_t first = 0;; first += kBatch) {
        size_t idx = 0, got = 0;
        each_span(src, src.pos, [&](const StateSpan &s) {
            if (idx >= first && idx < first + kBatch) from[got++] = s;
            ++idx;
        });
        idx = 0;
        each_span(dst, src.pos, [&](const StateSpan &d) {
            if (idx >= first && idx < first + kBatch && from[idx - first].used)
                std::memcpy(d.data, from[idx - first].data, from[idx - first].used);
            ++idx;
        });
        if (first + kBatch >= idx) break;
    }
    dst.pos = src.pos;
}

size_t saved_size(const Model &, const Sequence &seq) {
    size_t n = kFixedBytes + 8;
    each_span(seq, seq.pos, [&](const StateSpan &sp) { n += 8 + sp.used; });
    return n;
}

void save_sequence(const Model &m, const Sequence &seq, uint8_t *buf, size_t cap) {
    if (cap < saved_size(m, seq)) fail(NEEDLE_E_BUFFER_TOO_SMALL, "state blob: buffer too small");
    Fields f = fields_of(m, seq);
    each_span(seq, seq.pos, [&](const StateSpan &) { ++f.spans; });
    uint8_t *p = buf;
    std::memcpy(p, kMagic, 8), p += 8;
    put32(p, f.version), put32(p, f.format), put64(p, f.fingerprint);
    put32(p, f.window), put32(p, f.kv_type), put32(p, f.sinks), put32(p, f.heads), put32(p, f.pos);
    put32(p, f.spans);
    each_span(seq, seq.pos, [&](const StateSpan &sp) {
        put64(p, sp.used);
        if (sp.used) std::memcpy(p, sp.data, sp.used);
        p += sp.used;
    });
    put64(p, hash64(buf, size_t(p - buf)));
}

void load_sequence(const Model &m, Sequence &seq, const uint8_t *buf, size_t len) {
    if (len < kFixedBytes + 8) bad(strf("%zu bytes, shorter than its fixed fields", len));
    if (std::memcmp(buf, kMagic, 8) != 0) bad("not a needle state (magic)");
    uint64_t sum;
    std::memcpy(&sum, buf + len - 8, 8);
    if (hash64(buf, len - 8) != sum) bad("checksum mismatch (damaged or truncated)");
    Reader r{buf + 8, buf + len - 8};
    Fields f{};
    r.take(&f.version, 4), r.take(&f.format, 4), r.take(&f.fingerprint, 8);
    r.take(&f.window, 4), r.take(&f.kv_type, 4), r.take(&f.sinks, 4), r.take(&f.heads, 4);
    r.take(&f.pos, 4), r.take(&f.spans, 4);
    Fields want = fields_of(m, seq);
    if (f.version != kVersion) bad(strf("version %u, this library reads %u", f.version, kVersion));
    if (f.format != want.format || f.fingerprint != want.fingerprint) bad("saved from another model");
    if (f.window != want.window || f.kv_type != want.kv_type || f.sinks != want.sinks || f.heads != want.heads)
        bad(strf("saved with other state options (window %u, kv_type %u, sinks %u, heads %u; this state: %u, %u, "
                 "%u, %u)", f.window, f.kv_type, f.sinks, f.heads, want.window, want.kv_type, want.sinks,
                 want.heads));
    if (f.pos > seq.limit)
        bad(strf("position %u beyond this state's %s %u", f.pos,
                 seq.limit < m.info().max_seq_len ? "max_tokens" : "max_seq_len", seq.limit));
    // Every span's length must be what this state has at that position; checked before any copy.
    uint32_t count = 0;
    bool ok = true;
    Reader scan = r;
    each_span(seq, f.pos, [&](const StateSpan &sp) {
        uint64_t used = 0;
        ++count;
        if (!ok || !scan.take(&used, 8) || used != sp.used || size_t(scan.end - scan.p) < used) {
            ok = false;
            return;
        }
        scan.p += used;
    });
    if (!ok || count != f.spans || scan.p != scan.end) bad("span layout does not match this state");
    each_span(seq, f.pos, [&](const StateSpan &sp) {
        r.p += 8;
        if (sp.used) std::memcpy(sp.data, r.p, sp.used);
        r.p += sp.used;
    });
    seq.pos = f.pos;
}

}  // namespace needle
