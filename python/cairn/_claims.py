"""D²T claims (the paper's claim workflow): any number of claimer processes share a dataset's
committed steps, each step leased to one claimer at a time. A heartbeat thread renews this
claimer's leases while it lives; a claimer that dies (SIGKILL) loses them after ``lease``
seconds and another claimer gets the step. A claimed step is consumed by committing a result with
``dst.step(s, consume=src)``, which releases it in the same transaction."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Iterator

from .exceptions import CairnError


class _Heartbeat(threading.Thread):
    """Renews every lease of ``claimer`` each third of the lease (a missed beat or two, a
    server failing over, still leaves the lease alive)."""

    def __init__(self, inner: Any, claimer: str, lease: float) -> None:
        super().__init__(name=f"cairn-claims-{claimer[:8]}", daemon=True)
        self._inner, self._claimer, self._lease = inner, claimer, lease
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.wait(self._lease / 3):
            try:
                self._inner.renew(self._claimer, self._lease)
            except CairnError:
                pass  # the next beat tries again; a lease that lapses meanwhile is handed on

    def stop(self) -> None:
        self._stop.set()


def claims(inner: Any, lease: float, timeout: float | None) -> Iterator[int]:
    """Yields steps leased to a new claimer, lowest first, until the writers closed the dataset
    and nothing is left for this claimer, or no step came for ``timeout`` seconds. Steps it
    yielded and did not consume go back to the others when the loop ends. ``lease`` and ``timeout``
    are checked by :meth:`Reader.claims`."""
    claimer = uuid.uuid4().hex
    beat = _Heartbeat(inner, claimer, lease)
    beat.start()
    try:
        last, pause = time.monotonic(), 0.01
        while True:
            step, done = inner.claim(claimer, lease)
            if step is not None:
                yield step
                last, pause = time.monotonic(), 0.01
                continue
            if done or (timeout is not None and time.monotonic() - last >= timeout):
                return
            time.sleep(pause if timeout is None else max(0.0, min(pause, timeout - (time.monotonic() - last))))
            pause = min(2 * pause, 0.2)
    finally:
        beat.stop()
        try:
            inner.unclaim(claimer)
        except CairnError:
            pass  # unrenewed, its leases lapse by themselves
