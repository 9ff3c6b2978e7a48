// Package needle binds libneedle, the Needle inference engine, through cgo.
//
//	m, err := needle.Load("model.cact")
//	s, err := m.NewState()
//	res, err := s.Generate("Hello", needle.DefaultGenerateParams(), nil, func(id uint32, text string) bool { fmt.Print(text); return false })
//
// Model is safe for concurrent use; State and Batch are used by one goroutine at a time.
// Every handle has an explicit Close (idempotent) and a finalizer as a safety net. Handles may be
// closed in any order: the C library keeps a model alive while its states and batches exist.
//
// The ABI check (needle_check_abi, at package initialisation) is the first call the package makes
// into the library; Load returns its error. The dynamic loader binds the other symbols of the
// linked library, so none is called before the ABI is known.
//
// Failures are *Error values with the Status and the library's message. The message is copied
// inside the same cgo call that failed (see wrap.c), because needle_last_error is per OS thread.
//
// Building: the #cgo directives point at ../../include and ../../build (with an rpath). For
// another library location set CGO_CFLAGS=-I<prefix>/include and
// CGO_LDFLAGS="-L<libdir> -Wl,-rpath,<libdir>" (or LD_LIBRARY_PATH=<libdir> at run time).
package needle

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#cgo LDFLAGS: -L${SRCDIR}/../../build -Wl,-rpath,${SRCDIR}/../../build -lneedle
#include <stdlib.h>
#include "wrap.h"
*/
import "C"

import (
	"fmt"
	"math"
	"runtime"
	"unsafe"
)

// ABIVersion is the NEEDLE_ABI_VERSION these bindings were written against.
const ABIVersion = 1

// Status is a needle_status code.
type Status int32

// Status codes of needle.h.
const (
	OK                 Status = 0
	ErrInvalidArgument Status = 1
	ErrIO              Status = 2
	ErrFormat          Status = 3
	ErrUnsupported     Status = 4
	ErrNoMemory        Status = 5
	ErrContextFull     Status = 6
	ErrBufferTooSmall  Status = 7
	ErrCancelled       Status = 8
	ErrInternal        Status = 9
)

// String is the library's short description of the code.
func (s Status) String() string { return C.GoString(C.needle_status_string(C.needle_status(s))) }

// StopReason tells why Generate stopped (NEEDLE_STOP_*).
type StopReason uint32

const (
	StopNone        StopReason = 0
	StopEOS         StopReason = 1
	StopMaxTokens   StopReason = 2
	StopContextFull StopReason = 3
	StopCallback    StopReason = 4 // the callback returned true
)

// NoToken is the id passed to a Generate callback for the final U+FFFD flush.
const NoToken = 0xFFFFFFFF

// Error is a failed libneedle call.
type Error struct {
	Status  Status
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("needle: %s (status %d): %s", e.Status, int32(e.Status), e.Message)
}

// errBuf receives the message of a failing call (the library keeps at most 1023 bytes).
type errBuf [1024]byte

func (b *errBuf) ptr() *C.char   { return (*C.char)(unsafe.Pointer(&b[0])) }
func (b *errBuf) size() C.size_t { return C.size_t(len(b)) }

// check turns a status into an error carrying the message copied into b.
func (b *errBuf) check(st C.needle_status) error {
	if st == 0 {
		return nil
	}
	return &Error{Status: Status(st), Message: C.GoString(b.ptr())}
}

func closedError(what string) error {
	return &Error{Status: ErrInvalidArgument, Message: what + " is closed"}
}

// Version is the library version, e.g. "0.1.0".
func Version() string { return C.GoString(C.needle_version_string()) }

// LibraryABIVersion is the ABI version the loaded library implements.
func LibraryABIVersion() uint32 { return uint32(C.needle_abi_version()) }

// CheckABI returns an *Error with ErrUnsupported unless the library implements ABI `expected`.
func CheckABI(expected uint32) error {
	var eb errBuf
	return eb.check(C.ngo_check_abi(C.uint32_t(expected), eb.ptr(), eb.size()))
}

