// Huge-page backed blocks (huge_pages.h).
#include "core/huge_pages.h"

#include <cstdint>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace needle {

namespace {
constexpr size_t kHuge = size_t(2) << 20;
constexpr size_t kAlign = 64;

bool mapped(size_t bytes) {
#if defined(__linux__)
    return bytes >= kHuge;
#else
    (void)bytes;
    return false;
#endif
}
size_t map_len(size_t bytes) { return (bytes + 4095) & ~size_t(4095); }
}  // namespace

void *huge_alloc(size_t bytes) {
    if (!mapped(bytes)) return ::operator new(bytes ? bytes : 1, std::align_val_t(kAlign));
#if defined(__linux__)
    if (bytes > size_t(-1) - 2 * kHuge) throw std::bad_alloc();
    const size_t len = map_len(bytes);
    void *m = ::mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    // Keep the 2 MB-aligned range of len bytes inside the mapping and give back the rest: only a
    // whole, aligned 2 MB range can become one huge page.
    uint8_t *raw = static_cast<uint8_t *>(m);
    uint8_t *al = reinterpret_cast<uint8_t *>((reinterpret_cast<uintptr_t>(raw) + kHuge - 1) & ~uintptr_t(kHuge - 1));
    if (al > raw) ::munmap(raw, size_t(al - raw));
    const size_t after = size_t(raw + len + kHuge - (al + len));
    if (after) ::munmap(al + len, after);
#if defined(MADV_HUGEPAGE)
    ::madvise(al, len, MADV_HUGEPAGE);  // a hint: ignored where transparent huge pages are off
#endif
    return al;
#endif
}

void huge_free(void *p, size_t bytes) noexcept {
    if (!p) return;
#if defined(__linux__)
    if (mapped(bytes)) {
        ::munmap(p, map_len(bytes));
        return;
    }
#endif
    ::operator delete(p, std::align_val_t(kAlign));
}

}  // namespace needle
