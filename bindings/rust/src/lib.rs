//! Safe Rust bindings for libneedle, the Needle inference engine.
//!
//! ```no_run
//! let model = needle::Model::load("model.cact")?;
//! let mut state = needle::State::new(&model)?;
//! state.generate("Hello", &needle::GenerateParams::default(), None, |_, text| { print!("{text}"); false })?;
//! # Ok::<(), needle::Error>(())
//! ```
//!
//! * [`Model`] is a loaded container: immutable, `Send + Sync` (share it with `Arc<Model>`).
//! * [`State`] is one sequence: `Send` but not `Sync` (one thread at a time).
//! * [`Batch`] is prefill scratch for any state of the same model: `Send`, not `Sync`.
//!
//! Lifetimes: a `State` or `Batch` does not borrow its `Model`. The C library keeps a model alive
//! while states or batches made from it exist, so the handles may be dropped in any order.
//!
//! Errors are [`Error`] values carrying the [`Status`] and `needle_last_error()` of the failing
//! call, read right after it on the same thread. The raw declarations are in [`sys`].
//!
//! The ABI is checked (`needle_check_abi`) once, before the first model load, and that check is the
//! first call the crate makes into the library; a library built for another ABI makes every load
//! fail with [`Status::Unsupported`]. The crate links libneedle, so the dynamic loader binds every
//! symbol when the program starts: a library lacking one is refused by the loader before any Rust
//! code runs (no call to a missing function can happen).

mod chat;
pub mod sys;
pub use chat::{Chat, ChatParams, ToolChoice, CHAT_BUFFER_SIZE};

use std::any::Any;
use std::ffi::{CStr, CString};
use std::fmt;
use std::os::raw::{c_char, c_int, c_void};
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::ptr::{self, NonNull};
use std::sync::OnceLock;

/// Status codes of needle.h (`NEEDLE_E_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    InvalidArgument,
    Io,
    Format,
    Unsupported,
    NoMemory,
    ContextFull,
    BufferTooSmall,
    Cancelled,
    Internal,
    /// A code this crate does not know.
    Other(i32),
}

impl Status {
    /// Maps a C status (not `NEEDLE_OK`) to a `Status`.
    pub fn from_code(code: i32) -> Status {
        match code {
            sys::NEEDLE_E_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::NEEDLE_E_IO => Status::Io,
            sys::NEEDLE_E_FORMAT => Status::Format,
            sys::NEEDLE_E_UNSUPPORTED => Status::Unsupported,
            sys::NEEDLE_E_NO_MEMORY => Status::NoMemory,
            sys::NEEDLE_E_CONTEXT_FULL => Status::ContextFull,
            sys::NEEDLE_E_BUFFER_TOO_SMALL => Status::BufferTooSmall,
            sys::NEEDLE_E_CANCELLED => Status::Cancelled,
            sys::NEEDLE_E_INTERNAL => Status::Internal,
            other => Status::Other(other),
        }
    }

    /// The C code (`NEEDLE_E_*`).
    pub fn code(self) -> i32 {
        match self {
            Status::InvalidArgument => sys::NEEDLE_E_INVALID_ARGUMENT,
            Status::Io => sys::NEEDLE_E_IO,
            Status::Format => sys::NEEDLE_E_FORMAT,
            Status::Unsupported => sys::NEEDLE_E_UNSUPPORTED,
            Status::NoMemory => sys::NEEDLE_E_NO_MEMORY,
            Status::ContextFull => sys::NEEDLE_E_CONTEXT_FULL,
            Status::BufferTooSmall => sys::NEEDLE_E_BUFFER_TOO_SMALL,
            Status::Cancelled => sys::NEEDLE_E_CANCELLED,
            Status::Internal => sys::NEEDLE_E_INTERNAL,
            Status::Other(c) => c,
        }
    }
}