// abiErr is the result of the load-time ABI check; every Load returns it when set.
var abiErr = CheckABI(ABIVersion)

// ---------------------------------------------------------------- model

// LoadOptions are the load parameters; the zero value gives the defaults.
type LoadOptions struct {
	NoMmap   bool // read the file into memory instead of mapping it
	NThreads int  // worker threads for the model's kernels; 0 = all cores
	// Depth is the Needle 3 depth-ladder rung: 0 = all layers, 2..NumLayers = that many layers;
	// anything else is ErrInvalidArgument (Needle 2 accepts only 0).
	Depth uint32
}

// nThreads is o.NThreads as needle_model_params.n_threads (int32_t). A count outside int32 is an
// ErrInvalidArgument here: the C conversion would wrap it silently (1<<32 + 1 became 1). A negative
// count is left to the library, which refuses it.
func (o LoadOptions) nThreads() (C.int32_t, error) {
	if int64(o.NThreads) < math.MinInt32 || int64(o.NThreads) > math.MaxInt32 {
		return 0, &Error{Status: ErrInvalidArgument, Message: fmt.Sprintf("n_threads %d does not fit in int32", o.NThreads)}
	}
	return C.int32_t(o.NThreads), nil
}

// ModelInfo is the geometry and special ids of a model.
type ModelInfo struct {
	FormatVersion, VocabSize, DModel, NumLayers, NumHeads, NumKVHeads uint32
	HeadDim, VHeadDim, MaxSeqLen, KVWindow, MHCLanes, NumEngramSites  uint32
	BOSID, EOSID, PadID, UnkID                                        uint32
	HasTokenizer                                                      bool
	WeightBytes, FileBytes                                            uint64
	// Needle 3 (issue 8): OutVocab is the logits rows (every logits buffer holds that many
	// floats; Needle 2: VocabSize); bit l of GlobalLayerMask: layer l (as run) attends globally.
	OutVocab                              uint32
	GlobalLayerMask                       uint64
	QKVConvTaps                           uint32
	HasConfidenceHead, HasContrastiveHead bool
	NThreads                              uint32 // worker threads the states run with (clamped)
}

// Model is a loaded .cact container, immutable and safe for concurrent use.
type Model struct {
	ptr  *C.needle_model
	info ModelInfo
}

// Load loads a container file with default options.
func Load(path string) (*Model, error) { return LoadWithOptions(path, LoadOptions{}) }

