"""Python bindings for libneedle, the Needle inference engine (ctypes, standard library only).

    import needle
    with needle.Model("model.cact") as m, m.new_state() as s:
        print(s.generate("Hello", max_tokens=32).text)

Objects mirror the C handles of needle.h: `Model` (immutable, usable from any thread), `State`
(one sequence; one thread at a time) and `Batch` (prefill scratch). Each has `close()` and is a
context manager; `__del__` closes a forgotten handle. Handles may be closed in any order: the C
library keeps a model alive while states or batches made from it exist, so this module holds no
Python reference from a state to its model.

Failures raise `NeedleError` with `.status` (a NEEDLE_E_* code) and `.message` (needle_last_error
of the failing call, read right after it on the same thread).

The library is found, in order, at $NEEDLE_LIB (a file), in $NEEDLE_LIB_DIR, in the repository's
build directory (../../build from this file), then by the system loader (libneedle.so.1).
Importing this module checks the library's ABI (needle_check_abi) before it resolves any other
function, and raises NeedleError (status E_UNSUPPORTED) for a mismatch, for a library without
needle_check_abi, and for one that lacks a function of the ABI it claims.
"""

import ctypes
import ctypes.util
import json
import operator
import os
from array import array

__all__ = [
    "NeedleError", "Model", "State", "Batch", "ModelInfo", "GenerateResult",
    "version", "abi_version", "status_string", "ABI_VERSION", "decode_many", "builtin_tools",
]

ABI_VERSION = 1  # NEEDLE_ABI_VERSION this module was written against

OK = 0
E_INVALID_ARGUMENT = 1
E_IO = 2
E_FORMAT = 3
E_UNSUPPORTED = 4
E_NO_MEMORY = 5
E_CONTEXT_FULL = 6
E_BUFFER_TOO_SMALL = 7
E_CANCELLED = 8
E_INTERNAL = 9

STOP_NONE = 0
STOP_EOS = 1
STOP_MAX_TOKENS = 2
STOP_CONTEXT_FULL = 3
STOP_CALLBACK = 4

NO_TOKEN = 0xFFFFFFFF


# ------------------------------------------------------------------ C declarations

class _ModelParams(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("use_mmap", ctypes.c_int32),
                ("n_threads", ctypes.c_int32), ("depth", ctypes.c_uint32)]


class _StateParams(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("kv_window", ctypes.c_int32), ("kv_type", ctypes.c_int32),
                ("max_tokens", ctypes.c_uint32)]


class _ModelInfo(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint32) for name in (
        "struct_size", "format_version", "vocab_size", "d_model", "num_layers", "num_heads",
        "num_kv_heads", "head_dim", "v_head_dim", "max_seq_len", "kv_window", "mhc_lanes",
        "num_engram_sites", "bos_id", "eos_id", "pad_id", "unk_id", "has_tokenizer")] + [
        ("weight_bytes", ctypes.c_uint64), ("file_bytes", ctypes.c_uint64),
        ("out_vocab", ctypes.c_uint32), ("global_layer_mask", ctypes.c_uint64)] + [
        (name, ctypes.c_uint32) for name in ("qkv_conv_taps", "has_confidence_head", "has_contrastive_head",
                                             "n_threads")]


class _GenerateParams(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("max_tokens", ctypes.c_uint32),
                ("temperature", ctypes.c_float), ("top_k", ctypes.c_int32),
                ("top_p", ctypes.c_float), ("seed", ctypes.c_uint64), ("add_bos", ctypes.c_int32)]


class _GenerateResult(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("prompt_tokens", ctypes.c_uint32),
                ("generated_tokens", ctypes.c_uint32), ("stop_reason", ctypes.c_uint32),
                ("prefill_ms", ctypes.c_double), ("decode_ms", ctypes.c_double)]


_TOKEN_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint32, ctypes.POINTER(ctypes.c_char),
                                   ctypes.c_size_t, ctypes.c_void_p)

_u32p = ctypes.POINTER(ctypes.c_uint32)
_f32p = ctypes.POINTER(ctypes.c_float)
_vp = ctypes.c_void_p
_st = ctypes.c_int32
_size = ctypes.c_size_t

class _ChatParams(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("tool_choice", ctypes.c_int32),
                ("kv_type", ctypes.c_int32), ("grammar", ctypes.c_int32),
                ("require_required", ctypes.c_int32), ("stop_needs_call", ctypes.c_int32),
                ("sinks", ctypes.c_int32)]


