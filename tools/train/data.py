"""Training data for the demo model: queries against models/needle-demo.tools.json and the calls
the model must write (issue 10 item 2).

    /usr/bin/python3 tools/train/data.py --out DIR [--train N] [--test N] [--seed S]

writes DIR/train.jsonl, DIR/test.jsonl (one {"query", "calls", "kind"} per line) and
DIR/corpus.txt (rendered training text for the tokenizer). Deterministic for the seed.

Held-out split: the test set uses templates, cities, contact names, message bodies and some
number values the training set never shows (so its accuracy measures generalisation, not
recall). Cities come from tzdata's zone1970.tab (a Debian word list); contact names from a
list of given names below. Most training cities and names are made up per example
(`fresh_name`), bodies and labels drawn from Debian's wamerican word list, so the model learns
to copy any value rather than a closed set. Prompt rendering is tool-calling.md §3.1, the target §3.4 (what the
base model writes: no think block, "<tool_call>" CALLS "</tool_call><|im_end|>").
"""

import argparse
import json
import os
import random
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOOLS_PATH = os.path.join(ROOT, "models", "needle-demo.tools.json")
ZONES = "/usr/share/zoneinfo/zone1970.tab"
DICT = "/usr/share/dict/words"

# ------------------------------------------------------------------ rendering (tool-calling §3)


def tools_json(tools):
    """Canonical tools JSON (§3.3): compact separators, ASCII escapes."""
    return json.dumps(tools, separators=(",", ":"), ensure_ascii=True)


def render_prompt(tools_text, query, system=""):
    """The prompt template of tool-calling.md §3.1, byte for byte."""
    head = "<|im_start|>system\n%s<|im_end|>\n" % system if system != "" else ""
    return (head + "<|im_start|>user\n<tools>" + tools_text + "</tools>\n" + query +
            "<|im_end|>\n<|im_start|>assistant\n")


def render_target(calls):
    """What the model writes back (§3.4, base-model shape): no leading space, no think block."""
    return "<tool_call>" + json.dumps(calls, separators=(",", ":"), ensure_ascii=True) + \
        "</tool_call><|im_end|>"


# ------------------------------------------------------------------ word lists


def held_out(word, salt, share=6):
    """Deterministic split of a word list: about 1/share of the words are test-only."""
    return zlib.crc32((salt + word).encode()) % share == 0


def cities():
    out = set()
    with open(ZONES, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#"):
                continue
            zone = line.split("\t")[2].strip()
            city = zone.split("/")[-1].replace("_", " ")
            if city.isascii() and city[0].isalpha():
                out.add(city)
    return sorted(out)


NAMES = """Aaron Abigail Adam Adrian Aisha Alan Albert Alex Alice Amara Amelia Amir Ana Andre
Andrea Angela Anna Anton Arjun Astrid Ava Barbara Ben Bianca Boris Brian Camila Carla Carlos
Carmen Caroline Chen Chloe Chris Claire Clara Daniel David Diana Diego Dmitri Elena Eli Elias
Elif Emil Emily Emma Eric Erik Ethan Eva Fatima Felix Fiona Frank Freya Gabriel George Grace
Hana Hannah Harry Hassan Helen Henry Hugo Ian Ines Irene Isaac Ivan Jack Jacob James Jana Jane
Javier Jenny Jonas Jorge Jose Julia Julian Kai Karen Kate Kenji Kevin Kim Lara Laura Leah Leo
Leon Liam Lily Linda Lucas Lucy Luis Luka Maria Mark Marta Mateo Max Maya Mei Mia Michael Mila
Nadia Nina Noah Nora Olga Oliver Omar Oscar Pablo Paul Pedro Peter Priya Rafael Ravi Rita Robert
Rosa Ryan Sam Sara Sofia Sophie Stefan Sven Tara Theo Thomas Tom Uma Victor Vera Yara Yusuf Zoe
""".split() + ["Mom", "Dad", "Grandma", "my boss", "the landlord"]

BODIES_TRAIN = ["running late", "on my way", "call me back", "see you at noon",
                "dinner is ready", "pick up milk", "the meeting moved to 3", "happy birthday",
                "I am home", "don't forget the keys", "can you talk", "thanks for today",
                "the package arrived", "leaving now", "good luck tomorrow", "bring an umbrella",
                "lunch at the usual place", "I'll be there in 10 minutes", "love you",
                "the kids are asleep", "check your email", "meet me downstairs"]
BODIES_TEST = ["the train is delayed", "save me a seat", "I fixed the sink", "movie at 8",
               "we won the game", "buy some bread"]

ROOMS = ["living room", "kitchen", "bedroom", "bathroom", "office"]
ROOM_ALIASES = {"living room": ["living room", "lounge"], "kitchen": ["kitchen"],
                "bedroom": ["bedroom"], "bathroom": ["bathroom"], "office": ["office", "study"]}
LABELS_TRAIN = ["pasta", "eggs", "laundry", "tea", "pizza", "workout", "nap", "rice", "bread",
                "meditation", "parking", "homework", "cookies", "break", "oven"]
LABELS_TEST = ["soup", "stretching", "potatoes"]

ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
        "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
        "eighteen", "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def words(n):
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else " " + ONES[n % 10])
    return str(n)