// LoadWithOptions loads a container file.
func LoadWithOptions(path string, o LoadOptions) (*Model, error) {
	if abiErr != nil {
		return nil, abiErr
	}
	nThreads, err := o.nThreads()
	if err != nil {
		return nil, err
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	mmap := C.int32_t(1)
	if o.NoMmap {
		mmap = 0
	}
	var eb errBuf
	var out *C.needle_model
	var info C.needle_model_info
	st := C.ngo_model_load_file(cpath, mmap, nThreads, C.uint32_t(o.Depth), &out, &info, eb.ptr(), eb.size())
	return newModel(out, &info, eb.check(st))
}

// LoadMemory loads a container from bytes (which the library copies).
func LoadMemory(data []byte, o LoadOptions) (*Model, error) {
	if abiErr != nil {
		return nil, abiErr
	}
	nThreads, err := o.nThreads()
	if err != nil {
		return nil, err
	}
	var p unsafe.Pointer
	if len(data) > 0 {
		p = unsafe.Pointer(&data[0])
	}
	var eb errBuf
	var out *C.needle_model
	var info C.needle_model_info
	st := C.ngo_model_load_memory(p, C.size_t(len(data)), nThreads, C.uint32_t(o.Depth), &out, &info,
		eb.ptr(), eb.size())
	return newModel(out, &info, eb.check(st))
}

// LoadBuiltin loads the demo model compiled into libneedle (needle_model_load_builtin; model card
// models/README.md): a small Needle 2 trained to call the tools of BuiltinTools. Options as for
// LoadMemory (NoMmap is ignored; Depth must be 0 for this Needle 2 model). The caller owns the
// returned Model (Close it; a finalizer is the safety net). Errors are *Error: ErrUnsupported when
// the library was built without the demo model (BuiltinTools then reports ok == false),
// ErrInvalidArgument for bad options, ErrNoMemory; or the load-time ABI check's error.
func LoadBuiltin(o LoadOptions) (*Model, error) {
	if abiErr != nil {
		return nil, abiErr
	}
	nThreads, err := o.nThreads()
	if err != nil {
		return nil, err
	}
	var eb errBuf
	var out *C.needle_model
	var info C.needle_model_info
	st := C.ngo_model_load_builtin(nThreads, C.uint32_t(o.Depth), &out, &info, eb.ptr(), eb.size())
	return newModel(out, &info, eb.check(st))
}

// BuiltinTools returns the JSON array of tool schemas the built-in model (LoadBuiltin) was trained
// for (needle_builtin_tools_json, models/needle-demo.tools.json), ready for Model.NewChat; a Go copy
// of the library's static text. ok is false, and tools "", when the library was built without its
// demo model or failed the load-time ABI check: exactly when LoadBuiltin fails with ErrUnsupported.
func BuiltinTools() (tools string, ok bool) {
	if abiErr != nil {
		return "", false
	}
	p := C.needle_builtin_tools_json()
	if p == nil {
		return "", false
	}
	return C.GoString(p), true
}

func newModel(ptr *C.needle_model, i *C.needle_model_info, err error) (*Model, error) {
	if err != nil {
		return nil, err
	}
	m := &Model{ptr: ptr, info: ModelInfo{
		FormatVersion: uint32(i.format_version), VocabSize: uint32(i.vocab_size),
		DModel: uint32(i.d_model), NumLayers: uint32(i.num_layers), NumHeads: uint32(i.num_heads),
		NumKVHeads: uint32(i.num_kv_heads), HeadDim: uint32(i.head_dim),
		VHeadDim: uint32(i.v_head_dim), MaxSeqLen: uint32(i.max_seq_len),
		KVWindow: uint32(i.kv_window), MHCLanes: uint32(i.mhc_lanes),
		NumEngramSites: uint32(i.num_engram_sites), BOSID: uint32(i.bos_id),
		EOSID: uint32(i.eos_id), PadID: uint32(i.pad_id), UnkID: uint32(i.unk_id),
		HasTokenizer: i.has_tokenizer != 0, WeightBytes: uint64(i.weight_bytes),
		FileBytes: uint64(i.file_bytes), OutVocab: uint32(i.out_vocab),
		GlobalLayerMask: uint64(i.global_layer_mask), QKVConvTaps: uint32(i.qkv_conv_taps),
		HasConfidenceHead: i.has_confidence_head != 0, HasContrastiveHead: i.has_contrastive_head != 0,
		NThreads: uint32(i.n_threads),
	}}
	runtime.SetFinalizer(m, (*Model).Close)
	return m, nil
}

// Info is the model's geometry and ids.
func (m *Model) Info() ModelInfo { return m.info }

// Close releases the model. States and batches made from it stay usable. Idempotent.
func (m *Model) Close() error {
	if m.ptr != nil {
		C.needle_model_free(m.ptr)
		m.ptr = nil
		runtime.SetFinalizer(m, nil)
	}
	return nil
}

// Tokenize encodes text with the model's tokenizer.
func (m *Model) Tokenize(text string, addBOS bool) ([]uint32, error) {
	if m.ptr == nil {
		return nil, closedError("model")
	}
	b := []byte(text)
	var tp *C.char
	if len(b) > 0 {
		tp = (*C.char)(unsafe.Pointer(&b[0]))
	}
	bos := C.int(0)
	if addBOS {
		bos = 1
	}
	ids := make([]uint32, len(b)+8) // a first guess; the library reports the exact need
	for {
		var n C.size_t
		var eb errBuf
		st := C.ngo_tokenize(m.ptr, tp, C.size_t(len(b)), bos, (*C.uint32_t)(&ids[0]),
			C.size_t(len(ids)), &n, eb.ptr(), eb.size())
		runtime.KeepAlive(m)
		if Status(st) == ErrBufferTooSmall && int(n) > len(ids) {
			ids = make([]uint32, int(n))
			continue
		}
		if err := eb.check(st); err != nil {
			return nil, err
		}
		return ids[:int(n)], nil
	}
}

// Detokenize decodes ids to text.
func (m *Model) Detokenize(ids []uint32) (string, error) {
	if m.ptr == nil {
		return "", closedError("model")
	}
	var ip *C.uint32_t
	if len(ids) > 0 {
		ip = (*C.uint32_t)(&ids[0])
	}
	var n C.size_t
	var eb errBuf
	st := C.ngo_detokenize(m.ptr, ip, C.size_t(len(ids)), nil, 0, &n, eb.ptr(), eb.size())
	if Status(st) != ErrBufferTooSmall {
		if err := eb.check(st); err != nil {
			return "", err
		}
	}
	buf := make([]byte, int(n)+1)
	st = C.ngo_detokenize(m.ptr, ip, C.size_t(len(ids)), (*C.char)(unsafe.Pointer(&buf[0])),
		C.size_t(len(buf)), &n, eb.ptr(), eb.size())
	runtime.KeepAlive(m)
	if err := eb.check(st); err != nil {
		return "", err
	}
	return string(buf[:int(n)]), nil
}

// NewState creates an empty sequence with the model's attention window.
func (m *Model) NewState() (*State, error) { return m.NewStateWindow(-1) }

// NewStateWindow creates an empty sequence: kvWindow -1 = the model's window, 0 = full causal
// attention, > 0 = this window in tokens.
func (m *Model) NewStateWindow(kvWindow int32) (*State, error) {
	return m.NewStateOptions(kvWindow, false)
}

// NewStateOptions creates an empty sequence with a window (as NewStateWindow) and, if int8KV, an
// int8 KV cache (about 3.8x smaller at head_dim 64; logits not bit-faithful: needle.h needle_kv_type).
func (m *Model) NewStateOptions(kvWindow int32, int8KV bool) (*State, error) {
	return m.NewStateMaxTokens(kvWindow, int8KV, 0)
}

// NewStateMaxTokens is NewStateOptions holding at most maxTokens positions (0 = MaxSeqLen): the
// KV memory is sized for them at creation and feeding past them is ErrContextFull.
func (m *Model) NewStateMaxTokens(kvWindow int32, int8KV bool, maxTokens uint32) (*State, error) {
	if m.ptr == nil {
		return nil, closedError("model")
	}
	kvType := C.int32_t(C.NEEDLE_KV_F32)
	if int8KV {
		kvType = C.int32_t(C.NEEDLE_KV_INT8)
	}
	var eb errBuf
	var out *C.needle_state
	st := C.ngo_state_create(m.ptr, C.int32_t(kvWindow), kvType, C.uint32_t(maxTokens), &out, eb.ptr(), eb.size())
	runtime.KeepAlive(m)
	if err := eb.check(st); err != nil {
		return nil, err
	}
	// needle.h has no state -> model accessor: remember the logits size (OutVocab) here.
	s := &State{ptr: out, vocabSize: m.info.OutVocab}
	runtime.SetFinalizer(s, (*State).Close)
	return s, nil
}

// NewBatch creates prefill scratch for chunks of up to capacity positions.
func (m *Model) NewBatch(capacity uint32) (*Batch, error) {
	if m.ptr == nil {
		return nil, closedError("model")
	}
	var eb errBuf
	var out *C.needle_batch
	st := C.ngo_batch_create(m.ptr, C.uint32_t(capacity), &out, eb.ptr(), eb.size())
	runtime.KeepAlive(m)
	if err := eb.check(st); err != nil {
		return nil, err
	}
	b := &Batch{ptr: out}
	runtime.SetFinalizer(b, (*Batch).Close)
	return b, nil
}

// ---------------------------------------------------------------- batch

// Batch is prefill scratch; it serves any state of its model, one goroutine at a time.
type Batch struct{ ptr *C.needle_batch }

// Close frees the batch. Idempotent.
func (b *Batch) Close() error {
	if b.ptr != nil {
		C.needle_batch_free(b.ptr)
		b.ptr = nil
		runtime.SetFinalizer(b, nil)
	}
	return nil
}

func (b *Batch) raw() *C.needle_batch {
	if b == nil {
		return nil
	}
	return b.ptr
}

// ---------------------------------------------------------------- state

// State is one sequence (position, history, caches). Not safe for concurrent use.
type State struct {
	ptr       *C.needle_state
	vocabSize uint32
}

// Close frees the state. Idempotent.
func (s *State) Close() error {
	if s.ptr != nil {
		C.needle_state_free(s.ptr)
		s.ptr = nil
		runtime.SetFinalizer(s, nil)
	}
	return nil
}

// VocabSize is the length a logits buffer needs.
func (s *State) VocabSize() int { return int(s.vocabSize) }

// Pos is the number of tokens fed so far.
func (s *State) Pos() uint32 {
	p := uint32(C.needle_state_pos(s.ptr))
	runtime.KeepAlive(s)
	return p
}

// Reset rewinds the sequence to position 0.
func (s *State) Reset() {
	C.needle_state_reset(s.ptr)
	runtime.KeepAlive(s)
}

func floats(buf []float32) (*C.float, C.size_t) {
	if len(buf) == 0 {
		return nil, 0
	}
	return (*C.float)(&buf[0]), C.size_t(len(buf))
}

// Decode feeds one token; logits (nil = skip the LM head) receives the next-token logits and
// must hold at least VocabSize floats.
func (s *State) Decode(token uint32, logits []float32) error {
	if s.ptr == nil {
		return closedError("state")
	}
	lp, ln := floats(logits)
	var eb errBuf
	st := C.ngo_decode(s.ptr, C.uint32_t(token), lp, ln, eb.ptr(), eb.size())
	runtime.KeepAlive(s)
	return eb.check(st)
}

// DecodeLogits feeds one token and returns the next-token logits.
func (s *State) DecodeLogits(token uint32) ([]float32, error) {
	logits := make([]float32, s.vocabSize)
	if err := s.Decode(token, logits); err != nil {
		return nil, err
	}
	return logits, nil
}

// DecodeMany runs one decode step of several states of one model together (needle.h
// needle_decode_many): states[i] is fed tokens[i], every weight group is decoded once for all of
// them, and each state gets the bits its own Decode would give. logits is nil (skip the LM head)
// or holds one slice per state, each of at least VocabSize floats. At most batch's capacity
// states, each listed once. Validated up front: an error changes no state.
func DecodeMany(states []*State, tokens []uint32, logits [][]float32, batch *Batch) error {
	if len(tokens) != len(states) || (logits != nil && len(logits) != len(states)) {
		return &Error{Status: ErrInvalidArgument, Message: fmt.Sprintf(
			"DecodeMany: %d states, %d tokens and %d logits slices (give one token each, and no or one slice each)",
			len(states), len(tokens), len(logits))}
	}
	if len(states) == 0 || batch == nil || batch.ptr == nil {
		return &Error{Status: ErrInvalidArgument, Message: "DecodeMany: no states, or a nil or closed batch"}
	}
	handles := make([]*C.needle_state, len(states))
	for i, s := range states {
		if s == nil || s.ptr == nil {
			return closedError("state")
		}
		handles[i] = s.ptr
	}
	// One flat buffer of the shortest slice's length, copied out after the call.
	var flat []float32
	width := 0
	if logits != nil {
		width = len(logits[0])
		for _, l := range logits {
			if len(l) < width {
				width = len(l)
			}
		}
		flat = make([]float32, width*len(states))
	}
	fp, _ := floats(flat)
	var eb errBuf
	st := C.ngo_decode_many(&handles[0], (*C.uint32_t)(&tokens[0]), C.size_t(len(states)), fp, C.size_t(width),
		batch.ptr, eb.ptr(), eb.size())
	runtime.KeepAlive(states)
	runtime.KeepAlive(batch)
	if err := eb.check(st); err != nil {
		return err
	}
	for i, l := range logits {
		copy(l, flat[i*width:(i+1)*width])
	}
	return nil
}

// Prefill feeds tokens, in chunks through batch when not nil; logits (nil = skip) receives the
// last position's logits.
func (s *State) Prefill(tokens []uint32, batch *Batch, logits []float32) error {
	if s.ptr == nil {
		return closedError("state")
	}
	var tp *C.uint32_t
	if len(tokens) > 0 {
		tp = (*C.uint32_t)(&tokens[0])
	}
	lp, ln := floats(logits)
	var eb errBuf
	st := C.ngo_prefill(s.ptr, batch.raw(), tp, C.size_t(len(tokens)), lp, ln, eb.ptr(), eb.size())
	runtime.KeepAlive(s)
	runtime.KeepAlive(batch)
	return eb.check(st)
}

// Confidence is σ(confidence head) over every token fed so far (needle_state_confidence);
// ErrUnsupported for a model without the head.
func (s *State) Confidence() (float32, error) {
	if s.ptr == nil {
		return 0, closedError("state")
	}
	var p C.float
	var eb errBuf
	st := C.ngo_state_confidence(s.ptr, &p, eb.ptr(), eb.size())
	runtime.KeepAlive(s)
	return float32(p), eb.check(st)
}

// Embedding is the unit contrastive embedding of every token fed so far; the similarity of two
// is their dot product. ErrUnsupported for a model without the head.
func (s *State) Embedding() ([]float32, error) {
	if s.ptr == nil {
		return nil, closedError("state")
	}
	var dim C.size_t
	var eb errBuf
	st := C.ngo_state_embedding(s.ptr, nil, 0, &dim, eb.ptr(), eb.size())
	if Status(st) != ErrBufferTooSmall {
		runtime.KeepAlive(s)
		return nil, eb.check(st)
	}
	out := make([]float32, int(dim))
	st = C.ngo_state_embedding(s.ptr, (*C.float)(&out[0]), dim, &dim, eb.ptr(), eb.size())
	runtime.KeepAlive(s)
	if err := eb.check(st); err != nil {
		return nil, err
	}
	return out, nil
}

// CopyFrom makes s continue exactly as src (same model and options).
func (s *State) CopyFrom(src *State) error {
	if s.ptr == nil || src.ptr == nil {
		return closedError("state")
	}
	var eb errBuf
	st := C.ngo_state_copy(s.ptr, src.ptr, eb.ptr(), eb.size())
	runtime.KeepAlive(s)
	runtime.KeepAlive(src)
	return eb.check(st)
}

// Save returns the state as a versioned, checksummed blob tied to the model file.
func (s *State) Save() ([]byte, error) {
	if s.ptr == nil {
		return nil, closedError("state")
	}
	var n C.size_t
	var eb errBuf
	st := C.ngo_state_save(s.ptr, nil, 0, &n, eb.ptr(), eb.size())
	if Status(st) != ErrBufferTooSmall {
		runtime.KeepAlive(s)
		return nil, eb.check(st)
	}
	buf := make([]byte, int(n))
	st = C.ngo_state_save(s.ptr, unsafe.Pointer(&buf[0]), n, &n, eb.ptr(), eb.size())
	runtime.KeepAlive(s)
	if err := eb.check(st); err != nil {
		return nil, err
	}
	return buf[:int(n)], nil
}

// Load restores a Save of the same model file and options; ErrFormat (state unchanged)
// otherwise.
func (s *State) Load(blob []byte) error {
	if s.ptr == nil {
		return closedError("state")
	}
	var p unsafe.Pointer
	if len(blob) > 0 {
		p = unsafe.Pointer(&blob[0])
	}
	var eb errBuf
	st := C.ngo_state_load(s.ptr, p, C.size_t(len(blob)), eb.ptr(), eb.size())
	runtime.KeepAlive(s)
	runtime.KeepAlive(blob)
	return eb.check(st)
}

// GenerateParams are the generation options; start from DefaultGenerateParams().
type GenerateParams struct {
	MaxTokens   uint32  // generated-token budget
	Temperature float32 // 0 = greedy; > 0 samples
	TopK        int32   // 0 = all tokens
	TopP        float32 // 1 = all tokens
	Seed        uint64  // sampling is deterministic for a seed
	AddBOS      bool    // prepend BOS when the state is at position 0
}

// DefaultGenerateParams are the library's defaults (128 tokens, greedy, BOS).
func DefaultGenerateParams() GenerateParams {
	var p C.needle_generate_params
	p.struct_size = C.uint32_t(unsafe.Sizeof(p)) // init writes only struct_size bytes
	C.needle_generate_params_init(&p)
	return GenerateParams{MaxTokens: uint32(p.max_tokens), Temperature: float32(p.temperature),
		TopK: int32(p.top_k), TopP: float32(p.top_p), Seed: uint64(p.seed), AddBOS: p.add_bos != 0}
}

// GenerateResult holds the figures of one Generate call.
type GenerateResult struct {
	PromptTokens, GeneratedTokens uint32
	StopReason                    StopReason
	PrefillMs, DecodeMs           float64
}

// Generate feeds prompt (no chat template) and generates. callback (may be nil) gets each token
// id and the text it completes (NoToken for a final U+FFFD flush); returning true stops, which
// is not an error (StopCallback). A panic in the callback stops generation and is re-raised
// here once the C call has returned.
func (s *State) Generate(prompt string, p GenerateParams, batch *Batch,
	callback func(token uint32, text string) bool) (GenerateResult, error) {
	if s.ptr == nil {
		return GenerateResult{}, closedError("state")
	}
	var cp C.needle_generate_params
	cp.struct_size = C.uint32_t(unsafe.Sizeof(cp)) // init writes only struct_size bytes
	C.needle_generate_params_init(&cp)
	cp.max_tokens = C.uint32_t(p.MaxTokens)
	cp.temperature = C.float(p.Temperature)
	cp.top_k = C.int32_t(p.TopK)
	cp.top_p = C.float(p.TopP)
	cp.seed = C.uint64_t(p.Seed)
	cp.add_bos = 0
	if p.AddBOS {
		cp.add_bos = 1
	}
	b := []byte(prompt)
	var pp *C.char
	if len(b) > 0 {
		pp = (*C.char)(unsafe.Pointer(&b[0]))
	}
	var handle uintptr
	var ctx *callbackContext
	if callback != nil {
		ctx = &callbackContext{fn: callback}
		handle = register(ctx)
		defer unregister(handle)
	}
	var r C.needle_generate_result
	r.struct_size = C.uint32_t(unsafe.Sizeof(r))
	var eb errBuf
	st := C.ngo_generate(s.ptr, batch.raw(), pp, C.size_t(len(b)), &cp, C.uintptr_t(handle), &r,
		eb.ptr(), eb.size())
	runtime.KeepAlive(s)
	runtime.KeepAlive(batch)
	if ctx != nil && ctx.panicked {
		panic(ctx.panicValue)
	}
	res := GenerateResult{PromptTokens: uint32(r.prompt_tokens),
		GeneratedTokens: uint32(r.generated_tokens), StopReason: StopReason(r.stop_reason),
		PrefillMs: float64(r.prefill_ms), DecodeMs: float64(r.decode_ms)}
	if Status(st) == ErrCancelled {
		return res, nil
	}
	return res, eb.check(st)
}
