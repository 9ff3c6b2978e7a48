package needle

import (
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const bos = 2

// fixtures is $NEEDLE_FIXTURES, else ../shared/fixtures relative to the repository root.
func fixtures() string {
	if d := os.Getenv("NEEDLE_FIXTURES"); d != "" {
		return d
	}
	return filepath.Join("..", "..", "..", "shared", "fixtures")
}

func tiny(t *testing.T) *Model {
	t.Helper()
	m, err := Load(filepath.Join(fixtures(), "v2", "models", "tiny.cact"))
	if err != nil {
		t.Fatalf("load tiny.cact: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func wantStatus(t *testing.T, err error, want Status) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("want *Error with status %d, got %v", want, err)
	}
	if e.Status != want {
		t.Fatalf("status %d, want %d (%s)", e.Status, want, e.Message)
	}
	return e
}

func argmax(xs []float32) int {
	best := 0
	for i, x := range xs {
		if x > xs[best] {
			best = i
		}
	}
	return best
}

func TestLoadFailures(t *testing.T) {
	_, err := Load("/nonexistent/dir/model.cact")
	if e := wantStatus(t, err, ErrIO); !strings.Contains(e.Message, "nonexistent") {
		t.Errorf("message %q", e.Message)
	}
	path := filepath.Join(t.TempDir(), "garbage.cact")
	if err := os.WriteFile(path, []byte(strings.Repeat("not a needle container", 10)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Load(path)
	if e := wantStatus(t, err, ErrFormat); e.Message == "" {
		t.Error("empty message")
	}
	_, err = LoadMemory([]byte("garbage"), LoadOptions{})
	wantStatus(t, err, ErrFormat)
	if strconv.IntSize == 64 {
		big := int64(1)<<32 + 1 // out of int32: refused, not wrapped to 1
		_, err = LoadWithOptions(filepath.Join(fixtures(), "v2", "models", "tiny.cact"), LoadOptions{NThreads: int(big)})
		wantStatus(t, err, ErrInvalidArgument)
		_, err = LoadMemory([]byte("garbage"), LoadOptions{NThreads: 2 - int(big)}) // 1 - 1<<32: wrapped to 1
		wantStatus(t, err, ErrInvalidArgument)
	}
}

func TestABIGuard(t *testing.T) {
	if st := rawCheckABI(999); st != int32(ErrUnsupported) {
		t.Errorf("needle_check_abi(999) = %d, want 4", st)
	}
	if st := rawCheckABI(ABIVersion); st != 0 {
		t.Errorf("needle_check_abi(%d) = %d", ABIVersion, st)
	}
	e := wantStatus(t, CheckABI(999), ErrUnsupported)
	if !strings.Contains(e.Message, "999") {
		t.Errorf("message %q", e.Message)
	}
	if abiErr != nil || LibraryABIVersion() != ABIVersion || Version() == "" {
		t.Errorf("abi %v %d %q", abiErr, LibraryABIVersion(), Version())
	}
}

func TestInfoAndTokenizer(t *testing.T) {
	m := tiny(t)
	if i := m.Info(); i.VocabSize != 1024 || i.DModel != 128 || i.BOSID != bos || !i.HasTokenizer {
		t.Fatalf("info %+v", i)
	}
	text := "The quick brown fox, café ☃"
	ids, err := m.Tokenize(text, true)
	if err != nil || ids[0] != bos {
		t.Fatalf("tokenize: %v %v", ids, err)
	}
	if back, err := m.Detokenize(ids); err != nil || back != text {
		t.Fatalf("detokenize: %q %v", back, err)
	}
}

func TestBOSLogitsMatchReference(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(fixtures(), "v2", "refs", "tiny", "empty.full.f32"))
	if err != nil {
		t.Fatal(err)
	}
	ref := make([]float32, 1024)
	for i := range ref {
		ref[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	m := tiny(t)
	s, err := m.NewState()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	logits, err := s.DecodeLogits(bos)
	if err != nil {
		t.Fatal(err)
	}
	if s.Pos() != 1 || argmax(logits) != argmax(ref) {
		t.Fatalf("pos %d argmax %d want %d", s.Pos(), argmax(logits), argmax(ref))
	}
	for i := range ref {
		if math.Abs(float64(logits[i]-ref[i])) > 1e-4 {
			t.Fatalf("logit %d: %g vs %g", i, logits[i], ref[i])
		}
	}
}

func TestRawFFIEqualsSafeAPI(t *testing.T) {
	m := tiny(t)
	raw, st := rawDecode(m, bos)
	if st != 0 {
		t.Fatalf("raw decode status %d", st)
	}
	s, _ := m.NewState()
	defer s.Close()
	safe, err := s.DecodeLogits(bos)
	if err != nil {
		t.Fatal(err)
	}
	for i := range raw {
		if raw[i] != safe[i] {
			t.Fatalf("logit %d: raw %g safe %g", i, raw[i], safe[i])
		}
	}
}

func TestDecodeManyEqualsDecode(t *testing.T) {
	m := tiny(t)
	var st [4]*State
	for i := range st {
		s, err := m.NewState()
		if err != nil {
			t.Fatal(err)
		}
		st[i] = s
		defer s.Close()
	}
	a, b, c, d := st[0], st[1], st[2], st[3]
	batch, err := m.NewBatch(4)
	if err != nil {
		t.Fatal(err)
	}
	defer batch.Close()
	if err := a.Decode(7, nil); err != nil { // different positions
		t.Fatal(err)
	}
	if err := c.Decode(7, nil); err != nil {
		t.Fatal(err)
	}
	for step := uint32(0); step < 3; step++ {
		la, lb := make([]float32, 1024), make([]float32, 1024)
		if err := DecodeMany([]*State{a, b}, []uint32{30 + step, 40 + step}, [][]float32{la, lb}, batch); err != nil {
			t.Fatal(err)
		}
		wa, _ := c.DecodeLogits(30 + step)
		wb, _ := d.DecodeLogits(40 + step)
		for i := range la {
			if la[i] != wa[i] || lb[i] != wb[i] {
				t.Fatalf("step %d logit %d differs", step, i)
			}
		}
	}
	if a.Pos() != 4 || b.Pos() != 3 {
		t.Fatalf("positions %d %d", a.Pos(), b.Pos())
	}
	// Refused up front: no state moves.
	wantStatus(t, DecodeMany([]*State{a, b}, []uint32{1, 5000}, nil, batch), ErrInvalidArgument)
	wantStatus(t, DecodeMany([]*State{a, a}, []uint32{1, 2}, nil, batch), ErrInvalidArgument)
	wantStatus(t, DecodeMany([]*State{a, b}, []uint32{1}, nil, batch), ErrInvalidArgument)
	wantStatus(t, DecodeMany([]*State{a, b}, []uint32{1, 2}, [][]float32{make([]float32, 10), make([]float32, 1024)}, batch),
		ErrBufferTooSmall)
	if a.Pos() != 4 || b.Pos() != 3 {
		t.Fatalf("positions moved: %d %d", a.Pos(), b.Pos())
	}
}

func TestBatchedPrefillEqualsDecode(t *testing.T) {
	m := tiny(t)
	ids, _ := m.Tokenize("hello there, general", true)
	a, _ := m.NewState()
	b, _ := m.NewState()
	batch, err := m.NewBatch(4)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { a.Close(); b.Close(); batch.Close() }()
	last := make([]float32, 1024)
	for _, id := range ids {
		if err := a.Decode(id, last); err != nil {
			t.Fatal(err)
		}
	}
	chunked := make([]float32, 1024)
	if err := b.Prefill(ids, batch, chunked); err != nil {
		t.Fatal(err)
	}
	for i := range last {
		if last[i] != chunked[i] {
			t.Fatalf("logit %d differs", i)
		}
	}
}

func TestErrors(t *testing.T) {
	m := tiny(t)
	s, _ := m.NewState()
	defer s.Close()
	e := wantStatus(t, s.Decode(5000, nil), ErrInvalidArgument)
	if !strings.Contains(e.Message, "vocab_size") {
		t.Errorf("message %q", e.Message)
	}
	wantStatus(t, s.Decode(bos, make([]float32, 10)), ErrBufferTooSmall)
	long := make([]uint32, m.Info().MaxSeqLen+1)
	wantStatus(t, s.Prefill(long, nil, nil), ErrContextFull)
	if s.Pos() != 0 {
		t.Errorf("pos %d after failures", s.Pos())
	}
}

func generate(t *testing.T, m *Model, p GenerateParams) (string, []uint32, GenerateResult) {
	s, _ := m.NewState()
	defer s.Close()
	var sb strings.Builder
	var ids []uint32
	r, err := s.Generate("Hello", p, nil, func(id uint32, text string) bool {
		sb.WriteString(text)
		if id != NoToken {
			ids = append(ids, id)
		}
		return false
	})
	if err != nil {
		t.Fatal(err)
	}
	return sb.String(), ids, r
}

func TestSeededGenerationIsReproducible(t *testing.T) {
	m := tiny(t)
	p := DefaultGenerateParams()
	p.MaxTokens, p.Temperature, p.Seed = 16, 0.8, 7
	a, ids, r := generate(t, m, p)
	b, _, _ := generate(t, m, p)
	if a != b || r.GeneratedTokens == 0 {
		t.Fatalf("%q vs %q (%d tokens)", a, b, r.GeneratedTokens)
	}
	if back, _ := m.Detokenize(ids); back != a {
		t.Fatalf("detokenize %q vs streamed %q", back, a)
	}
}

func TestCallbackStopAndPanic(t *testing.T) {
	m := tiny(t)
	s, _ := m.NewState()
	defer s.Close()
	n := 0
	r, err := s.Generate("Hello", DefaultGenerateParams(), nil, func(uint32, string) bool { n++; return n == 3 })
	if err != nil || r.StopReason != StopCallback || r.GeneratedTokens != 3 {
		t.Fatalf("%+v %v", r, err)
	}
	func() {
		defer func() {
			if v := recover(); v != "from callback" {
				t.Fatalf("recovered %v", v)
			}
		}()
		s.Generate(" more", DefaultGenerateParams(), nil, func(uint32, string) bool { panic("from callback") })
		t.Fatal("no panic")
	}()
	if err := s.Decode(bos, nil); err != nil {
		t.Fatal(err)
	}
}

// Issue 13: calls on a state from its own Generate callback used to be accepted and changed the
// sequence under generate.
func TestStateBusyInsideItsOwnCallback(t *testing.T) {
	m := tiny(t)
	s, err := m.NewState()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	other, err := m.NewState()
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	var seen []error
	p := DefaultGenerateParams()
	p.MaxTokens = 4
	r, err := s.Generate("Hello", p, nil, func(uint32, string) bool {
		if seen == nil {
			seen = append(seen, s.Decode(5, nil), s.Prefill([]uint32{5}, nil, nil))
			_, gerr := s.Generate("x", DefaultGenerateParams(), nil, nil)
			seen = append(seen, gerr)
			if err := other.Decode(5, nil); err != nil {
				t.Errorf("another state: %v", err)
			}
		}
		return false
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 3 {
		t.Fatalf("%d calls recorded", len(seen))
	}
	for i, e := range seen {
		ne := wantStatus(t, e, ErrInvalidArgument)
		if ne != nil && !strings.Contains(ne.Message, "state is busy in needle_generate") {
			t.Errorf("call %d: %q", i, ne.Message)
		}
	}
	if other.Pos() != 1 || s.Pos() != r.PromptTokens+r.GeneratedTokens {
		t.Errorf("positions: other %d, state %d (want %d)", other.Pos(), s.Pos(), r.PromptTokens+r.GeneratedTokens)
	}
}

func TestCloseInAnyOrder(t *testing.T) {
	m := tiny(t)
	s, _ := m.NewState()
	b, _ := m.NewBatch(8)
	m.Close() // the C library keeps the model alive for s and b
	m.Close()
	p := DefaultGenerateParams()
	p.MaxTokens = 4
	r, err := s.Generate("Hello", p, b, nil)
	if err != nil || r.GeneratedTokens != 4 {
		t.Fatalf("%+v %v", r, err)
	}
	if _, err := s.DecodeLogits(bos); err != nil {
		t.Fatal(err)
	}
	b.Close()
	s.Close()
	wantStatus(t, s.Decode(bos, nil), ErrInvalidArgument)
	_, err = m.Tokenize("x", false)
	wantStatus(t, err, ErrInvalidArgument)
}

func TestConcurrentModelUse(t *testing.T) {
	m := tiny(t)
	done := make(chan []float32)
	for i := 0; i < 4; i++ {
		go func() {
			s, _ := m.NewState()
			defer s.Close()
			l, _ := s.DecodeLogits(bos)
			done <- l
		}()
	}
	first := <-done
	for i := 1; i < 4; i++ {
		if l := <-done; argmax(l) != argmax(first) || l[0] != first[0] {
			t.Fatal("threads disagree")
		}
	}
}

// An int8 KV cache runs and differs from f32 once keys are read back (not bit-faithful), while
// staying close: the first steps' logits within 0.2 of the f32 state's.
func TestInt8KVState(t *testing.T) {
	m := tiny(t)
	f32, err := m.NewStateOptions(-1, false)
	if err != nil {
		t.Fatal(err)
	}
	defer f32.Close()
	i8, err := m.NewStateOptions(-1, true)
	if err != nil {
		t.Fatal(err)
	}
	defer i8.Close()
	differs := false
	for _, tok := range []uint32{bos, 100, 200, 300, 400} {
		a, err := f32.DecodeLogits(tok)
		if err != nil {
			t.Fatal(err)
		}
		b, err := i8.DecodeLogits(tok)
		if err != nil {
			t.Fatal(err)
		}
		for i := range a {
			if math.Abs(float64(a[i]-b[i])) > 0.2 {
				t.Fatalf("token %d logit %d: f32 %g int8 %g", tok, i, a[i], b[i])
			}
			differs = differs || a[i] != b[i]
		}
	}
	if !differs {
		t.Fatal("int8 KV gave the f32 bits: was it applied?")
	}
}

// Probe heads after [BOS] against the tiny fixture (`empty` prompt), and state copy / save / load.
func TestHeadsAndPersistence(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(fixtures(), "v2", "refs", "tiny", "empty.contrastive.f32"))
	if err != nil {
		t.Fatal(err)
	}
	m := tiny(t)
	s, err := m.NewState()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Confidence(); err == nil {
		t.Fatal("confidence before any token: no error")
	}
	if _, err := s.DecodeLogits(bos); err != nil {
		t.Fatal(err)
	}
	p, err := s.Confidence()
	if err != nil {
		t.Fatal(err)
	}
	if logit := math.Log(float64(p)) - math.Log1p(-float64(p)); math.Abs(logit-(-4.647948265075684)) > 1e-3 {
		t.Fatalf("confidence logit %g", logit)
	}
	emb, err := s.Embedding()
	if err != nil {
		t.Fatal(err)
	}
	if len(emb) != len(raw)/4 {
		t.Fatalf("embedding dim %d", len(emb))
	}
	for i := range emb {
		if ref := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])); math.Abs(float64(emb[i]-ref)) > 1e-4 {
			t.Fatalf("embedding %d: %g vs %g", i, emb[i], ref)
		}
	}
	blob, err := s.Save()
	if err != nil {
		t.Fatal(err)
	}
	c, _ := m.NewState()
	defer c.Close()
	l, _ := m.NewState()
	defer l.Close()
	if err := c.CopyFrom(s); err != nil {
		t.Fatal(err)
	}
	if err := l.Load(blob); err != nil {
		t.Fatal(err)
	}
	want, _ := s.DecodeLogits(7)
	for _, st := range []*State{c, l} {
		got, err := st.DecodeLogits(7)
		if err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("continuation differs at logit %d", i)
			}
		}
	}
	blob[len(blob)/2] ^= 1
	wantStatus(t, l.Load(blob), ErrFormat)
	if l.Pos() != 2 {
		t.Fatalf("pos %d after a refused load", l.Pos())
	}
}

// ---------------------------------------------------------------- Needle 3 (issue 8)

// readLE32 reads a little-endian file of 32-bit words.
func readLE32(t *testing.T, path string) []uint32 {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]uint32, len(raw)/4)
	for i := range out {
		out[i] = binary.LittleEndian.Uint32(raw[4*i:])
	}
	return out
}

