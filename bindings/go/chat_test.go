package needle

import (
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

const weatherTools = `[{"name":"get_weather","description":"Get the weather for a city.",` +
	`"parameters":{"type":"object","properties":{"city":{"type":"string",` +
	`"enum":["Paris","Oslo"]}},"required":["city"]}}]`

var envelopeKeys = []string{"type", "success", "error", "error_code", "reason", "function_calls",
	"suppressed_calls", "reasoning", "confidence", "prefill_tps", "decode_tps", "peak_ram_mb"}

// keysInOrder lists the top-level keys of a JSON object as they appear.
func keysInOrder(t *testing.T, raw string) []string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("not an object: %q", raw)
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, tok.(string))
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

// completeTurn runs one Complete on c and checks that it succeeded with the envelope's keys in
// the documented order.
func completeTurn(t *testing.T, c *Chat, text string, maxNewTokens uint32) *Envelope {
	t.Helper()
	env, err := c.Complete(text, maxNewTokens)
	if err != nil {
		t.Fatal(err)
	}
	if k := strings.Join(keysInOrder(t, env.Raw), ","); k != strings.Join(envelopeKeys, ",") {
		t.Fatalf("keys %s", k)
	}
	return env
}

func TestChatRender(t *testing.T) {
	m := tiny(t)
	c, err := m.NewChat("date: 2026-07-21", weatherTools, DefaultChatParams())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tools, err := c.ToolsJSON()
	if err != nil || tools != weatherTools {
		t.Fatalf("tools %q %v", tools, err)
	}
	got, err := c.Render("Paris?")
	want := "<|im_start|>system\ndate: 2026-07-21<|im_end|>\n<|im_start|>user\n<tools>" + weatherTools +
		"</tools>\nParis?<|im_end|>\n<|im_start|>assistant\n"
	if err != nil || got != want {
		t.Fatalf("render %q %v", got, err)
	}
}

func TestChatRequiredCallThenReset(t *testing.T) {
	m := tiny(t)
	p := DefaultChatParams()
	p.ToolChoice = ToolChoiceRequired
	c, err := m.NewChat("", weatherTools, p)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	env := completeTurn(t, c, "What's the weather in Paris?", 64)
	if !env.Success || env.Type != "call" || env.ErrorCode != nil || len(env.FunctionCalls) != 1 {
		t.Fatalf("envelope %s", env.Raw)
	}
	call := env.FunctionCalls[0]
	if city, _ := call.Arguments["city"].(string); call.Name != "get_weather" || (city != "Paris" && city != "Oslo") {
		t.Fatalf("call %+v", call)
	}
	c.Reset()
	again, err := c.Complete("What's the weather in Paris?", 64)
	if err != nil || len(again.FunctionCalls) != 1 || again.FunctionCalls[0].Arguments["city"] != call.Arguments["city"] {
		t.Fatalf("after reset %v %v", again, err)
	}
	c.Reset()
	short, err := c.Complete("Paris?", 3)
	if err != nil || short.Success || short.ErrorCode == nil || *short.ErrorCode != "truncated" {
		t.Fatalf("truncated %v %v", short, err)
	}
	_, err = m.NewChat("", `[{"name": 3}]`, p)
	wantStatus(t, err, ErrInvalidArgument)
}

func TestBuiltinModelCallsATool(t *testing.T) {
	tools, ok := BuiltinTools()
	if !ok {
		// Library built with NEEDLE_BUILTIN_MODEL=OFF: the loader must say so.
		_, err := LoadBuiltin(LoadOptions{})
		wantStatus(t, err, ErrUnsupported)
		t.Skip("libneedle built without its demo model")
	}
	var schemas []struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal([]byte(tools), &schemas); err != nil {
		t.Fatalf("builtin tools %q: %v", tools, err)
	}
	var names []string
	for _, s := range schemas {
		names = append(names, s.Name)
	}
	if want := []string{"set_timer", "set_lights", "get_weather", "send_message"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("builtin tool names %q, want %q", names, want)
	}
	_, err := LoadBuiltin(LoadOptions{NThreads: -1})
	wantStatus(t, err, ErrInvalidArgument)
	if strconv.IntSize == 64 {
		big := int64(1)<<32 + 1 // wrapped to 1 thread before LoadOptions.nThreads checked the range
		_, err = LoadBuiltin(LoadOptions{NThreads: int(big)})
		wantStatus(t, err, ErrInvalidArgument)
	}
	m, err := LoadBuiltin(LoadOptions{NThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if i := m.Info(); !i.HasTokenizer || i.FormatVersion != 2 || i.NThreads != 1 {
		t.Fatalf("info %+v", i)
	}
	c, err := m.NewChat("", tools, DefaultChatParams())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	env := completeTurn(t, c, "Set a timer for 5 minutes", 256)
	want := []FunctionCall{{Name: "set_timer", Arguments: map[string]interface{}{"seconds": float64(300)}}}
	if !env.Success || env.Type != "call" || !reflect.DeepEqual(env.FunctionCalls, want) ||
		!strings.Contains(env.Raw, `"function_calls":[{"name":"set_timer","arguments":{"seconds":300}}]`) {
		t.Fatalf("envelope %s", env.Raw)
	}
}
