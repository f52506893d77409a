"""``cairn export``: a dataset's global variables, with dimension names and attributes, into Zarr v3
(zarr-python), netCDF-4 (netCDF4-python) or HDF5 (h5py), one entry per step along a ``step``
dimension, so that ``xr.open_zarr`` / ``xr.open_dataset`` of the result equals
``xr.open_dataset(DATASET, engine="cairn")``. One step of one variable is in memory at a time.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np

from ._api import Reader
from .exceptions import AlreadyExistsError, ConfigError, InvalidArgumentError
from .step_array import StepArray
from .variable import dims_of

#: The HDF5 attribute netCDF-4 gives a dimension that has no coordinate variable.
_NC_DIM_ONLY = "This is a netCDF dimension but not a netCDF variable."


@dataclass(frozen=True)
class Plan:
    """What to export: the steps, and each variable's lazy array, dims and attributes."""

    steps: list[int]
    arrays: dict[str, StepArray]
    dims: dict[str, tuple[str, ...]]
    attrs: dict[str, Any]
    skipped: list[str]


def plan(reader: Reader, steps: list[int], names: list[str] | None) -> Plan:
    """The global variables ``names`` (default: all) over ``steps``; dimension names shared by
    variables must have one length."""
    variables = reader.variables()
    unknown = sorted(set(names or ()) - set(variables))
    if unknown:
        raise InvalidArgumentError(f"--vars names {', '.join(unknown)}, not in the dataset; it has {', '.join(variables)}")
    chosen = [n for n in variables if names is None or n in names]
    arrays, dims, sizes = {}, {}, {"step": len(steps)}
    for n in chosen:
        info = variables[n]
        if info.local:
            continue
        arrays[n], dims[n] = StepArray(reader, n, steps, info), ("step", *dims_of(n, info))
        for d, size in zip(dims[n], arrays[n].shape):
            if sizes.setdefault(d, size) != size:
                raise InvalidArgumentError(f"dimension {d!r} is {sizes[d]} long in one variable but {size} in '{n}'; "
                                           "export them separately (--vars)")
    skipped = [n for n in chosen if variables[n].local]
    return Plan(steps, arrays, dims, reader.attrs, skipped)


def _flat(value: Any) -> Any:
    """An attribute value netCDF-4 and HDF5 can hold: strings, numbers, flat lists of numbers;
    anything else (booleans, None, mappings, nested lists) as JSON text."""
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return value
    if isinstance(value, list) and value and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return np.asarray(value)
    return json.dumps(value)


class Sink(Protocol):
    """A format writer: one step of one variable at a time, then ``close``."""

    def write(self, name: str, i: int, values: np.ndarray) -> None: ...

    def close(self) -> None: ...


class ZarrSink:
    """A Zarr v3 group: one array per variable chunked one step at a time, ``dimension_names``
    and attributes in its metadata, consolidated at the end."""

    def __init__(self, out: str, p: Plan) -> None:
        import zarr

        self.out = out
        self.group = zarr.open_group(out, mode="w", zarr_format=3)
        self.group.attrs.update(p.attrs)
        step = self.group.create_array("step", shape=(len(p.steps),), dtype="u8", dimension_names=["step"])
        step[:] = np.asarray(p.steps, dtype="u8")
        self.arrays = {}
        for n, a in p.arrays.items():
            fill = np.nan if a.dtype.kind in "fc" else 0
            z = self.group.create_array(n, shape=a.shape, chunks=(1, *[max(1, s) for s in a.shape[1:]]), dtype=a.dtype,
                                        dimension_names=list(p.dims[n]), fill_value=fill)
            z.attrs.update(a.info.attrs)
            self.arrays[n] = z

    def write(self, name: str, i: int, values: np.ndarray) -> None:
        self.arrays[name][i] = values

    def close(self) -> None:
        import zarr

        # Consolidated metadata is not in the Zarr v3 specification yet (zarr-python warns), but
        # xarray's open_zarr looks for it first.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            zarr.consolidate_metadata(self.out)


