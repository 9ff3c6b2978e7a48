"""Trains the demo Needle 2 on the generated tool-calling data (issue 10 item 4).

    /usr/bin/python3 tools/train/train.py --data DIR --out DIR/ckpt.pt [--steps N] [--batch B]

Each example is [BOS] + encode(prompt + target) (tool-calling.md §3.1, §3.4); the loss is the
next-token cross-entropy on the target tokens only. Every prompt starts with the same tools
block, so a step runs that shared prefix once (Needle2.hidden(prefix=...)) and only the
per-example rest in a batch. Exact-call accuracy is measured teacher-forced: greedy decoding
reproduces a target exactly iff the argmax at every target position is the target token.
--workers W runs W single-threaded processes, each on a share of every batch (workers.py).
Deterministic for --seed and a given W (one torch thread per process).
"""

import argparse
import json
import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import data  # noqa: E402
import needle2  # noqa: E402
import tokenizer  # noqa: E402
import workers  # noqa: E402

TOOLS_END = 9  # </tools>: the shared prefix ends with it (tool-calling.md §3.2)
TOOL_CALL = 10  # <tool_call>: the first target token (§3.4)

DEMO_GEOMETRY = dict(vocab_size=1024, d_model=128, num_heads=4, num_kv_heads=2, num_layers=4,
                     head_dim=32, max_seq_len=512, kv_window=512, mhc_lanes=4,
                     engram_slots=1021, engram_sub_dim=64, engram_heads=1,
                     engram_orders=(2, 3), engram_sites=(1, 2), engram_conv_taps=4,
                     rope_theta=10000.0)


class Examples:
    """Tokenised examples: ids, where the target starts, the tools block's length. A row with a
    "tools" field (anytool.py) is rendered with that tools JSON, others with the demo tools."""

    def __init__(self, path, sp, tools_text, limit=None):
        self.rows, self.meta = [], []
        with open(path) as f:
            for k, line in enumerate(f):
                if limit is not None and k >= limit:
                    break
                ex = json.loads(line)
                tt = ex.get("tools", tools_text)
                full = [2] + sp.encode(data.render_prompt(tt, ex["query"]) +
                                       data.render_target(ex["calls"]))
                # The target starts at its (only) <tool_call> marker; the first rows check
                # that the prompt encoded alone is exactly the ids before it.
                start = full.index(TOOL_CALL)
                if k < 64:
                    prompt = [2] + sp.encode(data.render_prompt(tt, ex["query"]))
                    assert full[:start] == prompt, "prompt/target boundary moved"
                self.rows.append((full, start, full.index(TOOLS_END) + 1))
                self.meta.append(ex)
        # Runs of consecutive rows with one tools block: a batch drawn inside one runs the
        # block once (Needle2.hidden(prefix=...)).
        self.groups, k = [], 0
        while k < len(self.rows):
            j = k + 1
            while j < len(self.rows) and self.prefix_of(j) == self.prefix_of(k):
                j += 1
            self.groups.append(list(range(k, j)))
            k = j
        self.prefix = self.prefix_of(0) if len(self.groups) == 1 else None

    def prefix_of(self, i):
        full, _, p = self.rows[i]
        return full[:p]

    def batch(self, idx):
        """tokens [B, S] (PAD 0 after the end), target mask [B, S - P] over the positions
        whose logits predict a target token (position t predicts token t + 1), and P, the
        tools block's length (every row of idx must share it)."""
        P = self.rows[idx[0]][2]
        assert all(self.prefix_of(i) == self.prefix_of(idx[0]) for i in idx), "mixed blocks"
        S = max(len(self.rows[i][0]) for i in idx)
        tok = torch.zeros(len(idx), S, dtype=torch.int64)
        want = torch.zeros(len(idx), S - P, dtype=torch.bool)
        nxt = torch.zeros(len(idx), S - P, dtype=torch.int64)
        for b, i in enumerate(idx):
            full, start, _ = self.rows[i]
            tok[b, :len(full)] = torch.tensor(full)
            want[b, start - 1 - P:len(full) - 1 - P] = True
            nxt[b, :len(full) - 1 - P] = torch.tensor(full[P + 1:])
        return tok, want, nxt, P

    def blocks(self, batch):
        """Every row once, in runs of at most `batch` rows sharing a tools block."""
        by = {}
        for i in range(len(self.rows)):
            by.setdefault(tuple(self.prefix_of(i)), []).append(i)
        return [self.longest_first(v[s:s + batch]) for v in by.values()
                for s in range(0, len(v), batch)]

    def longest_first(self, idx):
        """idx ordered by row length, longest first: the model's grouped attention
        (Needle2.attend_grouped) then pads each group of rows to a similar length."""
        return sorted(idx, key=lambda i: -len(self.rows[i][0]))

    def target_count(self, idx):
        """Target tokens (loss terms) of rows idx."""
        return sum(len(self.rows[i][0]) - self.rows[i][1] for i in idx)


