"""Generated tool sets for the unseen-tools stretch of issue 10: random tools (names, descriptions,
typed parameters) and queries that state the values, so that a model learns to read the tools
block instead of recalling four fixed tools.

    /usr/bin/python3 tools/train/anytool.py --out DIR [--sets N] [--per-set K] [--seed S]

writes DIR/anytool.train.jsonl (N tool sets x K queries, each row with its set's canonical
tools JSON in "tools"; rows of one set are consecutive, so a training step can run the shared
tools block once) and DIR/anytool.test.jsonl: 300 queries against ten realistic tools
that no training set contains (set_thermostat, send_email, ...), each alone in its own tools
block, in held-out phrasings (every seventh asks for something else and wants []).

A tool is {verb}_{noun} with 1-3 parameters: string (copied words, names, e-mail addresses),
integer (digits, or words below 100), boolean (a yes/no phrase) or a string enum (one of 2-4
words). A query states every value it wants, most often after a cue: the parameter's own name
("subject expenses", "temperature 21"), "with/set to/is/=". Optional parameters are stated half the
time and then appear in the call; required ones always. Of the queries against a set of 1-3
tools, 82% call one tool, 6% two, 12% none (a request for a different noun: answered []).
"""

import argparse
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import data  # noqa: E402

VERBS = ("set get send create add play book order call open close start stop find check "
         "update delete cancel schedule share save make turn show log track search buy "
         "rate reserve record translate convert remove enable disable lock unlock").split()
NOUNS = ("alarm reminder note playlist song podcast ticket meeting event task order pizza "
         "taxi ride table room hotel flight car door window fan heater oven kettle volume "
         "brightness channel movie recipe list contact photo file folder report invoice "
         "payment expense budget account password device speaker printer camera garden "
         "sprinkler vacuum washer dryer dishwasher coffee tea lamp curtain garage pool "
         "score game quiz poll survey label tag memo diary journal").split()
STRING_PARAMS = ("name title text subject body query city address item artist album "
                 "destination origin color topic language recipient note message "
                 "description location genre author category owner").split()
INT_PARAMS = ("count temperature minutes hours seconds level amount quantity number speed "
              "percent volume rating people days year size duration limit floor "
              "priority").split()
BOOL_PARAMS = "enabled urgent repeat public silent private shuffle loop".split()
ENUM_PARAMS = "mode unit style size format kind speed level".split()
ENUM_VALUES = ("low medium high small large fast slow eco auto manual celsius fahrenheit "
               "red green blue daily weekly monthly hot cold warm json text pdf csv "
               "economy business first normal turbo quiet loud short long").split()

# Ten realistic unseen tools for the held-out set: none of their names is a training tool
# name (the generator never builds these verb_noun pairs, checked in main).
HELD_TOOLS = [
    ("set_thermostat", "Set the thermostat to a temperature.",
     [("temperature", "integer", True)]),
    ("send_email", "Send an email.",
     [("to", "string", True), ("subject", "string", True), ("body", "string", True)]),
    ("play_music", "Play a song.",
     [("title", "string", True), ("artist", "string", False)]),
    ("create_note", "Create a note.", [("text", "string", True)]),
    ("order_food", "Order food for delivery.",
     [("dish", "string", True), ("quantity", "integer", True)]),
    ("book_taxi", "Book a taxi.",
     [("destination", "string", True), ("passengers", "integer", False)]),
    ("translate_text", "Translate text into a language.",
     [("text", "string", True), ("language", "string", True)]),
    ("set_volume", "Set the speaker volume.", [("level", "integer", True)]),
    ("add_calendar_event", "Add an event to the calendar.",
     [("title", "string", True), ("day", "string", True)]),
    ("toggle_wifi", "Turn the wifi on or off.", [("enabled", "boolean", True)]),
]

