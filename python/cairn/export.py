"""``cairn export``: a dataset's global variables, with dimension names and attributes, into Zarr v3
(zarr-python), netCDF-4 (netCDF4-python) or HDF5 (h5py), one entry per step along a record
dimension. The record dimension is ``step``, as in the xarray backend, unless a per-step time
variable is the record coordinate (``time(time)``, the default for .nc and .h5, which CDO and NCO
read as the time axis). One step of one variable is in memory at a time.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import shutil
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

import numpy as np

from . import cf
from ._api import Reader
from .exceptions import AlreadyExistsError, ConfigError, InvalidArgumentError
from .step_array import StepArray
from .variable import dims_of

#: The HDF5 attribute netCDF-4 gives a dimension that has no coordinate variable.
_NC_DIM_ONLY = "This is a netCDF dimension but not a netCDF variable."

#: Attributes naming other variables a variable uses (CF §5, §7.1–7.3): ``--vars`` keeps those, as
#: ``ncks -v`` does.
_REFERENCES = ("coordinates", "bounds", "climatology", "grid_mapping", "cell_measures", "formula_terms")

#: HDF5 refuses chunks of 4 GiB or more, Blosc buffers of 2 GiB or more: a larger step is split along
#: its slowest dimensions.
_MAX_CHUNK = 2**31

#: Steps per chunk of a record variable without other dimensions (one per chunk would be 8 bytes).
_SCALAR_CHUNK = 1024

#: ``--compress`` codecs per output suffix: codec -> (default level, lowest, highest).
CODECS: dict[str, dict[str, tuple[int, int, int]]] = {
    ".nc": {"zlib": (4, 1, 9)},
    ".h5": {"zlib": (4, 1, 9)},
    ".hdf5": {"zlib": (4, 1, 9)},
    ".zarr": {"zstd": (3, 1, 22), "blosc:zstd": (5, 1, 9)},
}


@dataclass(frozen=True)
class Compression:
    """What ``--compress`` asked for: ``codec`` (``none``, ``zlib``, ``zstd``, ``blosc:zstd``) at ``level``."""

    codec: str
    level: int = 0


def parse_compress(text: str | None, suffix: str) -> Compression | None:
    """``--compress`` for an output named ``*suffix``: ``none``, ``zlib[:LEVEL]`` (.nc, .h5),
    ``zstd[:LEVEL]`` or ``blosc:zstd[:LEVEL]`` (.zarr); ``None`` when not given."""
    if text is None:
        return None
    t = text.strip().lower()
    if t == "none":
        return Compression("none")
    defaults = {c: v[0] for codecs in CODECS.values() for c, v in codecs.items()}
    name, _, lvl = t.rpartition(":")
    if name in defaults:
        try:
            level: int | None = int(lvl)
        except ValueError:
            raise InvalidArgumentError(f"--compress {text}: the level {lvl!r} is not a whole number; "
                                       f"e.g. {name}:{defaults[name]}") from None
    else:
        name, level = t, None
    usage = "zlib[:LEVEL] for .nc and .h5, zstd[:LEVEL] or blosc:zstd[:LEVEL] for .zarr, or none"
    if name not in defaults:
        raise InvalidArgumentError(f"--compress {text}: unknown codec {name!r}; give {usage}")
    offered = CODECS[suffix]
    if name not in offered:
        fits = " or ".join(f"{c}[:LEVEL]" for c in offered)
        raise InvalidArgumentError(f"--compress {text}: {name} does not apply to a {suffix} output; a {suffix} takes {fits}")
    default, lo, hi = offered[name]
    if level is None:
        level = default
    if not lo <= level <= hi:
        raise InvalidArgumentError(f"--compress {text}: level {level} is out of range; {name} takes {lo} to {hi} "
                                   f"(default {default})")
    return Compression(name, level)


def record_chunks(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """Chunks of a record variable of ``shape`` (record axis first): one step per chunk, split
    along the slowest dimensions below HDF5's limit; 1-D ones (``time``) many steps per chunk."""
    if len(shape) == 1:
        return (max(1, min(shape[0], _SCALAR_CHUNK)),)
    chunks = [1, *(max(1, s) for s in shape[1:])]
    for d in range(1, len(chunks)):
        while chunks[d] > 1 and int(np.prod(chunks)) * itemsize >= _MAX_CHUNK:
            chunks[d] = (chunks[d] + 1) // 2
    return tuple(chunks)


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
    #: The record (unlimited) dimension: ``step``, or the time variable's name when it is the
    #: record coordinate (``step`` is then an auxiliary coordinate along it).
    record: str = "step"
    #: Variables ``--vars`` did not name but the named ones use as coordinates.
    added: list[str] = field(default_factory=list)


