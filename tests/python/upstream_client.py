"""Drives libneedle's upstream-compatible API (needle_load / needle_init / needle_complete /
needle_reset) through ctypes the way upstream's Python package 2.0.8 uses it (spec
tokenizer-and-prompt.md §7, tool-calling.md §2.1, §7): load a .cact blob kept alive by the caller,
init with json.dumps(tools), complete into a 65,536-byte buffer, parse the NUL-terminated text as
JSON, feed json.dumps(results) back while the envelope is a call, reset, re-init with other tools.

usage: upstream_client.py LIBNEEDLE MODEL.cact
"""
import ctypes
import json
import os
import subprocess
import sys
import threading

KEYS = ["type", "success", "error", "error_code", "reason", "function_calls", "suppressed_calls",
        "reasoning", "confidence", "prefill_tps", "decode_tps", "peak_ram_mb"]

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def open_lib(path):
    lib = ctypes.CDLL(path)
    lib.needle_load.argtypes = [ctypes.c_char_p, ctypes.c_uint64]
    lib.needle_load.restype = ctypes.c_int
    lib.needle_init.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p]
    lib.needle_init.restype = ctypes.c_int
    lib.needle_complete.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.needle_complete.restype = ctypes.c_int
    lib.needle_reset.argtypes = []
    lib.needle_reset.restype = None
    lib.needle_builtin_tools_json.argtypes = []
    lib.needle_builtin_tools_json.restype = ctypes.c_char_p
    return lib


def envelope(lib, text, max_new_tokens=48, size=65536):
    buf = ctypes.create_string_buffer(size)
    rc = lib.needle_complete(text.encode("utf-8"), max_new_tokens, buf, len(buf))
    check(rc == 0, f"needle_complete({text[:30]!r}) returned {rc}")
    text = buf.value.decode("utf-8")
    pairs = json.loads(text, object_pairs_hook=lambda kv: kv)
    check([k for k, _ in pairs] == KEYS, f"envelope keys in order: {[k for k, _ in pairs]}")
    env = json.loads(text)  # dicts all the way down (the pairs above nest lists in calls)
    check(env["type"] in ("call", "respond"), f"type {env['type']!r}")
    check(isinstance(env["success"], bool), "success is a bool")
    check(isinstance(env["function_calls"], list), "function_calls is a list")
    check(isinstance(env["confidence"], (int, float)) and 0 <= env["confidence"] <= 1, "confidence in [0,1]")
    if not env["success"]:
        check(isinstance(env["error"], str) and env["error"], "a failed turn has an error text")
        check(isinstance(env["error_code"], str), "a failed turn has an error_code")
    for call in env["function_calls"]:
        check(set(call) == {"name", "arguments"} or list(call) == ["name", "arguments"], f"call shape {call}")
    return env


def weather(city):
    return {"city": city, "temp_c": 21, "sky": "clear"}


def run_loop(lib, functions, query, max_steps=8):
    """The run() loop of tool-calling.md §2.1: execute calls, send json.dumps(results) back."""
    env = envelope(lib, query)
    turns = 1
    for _ in range(max_steps):
        calls = env.get("function_calls") or []
        if env.get("type") != "call" or not calls:
            break
        results = []
        for call in calls:
            fn = functions.get(call.get("name"))
            if fn is None:
                results.append({"error": "unknown tool: " + str(call.get("name"))})
                continue
            try:
                results.append(fn(**(call.get("arguments") or {})))
            except Exception as exc:  # noqa: BLE001 - a raising tool becomes its error text
                results.append({"error": str(exc)})
        env = envelope(lib, json.dumps(results, default=str))
        turns += 1
    return env, turns


