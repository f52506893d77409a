"""Checks of the values the public API and the ``cairn`` command take, made where they cross into
the native layer: each returns the value as that layer takes it, or raises
:class:`InvalidArgumentError` naming the value, what is allowed and what to give instead, never
the ``TypeError``, ``OverflowError`` or ``UnicodeEncodeError`` the conversion would raise.
:func:`arg` makes an ``argparse`` type of any of them (a bad word is a usage error, exit 2).

Imports nothing beyond the exceptions, so ``cairn serve`` starts without numpy."""

from __future__ import annotations

import argparse
import math
import numbers
import operator
import os
from collections.abc import Mapping
from typing import Any, Callable

from .exceptions import CairnError, InvalidArgumentError

#: Largest rank count, writer rank and server id (32-bit in the native layer and on the wire).
U32 = 2**32 - 1
#: Largest step, extent and offset (64-bit).
U64 = 2**64 - 1
#: The most server failures a redundancy level may be (``cairn_core::corec::Policy``).
MAX_REDUNDANCY = 16


def show(value: Any) -> str:
    """``repr(value)``, cut short: messages quote what was given without quoting megabytes."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _limit(n: float) -> str:
    """``n`` as a reader knows it: ``2**64 - 1`` rather than twenty digits."""
    if isinstance(n, int) and n > 2**20 and (n + 1) & n == 0:
        return f"2**{(n + 1).bit_length() - 1} - 1"
    return f"{n:g}" if isinstance(n, float) else str(n)


def _bad(what: str, value: Any, rule: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"invalid {what} {show(value)}: {rule}")


def _as_int(value: Any) -> int | None:
    """``value`` as a plain ``int`` if it is an integer: numpy integers count, ``bool``, floats
    and strings do not."""
    try:
        return None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        return None


def integer(value: Any, what: str, lo: int = 0, hi: int = U64, rule: str | None = None) -> int:
    """``value`` as a plain ``int`` in ``lo .. hi`` (see :func:`_as_int`)."""
    n = _as_int(value)
    if n is None or not lo <= n <= hi:
        raise _bad(what, value, rule or f"use an integer from {lo} to {_limit(hi)}")
    return n


def seconds(value: Any, what: str, lo: float = 0.0, hi: float = math.inf, rule: str | None = None) -> float:
    """``value`` as a finite ``float`` of seconds in ``lo .. hi`` (any real number but ``bool``)."""
    try:
        s = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else math.nan
    except OverflowError:  # an int past the largest float
        s = math.nan
    if not (math.isfinite(s) and lo <= s <= hi):
        span = f"from {_limit(lo)} to {_limit(hi)}" if math.isfinite(hi) else f"of at least {_limit(lo)}"
        raise _bad(what, value, rule or f"use a finite number of seconds {span}")
    return s


def text(value: Any, what: str, rule: str) -> str:
    """``value`` if it is a ``str`` the native layer can take (UTF-8: no lone surrogates)."""
    if not isinstance(value, str):
        raise _bad(what, value, f"{type(value).__name__} is not text; {rule}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _bad(what, value, f"it holds the lone surrogate U+{ord(value[e.start]):04X} at position {e.start}, "
                   "which is not Unicode text (Python makes them of bytes that are not UTF-8, e.g. in file "
                   f"names); {rule}") from None
    return value


def path(value: Any, what: str) -> str:
    """A file or folder name (``str``, ``bytes`` or path-like) as UTF-8 text."""
    try:
        name = os.fsdecode(os.fspath(value))
    except TypeError:
        raise _bad(what, value, f"{type(value).__name__} is not a path; give a str or pathlib.Path") from None
    return text(name, what, "rename it, or give a path that is UTF-8 text")


def extents(value: Any, what: str, hi: int = U64) -> list[int]:
    """A box's offset, count or a shape: one integer from 0 to ``hi`` per dimension."""
    rule = f"give one integer from 0 to {_limit(hi)} per dimension, e.g. (0, 0)"
    if isinstance(value, (str, bytes, Mapping)):
        raise _bad(what, value, f"{type(value).__name__} is not a sequence; {rule}")
    try:
        items = [(n, _as_int(n)) for n in value]
    except TypeError:
        raise _bad(what, value, f"{type(value).__name__} is not a sequence; {rule}") from None
    for given, n in items:
        if n is None or not 0 <= n <= hi:
            raise _bad(what, value, f"{show(given)} is not an integer from 0 to {_limit(hi)}; give one such integer "
                       "per dimension, e.g. (0, 0)")
    return [n for _, n in items]  # type: ignore[misc]


def arg(check: Callable[[Any], Any], parse: Callable[[str], Any] = int) -> Callable[[str], Any]:
    """An ``argparse`` type: the word parsed by ``parse`` and passed through ``check``. A word that
    does not parse goes to ``check`` as it is, so its message says what to give."""

    def convert(word: str) -> Any:
        try:
            try:
                value = parse(word)
            except ValueError:
                value = word
            return check(value)
        except CairnError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return convert


def int_arg(lo: int, hi: int = U32, what: str = "number") -> Callable[[str], int]:
    """An ``argparse`` type of integers from ``lo`` to ``hi``."""
    return arg(lambda n: integer(n, what, lo, hi))


def seconds_arg(lo: float, what: str = "seconds", rule: str | None = None) -> Callable[[str], float]:
    """An ``argparse`` type of finite numbers (of seconds, unless ``rule`` says otherwise) of at least ``lo``."""
    return arg(lambda s: seconds(s, what, lo, rule=rule), float)


def output_folder(file: str | None, flag: str) -> None:
    """Refuses an output ``file`` whose folder does not exist, before any work is done."""
    if file:
        folder = os.path.dirname(os.path.abspath(file))
        if not os.path.isdir(folder):
            raise InvalidArgumentError(f"{flag} {file}: folder {folder} does not exist; create it first")