def used(variables: Mapping[str, Any], names: list[str], time: str | None) -> set[str]:
    """``names`` and, transitively, the variables they use as coordinates: those named like one of
    their dimensions, the time variable (for a per-step variable), and those their CF attributes
    (``coordinates``, ``bounds``, ...) name."""
    out: set[str] = set()
    todo = list(names)
    while todo:
        n = todo.pop()
        if n in out or n not in variables:
            continue
        out.add(n)
        info = variables[n]
        if info.local:
            continue
        refs = list(dims_of(n, info))
        if time is not None and not info.constant:
            refs.append(time)
        for key in _REFERENCES:
            value = info.attrs.get(key)
            if isinstance(value, str):
                refs += [t for t in value.split() if not t.endswith(":")]
        todo += refs
    return out


def plan(reader: Reader, steps: list[int], names: list[str] | None, source: str = "", record: str | None = "step") -> Plan:
    """The global variables ``names`` (default: all) over ``steps``, with the coordinates they use;
    dimension names shared by variables must have one length. ``record``: ``"step"`` (``step`` the
    record dimension, the time variable an auxiliary coordinate along it), ``"time"`` (the time
    variable the record coordinate, ``step`` an auxiliary one) or ``None`` (``"time"`` when there
    is a time variable, else ``"step"``)."""
    variables = reader.variables()
    unknown = sorted(set(names or ()) - set(variables))
    if unknown:
        raise InvalidArgumentError(f"--vars names {', '.join(unknown)}, not in the dataset; it has {', '.join(variables)}")
    if record not in (None, "step", "time"):
        raise InvalidArgumentError(f"--record-dim {record}: give step or time")
    cf.check_steps(steps)
    per_step = {n: i for n, i in variables.items() if not i.local and not i.constant}
    wanted = None if names is None else used(variables, names, cf.time_variable(per_step))
    chosen = [n for n in variables if wanted is None or n in wanted]
    time = cf.time_variable({n: per_step[n] for n in chosen if n in per_step})
    if record == "time" and time is None:
        raise InvalidArgumentError("--record-dim time: no exported variable is a time (a per-step scalar with axis: \"T\" "
                                   "and units like \"days since 2000-01-01\"); define one, or export with --record-dim step")
    record = time if record != "step" and time is not None else "step"
    arrays, dims, sizes, var_attrs = {}, {}, {record: len(steps)}, {}
    constants: dict[str, np.ndarray] = {}
    for n in chosen:
        info = variables[n]
        if info.local:
            continue
        if record != "step" and record in dims_of(n, info):
            raise InvalidArgumentError(f"'{n}' has a dimension named {record!r}, the record dimension of this export; "
                                       "export with --record-dim step, or leave it out (--vars)")
        var_attrs[n] = cf.attrs_of(n, info.dtype, info.attrs)
        if info.constant:
            constants[n], dims[n] = reader.get(n), dims_of(n, info)
            shape = constants[n].shape
        else:
            arrays[n], dims[n] = StepArray(reader, n, steps, info), (record, *dims_of(n, info))
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
    if record != "step":
        _check_increasing(record, arrays[record][:], steps)
    attrs = dict(reader.attrs)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    line = f"{stamp} cairn export {source}".rstrip()
    attrs["history"] = f"{attrs['history']}\n{line}" if isinstance(attrs.get("history"), str) else line
    attrs.setdefault("Conventions", cf.CONVENTIONS)
    if time is not None and time in var_attrs:  # CF checkers want the time coordinate named as such, not only its axis
        var_attrs[time].setdefault("standard_name", "time")
    # The auxiliary coordinate along the record dimension: time along step, or step along time.
    aux = "step" if record != "step" else time
    if aux is not None:
        for n in arrays:
            if n != time:
                coords = str(var_attrs[n].get("coordinates", "")).split()
                var_attrs[n]["coordinates"] = " ".join(coords if aux in coords else [*coords, aux])
    added = [n for n in chosen if names is not None and n not in names and n not in skipped]
    return Plan(steps, arrays, dims, attrs, skipped, var_attrs, time, constants, record, added)


