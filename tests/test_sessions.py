"""Writer sessions on the file engine: how a session is derived when none is given, and two
writers that claim the same rank of one session."""

from __future__ import annotations

import numpy as np
import pytest

import cairn

#: Everything a session can come from besides ``session=`` and ``comm=``.
SESSION_ENV = ("CAIRN_SESSION", "PMIX_NAMESPACE", "OMPI_MCA_orte_hnp_uri", "PMI_KVSNAME", "SLURM_JOB_ID", "SLURM_STEP_ID")


@pytest.fixture
def by_hand(monkeypatch):
    """A process started by hand: no launcher, no ``$CAIRN_SESSION``."""
    for k in SESSION_ENV:
        monkeypatch.delenv(k, raising=False)


def writer(tmp_path, mode: str, rank: int, **kw):
    """Rank ``rank`` of 2 writers of dataset ``ds``."""
    return cairn.open("ds", mode, engine="file", path=tmp_path, rank=rank, nranks=2, **kw)


def write_half(f, rank: int, value: float, step: int = 0) -> None:
    """Rank ``rank`` puts ``value`` into its half of a 4-element array at ``step``."""
    f.define("x", "f8", (4,))
    with f.step(step):
        f.put("x", np.full(2, value), offset=(2 * rank,))


def test_ranks_started_by_hand_without_a_session_are_refused(tmp_path, by_hand):
    with pytest.raises(cairn.InvalidArgumentError, match=r"rank 0 of 2.*session=.*CAIRN_SESSION"):
        writer(tmp_path, "w", 0)
    # A single writer needs no agreement: it gets a fresh session of its own.
    with cairn.open("one", "w", engine="file", path=tmp_path) as f:
        f.define("x", "f8", (1,))
        with f.step(0):
            f.put("x", np.ones(1), offset=(0,))
    with cairn.open("one", "r", engine="file", path=tmp_path) as f:
        assert f.steps() == [0]


@pytest.mark.parametrize("env", [{"CAIRN_SESSION": "run7"}, {"SLURM_JOB_ID": "41", "SLURM_STEP_ID": "0"}])
def test_ranks_take_the_session_from_the_environment(tmp_path, by_hand, monkeypatch, env):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for r in range(2):
        with writer(tmp_path, "w", r) as f:
            write_half(f, r, float(r))
    with cairn.open("ds", "r", engine="file", path=tmp_path) as f:
        assert np.array_equal(f.get("x", 0), [0, 0, 1, 1])


def test_a_second_writer_of_a_rank_is_refused_while_the_first_is_open(tmp_path):
    with writer(tmp_path, "w", 0, session="s") as first:
        for mode in ("w", "a"):
            with pytest.raises(cairn.ConflictError, match=r'rank 0 .*session "s"'):
                writer(tmp_path, mode, 0, session="s")
        write_half(first, 0, 1.0)
    with writer(tmp_path, "a", 1, session="s") as other:
        write_half(other, 1, 2.0)
    with cairn.open("ds", "r", engine="file", path=tmp_path) as f:
        assert np.array_equal(f.get("x", 0), [1, 1, 2, 2])


def test_a_second_writer_of_a_rank_is_refused_once_the_first_has_ended_the_step(tmp_path):
    with writer(tmp_path, "w", 0, session="s") as first:
        write_half(first, 0, 1.0)
    # "w" would truncate the data file the first writer's part points at: refused on opening.
    with pytest.raises(cairn.ConflictError, match=r'step 0.*rank 0.*session "s"'):
        writer(tmp_path, "w", 0, session="s")
    # "a" keeps the data, but its own part of step 0 is refused when it ends the step.
    with writer(tmp_path, "a", 0, session="s") as second:
        with pytest.raises(cairn.ConflictError, match=r'step 0.*rank 0.*session "s"'):
            write_half(second, 0, 5.0)
        write_half(second, 0, 5.0, step=1)  # a step the first writer never wrote is its own
    with writer(tmp_path, "a", 1, session="s") as other:
        write_half(other, 1, 2.0)
    with cairn.open("ds", "r", engine="file", path=tmp_path) as f:
        assert f.steps() == [0]
        assert np.array_equal(f.get("x", 0), [1, 1, 2, 2])
