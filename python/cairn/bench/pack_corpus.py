"""A corpus of real files written by other libraries, for `cairn pack` tests and the benchmark's
real-files set: h5py (every HDF5 datatype class, userblock, external links, filtered chunks,
compact and external storage), netCDF4 (NETCDF4, NETCDF4_CLASSIC, NETCDF3_CLASSIC and
NETCDF3_64BIT_OFFSET), scipy.io.netcdf (if installed), and the sample files shipped inside the
installed packages.

>>> from cairn.bench.pack_corpus import write_corpus
>>> names = write_corpus("corpus/", copies=2)    # two "ranks" of each kind, values varying by rank
"""

from __future__ import annotations

import glob
import os
import shutil

import numpy as np


def _h5_types(f: object, rank: int, rng: np.random.Generator) -> None:
    import h5py

    n = 200 + rank
    f["f16"] = (np.linspace(0, 1, n) + rank).astype("<f2")
    f["f64be"] = np.sin(np.arange(n) * 0.01 + rank).astype(">f8")
    f["f128"] = np.arange(n, dtype=np.longdouble) / 3
    f["i8"] = np.arange(n, dtype="|i1")
    f["u64be"] = np.arange(n, dtype=">u8") * 7
    f["c128"] = (np.arange(n) + 1j * rank).astype("<c16")
    f["bool"] = np.arange(n) % 3 == 0
    cmp = np.dtype([("x", "<f8"), ("id", ">i4"), ("tag", "S3")])
    f["compound"] = np.array([(i * 0.5, i, b"ab") for i in range(n)], dtype=cmp)
    nested = np.dtype([("pos", "<f4", (3,)), ("inner", [("a", "<i2"), ("b", "<f8")])])
    f["nested"] = np.zeros(n, dtype=nested)
    f["vlen_str"] = np.array([f"rank {rank} item {i}" for i in range(40)], dtype=h5py.string_dtype())
    f["vlen_bytes"] = np.array([b"x" * (i % 7) for i in range(40)], dtype=h5py.string_dtype("ascii"))
    seq = f.create_dataset("vlen_seq", (20,), dtype=h5py.vlen_dtype(np.int32))
    for i in range(20):
        seq[i] = np.arange(i + rank, dtype=np.int32)
    f.create_dataset("enum", data=np.arange(n) % 3, dtype=h5py.enum_dtype({"RED": 0, "GREEN": 1, "BLUE": 2}, basetype="i1"))
    f["opaque"] = np.frombuffer(rng.bytes(16 * 30), dtype="V16")
    f["array_type"] = np.zeros(n, dtype=np.dtype(("<f4", (2, 3)))) + rank
    f["fixed_str"] = np.array([b"abc", b"defg"] * 10, dtype="S5")
    refs = f.create_dataset("refs", (3,), dtype=h5py.ref_dtype)
    refs[0], refs[1], refs[2] = f["f16"].ref, f["compound"].ref, f.ref
    rrefs = f.create_dataset("region_refs", (1,), dtype=h5py.regionref_dtype)
    rrefs[0] = f["f64be"].regionref[10:20]
    f.create_dataset("empty", data=h5py.Empty("f8"))
    f["scalar"] = 3.25 + rank
    _h5_time(f, n)
    _h5_quad(f, n)
    f.attrs["time_attr_like"] = np.arange(3, dtype=">i8")


def _h5_quad(f: object, n: int) -> None:
    """IEEE binary128 floats, which numpy cannot express ("Insufficient precision" in h5py)."""
    import h5py

    ft = h5py.h5t.IEEE_F64LE.copy()
    ft.set_size(16)
    ft.set_precision(128)
    ft.set_fields(127, 112, 15, 0, 112)
    ft.set_ebias(16383)
    ds = h5py.h5d.create(f.id, b"quad", ft, h5py.h5s.create_simple((n,)))  # type: ignore[attr-defined]
    ds.write(h5py.h5s.ALL, h5py.h5s.ALL, np.arange(n, dtype=np.longdouble), mtype=h5py.h5t.NATIVE_LDOUBLE)
    ds.close()