def target_logits(model, tok, want, P):
    # PAD (0) only follows a row's end: rows run packed, without their padding
    h = model.hidden(tok, prefix=P, lengths=(tok != 0).sum(1))  # [B, S - P, D]
    return h[want] @ model.p("embedding").t()


def evaluate(model, ex, batch=32):
    """(mean target loss, exact-call share per kind) teacher-forced over all examples."""
    losses, per_kind = [], {}
    model.eval()
    with torch.no_grad():
        for idx in ex.blocks(batch):
            tok, want, nxt, P = ex.batch(idx)
            h = model.hidden(tok, prefix=P, lengths=(tok != 0).sum(1))
            logits = h @ model.p("embedding").t()
            for b, i in enumerate(idx):
                lg, t = logits[b][want[b]], nxt[b][want[b]]
                losses.append(float(F.cross_entropy(lg, t)))
                ok = bool((lg.argmax(-1) == t).all())
                k = ex.meta[i]["kind"]
                per_kind.setdefault(k, []).append(ok)
    model.train()
    acc = {k: sum(v) / len(v) for k, v in per_kind.items()}
    allv = [x for v in per_kind.values() for x in v]
    acc["all"] = sum(allv) / len(allv)
    return float(np.mean(losses)), acc


def load_init(path):
    """A checkpoint's {"geometry", "arrays"}: a train.py checkpoint, or an exported .cact
    (its dequantised weights, cq-kernels.md §10: fine-tuning the shipped model)."""
    if not path.endswith(".cact"):
        return torch.load(path)
    import cact
    c = cact.Container.open(path)
    g = needle2.Geometry.from_header(c.header)
    return {"geometry": g.as_dict(), "arrays": [c.tensor(i) for i in range(len(g.canon()))]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--init-seed", type=int, default=0,
                    help="seed of the initial weights alone (0, the default: --seed's); the data, "
                         "its order and the held-out split stay those of --seed")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--wd", type=float, default=0.01, help="AdamW weight decay of the matrices")
    ap.add_argument("--init", default="", help="start from this checkpoint's weights")
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--eval-n", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--workers", type=int, default=1,
                    help="data-parallel processes (workers.py), one per core; the result "
                         "depends on the count, not on timing")
    ap.add_argument("--train-file", default="",
                    help="training examples (default DATA/train.jsonl; the tokenizer and the "
                         "held-out split always come from --data)")
    ap.add_argument("--stop", type=int, default=0,
                    help="stop after this step (evaluating and saving), the schedule still "
                         "sized for --steps")
    ap.add_argument("--minutes", type=float, default=0,
                    help="wall-clock budget: the schedule follows max(step/steps, time/budget) "
                         "and training stops at the end of either (0 = steps only; not "
                         "deterministic, for a shared machine)")
    ap.add_argument("--anytool", default="",
                    help="generated tool sets (anytool.py's anytool.train.jsonl): a share of "
                         "the steps trains on them, the rest on the demo tools")
    ap.add_argument("--anytool-share", type=float, default=0.3,
                    help="share of the steps drawn from --anytool")
    ap.add_argument("--anytool-test", default="",
                    help="held-out unseen tools (anytool.test.jsonl), evaluated beside the "
                         "demo split")
    ap.add_argument("--geometry", default="",
                    help="override DEMO_GEOMETRY, e.g. d_model=192,num_layers=6 (integers); "
                         "ignored with --init, whose checkpoint carries its geometry")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    team = workers.Workers(args.workers)
    out = print if team.main else (lambda *a, **k: None)
    torch.manual_seed(args.seed)
    sp = tokenizer.load(args.data)
    tools_text = data.tools_json(json.load(open(data.TOOLS_PATH)))
    train = Examples(args.train_file or os.path.join(args.data, "train.jsonl"), sp, tools_text)
    test = Examples(os.path.join(args.data, "test.jsonl"), sp, tools_text, limit=args.eval_n)
    P = len(train.prefix)
    anytool = Examples(args.anytool, sp, tools_text) if args.anytool else None
    any_test = Examples(args.anytool_test, sp, tools_text, limit=args.eval_n) \
        if args.anytool_test else None
    geo = dict(DEMO_GEOMETRY, vocab_size=sp.get_piece_size())
    geo.update({k: int(v) for k, v in (kv.split("=") for kv in args.geometry.split(",") if kv)})
    init = load_init(args.init) if args.init else None
    if init is not None:  # continue from a checkpoint (a fresh optimizer and schedule)
        geo = init["geometry"]
    g = needle2.Geometry(**geo)
    model = needle2.Needle2(g)
    model.init_weights(args.init_seed or args.seed)
    if init is not None:
        model.load_arrays(init["arrays"])
    n_params = sum(p.numel() for p in model.parameters())
    out("train %d examples, prefix %d tokens, %d parameters" % (len(train.rows), P, n_params),
        flush=True)
    if anytool:
        out("anytool: %d examples in %d tool sets, %.0f%% of the steps" %
            (len(anytool.rows), len(anytool.groups), 100 * args.anytool_share), flush=True)
    decay = [p for n, p in zip(model.names, model.params) if len(p.shape) == 2]
    rest = [p for n, p in zip(model.names, model.params) if len(p.shape) != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd},
                             {"params": rest, "weight_decay": 0.0}], lr=args.lr,
                            betas=(0.9, 0.98))
    warm = min(args.warmup, args.steps // 10 + 1)
    t0, tokens_seen, log_loss, elapsed = time.time(), 0, [], [0.0]

    def progress(s):
        frac = s / args.steps
        if args.minutes > 0:  # rank 0's clock (elapsed), so that every rank agrees
            frac = max(frac, elapsed[0] / (60 * args.minutes))
        return min(1.0, frac)

    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) *
        (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress(s)))))
    rng = random.Random(args.seed)
    pick = random.Random(args.seed + 17)  # which steps train on generated tool sets
    order, any_order, best = [], [], (-1.0, 0)
    for step in range(1, args.steps + 1):
        last = step == args.steps or progress(step) >= 1.0 or step == args.stop
        if anytool and pick.random() < args.anytool_share:
            # a batch of whole tool sets, each run with its own tools block
            per = max(1, args.batch // len(anytool.groups[0]))
            if len(any_order) < per:
                any_order = list(range(len(anytool.groups)))
                rng.shuffle(any_order)
            sets = [anytool.groups[gi] for gi in any_order[:per]]
            any_order = any_order[per:]
            ex, runs = anytool, [anytool.longest_first(g) for g in team.mine(sets)]
            n_target = sum(anytool.target_count(g) for g in sets)
        else:
            if len(order) < args.batch:
                order = list(range(len(train.rows)))
                rng.shuffle(order)
            idx = train.longest_first(order[:args.batch])
            order = order[args.batch:]
            ex, runs, n_target = train, [team.mine(idx)], train.target_count(idx)
        # The loss is the mean over the whole batch's target tokens (every rank's): each rank
        # backpropagates its share of the sum / n_target and the gradients are summed.
        parts = [ex.batch(r) for r in runs if r]
        opt.zero_grad(set_to_none=True)
        loss_sum, seen = 0.0, 0
        if parts:
            logits = torch.cat([target_logits(model, tok, want, p) for tok, want, _, p in parts])
            loss = F.cross_entropy(logits, torch.cat([nxt[want] for _, want, nxt, _ in parts]),
                                   reduction="sum") / n_target
            loss.backward()
            loss_sum = float(loss)
            seen = sum(p + int((tok[:, p:] != 0).sum()) for tok, _, _, p in parts)
        loss_sum, seen, elapsed[0] = team.sum_grads(
            model.params, [loss_sum, seen, time.time() - t0 if team.main else 0.0])
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        tokens_seen += seen
        log_loss.append(loss_sum)
        if step % 25 == 0 or step == 1:
            dt = time.time() - t0
            out("step %5d loss %.4f  %.2f steps/s %.0f tokens/s  %.0f s" %
                (step, np.mean(log_loss), step / dt, tokens_seen / dt, dt), flush=True)
            log_loss = []
        if team.main and (step % args.eval_every == 0 or last):
            loss_t, acc = evaluate(model, test)
            print("eval step %d: test loss %.4f exact %s" %
                  (step, loss_t, json.dumps({k: round(v, 3) for k, v in sorted(acc.items())})),
                  flush=True)
            if any_test:
                loss_a, acc_a = evaluate(model, any_test)
                print("  unseen tools: test loss %.4f exact %s" % (loss_a, json.dumps(
                    {k: round(v, 3) for k, v in sorted(acc_a.items())})), flush=True)
            # Every evaluation leaves a usable model: a per-step copy, and --out holds the best
            # so far by held-out exact calls (ties go to the later step: lower lr, lower loss),
            # so a run stopped early still has its best model where export.py looks.
            ck = {"geometry": g.as_dict(), "arrays": model.arrays(), "step": step,
                  "names": model.names, "test_exact": acc, "test_loss": loss_t}
            torch.save(ck, "%s.step%d" % (args.out, step))
            if acc["all"] >= best[0]:
                best = (acc["all"], step)
                torch.save(ck, args.out)
                print("  best so far: step %d exact %.3f -> %s" % (step, acc["all"], args.out),
                      flush=True)
        if last:
            break
    out("done: %d steps in %.0f s; best step %d (exact %.3f) in %s" %
        (step, time.time() - t0, best[1], best[0], args.out), flush=True)
    if team.close():
        sys.exit("a training worker failed")


if __name__ == "__main__":
    main()