class NetCDFSink:
    """A netCDF-4 file: ``step`` unlimited, the other dimensions fixed, no fill values."""

    def __init__(self, out: str, p: Plan) -> None:
        import netCDF4

        bad = [n for n, a in p.arrays.items() if a.dtype.kind == "c"]
        if bad:
            raise InvalidArgumentError(f"netCDF-4 has no complex numbers ({', '.join(bad)}); export to .zarr or .h5, "
                                       "or leave them out with --vars")
        self.nc = netCDF4.Dataset(out, "w", format="NETCDF4")
        self.nc.setncatts({k: _flat(v) for k, v in p.attrs.items()})
        self.nc.createDimension("step", None)
        made = {"step"}
        for n, a in p.arrays.items():
            for d, size in zip(p.dims[n][1:], a.shape[1:]):
                if d not in made:
                    self.nc.createDimension(d, size)
                    made.add(d)
        self.nc.createVariable("step", "u8", ("step",))[:] = np.asarray(p.steps, dtype="u8")
        self.vars = {}
        for n, a in p.arrays.items():
            v = self.nc.createVariable(n, a.dtype, p.dims[n], fill_value=False)
            v.setncatts({k: _flat(x) for k, x in a.info.attrs.items()})
            self.vars[n] = v

    def write(self, name: str, i: int, values: np.ndarray) -> None:
        self.vars[name][i] = values

    def close(self) -> None:
        self.nc.close()


class H5Sink:
    """An HDF5 file netCDF-4 readers (and so xarray) understand: dimensions are HDF5 dimension
    scales, ``step`` a coordinate, the others dimensions without a variable."""

    def __init__(self, out: str, p: Plan) -> None:
        import h5py

        self.f = h5py.File(out, "w")
        self.f.attrs.update({k: _flat(v) for k, v in p.attrs.items()})
        self.f.create_dataset("step", data=np.asarray(p.steps, dtype="u8")).make_scale("step")
        self.sets = {}
        for n, a in p.arrays.items():
            for d, size in zip(p.dims[n][1:], a.shape[1:]):
                if d not in self.f:
                    self.f.create_dataset(d, shape=(size,), dtype="f4").make_scale(f"{_NC_DIM_ONLY}{size:10d}")
            chunks = (1, *a.shape[1:]) if all(a.shape) else None
            ds = self.f.create_dataset(n, shape=a.shape, dtype=a.dtype, chunks=chunks)
            ds.attrs.update({k: _flat(x) for k, x in a.info.attrs.items()})
            for axis, d in enumerate(p.dims[n]):
                ds.dims[axis].attach_scale(self.f[d])
            self.sets[n] = ds

    def write(self, name: str, i: int, values: np.ndarray) -> None:
        self.sets[name][i] = values

    def close(self) -> None:
        self.f.close()


SINKS: dict[str, Callable[[str, Plan], Sink]] = {".zarr": ZarrSink, ".nc": NetCDFSink, ".h5": H5Sink, ".hdf5": H5Sink}


def export(reader: Reader, out: str, steps: list[int], names: list[str] | None = None, *, force: bool = False,
           progress: bool | None = None) -> Plan:
    """Writes ``names`` (default: every global variable) of ``steps`` to ``out``, whose suffix
    picks the format; returns what was written. ``progress`` shows a bar (``None``: on a terminal)."""
    from tqdm import tqdm

    suffix = os.path.splitext(out.rstrip("/"))[1].lower()
    if suffix not in SINKS:
        raise InvalidArgumentError(f"-o {out}: name the output .zarr (Zarr v3), .nc (netCDF-4) or .h5 (HDF5)")
    if os.path.exists(out) and not force:
        raise AlreadyExistsError(f"{out} exists; remove it or pass --force to replace it")
    if not os.path.isdir(os.path.dirname(os.path.abspath(out))):
        raise InvalidArgumentError(f"-o {out}: folder {os.path.dirname(os.path.abspath(out))} does not exist")
    p = plan(reader, steps, names)
    if os.path.exists(out):
        shutil.rmtree(out) if os.path.isdir(out) else os.remove(out)
    try:
        sink = SINKS[suffix](out, p)
    except ImportError as e:
        raise ConfigError(f"writing {suffix} needs the Python package {e.name}: pip install {e.name} "
                          "(or cairn[xarray])") from None
    total = sum(a.dtype.itemsize * int(np.prod(a.shape)) for a in p.arrays.values())
    try:
        with tqdm(total=total, unit="B", unit_scale=True, desc=f"exporting to {os.path.basename(out)}",
                  disable=None if progress is None else not progress) as bar:
            for i in range(len(p.steps)):
                for n, a in p.arrays.items():
                    values = a[i]
                    sink.write(n, i, values)
                    bar.update(values.nbytes)
    finally:
        sink.close()
    return p
