"""Held-out accuracy of an exported demo model with the engine through needle_chat (issue 10
targets): greedy, grammar-constrained, tool_choice auto, exactly what needle-run and
needle_complete run. Also checks that the chat layer renders the very prompt the trainer used.

    /usr/bin/python3 tools/train/chat_eval.py --model FILE.cact --data DIR [--n 200]
        [--show "query" ...]

Prints exact calls per kind (tool queries), the off-topic [] rate, schema validity (every
envelope of a tool query has success true: the grammar admits only declared names, keys and
types) and the envelopes of the --show queries.
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))
os.environ.setdefault("NEEDLE_LIB", os.path.join(ROOT, "build", "libneedle.so"))

import data  # noqa: E402
import export  # noqa: E402  (schema_valid)
import needle  # noqa: E402


def timer_groups(r):
    """Breakdown of single-timer queries: with a label or not; with a number value that no
    training query has (compose.py's held-out values, a superset of data.py's) or not."""
    if r["kind"] != "set_timer":
        return []
    import compose
    held = {str(v) for v in compose.HELD_MIN | compose.HELD_SEC | compose.HELD_HOURS}
    held |= {compose.number_words(int(v)) for v in held}
    q = " " + r["query"].lower().replace(",", " ").replace(".", " ") + " "
    value = "held-out value" if any(" %s " % h in q for h in held) else "training value"
    label = "labelled" if "label" in r["calls"][0]["arguments"] else "no label"
    return [value, label]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--test-file", default="",
                    help="held-out examples (default DATA/test.jsonl; DATA/old/test.jsonl is "
                         "the previous model's held-out file, written by data.py)")
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--show", nargs="*", default=[])
    ap.add_argument("--failures", default="", help="write the wrong answers here (JSON lines)")
    args = ap.parse_args()
    demo_text = open(data.TOOLS_PATH).read()
    rows = [json.loads(line) for line in open(args.test_file or
                                                 os.path.join(args.data, "test.jsonl"))][:args.n]
    per_kind, failed, invalid, groups, wrong = {}, 0, 0, {}, []
    t0 = time.time()
    chats = {}
    with needle.Model(args.model) as m:
        for r in rows:
            # A row may carry its own tools (anytool.py's unseen tools): one chat per tools
            # block, each checked once against the trainer's rendering.
            text = r.get("tools", demo_text)
            tools = json.loads(text)
            if text not in chats:
                chats[text] = chat = needle.Chat(m, tools=text)
                want = data.render_prompt(data.tools_json(tools), r["query"])
                if chat.render(r["query"]) != want:
                    print("chat prompt differs from the training prompt:\n%r\n%r" %
                          (chat.render(r["query"]), want))
                    return 1
            chat = chats[text]
            chat.reset()
            env = chat.complete(r["query"], args.max_new)
            calls = env["function_calls"]
            failed += not env["success"]
            invalid += not export.schema_valid(calls, tools)
            ok = env["success"] and calls == r["calls"]
            per_kind.setdefault(r["kind"], []).append(ok)
            for grp in timer_groups(r):
                groups.setdefault(grp, []).append(ok)
            if not ok:
                wrong.append({"query": r["query"], "want": r["calls"], "got": calls})
        dt = time.time() - t0
        acc = {k: (sum(v), len(v)) for k, v in sorted(per_kind.items())}
        tool = [x for k, v in per_kind.items() if k != "off_topic" for x in v]
        print("engine through needle_chat (greedy, grammar, auto) on %d held-out in %.0f s:" %
              (len(rows), dt))
        for k, (a, n) in acc.items():
            print("  %-18s %3d/%3d  %.3f" % (k, a, n, a / n))
        print("  tool queries exact %.3f; off-topic [] %.3f; failed turns %d; schema-invalid %d" %
              (sum(tool) / max(len(tool), 1),
               acc.get("off_topic", (0, 1))[0] / acc.get("off_topic", (0, 1))[1], failed, invalid))
        for grp, v in sorted(groups.items()):
            print("  timers %-28s %3d/%3d  %.3f" % (grp, sum(v), len(v), sum(v) / len(v)))
        if args.failures:
            with open(args.failures, "w") as f:
                for w in wrong:
                    f.write(json.dumps(w) + "\n")
        chat = chats.get(demo_text) or needle.Chat(m, tools=demo_text)
        for q in args.show:
            chat.reset()
            env = chat.complete(q, args.max_new)
            print("  %-50s -> %s" % (q, json.dumps(env["function_calls"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