/// A failed call: its status and the library's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub status: Status,
    pub message: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = unsafe { text(sys::needle_status_string(self.status.code())) };
        write!(f, "{} (status {}): {}", name, self.status.code(), self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// Copies a C string (NULL gives "").
unsafe fn text(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// Turns a status into a `Result`, reading the thread's last error right after the failing call.
fn check(status: sys::needle_status) -> Result<()> {
    if status == sys::NEEDLE_OK {
        Ok(())
    } else {
        Err(Error { status: Status::from_code(status), message: unsafe { text(sys::needle_last_error()) } })
    }
}

fn invalid(message: &str) -> Error {
    Error { status: Status::InvalidArgument, message: message.to_owned() }
}

/// Library version, e.g. "0.1.0".
pub fn version() -> String {
    unsafe { text(sys::needle_version_string()) }
}

/// ABI version the loaded library implements.
pub fn abi_version() -> u32 {
    unsafe { sys::needle_abi_version() }
}

/// The JSON array of tool schemas the built-in model ([`Model::builtin`]) was trained for
/// (`needle_builtin_tools_json`, models/needle-demo.tools.json), ready for [`Chat::new`]; an owned
/// copy of the library's static text. `None` when the library was built without its demo model
/// (CMake option `NEEDLE_BUILTIN_MODEL=OFF`) or implements another ABI ([`check_abi`] runs first,
/// as before a load): exactly when [`Model::builtin`] fails with [`Status::Unsupported`].
pub fn builtin_tools() -> Option<String> {
    check_abi().ok()?;
    let p = unsafe { sys::needle_builtin_tools_json() };
    if p.is_null() {
        None
    } else {
        Some(unsafe { text(p) })
    }
}

/// Checks that the loaded library implements [`sys::NEEDLE_ABI_VERSION`] (done once, before the
/// first load; callable directly).
pub fn check_abi() -> Result<()> {
    static CHECKED: OnceLock<Result<()>> = OnceLock::new();
    CHECKED.get_or_init(|| check(unsafe { sys::needle_check_abi(sys::NEEDLE_ABI_VERSION) })).clone()
}

/// Nullable pointer and length of an output buffer: an empty slice means "no buffer".
fn out_buf(buf: &mut [f32]) -> (*mut f32, usize) {
    if buf.is_empty() {
        (ptr::null_mut(), 0)
    } else {
        (buf.as_mut_ptr(), buf.len())
    }
}

/// One decode step of several states of one model together (needle.h `needle_decode_many`):
/// `states[i]` is fed `tokens[i]`; each weight group is decoded once for all of them, and each
/// state gets the bits its own [`State::decode`] would give. `logits` is empty (skip the LM
/// head) or holds one buffer per state, all of one length (>= out_vocab floats). At most
/// `batch.capacity()` states. Validated up front: an error changes no state.
pub fn decode_many(
    states: &mut [&mut State],
    tokens: &[u32],
    logits: &mut [&mut [f32]],
    batch: &mut Batch,
) -> Result<()> {
    if tokens.len() != states.len() || (!logits.is_empty() && logits.len() != states.len()) {
        return Err(Error {
            status: Status::InvalidArgument,
            message: format!(
                "decode_many: {} states, {} tokens and {} logits buffers (give one token each, and no or one buffer each)",
                states.len(),
                tokens.len(),
                logits.len()
            ),
        });
    }
    let len = logits.first().map_or(0, |l| l.len());
    if logits.iter().any(|l| l.len() != len) {
        return Err(Error {
            status: Status::InvalidArgument,
            message: "decode_many: the logits buffers differ in length".to_string(),
        });
    }
    let handles: Vec<*mut sys::needle_state> = states.iter().map(|s| s.as_ptr()).collect();
    let outs: Vec<*mut f32> = logits.iter_mut().map(|l| l.as_mut_ptr()).collect();
    let out_ptr = if len == 0 { ptr::null() } else { outs.as_ptr() };
    check(unsafe {
        sys::needle_decode_many(handles.as_ptr(), tokens.as_ptr(), handles.len(), out_ptr, len, batch.as_ptr())
    })
}

// ------------------------------------------------------------------ model

/// Load options (`needle_model_params`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    /// Map the file read-only (default) instead of reading it into memory.
    pub use_mmap: bool,
    /// Worker threads for the model's kernels; 0 (default) = all cores.
    pub n_threads: u32,
    /// Needle 3 depth-ladder rung: 0 (default) = all layers, 2..num_layers = that many layers;
    /// anything else is `Status::InvalidArgument` (Needle 2 accepts only 0).
    pub depth: u32,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { use_mmap: true, n_threads: 0, depth: 0 }
    }
}