# name: (restype, argtypes)
_SIGNATURES = {
    "needle_abi_version": (ctypes.c_uint32, []),
    "needle_version_string": (ctypes.c_char_p, []),
    "needle_check_abi": (ctypes.c_int32, [ctypes.c_uint32]),
    "needle_status_string": (ctypes.c_char_p, [_st]),
    "needle_last_error": (ctypes.c_char_p, []),
    "needle_model_params_init": (None, [ctypes.POINTER(_ModelParams)]),
    "needle_model_load_file": (_st, [ctypes.c_char_p, ctypes.POINTER(_ModelParams),
                                     ctypes.POINTER(_vp)]),
    "needle_model_load_memory": (_st, [ctypes.c_char_p, _size, ctypes.POINTER(_ModelParams),
                                       ctypes.POINTER(_vp)]),
    "needle_model_load_builtin": (_st, [ctypes.POINTER(_ModelParams), ctypes.POINTER(_vp)]),
    "needle_builtin_tools_json": (ctypes.c_char_p, []),
    "needle_model_free": (None, [_vp]),
    "needle_model_get_info": (_st, [_vp, ctypes.POINTER(_ModelInfo)]),
    "needle_state_create": (_st, [_vp, ctypes.POINTER(_vp)]),
    "needle_state_params_init": (None, [ctypes.POINTER(_StateParams)]),
    "needle_state_create_ex": (_st, [_vp, ctypes.POINTER(_StateParams), ctypes.POINTER(_vp)]),
    "needle_state_free": (None, [_vp]),
    "needle_state_reset": (None, [_vp]),
    "needle_state_pos": (ctypes.c_uint32, [_vp]),
    "needle_state_confidence": (_st, [_vp, ctypes.POINTER(ctypes.c_float)]),
    "needle_batch_create": (_st, [_vp, ctypes.c_uint32, ctypes.POINTER(_vp)]),
    "needle_batch_free": (None, [_vp]),
    "needle_state_decode": (_st, [_vp, ctypes.c_uint32, _f32p, _size]),
    "needle_state_prefill": (_st, [_vp, _vp, _u32p, _size, _f32p, _size]),
    "needle_decode_many": (_st, [ctypes.POINTER(_vp), _u32p, _size, ctypes.POINTER(_f32p), _size, _vp]),
    "needle_model_tokenize": (_st, [_vp, ctypes.c_char_p, _size, ctypes.c_int, _u32p, _size,
                                    ctypes.POINTER(_size)]),
    "needle_model_detokenize": (_st, [_vp, _u32p, _size, ctypes.c_char_p, _size,
                                      ctypes.POINTER(_size)]),
    # probe heads and state persistence (issue 9)
    "needle_state_confidence": (_st, [_vp, _f32p]),
    "needle_state_embedding": (_st, [_vp, _f32p, _size, ctypes.POINTER(_size)]),
    "needle_state_copy": (_st, [_vp, _vp]),
    "needle_state_save": (_st, [_vp, ctypes.c_void_p, _size, ctypes.POINTER(_size)]),
    "needle_state_load": (_st, [_vp, ctypes.c_char_p, _size]),
    "needle_generate_params_init": (None, [ctypes.POINTER(_GenerateParams)]),
    "needle_generate": (_st, [_vp, _vp, ctypes.c_char_p, _size, ctypes.POINTER(_GenerateParams),
                              _TOKEN_CALLBACK, _vp, ctypes.POINTER(_GenerateResult)]),
    "needle_chat_params_init": (None, [ctypes.POINTER(_ChatParams)]),
    "needle_chat_create": (_st, [_vp, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(_ChatParams),
                                 ctypes.POINTER(_vp)]),
    "needle_chat_render": (_st, [_vp, ctypes.c_char_p, ctypes.c_char_p, _size, ctypes.POINTER(_size)]),
    "needle_chat_complete": (_st, [_vp, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_char_p, _size,
                                   ctypes.POINTER(_size)]),
    "needle_chat_reset": (None, [_vp]),
    "needle_chat_free": (None, [_vp]),
    "needle_chat_tools_json": (_st, [_vp, ctypes.c_char_p, _size, ctypes.POINTER(_size)]),
}