# Number values never used in training (test-only), per unit.
HELD_MINUTES = {7, 13, 22, 35, 48}
HELD_SECONDS = {35, 75, 110}
HELD_BRIGHT = {15, 35, 65, 85}

# ------------------------------------------------------------------ templates
# Each template is (text, slots). "{dur}" etc. are filled by the generators below. Every list is
# split by position: index % 5 == 4 is test-only ("unseen templates").

TIMER = ["set a timer for {dur}", "Set a timer for {dur}.", "start a {durA} timer",
         "timer {dur}", "Can you set a timer for {dur}?", "please start a countdown of {dur}",
         "remind me in {dur}", "Could you time {dur} for me?", "countdown {dur}",
         "I need a timer for {dur}", "{dur} timer please", "Set an alarm to go off in {dur}",
         "start timing {dur}", "give me a {durA} countdown", "hey, timer for {dur}",
         "put a timer on for {dur}", "time {dur}", "Please set a {durA} timer.",
         "Wake me up in {dur}", "begin a {dur} countdown"]
TIMER_LABEL = ["set a {durA} timer for the {label}", "timer for {dur} called {label}",
               "start a {label} timer for {dur}", "set a timer for {dur} for the {label}",
               "{label} timer, {dur}", "Set a {dur} timer labelled {label}",
               "countdown {dur} for {label}", "Can you start a timer for my {label}, {dur}?",
               "I'm making {label}, set a timer for {dur}", "{dur} for the {label} please"]
LIGHTS_ON = ["turn on the {room} lights", "Turn the lights on in the {room}.",
             "lights on in the {room}", "switch on the {room} light", "{room} lights on",
             "Can you turn on the lights in the {room}?", "please light up the {room}",
             "I need light in the {room}", "switch the {room} lights on please",
             "put the {room} lights on"]
LIGHTS_OFF = ["turn off the {room} lights", "Turn the lights off in the {room}.",
              "lights off in the {room}", "switch off the {room} light", "{room} lights off",
              "Can you turn off the lights in the {room}?", "kill the lights in the {room}",
              "no more light in the {room} please", "switch the {room} lights off",
              "shut off the {room} lights"]
LIGHTS_DIM = ["dim the {room} lights to {bright}", "set the {room} lights to {bright}",
              "{room} lights at {bright}", "Turn the {room} lights on at {bright}.",
              "can you set the lights in the {room} to {bright}?",
              "make the {room} {bright} bright", "lights in the {room} to {bright} please",
              "brightness {bright} in the {room}", "put the {room} lights on {bright}",
              "I want the {room} lights at {bright}"]
WEATHER = ["what's the weather in {city}", "What is the weather like in {city}?",
           "weather {city}", "How's the weather in {city} today?", "is it raining in {city}",
           "Tell me the weather for {city}.", "forecast for {city}", "how hot is it in {city}",
           "check the weather in {city} please", "Do I need an umbrella in {city}?",
           "what's it like outside in {city}", "{city} weather", "Get me the weather in {city}",
           "is it cold in {city} right now?", "current weather in {city}"]
MESSAGE = ["send a message to {to} saying {body}", "text {to} {body}",
           "Tell {to} that {body}.", "message {to}: {body}", "Send {to} a text: {body}",
           "can you text {to} and say {body}?", "let {to} know {body}",
           "write to {to}: {body}", "send {to} the message {body}", "text {to} saying {body}",
           "Please message {to} that {body}", "shoot {to} a text: {body}",
           "drop {to} a message saying {body}", "Send a text to {to}: {body}",
           "tell {to} {body}"]
