//! Regenerates `include/cairn.h` from the Rust sources with cbindgen.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    // A soname with the major version: programs built against this library load
    // libcairn.so.<major> (scripts/build_c.sh links it in target/release; make install installs it).
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcairn.so.{}", std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap());
    let cfg = cbindgen::Config::from_file(format!("{dir}/cbindgen.toml")).expect("cbindgen.toml parses");
    cbindgen::Builder::new()
        .with_crate(&dir)
        .with_config(cfg)
        .generate()
        .expect("cbindgen generates the header")
        .write_to_file(format!("{dir}/include/cairn.h"));
}
