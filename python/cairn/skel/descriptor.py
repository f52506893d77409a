"""The I/O descriptor of an application (``APP.yaml``): what `cairn skel` replays.

    app: qmcpack
    steps: 100               # steps to replay
    compute: 0.05            # seconds of computation between steps (emulated)
    checkpoint_every: 10     # checkpoint variables are written every this many steps
    params: {electrons: 512} # named numbers, used as $electrons in shapes and counts
    sizes:                   # size models (see cairn.skel.sizes)
      walkers: {model: spring, target: 130, kick: 2}
    variables:
      - {name: energetics, dtype: f8, role: trace, count: [walkers, 11]}
      - {name: positions, dtype: f8, role: checkpoint, count: [walkers, $electrons, 3]}
      - {names: [T, P], dtype: f8, role: output, shape: [$n, $n, $n], decomposition: auto}

A variable is ``local`` (``count``: per-writer records, the first extent may name a size model)
or global (``shape`` split over the ranks by ``decomposition``: ``auto`` or a list of parts per
dimension). ``role`` says when it is written: ``output`` every ``every`` steps (default 1),
``checkpoint`` every ``checkpoint_every`` steps, ``trace`` every step as trace records.
Numbers may be expressions over params (``$nx * 2``).
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..exceptions import ConfigError, InvalidArgumentError
from . import sizes as S

ROLES = ("output", "checkpoint", "trace")
APPS = Path(__file__).with_name("apps")


@dataclass
class Variable:
    name: str
    dtype: np.dtype
    role: str
    every: int
    count: list[int | str] | None = None  # local: extents, the first may name a size model
    shape: list[int] | None = None  # global
    decomposition: list[int] | None = None  # parts per dimension; None: auto

    @property
    def local(self) -> bool:
        return self.shape is None

    def due(self, step: int) -> bool:
        return self.every > 0 and (step + 1) % self.every == 0


@dataclass
class App:
    name: str
    steps: int
    compute: float
    checkpoint_every: int
    variables: list[Variable]
    sizes: dict[str, S.SizeModel] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    source: str = ""


def shipped() -> dict[str, Path]:
    """Descriptors that come with Cairn, by name."""
    return {p.stem: p for p in sorted(APPS.glob("*.yaml"))}


def find(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.exists():
        return p
    apps = shipped()
    if name_or_path in apps:
        return apps[name_or_path]
    raise InvalidArgumentError(f"no descriptor {name_or_path!r}: give a YAML file or one of the shipped apps: {', '.join(apps)}")


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Div: operator.truediv, ast.Pow: operator.pow}


def _number(value: Any, params: dict[str, Any], where: str) -> Any:
    """``value`` with ``$name`` params substituted and arithmetic evaluated (no other code runs)."""
    if not isinstance(value, str) or "$" not in value:
        return value

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in params:
                raise InvalidArgumentError(f"{where}: unknown param ${node.id}; params: {', '.join(params) or 'none'}")
            return params[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise InvalidArgumentError(f"{where}: {value!r} is not arithmetic over $params")

    try:
        tree = ast.parse(value.replace("$", ""), mode="eval")
    except SyntaxError:
        raise InvalidArgumentError(f"{where}: cannot parse {value!r}") from None
    return ev(tree.body)


def _int(value: Any, params: dict[str, Any], where: str, lo: int = 0) -> int:
    v = _number(value, params, where)
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise InvalidArgumentError(f"{where}: {value!r} must be an integer >= {lo}")
    return v


def parse(doc: dict[str, Any], base: Path, source: str = "", overrides: dict[str, str] | None = None) -> App:
    """An :class:`App` from a parsed descriptor; ``overrides`` (``key=value`` from ``--set``)
    replace top-level keys or params."""
    if not isinstance(doc, dict):
        raise InvalidArgumentError(f"{source}: a descriptor is a mapping (app, steps, variables ...)")
    doc = dict(doc)
    params = dict(doc.get("params") or {})
    for k, v in (overrides or {}).items():
        parsed = _literal(v)
        if k in params or k not in ("app", "steps", "compute", "checkpoint_every"):
            params[k] = parsed
        else:
            doc[k] = parsed
    unknown = set(doc) - {"app", "steps", "compute", "checkpoint_every", "params", "sizes", "variables", "description"}
    if unknown:
        raise InvalidArgumentError(f"{source}: unknown keys {sorted(unknown)}; see `cairn skel --help`")
    sizes = {n: S.parse(n, spec, base) for n, spec in (doc.get("sizes") or {}).items()}
    ckpt = _int(doc.get("checkpoint_every", 0), params, "checkpoint_every")
    variables = []
    for i, v in enumerate(doc.get("variables") or []):
        where = f"variables[{i}]"
        if not isinstance(v, dict):
            raise InvalidArgumentError(f"{where}: a mapping with name, dtype, role and count or shape")
        names = v.get("names") or [v.get("name")]
        if not all(isinstance(n, str) and n for n in names):
            raise InvalidArgumentError(f"{where}: give name: or names: [...]")
        role = v.get("role", "output")
        if role not in ROLES:
            raise InvalidArgumentError(f"{where}: role {role!r}; use one of {', '.join(ROLES)}")
        try:
            dtype = np.dtype(v.get("dtype", "f8"))
        except TypeError as e:
            raise InvalidArgumentError(f"{where}: dtype {v.get('dtype')!r}: {e}") from None
        every = ckpt if role == "checkpoint" else _int(v.get("every", 1), params, f"{where}.every", 1)
        if ("count" in v) == ("shape" in v):
            raise InvalidArgumentError(f"{where}: give count: (per-writer records) or shape: (a global array), not both")
        count = shape = decomp = None
        if "count" in v:
            count = [c if j == 0 and isinstance(c, str) and c in sizes else _int(c, params, f"{where}.count")
                     for j, c in enumerate(v["count"])]
            if not count:
                raise InvalidArgumentError(f"{where}: count needs at least one extent")
        else:
            if role == "trace":
                raise InvalidArgumentError(f"{where}: a trace holds per-writer records: give count:, not shape:")
            shape = [_int(n, params, f"{where}.shape", 1) for n in v["shape"]]
            d = v.get("decomposition", "auto")
            decomp = None if d == "auto" else [_int(n, params, f"{where}.decomposition", 1) for n in d]
            if decomp is not None and len(decomp) != len(shape):
                raise InvalidArgumentError(f"{where}: decomposition {decomp} has {len(decomp)} parts for a {len(shape)}-D shape")
        for n in names:
            variables.append(Variable(n, dtype, role, every, count, shape, decomp))
    if not variables:
        raise InvalidArgumentError(f"{source}: no variables to replay")
    return App(
        name=str(doc.get("app", Path(source).stem or "app")),
        steps=_int(doc.get("steps", 10), params, "steps", 1),
        compute=float(_number(doc.get("compute", 0.0), params, "compute")),
        checkpoint_every=ckpt,
        variables=variables,
        sizes=sizes,
        params=params,
        source=source,
    )


def _literal(text: str) -> Any:
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def load(name_or_path: str, overrides: dict[str, str] | None = None) -> App:
    """Reads a descriptor file (or a shipped app by name)."""
    yaml = need_yaml()

    path = find(name_or_path)
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise InvalidArgumentError(f"{path}: not valid YAML: {e}") from None
    return parse(doc, path.parent, str(path), overrides)


def grid(nranks: int, ndim: int) -> list[int]:
    """Parts per dimension for ``nranks`` (as balanced as possible, like MPI_Dims_create)."""
    dims = [1] * ndim
    n = nranks
    f = 2
    factors = []
    while n > 1:
        while n % f == 0:
            factors.append(f)
            n //= f
        f += 1
    for p in sorted(factors, reverse=True):
        dims[dims.index(min(dims))] *= p
    return sorted(dims, reverse=True)


def box(shape: list[int], parts: list[int], rank: int) -> tuple[list[int], list[int]]:
    """Offset and count of ``rank``'s block of ``shape`` split into ``parts`` (C order of ranks)."""
    coords = []
    for p in reversed(parts):
        coords.append(rank % p)
        rank //= p
    coords.reverse()
    off = [c * n // p for c, n, p in zip(coords, shape, parts)]
    end = [(c + 1) * n // p for c, n, p in zip(coords, shape, parts)]
    return off, [e - o for o, e in zip(off, end)]


def need_yaml() -> Any:
    """The ``yaml`` module, or a clear error saying how to install it."""
    try:
        import yaml
    except ImportError:
        raise ConfigError("cairn skel reads YAML descriptors: pip install pyyaml (or cairn[skel]; `make setup` does)") from None
    return yaml