JOINERS = [" and ", ", and ", ", then ", " and also ", ". Also ", " plus "]
OFF_TOPIC = ["what's the capital of France?", "tell me a joke", "who won the world cup",
             "play some jazz", "book a flight to Paris", "what time is it", "order a pizza",
             "how do I boil an egg", "translate hello into Spanish", "what is 12 times 7",
             "turn up the volume", "call my mother", "open the garage door",
             "recommend a good book", "how tall is Mount Everest", "lock the front door",
             "What's your name?", "hello", "thanks!", "good morning",
             "set the thermostat to 21 degrees", "add milk to my shopping list",
             "how are you today", "read me the news", "what's on my calendar",
             "write a poem about the sea", "who are you", "start the vacuum cleaner",
             "how many days until Christmas", "is the shop open on Sunday",
             "play the next song", "what does this word mean", "take a picture",
             "show me my photos", "find a restaurant nearby", "what's the meaning of life"]


SYLLABLES = ["ka", "lo", "mi", "ra", "ven", "to", "sha", "dor", "bel", "ni", "qu", "az", "el",
             "mar", "ti", "os", "ul", "fen", "gra", "po", "zu", "ir", "han", "se", "wy", "cor"]
FILLER_WORDS = """the a my your our this that new old big small red blue green early late
today tonight tomorrow now soon again please maybe really very much more some all no yes
ok fine great good bad home work school car train bus door window table chair book phone
keys bag coat shoes food coffee tea water milk bread cake dinner lunch breakfast party game
movie song show call meeting class trip walk run ride is are was be have has need want get
got bring take send buy make see meet come go leave stay wait call me you us them it there
here at in on for with from to about after before back up down out over""".split()
FRESH = 0.75  # share of training cities/names drawn fresh
BODY_WORDS = FILLER_WORDS + """I I'm I'll we you he she they it's don't can't won't let's
call text dinner lunch tonight tomorrow morning evening weekend sorry thanks love miss late
early ready done home office store park station airport school gym doctor meeting party
game movie keys wallet phone charger milk eggs bread kids dog cat car bus train""".split()
# Held-out bodies and labels must not be made from the same words by chance.
HELD_WORDS = {"soup", "stretching", "potatoes"}
OFF_FRAMES = ["tell me about {w}", "what is {w}", "how do I {v} {w}", "why is {w} {a}",
              "can you {v} the {w}", "I like {w}", "is {w} {a}", "{v} {w} for me",
              "do you know any {w}", "what do you think of {w}"]
OFF_VERBS = ["clean", "fix", "cook", "find", "buy", "sell", "paint", "order", "book", "draw"]
OFF_NOUNS = ["music", "history", "cats", "the moon", "pasta", "football", "the news", "taxes",
             "a car", "the garden", "my emails", "a hotel", "the printer", "chess", "poetry"]
OFF_ADJ = ["good", "expensive", "far", "open", "safe", "popular", "hard"]

# Broad off-topic requests (answered []): frames x topics, other tools' requests, chit-chat.
# Every list is split by position like the templates (index % 5 == 4 is test-only).
TOPICS = """music history cats dogs the moon pasta football the news taxes chess poetry jazz
physics gardening bicycles the ocean volcanoes dinosaurs coffee wine cheese photography
painting yoga the stock market bitcoin elections the weekend my homework science fiction
ancient Rome the Olympics sushi pizza electric cars solar panels the internet robots
climate change space travel birds bees whales sharks mountains deserts rivers trains
airplanes tennis basketball baseball golf movies cartoons video games board games knitting
baking bread chocolate tea vegetables vitamins sleep running swimming marathons math
algebra geometry chemistry biology philosophy religion languages Spanish French German
Japanese grammar spelling novels Shakespeare opera guitars pianos drums dancing fashion
shoes furniture my car my job my family my friends birthdays holidays Halloween Easter
camping hiking fishing insurance mortgages rent recipes soup salads breakfast cereal
museums castles pyramids the Eiffel Tower the Great Wall maps clocks calendars umbrellas
""".split("\n")
TOPICS = [t for line in TOPICS for t in line.split(" ") if t]
TOPIC_PHRASES = ["ancient Rome", "the stock market", "climate change", "space travel",
                 "video games", "board games", "science fiction", "electric cars",
                 "solar panels", "the Great Wall", "the Eiffel Tower", "my homework", "the Olympics"]
