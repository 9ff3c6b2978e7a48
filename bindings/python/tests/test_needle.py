"""Tests of the Python bindings against the tiny fixture model.

Run from the repository root:  python3 -m unittest discover -s bindings/python/tests
Fixtures: $NEEDLE_FIXTURES, else ../shared/fixtures relative to the repository root."""
import ctypes
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import needle  # noqa: E402

ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
FIXTURES = os.environ.get("NEEDLE_FIXTURES", os.path.join(ROOT, "..", "shared", "fixtures"))
TINY = os.path.join(FIXTURES, "v2", "models", "tiny.cact")
# Every tiny prompt starts with BOS (id 2), so row 0 of any .full.f32 is the logits after BOS;
# the `empty` prompt is exactly [BOS].
BOS_REF = os.path.join(FIXTURES, "v2", "refs", "tiny", "empty.full.f32")
BOS = 2


def argmax(xs):
    return max(range(len(xs)), key=lambda i: (xs[i], -i))


class LoadTest(unittest.TestCase):
    def test_missing_file_is_io(self):
        with self.assertRaises(needle.NeedleError) as cm:
            needle.Model("/nonexistent/dir/model.cact")
        self.assertEqual(cm.exception.status, needle.E_IO)
        self.assertIn("nonexistent", cm.exception.message)

    def test_garbage_file_is_format(self):
        with tempfile.NamedTemporaryFile(suffix=".cact") as f:
            f.write(b"this is not a needle container" * 10)
            f.flush()
            with self.assertRaises(needle.NeedleError) as cm:
                needle.Model(f.name)
        self.assertEqual(cm.exception.status, needle.E_FORMAT)
        self.assertTrue(cm.exception.message)

    def test_from_bytes(self):
        with open(TINY, "rb") as f:
            data = f.read()
        with needle.Model.from_bytes(data) as m:
            self.assertEqual(m.info.vocab_size, 1024)
        with self.assertRaises(needle.NeedleError) as cm:
            needle.Model.from_bytes(b"garbage")
        self.assertEqual(cm.exception.status, needle.E_FORMAT)

    def test_abi_guard(self):
        self.assertEqual(needle.lib.needle_check_abi(needle.ABI_VERSION), needle.OK)
        self.assertEqual(needle.lib.needle_check_abi(999), needle.E_UNSUPPORTED)
        with self.assertRaises(needle.NeedleError) as cm:
            needle.check_abi(needle.lib, 999)
        self.assertEqual(cm.exception.status, needle.E_UNSUPPORTED)
        self.assertIn("999", cm.exception.message)
        self.assertEqual(needle.abi_version(), needle.ABI_VERSION)
        self.assertTrue(needle.version())


class ModelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = needle.Model(TINY)

    @classmethod
    def tearDownClass(cls):
        cls.model.close()

    def test_info(self):
        info = self.model.info
        self.assertEqual((info.vocab_size, info.d_model, info.num_layers), (1024, 128, 4))
        self.assertEqual(info.bos_id, BOS)
        self.assertTrue(info.has_tokenizer)

    def test_tokenize_roundtrip(self):
        text = "The quick brown fox, caf\u00e9 \u2603"
        ids = self.model.tokenize(text, add_bos=True)
        self.assertEqual(ids[0], BOS)
        self.assertEqual(self.model.detokenize(ids), text)

    def test_bos_logits_match_reference(self):
        with open(BOS_REF, "rb") as f:
            ref = struct.unpack("<1024f", f.read(4096))
        with self.model.new_state() as s:
            logits = s.decode(BOS)
            self.assertEqual(s.pos, 1)
        self.assertEqual(len(logits), 1024)
        self.assertEqual(argmax(logits), argmax(ref))
        for i in range(1024):
            self.assertAlmostEqual(logits[i], ref[i], delta=1e-4, msg="logit %d" % i)

    def test_raw_ffi_equals_safe_api(self):
        lib = needle.lib
        raw_state = ctypes.c_void_p()
        self.assertEqual(lib.needle_state_create(self.model._handle, ctypes.byref(raw_state)), 0)
        try:
            buf = (ctypes.c_float * 1024)()
            self.assertEqual(lib.needle_state_decode(raw_state, BOS, buf, 1024), 0)
        finally:
            lib.needle_state_free(raw_state)
        with self.model.new_state() as s:
            safe = s.decode(BOS)
        self.assertEqual(list(buf), list(safe))

    def test_prefill_with_batch_equals_decode(self):
        ids = self.model.tokenize("hello there, general", add_bos=True)
        with self.model.new_state() as a, self.model.new_state() as b, \
                self.model.new_batch(4) as batch:
            for t in ids:
                last = a.decode(t)
            chunked = b.prefill(ids, batch=batch)
            self.assertEqual(a.pos, b.pos)
        self.assertEqual(list(last), list(chunked))

    def test_decode_many_equals_decode(self):
        with self.model.new_state() as a, self.model.new_state() as b, self.model.new_state() as c, \
                self.model.new_state() as d, self.model.new_batch(2) as batch:
            a.prefill([BOS, 20, 21], logits=False)
            c.prefill([BOS, 20, 21], logits=False)
            b.prefill([BOS], logits=False)
            d.prefill([BOS], logits=False)
            for step in range(3):
                want = [a.decode(30 + step), b.decode(40 + step)]
                got = needle.decode_many([c, d], [30 + step, 40 + step], batch)
                self.assertEqual([list(x) for x in got], [list(x) for x in want])
            self.assertEqual((c.pos, d.pos), (6, 4))
            with self.assertRaises(needle.NeedleError) as cm:
                needle.decode_many([c, c], [30, 31], batch)
            self.assertEqual(cm.exception.status, needle.E_INVALID_ARGUMENT)
            self.assertIn("same state", cm.exception.message)
            self.assertEqual(c.pos, 6)

    def test_decode_errors(self):
        with self.model.new_state() as s:
            with self.assertRaises(needle.NeedleError) as cm:
                s.decode(5000)
            self.assertEqual(cm.exception.status, needle.E_INVALID_ARGUMENT)
            self.assertIn("vocab_size", cm.exception.message)
            self.assertEqual(s.pos, 0)
            with self.assertRaises(needle.NeedleError) as cm:
                s.prefill([BOS] * (self.model.info.max_seq_len + 1), logits=False)
            self.assertEqual(cm.exception.status, needle.E_CONTEXT_FULL)

    def test_integers_are_checked_not_wrapped(self):
        # ctypes alone would pass 2**32 + 5 as token 5 and -1 as 4294967295 or a huge budget.
        with self.model.new_state() as s:
            for bad in (2 ** 32 + 5, -1):
                with self.assertRaisesRegex(ValueError, r"token must be in \[0, 4294967295\]"):
                    s.decode(bad)
                with self.assertRaisesRegex(ValueError, "tokens item"):
                    s.prefill([BOS, bad])
            with self.assertRaisesRegex(TypeError, "token must be an integer, not float"):
                s.decode(2.0)
            with self.assertRaisesRegex(ValueError, "max_tokens"):
                s.generate("Hello", max_tokens=-1)
            with self.assertRaisesRegex(ValueError, "seed"):
                s.generate("Hello", max_tokens=1, seed=-1)
            with self.assertRaisesRegex(TypeError, "prompt must be str, not NoneType"):
                s.generate(None)
            self.assertEqual(s.pos, 0)
        with self.assertRaisesRegex(TypeError, "text must be str, not NoneType"):
            self.model.tokenize(None)
        with self.assertRaisesRegex(ValueError, "tokens item"):
            self.model.detokenize([-1])
        with self.assertRaisesRegex(ValueError, "max_tokens"):
            self.model.new_state(max_tokens=2 ** 32)
        with self.assertRaisesRegex(ValueError, "n_threads"):
            needle.Model(TINY, n_threads=2 ** 31)
        with self.model.new_chat(WEATHER) as chat:
            with self.assertRaisesRegex(ValueError, "max_new_tokens"):
                chat.complete("Paris?", -1)
            # the library refuses 0 too: the range says so instead of a NeedleError
            with self.assertRaisesRegex(ValueError, r"max_new_tokens must be in \[1, 4294967295\], got 0"):
                chat.complete("Paris?", 0)

    def generate(self, **kw):
        with self.model.new_state() as s:
            return s.generate("Hello", max_tokens=16, **kw)

    def test_seeded_generation_is_reproducible(self):
        a = self.generate(temperature=0.8, seed=7)
        b = self.generate(temperature=0.8, seed=7)
        self.assertEqual(a.text, b.text)
        self.assertEqual(a.tokens, b.tokens)
        self.assertTrue(a.generated_tokens > 0)
        self.assertEqual(self.model.detokenize(a.tokens), a.text)

    def test_callback_stop_is_not_an_error(self):
        seen = []
        r = self.generate(callback=lambda t, text: seen.append(t) or len(seen) == 3)
        self.assertEqual(r.stop_reason, needle.STOP_CALLBACK)
        self.assertEqual(r.generated_tokens, 3)
        self.assertEqual(len(seen), 3)

    def test_callback_exception_propagates(self):
        def boom(token, text):
            raise KeyError("from callback")
        with self.assertRaises(KeyError):
            self.generate(callback=boom)

    def test_state_is_busy_inside_its_own_callback(self):
        # Issue 13: these calls used to be accepted and changed the sequence under generate.
        with self.model.new_state() as s, self.model.new_state() as other:
            calls = [lambda: s.decode(5), lambda: s.prefill([5]), lambda: s.generate("x")]
            seen = []

            def reenter(token, text):
                if not seen:
                    for call in calls:
                        try:
                            call()
                            seen.append(None)
                        except needle.NeedleError as e:
                            seen.append((e.status, e.message))
                    other.decode(5)  # another state is free to use
                return False

            r = s.generate("Hello", max_tokens=4, callback=reenter)
            self.assertEqual(len(seen), 3)
            for status, message in seen:
                self.assertEqual(status, needle.E_INVALID_ARGUMENT)
                self.assertIn("state is busy in needle_generate", message)
            self.assertEqual(other.pos, 1)
            self.assertEqual(s.pos, r.prompt_tokens + r.generated_tokens)