# Cue templates: how a query states parameter p (spoken name s) with value v. The last two of
# each list are held-out phrasings (the test set uses only those, training never).
CUES = ["{s} {v}", "{s}: {v}", "with {s} {v}", "{s} set to {v}", "{s} = {v}", "{s} is {v}",
        "and {s} {v}", "{s} of {v}", "the {s} {v}", "using {s} {v}"]
HEADS = ["{verb} the {noun}", "{verb} {noun}", "please {verb} the {noun}", "can you {verb} a {noun}",
         "{verb} my {noun}", "I want to {verb} the {noun}", "{noun}:", "{verb} a {noun} now",
         "could you {verb} the {noun}", "hey, {verb} {noun}"]
# Bare statements (--bare): the first value without its parameter's name ("set the thermostat
# to 21 degrees", "create a note: buy milk"), a unit after a number where the name implies one,
# and with a tool alone in its block a head without the noun ("set it to 21 degrees").
BARE = ["{v}", "to {v}", ": {v}", "for {v}", "as {v}", "at {v}"]
UNITS = {"temperature": ["degrees"], "minutes": ["minutes", "min"], "hours": ["hours"],
         "seconds": ["seconds"], "percent": ["%", "percent"], "volume": ["%"], "level": ["%"],
         "people": ["people"], "days": ["days"], "duration": ["minutes"], "speed": ["km/h"],
         "passengers": ["people", "passengers"], "count": ["times"], "rating": ["stars"]}
IT_HEADS = ["{verb} it", "please {verb} it", "{verb} that", "can you {verb} it"]
TAILS = ["", "", "", " please", " thanks", ".", "!", " for me", " now", " asap"]


def split(items, test):
    """Held-out phrasing split: the last 2 of a list are test-only."""
    return items[-2:] if test else items[:-2]


