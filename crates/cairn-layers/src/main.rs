//! `cargo run -p cairn-layers [-- LAYERS_TOML]`: checks every crate `layers.toml` lists (see the
//! library's doc); exit status 1, each violation named, when one is broken.
//! `cargo run -p cairn-layers -- --edges SRC` prints a crate's module edges, to draw layers from.

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--edges") {
        let src = std::env::args().nth(2).unwrap_or_else(|| fail("--edges needs a crate's src folder"));
        for (from, tos) in cairn_layers::edges(std::path::Path::new(&src)).unwrap_or_else(|e| fail(&e)) {
            let tos: Vec<_> = tos.into_iter().collect();
            println!("{} -> {}", if from.is_empty() { "lib" } else { &from }, tos.join(", "));
        }
        return;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let file = std::env::args().nth(1).map_or_else(|| root.join("layers.toml"), std::path::PathBuf::from);
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| fail(&format!("reading {}: {e}", file.display())));
    let config: cairn_layers::Config = toml::from_str(&text).unwrap_or_else(|e| fail(&format!("{}: {e}", file.display())));
    let base = file.parent().unwrap_or(&root).to_path_buf();
    let mut broken = 0;
    for c in &config.crates {
        let edges = cairn_layers::edges(&base.join(&c.src)).unwrap_or_else(|e| fail(&e));
        let found = cairn_layers::check(&c.layers, &edges);
        if found.is_empty() {
            let arrows: usize = edges.values().map(|t| t.len()).sum();
            println!("layers ok: {}: {} modules, {arrows} imports, no circle, no upward import", c.name, edges.len());
        }
        for v in &found {
            println!("{}: {v}", c.name);
        }
        broken += found.len();
    }
    if broken > 0 {
        fail(&format!("{broken} layering violations"));
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("cairn-layers: {msg}");
    std::process::exit(1)
}
