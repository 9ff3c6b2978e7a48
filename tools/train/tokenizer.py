"""The demo tokenizer: SentencePiece BPE with space-free pieces (issue 10 item 3).

    /usr/bin/python3 tools/train/tokenizer.py --corpus DIR/corpus.txt --vocab 1024 --out DIR/tok

writes DIR/tok.model (the sentencepiece model it was trained as) and DIR/tok.blob (the
container-v2.md §9 RAW tokenizer blob, the table the engine and this file encode with).

Why space-free: sentencepiece normally learns pieces that carry the space before a word
(`▁Lisbon`). A value copied from the query into the JSON call follows `"` there, not a space,
so the same word became other ids with another segmentation, and the model had to learn a map
`▁X -> X` per token (it only learned it for the made-up names it was trained on). Here every
BPE piece is one character class (letters, or digits, or other symbols) and never contains
`▁`; the lone `▁` is a piece of its own. BPE merges then never cross a space or a
letter/punctuation boundary, so a word has the same ids wherever it stands, and copying a
value is copying ids.

How: the corpus is cut into runs of one class (spaces dropped), the runs are counted, and
sentencepiece BPE is trained on the run counts (TSV input, no dummy prefix). The blob lists the
special ids (PAD/EOS/BOS/UNK = 0..3), the ten chat markers (4..13, USER_DEFINED), the 256 byte
pieces (14..269), the BPE pieces, and `▁` last; vocab_size = the piece count.

Encoding is tokenizer-and-prompt.md §2 (RefTokenizer: markers first, then BPE by highest
score over each segment, leftmost tie, byte fallback), which is what the engine runs on the
blob. `Tokenizer.encode` runs that BPE per run of one class (the table has no piece that spans
two runs, so this is the same result, and far faster); `encode_reference` is the spec's
whole-segment form, used by the self-check.
"""

import argparse
import collections
import os
import re
import struct

MARKERS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tools>", "</tools>",
           "<tool_call>", "</tool_call>", "<tool_result>", "</tool_result>"]
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 0, 1, 2, 3, 4
SPACE = "\u2581"


def char_class(c):
    if c == SPACE or c == " ":
        return 0
    if c.isalpha():
        return 1
    if c.isdigit():
        return 2
    return 3


def runs(text):
    """Maximal runs of one character class; every space is a run of its own."""
    out, cur, cls = [], "", -1
    for c in text:
        k = char_class(c)
        if cur and (k != cls or k == 0):
            out.append(cur)
            cur = ""
        cur, cls = cur + c, k
    if cur:
        out.append(cur)
    return out


MARKER_RE = re.compile("(" + "|".join(re.escape(m) for m in sorted(MARKERS, key=len,
                                                                     reverse=True)) + ")")


def split_markers(text):
    """[(is_marker, string)]: markers matched longest first (tokenizer-and-prompt.md §2.4)."""
    return [(k % 2 == 1, p) for k, p in enumerate(MARKER_RE.split(text)) if p]


def train(corpus, vocab, prefix):
    """Trains sentencepiece BPE on the class runs of the corpus; returns (pieces, scores,
    types) of the blob (vocab pieces in all)."""
    import sentencepiece as spm
    counts = collections.Counter()
    with open(corpus, encoding="utf-8") as f:
        for line in f:
            for m, seg in split_markers(line.rstrip("\n")):
                if not m:
                    counts.update(r for r in runs(seg) if char_class(r[0]) != 0 and
                                  "\t" not in r)
    tsv = prefix + ".runs.tsv"
    with open(tsv, "w", encoding="utf-8") as f:
        for r, n in counts.most_common():
            f.write("%s\t%d\n" % (r, n))
    # One piece short of vocab: the lone ▁ is appended after training.
    spm.SentencePieceTrainer.train(
        input=tsv, input_format="tsv", model_prefix=prefix, model_type="bpe",
        vocab_size=vocab - 1, byte_fallback=True, user_defined_symbols=MARKERS, pad_id=0,
        eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="</s>", bos_piece="<s>",
        unk_piece="<unk>", normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=False, split_digits=True, character_coverage=1.0,
        max_sentence_length=8192, num_threads=1, minloglevel=2)
    os.remove(tsv)
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    pieces, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        if sp.is_control(i):
            kind = CONTROL
        elif sp.is_unknown(i):
            kind = UNKNOWN
        elif sp.is_byte(i):
            kind = BYTE
        elif piece in MARKERS:
            kind = USER_DEFINED
        else:
            kind = NORMAL
            # Class-pure and space-free, or the run-wise encoder would not be the spec's.
            assert SPACE not in piece and len({char_class(c) for c in piece}) == 1, piece
        pieces.append(piece)
        scores.append(sp.get_score(i))
        types.append(kind)
    pieces.append(SPACE)
    scores.append(min(scores) - 1.0)
    types.append(NORMAL)
    assert len(pieces) == vocab, (len(pieces), vocab)
    return pieces, scores, types


