//! Integration tests against the tiny fixture model
//! ($NEEDLE_FIXTURES, else ../shared/fixtures relative to the repository root).
use needle::{decode_many, sys, Batch, GenerateParams, Model, State, Status, StopReason};
use std::path::PathBuf;

const BOS: u32 = 2;

fn fixtures() -> PathBuf {
    std::env::var_os("NEEDLE_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures"))
}

fn tiny() -> Model {
    Model::load(fixtures().join("v2/models/tiny.cact")).expect("load tiny.cact")
}

fn argmax(xs: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] {
            best = i;
        }
    }
    best
}

#[test]
fn missing_file_is_io() {
    let e = Model::load("/nonexistent/dir/model.cact").unwrap_err();
    assert_eq!(e.status, Status::Io);
    assert_eq!(e.status.code(), 2);
    assert!(e.message.contains("nonexistent"), "{}", e.message);
}

#[test]
fn garbage_file_is_format() {
    let path = std::env::temp_dir().join(format!("needle-garbage-{}.cact", std::process::id()));
    std::fs::write(&path, b"this is not a needle container".repeat(10)).unwrap();
    let e = Model::load(&path).unwrap_err();
    std::fs::remove_file(&path).ok();
    assert_eq!(e.status, Status::Format);
    assert!(!e.message.is_empty());
    let e = Model::from_bytes(b"garbage", &Default::default()).unwrap_err();
    assert_eq!(e.status.code(), 3);
}

#[test]
fn abi_guard() {
    assert_eq!(unsafe { sys::needle_check_abi(999) }, sys::NEEDLE_E_UNSUPPORTED);
    assert_eq!(unsafe { sys::needle_check_abi(sys::NEEDLE_ABI_VERSION) }, sys::NEEDLE_OK);
    assert!(needle::check_abi().is_ok());
    assert_eq!(needle::abi_version(), sys::NEEDLE_ABI_VERSION);
    assert!(!needle::version().is_empty());
}

#[test]
fn info_and_tokenizer() {
    let m = tiny();
    assert_eq!((m.info().vocab_size, m.info().d_model, m.info().bos_id), (1024, 128, BOS));
    let text = "The quick brown fox, café ☃";
    let ids = m.tokenize(text, true).unwrap();
    assert_eq!(ids[0], BOS);
    assert_eq!(m.detokenize(&ids).unwrap(), text);
}

#[test]
fn bos_logits_match_reference() {
    let bytes = std::fs::read(fixtures().join("v2/refs/tiny/empty.full.f32")).unwrap();
    let reference: Vec<f32> =
        bytes[..4096].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let m = tiny();
    let mut s = State::new(&m).unwrap();
    let logits = s.decode_logits(BOS).unwrap();
    assert_eq!(s.pos(), 1);
    assert_eq!(argmax(&logits), argmax(&reference));
    for (i, (a, b)) in logits.iter().zip(&reference).enumerate() {
        assert!((a - b).abs() <= 1e-4, "logit {i}: {a} vs {b}");
    }
}

#[test]
fn raw_ffi_equals_safe_api() {
    let m = tiny();
    let mut raw = [0f32; 1024];
    unsafe {
        let mut st = std::ptr::null_mut();
        assert_eq!(sys::needle_state_create(m.as_ptr(), &mut st), 0);
        assert_eq!(sys::needle_state_decode(st, BOS, raw.as_mut_ptr(), raw.len()), 0);
        sys::needle_state_free(st);
    }
    let safe = State::new(&m).unwrap().decode_logits(BOS).unwrap();
    assert_eq!(&raw[..], &safe[..]);
}

#[test]
fn batched_prefill_equals_decode() {
    let m = tiny();
    let ids = m.tokenize("hello there, general", true).unwrap();
    let (mut a, mut b) = (State::new(&m).unwrap(), State::new(&m).unwrap());
    let mut batch = Batch::new(&m, 4).unwrap();
    let mut last = vec![0f32; 1024];
    for &t in &ids {
        a.decode(t, &mut last).unwrap();
    }
    let mut chunked = vec![0f32; 1024];
    b.prefill(&ids, Some(&mut batch), &mut chunked).unwrap();
    assert_eq!(a.pos(), b.pos());
    assert_eq!(last, chunked);
}