def _check_increasing(name: str, values: np.ndarray, steps: list[int]) -> None:
    """A record coordinate's values increase from step to step (CF §5), and none is missing."""
    if values.dtype.kind in "fc" and np.isnan(values).any():
        s = steps[int(np.flatnonzero(np.isnan(values))[0])]
        raise InvalidArgumentError(f"'{name}' is missing in step {s}, so it cannot be the record coordinate; export the "
                                   "steps that have it (--steps) or keep step as the record dimension (--record-dim step)")
    bad = np.flatnonzero(np.diff(values) <= 0)
    if bad.size:
        i = int(bad[0])
        raise InvalidArgumentError(f"'{name}' is {values[i]} in step {steps[i]} and {values[i + 1]} in step {steps[i + 1]}: "
                                   "a record coordinate must increase from step to step; export the steps where it does "
                                   "(--steps) or keep step as the record dimension (--record-dim step)")


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
    writes it), consolidated at the end. Compressed as zarr-python does by default (zstd) unless
    ``compression`` says otherwise."""

    def __init__(self, out: str, p: Plan, compression: Compression | None = None) -> None:
        import zarr

        self.out = out
        self.codecs = _zarr_compressors(compression)
        self.group = zarr.open_group(out, mode="w", zarr_format=3)
        self.group.attrs.update({k: _json(v) for k, v in p.attrs.items()})
        step = self.group.create_array("step", shape=(len(p.steps),), dtype="i8", dimension_names=[p.record],
                                       fill_value=None, **self.codecs)
        step[:] = cf.check_steps(p.steps)
        step.attrs.update(cf.STEP_ATTRS)
        for n, values in p.constants.items():
            self._array(n, values.shape, values.dtype, None, p)[...] = values
        self.arrays = {n: self._array(n, a.shape, a.dtype, record_chunks(a.shape, a.dtype.itemsize), p)
                       for n, a in p.arrays.items()}

    def _array(self, n: str, shape: tuple[int, ...], dtype: np.dtype, chunks: tuple[int, ...] | None, p: Plan) -> Any:
        attrs = dict(p.var_attrs[n])
        fill = attrs.pop("_FillValue", None)
        z = self.group.create_array(n, shape=shape, dtype=dtype, dimension_names=list(p.dims[n]), fill_value=fill,
                                    chunks=chunks or "auto", **self.codecs)
        if fill is not None:
            attrs["_FillValue"] = _zarr_fill(fill)
        z.attrs.update({k: _json(v) for k, v in attrs.items()})
        return z

    def write(self, name: str, i: int, values: np.ndarray) -> None:
        self.arrays[name][i] = values

    def close(self) -> None:
        import zarr

        # Consolidated metadata is not in the Zarr v3 specification yet (zarr-python warns), but
        # xarray's open_zarr looks for it first.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            zarr.consolidate_metadata(self.out)


def _zarr_compressors(c: Compression | None) -> dict[str, Any]:
    """``create_array``'s ``compressors`` for ``c`` (nothing: zarr-python's default)."""
    from zarr.codecs import BloscCodec, ZstdCodec

    if c is None:
        return {}
    if c.codec == "none":
        return {"compressors": None}
    if c.codec == "zstd":
        return {"compressors": [ZstdCodec(level=c.level)]}
    return {"compressors": [BloscCodec(cname="zstd", clevel=c.level)]}


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


def _deflate(c: Compression | None, shape: tuple[int, ...]) -> bool:
    """Whether zlib applies to a variable of ``shape``: asked for, and it has values to chunk."""
    return c is not None and c.codec == "zlib" and len(shape) > 0 and all(shape)


class NetCDFSink:
    """A netCDF-4 file: the record dimension unlimited, the other dimensions fixed, record
    variables chunked one step per chunk, a variable's fill value only where its attributes give
    one (in its type); zlib with the shuffle filter when ``compression`` asks."""

    def __init__(self, out: str, p: Plan, compression: Compression | None = None) -> None:
        import netCDF4

        bad = [n for n, a in p.arrays.items() if a.dtype.kind == "c"]
        if bad:
            raise InvalidArgumentError(f"netCDF-4 has no complex numbers ({', '.join(bad)}); export to .zarr or .h5, "
                                       "or leave them out with --vars")
        self.compression = compression
        self.nc = netCDF4.Dataset(out, "w", format="NETCDF4")
        self.nc.setncatts({k: _flat(v) for k, v in p.attrs.items()})
        self.nc.createDimension(p.record, None)
        made = {p.record}
        shapes = {**{n: a.shape[1:] for n, a in p.arrays.items()}, **{n: v.shape for n, v in p.constants.items()}}
        for n, shape in shapes.items():
            for d, size in zip(p.dims[n][-len(shape):] if shape else (), shape):
                if d not in made:
                    self.nc.createDimension(d, size)
                    made.add(d)
        self.vars = {}
        if p.record != "step":
            a = p.arrays[p.record]
            self.vars[p.record] = self._variable(p.record, a.dtype, a.shape, p, record_chunks(a.shape, a.dtype.itemsize))
        # CF-1.8 (§2.2) has no 64-bit integers: int32 while the steps fit, as they nearly always do.
        steps = cf.check_steps(p.steps)
        narrow = steps.size == 0 or int(steps.max()) < 2**31
        step = self.nc.createVariable("step", "i4" if narrow else "i8", (p.record,))
        step.setncatts(cf.STEP_ATTRS)
        step[:] = steps
        for n, values in p.constants.items():
            self._variable(n, values.dtype, values.shape, p)[...] = values
        for n, a in p.arrays.items():
            if n not in self.vars:
                self.vars[n] = self._variable(n, a.dtype, a.shape, p, record_chunks(a.shape, a.dtype.itemsize))

    def _variable(self, n: str, dtype: np.dtype, shape: tuple[int, ...], p: Plan, chunks: tuple[int, ...] | None = None) -> Any:
        """Variable ``n``, its fill value (if its attributes give one) and its other attributes."""
        attrs = dict(p.var_attrs[n])
        fill = attrs.pop("_FillValue", False)
        opts: dict[str, Any] = {"chunksizes": chunks} if chunks else {}
        if _deflate(self.compression, shape):
            opts.update(compression="zlib", complevel=self.compression.level, shuffle=True)  # type: ignore[union-attr]
        v = _named(n, lambda: self.nc.createVariable(n, dtype, p.dims[n], fill_value=fill, **opts))
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
    as they read a ``.nc``: dimensions are HDF5 dimension scales, the record dimension unlimited
    (``step``, int32 while the steps fit as in a ``.nc``, or the time variable with ``step`` along it), the others dimensions without
    a variable; string attributes fixed-length ASCII (netCDF's char), ``_FillValue`` in the
    variable's type; a variable named like one of its dimensions but not its coordinate
    (``x(step, x)``) is stored as netCDF-4 stores it, ``_nc4_non_coord_x``. Record variables are
    chunked one step per chunk; gzip with the shuffle filter (netCDF's zlib) when ``compression``
    asks."""

    def __init__(self, out: str, p: Plan, compression: Compression | None = None) -> None:
        import h5py

        self.compression = compression
        self.f = h5py.File(out, "w", track_order=True)
        _h5_attrs(self.f.attrs, p.attrs)
        self.sets = {}
        if p.record != "step":
            a = p.arrays[p.record]
            self.sets[p.record] = self._dataset(p.record, p.record, a.shape, a.dtype, p, record=True)
            self.sets[p.record].make_scale(p.record)
        steps = cf.check_steps(p.steps)
        if steps.size == 0 or int(steps.max()) < 2**31:  # as in .nc: CF-1.8 has no 64-bit integers
            steps = steps.astype("i4")
        step = self.f.create_dataset("step", data=steps, maxshape=(None,), chunks=record_chunks(steps.shape, steps.itemsize))
        _h5_attrs(step.attrs, cf.STEP_ATTRS)
        if p.record == "step":
            step.make_scale("step")
        else:
            step.dims[0].attach_scale(self.f[p.record])
        # Constants first, coordinates (1-D, named like their dimension: its scale) before the
        # others that use their dimension.
        for n in sorted(p.constants, key=lambda n: p.dims[n] != (n,)):
            values, coord = p.constants[n], p.dims[n] == (n,)
            if not coord:
                for d, size in zip(p.dims[n], values.shape):
                    self._dimension(d, size)
            stored = n if coord or n not in self.f else f"_nc4_non_coord_{n}"
            ds = self._dataset(n, stored, values.shape, values.dtype, p, data=values)
            if coord:
                ds.make_scale(n)
            else:
                for axis, d in enumerate(p.dims[n]):
                    ds.dims[axis].attach_scale(self.f[d])
        for n, a in p.arrays.items():
            if n in self.sets:
                continue
            for d, size in zip(p.dims[n][1:], a.shape[1:]):
                self._dimension(d, size)
            stored = f"_nc4_non_coord_{n}" if n in p.dims[n] or n in self.f else n
            ds = self._dataset(n, stored, a.shape, a.dtype, p, record=True)
            for axis, d in enumerate(p.dims[n]):
                ds.dims[axis].attach_scale(self.f[d])
            self.sets[n] = ds

    def _dataset(self, n: str, stored: str, shape: tuple[int, ...], dtype: np.dtype, p: Plan, *, record: bool = False,
                 data: np.ndarray | None = None) -> Any:
        """Variable ``n`` as dataset ``stored`` with its fill value and attributes; a record
        variable chunked and resizable along its first axis."""
        attrs = dict(p.var_attrs[n])
        fill = attrs.pop("_FillValue", None)
        opts: dict[str, Any] = {"fillvalue": fill}
        if record and all(shape):
            opts.update(chunks=record_chunks(shape, dtype.itemsize), maxshape=(None, *shape[1:]))
        if _deflate(self.compression, shape):
            opts.update(compression="gzip", compression_opts=self.compression.level, shuffle=True)  # type: ignore[union-attr]
        ds = _named(n, lambda: self.f.create_dataset(stored, shape=shape, dtype=dtype, data=data, **opts))
        if fill is not None:
            ds.attrs.create("_FillValue", np.asarray(fill, dtype=dtype).reshape(1))
        _h5_attrs(ds.attrs, attrs)
        return ds

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


