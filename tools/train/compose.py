"""Compositional queries for the demo model (third generator; data.py keeps the slot fillers,
rendering and word lists).

The second model overfitted its ~20 templates per tool: held-out loss stopped falling while
training loss kept falling, and unseen phrasings ("is it raining in X") got [] or wrong spans.
Here a query is assembled from parts, each drawn per example:

    [context sentence] [opener] [hedge] CORE [time phrase] [suffix]

CORE is a per-tool pattern whose words are themselves slots (verbs, objects, prepositions,
synonyms: "{set} {a_timer} for {dur}" with `set` in set/start/put on/make/run...), so each tool
has thousands of surface forms instead of twenty.

Held-out split (ComposeGen(test=True)): every list below is split by position, index % 5 == 4
test-only (`data.split`). The test set's CORE patterns are always test-only patterns, and its
openers, hedges, suffixes, context sentences and joiners come from the test-only parts; word
slots inside a core (verbs, objects) come from the whole list, so a test verb is unseen 1 time
in 5. The second generator's held-out templates (data.py, the file models/needle-demo.heldout
.json was drawn from) are test-only cores here too, its training templates training cores, and
its held-out cities, names, bodies, labels and number values stay held out, so that file stays
an honest second yardstick (`check_contamination` verifies no training query contains one of
its held-out templates).
"""

import random
import re

import data
import noise
from data import split

# ------------------------------------------------------------------ wrappers (split by index)

OPENERS = ["", "please ", "hey, ", "could you ", "can you ", "ok ", "hi, ", "quick: ",
           "hey assistant, ", "would you ", "I'd like you to ", "go ahead and ", "yo ",
           "excuse me, ", "ok so ", "right, ", "alright, ", "um ", "oh and ", "hello, ",
           "if you can, ", "i need you to ", "real quick, ", "kindly ", "just "]
HEDGES = ["", "", "I think ", "maybe ", "I guess ", "honestly ", "actually ", "so ",
          "basically ", "well ", "hmm ", "now ", "uh ", "I mean ", "right now "]
SUFFIXES = ["", "", "", " please", " thanks", " for me", " real quick", " right now",
            " now", " thank you", " if you can", " asap", " when you get a chance",
            " please and thank you", " cheers", " ok?", " would you", " thx", " ty",
            " if possible", " quickly", " pls", " okay", " for me please", " now please"]
CONTEXTS = ["", "", "", "I'm cooking dinner. ", "It's getting dark. ", "I'm heading out soon. ",
            "Quick question. ", "Good morning! ", "I'm in a hurry. ", "Just got home. ",
            "Okay, one thing. ", "So, ", "Listen. ", "I'm about to leave. ", "Hi there. ",
            "Before I forget, ", "One more thing: ", "I'm at work. ", "Sorry to bother you. ",
            "Busy day today. ", "Alright. ", "Help me out here. ", "It's late. ",
            "Thanks for earlier. ", "Here's what I need: "]
JOINERS = [" and ", ", and ", ", then ", " and also ", ". Also ", " plus ", "; ",
           ". Then ", " and then ", ", also ", " as well as ", " & ", ". And ", " then ",
           ", plus ", " and after that ", ", oh and ", ". Next, ", " also ", ", and please "]

# ------------------------------------------------------------------ word slots inside cores
# Test examples draw these from the whole list; training from the training part only.

WORDS = {
    "set": ["set", "start", "put on", "make", "create", "run", "begin", "kick off",
            "fire up", "get", "give me", "set up", "launch", "add", "queue"],
    "a_timer": ["a timer", "a countdown", "a countdown timer", "a timer", "one timer",
                "a quick timer", "the timer", "a new timer", "a kitchen timer", "a clock"],
    "timer_n": ["timer", "countdown", "timer", "count down", "countdown timer", "clock",
                "kitchen timer", "reminder"],
    "remind": ["remind me in", "ping me in", "alert me in", "let me know in", "notify me in",
               "buzz me in", "nudge me in", "beep in", "ring in", "tell me in"],
    "turn_on": ["turn on", "switch on", "put on", "flip on", "light up", "power on",
                "bring up", "start", "put up", "fire up"],
    "turn_off": ["turn off", "switch off", "shut off", "kill", "cut", "flip off",
                 "power off", "turn out", "put out", "douse"],
    "lights": ["lights", "light", "lamps", "lighting", "lights", "lamp", "ceiling light",
               "lights", "overhead lights", "bulbs"],
    "dim": ["dim", "set", "put", "adjust", "bring", "change", "lower", "turn", "make",
            "raise"],
    "weather": ["weather", "forecast", "weather", "conditions", "weather report",
                "temperature", "weather forecast", "climate right now", "outlook",
                "weather situation"],
    "tell": ["what's", "what is", "tell me", "show me", "give me", "get", "check", "find",
             "look up", "pull up", "read me", "fetch", "how's", "report", "say"],
    "text": ["text", "message", "text", "msg", "send a text to", "send a message to",
             "write to", "ping", "DM", "SMS"],
    "say": ["saying", "that says", "saying that", "telling them", "with", "that",
            "to say", "reading", "with the text", "and say"],
}