impl LoadOptions {
    fn raw(&self) -> Result<sys::needle_model_params> {
        // struct_size first: needle_*_params_init writes only the caller's struct_size bytes.
        let mut p = sys::needle_model_params {
            struct_size: std::mem::size_of::<sys::needle_model_params>() as u32,
            ..Default::default()
        };
        unsafe { sys::needle_model_params_init(&mut p) };
        p.use_mmap = self.use_mmap as i32;
        p.depth = self.depth;
        p.n_threads = i32::try_from(self.n_threads).map_err(|_| invalid("n_threads is too large"))?;
        Ok(p)
    }
}

/// Geometry and special ids of a model (`needle_model_info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelInfo {
    pub format_version: u32,
    pub vocab_size: u32,
    pub d_model: u32,
    pub num_layers: u32,
    pub num_heads: u32,
    pub num_kv_heads: u32,
    pub head_dim: u32,
    pub v_head_dim: u32,
    pub max_seq_len: u32,
    pub kv_window: u32,
    pub mhc_lanes: u32,
    pub num_engram_sites: u32,
    pub bos_id: u32,
    pub eos_id: u32,
    pub pad_id: u32,
    pub unk_id: u32,
    pub has_tokenizer: bool,
    pub weight_bytes: u64,
    pub file_bytes: u64,
    /// Logits rows: every logits buffer holds this many floats (Needle 2: vocab_size).
    pub out_vocab: u32,
    /// Bit l set: layer l (as run, after the depth ladder) attends globally; Needle 2: 0.
    pub global_layer_mask: u64,
    /// Taps of the causal Q/K/V conv (Needle 3), 0 = none.
    pub qkv_conv_taps: u32,
    /// `State::confidence` is supported.
    pub has_confidence_head: bool,
    /// `State::embedding` is supported.
    pub has_contrastive_head: bool,
    /// Worker threads the model's states run with (n_threads as clamped).
    pub n_threads: u32,
}

/// A loaded `.cact` container. Immutable and thread-safe.
#[derive(Debug)]
pub struct Model {
    raw: NonNull<sys::needle_model>,
    info: ModelInfo,
}

// The C library documents models as immutable after load and usable from any number of threads.
unsafe impl Send for Model {}
unsafe impl Sync for Model {}

impl Model {
    /// Loads a container file with default options.
    pub fn load(path: impl AsRef<Path>) -> Result<Model> {
        Model::load_with(path, &LoadOptions::default())
    }

    /// Loads a container file.
    pub fn load_with(path: impl AsRef<Path>, options: &LoadOptions) -> Result<Model> {
        use std::os::unix::ffi::OsStrExt;
        check_abi()?;
        let path =
            CString::new(path.as_ref().as_os_str().as_bytes()).map_err(|_| invalid("path contains a NUL byte"))?;
        let params = options.raw()?;
        let mut out = ptr::null_mut();
        check(unsafe { sys::needle_model_load_file(path.as_ptr(), &params, &mut out) })?;
        Model::wrap(out)
    }

    /// Loads a container from memory (the bytes are copied).
    pub fn from_bytes(data: &[u8], options: &LoadOptions) -> Result<Model> {
        check_abi()?;
        let params = options.raw()?;
        let mut out = ptr::null_mut();
        check(unsafe { sys::needle_model_load_memory(data.as_ptr() as *const c_void, data.len(), &params, &mut out) })?;
        Model::wrap(out)
    }

    /// Loads the demo model compiled into libneedle (`needle_model_load_builtin`; model card
    /// models/README.md): a small Needle 2 trained to call the tools of [`builtin_tools`].
    /// `options` as for [`Model::from_bytes`] (`use_mmap` is ignored; `n_threads` is validated the
    /// same way; `depth` must be 0 for this Needle 2 model). The returned `Model` owns its handle
    /// (freed on drop). Errors: [`Status::Unsupported`] when the library was built without the
    /// demo model (then [`builtin_tools`] is `None`), [`Status::InvalidArgument`] for bad options,
    /// [`Status::NoMemory`].
    pub fn builtin(options: &LoadOptions) -> Result<Model> {
        check_abi()?;
        let params = options.raw()?;
        let mut out = ptr::null_mut();
        check(unsafe { sys::needle_model_load_builtin(&params, &mut out) })?;
        Model::wrap(out)
    }

