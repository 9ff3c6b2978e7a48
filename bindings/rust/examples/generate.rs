//! Streams generated text:  cargo run --offline --example generate -- [MODEL.cact] [PROMPT]
//!
//! Without a model argument it runs the demo model ($NEEDLE_DEMO_MODEL, else
//! $NEEDLE_LIB_DIR/models/needle-demo.cact, else ../../build/models/needle-demo.cact):
//! the trained tool-calling demo model (models/README.md), prompted without the chat template.
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

fn demo_model() -> PathBuf {
    if let Some(p) = std::env::var_os("NEEDLE_DEMO_MODEL") {
        return p.into();
    }
    let lib_dir = std::env::var_os("NEEDLE_LIB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../build"));
    lib_dir.join("models/needle-demo.cact")
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let path = args.next().map(PathBuf::from).unwrap_or_else(demo_model);
    let prompt = args.next().unwrap_or_else(|| "Once upon a time".to_owned());
    println!("needle {} (ABI {}), model {}", needle::version(), needle::abi_version(), path.display());

    let run = || -> needle::Result<needle::GenerateResult> {
        let model = needle::Model::load(&path)?;
        let mut state = needle::State::new(&model)?;
        let params = needle::GenerateParams { max_tokens: 32, temperature: 0.8, seed: 7, ..Default::default() };
        let mut out = std::io::stdout();
        state.generate(&prompt, &params, None, |_, text| {
            let _ = out.write_all(text.as_bytes()).and_then(|_| out.flush());
            false // keep going
        })
    };
    match run() {
        Ok(r) => {
            println!(
                "\n[{} prompt tokens, {} generated, stop {:?}]",
                r.prompt_tokens, r.generated_tokens, r.stop_reason
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