# ------------------------------------------------------------------ cores per tool
# {dur} "5 minutes", {durA} "5 minute" (adjective), {label}, {room}, {bright}, {city}, {to},
# {body}; {w:NAME} is a word slot of WORDS. The first entries are data.py's templates in their
# own order, so data.split keeps their train/test side (its index % 5 == 4 are test-only).

TIMER = data.TIMER + [
    "{w:set} {w:a_timer} for {dur}", "{w:set} a {durA} {w:timer_n}", "{w:remind} {dur}",
    "{w:set} {w:a_timer} of {dur}", "{dur} on the {w:timer_n}", "{w:a_timer} for {dur}",
    "{w:timer_n} for {dur}", "{w:set} {w:a_timer} that lasts {dur}",
    "{w:set} {w:a_timer} to go off in {dur}", "I want {w:a_timer} for {dur}",
    "{w:timer_n}: {dur}", "{w:set} {w:a_timer}, {dur}", "count down {dur}",
    "{w:set} {w:a_timer} {dur} from now", "{durA} {w:timer_n}",
    "let me know when {dur} are up",
    "{w:set} {w:a_timer} for the next {dur}", "{dur} countdown starting now",
    "can I get {w:a_timer} for {dur}", "{w:set} me {w:a_timer} for {dur}",
    "start counting down from {dur}", "{w:set} {w:a_timer} lasting {dur}",
    "time me for {dur}", "{w:set} a {durA} {w:timer_n} now", "how about a {durA} {w:timer_n}",
    "{w:set} {w:a_timer} running {dur}", "I'll need {w:a_timer} for {dur}",
    "{dur}, {w:timer_n}", "{w:set} {w:a_timer} on {dur}",
    "go off in {dur}", "{w:set} {w:a_timer} good for {dur}",
    "give it {dur}", "track {dur} for me", "{w:set} {w:a_timer} to ring in {dur}"]
TIMER_LABEL = data.TIMER_LABEL + [
    "{w:set} {w:a_timer} for {dur} for the {label}", "{w:set} a {durA} {label} {w:timer_n}",
    "{label} {w:timer_n} for {dur}", "{w:set} {w:a_timer} called {label} for {dur}",
    "{w:set} {w:a_timer} named {label}, {dur}", "{dur} for {label}",
    "{w:remind} {dur} about the {label}", "{w:set} {w:a_timer} for my {label}: {dur}",
    "{w:set} a {durA} {w:timer_n} labelled {label}", "{w:set} {w:a_timer} for {dur} named {label}",
    "{label}: {dur}", "{w:set} a {label} {w:timer_n}, {dur}",
    "{w:set} {w:a_timer} for {dur} and call it {label}", "{dur} {label} {w:timer_n}",
    "{w:set} a {durA} {w:timer_n} for the {label}", "{w:remind} {dur} to check the {label}",
    "{w:set} {w:a_timer} for {dur}, label it {label}", "the {label} needs {dur}",
    "{w:set} {w:a_timer} for {label}, {dur}", "{w:set} {w:a_timer} tagged {label} for {dur}"]
LIGHTS_ON = data.LIGHTS_ON + [
    "{w:turn_on} the {room} {w:lights}", "{w:turn_on} the {w:lights} in the {room}",
    "{room} {w:lights} on", "{w:lights} on in the {room}", "I need the {room} {w:lights} on",
    "{w:turn_on} the {w:lights} of the {room}", "can we have the {room} {w:lights} on",
    "the {room} is dark, {w:turn_on} the {w:lights}", "{w:lights} in the {room} on",
    "it's dark in the {room}", "on with the {room} {w:lights}", "make the {room} bright",
    "get the {w:lights} on in the {room}", "{w:turn_on} {room} {w:lights}",
    "I want light in the {room}", "the {room} {w:lights} on", "brighten up the {room}",
    "{w:turn_on} the {room}'s {w:lights}", "{room}: {w:lights} on", "let there be light in the {room}"]
