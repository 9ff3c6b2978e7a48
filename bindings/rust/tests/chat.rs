//! Chat tests on the tiny fixture model (tool_choice required, an enum parameter).
use needle::{Chat, ChatParams, Model, Status, ToolChoice};
use std::path::PathBuf;

const WEATHER: &str = concat!(
    r#"[{"name":"get_weather","description":"Get the weather for a city.","#,
    r#""parameters":{"type":"object","properties":{"city":{"type":"string","#,
    r#""enum":["Paris","Oslo"]}},"required":["city"]}}]"#
);
const KEYS: [&str; 12] = [
    "type",
    "success",
    "error",
    "error_code",
    "reason",
    "function_calls",
    "suppressed_calls",
    "reasoning",
    "confidence",
    "prefill_tps",
    "decode_tps",
    "peak_ram_mb",
];

fn tiny() -> Model {
    let dir = std::env::var_os("NEEDLE_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures"));
    Model::load(dir.join("v2/models/tiny.cact")).expect("load tiny.cact")
}

/// Positions of each top-level `"key":` in the envelope: present and increasing.
fn assert_key_order(env: &str) {
    let mut last = 0;
    for k in KEYS {
        let at = env.find(&format!("\"{}\":", k)).unwrap_or_else(|| panic!("no {} in {}", k, env));
        assert!(at >= last, "{} out of order in {}", k, env);
        last = at;
    }
}

#[test]
fn chat_render_and_tools_json() {
    let m = tiny();
    let chat = Chat::new(&m, "date: 2026-07-21", WEATHER, &ChatParams::default()).unwrap();
    assert_eq!(chat.tools_json().unwrap(), WEATHER);
    let want = format!(
        "<|im_start|>system\ndate: 2026-07-21<|im_end|>\n<|im_start|>user\n<tools>{}</tools>\nParis?<|im_end|>\n<|im_start|>assistant\n",
        WEATHER
    );
    assert_eq!(chat.render("Paris?").unwrap(), want);
}

#[test]
fn chat_required_call_then_reset() {
    let m = tiny();
    let p = ChatParams { tool_choice: ToolChoice::Required, ..ChatParams::default() };
    let mut chat = Chat::new(&m, "", WEATHER, &p).unwrap();
    let env = chat.complete("What's the weather in Paris?", 64).unwrap();
    assert_key_order(&env);
    assert!(env.starts_with(r#"{"type":"call","success":true,"error":null,"error_code":null,"#), "{}", env);
    let paris = env.contains(r#""function_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]"#);
    let oslo = env.contains(r#""function_calls":[{"name":"get_weather","arguments":{"city":"Oslo"}}]"#);
    assert!(paris || oslo, "{}", env);
    chat.reset();
    let again = chat.complete("What's the weather in Paris?", 64).unwrap();
    let calls = |e: &str| e[e.find("\"function_calls\"").unwrap()..e.find("\"suppressed_calls\"").unwrap()].to_owned();
    assert_eq!(calls(&again), calls(&env));
    chat.reset();
    let short = chat.complete("Paris?", 3).unwrap();
    assert!(short.contains(r#""success":false"#) && short.contains(r#""error_code":"truncated""#), "{}", short);
    let e = Chat::new(&m, "", r#"[{"name": 3}]"#, &p).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("name"), "{}", e.message);
}

/// The top-level "name" values of a tools array, in order (no JSON dependency: the crate has none).
fn tool_names(tools: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = tools;
    while let Some(at) = rest.find("\"name\"") {
        rest = rest[at + 6..].trim_start();
        rest = rest.strip_prefix(':').expect("':' after \"name\"").trim_start();
        rest = rest.strip_prefix('"').expect("a string name");
        let end = rest.find('"').expect("closing quote");
        names.push(rest[..end].to_owned());
        rest = &rest[end + 1..];
    }
    names
}

#[test]
fn builtin_model_calls_a_tool() {
    let Some(tools) = needle::builtin_tools() else {
        // Library built with NEEDLE_BUILTIN_MODEL=OFF: the loader must say so.
        let e = Model::builtin(&Default::default()).unwrap_err();
        assert_eq!(e.status, Status::Unsupported);
        eprintln!("skipped: libneedle built without its demo model");
        return;
    };
    assert_eq!(tool_names(&tools), ["set_timer", "set_lights", "get_weather", "send_message"]);
    let e = Model::builtin(&needle::LoadOptions { n_threads: u32::MAX, ..Default::default() }).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    let m = Model::builtin(&needle::LoadOptions { n_threads: 1, ..Default::default() }).unwrap();
    assert!(m.info().has_tokenizer);
    assert_eq!((m.info().format_version, m.info().n_threads), (2, 1));
    let mut chat = Chat::new(&m, "", &tools, &ChatParams::default()).unwrap();
    let env = chat.complete("Set a timer for 5 minutes", 256).unwrap();
    assert_key_order(&env);
    assert!(env.contains(r#""success":true"#), "{}", env);
    assert!(env.contains(r#""function_calls":[{"name":"set_timer","arguments":{"seconds":300}}]"#), "{}", env);
}
