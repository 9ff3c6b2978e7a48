"""Reading .cact v2 containers back into float32 arrays (container-v2.md §1-§9, cq-kernels.md §10).

The trainer never writes containers itself: export goes through the project's C++ writer
(needle-make-model --weights, tools/cact_writer.cpp). This module reads what the writer (or
upstream's exporter) produced, so the exporter can measure the quantisation error of each
tensor and the parity checks can load a fixture into the PyTorch model.
"""

import struct

import numpy as np

TAG = 0x05E12A83
FP16, FP32, CQ, RAW = 1, 2, 3, 4
TERNARY = 5
TERNARY_UNIT = 1.2240064

HEADER_FIELDS = ("tag", "num_tensors", "codebook_len", "kv_window", "kv_bits", "vocab_size",
                 "d_model", "num_heads", "num_kv_heads", "num_layers", "head_dim", "max_seq_len",
                 "hada_n", "mhc_lanes", "engram_slots", "engram_sub_dim", "num_engram_tables",
                 "engram_conv_taps", "engram_conv_dilation", "num_engram_orders")


def hadamard(m):
    """Normalised Sylvester Walsh-Hadamard matrix H_m (cq-kernels.md §4), float64 [m, m]."""
    h = np.ones((1, 1))
    while h.shape[0] < m:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(m)


class Container:
    """A parsed container: header dict, codebook, records, raw bytes. Tensors by canonical index."""

    def __init__(self, data):
        self.data = bytes(data)
        words = struct.unpack_from("<29I", self.data, 0)
        if words[0] != TAG:
            raise ValueError("not a .cact v2 file (tag 0x%08x)" % words[0])
        h = dict(zip(HEADER_FIELDS, words[:20]))
        h["engram_orders"] = [o for o in words[20:24][:h["num_engram_orders"]]]
        h["engram_sites"] = list(words[25:25 + words[24]])
        h["rope_theta"] = struct.unpack_from("<f", self.data, 116)[0]
        self.header = h
        self.codebook = np.frombuffer(self.data, "<f4", h["codebook_len"], 120).copy()
        self.records = []
        at = 120 + 4 * h["codebook_len"]
        for _ in range(h["num_tensors"]):
            dtype, ndim, _pad = struct.unpack_from("<BBH", self.data, at)
            shape = list(struct.unpack_from("<4I", self.data, at + 4)[:ndim])
            offset, nbytes = struct.unpack_from("<QQ", self.data, at + 20)
            group, bits = struct.unpack_from("<II", self.data, at + 36)
            self.records.append(dict(dtype=dtype, shape=shape, offset=offset, nbytes=nbytes,
                                     group=group, bits=bits))
            at += 44

    @classmethod
    def open(cls, path):
        with open(path, "rb") as f:
            return cls(f.read())

    def levels(self, bits, group):
        """Stored levels of one CQ width (header book; ternary computed, §7.3)."""
        if bits == TERNARY:
            c = np.float32(TERNARY_UNIT / np.sqrt(float(group)))
            return np.array([-c, 0.0, c], np.float32)
        first = {2: 0, 3: 4, 4: 12}[bits]
        return self.codebook[first:first + (1 << bits)]

    def blob(self, i):
        r = self.records[i]
        return self.data[r["offset"]:r["offset"] + r["nbytes"]]

    def tensor(self, i):
        """Record i as float32 (FP16/FP32 as stored, CQ dequantised per cq-kernels.md §10)."""
        r = self.records[i]
        if r["dtype"] == FP16:
            return np.frombuffer(self.blob(i), "<f2").astype(np.float32).reshape(r["shape"])
        if r["dtype"] == FP32:
            return np.frombuffer(self.blob(i), "<f4").copy().reshape(r["shape"])
        if r["dtype"] == CQ:
            return dequantize(self.blob(i), r["shape"], r["group"], r["bits"],
                              self.levels(r["bits"], r["group"]))
        raise ValueError("record %d is RAW" % i)

    def tokenizer_blob(self):
        """The RAW tokenizer blob (last record) or None."""
        if self.records and self.records[-1]["dtype"] == RAW:
            return self.blob(len(self.records) - 1)
        return None


def unpack_indices(packed, count, width):
    """LSB-first bitstream of `count` indices of `width` bits per row (container-v2.md §7.1).

    packed: uint8 [rows, row_bytes] -> int64 [rows, count]."""
    bits = np.unpackbits(packed, axis=1, bitorder="little")[:, :count * width]
    bits = bits.reshape(packed.shape[0], count, width).astype(np.int64)
    return (bits << np.arange(width, dtype=np.int64)).sum(axis=2)


def dequantize(blob, shape, group, bits, levels):
    """CQ blob -> float32 [out, in]: (levels[idx] * norm) . H_G, padding dropped (§7.2)."""
    out, inp = shape
    in_pad = (inp + group - 1) // group * group
    ng = in_pad // group
    width = 2 if bits == TERNARY else bits
    row_bytes = in_pad * width // 8
    raw = np.frombuffer(blob, np.uint8)
    packed = raw[:out * row_bytes].reshape(out, row_bytes)
    norms = np.frombuffer(raw[out * row_bytes:].tobytes(), "<f2").astype(np.float32)
    norms = norms.reshape(out, ng)
    idx = unpack_indices(packed, in_pad, width)
    if bits == TERNARY:  # crumb 3/0/1 -> trit 0/1/2
        idx = np.select([idx == 3, idx == 0, idx == 1], [0, 1, 2], -1)
        if (idx < 0).any():
            raise ValueError("ternary crumb 2")
    u = levels[idx].reshape(out, ng, group).astype(np.float64) * norms[:, :, None]
    w = u @ hadamard(group)
    return w.reshape(out, in_pad)[:, :inp].astype(np.float32)
