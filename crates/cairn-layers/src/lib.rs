//! The module layers of the workspace's crates, checked from their parsed sources (`syn`): every
//! path a module names (`use` trees with nested braces, renames and globs; paths in code; `crate::`,
//! `super::`, `self::` and child-relative paths) is resolved to the module that defines the item,
//! following `pub use` re-exports to where the item lives. Test modules (`#[cfg(test)]`) are left
//! out; code after them is not. Macro-generated paths are out of scope.
//!
//! Rules, per crate (`layers.toml` at the workspace root writes each crate's order, lowest
//! first): no import circle among modules, no import from a lower layer to a higher one, and no
//! module importing its own parent (a `mod.rs` dispatches to its children; helpers both use go in
//! a module below them).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use syn::visit_mut::VisitMut;

/// One crate's layers, lowest first; each a list of module paths (a module and its children),
/// `*` for every module no other layer names, `lib` for the crate root.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct CrateLayers {
    /// Crate name (for messages).
    pub name: String,
    /// Its `src` folder, relative to the workspace root.
    pub src: PathBuf,
    /// Layers, lowest first.
    pub layers: Vec<Layer>,
}

/// One layer.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Layer {
    /// What it is (for messages).
    pub name: String,
    /// Module paths it holds.
    pub modules: Vec<String>,
}

/// The whole of `layers.toml`.
#[derive(Debug, serde::Deserialize)]
pub struct Config {
    /// Every checked crate.
    #[serde(rename = "crate")]
    pub crates: Vec<CrateLayers>,
}

/// An import that breaks a rule, or a circle.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Violation {
    /// `from` (in a lower layer) names `to` (in a higher one).
    Upward {
        /// The importing module.
        from: String,
        /// The module it names.
        to: String,
        /// Their layers.
        from_layer: String,
        /// (see `from_layer`)
        to_layer: String,
    },
    /// A module names its own parent.
    Parent {
        /// The child.
        from: String,
        /// Its parent.
        to: String,
    },
    /// Modules importing each other, in order.
    Circle(Vec<String>),
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = |m: &str| if m.is_empty() { "lib".to_string() } else { m.to_string() };
        match self {
            Violation::Upward { from, to, from_layer, to_layer } => {
                write!(f, "{} ({from_layer}) imports {} ({to_layer}), a higher layer", name(from), name(to))
            }
            Violation::Parent { from, to } => {
                write!(f, "{} imports its parent {}: move what both use into a module below them", name(from), name(to))
            }
            Violation::Circle(c) => write!(f, "import circle: {}", c.iter().map(|m| name(m)).collect::<Vec<_>>().join(" -> ")),
        }
    }
}

/// The parsed modules of a crate: path (`a::b`, `""` for the root) → file.
fn module_files(src: &Path) -> std::io::Result<BTreeMap<String, PathBuf>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir)? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(src).expect("below src").with_extension("");
                let mut parts: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
                if parts.first().is_some_and(|f| f == "bin") {
                    continue; // binaries are crates of their own
                }
                if parts.last().is_some_and(|l| l == "mod" || (parts.len() == 1 && (l == "lib" || l == "main"))) {
                    parts.pop();
                }
                out.insert(parts.join("::"), p);
            }
        }
    }
    Ok(out)
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| a.path().is_ident("cfg") && a.parse_args::<syn::Meta>().is_ok_and(|m| m.path().is_ident("test")))
}

/// What a module's code names: `use` paths (flattened) and other paths, each with the module
/// (inline modules included) it appears in; and its re-exports, name → path.
#[derive(Default)]
struct Names {
    paths: Vec<(Vec<String>, Vec<String>)>,
    reexports: BTreeMap<(Vec<String>, String), Vec<String>>,
}

fn flatten(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<(Vec<String>, String)>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let name = n.ident.to_string();
            if name == "self" {
                out.push((prefix.clone(), prefix.last().cloned().unwrap_or_default()));
            } else {
                let mut full = prefix.clone();
                full.push(name.clone());
                out.push((full, name));
            }
        }
        syn::UseTree::Rename(r) => {
            let mut full = prefix.clone();
            full.push(r.ident.to_string());
            out.push((full, r.rename.to_string()));
        }
        syn::UseTree::Glob(_) => out.push((prefix.clone(), "*".into())),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                flatten(t, prefix, out);
            }
        }
    }
}

