"""The Python layer check (``scripts/python_layers.py``): the package as it is passes, and each
way an upward import or a circle can hide is caught in a copy of a small package."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("python_layers", ROOT / "scripts" / "python_layers.py")
assert _spec and _spec.loader
layers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layers)

LAYERS = [
    {"name": "low", "modules": ["low", "_native"]},
    {"name": "mid", "modules": ["mid", "fam"]},
    {"name": "top", "modules": ["*"]},
]

# A package that keeps its layers: `fam` children use each other and their parent imports them.
CLEAN = {
    "__init__.py": "from .mid import Thing\n",
    "_native.pyi": "def f() -> int: ...\n",
    "low.py": "from . import _native\nX = 1\n",
    "mid.py": "from .low import X\nclass Thing: ...\n",
    "fam/__init__.py": "from .a import run\nVERSION = 1\n",
    "fam/a.py": "from . import util\ndef run() -> None: util.h()\n",
    "fam/util.py": "from ..low import X\ndef h() -> None: ...\n",
    "app.py": "import pkg\nfrom pkg import Thing\nfrom pkg.fam import run\n",
}


def _package(tmp_path: Path, extra: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, text in {**CLEAN, **extra}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_package_keeps_its_layers() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "python_layers.py")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "layers ok: cairn (python)" in r.stdout


def test_a_clean_package_passes(tmp_path: Path) -> None:
    graph = layers.edges(_package(tmp_path, {}))
    assert layers.check(LAYERS, graph) == []
    assert graph["app"] == {"", "mid", "fam.a"}, "names re-exported by an __init__ resolve to their module"
    assert graph["low"] == {"_native"}, "an extension module counts by its stub"


@pytest.mark.parametrize("name, text, expect", [
    # Each injection, and the sentence the check must print for it.
    ("low.py", "def f():\n    from .mid import Thing\n", "low (low) imports mid (mid), a higher layer"),
    ("low.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .mid import Thing\n",
     "low (low) imports mid (mid), a higher layer"),
    ("low.py", "import pkg.app\n", "low (low) imports app (top), a higher layer"),
    ("low.py", "from pkg import Thing\n", "low (low) imports mid (mid), a higher layer"),
    ("fam/util.py", "from .. import app\n", "fam.util (mid) imports app (top), a higher layer"),
    ("fam/util.py", "from . import VERSION\n", "fam.util imports its package fam: move what both use into a module below them"),
    ("fam/util.py", "from . import run\n", "import circle: fam.a -> fam.util -> fam.a"),
    ("low.py", "from .fam import util\n", "low (low) imports fam.util (mid), a higher layer"),
    ("mid.py", "from .low import X\nfrom .fam import run\n", None),
    ("fam/a.py", "from . import util\nfrom ..mid import Thing\n", None),
    ("fam/util.py", "from .a import run\n", "import circle: fam.a -> fam.util -> fam.a"),
])
def test_each_hidden_import_is_caught(tmp_path: Path, name: str, text: str, expect: str | None) -> None:
    found = layers.check(LAYERS, layers.edges(_package(tmp_path, {name: text})))
    if expect is None:
        assert found == [], "a downward import or one within a layer is allowed"
    else:
        assert expect in found, found