SINKS: dict[str, Callable[[str, Plan, Compression | None], Sink]] = {".zarr": ZarrSink, ".nc": NetCDFSink, ".h5": H5Sink,
                                                                      ".hdf5": H5Sink}


def export(reader: Reader, out: str, steps: list[int], names: list[str] | None = None, *, force: bool = False,
           progress: bool | None = None, source: str = "", record_dim: str | None = None,
           compress: str | None = None) -> Plan:
    """Writes ``names`` (default: every global variable) of ``steps``, with the coordinates they
    use, to ``out``, whose suffix picks the format; returns what was written. ``record_dim``:
    ``"step"`` or ``"time"`` (see :func:`plan`); ``None``: ``"time"`` for .nc and .h5 when there is
    a time variable, ``"step"`` otherwise and for .zarr (as the xarray backend). ``compress``:
    ``--compress``'s text (:func:`parse_compress`). The file is written under a temporary name next
    to ``out`` and renamed at the end: an error leaves nothing behind. ``progress`` shows a bar
    (``None``: on a terminal)."""
    from tqdm import tqdm

    out = out.rstrip("/")
    suffix = os.path.splitext(out)[1].lower()
    if suffix not in SINKS:
        raise InvalidArgumentError(f"-o {out}: name the output .zarr (Zarr v3), .nc (netCDF-4) or .h5 (HDF5)")
    compression = parse_compress(compress, suffix)
    if os.path.exists(out) and not force:
        raise AlreadyExistsError(f"{out} exists; remove it or pass --force to replace it")
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise InvalidArgumentError(f"-o {out}: folder {folder} does not exist")
    p = plan(reader, steps, names, source, record_dim if record_dim is not None or suffix != ".zarr" else "step")
    tmp = os.path.join(folder, f".{os.path.basename(out)}.tmp-{os.getpid()}")
    _remove(tmp)
    try:
        try:
            sink = SINKS[suffix](tmp, p, compression)
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