def main():
    lib_path, model_path = sys.argv[1], sys.argv[2]
    if os.environ.get("NEEDLE_FIXTURES"):
        # The C++ tests' override (tests/fixtures.h): the fixtures live elsewhere.
        model_path = os.path.join(os.environ["NEEDLE_FIXTURES"], "v2", "models", "tiny.cact")
    if len(sys.argv) > 3 and sys.argv[3] == "--builtin":
        # Child process: upstream's client with no weights= (no needle_load, no NEEDLE_MODEL)
        # runs the built-in demo model (issue 10), which calls its timer tool.
        lib = open_lib(lib_path)
        tools = lib.needle_builtin_tools_json()
        check(lib.needle_init(b"", tools, None) == 0, "needle_init with the built-in model")
        env = envelope(lib, "Set a timer for 5 minutes", 96)
        # The demo call: "5 minutes" is set_timer with 300 seconds.
        calls = env["function_calls"]
        check(calls == [{"name": "set_timer", "arguments": {"seconds": 300}}],
              f"built-in model calls set_timer: {calls}")
        return 1 if failures else 0
    if len(sys.argv) > 3 and sys.argv[3] == "--env-model":
        # Child process: no needle_load, the model comes from NEEDLE_MODEL.
        lib = open_lib(lib_path)
        check(lib.needle_init(b"", b"[]", None) == 0, "needle_init with NEEDLE_MODEL")
        envelope(lib, "hello", 8)
        return 1 if failures else 0

    os.environ.pop("NEEDLE_MODEL", None)
    lib = open_lib(lib_path)
    builtin = lib.needle_builtin_tools_json() is not None
    buf = ctypes.create_string_buffer(65536)
    check(lib.needle_complete(b"hi", 8, buf, len(buf)) < 0, "complete before init is negative")
    if builtin:  # the built-in demo model stands in until needle_load
        check(lib.needle_init(b"", b"[]", None) == 0, "init without needle_load uses the built-in model")
    else:
        check(lib.needle_init(b"", b"[]", None) < 0, "init without a model is negative")
    lib.needle_reset()  # no-op before init
    check(lib.needle_load(b"not a container", 15) < 0, "a damaged blob is refused")

    with open(model_path, "rb") as f:
        blob = f.read()  # kept alive, as the binding does
    check(lib.needle_load(blob, len(blob)) == 0, "needle_load of the fixture blob")

    tools = [{"name": "get_weather", "description": "Get the weather for a city.",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                             "required": ["city"]}}]
    check(lib.needle_init(b"", b"[{\"name\": ", None) < 0, "init with invalid JSON is negative")
    check(lib.needle_init(b"", b"{}", None) < 0, "init with a non-array is negative")
    check(lib.needle_init(b"", b"[{\"name\": 1}]", None) < 0, "init with a non-string name is negative")
    check(lib.needle_init(b"date: 2026-07-21", json.dumps(tools).encode(), None) == 0, "needle_init")

    first = envelope(lib, "What's the weather in Paris?")
    lib.needle_reset()
    env, turns = run_loop(lib, {"get_weather": weather}, "What's the weather in Paris?")
    check(turns >= 1, "run loop")
    lib.needle_reset()
    again = envelope(lib, "What's the weather in Paris?")
    for key in ("type", "success", "error_code", "function_calls", "reasoning", "confidence"):
        check(again[key] == first[key], f"reset replays the first turn: {key} {again[key]!r} vs {first[key]!r}")

    # Buffers: size < 2 is an argument error; too small for the envelope is negative with
    # "" or the minimal envelope; nothing is written past out_buf_size.
    lib.needle_reset()
    tiny_buf = ctypes.create_string_buffer(b"\x7f" * 8, 8)
    check(lib.needle_complete(b"hi", 8, tiny_buf, 1) < 0, "out_buf_size 1 is negative")
    check(lib.needle_complete(b"hi", 8, tiny_buf, 2) < 0, "out_buf_size 2 is negative")
    check(tiny_buf.raw[0] == 0 and tiny_buf.raw[2:] == b"\x7f" * 6, "2-byte buffer: '' and nothing past it")
    mid = ctypes.create_string_buffer(260)
    lib.needle_reset()
    rc = lib.needle_complete(b"hi", 48, mid, len(mid))
    if rc < 0:
        small = json.loads(mid.value.decode()) if mid.value else None
        check(small is None or small["error_code"] == "buffer_too_small", f"minimal envelope {mid.value!r}")
    check(lib.needle_complete(None, 8, buf, len(buf)) < 0, "NULL text is negative")
    check(lib.needle_complete(b"hi", 0, buf, len(buf)) < 0, "max_new_tokens 0 is negative")
    rc = lib.needle_complete(b"bad \xff text", 4, buf, len(buf))
    bad = json.loads(buf.value.decode())
    check(rc == 0 and bad["success"] is False and bad["error_code"] == "invalid_input",
          f"invalid UTF-8 is an envelope: {rc} {bad}")

    # Calls serialize: two threads on the one process-wide chat.
    out = []

    def worker():
        b = ctypes.create_string_buffer(65536)
        out.append((lib.needle_complete(b"Weather in Rome?", 16, b, len(b)), b.value))

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for rc, text in out:
        check(rc == 0 and json.loads(text.decode())["type"] in ("call", "respond"), f"threaded complete {rc}")

    # Re-init with other tools.
    other = [{"name": "send_message", "description": "Send a text message to a contact.",
              "parameters": {"type": "object", "properties": {"recipient": {"type": "string"},
                                                               "text": {"type": "string"}},
                             "required": ["recipient", "text"]}},
             {"name": "set_timer", "parameters": {"type": "object",
                                                  "properties": {"seconds": {"type": "integer", "minimum": 1}}}}]
    check(lib.needle_init(b"", json.dumps(other).encode(), None) == 0, "re-init with other tools")
    env, _ = run_loop(lib, {}, "Text Bob that I am late")
    for call in env["function_calls"]:
        check(call["name"] in ("send_message", "set_timer"), f"call of a declared tool: {call}")

    child = subprocess.run([sys.executable, __file__, lib_path, model_path, "--env-model"],
                           env=dict(os.environ, NEEDLE_MODEL=model_path))
    check(child.returncode == 0, "NEEDLE_MODEL fallback in a fresh process")
    if builtin:
        child = subprocess.run([sys.executable, __file__, lib_path, model_path, "--builtin"],
                               env={k: v for k, v in os.environ.items() if k != "NEEDLE_MODEL"})
        check(child.returncode == 0, "built-in model in a fresh process (no needle_load, no NEEDLE_MODEL)")

    print("upstream client:", "FAILED" if failures else "ok", f"({len(failures)} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