#[test]
fn decode_many_equals_decode() {
    let m = tiny();
    let (mut a, mut b) = (State::new(&m).unwrap(), State::new(&m).unwrap());
    let (mut c, mut d) = (State::new(&m).unwrap(), State::new(&m).unwrap());
    a.decode(7, &mut []).unwrap(); // different positions
    c.decode(7, &mut []).unwrap();
    let mut batch = Batch::new(&m, 4).unwrap();
    for step in 0..3u32 {
        let (mut la, mut lb) = (vec![0f32; 1024], vec![0f32; 1024]);
        decode_many(&mut [&mut a, &mut b], &[30 + step, 40 + step], &mut [&mut la, &mut lb], &mut batch).unwrap();
        assert_eq!(la, c.decode_logits(30 + step).unwrap());
        assert_eq!(lb, d.decode_logits(40 + step).unwrap());
    }
    assert_eq!((a.pos(), b.pos()), (4, 3));
    // A bad token is refused up front: no state moves.
    let e = decode_many(&mut [&mut a, &mut b], &[1, 5000], &mut [], &mut batch).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert_eq!((a.pos(), b.pos()), (4, 3));
    let e = decode_many(&mut [&mut a, &mut b], &[1], &mut [], &mut batch).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    let mut short = [0f32; 10];
    let mut other = [0f32; 10];
    let e = decode_many(&mut [&mut a, &mut b], &[1, 2], &mut [&mut short, &mut other], &mut batch).unwrap_err();
    assert_eq!(e.status, Status::BufferTooSmall);
}

#[test]
fn errors_carry_status_and_message() {
    let m = tiny();
    let mut s = State::new(&m).unwrap();
    let e = s.decode(5000, &mut []).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("vocab_size"), "{}", e.message);
    let e = s.decode(BOS, &mut [0f32; 10]).unwrap_err();
    assert_eq!(e.status, Status::BufferTooSmall);
    let too_long = vec![BOS; m.info().max_seq_len as usize + 1];
    assert_eq!(s.prefill(&too_long, None, &mut []).unwrap_err().status, Status::ContextFull);
    assert_eq!(s.pos(), 0);
}

fn generate(m: &Model, params: &GenerateParams) -> (String, Vec<u32>, needle::GenerateResult) {
    let mut s = State::new(m).unwrap();
    let (mut text, mut ids) = (String::new(), Vec::new());
    let r = s
        .generate("Hello", params, None, |id, piece| {
            text.push_str(piece);
            if id != sys::NEEDLE_NO_TOKEN {
                ids.push(id);
            }
            false
        })
        .unwrap();
    (text, ids, r)
}

#[test]
fn seeded_generation_is_reproducible() {
    let m = tiny();
    let p = GenerateParams { max_tokens: 16, temperature: 0.8, seed: 7, ..Default::default() };
    let (a, ids, r) = generate(&m, &p);
    let (b, _, _) = generate(&m, &p);
    assert_eq!(a, b);
    assert!(r.generated_tokens > 0);
    assert_eq!(m.detokenize(&ids).unwrap(), a);
}

#[test]
fn callback_stop_and_panic() {
    let m = tiny();
    let mut s = State::new(&m).unwrap();
    let mut n = 0;
    let r = s
        .generate("Hello", &GenerateParams::default(), None, |_, _| {
            n += 1;
            n == 3
        })
        .unwrap();
    assert_eq!((r.stop_reason, r.generated_tokens), (StopReason::Callback, 3));

    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = s.generate(" more", &GenerateParams::default(), None, |_, _| panic!("from callback"));
    }));
    let payload = caught.unwrap_err();
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"from callback"));
    s.decode(BOS, &mut []).unwrap(); // the state is still usable
}

