"""Exports a trained checkpoint to .cact through the project's writer (issue 10 item 5).

    /usr/bin/python3 tools/train/export.py --data DIR --ckpt DIR/ckpt.pt --out FILE.cact
        [--writer build/tools/needle-make-model] [--engine] [--eval-n 200]

1. Writes the float weights once per CQ width (2, 3, 4 bits) through needle-make-model
   --weights (tools/cact_writer.cpp quantises: Hadamard rotation per group of 128, f16 group
   norms, codebook indices, cq-kernels.md §3) and reads each back dequantised (cact.py).
2. Chooses the width of every CQ tensor by measured accuracy: starting from all 4-bit, each
   tensor (largest first) drops to 2, else 3 bits, when the held-out target loss rises by at
   most --loss-budget (relative) over the all-4-bit model and no exact call is lost.
3. Writes the final container (FP16 norms and diagonals, the tokenizer blob as the last record).
4. Checks: the engine's tokenizer agrees with the trainer's (tokenizer.py) on the eval prompts, and (--engine)
   the engine's logits equal the dequantised PyTorch model's on a few prompts.
Prints float / exported accuracy per kind and the parity figures.
"""

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import cact  # noqa: E402
import data  # noqa: E402
import needle2  # noqa: E402
import tokenizer  # noqa: E402
import train  # noqa: E402


def write_ndlw(path, g, arrays, bits):
    """The writer's --weights input: "NDLW", version 1, count, per tensor bits/ndim/shape/f32."""
    with open(path, "wb") as f:
        f.write(struct.pack("<4sII", b"NDLW", 1, len(arrays)))
        for (name, shape, kind), a, b in zip(g.canon(), arrays, bits):
            a = np.ascontiguousarray(a, dtype="<f4").reshape(shape)
            f.write(struct.pack("<II", b if kind != "f16" else 0, len(shape)))
            f.write(struct.pack("<%dI" % len(shape), *shape))
            f.write(a.tobytes())


def writer_args(g):
    return ["--preset", "demo", "--vocab", str(g.vocab_size), "--d-model", str(g.d_model),
            "--heads", str(g.num_heads), "--kv-heads", str(g.num_kv_heads),
            "--head-dim", str(g.head_dim), "--layers", str(g.num_layers),
            "--max-seq-len", str(g.max_seq_len), "--window", str(g.kv_window),
            "--lanes", str(g.mhc_lanes), "--group", "128",
            "--sites", ",".join(map(str, g.engram_sites)) or "none",
            "--slots", str(g.engram_slots), "--sub-dim", str(g.engram_sub_dim),
            "--engram-heads", str(g.engram_heads),
            "--orders", ",".join(map(str, g.engram_orders)),
            "--taps", str(g.engram_conv_taps), "--rope-theta", repr(g.rope_theta), "--no-heads"]


def write_cact(writer, g, arrays, bits, tok_blob, out):
    with tempfile.TemporaryDirectory() as tmp:
        w = os.path.join(tmp, "w.ndlw")
        write_ndlw(w, g, arrays, bits)
        subprocess.run([writer, *writer_args(g), "--weights", w, "--tokenizer-blob", tok_blob,
                        "--out", out], check=True, stdout=subprocess.DEVNULL)


def read_arrays(path, n):
    c = cact.Container.open(path)
    return [c.tensor(i) for i in range(n)]


def score(model, ex):
    loss, acc = train.evaluate(model, ex)
    return loss, acc


def choose_bits(model, g, deq, ex, budget):
    """deq[b] = every tensor dequantised at width b. Returns bits per canonical tensor."""
    canon = g.canon()
    cq = [i for i, (_, _, kind) in enumerate(canon) if kind != "f16"]
    bits = [4 if i in cq else 0 for i in range(len(canon))]

    def run(bits_now):
        model.load_arrays([deq[b][i] if b else deq[4][i] for i, b in enumerate(bits_now)])
        return score(model, ex)

    base_loss, base_acc = run(bits)
    print("all 4-bit: loss %.4f exact %.3f" % (base_loss, base_acc["all"]), flush=True)
    size = lambda i: int(np.prod(canon[i][1]))
    for i in sorted(cq, key=size, reverse=True):
        for b in (2, 3):
            trial = list(bits)
            trial[i] = b
            loss, acc = run(trial)
            if loss <= base_loss * (1 + budget) and acc["all"] >= base_acc["all"]:
                bits = trial
                print("  %-22s -> %d bits (loss %.4f, exact %.3f)" %
                      (canon[i][0], b, loss, acc["all"]), flush=True)
                break
        else:
            print("  %-22s stays 4 bits" % canon[i][0], flush=True)
    return bits


