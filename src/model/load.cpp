// Container bytes (mmap or copy) and model construction by tag.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>

#include "container/cact_v2.h"
#include "core/bytes.h"
#include "core/error.h"
#include "model/model.h"
#include "model/needle2.h"
#include "model/needle3.h"

namespace needle {

namespace {
struct Fd {
    int fd;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};
}  // namespace

std::shared_ptr<const FileBytes> FileBytes::open(const char *path, bool use_mmap) {
    // O_NONBLOCK: opening a FIFO (or a device that waits) would otherwise block until a writer
    // comes; it has no effect on a regular file, and anything else is refused just below.
    Fd f{::open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
    if (f.fd < 0) fail(NEEDLE_E_IO, strf("cannot open '%s': %s", path, std::strerror(errno)));
    struct stat st;
    if (::fstat(f.fd, &st) != 0) fail(NEEDLE_E_IO, strf("cannot stat '%s': %s", path, std::strerror(errno)));
    if (!S_ISREG(st.st_mode)) fail(NEEDLE_E_IO, strf("'%s' is not a regular file", path));
    std::shared_ptr<FileBytes> fb(new FileBytes());
    fb->size_ = size_t(st.st_size);
    if (fb->size_ == 0) return fb;  // the parser reports the truncation
    if (use_mmap) {
        // MAP_POPULATE: loading a valid file reads every page anyway (validation, conversion,
        // the repack); mapping them all in one call costs less than a fault per 64 KB of first
        // touches, which are dear in a VM (needle2, 21 loads per process, A/B: 0.90x the wall
        // time). Not for a file larger than any model: a huge (say sparse) file is refused
        // after reading a few pages, not all of them.
        constexpr size_t kPopulateMax = size_t(256) << 20;
        const int flags = MAP_PRIVATE | (fb->size_ <= kPopulateMax ? MAP_POPULATE : 0);
        void *p = ::mmap(nullptr, fb->size_, PROT_READ, flags, f.fd, 0);
        if (p == MAP_FAILED) fail(NEEDLE_E_IO, strf("cannot map '%s': %s", path, std::strerror(errno)));
        fb->data_ = static_cast<const uint8_t *>(p);
        fb->mapped_ = true;
        return fb;
    }
    fb->owned_.resize(fb->size_);
    size_t got = 0;
    while (got < fb->size_) {
        const ssize_t r = ::read(f.fd, fb->owned_.data() + got, fb->size_ - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) fail(NEEDLE_E_IO, strf("cannot read '%s' (%zu of %zu byte%s)", path, got, fb->size_, plural(fb->size_)));
        got += size_t(r);
    }
    fb->data_ = fb->owned_.data();
    return fb;
}

std::shared_ptr<const FileBytes> FileBytes::copy(const void *data, size_t size) {
    std::shared_ptr<FileBytes> fb(new FileBytes());
    fb->owned_.assign(static_cast<const uint8_t *>(data), static_cast<const uint8_t *>(data) + size);
    fb->data_ = fb->owned_.data();
    fb->size_ = size;
    return fb;
}

void FileBytes::release_pages(const uint8_t *p, size_t n) const {
    if (!mapped_ || p < data_ || n > size_ || size_t(p - data_) > size_ - n) return;
    const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
    const uintptr_t lo = (uintptr_t(p) + page - 1) & ~(page - 1), hi = (uintptr_t(p) + n) & ~(page - 1);
    // A read-only private file mapping: dropping pages loses nothing (they are re-read on touch).
    if (hi > lo) ::madvise(reinterpret_cast<void *>(lo), hi - lo, MADV_DONTNEED);
}

FileBytes::~FileBytes() {
    if (mapped_) ::munmap(const_cast<uint8_t *>(data_), size_);
}

std::shared_ptr<const Model> load_model(std::shared_ptr<const FileBytes> bytes, const LoadOptions &opt) {
    std::shared_ptr<const Model> m;
    // The load's parallel work (the rows-in-lanes copies) runs on the model's own thread count,
    // as its sequences will: oneTBB's default arena started a worker per core whatever
    // n_threads said (n_threads 1 left an extra thread running) and kept them.
    ArenaLease(opt.n_threads).execute([&] {
        if (bytes->size() >= 4 && read_u32(bytes->data()) == kCactTagV3) {
            const ContainerV3 c = parse_cact_v3(bytes->data(), bytes->size());
            m = std::make_shared<Needle3Model>(bytes, c, opt.n_threads, opt.depth, opt.fast);
        } else {
            const ContainerV2 c = parse_cact_v2(bytes->data(), bytes->size());
            if (opt.depth != 0)
                fail(NEEDLE_E_INVALID_ARGUMENT, strf("depth %u: a Needle 2 model has no depth ladder (use 0)", opt.depth));
            m = std::make_shared<Needle2Model>(bytes, c, opt.n_threads, opt.fast);
        }
    });
    // Validation, conversion and the rows-in-lanes copies read every page of the file; what the
    // forward pass reads from it afterwards is small (the embedding and Engram table rows of the
    // tokens fed; the stored matrices only under kernels that read the stored form). Dropping all
    // of its pages from the RSS now (a read-only mapping: they are read again where touched)
    // leaves resident only the pages actually used. A no-op for copied bytes.
    bytes->release_pages(bytes->data(), bytes->size());
    return m;
}

}  // namespace needle

namespace needle {
void feed(const Model &m, Sequence &seq, Workspace &ws, const uint32_t *tokens, size_t n,
          float *logits) {
    seq.arena.execute([&] {
        for (size_t i = 0; i < n; i += ws.capacity) {
            const uint32_t chunk = uint32_t(std::min<size_t>(ws.capacity, n - i));
            m.forward(seq, ws, tokens + i, chunk, i + chunk == n ? logits : nullptr);
        }
    });
}

void feed_many(const Model &m, Sequence *const *seqs, Workspace &ws, const uint32_t *tokens, uint32_t n,
               float *const *logits) {
    seqs[0]->arena.execute([&] { m.forward_many(seqs, ws, tokens, n, logits); });
}
}  // namespace needle
