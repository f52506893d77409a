"""``cairn adios2-plugin``: where the ADIOS2 plugin engine ``libcairn_adios2.so`` is (the folder
to put on ``ADIOS2_PLUGIN_PATH``), and ``--build`` to build it (CMake and a C++17 compiler) against
the ``adios2`` wheel of this Python or the ADIOS2 of ``--adios2-dir``."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from pathlib import Path

from .exceptions import ConfigError, NotFoundError

LIBRARY = "libcairn_adios2.so"
#: This checkout: the plugin's sources (adios2/) and its build folder.
_ROOT = Path(__file__).resolve().parents[2]
_SOURCE = _ROOT / "adios2"
_BUILD = _SOURCE / "build"


def folders() -> list[Path]:
    """Where the library may be, first match wins: ``$CAIRN_ADIOS2_PLUGIN_DIR``, the ``lib/`` of
    a ``make install`` prefix this package was installed into, this checkout's build folder."""
    here = Path(__file__).resolve()
    out = [Path(d) for d in [os.environ.get("CAIRN_ADIOS2_PLUGIN_DIR")] if d]
    if len(here.parents) > 3 and here.parents[3].name == "lib":  # PREFIX/lib/pythonX.Y/site-packages/cairn/
        out.append(here.parents[3])
    out.append(_BUILD)
    return out


def plugin_dir() -> Path:
    """The folder holding ``libcairn_adios2.so``; NotFoundError saying how to build it when none does."""
    for d in folders():
        if (d / LIBRARY).is_file():
            return d
    raise NotFoundError(f"{LIBRARY} is not built (looked in {', '.join(map(str, folders()))}); "
                        "build it with `cairn adios2-plugin --build` (CMake and a C++17 compiler needed)")


def wheel_adios2_dir() -> Path | None:
    """The folder of ``adios2-config.cmake`` in this Python's ``adios2`` wheel, if it has one."""
    import importlib.util

    spec = importlib.util.find_spec("adios2")
    if spec is None or spec.origin is None:
        return None
    d = Path(spec.origin).parent / "cmake" / "adios2"
    return d if (d / "adios2-config.cmake").is_file() else None


def build(adios2_dir: str | None = None, quiet: bool = False) -> Path:
    """Builds the plugin in this checkout's ``adios2/build`` against ``adios2_dir`` (else
    ``$ADIOS2_DIR``, else the ``adios2`` wheel); returns the folder holding it."""
    if not (_SOURCE / "CMakeLists.txt").is_file():
        raise NotFoundError(f"the plugin's sources are not here ({_SOURCE}): build it from a Cairn checkout "
                            "(`make setup`, or `make install PREFIX=DIR` which installs DIR/lib/libcairn_adios2.so)")
    if shutil.which("cmake") is None:
        raise ConfigError("cmake is not on PATH: install CMake (and a C++17 compiler) to build the ADIOS2 plugin")
    given = adios2_dir or os.environ.get("ADIOS2_DIR")
    where = Path(given) if given else wheel_adios2_dir()
    if where is None:
        raise ConfigError("no ADIOS2 to build against: pip install adios2, or give --adios2-dir DIR "
                          "(the folder of adios2-config.cmake, or an ADIOS2 install prefix)")
    out = None if not quiet else subprocess.DEVNULL
    for cmd in (["cmake", "-S", str(_SOURCE), "-B", str(_BUILD), f"-DADIOS2_DIR={where}", f"-DCMAKE_PREFIX_PATH={where}"],
                ["cmake", "--build", str(_BUILD), "-j", str(min(os.cpu_count() or 1, 4))]):
        p = subprocess.run(cmd, stdout=out, stderr=None if not quiet else subprocess.PIPE, text=True)
        if p.returncode != 0:
            raise ConfigError(f"{' '.join(cmd)} failed (exit {p.returncode}){': ' + p.stderr[-2000:] if p.stderr else ''}")
    return _BUILD


def cmd_adios2_plugin(args: argparse.Namespace) -> None:
    if args.build:
        d = build(args.adios2_dir, quiet=True)
        print(d)
        return
    print(plugin_dir())


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("adios2-plugin", help="print the folder of the ADIOS2 plugin engine libcairn_adios2.so (for ADIOS2_PLUGIN_PATH)",
                       description="ADIOS2 codes stage through Cairn by their XML file alone: <engine type=\"Plugin\"> with "
                                   "PluginName=cairn and PluginLibrary=cairn_adios2, ADIOS2_PLUGIN_PATH=$(cairn adios2-plugin). "
                                   "See docs/guide.md, \"From ADIOS2\".")
    p.add_argument("--build", action="store_true", help="build it (CMake, a C++17 compiler) in this checkout's adios2/build")
    p.add_argument("--adios2-dir", help="the ADIOS2 to build against (default: $ADIOS2_DIR, else this Python's adios2 wheel)")
    p.set_defaults(func=cmd_adios2_plugin)