def engine_check(path, sp, model, prompts):
    """Largest |logit difference| engine vs dequantised PyTorch over prompts (last position
    and 8 greedy decode steps), and whether the engine tokenizer agrees with the trainer's encoder."""
    sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))
    os.environ.setdefault("NEEDLE_LIB", os.path.join(ROOT, "build", "libneedle.so"))
    import needle
    worst, tok_ok = 0.0, True
    with needle.Model(path) as m:
        for text in prompts:
            ids = [2] + sp.encode(text)
            tok_ok &= m.tokenize(text, add_bos=True) == ids
            with m.new_state() as s:
                eng = [np.array(s.prefill(ids), np.float32)]
                seq = list(ids)
                for _ in range(8):
                    seq.append(int(np.argmax(eng[-1])))
                    eng.append(np.array(s.decode(seq[-1]), np.float32))
            with torch.no_grad():
                ref = model(torch.tensor([seq], dtype=torch.int64))[0].numpy()
            ref = ref[len(ids) - 1:]
            worst = max(worst, float(np.abs(ref - np.stack(eng)).max()))
    return worst, tok_ok


def schema_valid(calls, tools):
    """Every call names a declared tool, has its required keys and only declared keys of the
    declared JSON types (integers within minimum/maximum, strings within an enum)."""
    by_name = {t["name"]: t["parameters"] for t in tools}
    types = {"integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
             "boolean": lambda v: isinstance(v, bool), "string": lambda v: isinstance(v, str)}
    if not isinstance(calls, list):
        return False
    for c in calls:
        if not isinstance(c, dict) or c.get("name") not in by_name:
            return False
        args, sch = c.get("arguments"), by_name[c["name"]]
        if not isinstance(args, dict) or any(k not in args for k in sch.get("required", [])):
            return False
        for k, v in args.items():
            prop = sch["properties"].get(k)
            if prop is None or not types[prop["type"]](v):
                return False
            if "enum" in prop and v not in prop["enum"]:
                return False
            if prop["type"] == "integer" and not prop.get("minimum", v) <= v <= prop.get("maximum", v):
                return False
    return True


def engine_eval(path, ex, tools, max_new=64):
    """Greedy decoding with the engine (no grammar): exact calls per kind and schema validity.
    Returns ({kind: share exact}, share schema-valid among outputs that parse, examples)."""
    sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))
    os.environ.setdefault("NEEDLE_LIB", os.path.join(ROOT, "build", "libneedle.so"))
    import needle
    per_kind, valid, parsed, shown = {}, 0, 0, []
    with needle.Model(path) as m, m.new_state() as s:
        for (full, start, _), meta in zip(ex.rows, ex.meta):
            s.reset()
            logits = np.array(s.prefill(full[:start]), np.float32)
            out = []
            for _ in range(max_new):
                t = int(np.argmax(logits))
                if t in (1, 5):  # EOS, <|im_end|>
                    break
                out.append(t)
                logits = np.array(s.decode(t), np.float32)
            text = m.detokenize(out)
            calls = None
            if text.startswith("<tool_call>") and text.endswith("</tool_call>"):
                try:
                    calls = json.loads(text[len("<tool_call>"):-len("</tool_call>")])
                except ValueError:
                    calls = None
            if calls is not None:
                parsed += 1
                valid += schema_valid(calls, tools)
            ok = calls is not None and json.dumps(calls, sort_keys=True) == \
                json.dumps(meta["calls"], sort_keys=True)
            per_kind.setdefault(meta["kind"], []).append(ok)
            if len(shown) < 10:
                shown.append((meta["query"], text))
    acc = {k: sum(v) / len(v) for k, v in per_kind.items()}
    allv = [x for v in per_kind.values() for x in v]
    acc["all"] = sum(allv) / len(allv)
    return acc, valid / max(parsed, 1), shown