/// Issue 13: calls on a state from its own generate callback used to be accepted. The safe API
/// cannot make them (the state is borrowed), so they go through the raw pointer.
#[test]
fn state_is_busy_inside_its_own_callback() {
    let m = tiny();
    let mut s = State::new(&m).unwrap();
    let mut other = State::new(&m).unwrap();
    let raw = s.as_ptr();
    let mut seen: Vec<(i32, String)> = Vec::new();
    let params = GenerateParams { max_tokens: 4, ..GenerateParams::default() };
    let r = s
        .generate("Hello", &params, None, |_, _| {
            if seen.is_empty() {
                let t = 5u32;
                let last =
                    || unsafe { std::ffi::CStr::from_ptr(sys::needle_last_error()) }.to_string_lossy().into_owned();
                let st = unsafe { sys::needle_state_decode(raw, t, std::ptr::null_mut(), 0) };
                seen.push((st, last()));
                let st =
                    unsafe { sys::needle_state_prefill(raw, std::ptr::null_mut(), &t, 1, std::ptr::null_mut(), 0) };
                seen.push((st, last()));
                let st = unsafe {
                    sys::needle_generate(
                        raw,
                        std::ptr::null_mut(),
                        b"x".as_ptr() as *const _,
                        1,
                        std::ptr::null(),
                        None,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                    )
                };
                seen.push((st, last()));
                other.decode(t, &mut []).unwrap(); // another state is free to use
            }
            false
        })
        .unwrap();
    assert_eq!(seen.len(), 3);
    for (st, msg) in &seen {
        assert_eq!(*st, sys::NEEDLE_E_INVALID_ARGUMENT, "{msg}");
        assert!(msg.contains("state is busy in needle_generate"), "{msg}");
    }
    assert_eq!(other.pos(), 1);
    assert_eq!(s.pos(), r.prompt_tokens + r.generated_tokens);
}

#[test]
fn handles_drop_in_any_order() {
    let m = tiny();
    let mut s = State::new(&m).unwrap();
    let mut batch = Batch::new(&m, 8).unwrap();
    drop(m); // the C library keeps the model alive for the state and batch
    let p = GenerateParams { max_tokens: 4, ..Default::default() };
    let r = s.generate("Hello", &p, Some(&mut batch), |_, _| false).unwrap();
    assert_eq!(r.generated_tokens, 4);
    assert_eq!(s.decode_logits(BOS).unwrap().len(), 1024);
    drop(batch);
    drop(s);
}

#[test]
fn model_is_shared_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Model>();
    send::<State>();
    send::<Batch>();
    let m = std::sync::Arc::new(tiny());
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let m = m.clone();
            std::thread::spawn(move || State::new(&m).unwrap().decode_logits(BOS).unwrap())
        })
        .collect();
    let results: Vec<Vec<f32>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(results[0], results[1]);
}

/// Probe heads after [BOS] against the tiny fixture (`empty` prompt), and state copy / save / load.
#[test]
fn heads_and_persistence() {
    let m = tiny();
    let mut s = State::new(&m).unwrap();
    assert_eq!(s.confidence().unwrap_err().status, Status::InvalidArgument);
    s.decode_logits(BOS).unwrap();
    let p = s.confidence().unwrap() as f64;
    let logit = p.ln() - (-p).ln_1p();
    assert!((logit - (-4.647948265075684)).abs() < 1e-3, "logit {}", logit);
    let raw = std::fs::read(fixtures().join("v2/refs/tiny/empty.contrastive.f32")).unwrap();
    let emb = s.embedding().unwrap();
    assert_eq!(emb.len() * 4, raw.len());
    for (i, e) in emb.iter().enumerate() {
        let r = f32::from_le_bytes([raw[4 * i], raw[4 * i + 1], raw[4 * i + 2], raw[4 * i + 3]]);
        assert!((e - r).abs() < 1e-4, "embedding {}: {} vs {}", i, e, r);
    }
    let mut blob = s.save().unwrap();
    let mut c = State::new(&m).unwrap();
    let mut l = State::new(&m).unwrap();
    c.copy_from(&s).unwrap();
    l.load(&blob).unwrap();
    let want = s.decode_logits(7).unwrap();
    assert_eq!(c.decode_logits(7).unwrap(), want);
    assert_eq!(l.decode_logits(7).unwrap(), want);
    let mid = blob.len() / 2;
    blob[mid] ^= 1;
    assert_eq!(l.load(&blob).unwrap_err().status, Status::Format);
    assert_eq!(l.pos(), 2);
}

