"""The ``cairn`` command: inspect and extract datasets.

    cairn ls PATH [--cluster FILE] [--blocks] [--verify] | cairn ls --cluster FILE
    cairn get PATH VAR --step N [--box 0:10,:,5] [--writer R] [-o out.npy] [--cluster FILE]
    cairn export PATH -o OUT.zarr|OUT.nc|OUT.h5 [--steps 0:10] [--vars a,b] [--cluster FILE]
    cairn pack SET_DIR -o OUT [--group-size 32 --scheme auto --parity 1] | --compare
    cairn unpack OUT -o RESTORED [--member NAME]
    [mpirun -n N] cairn skel APP.yaml|qmcpack|s3d [--engine file|staging|adios2] [--trace-flush N]
    cairn model RUNS.json... [--procs 16384,65536] [--mttf 6h] [--png model.png]
    cairn cohmm --out DIR [--nx 128 --ny 128 --steps 20 --mode database|runtime --store staging|redis
                [--store-url URL] --engine dask|process --workers 2 --no-kriging --flux analytic|md --plot]
    cairn serve --cluster cluster.json [--id N --servers S --memory 4GiB]
    cairn cluster start --servers 4 [--spares 1] [--topology FILE] [--memory 4GiB] [--file cluster.json]
    cairn cluster status [--objects] [--json] [--file cluster.json]   (also: cairn status)
    cairn cluster dashboard [--port 8470] [--allow-host NAME]
    cairn cluster stop [--file cluster.json]
    cairn adios2-plugin [--build [--adios2-dir DIR]]
    cairn chaos --cluster cluster.json --mtbf 18s --duration 150s --kill server|node [--workload] [--json OUT]
    cairn --version
"""

from __future__ import annotations

import argparse
import os
import sys

from . import __version__, cluster_cli
from .exceptions import CairnError

#: Options whose values may start with "-" (a negative index), which argparse would take for an option.
_NEGATIVE_OK = ("--box", "--step")


class Formatter(argparse.HelpFormatter):
    """Help that shows each option's default, unless it is none or the help text already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS) and "default" not in text:
            text += " (default: %(default)s)"
        return text


def _formatted(parser: argparse.ArgumentParser) -> None:
    """Gives ``parser`` and all its subcommands' parsers the :class:`Formatter`."""
    parser.formatter_class = Formatter
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for p in a.choices.values():
                _formatted(p)


def _join_negative(argv: list[str]) -> list[str]:
    """``--box -1,:,:`` as ``--box=-1,:,:``, so that a negative index is not taken for an option."""
    out: list[str] = []
    it = iter(argv)
    for a in it:
        if a in _NEGATIVE_OK:
            nxt = next(it, None)
            out.append(a if nxt is None else f"{a}={nxt}")
        else:
            out.append(a)
    return out


def parser(serve_only: bool = False) -> argparse.ArgumentParser:
    """The ``cairn`` argument parser with every subcommand, or only the server's (``cairn serve``
    runs once per server and again for every spare: without the client's modules, numpy among
    them, it starts with 0.05 s of CPU instead of 0.3)."""
    p = argparse.ArgumentParser(prog="cairn", description="Cairn: staging and checkpoint/restart for n-D arrays")
    p.add_argument("--version", action="version", version=f"cairn {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    if serve_only:
        cluster_cli.add(sub)
    else:
        from . import adios2_cli, chaos, cohmm_cli, dataset_cli, export_cli, model_cli, pack_cli, skel_cli

        for module in (dataset_cli, export_cli, pack_cli, skel_cli, model_cli, cohmm_cli, cluster_cli, chaos, adios2_cli):
            module.add(sub)
    _formatted(p)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser(serve_only=argv[:1] == ["serve"]).parse_args(_join_negative(argv))
    args.argv = argv
    # Tables printed step by step reach a pipe (`| tee`, a log) line by line, not at exit.
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    try:
        args.func(args)
        sys.stdout.flush()
    except CairnError as e:
        print(f"cairn: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader of our output left (`cairn ls ... | head`): stop quietly. Python would also
        # report the failed flush of stdout at exit, so point it at /dev/null.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
