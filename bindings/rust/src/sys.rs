//! Raw declarations of needle.h (ABI version 1). Everything here is `unsafe` to call; the safe
//! API in the crate root is built on it. Struct layouts are `#[repr(C)]` copies of the header's.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_void};

/// NEEDLE_ABI_VERSION of the header these declarations were written from.
pub const NEEDLE_ABI_VERSION: u32 = 1;

pub type needle_status = i32;
pub const NEEDLE_OK: needle_status = 0;
pub const NEEDLE_E_INVALID_ARGUMENT: needle_status = 1;
pub const NEEDLE_E_IO: needle_status = 2;
pub const NEEDLE_E_FORMAT: needle_status = 3;
pub const NEEDLE_E_UNSUPPORTED: needle_status = 4;
pub const NEEDLE_E_NO_MEMORY: needle_status = 5;
pub const NEEDLE_E_CONTEXT_FULL: needle_status = 6;
pub const NEEDLE_E_BUFFER_TOO_SMALL: needle_status = 7;
pub const NEEDLE_E_CANCELLED: needle_status = 8;
pub const NEEDLE_E_INTERNAL: needle_status = 9;

pub const NEEDLE_STOP_NONE: u32 = 0;
pub const NEEDLE_STOP_EOS: u32 = 1;
pub const NEEDLE_STOP_MAX_TOKENS: u32 = 2;
pub const NEEDLE_STOP_CONTEXT_FULL: u32 = 3;
pub const NEEDLE_STOP_CALLBACK: u32 = 4;

pub const NEEDLE_NO_TOKEN: u32 = 0xFFFF_FFFF;