    fn wrap(out: *mut sys::needle_model) -> Result<Model> {
        let raw = NonNull::new(out).ok_or_else(|| invalid("load returned no model"))?;
        let mut i = sys::needle_model_info {
            struct_size: std::mem::size_of::<sys::needle_model_info>() as u32,
            ..Default::default()
        };
        // Wrap first so the handle is freed if get_info fails.
        let mut model = Model { raw, info: ModelInfo::from(&i) };
        check(unsafe { sys::needle_model_get_info(raw.as_ptr(), &mut i) })?;
        model.info = ModelInfo::from(&i);
        Ok(model)
    }

    /// The model's geometry and ids.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// The raw handle (still owned by this `Model`).
    pub fn as_ptr(&self) -> *mut sys::needle_model {
        self.raw.as_ptr()
    }

    /// Encodes text with the model's tokenizer.
    pub fn tokenize(&self, text: &str, add_bos: bool) -> Result<Vec<u32>> {
        let mut ids = vec![0u32; text.len() + 8]; // a first guess; the library reports the need
        loop {
            let mut n = 0usize;
            let st = unsafe {
                sys::needle_model_tokenize(
                    self.raw.as_ptr(),
                    text.as_ptr() as *const c_char,
                    text.len(),
                    add_bos as c_int,
                    ids.as_mut_ptr(),
                    ids.len(),
                    &mut n,
                )
            };
            if st == sys::NEEDLE_E_BUFFER_TOO_SMALL && n > ids.len() {
                ids.resize(n, 0);
                continue;
            }
            check(st)?;
            ids.truncate(n);
            return Ok(ids);
        }
    }

    /// Decodes ids to text.
    pub fn detokenize(&self, tokens: &[u32]) -> Result<String> {
        let mut len = 0usize;
        let st = unsafe {
            sys::needle_model_detokenize(self.raw.as_ptr(), tokens.as_ptr(), tokens.len(), ptr::null_mut(), 0, &mut len)
        };
        if st != sys::NEEDLE_E_BUFFER_TOO_SMALL {
            check(st)?;
        }
        let mut buf = vec![0u8; len + 1];
        check(unsafe {
            sys::needle_model_detokenize(
                self.raw.as_ptr(),
                tokens.as_ptr(),
                tokens.len(),
                buf.as_mut_ptr() as *mut c_char,
                buf.len(),
                &mut len,
            )
        })?;
        buf.truncate(len);
        String::from_utf8(buf)
            .map_err(|_| Error { status: Status::Internal, message: "detokenize gave invalid UTF-8".into() })
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        unsafe { sys::needle_model_free(self.raw.as_ptr()) }
    }
}

impl From<&sys::needle_model_info> for ModelInfo {
    fn from(i: &sys::needle_model_info) -> Self {
        ModelInfo {
            format_version: i.format_version,
            vocab_size: i.vocab_size,
            d_model: i.d_model,
            num_layers: i.num_layers,
            num_heads: i.num_heads,
            num_kv_heads: i.num_kv_heads,
            head_dim: i.head_dim,
            v_head_dim: i.v_head_dim,
            max_seq_len: i.max_seq_len,
            kv_window: i.kv_window,
            mhc_lanes: i.mhc_lanes,
            num_engram_sites: i.num_engram_sites,
            bos_id: i.bos_id,
            eos_id: i.eos_id,
            pad_id: i.pad_id,
            unk_id: i.unk_id,
            has_tokenizer: i.has_tokenizer != 0,
            weight_bytes: i.weight_bytes,
            file_bytes: i.file_bytes,
            out_vocab: i.out_vocab,
            global_layer_mask: i.global_layer_mask,
            qkv_conv_taps: i.qkv_conv_taps,
            has_confidence_head: i.has_confidence_head != 0,
            has_contrastive_head: i.has_contrastive_head != 0,
            n_threads: i.n_threads,
        }
    }
}

// ------------------------------------------------------------------ batch

