"""Word-level noise for the training side of the compositional generator (round 5).

The fourth model fitted its training cores (training loss 0.01) while the held-out loss rose
after step 2600: it memorised surface forms. Here a training query is perturbed outside its
argument values: filler words dropped in between the core's words (hesitations, discourse words,
random dictionary words), droppable function words left out, and wrappers assembled from
pieces (greeting + address + request frame, thanks/please tails) so that openers and suffixes
are far more varied. Nothing here runs on the test side (no random draws there, so the
held-out split stays byte for byte the same), and no piece contains one of the held-out
wrapper parts (compose.py's index % 5 == 4 openers, hedges, suffixes, contexts): those stay
unseen in training.
"""

import re

FILLERS = ["um", "uh", "like", "so", "really", "please", "kindly", "now", "quickly", "ok",
           "actually", "basically", "you know", "maybe", "pretty please", "for me", "quick",
           "er", "hmm", "okay", "simply", "also", "then", "yeah", "erm", "sort of", "kinda",
           "oh", "ah", "literally", "perhaps", "soon", "here", "again", "jeez", "hey"]
# Function words that can go without changing a call (never "on"/"off"/numbers/units).
DROPPABLE = {"the", "a", "an", "me", "my", "please", "for", "to", "of", "in", "that", "up"}
GREET = ["hey", "hi", "hello", "yo", "ok", "okay", "alright", "listen", "morning", "evening",
         "so", "oh", "ah", "sure", "hiya", "greetings", "oi", "look"]
ADDRESS = ["", "", "assistant", "buddy", "mate", "friend", "computer", "pal", "bot",
           "there", "you", "robot", "helper"]
FRAMES = ["", "", "please", "could you please", "would you please", "I need you to",
          "I want you to", "do me a favour and", "I'd love it if you'd", "be a dear and",
          "mind if you", "would you kindly", "you should", "I'd appreciate it if you'd",
          "try to", "could you maybe", "can I ask you to", "I would like you to",
          "let's", "time to", "I need to", "help me", "we need to", "I want to", "quickly"]
TAILS = ["", "please", "for me", "cheers", "much appreciated", "thanks a lot", "ta",
         "if that's ok", "when you can", "no rush", "as soon as possible", "please do",
         "thanks so much", "kthx", "merci", "appreciate it", "yes please", "ok thanks",
         "great", "cool", "that's all", "go", "do it", "right away", "immediately"]
SCENES = ["I'm tired.", "Long day.", "Guests are coming.", "I'm on the couch.",
          "My hands are full.", "Kids are asleep.", "Just woke up.", "I'm back.",
          "We're leaving.", "Almost bedtime.", "Lunch break.", "I'm in the car.",
          "Working from home today.", "Movie night.", "Weekend at last."]

FREE_SLOTS = ("{body}", "{label}", "{to}", "{city}", "{city2}", "{name}")


def _words(s):
    return re.findall(r"[a-z']+", s.lower())


def _contains(ws, part):
    n = len(part)
    return n > 0 and any(ws[i:i + n] == part for i in range(len(ws) - n + 1))


class Noise:
    """Perturbations drawn from rng (a random.Random) for training queries only. heldout is the
    list of held-out wrapper strings: no generated piece contains one of them."""

    def __init__(self, rng, dictionary, heldout, meaningful):
        self.r = rng
        self.held = [w for w in (_words(h) for h in heldout) if w]
        ok = lambda s: not any(_contains(_words(s), h) for h in self.held)
        # Dictionary fillers: never a word that could change a call (numbers, units, rooms,
        # on/off, tool words: `meaningful`) nor a held-out wrapper word.
        single = {h[0] for h in self.held if len(h) == 1}
        self.dict = [w for w in dictionary if w not in meaningful and w not in single]
        self.fillers = [f for f in FILLERS if ok(f)]
        self.greet = [g for g in GREET if ok(g)]
        self.address = [a for a in ADDRESS if ok(a)]
        self.frames = [f for f in FRAMES if ok(f)]
        self.tails = [t for t in TAILS if ok(t)]
        self.scenes = [s for s in SCENES if ok(s)]
        self.ok = ok
        self.no_insert_before = set()  # words no filler goes right before (compose.py, more)

    def pick(self, items):
        return items[self.r.randrange(len(items))]

    def filler(self):
        if self.r.random() < 0.3:
            return self.pick(self.dict)
        return self.pick(self.fillers)

    def words(self, t, p=0.35):
        """t (a core pattern with its value slots still in braces) with filler words inserted
        between words and droppable words left out, never next to a free-text slot (a
        name, city, body or label would swallow the filler)."""
        if self.r.random() >= p:
            return t
        ws = t.split(" ")
        for _ in range(self.r.randint(1, 2)):
            k = self.r.random()
            if k < 0.6:
                gaps = [i for i in range(len(ws) + 1)
                        if not any(s in w for s in FREE_SLOTS for w in ws[max(0, i - 1):i + 1])
                        and not (i < len(ws) and
                                 ws[i].lower().strip(",.:;!?") in self.no_insert_before)]
                if gaps:
                    ws.insert(self.pick(gaps), self.filler())
            else:
                drop = [i for i, w in enumerate(ws) if w.lower() in DROPPABLE]
                if drop and len(ws) > 3:
                    del ws[self.pick(drop)]
        return " ".join(ws)

    def opener(self):
        """A composed opener ("hey buddy, could you please "), or ""."""
        parts = []
        if self.r.random() < 0.6:
            g = self.pick(self.greet)
            a = self.pick(self.address)
            parts.append((g + " " + a).strip() + self.pick([", ", " ", ". ", "! "]))
        f = self.pick(self.frames)
        if f:
            parts.append(f + " ")
        s = "".join(parts)
        return s if self.ok(s) else ""

    def tail(self):
        t = self.pick(self.tails)
        return (self.pick([" ", ", ", " - "]) + t) if t and self.ok(t) else ""

    def scene(self):
        return self.pick(self.scenes) + " "

    def anywhere(self, q):
        """Off-topic text: a filler inserted anywhere. Only insertion: dropping or swapping
        words could turn a lookalike ("are the kitchen lights on?") into a request."""
        if self.r.random() >= 0.3:
            return q
        ws = q.split(" ")
        ws.insert(self.r.randrange(len(ws) + 1), self.filler())
        return " ".join(ws)
