"""Attributes of variables and datasets: JSON-serialisable values (numpy scalars and arrays become
numbers and lists) that cross into Rust as JSON text, and the writer's ``attrs`` mapping."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, Callable

import numpy as np

from ._check import text
from .exceptions import InvalidArgumentError


def _plain(value: Any) -> Any:
    """``value`` with numpy scalars and arrays turned into Python numbers and lists."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def to_json(attrs: Mapping[str, Any], owner: str) -> str:
    """``attrs`` of ``owner`` as a JSON object, or :class:`InvalidArgumentError` saying which value
    cannot be stored."""
    if not isinstance(attrs, Mapping):
        raise InvalidArgumentError(f"attributes of {owner} must be a mapping of names to values, not {type(attrs).__name__}")
    for k, v in attrs.items():
        text(k, f"attribute name of {owner}", "names are strings of UTF-8 text")
        try:
            # Encoded too: text with a lone surrogate is refused here, naming the attribute.
            json.dumps(v, default=_plain, allow_nan=False, ensure_ascii=False).encode("utf-8")
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError(f"attribute {k!r} of {owner} = {v!r} cannot be stored ({e}); use numbers, strings, "
                                       "booleans, None, lists, dicts or numpy scalars/arrays of finite values") from None
    return json.dumps(dict(attrs), default=_plain, allow_nan=False)


def from_json(text: str) -> dict[str, Any]:
    """Attributes read back: JSON numbers, strings, booleans, lists and objects."""
    return json.loads(text)


class DatasetAttrs(MutableMapping[str, Any]):
    """A writer's dataset attributes: a dict whose every change is handed to ``push`` (checked and
    kept by the native writer, and published with every step it ends from then on)."""

    def __init__(self, current: dict[str, Any], push: Callable[[str], None]) -> None:
        self._data = current
        self._push = push

    def _set(self, data: dict[str, Any]) -> None:
        text = to_json(data, "the dataset")
        self._push(text)
        self._data = from_json(text)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._set({**self._data, key: value})

    def __delitem__(self, key: str) -> None:
        data = dict(self._data)
        del data[key]
        self._set(data)

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"DatasetAttrs({self._data!r})"
