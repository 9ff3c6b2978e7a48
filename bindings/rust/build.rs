//! Links libneedle. The library is looked up in $NEEDLE_LIB_DIR, default ../../build relative to
//! this crate (the repository's build directory). An rpath to that directory is added so tests and
//! examples run without LD_LIBRARY_PATH.
use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=NEEDLE_LIB_DIR");
    println!("cargo:rerun-if-changed=build.rs");
    let dir = match env::var_os("NEEDLE_LIB_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap()).join("../../build"),
    };
    let dir = dir.canonicalize().unwrap_or(dir);
    if !dir.join("libneedle.so").exists() {
        println!("cargo:warning=libneedle.so not found in {} (set NEEDLE_LIB_DIR)", dir.display());
    }
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=needle");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
}