/// Scratch for chunked prefill of up to `capacity` positions; serves any state of its model.
#[derive(Debug)]
pub struct Batch {
    raw: NonNull<sys::needle_batch>,
    capacity: u32,
}

// A batch may move between threads; `&mut` use keeps it to one thread at a time.
unsafe impl Send for Batch {}

impl Batch {
    /// Creates prefill scratch for `model` (keeps the model alive on the C side).
    pub fn new(model: &Model, capacity: u32) -> Result<Batch> {
        let mut out = ptr::null_mut();
        check(unsafe { sys::needle_batch_create(model.as_ptr(), capacity, &mut out) })?;
        let raw = NonNull::new(out).ok_or_else(|| invalid("batch_create returned no batch"))?;
        Ok(Batch { raw, capacity })
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    pub fn as_ptr(&self) -> *mut sys::needle_batch {
        self.raw.as_ptr()
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        unsafe { sys::needle_batch_free(self.raw.as_ptr()) }
    }
}

// ------------------------------------------------------------------ state and generation

/// Why generation stopped (`NEEDLE_STOP_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    None,
    Eos,
    MaxTokens,
    ContextFull,
    /// The callback returned `true`.
    Callback,
    Other(u32),
}

impl StopReason {
    fn from_code(c: u32) -> StopReason {
        match c {
            sys::NEEDLE_STOP_NONE => StopReason::None,
            sys::NEEDLE_STOP_EOS => StopReason::Eos,
            sys::NEEDLE_STOP_MAX_TOKENS => StopReason::MaxTokens,
            sys::NEEDLE_STOP_CONTEXT_FULL => StopReason::ContextFull,
            sys::NEEDLE_STOP_CALLBACK => StopReason::Callback,
            other => StopReason::Other(other),
        }
    }
}

/// Generation options (`needle_generate_params`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenerateParams {
    /// Generated-token budget (default 128).
    pub max_tokens: u32,
    /// 0 (default) = greedy; > 0 samples softmax(logits / temperature).
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 (default) = all.
    pub top_k: u32,
    /// Nucleus threshold; 1 (default) = all.
    pub top_p: f32,
    /// Sampling is deterministic for a seed (default 0).
    pub seed: u64,
    /// Prepend BOS when the state is at position 0 (default true).
    pub add_bos: bool,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams { max_tokens: 128, temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0, add_bos: true }
    }
}

/// Figures of one generation (`needle_generate_result`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenerateResult {
    pub prompt_tokens: u32,
    pub generated_tokens: u32,
    pub stop_reason: StopReason,
    pub prefill_ms: f64,
    pub decode_ms: f64,
}

/// One sequence: position, history and caches.
#[derive(Debug)]
pub struct State {
    raw: NonNull<sys::needle_state>,
    vocab_size: u32,
}

// A state may move between threads but must be used by one at a time: Send, not Sync.
unsafe impl Send for State {}

/// What the trampoline needs: the user's closure and a caught panic.
struct CallbackContext<'a> {
    callback: &'a mut dyn FnMut(u32, &str) -> bool,
    panic: Option<Box<dyn Any + Send + 'static>>,
}

unsafe extern "C" fn trampoline(token: u32, text: *const c_char, len: usize, user: *mut c_void) -> c_int {
    let ctx = &mut *(user as *mut CallbackContext);
    if ctx.panic.is_some() {
        return 1;
    }
    let bytes: &[u8] = if len == 0 { &[] } else { std::slice::from_raw_parts(text as *const u8, len) };
    let piece = String::from_utf8_lossy(bytes); // whole code points per the contract: borrowed
    let callback = &mut ctx.callback;
    match panic::catch_unwind(AssertUnwindSafe(|| callback(token, &piece))) {
        Ok(stop) => stop as c_int,
        Err(payload) => {
            ctx.panic = Some(payload); // resumed after needle_generate returns
            1
        }
    }
}

impl State {
    /// Creates an empty sequence with the model's attention window.
    pub fn new(model: &Model) -> Result<State> {
        State::with_kv_window(model, -1)
    }

    /// Creates an empty sequence: `kv_window` -1 = the model's window, 0 = full causal
    /// attention, > 0 = this window in tokens.
    pub fn with_kv_window(model: &Model, kv_window: i32) -> Result<State> {
        State::with_options(model, kv_window, false)
    }