// TestNeedle3Tiny3: tiny3 (fixtures/v3 manifest case tiny3__chat__f32): info, greedy
// continuation, depth ladder, max_tokens and the confidence head through the binding.
func TestNeedle3Tiny3(t *testing.T) {
	v3 := filepath.Join(fixtures(), "v3")
	path := filepath.Join(v3, "models", "tiny3.cact")
	m, err := Load(path)
	if err != nil {
		t.Fatalf("load tiny3.cact: %v", err)
	}
	defer m.Close()
	if i := m.Info(); i.FormatVersion != 3 || i.OutVocab != 512 || !i.HasConfidenceHead {
		t.Fatalf("info %+v", i)
	}
	prompt := readLE32(t, filepath.Join(v3, "refs", "tiny3__chat__f32.prompt.u32"))
	ref := readLE32(t, filepath.Join(v3, "refs", "tiny3__chat__f32.prefill.f32"))

	// Greedy: the manifest's first two generated ids; the state holds exactly the prompt.
	s, err := m.NewStateMaxTokens(-1, false, uint32(len(prompt)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	logits := make([]float32, s.VocabSize())
	if len(logits) != 512 {
		t.Fatalf("logits size %d", len(logits))
	}
	if err := s.Prefill(prompt, nil, logits); err != nil {
		t.Fatal(err)
	}
	for i, x := range logits {
		if d := math.Abs(float64(x - math.Float32frombits(ref[i]))); d > 2e-4 {
			t.Fatalf("prefill row %d: |d| %g", i, d)
		}
	}
	if a := argmax(logits); a != 35 {
		t.Fatalf("greedy id %d, want 35", a)
	}
	p, err := s.Confidence()
	want := 1 / (1 + math.Exp(-0.47859019))
	if err != nil || p <= 0 || p >= 1 || math.Abs(float64(p)-want) > 1e-4 {
		t.Fatalf("confidence %v (want %v), %v", p, want, err)
	}
	wantStatus(t, s.Decode(35, logits), ErrContextFull)
	if s.Pos() != uint32(len(prompt)) {
		t.Fatalf("pos %d after CONTEXT_FULL", s.Pos())
	}
	s2, err := m.NewState()
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if err := s2.Prefill(prompt, nil, nil); err != nil {
		t.Fatal(err)
	}
	if next, err := s2.DecodeLogits(35); err != nil || argmax(next) != 32 {
		t.Fatalf("second greedy id: %v", err)
	}
	s2.Reset()
	gp := DefaultGenerateParams()
	gp.MaxTokens = 3
	r, err := s2.Generate("Hello", gp, nil, nil)
	if err != nil || r.GeneratedTokens > 3 || r.PromptTokens < 2 ||
		(r.StopReason != StopMaxTokens && r.StopReason != StopEOS) {
		t.Fatalf("generate %+v, %v", r, err)
	}

	d2, err := LoadWithOptions(path, LoadOptions{Depth: 2})
	if err != nil || d2.Info().NumLayers != 2 {
		t.Fatalf("depth 2: %v", err)
	}
	d2.Close()
	_, err = LoadWithOptions(path, LoadOptions{Depth: 1})
	wantStatus(t, err, ErrInvalidArgument)
}