/// Collects every path of the items of one module (recursing into inline, non-test modules).
fn collect(items: &mut [syn::Item], here: &[String], names: &mut Names) {
    struct Paths<'a>(&'a mut Vec<(Vec<String>, Vec<String>)>, Vec<String>);
    impl VisitMut for Paths<'_> {
        fn visit_path_mut(&mut self, p: &mut syn::Path) {
            if p.leading_colon.is_none() && p.segments.len() > 1 {
                self.0.push((self.1.clone(), p.segments.iter().map(|s| s.ident.to_string()).collect()));
            }
            syn::visit_mut::visit_path_mut(self, p);
        }
        fn visit_item_mod_mut(&mut self, _: &mut syn::ItemMod) {}
        fn visit_item_use_mut(&mut self, _: &mut syn::ItemUse) {}
        fn visit_macro_mut(&mut self, _: &mut syn::Macro) {}
    }
    for item in items {
        match item {
            syn::Item::Mod(m) => {
                if is_test(&m.attrs) {
                    continue;
                }
                if let Some((_, inner)) = &mut m.content {
                    let mut sub = here.to_vec();
                    sub.push(m.ident.to_string());
                    collect(inner, &sub, names);
                }
            }
            syn::Item::Use(u) => {
                if is_test(&u.attrs) {
                    continue;
                }
                let mut flat = Vec::new();
                flatten(&u.tree, &mut Vec::new(), &mut flat);
                let public = !matches!(u.vis, syn::Visibility::Inherited);
                for (path, name) in flat {
                    if public {
                        names.reexports.insert((here.to_vec(), name), path.clone());
                    }
                    names.paths.push((here.to_vec(), path));
                }
            }
            other => {
                let attrs = match other {
                    syn::Item::Fn(f) => &f.attrs,
                    syn::Item::Impl(i) => &i.attrs,
                    syn::Item::Const(c) => &c.attrs,
                    syn::Item::Static(s) => &s.attrs,
                    _ => &Vec::new(),
                };
                if !is_test(attrs) {
                    Paths(&mut names.paths, here.to_vec()).visit_item_mut(other);
                }
            }
        }
    }
}

/// Resolves `path`, named in module `here`, to the module of the crate defining it (following
/// re-exports), or None for another crate's items and local names.
fn resolve(path: &[String], here: &[String], modules: &BTreeSet<Vec<String>>, names: &Names, depth: usize) -> Option<Vec<String>> {
    if depth > 16 || path.is_empty() {
        return None;
    }
    let (mut base, mut rest): (Vec<String>, &[String]) = match path[0].as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "self" => (here.to_vec(), &path[1..]),
        "super" => {
            let mut b = here.to_vec();
            let mut r = path;
            while r.first().is_some_and(|s| s == "super") {
                b.pop()?;
                r = &r[1..];
            }
            (b, r)
        }
        // A child of this module (2018 paths are relative to the module).
        first => {
            let mut child = here.to_vec();
            child.push(first.to_string());
            if !modules.contains(&child) {
                return None;
            }
            (here.to_vec(), path)
        }
    };
    while let Some(next) = rest.first() {
        let mut deeper = base.clone();
        deeper.push(next.clone());
        if !modules.contains(&deeper) {
            break;
        }
        base = deeper;
        rest = &rest[1..];
    }
    // An item of `base`: where a re-export there says it lives.
    if let Some(name) = rest.first() {
        if let Some(target) = names.reexports.get(&(base.clone(), name.clone())) {
            if let Some(m) = resolve(target, &base, modules, names, depth + 1) {
                return Some(m);
            }
        }
    }
    Some(base)
}