def blob_bytes(pieces, scores, types):
    """The RAW tokenizer blob of container-v2.md §9."""
    out = bytearray(struct.pack("<5IBBH", len(pieces), 0, 1, 2, 3, 1, 1, 0))
    for p, s, k in zip(pieces, scores, types):
        surface = p.encode("utf-8")
        out += struct.pack("<fBH", s, k, len(surface)) + surface
    return bytes(out)


class Tokenizer:
    """RefTokenizer (tokenizer-and-prompt.md §2, §3) over a §9 blob."""

    def __init__(self, path):
        b = open(path, "rb").read()
        n, self.pad_id, self.eos_id, self.bos_id, self.unk_id, self.dummy, self.fallback, _ = \
            struct.unpack_from("<5IBBH", b, 0)
        off, self.pieces, self.scores, self.types = 24, [], [], []
        for _ in range(n):
            s, k, ln = struct.unpack_from("<fBH", b, off)
            self.pieces.append(b[off + 7:off + 7 + ln].decode("utf-8"))
            self.scores.append(s)
            self.types.append(k)
            off += 7 + ln
        self.id_of = {p: i for i, p in enumerate(self.pieces)}  # later ids overwrite (§2.6)
        self.marker_id = {p: i for i, p in enumerate(self.pieces) if self.types[i] == USER_DEFINED}
        self.byte_id = {int(p[3:5], 16): i for i, p in enumerate(self.pieces)
                        if self.types[i] == BYTE}
        self.cache, self.run_cache = {}, {}

    def get_piece_size(self):
        return len(self.pieces)

    def id_to_piece(self, i):
        return self.pieces[i]

    def bpe(self, seg):
        """§2.5 on one segment: merge the highest-scoring adjacent pair, leftmost on ties."""
        sym = list(seg)
        while len(sym) > 1:
            best, at = None, -1
            for j in range(len(sym) - 1):
                i = self.id_of.get(sym[j] + sym[j + 1])
                if i is not None and (best is None or self.scores[i] > best):
                    best, at = self.scores[i], j
            if at < 0:
                break
            sym[at:at + 2] = [sym[at] + sym[at + 1]]
        out = []
        for s in sym:
            if s in self.id_of:
                out.append(self.id_of[s])
            elif self.fallback:
                out.extend(self.byte_id[c] for c in s.encode("utf-8"))
            else:
                out.append(self.unk_id)
        return out

    def run_ids(self, r):
        ids = self.run_cache.get(r)
        if ids is None:
            ids = self.run_cache[r] = self.bpe(r)
        return ids

    def _escape(self, text):
        text = text.replace(" ", SPACE)
        return SPACE + text if self.dummy else text

    def encode(self, text):
        if text == "":
            return []
        out = []
        for m, seg in split_markers(self._escape(text)):
            if m:
                out.append(self.marker_id[seg])
                continue
            ids = self.cache.get(seg)
            if ids is None:
                ids = [i for r in runs(seg) for i in self.run_ids(r)]
                if len(self.cache) < 200000:
                    self.cache[seg] = ids
            out.extend(ids)
        return out

    def encode_reference(self, text):
        """The spec's form: BPE over the whole segment between markers."""
        if text == "":
            return []
        out = []
        for m, seg in split_markers(self._escape(text)):
            out.extend([self.marker_id[seg]] if m else self.bpe(seg))
        return out

    def decode(self, ids):
        bs = bytearray()
        for i in ids:
            k = self.types[i]
            if k in (NORMAL, USER_DEFINED):
                bs += self.pieces[i].encode("utf-8")
            elif k == BYTE:
                bs.append(int(self.pieces[i][3:5], 16))
        text = bs.decode("utf-8", errors="replace").replace(SPACE, " ")
        return text[1:] if self.dummy and text.startswith(" ") else text


def load(data_dir):
    return Tokenizer(os.path.join(data_dir, "tok.blob"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--out", required=True, help="output prefix")
    args = ap.parse_args()
    pieces, scores, types = train(args.corpus, args.vocab, args.out)
    assert pieces[:4] == ["<pad>", "</s>", "<s>", "<unk>"]
    assert pieces[4:14] == MARKERS and pieces[14] == "<0x00>" and pieces[269] == "<0xFF>"
    with open(args.out + ".blob", "wb") as f:
        f.write(blob_bytes(pieces, scores, types))
    tok = Tokenizer(args.out + ".blob")
    # Self-check on corpus lines: run-wise == whole-segment encoding, and decode round trips.
    with open(args.corpus, encoding="utf-8") as f:
        for k, line in enumerate(f):
            if k >= 300:
                break
            text = line.rstrip("\n")
            ids = tok.encode(text)
            assert ids == tok.encode_reference(text), text
            assert tok.decode(ids) == text, text
    print("tokenizer: %d pieces (space-free BPE) -> %s.blob" % (len(pieces), args.out))


if __name__ == "__main__":
    main()