/// Opaque handles.
#[repr(C)]
pub struct needle_model {
    _private: [u8; 0],
}
#[repr(C)]
pub struct needle_state {
    _private: [u8; 0],
}
#[repr(C)]
pub struct needle_batch {
    _private: [u8; 0],
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct needle_model_params {
    pub struct_size: u32,
    pub use_mmap: i32,
    pub n_threads: i32,
    /// Needle 3 depth-ladder rung; 0 = all layers (needle.h).
    pub depth: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct needle_model_info {
    pub struct_size: u32,
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
    pub has_tokenizer: u32,
    pub weight_bytes: u64,
    pub file_bytes: u64,
    // ---- added by issue 8 (Needle 3)
    /// Logits rows: every logits buffer holds this many floats.
    pub out_vocab: u32,
    /// Bit l set: layer l (as run) attends globally.
    pub global_layer_mask: u64,
    pub qkv_conv_taps: u32,
    pub has_confidence_head: u32,
    pub has_contrastive_head: u32,
    /// Worker threads the model's states run with (issue 13).
    pub n_threads: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct needle_state_params {
    pub struct_size: u32,
    pub kv_window: i32,
    pub kv_type: i32,
    /// Positions the state can hold; 0 = max_seq_len (needle.h).
    pub max_tokens: u32,
}

pub const NEEDLE_KV_F32: i32 = 0;
pub const NEEDLE_KV_INT8: i32 = 1;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct needle_generate_params {
    pub struct_size: u32,
    pub max_tokens: u32,
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub seed: u64,
    pub add_bos: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct needle_generate_result {
    pub struct_size: u32,
    pub prompt_tokens: u32,
    pub generated_tokens: u32,
    pub stop_reason: u32,
    pub prefill_ms: f64,
    pub decode_ms: f64,
}

pub type needle_token_callback =
    Option<unsafe extern "C" fn(token: u32, text: *const c_char, text_len: usize, user_data: *mut c_void) -> c_int>;

extern "C" {
    pub fn needle_abi_version() -> u32;
    pub fn needle_version_string() -> *const c_char;
    pub fn needle_check_abi(expected_abi: u32) -> i32;
    pub fn needle_status_string(s: needle_status) -> *const c_char;
    pub fn needle_last_error() -> *const c_char;

    pub fn needle_model_params_init(p: *mut needle_model_params);
    pub fn needle_model_load_file(
        path: *const c_char,
        p: *const needle_model_params,
        out: *mut *mut needle_model,
    ) -> needle_status;
    pub fn needle_model_load_memory(
        data: *const c_void,
        size: usize,
        p: *const needle_model_params,
        out: *mut *mut needle_model,
    ) -> needle_status;
    /// UNSUPPORTED when the library was built without its demo model.
    pub fn needle_model_load_builtin(p: *const needle_model_params, out: *mut *mut needle_model) -> needle_status;
    /// Static text, or NULL when the library was built without its demo model.
    pub fn needle_builtin_tools_json() -> *const c_char;
    pub fn needle_model_free(model: *mut needle_model);
    pub fn needle_model_get_info(model: *const needle_model, info: *mut needle_model_info) -> needle_status;

    pub fn needle_state_create(model: *mut needle_model, out: *mut *mut needle_state) -> needle_status;
    pub fn needle_state_params_init(p: *mut needle_state_params);
    pub fn needle_state_create_ex(
        model: *mut needle_model,
        p: *const needle_state_params,
        out: *mut *mut needle_state,
    ) -> needle_status;
    pub fn needle_state_free(state: *mut needle_state);
    pub fn needle_state_reset(state: *mut needle_state);
    pub fn needle_state_pos(state: *const needle_state) -> u32;
    pub fn needle_batch_create(model: *mut needle_model, capacity: u32, out: *mut *mut needle_batch) -> needle_status;
    pub fn needle_batch_free(batch: *mut needle_batch);

    pub fn needle_state_decode(
        state: *mut needle_state,
        token: u32,
        logits: *mut f32,
        logits_len: usize,
    ) -> needle_status;
    pub fn needle_decode_many(
        states: *const *mut needle_state,
        tokens: *const u32,
        n: usize,
        logits: *const *mut f32,
        logits_len: usize,
        scratch: *mut needle_batch,
    ) -> needle_status;
    pub fn needle_state_prefill(
        state: *mut needle_state,
        batch: *mut needle_batch,
        tokens: *const u32,
        n_tokens: usize,
        logits: *mut f32,
        logits_len: usize,
    ) -> needle_status;

    pub fn needle_model_tokenize(
        model: *const needle_model,
        text: *const c_char,
        text_len: usize,
        add_bos: c_int,
        tokens: *mut u32,
        capacity: usize,
        n_tokens: *mut usize,
    ) -> needle_status;
    pub fn needle_model_detokenize(
        model: *const needle_model,
        tokens: *const u32,
        n_tokens: usize,
        text: *mut c_char,
        capacity: usize,
        text_len: *mut usize,
    ) -> needle_status;

    // probe heads and state persistence (issue 9)
    pub fn needle_state_confidence(state: *const needle_state, probability: *mut f32) -> needle_status;
    pub fn needle_state_embedding(
        state: *const needle_state,
        out: *mut f32,
        out_len: usize,
        dim: *mut usize,
    ) -> needle_status;
    pub fn needle_state_copy(dst: *mut needle_state, src: *const needle_state) -> needle_status;
    pub fn needle_state_save(
        state: *const needle_state,
        buf: *mut c_void,
        cap: usize,
        len: *mut usize,
    ) -> needle_status;
    pub fn needle_state_load(state: *mut needle_state, buf: *const c_void, len: usize) -> needle_status;

    pub fn needle_generate_params_init(p: *mut needle_generate_params);
    pub fn needle_generate(
        state: *mut needle_state,
        batch: *mut needle_batch,
        prompt: *const c_char,
        prompt_len: usize,
        params: *const needle_generate_params,
        callback: needle_token_callback,
        user_data: *mut c_void,
        result: *mut needle_generate_result,
    ) -> needle_status;
}

// ---------------------------------------------------------------- tool-calling chat (issue 9)
#[repr(C)]
pub struct needle_chat {
    _private: [u8; 0],
}

pub const NEEDLE_TOOL_CHOICE_AUTO: i32 = 0;
pub const NEEDLE_TOOL_CHOICE_REQUIRED: i32 = 1;
pub const NEEDLE_TOOL_CHOICE_NONE: i32 = 2;

/// needle_chat_params, field by field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct needle_chat_params {
    pub struct_size: u32,
    pub tool_choice: i32,
    pub kv_type: i32,
    pub grammar: i32,
    pub require_required: i32,
    pub stop_needs_call: i32,
    pub sinks: i32,
}

extern "C" {
    pub fn needle_chat_params_init(p: *mut needle_chat_params);
    pub fn needle_chat_create(
        model: *mut needle_model,
        system: *const c_char,
        tools_json: *const c_char,
        p: *const needle_chat_params,
        out: *mut *mut needle_chat,
    ) -> needle_status;
    pub fn needle_chat_render(
        chat: *mut needle_chat,
        text: *const c_char,
        out: *mut c_char,
        cap: usize,
        len: *mut usize,
    ) -> needle_status;
    pub fn needle_chat_complete(
        chat: *mut needle_chat,
        text: *const c_char,
        max_new_tokens: u32,
        out: *mut c_char,
        cap: usize,
        len: *mut usize,
    ) -> needle_status;
    pub fn needle_chat_reset(chat: *mut needle_chat);
    pub fn needle_chat_free(chat: *mut needle_chat);
    pub fn needle_chat_tools_json(
        chat: *const needle_chat,
        out: *mut c_char,
        cap: usize,
        len: *mut usize,
    ) -> needle_status;
}
