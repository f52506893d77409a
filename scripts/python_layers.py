"""The layer check of the Python packages ``layers.toml`` lists under ``[[python]]``, as
``cargo run -p cairn-layers`` checks the crates: module edges from the parsed sources (``ast``:
every ``import`` and ``from … import`` anywhere, also inside functions and ``TYPE_CHECKING``
blocks; relative levels; names re-exported by a package's ``__init__`` resolved to the module
defining them), then no import circle, no import from a lower layer to a higher one, and no
module importing its own package's ``__init__`` (move what both use into a module below them).

``python scripts/python_layers.py [LAYERS_TOML]``; ``--edges PACKAGE_DIR`` prints the graph."""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path


def modules(root: Path) -> dict[str, Path]:
    """Module name (dotted, relative to the package; ``""``: its ``__init__``) → file. An
    extension module counts by its stub (``_native.pyi``)."""
    out = {}
    stubs = [f for f in root.rglob("*.pyi") if not f.with_suffix(".py").exists()]
    for f in sorted([*root.rglob("*.py"), *stubs]):
        parts = list(f.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def _package_of(mod: str, files: dict[str, Path]) -> str:
    """The package a module's relative imports start from."""
    if files[mod].name == "__init__.py":
        return mod
    return mod.rpartition(".")[0]


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def _imports(mod: str, files: dict[str, Path], top: str) -> list[tuple[str, str | None]]:
    """(module, name or None) pairs `mod` imports from inside the package, by absolute name."""
    tree = ast.parse(files[mod].read_text(), str(files[mod]))
    out: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == top or a.name.startswith(top + "."):
                    out.append((a.name[len(top) + 1:], None))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package_of(mod, files).split(".") if _package_of(mod, files) else []
                up = node.level - 1
                if up > len(base):
                    continue
                base = base[:len(base) - up]
                target = _join(".".join(base), node.module or "")
            elif node.module and (node.module == top or node.module.startswith(top + ".")):
                target = node.module[len(top) + 1:]
            else:
                continue
            out.extend((target, a.name) for a in node.names)
    return out


def _reexports(files: dict[str, Path], top: str) -> dict[tuple[str, str], str]:
    """(package, name) → the module a package's ``__init__`` imports that name from."""
    out: dict[tuple[str, str], str] = {}
    for mod, f in files.items():
        if f.name != "__init__.py":
            continue
        for target, name in _imports(mod, files, top):
            if name and name != "*" and _join(target, name) not in files:
                out[(mod, name)] = target
    return out


def _resolve(target: str, name: str | None, files: dict[str, Path], again: dict[tuple[str, str], str]) -> str:
    """The module an import of ``name`` from ``target`` reaches: a submodule, the module a
    package re-exports the name from, or the module itself."""
    if name and _join(target, name) in files:
        return _join(target, name)
    seen = set()
    while name and (target, name) in again and (target, name) not in seen:
        seen.add((target, name))
        target = again[(target, name)]
    return target


def edges(root: Path) -> dict[str, set[str]]:
    """Module → the modules of the package it imports (a package's name stands for its
    ``__init__``)."""
    files = modules(root)
    top = root.name
    again = _reexports(files, top)
    out: dict[str, set[str]] = {m: set() for m in files}
    for mod in files:
        for target, name in _imports(mod, files, top):
            to = _resolve(target, name, files, again)
            if to != mod and to in files:
                out[mod].add(to)
    return out


def layer_of(layers: list[dict], mod: str) -> int:
    """Index of the layer naming `mod` (longest match; ``*``: every module no layer names;
    ``__init__``: the package's own)."""
    name = mod or "__init__"
    best: tuple[int, int] | None = None
    for i, layer in enumerate(layers):
        for p in layer["modules"]:
            if p != "*" and (name == p or name.startswith(p + ".")) and (best is None or len(p) > best[0]):
                best = (len(p), i)
    if best is not None:
        return best[1]
    return next((i for i, lay in enumerate(layers) if "*" in lay["modules"]), 0)


def _show(m: str) -> str:
    return m or "__init__"


def check(layers: list[dict], graph: dict[str, set[str]]) -> list[str]:
    """Every violation of `layers` in `graph`, as sentences."""
    out = []
    for a, tos in sorted(graph.items()):
        for b in sorted(tos):
            la, lb = layer_of(layers, a), layer_of(layers, b)
            if lb > la:
                out.append(f"{_show(a)} ({layers[la]['name']}) imports {_show(b)} ({layers[lb]['name']}), a higher layer")
    # A module importing its own package's __init__ (not the top package's root, whose layer rules).
    for a, tos in sorted(graph.items()):
        parent = a.rpartition(".")[0]
        if "." in a and parent in tos:
            out.append(f"{_show(a)} imports its package {_show(parent)}: move what both use into a module below them")
    out.extend(f"import circle: {' -> '.join(map(_show, c))}" for c in _circles(graph))
    return out


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
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
                comps.append(comp)

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle(sorted(c), graph) for c in comps]


def _cycle(comp: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A circle through the first module of a strongly connected component."""
    members, start = set(comp), comp[0]
    prev: dict[str, str] = {}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w not in prev:
                prev[w] = v
                todo.append(w)
    return comp


def main(argv: list[str]) -> int:
    here = Path(__file__).resolve().parent.parent
    if argv[:1] == ["--edges"]:
        for a, tos in sorted(edges(Path(argv[1])).items()):
            print(f"{_show(a)} -> {', '.join(map(_show, sorted(tos)))}")
        return 0
    path = Path(argv[0]) if argv else here / "layers.toml"
    config = tomllib.loads(path.read_text())
    broken = 0
    for pkg in config.get("python", []):
        graph = edges(path.parent / pkg["src"])
        found = check(pkg["layers"], graph)
        for v in found:
            print(f"{pkg['name']}: {v}")
        if not found:
            n = sum(len(t) for t in graph.values())
            print(f"layers ok: {pkg['name']}: {len(graph)} modules, {n} imports, no circle, no upward import")
        broken += len(found)
    if broken:
        print(f"python_layers: {broken} layering violations", file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