OFF_FRAMES2 = ["tell me about {t}", "what do you know about {t}?", "explain {t} to me",
               "I want to learn about {t}", "Can you teach me about {t}?", "{t} is boring",
               "why do people like {t}?", "give me a fact about {t}", "what's your opinion on {t}",
               "I really love {t}", "write a story about {t}", "summarize the history of {t}",
               "Is {t} popular these days?", "how do I get better at {t}?",
               "I'm reading about {t}", "Do you like {t}?", "let's talk about {t}",
               "what's the best book on {t}", "quiz me on {t}", "{t}, what do you think?",
               "I have a question about {t}", "recommend something about {t}",
               "my friend is obsessed with {t}", "How much does {t} cost?",
               "search the web for {t}", "make a list of {t} ideas", "describe {t} in one sentence",
               "are there any podcasts about {t}?", "show me pictures of {t}",
               "what is the origin of {t}", "compose a song about {t}",
               "I don't understand {t}", "who invented {t}?", "tell me a joke about {t}",
               "Find a video about {t}", "do you have any tips for {t}?",
               "what are the rules of {t}", "can you help me with {t}", "remind me what {t} is",
               "translate {t} into French"]
OTHER_TOOLS = ["Book a hotel in {city} for two nights",
               "play some {t}", "play the next song", "Play my workout playlist",
               "call {name}", "Call {name} on speaker", "video call {name}",
               "email {name} about {t}", "what time is it in {city}?",
               "how far is {city} from here", "navigate to {city}", "order a pizza",
               "order sushi for dinner", "set the thermostat to {n} degrees",
               "turn the heating up to {n}", "make it warmer in here", "turn up the volume",
               "mute the TV", "lock the front door", "open the garage door", "unlock the car",
               "add {t} to my shopping list", "put eggs on the grocery list",
               "what's on my calendar today", "schedule a meeting with {name} tomorrow",
               "cancel my dentist appointment", "take a note: buy {t}",
               "start the dishwasher", "close the blinds",
               "open the curtains in the {room}", "take a picture", "show me my photos",
                "how much is a taxi to {city}",
               "convert {n} dollars to euros", "what's {n} plus {n2}",
               "read me the news", "what's the score of the game", "who won the match last night",
               "track my package", "pay the electricity bill", "check my bank balance",
               "post a photo on instagram", "open the calculator", "turn on the TV",
               "turn on the fan", "switch on the coffee machine", "start the washing machine",
               "buy tickets for the concert", "find flights to {city} next week",
               "reserve a table for {n} people", "what movies are playing tonight",
               "Set my status to busy", "charge my phone", "where is my phone",
               "how do I get to {city}", "spell the word {t}", "define the word {t}"]
CHITCHAT = ["hello", "hi", "hey there", "good morning", "good evening", "good night",
            "thank you so much", "who are you", "what's your name",
            "you are great", "I'm bored", "I'm tired", "I had a long day", "nice to meet you",
            "ok", "cool", "never mind", "stop", "cancel that", "yes", "no", "what can you do?",
            "are you a robot?", "I love you", "goodbye", "see you later", "sorry",
            "what's the meaning of life", "tell me something interesting", "sing a song",
            "I'm hungry", "I'm happy today", "it's a beautiful day", "what day is it",
            "what year is it", "how old are you", "can you hear me", "test test",
            "my kitchen is a mess", "I hate the rain", "the weather was lovely yesterday",
            "I already set a timer", "the lights are fine", "I texted her already",
            "{city} is a lovely city", "I visited {city} last year", "{name} is my best friend",
            "I saw {name} at the shop", "did you know {name}?", "I miss {city}"]

# The new lists do not repeat the original list (whose split is the old held-out set).
_OLD = {t.lower().rstrip("?!") for t in OFF_TOPIC}
OFF_FRAMES2, OTHER_TOOLS, CHITCHAT = ([t for t in x if t.lower().rstrip("?!") not in _OLD]
                                      for x in (OFF_FRAMES2, OTHER_TOOLS, CHITCHAT))