/// The import edges of the crate at `src`: module → the modules it names (inline modules count
/// as their file's module).
pub fn edges(src: &Path) -> Result<BTreeMap<String, BTreeSet<String>>, String> {
    let files = module_files(src).map_err(|e| format!("reading {}: {e}", src.display()))?;
    let split = |m: &str| if m.is_empty() { Vec::new() } else { m.split("::").map(String::from).collect::<Vec<_>>() };
    let mut modules: BTreeSet<Vec<String>> = files.keys().map(|m| split(m)).collect();
    let mut names = Names::default();
    let mut owner: BTreeMap<Vec<String>, String> = BTreeMap::new();
    for (m, file) in &files {
        let text = std::fs::read_to_string(file).map_err(|e| format!("reading {}: {e}", file.display()))?;
        let mut parsed = syn::parse_file(&text).map_err(|e| format!("parsing {}: {e}", file.display()))?;
        let here = split(m);
        let before = names.paths.len();
        // Inline modules are modules too (paths may name them).
        fn inline(items: &[syn::Item], here: &[String], out: &mut BTreeSet<Vec<String>>) {
            for item in items {
                if let syn::Item::Mod(md) = item {
                    if let Some((_, inner)) = &md.content {
                        let mut sub = here.to_vec();
                        sub.push(md.ident.to_string());
                        out.insert(sub.clone());
                        inline(inner, &sub, out);
                    }
                }
            }
        }
        inline(&parsed.items, &here, &mut modules);
        collect(&mut parsed.items, &here, &mut names);
        for (ctx, _) in &names.paths[before..] {
            owner.entry(ctx.clone()).or_insert_with(|| m.clone());
        }
    }
    let file_of =
        |m: &[String]| -> String { (0..=m.len()).rev().map(|n| m[..n].join("::")).find(|p| files.contains_key(p)).unwrap_or_default() };
    let mut out: BTreeMap<String, BTreeSet<String>> = files.keys().map(|m| (m.clone(), BTreeSet::new())).collect();
    for (ctx, path) in &names.paths {
        let from = file_of(ctx);
        if let Some(to) = resolve(path, ctx, &modules, &names, 0) {
            let to = file_of(&to);
            if to != from {
                out.entry(from).or_default().insert(to);
            }
        }
    }
    Ok(out)
}

fn layer_of(layers: &[Layer], module: &str) -> usize {
    let module = if module.is_empty() { "lib" } else { module };
    let named = |p: &str| module == p || module.starts_with(&format!("{p}::"));
    layers
        .iter()
        .enumerate()
        .filter_map(|(i, l)| l.modules.iter().filter(|p| *p != "*" && named(p)).map(|p| (p.len(), i)).max())
        .max()
        .map(|(_, i)| i)
        .or_else(|| layers.iter().position(|l| l.modules.iter().any(|p| p == "*")))
        .unwrap_or(0)
}