def write_ref(path, model, sp, prompts):
    """The trainer's reference for CI: last-position logits of a few prompts (dequantised
    PyTorch model), ids and argmax."""
    ref = []
    for text in prompts:
        ids = [2] + sp.encode(text)
        with torch.no_grad():
            lg = model(torch.tensor([ids], dtype=torch.int64))[0, -1].numpy()
        ref.append({"text": text, "ids": ids, "argmax": int(np.argmax(lg)),
                    "logits": [float("%.7g" % v) for v in lg]})
    with open(path, "w") as f:
        json.dump({"format": "needle-demo-ref/1", "prompts": ref}, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--writer", default=os.path.join(ROOT, "build", "tools", "needle-make-model"))
    ap.add_argument("--eval-n", type=int, default=200)
    ap.add_argument("--loss-budget", type=float, default=0.05)
    ap.add_argument("--engine", action="store_true")
    ap.add_argument("--fixed-bits", type=int, default=0, help="skip the search: all CQ at B")
    ap.add_argument("--tol", type=float, default=1e-4, help="engine parity bound (exit 1)")
    ap.add_argument("--engine-eval", type=int, default=0, help="greedy engine accuracy on N")
    ap.add_argument("--ref", default="", help="write the CI logits reference JSON here")
    ap.add_argument("--heldout", default="", help="write held-out queries/calls JSON here")
    ap.add_argument("--heldout-n", type=int, default=200, help="examples in --heldout")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sp = tokenizer.load(args.data)  # RefTokenizer over the blob, what training encoded with
    tok_blob = os.path.join(args.data, "tok.blob")
    tools_text = data.tools_json(json.load(open(data.TOOLS_PATH)))
    ex = train.Examples(os.path.join(args.data, "test.jsonl"), sp, tools_text, limit=args.eval_n)
    ck = torch.load(args.ckpt)
    g = needle2.Geometry(**ck["geometry"])
    model = needle2.Needle2(g)
    model.load_arrays(ck["arrays"])
    f_loss, f_acc = score(model, ex)
    print("float (step %d): loss %.4f exact %s" % (ck["step"], f_loss, json.dumps(
        {k: round(v, 3) for k, v in sorted(f_acc.items())})), flush=True)
    n = len(g.canon())
    if args.fixed_bits:
        bits = [args.fixed_bits if kind != "f16" else 0 for _, _, kind in g.canon()]
    else:
        deq = {}
        for b in (2, 3, 4):
            tmp = args.out + ".b%d.tmp" % b
            write_cact(args.writer, g, ck["arrays"], [b] * n, tok_blob, tmp)
            deq[b] = read_arrays(tmp, n)
            os.remove(tmp)
        bits = choose_bits(model, g, deq, ex, args.loss_budget)
    write_cact(args.writer, g, ck["arrays"], bits, tok_blob, args.out)
    model.load_arrays(read_arrays(args.out, n))
    q_loss, q_acc = score(model, ex)
    print("exported %s (%d bytes): loss %.4f exact %s" % (args.out, os.path.getsize(args.out),
          q_loss, json.dumps({k: round(v, 3) for k, v in sorted(q_acc.items())})), flush=True)
    print("bits: %s" % json.dumps({name: b for (name, _, kind), b in zip(g.canon(), bits)
                                   if kind != "f16"}))
    if args.engine:
        prompts = [data.render_prompt(tools_text, m["query"]) for m in ex.meta[:4]]
        worst, tok_ok = engine_check(args.out, sp, model, prompts)
        print("engine vs dequantised PyTorch: max |logit diff| %.3e over %d prompts x 9 steps; "
              "tokenizer agrees: %s" % (worst, len(prompts), tok_ok), flush=True)
        if worst > args.tol or not tok_ok:
            return 1
    if args.ref:
        queries = ["Set a timer for 5 minutes", "turn off the kitchen lights",
                   "what's the weather in Lisbon?", "tell me a joke"]
        write_ref(args.ref, model, sp, [data.render_prompt(tools_text, q) for q in queries])
    if args.heldout:
        rows = [json.loads(line) for line in open(os.path.join(args.data, "test.jsonl"))]
        with open(args.heldout, "w") as f:
            # The chat layer renders the prompt itself (tests/test_demo_model.cpp): the query,
            # its kind and the calls it must produce are enough.
            json.dump({"format": "needle-demo-heldout/2", "examples": [
                {"query": r["query"], "kind": r["kind"], "calls": r["calls"]}
                for r in rows[:args.heldout_n]]}, f, indent=0)
    if args.engine_eval:
        ev = train.Examples(os.path.join(args.data, "test.jsonl"), sp, tools_text,
                            limit=args.engine_eval)
        acc, valid, shown = engine_eval(args.out, ev, json.load(open(data.TOOLS_PATH)))
        print("engine greedy (no grammar) on %d held-out: exact %s, schema-valid %.3f" % (
            len(ev.rows), json.dumps({k: round(v, 3) for k, v in sorted(acc.items())}), valid))
        for q, text in shown:
            print("  %-60s -> %s" % (q[:60], text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
