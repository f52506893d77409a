"""``cairn export``: a dataset's global variables, with dimension names and attributes, into Zarr v3
(zarr-python), netCDF-4 (netCDF4-python) or HDF5 (h5py), one entry per step along a ``step``
dimension, so that ``xr.open_zarr`` / ``xr.open_dataset`` of the result equals
``xr.open_dataset(DATASET, engine="cairn")``. One step of one variable is in memory at a time.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import shutil
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np

from . import cf
from ._api import Reader
from .exceptions import AlreadyExistsError, ConfigError, InvalidArgumentError
from .step_array import StepArray
from .variable import dims_of

#: The HDF5 attribute netCDF-4 gives a dimension that has no coordinate variable.
_NC_DIM_ONLY = "This is a netCDF dimension but not a netCDF variable."


@dataclass(frozen=True)
class Plan:
    """What to export: the steps, and each variable's lazy array, dims and attributes (typed:
    ``_FillValue`` and the like in the variable's type), the dataset's attributes (with
    ``Conventions`` and a ``history`` line), and the variable that is the ``time`` coordinate."""

    steps: list[int]
    arrays: dict[str, StepArray]
    dims: dict[str, tuple[str, ...]]
    attrs: dict[str, Any]
    skipped: list[str]
    var_attrs: dict[str, dict[str, Any]]
    time: str | None = None
    #: Constant (step-invariant) variables: their values, exported without the step axis.
    constants: dict[str, np.ndarray] = field(default_factory=dict)


def plan(reader: Reader, steps: list[int], names: list[str] | None, source: str = "") -> Plan:
    """The global variables ``names`` (default: all) over ``steps``; dimension names shared by
    variables must have one length."""
    variables = reader.variables()
    unknown = sorted(set(names or ()) - set(variables))
    if unknown:
        raise InvalidArgumentError(f"--vars names {', '.join(unknown)}, not in the dataset; it has {', '.join(variables)}")
    cf.check_steps(steps)
    chosen = [n for n in variables if names is None or n in names]
    arrays, dims, sizes, var_attrs = {}, {}, {"step": len(steps)}, {}
    constants: dict[str, np.ndarray] = {}
    for n in chosen:
        info = variables[n]
        if info.local:
            continue
        var_attrs[n] = cf.attrs_of(n, info.dtype, info.attrs)
        if info.constant:
            constants[n], dims[n] = reader.get(n), dims_of(n, info)
            shape = constants[n].shape
        else:
            arrays[n], dims[n] = StepArray(reader, n, steps, info), ("step", *dims_of(n, info))
            shape = arrays[n].shape
        for d, size in zip(dims[n], shape):
            if sizes.setdefault(d, size) != size:
                raise InvalidArgumentError(f"dimension {d!r} is {sizes[d]} long in one variable but {size} in '{n}'; "
                                           "export them separately (--vars)")
    skipped = [n for n in chosen if variables[n].local]
    if not arrays and not constants:
        what = f"only local (per-writer, ragged) variables: {', '.join(skipped)}" if skipped else "no global variable"
        raise InvalidArgumentError(f"nothing to export: the selection has {what}; netCDF, HDF5 and Zarr hold arrays "
                                   "of one shape (read local variables with `cairn get --writer`)")
    time = cf.time_variable({n: variables[n] for n in arrays})
    attrs = dict(reader.attrs)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    line = f"{stamp} cairn export {source}".rstrip()
    attrs["history"] = f"{attrs['history']}\n{line}" if isinstance(attrs.get("history"), str) else line
    attrs.setdefault("Conventions", cf.CONVENTIONS)
    if time is not None:
        for n in arrays:
            if n != time:
                var_attrs[n].setdefault("coordinates", time)
    return Plan(steps, arrays, dims, attrs, skipped, var_attrs, time, constants)


def _flat(value: Any) -> Any:
    """An attribute value netCDF-4 and HDF5 can hold: strings, numbers, flat lists of numbers,
    typed numpy values; anything else (booleans, None, mappings, nested lists) as JSON text."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value
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
    and attributes in its metadata (a ``_FillValue`` becomes the array's fill value, as xarray
    writes it), consolidated at the end."""

    def __init__(self, out: str, p: Plan) -> None:
        import zarr

        self.out = out
        self.group = zarr.open_group(out, mode="w", zarr_format=3)
        self.group.attrs.update({k: _json(v) for k, v in p.attrs.items()})
        step = self.group.create_array("step", shape=(len(p.steps),), dtype="i8", dimension_names=["step"], fill_value=None)
        step[:] = cf.check_steps(p.steps)
        step.attrs.update(cf.STEP_ATTRS)
        for n, values in p.constants.items():
            attrs = dict(p.var_attrs[n])
            fill = attrs.pop("_FillValue", None)
            z = self.group.create_array(n, shape=values.shape, dtype=values.dtype, dimension_names=list(p.dims[n]), fill_value=fill)
            if fill is not None:
                attrs["_FillValue"] = _zarr_fill(fill)
            z.attrs.update({k: _json(v) for k, v in attrs.items()})
            z[...] = values
        self.arrays = {}
        for n, a in p.arrays.items():
            attrs = dict(p.var_attrs[n])
            fill = attrs.pop("_FillValue", None)
            z = self.group.create_array(n, shape=a.shape, chunks=(1, *[max(1, s) for s in a.shape[1:]]), dtype=a.dtype,
                                        dimension_names=list(p.dims[n]), fill_value=fill)
            if fill is not None:
                attrs["_FillValue"] = _zarr_fill(fill)
            z.attrs.update({k: _json(v) for k, v in attrs.items()})
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


def _zarr_fill(fill: Any) -> Any:
    """A ``_FillValue`` attribute as xarray writes and reads it in Zarr: floats as the base64 of
    their float64 bytes (so NaN and infinities survive JSON), integers as numbers."""
    v = np.asarray(fill)
    if v.dtype.kind in "fc":
        return base64.b64encode(np.asarray(v, dtype="<f8").tobytes()).decode()
    return v.item()


def _json(value: Any) -> Any:
    """An attribute value as JSON holds it (numpy values as Python numbers and lists)."""
    if isinstance(value, (np.ndarray, np.generic)):
        v = value.tolist()
        return None if isinstance(v, float) and np.isnan(v) else v
    return value


class NetCDFSink:
    """A netCDF-4 file: ``step`` unlimited, the other dimensions fixed, a variable's fill value
    only where its attributes give one (in its type)."""

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
        shapes = {**{n: a.shape[1:] for n, a in p.arrays.items()}, **{n: v.shape for n, v in p.constants.items()}}
        for n, shape in shapes.items():
            for d, size in zip(p.dims[n][-len(shape):] if shape else (), shape):
                if d not in made:
                    self.nc.createDimension(d, size)
                    made.add(d)
        # CF-1.8 (§2.2) has no 64-bit integers: int32 while the steps fit, as they nearly always do.
        steps = cf.check_steps(p.steps)
        narrow = steps.size == 0 or int(steps.max()) < 2**31
        step = self.nc.createVariable("step", "i4" if narrow else "i8", ("step",))
        step.setncatts(cf.STEP_ATTRS)
        step[:] = steps
        for n, values in p.constants.items():
            self._variable(n, values.dtype, p)[...] = values
        self.vars = {n: self._variable(n, a.dtype, p) for n, a in p.arrays.items()}

    def _variable(self, n: str, dtype: np.dtype, p: Plan) -> Any:
        """Variable ``n``, its fill value (if its attributes give one) and its other attributes."""
        attrs = dict(p.var_attrs[n])
        fill = attrs.pop("_FillValue", False)
        v = _named(n, lambda: self.nc.createVariable(n, dtype, p.dims[n], fill_value=fill))
        _named(n, lambda: v.setncatts({k: _flat(x) for k, x in attrs.items()}))
        # The values are stored as they are: not packed again by scale_factor/add_offset.
        v.set_auto_maskandscale(False)
        return v

    def write(self, name: str, i: int, values: np.ndarray) -> None:
        self.vars[name][i] = values

    def close(self) -> None:
        self.nc.close()


class H5Sink:
    """An HDF5 file laid out as netCDF-4 lays out its own, so netCDF readers (and xarray) read it
    as they read a ``.nc``: dimensions are HDF5 dimension scales, ``step`` an unlimited int64
    coordinate, the others dimensions without a variable; string attributes fixed-length ASCII
    (netCDF's char), ``_FillValue`` in the variable's type; a variable named like one of its
    dimensions but not its coordinate (``x(step, x)``) is stored as netCDF-4 stores it,
    ``_nc4_non_coord_x``."""

    def __init__(self, out: str, p: Plan) -> None:
        import h5py

        self.f = h5py.File(out, "w", track_order=True)
        _h5_attrs(self.f.attrs, p.attrs)
        step = self.f.create_dataset("step", data=cf.check_steps(p.steps), maxshape=(None,), chunks=(max(1, min(len(p.steps), 1024)),))
        step.make_scale("step")
        _h5_attrs(step.attrs, cf.STEP_ATTRS)
        # Constants first: a 1-D one named like its dimension is that dimension's scale.
        for n, values in p.constants.items():
            attrs = dict(p.var_attrs[n])
            fill = attrs.pop("_FillValue", None)
            coord = p.dims[n] == (n,)
            if not coord:
                for d, size in zip(p.dims[n], values.shape):
                    self._dimension(d, size)
            stored = n if coord or n not in self.f else f"_nc4_non_coord_{n}"
            ds = _named(n, lambda: self.f.create_dataset(stored, data=values, fillvalue=fill))
            if coord:
                ds.make_scale(n)
            if fill is not None:
                ds.attrs.create("_FillValue", np.asarray(fill, dtype=values.dtype).reshape(1))
            _h5_attrs(ds.attrs, attrs)
            if not coord:
                for axis, d in enumerate(p.dims[n]):
                    ds.dims[axis].attach_scale(self.f[d])
        self.sets = {}
        for n, a in p.arrays.items():
            for d, size in zip(p.dims[n][1:], a.shape[1:]):
                self._dimension(d, size)
            stored = f"_nc4_non_coord_{n}" if n in p.dims[n] or n in self.f else n
            attrs = dict(p.var_attrs[n])
            fill = attrs.pop("_FillValue", None)
            chunks = (1, *a.shape[1:]) if all(a.shape[1:]) and a.shape[0] else None
            ds = _named(n, lambda: self.f.create_dataset(stored, shape=a.shape, dtype=a.dtype, chunks=chunks,
                                                         maxshape=(None, *a.shape[1:]) if chunks else None, fillvalue=fill))
            if fill is not None:
                ds.attrs.create("_FillValue", np.asarray(fill, dtype=a.dtype).reshape(1))
            _h5_attrs(ds.attrs, attrs)
            for axis, d in enumerate(p.dims[n]):
                ds.dims[axis].attach_scale(self.f[d])
            self.sets[n] = ds

    def _dimension(self, d: str, size: int) -> None:
        """Dimension ``d`` as netCDF-4 makes one without a variable, unless it exists."""
        if d not in self.f:
            self.f.create_dataset(d, shape=(size,), dtype="f4").make_scale(f"{_NC_DIM_ONLY}{size:10d}")

    def write(self, name: str, i: int, values: np.ndarray) -> None:
        self.sets[name][i] = values

    def close(self) -> None:
        self.f.close()


def _h5_attrs(target: Any, attrs: dict[str, Any]) -> None:
    """Attributes as netCDF-4 writes them: text as fixed-length strings (netCDF's char), numbers
    as 1-element arrays."""
    for k, v in attrs.items():
        v = _flat(v)
        if isinstance(v, str):
            target.create(k, np.bytes_(v.encode()))
        else:
            target.create(k, np.atleast_1d(np.asarray(v)))


def _named(name: str, make: Callable[[], Any]) -> Any:
    """``make()``, with a format library's error as one line naming the variable."""
    try:
        return make()
    except (ValueError, TypeError, RuntimeError, KeyError, OSError) as e:
        raise InvalidArgumentError(f"variable '{name}': {str(e).strip() or type(e).__name__}") from None


SINKS: dict[str, Callable[[str, Plan], Sink]] = {".zarr": ZarrSink, ".nc": NetCDFSink, ".h5": H5Sink, ".hdf5": H5Sink}


def export(reader: Reader, out: str, steps: list[int], names: list[str] | None = None, *, force: bool = False,
           progress: bool | None = None, source: str = "") -> Plan:
    """Writes ``names`` (default: every global variable) of ``steps`` to ``out``, whose suffix
    picks the format; returns what was written. The file is written under a temporary name next
    to ``out`` and renamed at the end: an error leaves nothing behind. ``progress`` shows a bar
    (``None``: on a terminal)."""
    from tqdm import tqdm

    out = out.rstrip("/")
    suffix = os.path.splitext(out)[1].lower()
    if suffix not in SINKS:
        raise InvalidArgumentError(f"-o {out}: name the output .zarr (Zarr v3), .nc (netCDF-4) or .h5 (HDF5)")
    if os.path.exists(out) and not force:
        raise AlreadyExistsError(f"{out} exists; remove it or pass --force to replace it")
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise InvalidArgumentError(f"-o {out}: folder {folder} does not exist")
    p = plan(reader, steps, names, source)
    tmp = os.path.join(folder, f".{os.path.basename(out)}.tmp-{os.getpid()}")
    _remove(tmp)
    try:
        try:
            sink = SINKS[suffix](tmp, p)
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
                        _named(n, lambda: sink.write(n, i, values))
                        bar.update(values.nbytes)
        finally:
            sink.close()
        _remove(out)
        os.replace(tmp, out)
    except BaseException:
        _remove(tmp)
        raise
    return p


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)