def _h5_time(f: object, n: int) -> None:
    """A dataset of HDF5's H5T_TIME class (h5py can write it only through the low-level API)."""
    import h5py

    tid = h5py.h5t.UNIX_D32LE.copy()
    ds = h5py.h5d.create(f.id, b"time", tid, h5py.h5s.create_simple((n,)))  # type: ignore[attr-defined]
    ds.write(h5py.h5s.ALL, h5py.h5s.ALL, np.arange(n, dtype="<u4") * 60, mtype=tid)
    ds.close()


def _h5_layouts(f: object, rank: int) -> None:
    import h5py

    data = np.cumsum(np.ones((64, 48)), axis=0) + rank
    f.create_dataset("chunked", data=data, chunks=(16, 16))
    f.create_dataset("gzip_shuffle", data=data, chunks=(16, 48), compression="gzip", shuffle=True)
    f.create_dataset("fletcher", data=data, chunks=(32, 48), fletcher32=True)
    f.create_dataset("scaleoffset", data=data.astype("<i4"), chunks=(32, 48), scaleoffset=0)
    f.create_dataset("partial_chunks", data=np.arange(1000.0), chunks=(300,), maxshape=(None,))
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_layout(h5py.h5d.COMPACT)
    small = np.arange(30, dtype="<i4") + rank
    ds = h5py.h5d.create(f.id, b"compact", h5py.h5t.STD_I32LE, h5py.h5s.create_simple((30,)), dcpl=dcpl)  # type: ignore[attr-defined]
    ds.write(h5py.h5s.ALL, h5py.h5s.ALL, small)
    ds.close()
    g = f.create_group("links")
    g["soft"] = h5py.SoftLink("/chunked")
    g["external"] = h5py.ExternalLink("elsewhere.h5", "/data")
    g["hard"] = f["chunked"]


def write_h5(path: str, rank: int, userblock: int = 0, libver: str | None = None) -> None:
    """One HDF5 file with every datatype class and storage layout h5py can write."""
    import h5py

    rng = np.random.default_rng(rank)
    kw = {"userblock_size": userblock} if userblock else {}
    with h5py.File(path, "w", libver=libver, **kw) as f:
        _h5_types(f, rank, rng)
        _h5_layouts(f, rank)
    if userblock:
        with open(path, "r+b") as fh:
            fh.write(b"MATLAB 7.3 MAT-file, cairn corpus".ljust(128, b" "))


def write_h5_external(folder: str, rank: int) -> list[str]:
    """A dataset whose values live in a raw file beside the HDF5 file (external storage)."""
    import h5py

    raw = f"ext-{rank}.bin"
    path = os.path.join(folder, f"external-{rank}.h5")
    cwd = os.getcwd()
    os.chdir(folder)  # external storage paths are relative to the working directory
    try:
        with h5py.File(os.path.basename(path), "w") as f:
            f.create_dataset("ext", shape=(100,), dtype="<f8", external=[(raw, 0, 800)])
            f["ext"][:] = np.arange(100.0) + rank
    finally:
        os.chdir(cwd)
    return [path, os.path.join(folder, raw)]