def _candidates():
    here = os.path.dirname(os.path.abspath(__file__))
    if os.environ.get("NEEDLE_LIB"):
        yield os.environ["NEEDLE_LIB"]
    if os.environ.get("NEEDLE_LIB_DIR"):
        yield os.path.join(os.environ["NEEDLE_LIB_DIR"], "libneedle.so")
    yield os.path.join(here, "..", "..", "build", "libneedle.so")
    found = ctypes.util.find_library("needle")
    if found:
        yield found
    yield "libneedle.so.1"


def _open_library():
    errors = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            errors.append(path + ": not found")
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            errors.append(str(e))
            continue
        _check_abi_first(lib, path)
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, name, None)
            if fn is None:
                raise NeedleError(E_UNSUPPORTED, "%s implements needle ABI %d but has no %s"
                                  % (path, ABI_VERSION, name))
            fn.restype, fn.argtypes = restype, argtypes
        return lib
    raise ImportError("needle: cannot load libneedle (set NEEDLE_LIB_DIR): " + "; ".join(errors))


def _check_abi_first(library, path):
    """needle_check_abi is the one function resolved before the ABI is known to match."""
    fn = getattr(library, "needle_check_abi", None)
    if fn is None:
        raise NeedleError(E_UNSUPPORTED, "%s has no needle_check_abi: not libneedle, or older than "
                          "its first ABI" % path)
    fn.restype, fn.argtypes = ctypes.c_int32, [ctypes.c_uint32]
    status = fn(ABI_VERSION)
    if status != OK:
        last_error = getattr(library, "needle_last_error", None)  # ABI 1 has it; read it right away
        message = ""
        if last_error is not None:
            last_error.restype, last_error.argtypes = ctypes.c_char_p, []
            message = _decode(last_error())
        raise NeedleError(E_UNSUPPORTED, message or "%s refused needle ABI %d" % (path, ABI_VERSION))


def check_abi(library, expected=ABI_VERSION):
    """Raises NeedleError(E_UNSUPPORTED) unless `library` implements ABI `expected`."""
    _check(library.needle_check_abi(expected), library)


#: The raw ctypes library (all needle_* functions declared); for tests and advanced use.
lib = None


# ------------------------------------------------------------------ errors and helpers

class NeedleError(Exception):
    """A failed libneedle call: `status` is the NEEDLE_E_* code, `message` the library's text."""

    def __init__(self, status, message):
        self.status = status
        self.message = message
        name = _decode(lib.needle_status_string(status)) if lib is not None else str(status)
        super().__init__("%s (status %d): %s" % (name, status, message))


def _decode(b):
    return b.decode("utf-8", "replace") if b is not None else ""


def _check(status, library=None):
    if status != OK:
        # Read the thread-local message right away, on the thread that made the failing call.
        raise NeedleError(status, _decode((library or lib).needle_last_error()))


_U32 = (0, 0xFFFFFFFF)
_I32 = (-0x80000000, 0x7FFFFFFF)
_U64 = (0, 0xFFFFFFFFFFFFFFFF)


def _int(value, name, bounds):
    """`value` as a Python int within the C type's `bounds`: ctypes would wrap 2**32 + 5 to 5 and
    -1 to 4294967295 without a word, so the library would see another argument than the caller's.
    Raises TypeError for a non-integer (a float, None) and ValueError out of range."""
    try:
        v = operator.index(value)  # int, bool, numpy integers; not float
    except TypeError:
        raise TypeError("%s must be an integer, not %s" % (name, type(value).__name__)) from None
    lo, hi = bounds
    if not lo <= v <= hi:
        raise ValueError("%s must be in [%d, %d], got %d" % (name, lo, hi, v))
    return v


def _ids(tokens, name="tokens"):
    """A list of token ids as a ctypes uint32 array, each checked (see _int)."""
    if isinstance(tokens, (str, bytes)):
        raise TypeError("%s must be a sequence of token ids, not %s" % (name, type(tokens).__name__))
    return (ctypes.c_uint32 * len(tokens))(*[_int(t, name + " item", _U32) for t in tokens])


def _utf8(text, name="text", c_string=False):
    """str -> UTF-8 bytes; a TypeError naming the argument for anything else, a ValueError for
    text UTF-8 cannot hold (a lone surrogate) and, where the library reads a NUL-terminated
    C string (c_string), for a NUL character, which would silently end the text there."""
    if not isinstance(text, str):
        raise TypeError("%s must be str, not %s" % (name, type(text).__name__))
    if c_string and "\0" in text:
        raise ValueError("%s contains a NUL character at index %d (the library reads it as a C "
                         "string, which would end there)" % (name, text.index("\0")))
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError("%s is not valid Unicode text: %s at index %d" % (name, e.reason, e.start)) from None