LIGHTS_OFF = data.LIGHTS_OFF + [
    "{w:turn_off} the {room} {w:lights}", "{w:turn_off} the {w:lights} in the {room}",
    "{room} {w:lights} off", "{w:lights} off in the {room}", "I don't need the {room} {w:lights}",
    "{w:turn_off} the {w:lights} of the {room}", "no {w:lights} in the {room}",
    "the {room} is too bright, {w:turn_off} the {w:lights}", "{w:lights} in the {room} off",
    "darken the {room}", "off with the {room} {w:lights}", "make the {room} dark",
    "get the {w:lights} off in the {room}", "{w:turn_off} {room} {w:lights}",
    "nobody is in the {room}, {w:turn_off} the {w:lights}", "the {room} {w:lights} off",
    "lights out in the {room}", "{w:turn_off} the {room}'s {w:lights}", "{room}: {w:lights} off",
    "I'm leaving the {room}, {w:turn_off} the {w:lights}"]
LIGHTS_DIM = data.LIGHTS_DIM + [
    "{w:dim} the {room} {w:lights} to {bright}", "{w:dim} the {w:lights} in the {room} to {bright}",
    "{room} {w:lights} to {bright}", "{w:lights} in the {room} at {bright}",
    "{room} brightness {bright}", "{w:dim} the {room} to {bright}",
    "set brightness in the {room} to {bright}", "{w:turn_on} the {room} {w:lights} at {bright}",
    "{bright} in the {room}", "{room} {w:lights} at {bright} please",
    "I'd like the {room} at {bright}", "{w:dim} {room} {w:lights} to {bright}",
    "make the {room} {w:lights} {bright}", "{w:lights} {room} {bright}",
    "{w:dim} the {room}'s {w:lights} to {bright}", "{room}: {bright}",
    "can the {room} {w:lights} go to {bright}", "brightness of the {room} {w:lights} to {bright}",
    "{w:turn_on} the {w:lights} in the {room} to {bright}", "{room} at {bright} brightness"]
WEATHER = data.WEATHER + [
    "{w:tell} the {w:weather} in {city}", "{w:tell} the {w:weather} for {city}",
    "{w:weather} in {city}", "{w:weather} for {city}", "{city} {w:weather}",
    "how's it looking in {city}", "will it rain in {city}", "is it sunny in {city}",
    "how cold is it in {city}", "what's the temperature in {city}", "temperature {city}",
    "is it snowing in {city}", "is it warm in {city}", "should I bring a jacket in {city}",
    "do I need a coat in {city}", "how windy is it in {city}", "any rain in {city}",
    "what's the sky like over {city}", "{w:tell} {city}'s {w:weather}",
    "I'm going to {city}, what's the {w:weather}", "{w:weather} {city}",
    "how humid is {city}", "is it nice out in {city}", "what's the {w:weather} like in {city}",
    "{city}: {w:weather}", "{w:weather} in {city} please", "is it stormy in {city}",
    "how is {city} looking weather-wise", "what are conditions like in {city}",
    "{w:tell} the current {w:weather} in {city}", "is it freezing in {city}",
    "do I need sunscreen in {city}", "is there fog in {city}", "hot or cold in {city}",
    "what should I wear in {city}", "{w:tell} me about the {w:weather} in {city}",
    "weather check: {city}", "what's happening with the {w:weather} in {city}",
    "is the sun out in {city}", "how's {city} today"]
MESSAGE = data.MESSAGE + [
    "{w:text} {to} {w:say} {body}", "{w:text} {to}: {body}", "{w:text} {to} {body}",
    "send {to} a message {w:say} {body}", "send {to} a text {w:say} {body}",
    "tell {to} that {body}", "let {to} know that {body}", "{to} needs to know {body}",
    "send this to {to}: {body}", "message for {to}: {body}", "{w:text} {to} and say {body}",
    "can you {w:text} {to} {w:say} {body}", "quick text to {to}: {body}",
    "text to {to} {w:say} {body}", "{w:text} {to} the words {body}",
    "send a note to {to} {w:say} {body}", "reach out to {to} {w:say} {body}",
    "{w:text} {to} this: {body}", "inform {to} that {body}", "pass on to {to}: {body}",
    "write {to} a message: {body}", "text {to} with {body}", "send {to}: {body}",
    "{to} should get a text {w:say} {body}", "message {to} {w:say} {body}",
    "ping {to} with {body}", "let {to} know {body}", "shoot a message to {to}: {body}",
    "send a quick text to {to} {w:say} {body}", "tell {to} via text {body}"]