# A library that is not libneedle, or lacks part of the ABI it claims: importing the binding must
# raise NeedleError(E_UNSUPPORTED) naming the problem (issue 13: it raised AttributeError).
STUB_GOOD_ABI = r"""
#include <stdint.h>
int32_t needle_check_abi(uint32_t v) { return v == 1 ? 0 : 4; }
const char *needle_last_error(void) { return "stub"; }
"""
STUB_OTHER_ABI = r"""
#include <stdint.h>
int32_t needle_check_abi(uint32_t v) { (void)v; return 4; }
const char *needle_last_error(void) { return "caller expects needle ABI 1, library implements ABI 2"; }
"""
STUB_NO_ABI = "int needle_version_major(void) { return 1; }\n"


class HeadsAndPersistenceTest(unittest.TestCase):
    """Probe heads against the tiny fixture references; state copy / save / load."""

    @classmethod
    def setUpClass(cls):
        cls.model = needle.Model(TINY)
        import json
        with open(os.path.join(FIXTURES, "v2", "refs", "tiny", "manifest.json")) as f:
            cls.prompt = next(p for p in json.load(f)["prompts"] if p["name"] == "plain")

    @classmethod
    def tearDownClass(cls):
        cls.model.close()

    def test_heads_match_the_reference(self):
        import math
        with self.model.new_state() as s:
            s.prefill(self.prompt["ids"], logits=False)
            p = s.confidence()
            logit = math.log(p) - math.log1p(-p)
            self.assertAlmostEqual(logit, self.prompt["heads"]["confidence_logit"], delta=1e-3)
            emb = s.embedding()
            with open(os.path.join(FIXTURES, "v2", self.prompt["heads"]["contrastive"]["file"]), "rb") as f:
                raw = f.read()
            ref = struct.unpack("<%df" % (len(raw) // 4), raw)
            self.assertEqual(len(emb), len(ref))
            self.assertLess(max(abs(a - b) for a, b in zip(emb, ref)), 1e-4)

    def test_no_position_fed_is_an_error(self):
        with self.model.new_state() as s:
            with self.assertRaises(needle.NeedleError) as cm:
                s.confidence()
            self.assertEqual(cm.exception.status, needle.E_INVALID_ARGUMENT)

    def test_copy_and_save_load_continue_identically(self):
        ids = self.prompt["ids"]
        with self.model.new_state() as a, self.model.new_state() as b, self.model.new_state() as c:
            a.prefill(ids, logits=False)
            b.copy_from(a)
            blob = a.save()
            c.load(blob)
            self.assertEqual((b.pos, c.pos), (len(ids), len(ids)))
            for t in (5, 6, 7):
                la, lb, lc = a.decode(t), b.decode(t), c.decode(t)
                self.assertEqual(la.tobytes(), lb.tobytes())
                self.assertEqual(la.tobytes(), lc.tobytes())
            damaged = bytearray(blob)
            damaged[len(damaged) // 2] ^= 0x40
            with self.assertRaises(needle.NeedleError) as cm:
                c.load(bytes(damaged))
            self.assertEqual(cm.exception.status, needle.E_FORMAT)
            self.assertEqual(c.pos, len(ids) + 3)


@unittest.skipUnless(shutil.which("cc"), "needs a C compiler for the stub libraries")
class AbiFirstTest(unittest.TestCase):
    def import_with(self, source):
        with tempfile.TemporaryDirectory() as d:
            c, so = os.path.join(d, "stub.c"), os.path.join(d, "libstub.so")
            with open(c, "w") as f:
                f.write(source)
            subprocess.run(["cc", "-shared", "-fPIC", "-o", so, c], check=True)
            probe = ("import sys; sys.path.insert(0, %r)\n"
                     "try:\n    import needle\n    print('imported')\n"
                     "except Exception as e:\n"
                     "    print(type(e).__name__, getattr(e, 'status', None), e)\n"
                     % os.path.dirname(HERE))
            env = dict(os.environ, NEEDLE_LIB=so)
            out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                                 text=True, check=True)
            return out.stdout.strip()

    def test_missing_function_is_unsupported(self):
        out = self.import_with(STUB_GOOD_ABI)
        self.assertTrue(out.startswith("NeedleError 4 "), out)
        self.assertIn("has no needle_", out)

    def test_other_abi_is_unsupported_with_the_library_message(self):
        out = self.import_with(STUB_OTHER_ABI)
        self.assertTrue(out.startswith("NeedleError 4 "), out)
        self.assertIn("library implements ABI 2", out)

    def test_no_check_abi_is_unsupported(self):
        out = self.import_with(STUB_NO_ABI)
        self.assertTrue(out.startswith("NeedleError 4 "), out)
        self.assertIn("has no needle_check_abi", out)


class CloseOrderTest(unittest.TestCase):
    def test_model_closed_before_state(self):
        model = needle.Model(TINY)
        state = model.new_state()
        batch = model.new_batch(8)
        model.close()
        model.close()  # twice is harmless
        r = state.generate("Hello", max_tokens=4, batch=batch)
        self.assertEqual(r.generated_tokens, 4)
        self.assertEqual(len(state.decode(BOS)), 1024)
        batch.close()
        state.close()
        with self.assertRaises(needle.NeedleError):
            state.decode(BOS)
        with self.assertRaises(needle.NeedleError):
            model.tokenize("x")


WEATHER = [{"name": "get_weather", "description": "Get the weather for a city.",
            "parameters": {"type": "object",
                           "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                           "required": ["city"]}}]
ENVELOPE_KEYS = ["type", "success", "error", "error_code", "reason", "function_calls",
                 "suppressed_calls", "reasoning", "confidence", "prefill_tps", "decode_tps",
                 "peak_ram_mb"]


class ChatTest(unittest.TestCase):
    def test_render_and_canonical_tools(self):
        with needle.Model(TINY) as m, m.new_chat(WEATHER, system="date: 2026-07-21") as chat:
            tools = '[{"name":"get_weather","description":"Get the weather for a city.",' \
                    '"parameters":{"type":"object","properties":{"city":{"type":"string",' \
                    '"enum":["Paris","Oslo"]}},"required":["city"]}}]'
            self.assertEqual(chat.tools_json, tools)
            self.assertEqual(chat.render("Paris?"),
                             "<|im_start|>system\ndate: 2026-07-21<|im_end|>\n<|im_start|>user\n<tools>"
                             + tools + "</tools>\nParis?<|im_end|>\n<|im_start|>assistant\n")

    def test_required_call_then_reset(self):
        with needle.Model(TINY) as m, needle.Chat(m, WEATHER, tool_choice="required") as chat:
            env = chat.complete("What's the weather in Paris?", 64)
            self.assertEqual(list(env), ENVELOPE_KEYS)
            self.assertTrue(env["success"], env)
            self.assertEqual(len(env["function_calls"]), 1)
            self.assertEqual(env["function_calls"][0]["name"], "get_weather")
            self.assertIn(env["function_calls"][0]["arguments"]["city"], ("Paris", "Oslo"))
            chat.reset()
            self.assertEqual(chat.complete("What's the weather in Paris?", 64)["function_calls"],
                             env["function_calls"])

    def test_truncated_and_bad_tools(self):
        with needle.Model(TINY) as m:
            with m.new_chat(WEATHER, tool_choice="required") as chat:
                env = chat.complete("Paris?", 3)
                self.assertFalse(env["success"])
                self.assertEqual(env["error_code"], "truncated")
            with self.assertRaises(needle.NeedleError) as cm:
                m.new_chat('[{"name": 3}]')
            self.assertEqual(cm.exception.status, needle.E_INVALID_ARGUMENT)
            self.assertIn("name", cm.exception.message)
            with self.assertRaises(ValueError):
                m.new_chat(WEATHER, tool_choice="always")

    def test_text_the_library_would_cut_or_cannot_encode_is_refused(self):
        # A NUL would end the C string there: the rest of the query, system or path would be lost.
        with self.assertRaisesRegex(ValueError, "path contains a NUL"):
            needle.Model(TINY + "\0garbage")
        with needle.Model(TINY) as m:
            with self.assertRaisesRegex(ValueError, "system contains a NUL character at index 4"):
                m.new_chat(WEATHER, system="date\0 ignore")
            with self.assertRaisesRegex(TypeError, "tools must be a list .* not NoneType"):
                m.new_chat(None)
            with m.new_chat(WEATHER) as chat:
                with self.assertRaisesRegex(ValueError, "text contains a NUL character at index 5"):
                    chat.complete("Paris\0 and Oslo?")
                with self.assertRaisesRegex(ValueError, "text contains a NUL"):
                    chat.render("\0Paris?")
                with self.assertRaisesRegex(ValueError, "text is not valid Unicode text: .* at index 1"):
                    chat.complete("P\ud800")
            # tokenize passes a length: a NUL is an ordinary character there
            self.assertEqual(m.detokenize(m.tokenize("a\0b")), "a\0b")

    @unittest.skipIf(needle.builtin_tools() is None, "libneedle built without its demo model")
    def test_builtin_model_calls_a_tool(self):
        tools = needle.builtin_tools()
        self.assertEqual([t["name"] for t in json.loads(tools)],
                         ["set_timer", "set_lights", "get_weather", "send_message"])
        with needle.Model.builtin() as m, m.new_chat(tools) as chat:
            self.assertTrue(m.info.has_tokenizer)
            env = chat.complete("Set a timer for 5 minutes")
            self.assertTrue(env["success"], env)
            self.assertEqual(env["function_calls"],
                             [{"name": "set_timer", "arguments": {"seconds": 300}}])


if __name__ == "__main__":
    unittest.main()


class Needle3Test(unittest.TestCase):
    """One Needle 3 case (fixtures/v3 manifest: tiny3 chat, f32): prefill row, confidence,
    depth and max_tokens through the binding."""

    def test_tiny3_chat(self):
        import json
        v3 = os.path.join(FIXTURES, "v3")
        with open(os.path.join(v3, "manifest.json")) as f:
            case = next(c for c in json.load(f)["cases"] if c["id"] == "tiny3__chat__f32")
        with open(os.path.join(v3, case["prompt_file"]), "rb") as f:
            raw = f.read()
        prompt = list(struct.unpack("<%dI" % (len(raw) // 4), raw))
        with open(os.path.join(v3, case["prefill_logits"]), "rb") as f:
            raw = f.read()
        ref = struct.unpack("<%df" % (len(raw) // 4), raw)
        with needle.Model(os.path.join(v3, "models", "tiny3.cact")) as m:
            self.assertEqual(m.info.format_version, 3)
            self.assertEqual(m.info.out_vocab, case["rows"])
            self.assertEqual(m.info.has_confidence_head, 1)
            with m.new_state(max_tokens=len(prompt)) as s:
                got = s.prefill(prompt)
                self.assertLessEqual(max(abs(a - b) for a, b in zip(got, ref)), 2e-4)
                want = 1.0 / (1.0 + 2.718281828459045 ** -case["confidence_logit"])
                self.assertAlmostEqual(s.confidence(), want, delta=1e-4)
                with self.assertRaises(needle.NeedleError) as cm:
                    s.decode(prompt[0])
                self.assertEqual(cm.exception.status, needle.E_CONTEXT_FULL)
        with needle.Model(os.path.join(v3, "models", "tiny3.cact"), depth=3) as m:
            self.assertEqual(m.info.num_layers, 3)