def write_netcdf4(path: str, rank: int, fmt: str) -> None:
    import netCDF4

    with netCDF4.Dataset(path, "w", format=fmt) as ds:
        ds.setncattr("title", f"rank {rank}")
        ds.createDimension("time", None)
        ds.createDimension("x", 40)
        t = ds.createVariable("time", "f8", ("time",))
        v = ds.createVariable("temp", "f4", ("time", "x"))
        i = ds.createVariable("count", "i2", ("x",))
        c = ds.createVariable("flag", "S1", ("x",))
        b = ds.createVariable("byte", "i1", ("x",))
        for k in range(5):
            t[k] = k * 0.5
            v[k, :] = np.sin(np.arange(40) * 0.1 + k + rank)
        i[:] = np.arange(40)
        c[:] = np.array(list("abcdefghij" * 4), dtype="S1")
        b[:] = np.arange(40) % 100
        v.units = "K"
        if not fmt.startswith("NETCDF4"):
            return
        z = ds.createVariable("zipped", "f8", ("x",), zlib=True, complevel=4)
        z[:] = np.arange(40.0) + rank
        if fmt == "NETCDF4":
            u = ds.createVariable("u64", "u8", ("x",))
            u[:] = np.arange(40, dtype="u8")
            s = ds.createVariable("names", str, ("x",))
            s[:] = np.array([f"n{k}" for k in range(40)], dtype=object)
            ct = ds.createCompoundType(np.dtype([("a", "<f8"), ("b", "<i4")]), "pair_t")
            p = ds.createVariable("pairs", ct, ("x",))
            p[:] = np.zeros(40, dtype=[("a", "<f8"), ("b", "<i4")])
            et = ds.createEnumType(np.uint8, "cloud_t", {"clear": 0, "cumulus": 1})
            e = ds.createVariable("cloud", et, ("x",), fill_value=0)
            e[:] = np.arange(40) % 2
            vt = ds.createVLType(np.int32, "ragged_t")
            r = ds.createVariable("ragged", vt, ("x",))
            for k in range(40):
                r[k] = np.arange(k % 5, dtype=np.int32)
            g = ds.createGroup("sub")
            g.createDimension("y", 3)
            g.createVariable("w", "f4", ("y",))[:] = [1.0, 2.0, 3.0]


def write_scipy_netcdf(path: str, rank: int, version: int) -> bool:
    """A netCDF classic file written by scipy.io (False if scipy is not installed)."""
    try:
        from scipy.io import netcdf_file
    except ImportError:
        return False
    with netcdf_file(path, "w", version=version) as f:
        f.history = f"rank {rank}"
        f.createDimension("t", None)
        f.createDimension("x", 30)
        t = f.createVariable("t", "i4", ("t",))
        v = f.createVariable("v", "f8", ("t", "x"))
        w = f.createVariable("w", "f4", ("x",))
        t[:] = np.arange(4)
        v[:] = np.arange(120.0).reshape(4, 30) + rank
        w[:] = np.arange(30.0)
    return True


def shipped_samples() -> list[str]:
    """HDF5/netCDF sample files shipped inside the installed packages (h5py's test data …)."""
    found: list[str] = []
    for mod in ("h5py", "netCDF4", "scipy", "tables", "xarray"):
        try:
            pkg = __import__(mod)
        except ImportError:
            continue
        root = os.path.dirname(pkg.__file__ or "")
        for ext in ("h5", "hdf5", "nc", "he5", "cdf"):
            found += glob.glob(os.path.join(root, "**", f"*.{ext}"), recursive=True)
    return sorted(p for p in found if os.path.getsize(p) < 8 << 20)


def write_corpus(folder: str, copies: int = 1, samples: bool = True) -> list[str]:
    """Writes `copies` of every kind of file into `folder`; returns the paths."""
    os.makedirs(folder, exist_ok=True)
    paths: list[str] = []
    for r in range(copies):
        for name, kw in (("h5", {}), ("h5ub", {"userblock": 512}), ("h5latest", {"libver": "latest"})):
            p = os.path.join(folder, f"{name}-{r}.h5")
            write_h5(p, r, **kw)
            paths.append(p)
        paths += write_h5_external(folder, r)
        for fmt in ("NETCDF4", "NETCDF4_CLASSIC", "NETCDF3_CLASSIC", "NETCDF3_64BIT_OFFSET"):
            p = os.path.join(folder, f"{fmt.lower()}-{r}.nc")
            write_netcdf4(p, r, fmt)
            paths.append(p)
        for version in (1, 2):
            p = os.path.join(folder, f"scipy-v{version}-{r}.nc")
            if write_scipy_netcdf(p, r, version):
                paths.append(p)
    if samples:
        for i, s in enumerate(shipped_samples()):
            p = os.path.join(folder, f"sample-{i}-{os.path.basename(s)}")
            shutil.copyfile(s, p)
            paths.append(p)
    return paths
