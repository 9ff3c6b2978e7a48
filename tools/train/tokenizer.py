"""The demo tokenizer: SentencePiece BPE trained on the rendered training text (issue 10 item 3).

    /usr/bin/python3 tools/train/tokenizer.py --corpus DIR/corpus.txt --vocab 1024 --out DIR/tok

writes DIR/tok.model (sentencepiece) and DIR/tok.blob (container-v2.md §9 RAW tokenizer blob).
Ids as tokenizer-and-prompt.md §1: PAD 0, EOS 1, BOS 2, UNK 3, the ten chat markers 4..13
(user-defined symbols), the 256 byte pieces next (byte fallback), then BPE pieces. Whitespace is
kept as is (identity normalisation, no collapsing), like the real needle2 tokenizer; digits are
split so numbers are copied digit by digit.
"""

import argparse
import struct

import sentencepiece as spm

MARKERS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tools>", "</tools>",
           "<tool_call>", "</tool_call>", "<tool_result>", "</tool_result>"]
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 0, 1, 2, 3, 4


def train(corpus, vocab, prefix):
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=prefix, model_type="bpe", vocab_size=vocab,
        byte_fallback=True, user_defined_symbols=MARKERS, pad_id=0, eos_id=1, bos_id=2,
        unk_id=3, pad_piece="<pad>", eos_piece="</s>", bos_piece="<s>", unk_piece="<unk>",
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, split_digits=True, character_coverage=1.0,
        max_sentence_length=8192, num_threads=1,
        minloglevel=2)
    return spm.SentencePieceProcessor(model_file=prefix + ".model")


def blob(sp):
    """The RAW tokenizer blob of container-v2.md §9 for a trained processor."""
    n = sp.get_piece_size()
    out = bytearray(struct.pack("<5IBBH", n, sp.pad_id(), sp.eos_id(), sp.bos_id(), sp.unk_id(),
                                1, 1, 0))
    for i in range(n):
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
        surface = piece.encode("utf-8")
        out += struct.pack("<fBH", sp.get_score(i), kind, len(surface)) + surface
    return bytes(out)


def check_ids(sp):
    """The id layout the engine and tokenizer-and-prompt.md §1 expect."""
    assert [sp.pad_id(), sp.eos_id(), sp.bos_id(), sp.unk_id()] == [0, 1, 2, 3]
    for k, m in enumerate(MARKERS):
        assert sp.piece_to_id(m) == 4 + k, (m, sp.piece_to_id(m))
    assert sp.id_to_piece(14) == "<0x00>" and sp.id_to_piece(269) == "<0xFF>"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--out", required=True, help="output prefix")
    args = ap.parse_args()
    sp = train(args.corpus, args.vocab, args.out)
    check_ids(sp)
    with open(args.out + ".blob", "wb") as f:
        f.write(blob(sp))
    print("tokenizer: %d pieces -> %s.model, %s.blob" % (sp.get_piece_size(), args.out, args.out))


if __name__ == "__main__":
    main()
