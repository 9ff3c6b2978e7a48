// Memory for the large buffers a forward pass streams every step (the rows-in-lanes weights, the
// KV cache, prefill scratch), backed by 2 MB pages where the kernel gives them.
//
// Why: a needle2 decode step reads the whole f32 KV window (27 layers x 512 KB) and ~11 MB of
// weights; in 4 KB pages that is ~6,000 pages per step, far past the TLB, and every page walk
// stalls the attention loads (in a VM a walk costs more still). With 2 MB pages the same bytes
// are a dozen TLB entries: the decode attention over a full window ran 0.35 -> 0.245 ms (one core,
// Zen 5 VM, the same kernel). Transparent huge pages are asked for with MADV_HUGEPAGE (needed when
// the system setting is "madvise", Debian's default); where they are off nothing changes.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace needle {

// `bytes` of memory (contents unspecified), 64-byte aligned. At least 2 MB, on Linux: an
// anonymous mapping whose whole 2 MB-aligned parts may become huge pages (the tail stays in 4 KB
// pages; RSS grows by what is touched, as with malloc). Smaller, or elsewhere: aligned operator
// new. Free with huge_free(p, bytes), the same bytes. Throws std::bad_alloc.
void *huge_alloc(size_t bytes);
void huge_free(void *p, size_t bytes) noexcept;

// A std::allocator that takes large blocks from huge_alloc. Stateless: any two compare equal.
template <class T>
struct HugePageAllocator {
    using value_type = T;
    HugePageAllocator() = default;
    template <class U>
    HugePageAllocator(const HugePageAllocator<U> &) noexcept {}
    T *allocate(size_t n) {
        if (n > size_t(-1) / sizeof(T)) throw std::bad_alloc();
        return static_cast<T *>(huge_alloc(n * sizeof(T)));
    }
    void deallocate(T *p, size_t n) noexcept { huge_free(p, n * sizeof(T)); }
    template <class U>
    bool operator==(const HugePageAllocator<U> &) const noexcept { return true; }
    template <class U>
    bool operator!=(const HugePageAllocator<U> &) const noexcept { return false; }
};

// A vector for per-step streamed buffers (KV rings, workspaces).
template <class T>
using HugeVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace needle