def off_train(items):
    """The training part of an off-topic list without anything close to a held-out request of
    the original list (its test queries stay unseen)."""
    held = [t.lower().rstrip("?!") for t in split(OFF_TOPIC, True)]
    base = lambda t: t.lower().split("{")[0].strip().rstrip("?!")
    return [t for t in split(items, False)
            if not any(h.startswith(base(t)) or base(t).startswith(h) for h in held)]


def synthetic_name(r, words=1):
    """A made-up proper name (training only): the model must copy names, not recall them."""
    parts = []
    for _ in range(words):
        w = "".join(r.choice(SYLLABLES) for _ in range(r.randint(1, 3)))
        parts.append(w.capitalize())
    return " ".join(parts)


# A diverse generator of made-up names: letter strings of realistic shape (onset, vowel, coda
# clusters of many languages), recombined parts of real names, dictionary words; 1-2 words,
# varied capitalisation. The old 26 syllables taught the model to copy those and nothing else.
ONSETS = ("b c d f g h j k l m n p r s t v w x y z br bl ch cl cr dr fl fr gl gr kl kr ph pl "
          "pr qu sc sh sk sl sm sn sp st str sw th tr tw vl wh zh ts dz ng gn ps").split()
VOWELS = "a e i o u a e i o u y ai au ea ee ei ia ie io oa oe oi oo ou ua ue ui aa".split()
CODAS = ("n r s l t m k d x z ng nd nt rd rk rn rs st sk th ch sh ll ss tt ck gh").split()


def word_shape(r):
    w = ""
    for k in range(r.choice([1, 1, 2, 2, 2, 3, 3, 4])):
        if k == 0 and r.random() < 0.25:
            w += r.choice(VOWELS)
        else:
            w += r.choice(ONSETS) + r.choice(VOWELS)
        if r.random() < 0.3:
            w += r.choice(CODAS)
    if r.random() < 0.08:
        w += str(r.randint(1, 99))
    return w


def capitalise(r, w):
    x = r.random()
    if x < 0.72:
        return w[:1].upper() + w[1:].lower()
    if x < 0.84:
        return w.lower()
    if x < 0.92:
        return w.upper()
    k = r.randrange(1, max(2, len(w)))
    return w[:1].upper() + w[1:k].lower() + w[k:k + 1].upper() + w[k + 1:].lower()


def fresh_name(r, parts, dictionary, max_words=2):
    """A made-up proper name (training only): shapes, recombined real parts or dictionary
    words, 1-2 words (3 rarely), varied capitalisation."""
    n = 1 if r.random() < 0.7 else (2 if r.random() < 0.9 or max_words < 3 else 3)
    out = []
    for _ in range(min(n, max_words + 1)):
        x = r.random()
        if x < 0.55:
            w = word_shape(r)
        elif x < 0.8:
            a, b = r.choice(parts), r.choice(parts)
            w = a[:r.randint(1, len(a))] + b[r.randint(0, len(b) - 1):]
        else:
            w = r.choice(dictionary)
        out.append(capitalise(r, w))
    return r.choice([" ", " ", " ", "-"]).join(out) if len(out) > 1 else out[0]


def dictionary_words():
    """Lower-case words of Debian's wamerican list (/usr/share/dict/words), 2-10 letters."""
    try:
        with open(DICT, encoding="utf-8") as f:
            ws = [w.strip() for w in f]
    except OSError:
        ws = []
    ws = [w for w in ws if w.isascii() and w.isalpha() and w.islower() and 2 <= len(w) <= 10]
    return ws or FILLER_WORDS


def split(items, test):
    return [t for i, t in enumerate(items) if (i % 5 == 4) == test]


# ------------------------------------------------------------------ slot fillers


