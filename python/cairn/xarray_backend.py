"""The xarray backend: ``xr.open_dataset("out/run1", engine="cairn")``.

Every global variable becomes a data variable with a ``step`` dimension first (coordinate: the
committed step numbers, int64), except constants (``define(..., constant=True)``), which have no
step axis (a 1-D constant named like its dimension is an index coordinate); then its dimension names (``define(..., dims=...)``, else
``<name>_dim<i>``), with its attributes; the dataset's attributes are the Dataset's. A per-step
scalar variable with ``axis: "T"`` and CF time units is a ``time`` coordinate along ``step``; the
backend keeps ``step`` as the dimension (``ds.swap_dims(step="time")`` gives the layout of a
``.nc`` export, where ``time`` is the record dimension).
CF decoding is xarray's own, as for netCDF files: ``mask_and_scale`` (``_FillValue``,
``missing_value``, ``scale_factor``, ``add_offset``), ``decode_times``, ``decode_timedelta``,
``use_cftime``, ``concat_characters``, ``decode_coords``. Values are read lazily, only the boxes
indexed; ``chunks={}`` gives Dask arrays with one chunk per step and per written block. Local
(ragged, per-writer) variables are left out.

A staging dataset is opened by name with ``backend_kwargs={"cluster": "cluster.json"}``; any
``cairn.toml`` with ``backend_kwargs={"config": "cairn.toml"}``.
"""

from __future__ import annotations

import os
from typing import Any, Iterable

import numpy as np
import xarray as xr
from xarray.backends import BackendArray, BackendEntrypoint
from xarray.core import indexing

from . import cf
from ._api import Reader
from .locate import open_reader
from .step_array import StepArray
from .variable import dims_of


class CairnBackendArray(BackendArray):
    """One variable over all steps, indexed lazily (basic indexing: what a box read does)."""

    def __init__(self, array: StepArray) -> None:
        self.array = array
        self.shape = array.shape
        self.dtype = array.dtype

    def __getitem__(self, key: indexing.ExplicitIndexer) -> np.ndarray:
        return indexing.explicit_indexing_adapter(key, self.shape, indexing.IndexingSupport.BASIC, self.array.__getitem__)


class ConstantBackendArray(BackendArray):
    """A constant (step-invariant) variable, indexed lazily: no step axis."""

    def __init__(self, reader: Reader, name: str, info: Any) -> None:
        self.variable = reader[name]
        self.shape = info.shape
        self.dtype = info.dtype

    def __getitem__(self, key: indexing.ExplicitIndexer) -> np.ndarray:
        return indexing.explicit_indexing_adapter(key, self.shape, indexing.IndexingSupport.BASIC, self.variable.__getitem__)


def to_dataset(reader: Reader, drop_variables: Iterable[str] = (), **decode: Any) -> xr.Dataset:
    """The xarray Dataset of ``reader``'s global variables over its committed steps, decoded as
    ``decode`` (``xr.decode_cf``'s options) says."""
    steps = reader.steps()
    drop = set(drop_variables)
    variables = {}
    infos = {n: i for n, i in reader.variables().items() if not i.local and n not in drop}
    for name, info in infos.items():
        attrs = cf.attrs_of(name, info.dtype, info.attrs)
        if info.constant:
            # Step-invariant: no step axis (a 1-D one named like its dimension is an index coordinate).
            data = indexing.LazilyIndexedArray(ConstantBackendArray(reader, name, info))
            variables[name] = xr.Variable(dims_of(name, info), data, attrs=attrs)
            continue
        array = StepArray(reader, name, steps, info)
        dims = ("step", *dims_of(name, info))
        data = indexing.LazilyIndexedArray(CairnBackendArray(array))
        preferred = dict(zip(dims, array.chunks()))
        variables[name] = xr.Variable(dims, data, attrs=attrs, encoding={"preferred_chunks": preferred})
    step = xr.Variable(("step",), cf.check_steps(steps), attrs=cf.STEP_ATTRS)
    ds = xr.Dataset(variables, coords={"step": step}, attrs=reader.attrs)
    time = cf.time_variable(infos)
    if time is not None:
        ds = ds.set_coords(time)
    ds = xr.decode_cf(ds, **decode)
    ds.set_close(reader.close)
    return ds


class CairnBackendEntrypoint(BackendEntrypoint):
    """``engine="cairn"``: Cairn datasets (file engine folders, or staging datasets by name)."""

    description = "Open Cairn datasets (file or staging engine) in xarray"
    open_dataset_parameters = ("filename_or_obj", "drop_variables", "mask_and_scale", "decode_times", "decode_timedelta",
                               "use_cftime", "concat_characters", "decode_coords", "cluster", "config")

    def open_dataset(  # type: ignore[override]
        self,
        filename_or_obj: Any,
        *,
        drop_variables: Iterable[str] | None = None,
        mask_and_scale: bool = True,
        decode_times: bool = True,
        decode_timedelta: bool | None = None,
        use_cftime: bool | None = None,
        concat_characters: bool = True,
        decode_coords: bool | str = True,
        cluster: str | os.PathLike[str] | None = None,
        config: str | os.PathLike[str] | None = None,
    ) -> xr.Dataset:
        decode = {"mask_and_scale": mask_and_scale, "decode_times": decode_times, "decode_timedelta": decode_timedelta,
                  "use_cftime": use_cftime, "concat_characters": concat_characters, "decode_coords": decode_coords}
        return to_dataset(open_reader(filename_or_obj, cluster, config), drop_variables or (), **decode)

    def guess_can_open(self, filename_or_obj: Any) -> bool:
        try:
            return os.path.isdir(os.path.join(os.fspath(filename_or_obj), "steps"))
        except TypeError:
            return False