def _path(path):
    """A file path as the bytes the C library opens; a NUL in it is a ValueError (as open())."""
    raw = os.fsencode(path)
    if b"\0" in raw:
        raise ValueError("path contains a NUL character")
    return raw


def version():
    """The library version, e.g. "0.1.0"."""
    return _decode(lib.needle_version_string())


def abi_version():
    """The ABI version the loaded library implements."""
    return lib.needle_abi_version()


def builtin_tools():
    """The JSON tools array the built-in model was trained for (a str for Model.new_chat), or
    None when this libneedle was built without one."""
    raw = lib.needle_builtin_tools_json()
    return None if raw is None else raw.decode("utf-8")


def status_string(status):
    """Short description of a status code."""
    return _decode(lib.needle_status_string(status))


class _Handle:
    """Owns one C handle; subclasses name their free function."""

    _free = None

    def __init__(self, ptr):
        self._ptr = ptr

    @property
    def _handle(self):
        if not self._ptr:
            raise NeedleError(E_INVALID_ARGUMENT, "%s is closed" % type(self).__name__)
        return self._ptr

    @property
    def closed(self):
        return not self._ptr

    def close(self):
        """Frees the C handle; closing twice is harmless."""
        ptr, self._ptr = self._ptr, None
        if ptr and lib is not None:
            getattr(lib, self._free)(ptr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


# ------------------------------------------------------------------ objects

class ModelInfo:
    """Geometry and special ids of a model (the fields of needle_model_info)."""

    def __init__(self, raw):
        for name, _ in _ModelInfo._fields_[1:]:
            setattr(self, name, getattr(raw, name))
        self.has_tokenizer = bool(self.has_tokenizer)

    def __repr__(self):
        return "ModelInfo(vocab_size=%d, d_model=%d, num_layers=%d, max_seq_len=%d)" % (
            self.vocab_size, self.d_model, self.num_layers, self.max_seq_len)


class Model(_Handle):
    """A loaded .cact container. Thread-safe; may be closed while its states are still in use."""

    _free = "needle_model_free"

    def __init__(self, path, use_mmap=True, n_threads=0, depth=0):
        """depth: Needle 3 depth-ladder rung (0 = all layers, 2..num_layers; Needle 2: 0 only)."""
        super().__init__(None)
        p = self._params(use_mmap, n_threads, depth)
        out = ctypes.c_void_p()
        _check(lib.needle_model_load_file(_path(path), ctypes.byref(p), ctypes.byref(out)))
        self._ptr = out.value
        self.info = self._read_info()

    @classmethod
    def from_bytes(cls, data, n_threads=0, depth=0):
        """Loads a container from memory (the bytes are copied)."""
        data = bytes(data)
        return cls._adopt(lambda p, out: lib.needle_model_load_memory(data, len(data), p, out),
                          cls._params(True, n_threads, depth))

    @classmethod
    def builtin(cls, n_threads=0):
        """The demo model compiled into libneedle (models/README.md), trained for the tools of
        builtin_tools(). Raises NeedleError E_UNSUPPORTED for a build without one."""
        return cls._adopt(lib.needle_model_load_builtin, cls._params(True, n_threads))

    @classmethod
    def _adopt(cls, load, p):
        """A Model holding the handle that load(params, out) writes to out."""
        self = cls.__new__(cls)
        _Handle.__init__(self, None)
        out = ctypes.c_void_p()
        _check(load(ctypes.byref(p), ctypes.byref(out)))
        self._ptr = out.value
        self.info = self._read_info()
        return self

    @staticmethod
    def _params(use_mmap, n_threads, depth=0):
        p = _ModelParams(struct_size=ctypes.sizeof(_ModelParams))  # init writes only struct_size bytes
        lib.needle_model_params_init(ctypes.byref(p))
        p.use_mmap = int(bool(use_mmap))
        p.n_threads, p.depth = _int(n_threads, "n_threads", _I32), _int(depth, "depth", _U32)
        return p

    def _read_info(self):
        raw = _ModelInfo(struct_size=ctypes.sizeof(_ModelInfo))
        _check(lib.needle_model_get_info(self._handle, ctypes.byref(raw)))
        return ModelInfo(raw)

    def tokenize(self, text, add_bos=False):
        """Encodes text with the model's tokenizer; returns a list of ids."""
        raw = _utf8(text)
        n = ctypes.c_size_t(len(raw) + 8)  # a first guess; the library reports the exact need
        while True:
            buf = (ctypes.c_uint32 * n.value)()
            status = lib.needle_model_tokenize(self._handle, raw, len(raw), int(bool(add_bos)),
                                               buf, len(buf), ctypes.byref(n))
            if status != E_BUFFER_TOO_SMALL:
                _check(status)
                return list(buf[:n.value])

    def detokenize(self, tokens):
        """Decodes ids to text."""
        ids = _ids(tokens)
        n = ctypes.c_size_t()
        status = lib.needle_model_detokenize(self._handle, ids, len(tokens), None, 0,
                                             ctypes.byref(n))
        if status != E_BUFFER_TOO_SMALL:
            _check(status)
        buf = ctypes.create_string_buffer(n.value + 1)
        _check(lib.needle_model_detokenize(self._handle, ids, len(tokens), buf, len(buf),
                                           ctypes.byref(n)))
        return buf.raw[:n.value].decode("utf-8")

    def new_state(self, kv_window=-1, int8_kv=False, max_tokens=0):
        """A new empty sequence (see State)."""
        return State(self, kv_window, int8_kv, max_tokens)

    def new_chat(self, tools="[]", system="", tool_choice="auto"):
        """A tool-calling conversation on this model (see Chat)."""
        return Chat(self, tools, system, tool_choice)

    def new_batch(self, capacity):
        """Prefill scratch for chunks of up to `capacity` positions (see Batch)."""
        return Batch(self, capacity)


class Batch(_Handle):
    """Scratch for chunked prefill; serves any state of the same model, one thread at a time."""

    _free = "needle_batch_free"

    def __init__(self, model, capacity):
        super().__init__(None)
        out = ctypes.c_void_p()
        capacity = _int(capacity, "capacity", _U32)
        _check(lib.needle_batch_create(model._handle, capacity, ctypes.byref(out)))
        self._ptr = out.value
        self.capacity = capacity


def decode_many(states, tokens, batch, logits=True):
    """One decode step of several states of one model at once (needle.h needle_decode_many):
    tokens[i] is fed to states[i]; `batch` (capacity >= len(states)) is the step's scratch.
    Returns a list of the states' next-token logits as array('f') (None if logits=False); each
    is what states[i].decode(tokens[i]) would give. On an error no state has changed."""
    n = len(states)
    if len(tokens) != n:
        raise ValueError("decode_many: %d states but %d tokens" % (n, len(tokens)))
    handles = (_vp * n)(*[s._handle for s in states])
    ids = _ids(tokens)
    outs, ptrs, width = [None] * n, None, 0
    if logits and n:
        width = states[0].vocab_size
        outs = [array("f", bytes(4 * width)) for _ in range(n)]
        ptrs = (_f32p * n)(*[ctypes.cast(o.buffer_info()[0], _f32p) for o in outs])
    _check(lib.needle_decode_many(handles, ids, n, ptrs, width, batch._handle))
    return outs


class GenerateResult:
    """Outcome of State.generate: the text and ids streamed, and the library's figures."""

    def __init__(self, text, tokens, raw):
        self.text = text
        self.tokens = tokens
        self.prompt_tokens = raw.prompt_tokens
        self.generated_tokens = raw.generated_tokens
        self.stop_reason = raw.stop_reason
        self.prefill_ms = raw.prefill_ms
        self.decode_ms = raw.decode_ms

    def __repr__(self):
        return "GenerateResult(generated_tokens=%d, stop_reason=%d, text=%r)" % (
            self.generated_tokens, self.stop_reason, self.text)


class State(_Handle):
    """One sequence (position, history, caches). Use from one thread at a time."""

    _free = "needle_state_free"

    def __init__(self, model, kv_window=-1, int8_kv=False, max_tokens=0):
        """kv_window: -1 the model's window, 0 full causal, > 0 that many tokens. int8_kv: an int8
        KV cache (3.8x smaller at head_dim 64, logits not bit-faithful; needle.h needle_kv_type).
        max_tokens: positions the state can hold (0 = max_seq_len); its memory is sized for them."""
        super().__init__(None)
        p = _StateParams(struct_size=ctypes.sizeof(_StateParams))  # init writes only struct_size bytes
        lib.needle_state_params_init(ctypes.byref(p))
        p.kv_window = _int(kv_window, "kv_window", _I32)
        p.kv_type = 1 if int8_kv else 0
        p.max_tokens = _int(max_tokens, "max_tokens", _U32)
        out = ctypes.c_void_p()
        _check(lib.needle_state_create_ex(model._handle, ctypes.byref(p), ctypes.byref(out)))
        self._ptr = out.value
        # needle.h has no state->model accessor, so remember what logits buffers need.
        self.vocab_size = model.info.out_vocab  # logits rows

    @property
    def pos(self):
        """Tokens fed so far."""
        return lib.needle_state_pos(self._handle)

    def reset(self):
        """Rewinds to position 0."""
        lib.needle_state_reset(self._handle)

    def _logits(self, want):
        if not want:
            return None, None, 0
        out = array("f", bytes(4 * self.vocab_size))
        addr, n = out.buffer_info()
        return out, ctypes.cast(addr, _f32p), n

    def decode(self, token, logits=True):
        """Feeds one token; returns the next-token logits as array('f') (None if logits=False)."""
        token = _int(token, "token", _U32)
        out, ptr, n = self._logits(logits)
        _check(lib.needle_state_decode(self._handle, token, ptr, n))
        return out

    def prefill(self, tokens, batch=None, logits=True):
        """Feeds tokens (in chunks through `batch` if given); returns the last position's logits."""
        ids = _ids(tokens)
        out, ptr, n = self._logits(logits and len(tokens) > 0)
        _check(lib.needle_state_prefill(self._handle, batch._handle if batch else None, ids,
                                        len(tokens), ptr, n))
        return out

    def confidence(self):
        """σ(confidence head) over every token fed so far (needle.h needle_state_confidence).
        Raises NeedleError E_UNSUPPORTED for a model without the head."""
        p = ctypes.c_float()
        _check(lib.needle_state_confidence(self._handle, ctypes.byref(p)))
        return p.value

    def embedding(self):
        """Unit contrastive embedding (list of floats) of every token fed so far; the
        similarity of two is their dot product. E_UNSUPPORTED without the head."""
        dim = _size()
        status = lib.needle_state_embedding(self._handle, None, 0, ctypes.byref(dim))
        if status != E_BUFFER_TOO_SMALL:
            _check(status)
        out = (ctypes.c_float * dim.value)()
        _check(lib.needle_state_embedding(self._handle, out, dim.value, ctypes.byref(dim)))
        return list(out)

    def copy_from(self, other):
        """Makes this state continue exactly as `other` (same model and options)."""
        _check(lib.needle_state_copy(self._handle, other._handle))

    def save(self):
        """The state as bytes (versioned, checksummed, tied to the model file)."""
        n = _size()
        status = lib.needle_state_save(self._handle, None, 0, ctypes.byref(n))
        if status != E_BUFFER_TOO_SMALL:
            _check(status)
        buf = ctypes.create_string_buffer(n.value)
        _check(lib.needle_state_save(self._handle, buf, n.value, ctypes.byref(n)))
        return buf.raw[:n.value]

    def load(self, blob):
        """Restores a save() of the same model file and options; E_FORMAT (state unchanged)
        for anything else."""
        _check(lib.needle_state_load(self._handle, bytes(blob), len(blob)))

    def generate(self, prompt, max_tokens=128, temperature=0.0, top_k=0, top_p=1.0, seed=0,
                 add_bos=True, batch=None, callback=None):
        """Feeds `prompt` and generates up to `max_tokens` tokens.

        `callback(token, text)` is called per token with the text it completes (token is
        NO_TOKEN for a final U+FFFD flush); a truthy return stops generation, which is not an
        error (stop_reason STOP_CALLBACK). An exception in the callback stops generation and is
        re-raised here. Returns a GenerateResult."""
        p = _GenerateParams(struct_size=ctypes.sizeof(_GenerateParams))  # init writes only struct_size bytes
        lib.needle_generate_params_init(ctypes.byref(p))
        p.max_tokens = _int(max_tokens, "max_tokens", _U32)
        p.top_k, p.seed = _int(top_k, "top_k", _I32), _int(seed, "seed", _U64)
        p.temperature, p.top_p, p.add_bos = temperature, top_p, int(bool(add_bos))
        res = _GenerateResult(struct_size=ctypes.sizeof(_GenerateResult))
        pieces, tokens, failure = [], [], []

        def trampoline(token, text, length, _user):
            try:
                piece = ctypes.string_at(text, length).decode("utf-8", "replace")
                pieces.append(piece)
                if token != NO_TOKEN:
                    tokens.append(token)
                return 1 if callback is not None and callback(token, piece) else 0
            except BaseException as e:  # never let an exception reach C
                failure.append(e)
                return 1

        c_callback = _TOKEN_CALLBACK(trampoline)  # referenced until the call returns
        raw = _utf8(prompt, "prompt")
        status = lib.needle_generate(self._handle, batch._handle if batch else None, raw,
                                     len(raw), ctypes.byref(p), c_callback, None,
                                     ctypes.byref(res))
        if failure:
            raise failure[0]
        if status != E_CANCELLED:
            _check(status)
        return GenerateResult("".join(pieces), tokens, res)


TOOL_CHOICES = {"auto": 0, "required": 1, "none": 2}


class Chat(_Handle):
    """One tool-calling conversation (needle.h needle_chat; spec tool-calling.md).

    `tools`: a list of JSON-schema dicts (sent as json.dumps) or a JSON string; `system`: system
    facts; `tool_choice`: "auto", "required" or "none". complete() returns the envelope as a
    dict with the keys in the documented order. Use from one thread at a time."""

    _free = "needle_chat_free"
    buffer_size = 1 << 20  # bytes for one envelope

    def __init__(self, model, tools="[]", system="", tool_choice="auto"):
        super().__init__(None)
        if tool_choice not in TOOL_CHOICES:
            raise ValueError("tool_choice must be one of %s" % sorted(TOOL_CHOICES))
        p = _ChatParams(struct_size=ctypes.sizeof(_ChatParams))  # init writes only struct_size bytes
        lib.needle_chat_params_init(ctypes.byref(p))
        p.tool_choice = TOOL_CHOICES[tool_choice]
        if not isinstance(tools, (str, list, tuple)):
            raise TypeError("tools must be a list of tool schemas or a JSON string, not %s"
                            % type(tools).__name__)
        tools_json = tools if isinstance(tools, str) else json.dumps(tools)
        out = ctypes.c_void_p()
        _check(lib.needle_chat_create(model._handle, _utf8(system or "", "system", True),
                                      _utf8(tools_json, "tools", True), ctypes.byref(p),
                                      ctypes.byref(out)))
        self._ptr = out.value
        self._model = model  # the library keeps the model alive; this keeps the Python object too

    def _text(self, fn, *args):
        n = _size()
        status = fn(self._handle, *args, None, 0, ctypes.byref(n))
        if status != E_BUFFER_TOO_SMALL:
            _check(status)
        buf = ctypes.create_string_buffer(n.value + 1)
        _check(fn(self._handle, *args, buf, len(buf), ctypes.byref(n)))
        return buf.raw[:n.value].decode("utf-8")

    def render(self, text):
        """The exact prompt text the next complete(text) would feed (no BOS)."""
        return self._text(lib.needle_chat_render, _utf8(text, "text", True))

    @property
    def tools_json(self):
        """The canonical tools JSON placed between <tools> and </tools>."""
        return self._text(lib.needle_chat_tools_json)

    def complete(self, text, max_new_tokens=256):
        """One turn; returns the envelope dict (success False for a failed turn).

        After a turn that returned calls, the next `text` is read as those calls' results
        (rendered in <tool_result>, tool-calling.md §10); after a turn without calls it is a new
        query. Call reset() to ask an unrelated question after a call."""
        raw = _utf8(text, "text", True)
        max_new_tokens = _int(max_new_tokens, "max_new_tokens", (1, _U32[1]))
        buf = ctypes.create_string_buffer(self.buffer_size)
        n = _size()
        # A too-small buffer raises (the turn ran; it is not re-run): raise buffer_size instead.
        _check(lib.needle_chat_complete(self._handle, raw, max_new_tokens, buf, len(buf), ctypes.byref(n)))
        return json.loads(buf.raw[:n.value].decode("utf-8"), object_pairs_hook=dict)

    def reset(self):
        """Rewinds to the cached tools prefix; tools and system stay."""
        lib.needle_chat_reset(self._handle)


lib = _open_library()
check_abi(lib)