    /// Creates an empty sequence with a window (as `with_kv_window`) and, if `int8_kv`, an int8
    /// KV cache (3.8x smaller at head_dim 64, not bit-faithful: see needle.h `needle_kv_type`).
    pub fn with_options(model: &Model, kv_window: i32, int8_kv: bool) -> Result<State> {
        State::with_max_tokens(model, kv_window, int8_kv, 0)
    }

    /// As `with_options`, holding at most `max_tokens` positions (0 = max_seq_len): the KV memory
    /// is sized for them at creation and feeding past them is `Status::ContextFull`.
    pub fn with_max_tokens(model: &Model, kv_window: i32, int8_kv: bool, max_tokens: u32) -> Result<State> {
        // struct_size first: needle_*_params_init writes only the caller's struct_size bytes.
        let mut p = sys::needle_state_params {
            struct_size: std::mem::size_of::<sys::needle_state_params>() as u32,
            ..Default::default()
        };
        unsafe { sys::needle_state_params_init(&mut p) };
        p.kv_window = kv_window;
        p.kv_type = if int8_kv { sys::NEEDLE_KV_INT8 } else { sys::NEEDLE_KV_F32 };
        p.max_tokens = max_tokens;
        let mut out = ptr::null_mut();
        check(unsafe { sys::needle_state_create_ex(model.as_ptr(), &p, &mut out) })?;
        let raw = NonNull::new(out).ok_or_else(|| invalid("state_create returned no state"))?;
        // needle.h has no state -> model accessor: remember the logits size (out_vocab) here.
        Ok(State { raw, vocab_size: model.info().out_vocab })
    }

    pub fn as_ptr(&self) -> *mut sys::needle_state {
        self.raw.as_ptr()
    }

