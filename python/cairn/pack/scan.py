"""Finding the variables of a checkpoint file and where their values lie in it.

A *member* is one process's checkpoint file. Scanning lists its variables (path, element type,
class) and the byte ranges of the file that hold their raw values. Everything else in the file
(headers, attributes, B-trees, padding, data stored filtered) is the *residual*. Packing moves
values and residual into separate streams and unpacking splices them back, so every file is
restored byte for byte; the scanner only has to be right for compression to be good, never for
restoration to be exact (ranges that are out of bounds or overlap are left in the residual).

Formats: HDF5 (including netCDF-4, which is HDF5) through h5py, and netCDF classic (CDF-1, -2 and
-5) from its header. Other files are packed as opaque bytes. Whatever the scanner cannot model (a
datatype numpy has no equivalent for, a file HDF5 cannot open) stays residual, and the member
carries a note saying so (shown by ``--compare``).
"""

from __future__ import annotations

import os

from .member import Member, Variable

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def detect(path: str) -> str:
    with open(path, "rb") as f:
        head = f.read(8)
        # HDF5's signature is at 0 or, after a userblock (MATLAB v7.3 files), at 512, 1024, 2048 …
        at = 512
        while head != HDF5_SIGNATURE and at < (8 << 20):
            f.seek(at)
            sig = f.read(8)
            if len(sig) < 8:
                break
            if sig == HDF5_SIGNATURE:
                return "hdf5"
            at *= 2
    if head == HDF5_SIGNATURE:
        return "hdf5"
    if head[:3] == b"CDF" and head[3:4] in (b"\x01", b"\x02", b"\x05"):
        return "netcdf3"
    return "opaque"


def scan(path: str, name: str) -> Member:
    """Scans one file. Unknown formats become opaque members (all residual)."""
    size = os.path.getsize(path)
    fmt = detect(path) if size >= 8 else "opaque"
    variables: list[Variable] = []
    notes: list[str] = []
    try:
        if fmt == "hdf5":
            fmt, variables = _scan_hdf5(path, notes)
        elif fmt == "netcdf3":
            from .netcdf3 import scan_classic

            variables = scan_classic(path, size)
    except Exception as e:  # noqa: BLE001 - any failure to model a file only costs ratio
        notes.append(f"not scanned ({type(e).__name__}: {e}); packed as opaque bytes")
        fmt, variables = "opaque", []
    return Member(name, path, fmt, size, _keep_valid(variables, size), notes)


def _keep_valid(variables: list[Variable], size: int) -> list[Variable]:
    """Drops variables with a range outside the file or overlapping another's (hard links, a
    misread header): their bytes then stay in the residual."""
    taken: list[tuple[int, int, int]] = sorted(
        (off, off + n, i) for i, v in enumerate(variables) for off, n in v.regions if n > 0
    )
    bad = {i for a, b, i in taken if a < 0 or b > size}
    end, owner = -1, -1
    for a, b, i in taken:
        if a < end:
            bad.update((i, owner))
        if b > end:
            end, owner = b, i
    return [
        Variable(v.path, v.dtype, v.shape, [r for r in v.regions if r[1] > 0], v.ordered)
        for i, v in enumerate(variables)
        if i not in bad and v.nbytes > 0
    ]


def _scan_hdf5(path: str, notes: list[str]) -> tuple[str, list[Variable]]:
    import h5py

    # The low-level API: the high-level wrappers cost more than the HDF5 calls for files with
    # thousands of small variables (measured: scanning was over half of pack time).
    found: list[Variable] = []
    fid = h5py.h5f.open(path.encode(), h5py.h5f.ACC_RDONLY)
    try:
        fmt = "netcdf4" if h5py.h5a.exists(fid, b"_NCProperties") else "hdf5"

        def visit(name: bytes, info: object) -> None:
            if info.type == h5py.h5o.TYPE_DATASET:  # type: ignore[attr-defined]
                try:
                    dsid = h5py.h5d.open(fid, name)
                except Exception as e:  # noqa: BLE001 - e.g. a dataset whose filter is not available
                    notes.append(f"/{name.decode(errors='replace')}: not opened ({e}); left residual")
                    return
                try:
                    var = _variable(dsid, "/" + name.decode(errors="replace"))
                    if var is not None:
                        found.append(var)
                except Exception as e:  # noqa: BLE001 - types numpy cannot express (H5T_TIME, odd floats)
                    notes.append(f"/{name.decode(errors='replace')}: {type(e).__name__}: {e}; left residual")
                finally:
                    dsid.close()

        h5py.h5o.visit(fid, visit, info=True)
    finally:
        fid.close()
    return fmt, found


def _variable(dsid: object, path: str) -> Variable | None:
    import h5py

    dcpl = dsid.get_create_plist()  # type: ignore[attr-defined]
    regions = _dataset_regions(dsid, dcpl)
    if not regions:
        return None
    dtype = dsid.dtype  # type: ignore[attr-defined]
    size = dsid.get_type().get_size()  # type: ignore[attr-defined]
    # Values numpy cannot describe exactly (heap ids of variable-length data, references) stay
    # untyped bytes of the stored size.
    exact = dtype.kind != "O" and dtype.itemsize == size
    contiguous = dcpl.get_layout() == h5py.h5d.CONTIGUOUS  # type: ignore[attr-defined]
    plain = exact and contiguous and dtype.fields is None and dtype.subdtype is None
    return Variable(path, dtype.str if exact else f"|V{size}", tuple(dsid.shape or ()), regions, plain)  # type: ignore[attr-defined]


def _dataset_regions(dsid: object, dcpl: object) -> list[tuple[int, int]]:
    """File ranges of a dataset's raw values: its contiguous block, or its chunks in index order.
    Filtered data (gzip, shuffle…) is already transformed, so it stays opaque, as do compact,
    virtual and external layouts."""
    import h5py

    if dcpl.get_nfilters() > 0 or dcpl.get_external_count() > 0:  # type: ignore[attr-defined]
        return []
    layout = dcpl.get_layout()  # type: ignore[attr-defined]
    if layout == h5py.h5d.CONTIGUOUS:
        off = dsid.get_offset()  # type: ignore[attr-defined]
        return [] if off is None else [(int(off), int(dsid.get_storage_size()))]  # type: ignore[attr-defined]
    if layout == h5py.h5d.CHUNKED:
        out = []
        for i in range(dsid.get_num_chunks()):  # type: ignore[attr-defined]
            info = dsid.get_chunk_info(i)  # type: ignore[attr-defined]
            if info.byte_offset is not None and info.filter_mask == 0:
                out.append((int(info.byte_offset), int(info.size)))
        return out
    return []
