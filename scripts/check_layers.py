#!/usr/bin/env python3
"""Checks the staging server's module layers (issue 41): no import cycle among the modules of
crates/cairn-server, and no import from a lower layer to a higher one.

Layers, bottom up: the data plane (every module at the crate's top level but those named
below), the control plane (`control/`), requests (`cmd/`), connections (`handler`, `server`),
and process start (`serve`). A module's imports are the
`crate::a::b` paths and `super::` paths in its code; comments and `#[cfg(test)]` modules are
left out (a test may build what it tests from anywhere). Exit status 1, with each offending
import and cycle named, when the layering is broken.

Run: python3 scripts/check_layers.py [crate dir]
"""

import re
import sys
from pathlib import Path

TOP = {"admission": 3, "handler": 3, "server": 3, "serve": 4, "settings": 4, "lib": 5}
LAYER_NAMES = {0: "data plane", 1: "control plane", 2: "requests", 3: "connections", 4: "process start", 5: "crate root"}


def module_of(path: Path, src: Path) -> str:
    rel = path.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "mod":
        parts.pop()
    return "::".join(parts)


def layer(module: str) -> int:
    first = module.split("::")[0]
    if first == "control":
        return 1
    if first == "cmd":
        return 2
    return TOP.get(first, 0)


def code_of(text: str) -> str:
    """The text without comments and without `#[cfg(test)]` modules."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    cut = re.search(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text)
    return text[: cut.start()] if cut else text


def imports(module: str, text: str, modules: set) -> set:
    """The crate's modules that `module` names."""
    out = set()
    here = module.split("::") if module else []
    for m in re.finditer(r"\b(crate|super)((?:::\w+)+)", text):
        head, path = m.group(1), m.group(2).strip(":").split("::")
        if head == "crate":
            base = []
        else:
            # `super` of a `mod.rs` module is its parent; of a file, the folder's module.
            base = here[:-1]
        # Longest prefix that names a module of the crate.
        for n in range(len(path), 0, -1):
            target = "::".join(base + path[:n])
            if target in modules:
                if target != module:
                    out.add(target)
                break
        else:
            # A grouped import such as `use super::{a, b}` names modules inside the braces.
            pass
    for m in re.finditer(r"\buse\s+(crate|super)::\{([^}]*)\}", text):
        base = [] if m.group(1) == "crate" else here[:-1]
        for item in m.group(2).split(","):
            name = item.strip().split("::")[0]
            target = "::".join(base + [name])
            if target in modules and target != module:
                out.add(target)
    return out


def cycles(graph: dict) -> list:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    crate = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "crates" / "cairn-server"
    src = crate / "src"
    files = {module_of(p, src): p for p in src.rglob("*.rs") if "bin" not in p.relative_to(src).parts}
    modules = set(files) - {"lib"}
    modules.add("")
    graph, upward = {}, []
    for module, path in sorted(files.items()):
        name = "" if module == "lib" else module
        deps = imports(name, code_of(path.read_text()), modules) - {""}
        # A parent names its children to declare them; that is not a use.
        deps = {d for d in deps if not (name and d.startswith(name + "::")) and not (name == "" and "::" not in d)}
        graph[name or "lib"] = deps
        for d in sorted(deps):
            if layer(d) > layer(name or "lib"):
                upward.append(f"{path.relative_to(crate)}: {name or 'lib'} ({LAYER_NAMES[layer(name or 'lib')]}) imports {d} ({LAYER_NAMES[layer(d)]})")
    # Parents and children are one node for cycles: a folder is one module to its users.
    found = cycles(graph)
    for line in upward:
        print("upward import:", line)
    for c in found:
        print("import cycle:", " -> ".join(c))
    if upward or found:
        print(f"{len(upward)} upward imports, {len(found)} cycles among {len(graph)} modules of {crate}")
        return 1
    print(f"layers ok: {len(graph)} modules of {crate.name}, no cycle, no upward import")
    return 0


if __name__ == "__main__":
    sys.exit(main())