class AnyToolGen:
    def __init__(self, rng, test, heldout_tails=False, bare=0.0):
        self.r, self.test = rng, test
        self.base = data.Gen(rng, test)  # names, cities, bodies, dictionary words
        self.cues, self.heads = split(CUES, test), split(HEADS, test)
        # Tails stay training ones on the test side too: an unseen tail word after a free-text
        # value ("the title leeched now") cannot be told from the value by anyone; with
        # --heldout-tails the test side uses the two held-out tails (the harder variant).
        self.tails = split(TAILS, test and heldout_tails)
        self.bare, self.bare_cues, self.it_heads = bare, split(BARE, test), split(IT_HEADS, test)

    def pick(self, xs):
        return xs[self.r.randrange(len(xs))]

    def word(self):
        return self.pick(self.base.dict)

    # ------------------------------------------------------------------ tools

    def param(self):
        x = self.r.random()
        if x < 0.5:
            name = self.pick(STRING_PARAMS) if self.r.random() < 0.7 else self.word()
            return {"type": "string"}, name
        if x < 0.8:
            name = self.pick(INT_PARAMS) if self.r.random() < 0.7 else self.word()
            schema = {"type": "integer"}
            return schema, name
        if x < 0.9:
            return {"type": "boolean"}, self.pick(BOOL_PARAMS)
        vals = self.r.sample(ENUM_VALUES, self.r.randint(2, 4))
        return {"type": "string", "enum": vals}, self.pick(ENUM_PARAMS)

    def tool(self):
        verb = self.pick(VERBS) if self.r.random() < 0.8 else self.word()
        noun = self.pick(NOUNS) if self.r.random() < 0.6 else self.word()
        name = "%s_%s" % (verb, noun)
        props, required = {}, []
        for _ in range(self.r.choice([1, 1, 2, 2, 2, 3])):
            schema, pname = self.param()
            if pname in props:
                continue
            props[pname] = schema
            if self.r.random() < 0.75:
                required.append(pname)
        if not required:
            required.append(next(iter(props)))
        desc = "%s the %s." % (verb.capitalize(), noun)
        tool = {"name": name, "description": desc,
                "parameters": {"type": "object", "properties": props, "required": required}}
        return tool, (verb, noun)

    # ------------------------------------------------------------------ values and queries

    def value(self, schema, pname):
        t = schema["type"]
        if "enum" in schema:
            v = self.pick(schema["enum"])
            return v, v
        if t == "integer":
            v = self.r.randint(0, 100) if self.r.random() < 0.6 else self.r.randint(100, 9999)
            said = data.words(v) if v < 100 and self.r.random() < 0.2 else str(v)
            return v, said
        if t == "boolean":
            v = self.r.random() < 0.5
            return v, self.pick(["yes", "true", "on"] if v else ["no", "false", "off"])
        x = self.r.random()
        if pname in ("to", "recipient") and x < 0.5:
            v = "%s@%s.%s" % (self.word(), self.word(), self.pick(["com", "org", "net", "io"]))
        elif pname in ("city", "destination", "origin", "location") and x < 0.7:
            v = self.base.city()
        elif x < 0.3:
            v = self.base.name()
        elif x < 0.6:
            v = self.base.body()
        else:
            v = " ".join(self.word() for _ in range(self.r.randint(1, 3)))
        return v, v

    def ask(self, tool, words, alone=False):
        """(query part, call) for one tool: a head naming the verb and noun, then its values.
        alone: the tool is the only one in its block (a head may then leave the noun out)."""
        if self.bare and self.r.random() < self.bare:
            return self.ask_bare(tool, words, alone)
        verb, noun = words
        props = tool["parameters"]["properties"]
        req = tool["parameters"]["required"]
        args, parts = {}, []
        for pname, schema in props.items():
            if pname not in req and self.r.random() < 0.5:
                continue
            v, said = self.value(schema, pname)
            args[pname] = v
            spoken = pname.replace("_", " ")
            parts.append(self.pick(self.cues).format(s=spoken, v=said))
        head = self.pick(self.heads).format(verb=verb.replace("_", " "),
                                            noun=noun.replace("_", " "))
        sep = self.pick([" ", ", ", " with ", " "]) if parts else ""
        joined = self.pick([" ", ", ", " and "]).join(parts)
        return head + sep + joined, {"name": tool["name"], "arguments": args}

    def ask_bare(self, tool, words, alone):
        """Like ask(), the first value stated without its parameter's name."""
        verb, noun = (w.replace("_", " ") for w in words)
        props = tool["parameters"]["properties"]
        req = tool["parameters"]["required"]
        stated = [p for p in props if p in req or self.r.random() < 0.5]
        args, parts = {}, []
        for k, pname in enumerate(stated):
            v, said = self.value(props[pname], pname)
            args[pname] = v
            if k == 0:
                if props[pname]["type"] == "integer" and pname in UNITS and self.r.random() < 0.6:
                    said = str(said) + ("" if self.r.random() < 0.3 and "%" in UNITS[pname]
                                        else " ") + self.pick(UNITS[pname])
                    said = said.replace(" %", "%")
                parts.append(self.pick(self.bare_cues).format(v=said))
            else:
                parts.append(self.pick(self.cues).format(s=pname.replace("_", " "), v=said))
        heads = self.it_heads if alone and self.r.random() < 0.3 else self.heads
        head = self.pick(heads).format(verb=verb, noun=noun)
        glue = " " + parts[0]
        if parts[0].startswith(":"):
            glue = parts[0][1:] if head.endswith(":") else parts[0]
        rest = "".join(self.pick([" ", ", ", " and "]) + x for x in parts[1:])
        return head + glue + rest, {"name": tool["name"], "arguments": args}

    def off_topic(self, names):
        noun = self.pick(NOUNS)
        while any(n.endswith("_" + noun) for n in names):
            noun = self.pick(NOUNS + [self.word()])
        verb = self.pick(VERBS)
        return self.pick(self.heads).format(verb=verb, noun=noun) + self.pick(self.tails)

    def group(self, k):
        """k queries against one set of 1-3 generated tools."""
        tools = [self.tool() for _ in range(self.r.choice([1, 1, 2, 2, 3]))]
        names = [t["name"] for t, _ in tools]
        if len(set(names)) < len(names):
            return self.group(k)
        text = data.tools_json([t for t, _ in tools])
        rows = []
        for _ in range(k):
            x = self.r.random()
            if x < 0.12:
                q, calls, kind = self.off_topic(names), [], "off_topic"
            elif x < 0.18 and len(tools) > 1:
                a, b = self.r.sample(tools, 2)
                qa, ca = self.ask(*a)
                qb, cb = self.ask(*b)
                q = qa + self.pick([" and ", ", then ", ". Also "]) + qb + self.pick(self.tails)
                calls, kind = [ca, cb], "two_calls"
            else:
                qa, ca = self.ask(*self.pick(tools), alone=len(tools) == 1)
                q, calls, kind = qa + self.pick(self.tails), [ca], "any_tool"
            rows.append({"query": q, "calls": calls, "kind": kind, "tools": text})
        return rows

    def held_out(self, n):
        """n queries, each against one of HELD_TOOLS alone, in held-out phrasings; every
        seventh asks for something else (answered [])."""
        rows = []
        for i in range(n):
            name, desc, params = HELD_TOOLS[(i - i // 7) % len(HELD_TOOLS)]
            props = {p: {"type": t} for p, t, _ in params}
            req = [p for p, _, r in params if r]
            tool = {"name": name, "description": desc,
                    "parameters": {"type": "object", "properties": props, "required": req}}
            verb, noun = name.split("_", 1)
            if i % 7 == 6:
                rows.append({"query": self.off_topic([name]), "calls": [], "kind": "off_topic",
                             "tools": data.tools_json([tool])})
                continue
            q, call = self.ask(tool, (verb, noun), alone=True)
            rows.append({"query": q + self.pick(self.tails), "calls": [call], "kind": name,
                         "tools": data.tools_json([tool])})
        return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sets", type=int, default=6000)
    ap.add_argument("--per-set", type=int, default=8)
    ap.add_argument("--test", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bare", type=float, default=0.0,
                    help="share of calls whose first value is stated without its parameter's "
                         "name (BARE cues, units, 'set it to ...'); both sides")
    ap.add_argument("--heldout-tails", action="store_true",
                    help="the test side ends queries with the two held-out tails (now, asap)")
    ap.add_argument("--ship", default="",
                    help="also write the held-out rows here in the CI's needle-demo-heldout/2 "
                         "format, each example with its tools (tests/test_demo_model.cpp)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    g = AnyToolGen(random.Random(args.seed * 1000 + 7), False, bare=args.bare)
    held_names = {t[0] for t in HELD_TOOLS}
    n_rows, clash = 0, 0
    with open(os.path.join(args.out, "anytool.train.jsonl"), "w") as f:
        for _ in range(args.sets):
            rows = g.group(args.per_set)
            if any(c["name"] in held_names for r in rows for c in r["calls"]):
                clash += 1
                continue  # a held-out tool name: never in training
            for r in rows:
                f.write(json.dumps(r) + "\n")
            n_rows += len(rows)
    t = AnyToolGen(random.Random(args.seed * 1000 + 8), True, args.heldout_tails, args.bare)
    held = t.held_out(args.test)
    with open(os.path.join(args.out, "anytool.test.jsonl"), "w") as f:
        for r in held:
            f.write(json.dumps(r) + "\n")
    if args.ship:
        with open(args.ship, "w") as f:
            json.dump({"format": "needle-demo-heldout/2", "examples": held}, f, indent=0)
    print("anytool: %d training rows in sets of %d (%d sets dropped: a held-out name), %d "
          "held-out rows over %d unseen tools" % (n_rows, args.per_set, clash, args.test,
                                                  len(HELD_TOOLS)))


if __name__ == "__main__":
    main()