/// Every violation of `layers` in the crate whose module edges are `edges`.
pub fn check(layers: &[Layer], edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Violation> {
    let mut out = Vec::new();
    for (from, tos) in edges {
        for to in tos {
            let (lf, lt) = (layer_of(layers, from), layer_of(layers, to));
            if lt > lf {
                out.push(Violation::Upward {
                    from: from.clone(),
                    to: to.clone(),
                    from_layer: layers[lf].name.clone(),
                    to_layer: layers[lt].name.clone(),
                });
            } else if !from.is_empty() && (to.is_empty() || from.starts_with(&format!("{to}::"))) && lt == lf {
                out.push(Violation::Parent { from: from.clone(), to: to.clone() });
            }
        }
    }
    out.extend(circles(edges).into_iter().map(Violation::Circle));
    out.sort();
    out
}

/// The import circles (strongly connected components of more than one module), each from its
/// first module round to it again.
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Tarjan's algorithm.
    struct T<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    impl<'a> T<'a> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on.insert(v);
            for w in self.edges.get(v).into_iter().flatten() {
                if !self.index.contains_key(w.as_str()) {
                    self.visit(w);
                    let l = self.low[w.as_str()].min(self.low[v]);
                    self.low.insert(v, l);
                } else if self.on.contains(w.as_str()) {
                    let l = self.index[w.as_str()].min(self.low[v]);
                    self.low.insert(v, l);
                }
            }
            if self.low[v] == self.index[v] {
                let mut scc = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(w);
                    scc.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if scc.len() > 1 {
                    scc.sort();
                    let first = scc[0].clone();
                    scc.push(first);
                    self.out.push(scc);
                }
            }
        }
    }
    let mut t = T { edges, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), on: BTreeSet::new(), out: Vec::new() };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clean crate: `low` (data), `fam` (a family: `mod.rs` dispatching to `a`, which uses
    /// the helper module `util`), `high` above them, the root re-exporting `high::Top`.
    const CLEAN: &[(&str, &str)] = &[
        ("lib.rs", "pub mod fam;\npub mod high;\npub mod low;\npub use high::Top;\n"),
        ("low.rs", "pub fn f() {}\n#[cfg(test)]\nmod tests {\n    use crate::high::Top;\n}\n"),
        ("high.rs", "use crate::low;\npub struct Top;\npub fn g() { low::f() }\n"),
        ("fam/mod.rs", "pub mod a;\npub mod util;\npub fn dispatch() { a::run() }\n"),
        ("fam/a.rs", "use super::util::h;\npub fn run() { h() }\n"),
        ("fam/util.rs", "pub fn h() {}\n"),
    ];

    fn layers() -> Vec<Layer> {
        [("data", "*"), ("top", "high"), ("root", "lib")]
            .iter()
            .map(|(n, m)| Layer { name: n.to_string(), modules: vec![m.to_string()] })
            .collect()
    }

    /// The violations of the clean crate with `extra` appended to file `file`.
    fn with(file: &str, extra: &str) -> Vec<Violation> {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in CLEAN {
            let p = dir.path().join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            let text = if *name == file { format!("{text}{extra}") } else { text.to_string() };
            std::fs::write(p, text).unwrap();
        }
        check(&layers(), &edges(dir.path()).unwrap())
    }

    #[test]
    fn the_clean_crate_passes_and_a_test_modules_imports_do_not_count() {
        assert_eq!(with("lib.rs", ""), vec![]);
    }

    #[test]
    fn each_kind_of_upward_import_is_caught() {
        let up = |from: &str| Violation::Upward { from: from.into(), to: "high".into(), from_layer: "data".into(), to_layer: "top".into() };
        let cases = [
            ("low.rs", "use crate::high::Top;\n", up("low")),
            ("low.rs", "pub fn x() -> crate::high::Top { crate::high::Top }\n", up("low")),
            // A re-export: the root's `pub use high::Top` leads to `high`.
            ("low.rs", "pub fn y() -> Option<crate::Top> { None }\n", up("low")),
            ("low.rs", "use crate::{fam::{util}, high::{Top as T}};\n", up("low")),
            ("fam/util.rs", "pub fn z() -> Option<super::super::high::Top> { None }\n", up("fam::util")),
            ("low.rs", "#[cfg(test)]\nmod more {}\nuse crate::high::Top as After;\n", up("low")),
            ("fam/a.rs", "pub fn w() { super::dispatch() }\n", Violation::Parent { from: "fam::a".into(), to: "fam".into() }),
            ("low.rs", "pub fn v() { crate::fam::util::h() }\n", Violation::Circle(vec![])),
        ];
        for (file, extra, want) in cases {
            let got = with(file, extra);
            match want {
                // A circle only with the import back: low -> fam::util here, and fam::util -> low.
                Violation::Circle(_) => assert!(got.is_empty(), "{extra}: one way is no circle: {got:?}"),
                want => assert!(got.contains(&want), "{file} += {extra:?}: want {want}, got {got:?}"),
            }
        }
    }

    #[test]
    fn circles_are_named() {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in CLEAN {
            let p = dir.path().join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        std::fs::write(dir.path().join("low.rs"), "pub fn f() { crate::fam::util::h() }\n").unwrap();
        std::fs::write(dir.path().join("fam/util.rs"), "pub fn h() { crate::low::f() }\n").unwrap();
        let got = check(&layers(), &edges(dir.path()).unwrap());
        assert_eq!(got, vec![Violation::Circle(vec!["fam::util".into(), "low".into(), "fam::util".into()])]);
    }
}
