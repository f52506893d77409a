"""``python -m cairn.bench NAME [options]``: run one benchmark."""

import sys

BENCHES = {"file": "cairn.bench.file", "staging": "cairn.bench.staging", "pack": "cairn.bench.pack", "skel": "cairn.bench.skel",
           "dad": "cairn.bench.dad", "commit": "cairn.bench.commit", "redundancy": "cairn.bench.redundancy",
           "recovery": "cairn.bench.recovery", "workflow": "cairn.bench.workflow",
           "file-scale": "cairn.bench.file_scale", "drain": "cairn.bench.drain", "drain-scale": "cairn.bench.drain_scale",
           "stream": "cairn.bench.stream", "demo-prefault": "cairn.bench.demo_prefault",
           "adios2": "cairn.bench.adios2_plugin"}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in BENCHES:
        sys.exit(f"usage: python -m cairn.bench {{{','.join(BENCHES)}}} [options]")
    import importlib

    name = sys.argv.pop(1)
    importlib.import_module(BENCHES[name]).main(sys.argv[1:])


main()
