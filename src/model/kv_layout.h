// Where a sequence's KV rows live and which of them a query reads (model-v2.md §4.3 with the
// sinks of tool-calling.md §10.3): key j is visible to query p iff j <= p and (window == 0 or
// p - j < window or j < sinks). Slots 0..sinks-1 hold the sink keys for good; the other
// `window` slots cycle. A query reads the positions lo..p through slot j % ring, which covers
// exactly its visible keys: before the window passes the sinks these are 0..p (stored at slot j),
// afterwards all `ring` slots (the sinks and the last `window` keys), in slot order.
#pragma once

#include <cstdint>

namespace needle {

struct KvLayout {
    uint32_t window = 0;  // 0 = full causal
    uint32_t sinks = 0;   // only with a window
    uint32_t ring = 0;    // slots: window + sinks, or max_seq_len when full causal

    static KvLayout make(uint32_t window, uint32_t sinks, uint32_t max_seq_len) {
        KvLayout k;
        if (window >= max_seq_len || (window && uint64_t(window) + sinks >= max_seq_len)) window = 0;
        k.window = window;
        k.sinks = window ? sinks : 0;
        k.ring = window ? window + k.sinks : max_seq_len;
        return k;
    }
    // Slot of key p.
    uint32_t slot(uint32_t p) const { return p < sinks ? p : sinks + (p - sinks) % (ring - sinks); }
    // First position of the range a query at p reads (through slot j % ring).
    uint32_t lo(uint32_t p) const { return (window && p + 1 > ring) ? p + 1 - ring : 0; }
};

}  // namespace needle
