"""Exceptions Cairn raises: all derive from :class:`CairnError`, and each also from the built-in
that fits (``NotFoundError`` is a ``KeyError``, ``InvalidArgumentError`` a ``ValueError`` …)."""

from ._native import (
    AlreadyExistsError,
    CairnError,
    CapacityError,
    ConfigError,
    ConflictError,
    CorruptError,
    DataLossError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)

__all__ = [
    "CairnError",
    "NotFoundError",
    "AlreadyExistsError",
    "ConflictError",
    "UnavailableError",
    "CorruptError",
    "InvalidArgumentError",
    "ConfigError",
    "CapacityError",
    "DataLossError",
]
