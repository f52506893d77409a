"""D²T claims (the paper's claim workflow): any number of claimer processes share a dataset's
committed steps, each step leased to one claimer at a time. The client crate's claimer renews
this claimer's leases from a heartbeat thread while it lives; a claimer that dies (SIGKILL) loses
them after ``lease`` seconds and another claimer gets the step. A claimed step is consumed by
committing a result with ``dst.step(s, consume=src)``, which releases it in the same transaction."""

from __future__ import annotations

from typing import Any, Iterator


def claims(inner: Any, lease: float, timeout: float | None) -> Iterator[int]:
    """Yields steps leased to a new claimer, lowest first, until the writers closed the dataset
    and nothing is left for this claimer, or no step came for ``timeout`` seconds. Steps it
    yielded and did not consume go back to the others when the loop ends. ``lease`` and ``timeout``
    are checked by :meth:`Reader.claims`."""
    claimer = inner.claimer(lease)
    try:
        while (step := claimer.next(timeout)) is not None:
            yield step
    finally:
        claimer.end()