// ------------------------------------------------------------------ Needle 3 (issue 8)

fn read_le<T>(path: PathBuf, f: fn([u8; 4]) -> T) -> Vec<T> {
    let bytes = std::fs::read(path).unwrap();
    bytes.chunks_exact(4).map(|c| f([c[0], c[1], c[2], c[3]])).collect()
}

/// tiny3 (fixtures/v3 manifest case tiny3__chat__f32): info, greedy continuation, depth ladder,
/// max_tokens and the confidence head through the binding.
#[test]
fn needle3_tiny3() {
    let v3 = fixtures().join("v3");
    let path = v3.join("models/tiny3.cact");
    let m = Model::load(&path).expect("load tiny3.cact");
    let info = *m.info();
    assert_eq!((info.format_version, info.out_vocab, info.has_confidence_head), (3, 512, true));
    let prompt = read_le(v3.join("refs/tiny3__chat__f32.prompt.u32"), u32::from_le_bytes);
    let reference = read_le(v3.join("refs/tiny3__chat__f32.prefill.f32"), f32::from_le_bytes);
    assert_eq!(prompt.len(), 28);

    // Greedy: the manifest's first two generated ids; the state holds exactly the prompt.
    let mut s = State::with_max_tokens(&m, -1, false, prompt.len() as u32).unwrap();
    assert_eq!(s.vocab_size(), 512);
    let mut logits = vec![0f32; s.vocab_size()];
    s.prefill(&prompt, None, &mut logits).unwrap();
    let worst = logits.iter().zip(&reference).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst <= 2e-4, "prefill max |d| {worst}");
    assert_eq!(argmax(&logits), 35);
    let p = s.confidence().unwrap();
    assert!(p > 0.0 && p < 1.0);
    assert!((p - 1.0 / (1.0 + (-0.478_590_19f32).exp())).abs() <= 1e-4, "confidence {p}");
    assert_eq!(s.decode(35, &mut logits).unwrap_err().status, Status::ContextFull);
    assert_eq!(s.pos(), 28);
    let mut s = State::new(&m).unwrap();
    s.prefill(&prompt, None, &mut []).unwrap();
    assert_eq!(argmax(&s.decode_logits(35).unwrap()), 32);

    let params = GenerateParams { max_tokens: 3, ..Default::default() };
    let mut s = State::new(&m).unwrap();
    let r = s.generate("Hello", &params, None, |_, _| false).unwrap();
    assert!(r.generated_tokens <= 3 && r.prompt_tokens > 1);
    assert!(matches!(r.stop_reason, StopReason::MaxTokens | StopReason::Eos));

    let depth = |d| Model::load_with(&path, &needle::LoadOptions { depth: d, ..Default::default() });
    assert_eq!(depth(2).unwrap().info().num_layers, 2);
    assert_eq!(depth(1).unwrap_err().status, Status::InvalidArgument);
}

/// The `#[repr(C)]` mirrors have needle.h's sizes and offsets (x86-64 / arm64 LP64).
#[test]
fn struct_layouts_match_needle_h() {
    use std::mem::{offset_of, size_of};
    assert_eq!(size_of::<sys::needle_model_params>(), 16);
    assert_eq!(size_of::<sys::needle_state_params>(), 16);
    assert_eq!(size_of::<sys::needle_generate_params>(), 40);
    assert_eq!(size_of::<sys::needle_model_info>(), 120);
    assert_eq!(offset_of!(sys::needle_model_info, out_vocab), 88);
    assert_eq!(offset_of!(sys::needle_model_info, global_layer_mask), 96);
    assert_eq!(offset_of!(sys::needle_model_info, n_threads), 116);
}
