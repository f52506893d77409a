"""Streaming readers that release what they passed (``Reader.stream(release=True)``): the reader
registers on the dataset (issue 45's backpressure, with the writers' ``define_queue``); a step is
released once every registered reader has passed it. The client crate's registration renews
itself from a heartbeat thread while the reader lives; one that dies or hangs is dropped after
the staging ``timeout``, and one that comes back (SIGCONT) is registered again at the oldest kept
step: it goes on from there, with a :class:`StepsMissedWarning` naming what was released past its
mark. The stream starts at the reader's mark, never below it, so it never yields a step another
reader may release."""

from __future__ import annotations

import weakref
from typing import Any, Callable, Iterator


def releasing(inner: Any, start: int | None, stream: Callable[[int | None], Iterator[int]],
              warn_missed: Callable[[int, int], None]) -> Iterator[int]:
    """Registers as a reader of the dataset now (at ``start``, or the oldest kept step) and
    yields ``stream(mark)`` (a reader's stream from its mark): a step is passed once the loop asks
    for the next, and released once every registered reader passed it. Steps from ``start`` up
    to the mark were released before it registered (warned of). The registration ends with the
    loop (or when the iterator is dropped)."""
    reg = inner.stream_register(start)
    at = reg.start
    if start is not None and at is not None and at > start:
        warn_missed(start, at)

    def run() -> Iterator[int]:
        try:
            for s in stream(at):
                yield s
                reg.passed(s)
        finally:
            reg.leave()

    gen = run()
    # Also when the loop never starts (its `finally` would not run): the registration ends with it.
    weakref.finalize(gen, reg.leave)
    return gen