    /// Floats a logits buffer needs (the model's out_vocab, needle.h; Needle 2: vocab_size).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size as usize
    }

    /// Tokens fed so far.
    pub fn pos(&self) -> u32 {
        unsafe { sys::needle_state_pos(self.raw.as_ptr()) }
    }

    /// Rewinds to position 0.
    pub fn reset(&mut self) {
        unsafe { sys::needle_state_reset(self.raw.as_ptr()) }
    }

    /// Feeds one token. `logits` receives the next-token logits (at least out_vocab floats);
    /// an empty slice skips the LM head.
    pub fn decode(&mut self, token: u32, logits: &mut [f32]) -> Result<()> {
        let (p, n) = out_buf(logits);
        check(unsafe { sys::needle_state_decode(self.raw.as_ptr(), token, p, n) })
    }

    /// Feeds one token and returns the next-token logits.
    pub fn decode_logits(&mut self, token: u32) -> Result<Vec<f32>> {
        let mut logits = vec![0f32; self.vocab_size()];
        self.decode(token, &mut logits)?;
        Ok(logits)
    }

    /// Feeds tokens, in chunks through `batch` if given. `logits` (empty = skip) receives the last
    /// position's logits.
    pub fn prefill(&mut self, tokens: &[u32], batch: Option<&mut Batch>, logits: &mut [f32]) -> Result<()> {
        let (p, n) = out_buf(logits);
        let b = batch.map_or(ptr::null_mut(), |b| b.as_ptr());
        check(unsafe { sys::needle_state_prefill(self.raw.as_ptr(), b, tokens.as_ptr(), tokens.len(), p, n) })
    }

    /// σ(confidence head) over every token fed so far; `Status::Unsupported` without the head.
    pub fn confidence(&self) -> Result<f32> {
        let mut p = 0f32;
        check(unsafe { sys::needle_state_confidence(self.raw.as_ptr(), &mut p) })?;
        Ok(p)
    }

    /// Unit contrastive embedding of every token fed so far (similarity = dot product);
    /// `Status::Unsupported` without the head.
    pub fn embedding(&self) -> Result<Vec<f32>> {
        let mut dim = 0usize;
        let st = unsafe { sys::needle_state_embedding(self.raw.as_ptr(), ptr::null_mut(), 0, &mut dim) };
        if st != sys::NEEDLE_E_BUFFER_TOO_SMALL {
            check(st)?;
        }
        let mut out = vec![0f32; dim];
        check(unsafe { sys::needle_state_embedding(self.raw.as_ptr(), out.as_mut_ptr(), out.len(), &mut dim) })?;
        Ok(out)
    }

    /// Makes this state continue exactly as `src` (same model and options).
    pub fn copy_from(&mut self, src: &State) -> Result<()> {
        check(unsafe { sys::needle_state_copy(self.raw.as_ptr(), src.raw.as_ptr()) })
    }

    /// The state as a versioned, checksummed blob tied to the model file.
    pub fn save(&self) -> Result<Vec<u8>> {
        let mut len = 0usize;
        let st = unsafe { sys::needle_state_save(self.raw.as_ptr(), ptr::null_mut(), 0, &mut len) };
        if st != sys::NEEDLE_E_BUFFER_TOO_SMALL {
            check(st)?;
        }
        let mut buf = vec![0u8; len];
        check(unsafe { sys::needle_state_save(self.raw.as_ptr(), buf.as_mut_ptr().cast(), buf.len(), &mut len) })?;
        buf.truncate(len);
        Ok(buf)
    }

    /// Restores a `save` of the same model file and options; `Status::Format` (state unchanged)
    /// otherwise.
    pub fn load(&mut self, blob: &[u8]) -> Result<()> {
        check(unsafe { sys::needle_state_load(self.raw.as_ptr(), blob.as_ptr().cast(), blob.len()) })
    }

    /// Feeds `prompt` (no chat template) and generates. `on_token(id, text)` gets each token and
    /// the text it completes (id [`sys::NEEDLE_NO_TOKEN`] for a final U+FFFD flush); return `true`
    /// to stop, which is not an error ([`StopReason::Callback`]). A panic in the callback stops
    /// generation and is resumed here, after the C call has returned.
    pub fn generate<F>(
        &mut self,
        prompt: &str,
        params: &GenerateParams,
        batch: Option<&mut Batch>,
        mut on_token: F,
    ) -> Result<GenerateResult>
    where
        F: FnMut(u32, &str) -> bool,
    {
        let mut p = sys::needle_generate_params {
            struct_size: std::mem::size_of::<sys::needle_generate_params>() as u32,
            ..Default::default()
        };
        unsafe { sys::needle_generate_params_init(&mut p) };
        p.max_tokens = params.max_tokens;
        p.temperature = params.temperature;
        p.top_k = i32::try_from(params.top_k).map_err(|_| invalid("top_k is too large"))?;
        p.top_p = params.top_p;
        p.seed = params.seed;
        p.add_bos = params.add_bos as i32;
        let mut r = sys::needle_generate_result {
            struct_size: std::mem::size_of::<sys::needle_generate_result>() as u32,
            ..Default::default()
        };
        let mut ctx = CallbackContext { callback: &mut on_token, panic: None };
        let b = batch.map_or(ptr::null_mut(), |b| b.as_ptr());
        let st = unsafe {
            sys::needle_generate(
                self.raw.as_ptr(),
                b,
                prompt.as_ptr() as *const c_char,
                prompt.len(),
                &p,
                Some(trampoline),
                &mut ctx as *mut CallbackContext as *mut c_void,
                &mut r,
            )
        };
        let outcome = if st == sys::NEEDLE_E_CANCELLED { Ok(()) } else { check(st) };
        if let Some(payload) = ctx.panic.take() {
            panic::resume_unwind(payload);
        }
        outcome?;
        Ok(GenerateResult {
            prompt_tokens: r.prompt_tokens,
            generated_tokens: r.generated_tokens,
            stop_reason: StopReason::from_code(r.stop_reason),
            prefill_ms: r.prefill_ms,
            decode_ms: r.decode_ms,
        })
    }
}

impl Drop for State {
    fn drop(&mut self) {
        unsafe { sys::needle_state_free(self.raw.as_ptr()) }
    }
}

/// `State` is deliberately not `Sync`:
///
/// ```compile_fail
/// fn sync<T: Sync>() {}
/// sync::<needle::State>();
/// ```
#[allow(dead_code)]
struct StateIsNotSync;
