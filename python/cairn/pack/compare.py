"""`cairn pack --compare`: every scheme on a sample of the set, as a table, so users can pick
(mcrEngine §6.2: the best scheme depends on the application). Containers are packed as `cairn
pack` would by default (with parity)."""

from __future__ import annotations

import os
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

from .aggregate import FRAME, list_members, pack_best, scan_group
from .layout import AUTO, tries
from .restore import decode_all

#: (scheme, codec) pairs compared; the first is the paper's baseline (Agnostic with gzip).
CANDIDATES = (
    ("agnostic", "gzip"),
    ("agnostic", "zstd"),
    ("agnostic-block", "zstd"),
    ("aware", "aware"),
    ("aware-block", "aware"),
    (AUTO, "aware"),
)


@dataclass
class Row:
    scheme: str
    codec: str
    members: int
    raw: int
    packed: int
    ratio: float
    improvement: float  # over the first row, as a fraction
    pack_mbps: float
    unpack_mbps: float


def compare(
    src: str,
    group_size: int = 32,
    block: int = 8192,
    sample: int | None = None,
    match: str | None = None,
    candidates: tuple[tuple[str, str], ...] = CANDIDATES,
    workers: int | None = None,
    notes: list[str] | None = None,
    parity: int = 1,
    parity_group: int = 16,
) -> list[Row]:
    """Packs the first `sample` members (default: one group) with each candidate and decodes
    them again, timing both. What the scanner left residual is added to `notes`."""
    files = list_members(src)[: sample or group_size]
    pattern = re.compile(match) if match else None
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="cairn-compare-") as tmp, ThreadPoolExecutor(workers or os.cpu_count() or 2) as pool:
        for scheme, codec in candidates:
            t0 = time.perf_counter()
            packed = raw = 0
            paths = []
            for g in range(0, len(files), group_size):
                members = scan_group(files[g : g + group_size])
                if notes is not None and not rows:
                    notes += [f"{m.name}: {n}" for m in members for n in m.notes]
                path = os.path.join(tmp, f"{scheme}-{codec}-{g}.cpk")
                packed += pack_best(members, path, tries(scheme), block, codec, pattern, pool, None, False, FRAME, parity, parity_group)
                raw += sum(m.size for m in members)
                paths.append(path)
            t_pack = time.perf_counter() - t0
            t0 = time.perf_counter()
            for path in paths:
                decode_all(path, pool)
                os.unlink(path)
            t_unpack = time.perf_counter() - t0
            ratio = raw / packed if packed else 1.0
            base = rows[0].ratio if rows else ratio
            rows.append(Row(scheme, codec, len(files), raw, packed, ratio, ratio / base - 1, raw / t_pack / 1e6, raw / t_unpack / 1e6))
    return rows


def table(rows: list[Row]) -> str:
    base = f"{rows[0].scheme}+{rows[0].codec}" if rows else ""
    out = [f"{'scheme':<15} {'codec':<6} {'ratio':>7} {'vs ' + base:>16} {'pack MB/s':>10} {'unpack MB/s':>12}"]
    for r in rows:
        out.append(f"{r.scheme:<15} {r.codec:<6} {r.ratio:>7.3f} {r.improvement * 100:>+15.1f}% {r.pack_mbps:>10.1f} {r.unpack_mbps:>12.1f}")
    return "\n".join(out)


def as_json(rows: list[Row]) -> list[dict]:
    return [asdict(r) for r in rows]
