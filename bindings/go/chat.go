package needle

/*
#include <stdlib.h>
#include "wrap.h"
*/
import "C"

import (
	"encoding/json"
	"runtime"
	"unsafe"
)

// ---------------------------------------------------------------- tool-calling chat (issue 9)

// ToolChoice is needle_chat_params.tool_choice.
type ToolChoice int32

const (
	ToolChoiceAuto     ToolChoice = 0 // the model decides
	ToolChoiceRequired ToolChoice = 1 // the turn starts with <tool_call>
	ToolChoiceNone     ToolChoice = 2 // no call; type "respond"
)

// ChatParams mirrors needle_chat_params field by field (struct_size is set by the package).
// DefaultChatParams gives the library's defaults.
type ChatParams struct {
	ToolChoice      ToolChoice
	KVType          int32 // needle_kv_type: 0 f32, 1 int8
	Grammar         bool  // constrained decoding inside <tool_call> (§6)
	RequireRequired bool  // an arguments object closes only once every "required" key appeared
	StopNeedsCall   bool  // EOS and <|im_end|> are masked until a call list has closed
	Sinks           bool  // the static prefix stays visible as KV sinks (§10.3)
}

// DefaultChatParams returns needle_chat_params_init's values.
func DefaultChatParams() ChatParams {
	var p C.needle_chat_params
	p.struct_size = C.uint32_t(unsafe.Sizeof(p)) // init writes only struct_size bytes
	C.needle_chat_params_init(&p)
	return ChatParams{ToolChoice(p.tool_choice), int32(p.kv_type), p.grammar != 0,
		p.require_required != 0, p.stop_needs_call != 0, p.sinks != 0}
}

func cbool(b bool) C.int32_t {
	if b {
		return 1
	}
	return 0
}

// FunctionCall is one parsed call of an envelope.
type FunctionCall struct {
	Name      string                 `json:"name"`
	Arguments map[string]interface{} `json:"arguments"`
}

// Envelope is the response of one turn (tool-calling.md §7.1), fields in the library's order.
type Envelope struct {
	Type            string         `json:"type"` // "call" or "respond"
	Success         bool           `json:"success"`
	Error           *string        `json:"error"`      // nil or a sentence
	ErrorCode       *string        `json:"error_code"` // nil, "truncated", "context_full", ...
	Reason          *string        `json:"reason"`
	FunctionCalls   []FunctionCall `json:"function_calls"`
	SuppressedCalls []FunctionCall `json:"suppressed_calls"`
	Reasoning       string         `json:"reasoning"`
	Confidence      float64        `json:"confidence"`
	PrefillTPS      float64        `json:"prefill_tps"`
	DecodeTPS       float64        `json:"decode_tps"`
	PeakRAMMB       float64        `json:"peak_ram_mb"`
	Raw             string         `json:"-"` // the envelope JSON as the library wrote it
}

// Chat is one tool-calling conversation (needle.h needle_chat). Not safe for concurrent use;
// the library keeps its model alive.
type Chat struct {
	ptr *C.needle_chat
	buf []byte // envelope buffer, sized once
}

// ChatBufferSize is the bytes reserved for one envelope.
const ChatBufferSize = 1 << 20

// NewChat starts a conversation: system facts, tools as a JSON array of schemas ("" = "[]").
func (m *Model) NewChat(system, toolsJSON string, p ChatParams) (*Chat, error) {
	if m.ptr == nil {
		return nil, closedError("model")
	}
	if toolsJSON == "" {
		toolsJSON = "[]"
	}
	var cp C.needle_chat_params
	cp.struct_size = C.uint32_t(unsafe.Sizeof(cp)) // init writes only struct_size bytes
	C.needle_chat_params_init(&cp)
	cp.tool_choice = C.int32_t(p.ToolChoice)
	cp.kv_type = C.int32_t(p.KVType)
	cp.grammar = cbool(p.Grammar)
	cp.require_required = cbool(p.RequireRequired)
	cp.stop_needs_call = cbool(p.StopNeedsCall)
	cp.sinks = cbool(p.Sinks)
	cs, ct := C.CString(system), C.CString(toolsJSON)
	defer C.free(unsafe.Pointer(cs))
	defer C.free(unsafe.Pointer(ct))
	var eb errBuf
	var out *C.needle_chat
	st := C.ngo_chat_create(m.ptr, cs, ct, &cp, &out, eb.ptr(), eb.size())
	runtime.KeepAlive(m)
	if err := eb.check(st); err != nil {
		return nil, err
	}
	c := &Chat{ptr: out}
	runtime.SetFinalizer(c, (*Chat).Close)
	return c, nil
}

// Close frees the chat. Idempotent.
func (c *Chat) Close() error {
	if c.ptr != nil {
		C.needle_chat_free(c.ptr)
		c.ptr = nil
		runtime.SetFinalizer(c, nil)
	}
	return nil
}

// text runs a render-style call twice: size query, then the write.
func (c *Chat) text(call func(out *C.char, cap C.size_t, n *C.size_t, eb *errBuf) C.needle_status) (string, error) {
	if c.ptr == nil {
		return "", closedError("chat")
	}
	var eb errBuf
	var n C.size_t
	st := call(nil, 0, &n, &eb)
	if Status(st) != ErrBufferTooSmall {
		if err := eb.check(st); err != nil {
			return "", err
		}
	}
	buf := make([]byte, int(n)+1)
	st = call((*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), &n, &eb)
	runtime.KeepAlive(c)
	if err := eb.check(st); err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// Render returns the exact text the next Complete(text) would feed (no BOS).
func (c *Chat) Render(text string) (string, error) {
	ct := C.CString(text)
	defer C.free(unsafe.Pointer(ct))
	return c.text(func(out *C.char, cap C.size_t, n *C.size_t, eb *errBuf) C.needle_status {
		return C.ngo_chat_render(c.ptr, ct, out, cap, n, eb.ptr(), eb.size())
	})
}

// ToolsJSON returns the canonical tools JSON placed between <tools> and </tools> (§3.3).
func (c *Chat) ToolsJSON() (string, error) {
	return c.text(func(out *C.char, cap C.size_t, n *C.size_t, eb *errBuf) C.needle_status {
		return C.ngo_chat_tools_json(c.ptr, out, cap, n, eb.ptr(), eb.size())
	})
}

// Complete runs one turn on text (a query, or tool results as JSON) and returns the parsed
// envelope (Success false for a failed turn, with a nil error).
func (c *Chat) Complete(text string, maxNewTokens uint32) (*Envelope, error) {
	if c.ptr == nil {
		return nil, closedError("chat")
	}
	if c.buf == nil {
		c.buf = make([]byte, ChatBufferSize)
	}
	ct := C.CString(text)
	defer C.free(unsafe.Pointer(ct))
	var eb errBuf
	var n C.size_t
	st := C.ngo_chat_complete(c.ptr, ct, C.uint32_t(maxNewTokens), (*C.char)(unsafe.Pointer(&c.buf[0])),
		C.size_t(len(c.buf)), &n, eb.ptr(), eb.size())
	runtime.KeepAlive(c)
	if err := eb.check(st); err != nil {
		return nil, err
	}
	env := &Envelope{Raw: string(c.buf[:n])}
	if err := json.Unmarshal(c.buf[:n], env); err != nil {
		return nil, err
	}
	return env, nil
}

// Reset rewinds to the cached static prefix; tools and system stay.
func (c *Chat) Reset() {
	if c.ptr != nil {
		C.needle_chat_reset(c.ptr)
		runtime.KeepAlive(c)
	}
}
