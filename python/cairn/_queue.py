"""Streaming readers that release what they passed (``Reader.stream(release=True)``): the reader
registers on the dataset (issue 45's backpressure, with the writers' ``define_queue``); a step is
released once every registered reader has passed it. A heartbeat renews the registration while
the reader lives; one that dies or hangs is dropped after the staging ``timeout``, and one that
comes back (SIGCONT) is registered again at the oldest kept step: it goes on from there, with a
:class:`StepsMissedWarning` naming what was released past its mark. The stream starts at the
reader's mark, never below it, so it never yields a step another reader may release."""

from __future__ import annotations

import threading
import uuid
import weakref
from typing import Any, Callable, Iterator

from .exceptions import CairnError


class _Heartbeat(threading.Thread):
    """Calls ``beat`` every ``period`` seconds until stopped (a failed beat is retried at the next)."""

    def __init__(self, beat: Callable[[], None], period: float) -> None:
        super().__init__(name="cairn-stream", daemon=True)
        self._beat, self._period = beat, period
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.wait(self._period):
            try:
                self._beat()
            except CairnError:
                pass

    def stop(self) -> None:
        self._stop.set()


def releasing(inner: Any, start: int | None, stream: Callable[[int | None], Iterator[int]],
              warn_missed: Callable[[int, int], None]) -> Iterator[int]:
    """Registers as a reader of the dataset now (at ``start``, or the oldest kept step) and
    yields ``stream(mark)`` (a reader's stream from its mark): a step is passed once the loop asks
    for the next, and released once every registered reader passed it. Steps from ``start`` up
    to the mark were released before it registered (warned of). The registration ends with the
    loop (or when the iterator is dropped)."""
    reader = uuid.uuid4().hex
    lease, mark = inner.stream_at(reader, start, False)  # its lease in seconds, the first step it holds
    beat = _Heartbeat(lambda: inner.stream_at(reader, None, False), lease / 3)
    beat.start()
    at = start if mark is None else mark if start is None else max(start, mark)
    if start is not None and at > start:
        warn_missed(start, at)

    def run() -> Iterator[int]:
        try:
            for s in stream(at):
                yield s
                try:
                    inner.stream_at(reader, s + 1, False)
                except CairnError:
                    pass  # a leader changing: the next step's mark moves it as far
        finally:
            done()

    gen = run()
    # Also when the loop never starts (its `finally` would not run): the registration ends with it.
    done = weakref.finalize(gen, _leave, inner, reader, beat)
    return gen


def _leave(inner: Any, reader: str, beat: _Heartbeat) -> None:
    beat.stop()
    try:
        inner.stream_at(reader, None, True)
    except CairnError:
        pass  # unrenewed, the registration lapses by itself
