//! Tool-calling conversations (needle.h `needle_chat_*`, spec tool-calling.md).
use crate::{check, invalid, sys, Model, Result};
use std::ffi::CString;
use std::os::raw::c_char;
use std::ptr::{self, NonNull};

/// `needle_chat_params.tool_choice`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides (default).
    Auto,
    /// The turn starts with `<tool_call>`.
    Required,
    /// No call; the envelope's type is "respond".
    None,
}

/// Options of [`Chat::new`], one field per `needle_chat_params` field (struct_size is set here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChatParams {
    pub tool_choice: ToolChoice,
    /// `needle_kv_type` of the conversation's state (`sys::NEEDLE_KV_F32` default).
    pub kv_type: i32,
    /// Constrained decoding inside `<tool_call>` (§6).
    pub grammar: bool,
    /// An arguments object closes only once every "required" key appeared (§6.4).
    pub require_required: bool,
    /// EOS and `<|im_end|>` are masked until a call list has closed (§6.3).
    pub stop_needs_call: bool,
    /// The static prefix stays visible as KV sinks (§10.3).
    pub sinks: bool,
}

impl Default for ChatParams {
    /// `needle_chat_params_init`'s values.
    fn default() -> Self {
        // struct_size first: needle_chat_params_init writes only the caller's struct_size bytes
        // (this mirror stops before validation and tool_index_path).
        let mut p = sys::needle_chat_params {
            struct_size: std::mem::size_of::<sys::needle_chat_params>() as u32,
            ..Default::default()
        };
        unsafe { sys::needle_chat_params_init(&mut p) };
        let tool_choice = match p.tool_choice {
            sys::NEEDLE_TOOL_CHOICE_REQUIRED => ToolChoice::Required,
            sys::NEEDLE_TOOL_CHOICE_NONE => ToolChoice::None,
            _ => ToolChoice::Auto,
        };
        ChatParams {
            tool_choice,
            kv_type: p.kv_type,
            grammar: p.grammar != 0,
            require_required: p.require_required != 0,
            stop_needs_call: p.stop_needs_call != 0,
            sinks: p.sinks != 0,
        }
    }
}

/// One tool-calling conversation. `complete` returns the §7.1 envelope as the JSON text the
/// library wrote (the crate has no JSON dependency; parse it with the JSON library of your choice).
/// Use from one thread at a time: `Send`, not `Sync`.
#[derive(Debug)]
pub struct Chat {
    raw: NonNull<sys::needle_chat>,
    buf: Vec<u8>, // envelope buffer, sized once
}

unsafe impl Send for Chat {}

fn c_string(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| invalid("text contains a NUL byte"))
}

/// Bytes reserved for one envelope.
pub const CHAT_BUFFER_SIZE: usize = 1 << 20;

impl Chat {
    /// Starts a conversation: system facts and tools (a JSON array of schemas; "" = "[]").
    pub fn new(model: &Model, system: &str, tools_json: &str, params: &ChatParams) -> Result<Chat> {
        // struct_size first: needle_chat_params_init writes only the caller's struct_size bytes
        // (this mirror stops before validation and tool_index_path).
        let mut p = sys::needle_chat_params {
            struct_size: std::mem::size_of::<sys::needle_chat_params>() as u32,
            ..Default::default()
        };
        unsafe { sys::needle_chat_params_init(&mut p) };
        p.tool_choice = match params.tool_choice {
            ToolChoice::Auto => sys::NEEDLE_TOOL_CHOICE_AUTO,
            ToolChoice::Required => sys::NEEDLE_TOOL_CHOICE_REQUIRED,
            ToolChoice::None => sys::NEEDLE_TOOL_CHOICE_NONE,
        };
        p.kv_type = params.kv_type;
        p.grammar = params.grammar as i32;
        p.require_required = params.require_required as i32;
        p.stop_needs_call = params.stop_needs_call as i32;
        p.sinks = params.sinks as i32;
        let system = c_string(system)?;
        let tools = c_string(if tools_json.is_empty() { "[]" } else { tools_json })?;
        let mut out = ptr::null_mut();
        check(unsafe { sys::needle_chat_create(model.as_ptr(), system.as_ptr(), tools.as_ptr(), &p, &mut out) })?;
        let raw = NonNull::new(out).ok_or_else(|| invalid("chat_create returned no chat"))?;
        Ok(Chat { raw, buf: Vec::new() })
    }

    pub fn as_ptr(&self) -> *mut sys::needle_chat {
        self.raw.as_ptr()
    }

    /// Size query, then the write (the buffer rules of needle_chat_render).
    fn text(&self, call: impl Fn(*mut c_char, usize, &mut usize) -> sys::needle_status) -> Result<String> {
        let mut len = 0usize;
        let st = call(ptr::null_mut(), 0, &mut len);
        if st != sys::NEEDLE_E_BUFFER_TOO_SMALL {
            check(st)?;
        }
        let mut buf = vec![0u8; len + 1];
        check(call(buf.as_mut_ptr().cast(), buf.len(), &mut len))?;
        buf.truncate(len);
        String::from_utf8(buf).map_err(|_| invalid("library returned invalid UTF-8"))
    }

    /// The exact text the next `complete(text)` would feed (no BOS).
    pub fn render(&self, text: &str) -> Result<String> {
        let t = c_string(text)?;
        self.text(|out, cap, len| unsafe { sys::needle_chat_render(self.raw.as_ptr(), t.as_ptr(), out, cap, len) })
    }

    /// The canonical tools JSON placed between `<tools>` and `</tools>` (§3.3).
    pub fn tools_json(&self) -> Result<String> {
        self.text(|out, cap, len| unsafe { sys::needle_chat_tools_json(self.raw.as_ptr(), out, cap, len) })
    }

    /// One turn on `text` (a query, or tool results as JSON): the envelope JSON (fields type,
    /// success, error, error_code, reason, function_calls, suppressed_calls, reasoning,
    /// confidence, prefill_tps, decode_tps, peak_ram_mb). A failed turn is an `Ok` envelope with
    /// `"success":false`.
    pub fn complete(&mut self, text: &str, max_new_tokens: u32) -> Result<String> {
        let t = c_string(text)?;
        if self.buf.is_empty() {
            self.buf = vec![0u8; CHAT_BUFFER_SIZE];
        }
        let mut len = 0usize;
        check(unsafe {
            sys::needle_chat_complete(
                self.raw.as_ptr(),
                t.as_ptr(),
                max_new_tokens,
                self.buf.as_mut_ptr().cast(),
                self.buf.len(),
                &mut len,
            )
        })?;
        String::from_utf8(self.buf[..len].to_vec()).map_err(|_| invalid("library returned invalid UTF-8"))
    }

    /// Rewinds to the cached static prefix; tools and system stay.
    pub fn reset(&mut self) {
        unsafe { sys::needle_chat_reset(self.raw.as_ptr()) }
    }
}

impl Drop for Chat {
    fn drop(&mut self) {
        unsafe { sys::needle_chat_free(self.raw.as_ptr()) }
    }
}
