"""Exceptions Cairn raises: all derive from :class:`CairnError`, and each also from the built-in
that fits (``NotFoundError`` is a ``KeyError``, ``InvalidArgumentError`` a ``ValueError`` …).

``e.code`` is the typed reason where one applies, else None: ``"step_in_flight"``,
``"lost_quorum"``, ``"stale_epoch"``, ``"released"``, ``"server_gone"``, ``"foreign_drain"``
(a drain folder holds another run's committed steps), ``"unsafe_path"`` (a symlink or another
user's entry below a drain folder)."""

from __future__ import annotations

import functools

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


# The typed reason of an error (set on instances by the native layer); None where none applies.
CairnError.code = None


class StepError(CairnError):
    """Some puts of a step could not be stored (D²T sub-transactions: each put is one), so the
    step did not commit; nothing of it is visible.

    ``failed`` maps each variable with such a put to the servers that refused or did not answer
    it (an empty list for the ``file`` engine: its disk); ``puts`` lists every failed put as
    ``(variable, offset, count, servers, message)``; ``step`` is the step. After
    :meth:`Writer.end_step` the step stays open with the puts that were stored: put the failed
    boxes again and call ``end_step()`` again, or ``abort_step()``. Leaving a ``with f.step(s):``
    block aborts it instead. When every failed put found its servers or disk full, the error is a
    :class:`CapacityError` itself, with the same ``step``, ``puts``, ``failed`` and message (catch
    ``(StepError, CapacityError)`` to retry both); when every one failed another same way, it is
    also of that class (``UnavailableError``), so code catching those keeps working.

    A step this rank ended (``end_step`` returned False: other ranks were still to end it) that
    aborted later is reported at this rank's next ``begin_step``, ``end_step`` or ``close`` (or
    by :meth:`Writer.wait_committed`) as a ``StepError`` with ``aborted`` True and ``reason``
    saying why."""

    aborted = False
    reason = ""
    step: int
    puts: list[tuple[str, tuple[int, ...], tuple[int, ...], list[int], str]]
    failed: dict[str, list[int]]

    def __init__(self, step: int, puts: list[tuple[str, tuple[int, ...], tuple[int, ...], list[int], str]]) -> None:
        super().__init__(_failed_puts(self, step, puts))


class StepsMissedWarning(UserWarning):
    """:meth:`Reader.stream` passed over steps that were committed but released before it got to
    them (``keep_last`` or ``release``, a reader that fell behind); ``steps`` lists them."""

    def __init__(self, steps: list[int]) -> None:
        self.steps = steps
        shown = ", ".join(map(str, steps[:10])) + (", ..." if len(steps) > 10 else "")
        super().__init__(f"{len(steps)} step(s) were released before this reader got to them: {shown}; "
                         f"read faster, or keep more steps (keep_last)")


def step_aborted(step: int, reason: str) -> StepError:
    """The :class:`StepError` of a step this rank ended that aborted later (``.aborted`` is
    True): another rank's end found a put gone, or another rank aborted it."""
    e = StepError.__new__(StepError)
    CairnError.__init__(e, f"step {step} aborted after this rank ended it: {reason}; nothing of it is visible. Write "
                           f"it again under a new step number, or go on without it")
    e.step, e.puts, e.failed, e.aborted, e.reason = step, [], {}, True, reason
    return e


def _failed_puts(e: Exception, step: int, puts: list[tuple[str, tuple[int, ...], tuple[int, ...], list[int], str]]) -> str:
    """Sets ``e``'s ``step``, ``puts``, ``reason`` and ``failed``; returns its message."""
    failed: dict[str, list[int]] = {}
    for var, _, _, servers, _ in puts:
        failed[var] = sorted(set(failed.get(var, [])) | set(servers))
    e.step, e.puts, e.failed, e.reason = step, puts, failed, puts[0][4] if puts else ""  # type: ignore[attr-defined]
    names = ", ".join(f"'{v}'" + (f" (servers {', '.join(map(str, s))})" if s else "") for v, s in failed.items())
    return (f"step {step} is not committed: {len(puts)} put(s) of {names} could not be stored; first: "
            f"{e.reason}. Put those boxes again and end the step, or abort it")  # type: ignore[attr-defined]


@functools.cache
def _step_error_of(kind: type) -> type:
    """A :class:`StepError` that is also a ``kind`` (e.g. a :class:`CapacityError`)."""
    return type("StepError", (StepError, kind), {"__module__": "cairn", "__doc__": StepError.__doc__})


def step_error(step: int, failed: list[tuple[str, list[int], list[int], list[int], str, str]]) -> CairnError:
    """The error of ``step``'s failed puts, as ``Writer.failed_puts`` lists them: a
    :class:`CapacityError` itself when every one found its servers or disk full, else a
    :class:`StepError`; both carry ``step``, ``puts``, ``failed`` and the same message."""
    puts = [(v, tuple(o), tuple(c), list(s), msg) for v, o, c, s, msg, _ in failed]
    kinds = {k for *_, k in failed}
    if kinds == {"CapacityError"}:
        e = CapacityError()
        e.args = (_failed_puts(e, step, puts),)
        e.aborted = False  # type: ignore[attr-defined]
        return e
    cls = _step_error_of(globals()[kinds.pop()]) if len(kinds) == 1 else StepError
    return cls(step, puts)


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
    "StepError",
    "StepsMissedWarning",
]