class Gen:
    def __init__(self, rng, test):
        self.r, self.test = rng, test
        self.cities = [c for c in cities() if held_out(c, "city") == test]
        self.names = [n for n in NAMES if held_out(n, "name", 5) == test]
        self.bodies = BODIES_TEST if test else BODIES_TRAIN
        self.labels = LABELS_TEST if test else LABELS_TRAIN
        # Parts of real names for recombination: training names and cities only.
        self.parts = [w for w in NAMES + cities() if w.isalpha() and len(w) > 2 and
                      held_out(w, "name", 5) is False and held_out(w, "city") is False]
        self.off = {id(x): off_train(x) for x in (OFF_FRAMES2, OTHER_TOOLS, CHITCHAT)}
        self.dict = [w for w in dictionary_words() if w not in HELD_WORDS]
        self.topics = TOPICS + TOPIC_PHRASES  # what off-topic frames talk about ({t})

    def pick(self, items):
        return items[self.r.randrange(len(items))]

    # Training draws most proper names, bodies and labels fresh (made up, FRESH) so that
    # copying from the query is the only way to be right; the test set uses only real
    # held-out ones.
    def city(self):
        if not self.test and self.r.random() < FRESH:
            return fresh_name(self.r, self.parts, self.dict)
        return self.pick(self.cities)

    def name(self):
        if not self.test and self.r.random() < FRESH:
            return fresh_name(self.r, self.parts, self.dict, 1)
        return self.pick(self.names)

    def body(self):
        if self.test:
            return self.pick(self.bodies)
        x = self.r.random()
        if x < 0.15:
            return self.pick(self.bodies)
        n = self.r.randint(1, 7)
        ws = [self.pick(self.dict) if self.r.random() < 0.45 else self.pick(BODY_WORDS)
              for _ in range(n)]
        if self.r.random() < 0.2:
            ws[0] = ws[0].capitalize()
        if self.r.random() < 0.1:
            ws.append(str(self.r.randint(1, 12)))
        return " ".join(ws)

    def label(self):
        if not self.test and self.r.random() < 0.6:
            w = self.pick(self.dict)
            return w if self.r.random() < 0.7 else w + " " + self.pick(self.dict)
        return self.pick(self.labels)

    def off_topic(self):
        r = self.r.random()
        fill = lambda t: t.replace("{t}", self.pick(self.topics)).replace(
            "{city}", self.pick(self.cities) if self.test or self.r.random() < 0.5 else
            fresh_name(self.r, self.parts, self.dict)).replace(
            "{name}", self.pick(self.names) if self.test or self.r.random() < 0.5 else
            fresh_name(self.r, self.parts, self.dict, 1)).replace(
            "{n2}", str(self.r.randint(2, 30))).replace("{n}", str(self.r.randint(2, 30))).replace(
            "{room}", self.pick(ROOMS))
        if self.test:
            # Held-out: the old list's test templates plus unseen frames of the new lists.
            src = self.pick([OFF_TOPIC, OFF_FRAMES2, OTHER_TOOLS, CHITCHAT])
            return fill(self.pick(split(src, True)))
        if r < 0.1:
            return self.pick(OFF_FRAMES).replace("{w}", self.pick(OFF_NOUNS)).replace(
                "{v}", self.pick(OFF_VERBS)).replace("{a}", self.pick(OFF_ADJ))
        if r < 0.2:
            return self.pick(split(OFF_TOPIC, False))
        src = OFF_FRAMES2 if r < 0.5 else (OTHER_TOOLS if r < 0.8 else CHITCHAT)
        return fill(self.pick(self.off[id(src)]))

    def number(self, n):
        """n as digits or words (words up to 99)."""
        return words(n) if n < 100 and self.r.random() < 0.4 else str(n)

    def allowed(self, n, held):
        return (n in held) == self.test or (not self.test and n not in held)

    def value(self, lo, hi, held):
        """A value in [lo, hi]; the test split favours the held-out values."""
        if self.test and self.r.random() < 0.5:
            return self.pick(sorted(v for v in held if lo <= v <= hi))
        while True:
            n = self.r.randint(lo, hi)
            if n not in held:
                return n

    def common_duration(self, adjective):
        """The durations people ask for most, each seen often (no arithmetic to generalise)."""
        unit, n = self.pick([("m", 5), ("m", 10), ("m", 15), ("m", 20), ("m", 30), ("m", 45),
                             ("m", 1), ("m", 2), ("m", 3), ("m", 25), ("m", 40), ("m", 60),
                             ("m", 90), ("h", 1), ("h", 2), ("h", 3), ("s", 30), ("s", 90),
                             ("s", 45), ("s", 10), ("x", 0), ("x", 1), ("x", 2)])
        if unit == "x":
            text, secs = [("half an hour", 1800), ("an hour", 3600), ("a minute", 60)][n]
            if adjective:
                text = {"an hour": "one hour", "a minute": "one minute"}.get(text, text)
            return text, secs
        name, mult = {"m": ("minute", 60), "h": ("hour", 3600), "s": ("second", 1)}[unit]
        plural = "" if adjective or n == 1 else "s"
        if unit == "m" and not adjective and self.r.random() < 0.15:
            name, plural = self.pick(["min", "mins"]), ""
        return "%s %s%s" % (self.number(n), name, plural), n * mult

    def duration(self, adjective):
        """(text, seconds). adjective: '5 minute' instead of '5 minutes'."""
        if self.r.random() < 0.35:
            return self.common_duration(adjective)
        r = self.r.random()
        if r < 0.45:
            n = self.value(1, 90, HELD_MINUTES)
            unit = "minute" if (adjective or n == 1) else "minutes"
            if not adjective and self.r.random() < 0.15:
                unit = "min"
            return "%s %s" % (self.number(n), unit), n * 60
        if r < 0.65:
            n = self.value(5, 180, HELD_SECONDS)
            unit = "second" if adjective else "seconds"
            return "%s %s" % (self.number(n), unit), n
        if r < 0.8:
            n = self.r.randint(1, 12)
            unit = "hour" if (adjective or n == 1) else "hours"
            return "%s %s" % (self.number(n), unit), n * 3600
        if r < 0.9:
            text, secs = self.pick([("half an hour", 1800), ("an hour", 3600),
                                    ("a minute", 60), ("a quarter of an hour", 900),
                                    ("an hour and a half", 5400), ("90 seconds", 90)])
            if adjective:
                text = {"an hour": "one hour", "a minute": "one minute"}.get(text, text)
            return text, secs
        h, m = self.r.randint(1, 3), self.value(5, 55, HELD_MINUTES)
        return ("%s hour%s and %s minute%s" % (self.number(h), "" if h == 1 else "s",
                                                self.number(m), "" if m == 1 else "s"),
                h * 3600 + m * 60)

    def brightness(self):
        n = self.value(5, 100, HELD_BRIGHT) // 5 * 5 if self.r.random() < 0.7 else \
            self.value(1, 100, HELD_BRIGHT)
        if n in HELD_BRIGHT and not self.test:
            n = 50
        r = self.r.random()
        if r < 0.6:
            return "%d%%" % n, n
        if r < 0.8:
            return "%d percent" % n, n
        text, v = self.pick([("half", 50), ("full", 100), ("maximum", 100), ("a quarter", 25),
                             ("minimum", 0), ("zero", 0)])
        return text, v

    # -------------------------------------------------------------- one call

    def timer(self):
        if self.r.random() < 0.3:
            t = self.pick(split(TIMER_LABEL, self.test))
            label = self.label()
            args_label = {"label": label}
        else:
            t, args_label = self.pick(split(TIMER, self.test)), {}
            label = ""
        text, secs = self.duration("{durA}" in t)
        secs = max(1, min(86400, secs))
        q = t.replace("{durA}", text).replace("{dur}", text).replace("{label}", label)
        return q, {"name": "set_timer", "arguments": dict({"seconds": secs}, **args_label)}

    def lights(self):
        room = self.pick(ROOMS)
        alias = self.pick(ROOM_ALIASES[room])
        k = self.r.random()
        if k < 0.35:
            q, args = self.pick(split(LIGHTS_ON, self.test)), {"room": room, "on": True}
        elif k < 0.65:
            q, args = self.pick(split(LIGHTS_OFF, self.test)), {"room": room, "on": False}
        else:
            text, v = self.brightness()
            q = self.pick(split(LIGHTS_DIM, self.test)).replace("{bright}", text)
            args = {"room": room, "on": v > 0, "brightness": v}
        return q.replace("{room}", alias), {"name": "set_lights", "arguments": args}

    def weather(self):
        city = self.city()
        q = self.pick(split(WEATHER, self.test)).replace("{city}", city)
        return q, {"name": "get_weather", "arguments": {"city": city}}

    def message(self):
        to, body = self.name(), self.body()
        q = self.pick(split(MESSAGE, self.test)).replace("{to}", to).replace("{body}", body)
        return q, {"name": "send_message", "arguments": {"to": to, "body": body}}

    def single(self):
        return self.pick([self.timer, self.lights, self.weather, self.message])()

    # -------------------------------------------------------------- surface variation

    def vary(self, q, values=()):
        """A polite frame, no final punctuation, lower case (only when no argument value has
        capitals: the call copies values as written)."""
        r = self.r
        if r.random() < 0.15:
            q = self.pick(["please ", "hey, ", "could you ", "ok ", "Quick: "]) + q[0].lower() + q[1:]
        if r.random() < 0.25:
            q = q.rstrip(".?!")
        if r.random() < 0.2 and all(v == v.lower() for v in values):
            q = q.lower()
        return q

    def typo(self, q, keep):
        """Swaps two letters inside one word that is not part of an argument value."""
        ws = q.split(" ")
        cand = [i for i, w in enumerate(ws) if len(w) > 3 and w.isalpha() and
                all(w.lower() not in k.lower() for k in keep)]
        if not cand:
            return q
        i = self.pick(cand)
        w = ws[i]
        j = self.r.randrange(len(w) - 1)
        ws[i] = w[:j] + w[j + 1] + w[j] + w[j + 2:]
        return " ".join(ws)

    def example(self):
        r = self.r.random()
        if r < 0.15:
            q, calls, kind = self.off_topic(), [], "off_topic"
            q = self.vary(q)
        elif r < 0.27:
            (q1, c1), (q2, c2) = self.single(), self.single()
            while c2["name"] == c1["name"]:
                q2, c2 = self.single()
            q = q1.rstrip(".?!") + self.pick(JOINERS) + q2[0].lower() + q2[1:]
            calls, kind = [c1, c2], "two_calls"
        else:
            q, c = self.single()
            values = [str(v) for v in c["arguments"].values()]
            q, calls, kind = self.vary(q, values), [c], c["name"]
        values = [str(v) for c in calls for v in c["arguments"].values()]
        if calls and self.r.random() < 0.08:
            q = self.typo(q, values)
        return {"query": q, "calls": calls, "kind": kind}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--train", type=int, default=40000)
    ap.add_argument("--test", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--gen", default="compose",
                    choices=["compose", "noisy", "more", "more14", "more15", "more16", "more17", "more18",
                             "more19", "more20", "more21", "more24", "v2"],
                    help="compose: the compositional generator (compose.py); v2: this file's "
                         "templates (the second demo model's data)")
    ap.add_argument("--old-heldout", default=os.path.join(ROOT, "models", "needle-demo.heldout-v2.json"),
                    help="a previous held-out file: written to OUT/old/test.jsonl as a second "
                         "yardstick and checked against the training set")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    tools = json.load(open(TOOLS_PATH))
    tt = tools_json(tools)
    for name, n, test in (("train", args.train, False), ("test", args.test, True)):
        rng = random.Random(args.seed * 1000 + int(test))
        if args.gen != "v2":
            import compose
            g = compose.ComposeGen(rng, test, args.gen.startswith(("noisy", "more")),
                                   {"more": True, "more14": 14, "more15": 15,
                                    "more16": 16, "more17": 17, "more18": 18,
                                    "more19": 19, "more20": 20, "more21": 21,
                                    "more24": 24}.get(args.gen, False))
        else:
            g = Gen(rng, test)
        rows = [g.example() for _ in range(n)]
        with open(os.path.join(args.out, name + ".jsonl"), "w") as f:
            for x in rows:
                f.write(json.dumps(x) + "\n")
        if not test:
            train_rows = rows
        print("%s: %d examples, %d distinct queries" % (name, n, len({x["query"] for x in rows})))
    if args.old_heldout and os.path.exists(args.old_heldout):
        import compose
        old = json.load(open(args.old_heldout))["examples"]
        os.makedirs(os.path.join(args.out, "old"), exist_ok=True)
        with open(os.path.join(args.out, "old", "test.jsonl"), "w") as f:
            for x in old:
                f.write(json.dumps(x) + "\n")
        same, hits = compose.check_contamination(train_rows, [x["query"] for x in old],
                                                 args.gen.startswith("more"))
        print("old held-out (%s): %d training queries equal one of its %d; training queries "
              "matching its held-out templates: %s" % (args.old_heldout, same, len(old),
                                                        json.dumps(hits) if hits else "none"))
    # Tokenizer corpus: rendered training examples (prompt + target), one per line pair.
    with open(os.path.join(args.out, "train.jsonl")) as f, \
            open(os.path.join(args.out, "corpus.txt"), "w") as out:
        for k, line in enumerate(f):
            if k >= 20000:
                break
            ex = json.loads(line)
            out.write((render_prompt(tt, ex["query"]) + render_target(ex["calls"]))
                      .replace("\n", " ") + "\n")


if __name__ == "__main__":
    main()