# Off-topic lookalikes: the tools' own words around requests that are none of the four tools
# (answered []). Decisions where the tools are silent: an alarm *at a clock time* is not a
# countdown (the tool takes seconds from now) -> []; an alarm *in* a duration is set_timer
# (data.TIMER has "Set an alarm to go off in {dur}"); email, calls and chat apps are not a text
# message -> []; other devices in a room (fan, TV, heating, blinds) are not the lights -> [];
# weather without a city, or for a day other than now, is not get_weather's current weather.
LOOKALIKES = [
    "set an alarm for {clock}", "wake me up at {clock}", "set the thermostat to {n} degrees",
    "turn on the {room} fan", "turn off the TV in the {room}", "book a flight to {city}",
    "call {name}", "email {name} that {body}", "what time is it in {city}",
    "how long is {dur}", "cancel the timer", "how much time is left on my timer",
    "turn the heating on in the {room}", "close the blinds in the {room}",
    "what was the weather like last week", "will it rain tomorrow", "did {name} text me",
    "read my messages from {name}", "find a hotel in {city}", "play music in the {room}",
    "what's {dur} in seconds", "how many seconds in {dur}", "open the {room} window",
    "I set a timer for {dur} yesterday", "the {room} lights are broken",
    "are the {room} lights on?", "who is {name}", "how far is {city}",
    "lock the {room} door", "buy a lamp for the {room}", "order new bulbs for the {room}",
    "what's the population of {city}", "translate {body} into French",
    "what does {body} mean", "delete my messages", "show my timers",
    "pause the timer", "vacuum the {room}", "set an alarm for tomorrow morning",
    "turn up the music in the {room}", "start the oven at {n} degrees", "weather",
    "video call {name}", "block {name}", "is {name} online", "send an email to {name}",
    "reply to the last email", "paint the {room} {color}", "clean the {room}",
    "the {room} is cold", "how old is {city}", "history of {city}",
    "set the volume to {n}", "set the {room} temperature to {n}", "mute {name}",
    "remember that {body}", "add {body} to my notes", "what day is {clock}",
    "set the TV to channel {n}", "who texted me", "flights from {city} to {city2}",
    "navigate to {name}'s house", "turn the oven off", "turn on do not disturb",
    "schedule a text to {name} for tomorrow", "is it {clock} yet", "how do timers work",
    "what is a light year", "why is the sky blue", "how bright is the sun",
    "make a reservation in {city}", "weather is nice today", "I like the {room} lights",
    "the timer went off", "stop the alarm", "snooze", "turn off my alarm",
    "what's the weather going to be next week", "rain sounds please", "dim the screen",
    "set the screen brightness to {bright}", "turn the phone brightness up"]
COLORS = ["blue", "white", "green", "grey", "yellow"]
CLOCKS = ["7am", "6:30", "noon", "midnight", "8 o'clock", "5:45 pm", "seven thirty",
          "tomorrow at 9", "half past six", "10pm"]

# ------------------------------------------------------------------ numbers
# Dense timer arithmetic: minutes 1..180, hours 1..24, seconds 1..300, mixed forms. Held-out
# values: data.py's (7, 13, 22, 35, 48 minutes; 35, 75, 110 seconds) plus these.
HELD_MIN = set(data.HELD_MINUTES) | {58, 67, 83, 104, 127, 151, 172}
HELD_SEC = set(data.HELD_SECONDS) | {140, 230}
HELD_HOURS = {9, 17}
BIG = ["", "one hundred", "two hundred"]


def number_words(n):
    if n < 100:
        return data.words(n)
    rest = n % 100
    return BIG[n // 100] + ("" if rest == 0 else " and " + data.words(rest))


class ComposeGen(data.Gen):
    def __init__(self, rng, test, noisy=False, more=False):
        super().__init__(rng, test)
        self.noisy = noisy and not test
        self.wr = {k: (v if test else split(v, False)) for k, v in WORDS.items()}
        # Round 5: word-level noise and composed wrappers on the training side only (the test
        # side draws nothing new, so its split is unchanged); held-out wrapper parts excluded.
        # Off by default: the shipped (fourth) model's data is the plain generator's.
        if self.noisy:
            held = [h for lst in (OPENERS, HEDGES, SUFFIXES, CONTEXTS, JOINERS)
                    for h in split(lst, True)]
            self.noise = noise.Noise(rng, self.dict, held, meaningful_words())
        # Round 13: more.py's extra phrasings join the training parts (never the test side);
        # more=14, 15 and 16 add rounds 14's, 15's and 16's (more.CORES14, CORES15, CORES16).
        self.more = {}
        if more and not test:
            import more as more_phrasings
            self.more = {14: more_phrasings.LISTS14, 15: more_phrasings.LISTS15,
                         16: more_phrasings.LISTS16, 17: more_phrasings.LISTS17,
                         18: more_phrasings.LISTS17, 19: more_phrasings.LISTS17,
                         20: more_phrasings.LISTS20, 21: more_phrasings.LISTS21,
                         24: more_phrasings.LISTS24}.get(
                more, more_phrasings.LISTS)
            # Round 18: some bodies open with a pronoun (more.BODY_OPENERS18, body below).
            if more is not True and more >= 18:
                self.body_openers = more_phrasings.BODY_OPENERS18
                self.body_opener_share = more_phrasings.BODY_OPENER_SHARE18
            # Round 21: a share of the minute timers run past 180 minutes (duration below).
            if more is not True and more >= 21:
                self.wide_minutes = more_phrasings.WIDE_MINUTES_SHARE21
            # Round 24: its body swap, and the word slot of its weather cores (kept out of
            # WORDS, whose words also make meaningful_words(), so earlier rounds' noise stays).
            if more is not True and more >= 24:
                self.wr["gear"] = split(more_phrasings.GEAR24, False)
                self.bodies = [more_phrasings.BODY_SWAP24.get(b, b) for b in self.bodies]
            # Round 19: off-topic frames no longer talk about umbrellas (more.NO_TOPICS19).
            # Round 19 only: round 20 keeps the umbrella topic (more.py).
            if more == 19:
                self.topics = [t for t in self.topics if t not in more_phrasings.NO_TOPICS19]
            if self.noisy:
                # No filler right before a timer noun: "set a thoroughly timer" (no label)
                # taught that a word there is noise, so "soup timer, ..." lost its label
                # (round 12: 43 of 43 such v2-file queries).
                self.noise.no_insert_before = {w.split()[-1] for w in WORDS["timer_n"] +
                                               WORDS["a_timer"]}

    body_openers = ()  # round 18 and later, training side only
    wide_minutes = 0.0  # round 21 and later, training side only

    def body(self):
        """A message body; from round 18 (training side) a share of them open with a pronoun, so
        that "text Anna I'm late" ends the name before "I'm"."""
        b = super().body()
        if self.body_openers and self.r.random() < self.body_opener_share:
            b = self.pick(self.body_openers) + " " + b
        return b

    def part(self, items):
        """A core or a wrapper part of list `items`: its test-only entries on the test side,
        its training entries (with more.py's extras) otherwise."""
        return self.pick(self.more.get(id(items)) or split(items, self.test))

    core = part  # a core (what is asked) and a wrapper part are drawn alike

    def words_in(self, t):
        t = re.sub(r"\{w:(\w+)\}", lambda m: self.pick(self.wr[m.group(1)]), t)
        return self.noise.words(t) if self.noisy else t

    def number(self, n):
        return number_words(n) if n < 200 and self.r.random() < 0.35 else str(n)

    def value(self, lo, hi, held):
        if self.test and self.r.random() < 0.5:
            vals = sorted(v for v in held if lo <= v <= hi)
            if vals:
                return self.pick(vals)
        while True:
            n = self.r.randint(lo, hi)
            if n not in held:
                return n

    def unit(self, name, n, adjective):
        plural = "" if adjective or n == 1 else "s"
        if name == "minute" and self.r.random() < 0.15:
            return self.pick(["min", "mins", "minute" + plural])
        if name == "second" and self.r.random() < 0.15:
            return self.pick(["sec", "secs", "second" + plural])
        if name == "hour" and self.r.random() < 0.1:
            return self.pick(["hr", "hrs", "hour" + plural])
        return name + plural

    def duration(self, adjective):
        r = self.r.random()
        if r < 0.2:
            return self.common_duration(adjective)
        if r < 0.55:
            # Round 21: minutes up to the schema's 1440 as well. 181..1440 holds ~1260 values, too
            # many to learn one by one, so x60 has to be learnt digit by digit; "122 minutes" ->
            # 7320 ends as the held-out "22 minutes" -> 1320 does. No draw when off (rounds <= 20
            # regenerate byte for byte).
            if self.wide_minutes and self.r.random() < self.wide_minutes:
                n = self.r.randint(181, 1440)
            else:
                n = self.value(1, 180, HELD_MIN)
            return "%s %s" % (self.number(n), self.unit("minute", n, adjective)), n * 60
        if r < 0.7:
            n = self.value(1, 300, HELD_SEC)
            return "%s %s" % (self.number(n), self.unit("second", n, adjective)), n
        if r < 0.8:
            n = self.value(1, 24, HELD_HOURS)
            return "%s %s" % (self.number(n), self.unit("hour", n, adjective)), n * 3600
        if r < 0.87:
            text, secs = self.pick([
                ("half an hour", 1800), ("an hour", 3600), ("a minute", 60),
                ("a quarter of an hour", 900), ("an hour and a half", 5400),
                ("a minute and a half", 90), ("two and a half hours", 9000),
                ("three quarters of an hour", 2700), ("half a minute", 30),
                ("a couple of minutes", 120), ("a second", 1),
                ("one and a half hours", 5400), ("a day", 86400), ("24 hours", 86400)])
            if adjective:
                text = {"an hour": "one hour", "a minute": "one minute",
                        "a second": "one second", "a day": "one day"}.get(text, text)
            return text, secs
        if r < 0.95:
            h, m = self.value(1, 23, HELD_HOURS), self.value(1, 59, HELD_MIN)
            hw = self.unit("hour", h, False)
            mw = self.unit("minute", m, False)
            join = self.pick([" and ", " ", ", "])
            return ("%s %s%s%s %s" % (self.number(h), hw, join, self.number(m), mw),
                    h * 3600 + m * 60)
        m, s = self.value(1, 59, HELD_MIN), self.value(1, 59, HELD_SEC)
        join = self.pick([" and ", " ", ", "])
        return ("%s %s%s%s %s" % (self.number(m), self.unit("minute", m, False), join,
                                  self.number(s), self.unit("second", s, False)), m * 60 + s)

    # -------------------------------------------------------------- one call

    def timer(self):
        if self.r.random() < 0.3:
            t, label = self.words_in(self.core(TIMER_LABEL)), self.label()
            extra = {"label": label}
        else:
            t, label, extra = self.words_in(self.core(TIMER)), "", {}
        text, secs = self.duration("{durA}" in t)
        secs = max(1, min(86400, secs))
        q = t.replace("{durA}", text).replace("{dur}", text).replace("{label}", label)
        return q, {"name": "set_timer", "arguments": dict({"seconds": secs}, **extra)}

    def lights(self):
        room = self.pick(data.ROOMS)
        alias = self.pick(data.ROOM_ALIASES[room])
        k = self.r.random()
        if k < 0.35:
            q, args = self.core(LIGHTS_ON), {"room": room, "on": True}
        elif k < 0.65:
            q, args = self.core(LIGHTS_OFF), {"room": room, "on": False}
        else:
            text, v = self.brightness()
            q = self.core(LIGHTS_DIM).replace("{bright}", text)
            args = {"room": room, "on": v > 0, "brightness": v}
        return self.words_in(q).replace("{room}", alias), {"name": "set_lights", "arguments": args}

    def weather(self):
        city = self.city()
        q = self.words_in(self.core(WEATHER)).replace("{city}", city)
        return q, {"name": "get_weather", "arguments": {"city": city}}

    def message(self):
        to, body = self.name(), self.body()
        q = self.words_in(self.core(MESSAGE))
        if self.r.random() < 0.1 and q.endswith("{body}"):
            body_text = '"%s"' % body
        else:
            body_text = body
        q = q.replace("{to}", to).replace("{body}", body_text)
        return q, {"name": "send_message", "arguments": {"to": to, "body": body}}

    def single(self):
        """One call; on the training side never a query that contains one of the second
        generator's held-out templates (word slots can rebuild them: "{w:text} {to} {w:say}
        {body}" is "text {to} saying {body}" once in a while)."""
        for _ in range(50):
            q, c = super().single()
            if self.test or not self.old_heldout(q, [c]):
                return q, c
        raise RuntimeError("no training query outside the old held-out templates")

    def old_heldout(self, q, calls):
        """Whether a training query contains a held-out template of the second generator
        (round 13, more=True: judged by the query's own values, old_heldout_hits)."""
        if self.more and calls:
            return bool(old_heldout_hits(q, calls))
        return matches_old_heldout(q, not calls)

    def lookalike(self):
        t = self.core(LOOKALIKES)
        fill = {"{clock}": lambda: self.pick(CLOCKS), "{n}": lambda: str(self.r.randint(2, 30)),
                "{room}": lambda: self.pick(data.ROOMS), "{city2}": self.city, "{city}": self.city,
                "{name}": self.name, "{body}": self.body, "{dur}": lambda: self.duration(False)[0],
                "{color}": lambda: self.pick(COLORS), "{bright}": lambda: self.brightness()[0]}
        for k, f in fill.items():
            while k in t:
                t = t.replace(k, f(), 1)
        return t

    # -------------------------------------------------------------- wrapping

    @staticmethod
    def decap(q, values):
        """q with its first letter lower-cased, unless q starts with "I" or with an argument
        value (a city or a name is copied as written)."""
        if q[:2] in ("I ", "I'") or any(v and q.startswith(v) for v in values):
            return q
        return q[:1].lower() + q[1:]

    def wrap(self, q, values, free_end):
        """Context, opener, hedge and suffix around a core; no suffix when the query ends in a
        free-text value (a message body or label would swallow it)."""
        r = self.r
        n = self.noise if self.noisy else None
        if r.random() < 0.45:
            if n and r.random() < 0.4:
                o = n.opener() + self.part(HEDGES)
            else:
                o = self.part(OPENERS) + self.part(HEDGES)
            if o:
                q = o + self.decap(q, values)
        if not free_end and r.random() < 0.35:
            q = q.rstrip(".?!") + (n.tail() if n and r.random() < 0.4 else self.part(SUFFIXES))
        if r.random() < 0.2:
            c = n.scene() if n and r.random() < 0.3 else self.part(CONTEXTS)
            if c:
                q = c + q
        if r.random() < 0.3:
            q = q.rstrip(".?!")
        elif r.random() < 0.1:
            q = q.rstrip(".?!") + self.pick(["?", ".", "!"])
        if r.random() < 0.2 and all(v == v.lower() for v in values):
            q = q.lower()
        return q

    def example(self):
        """One example; the training side resamples any query that contains a held-out
        template of the second generator (a wrapper or a joiner can complete one)."""
        for _ in range(50):
            x = self.example1()
            if self.test or not self.old_heldout(x["query"], x["calls"]):
                return x
        raise RuntimeError("no training example outside the old held-out templates")

    def example1(self):
        # Mix (test side as before): training has more off-topic queries and lookalikes
        # (round 4's weakest class on the round-3 split), and two calls.
        off, two, look = (0.24, 0.43, 0.5) if self.noisy else (0.2, 0.38, 0.45)
        r = self.r.random()
        if r < off:
            q = self.lookalike() if self.r.random() < look else self.off_topic()
            if self.noisy:
                q = self.noise.anywhere(q)
            return {"query": self.wrap(q, [q], False), "calls": [], "kind": "off_topic"}
        if r < two:
            (q1, c1), (q2, c2) = self.single(), self.single()
            while c2["name"] == c1["name"]:
                q2, c2 = self.single()
            calls = [c1, c2]
            values = [str(v) for c in calls for v in c["arguments"].values()]
            q = q1.rstrip(".?!") + self.part(JOINERS) + self.decap(q2, values)
            q = self.wrap(q, values, c2["name"] == "send_message" or "label" in c2["arguments"])
            kind = "two_calls"
        else:
            q, c = self.single()
            calls, kind = [c], c["name"]
            values = [str(v) for v in c["arguments"].values()]
            free = c["name"] == "send_message" or "label" in c["arguments"]
            q = self.wrap(q, values, free)
        if self.r.random() < 0.06:
            q = self.typo(q, values)
        return {"query": q, "calls": calls, "kind": kind}


def meaningful_words():
    """Words a dictionary filler must not be: numbers, units, rooms, on/off, tool words."""
    ws = set(data.ONES) | set(data.TENS) | {"hundred", "half", "quarter", "day", "days", "on",
                                            "off", "no", "not", "dark", "bright", "dim"}
    for u in ("minute", "second", "hour", "min", "sec", "hr"):
        ws |= {u, u + "s"}
    for lst in list(WORDS.values()) + [data.ROOMS, sum(data.ROOM_ALIASES.values(), [])]:
        for phrase in lst:
            ws |= set(phrase.lower().split())
    return ws


SLOT_RE = {"room": "(?:living room|lounge|kitchen|bedroom|bathroom|office|study)"}


def _pattern(t, values=None):
    """A compiled regex for an old held-out template: its fixed words in order, a non-empty
    value for each slot (a room name for {room}; with `values`, a free-text slot is one of the
    query's own values of that argument, quoted or not), anywhere in the query (wrappers
    around it)."""
    out = ""
    for k, piece in enumerate(re.split(r"(\{\w+\})", t.lower().rstrip(".?!"))):
        if k % 2 and values and values.get(piece[1:-1]):
            out += "(?:%s)" % "|".join('"?%s"?' % re.escape(v) for v in values[piece[1:-1]])
        elif k % 2:
            out += SLOT_RE.get(piece[1:-1], ".+?")
        else:
            out += re.escape(piece)
    return re.compile(r"(?:^|\W)" + out + r"(?:\W|$)")


_PATTERNS = []


def old_heldout_patterns():
    """The second generator's held-out templates (data.py lists, index % 5 == 4)."""
    if not _PATTERNS:
        for lst in (data.TIMER, data.TIMER_LABEL, data.LIGHTS_ON, data.LIGHTS_OFF,
                    data.LIGHTS_DIM, data.WEATHER, data.MESSAGE):
            _PATTERNS.extend((t, _pattern(t)) for t in split(lst, True))
    return _PATTERNS


_OFF_PATTERNS = []


def old_offtopic_patterns():
    """The second generator's held-out off-topic templates."""
    if not _OFF_PATTERNS:
        for lst in (data.OFF_TOPIC, data.OFF_FRAMES2, data.OTHER_TOOLS, data.CHITCHAT):
            _OFF_PATTERNS.extend((t, _pattern(t)) for t in split(lst, True))
    return _OFF_PATTERNS


def matches_old_heldout(q, off_topic=False):
    q = q.lower()
    pats = old_offtopic_patterns() if off_topic else old_heldout_patterns()
    return any(p.search(q) for _, p in pats)


FREE_ARGS = ("to", "body", "city", "label")


def old_heldout_hits(q, calls):
    """Round 13's guard: the old held-out templates a tool query contains, a free-text slot
    ({to}, {body}, {city}, {label}) standing for one of this query's own values of that argument
    (a template whose free slot has no such value cannot be in it). The plain patterns let any
    text fill a slot, so "tell {to} {body}" matched every "tell X Y": "tell Anna that ...", a
    training core, and "tell me the weather in ..." never reached training, and "tell" was
    never a message verb (45 of the 60 v2-file queries with it got [] from round 12)."""
    q = q.lower()
    vals = {k: [str(c["arguments"][k]).lower() for c in calls if k in c["arguments"]]
            for k in FREE_ARGS}
    hits = []
    for t, p in old_heldout_patterns():
        slots = [s for s in re.findall(r"\{(\w+)\}", t) if s in FREE_ARGS]
        if not slots:
            if p.search(q):
                hits.append(t)
        elif all(vals[s] for s in slots) and _pattern(t, vals).search(q):
            hits.append(t)
    return hits


def check_contamination(train_rows, old_queries, by_values=False):
    """(training queries equal to an old held-out query, {old template: training matches});
    by_values: tool queries checked as round 13's guard checks them (old_heldout_hits)."""
    old = {q.lower().rstrip(".?!") for q in old_queries}
    same = sum(1 for x in train_rows if x["query"].lower().rstrip(".?!") in old)
    pats = old_heldout_patterns()
    hits = {}
    for x in train_rows:
        q = x["query"].lower()
        if by_values and x["calls"]:
            found = old_heldout_hits(q, x["calls"])
        else:
            found = [t for t, p in (pats if x["calls"] else old_offtopic_patterns())
                     if p.search(q)]
        for t in found:
            hits[t] = hits.get(t, 0) + 1
    return same, hits


if __name__ == "__main__":
    g = ComposeGen(random.Random(5), False)
    for _ in range(30):
        print(g.example()["query"])
