"""Arrays `get` returns reuse the memory of released ones (issue 45: a new array per step paid a
page fault per 4 KiB), and only once no array or view uses it: data a caller still holds is
never overwritten by a later read."""

from __future__ import annotations

import gc

import numpy as np

import cairn
from cairn import _reuse


def test_memory_comes_back_only_when_the_last_view_goes():
    a = _reuse.empty((512, 1024), "f8")
    a[:] = 7
    where = a.ctypes.data
    view = a[100:101]
    del a
    gc.collect()
    b = _reuse.empty((512, 1024), "f8")
    assert b.ctypes.data != where, "a view still uses it"
    del view
    c = _reuse.empty((512, 1024), "f8")
    assert c.ctypes.data == where and c.flags.writeable and c.flags.c_contiguous
    assert _reuse.empty((3,), "i4").dtype == np.int32, "small reads get plain arrays"


def test_reads_into_reused_memory_never_touch_what_the_caller_holds(tmp_path):
    with cairn.open("r", "w", engine="file", path=tmp_path) as f:
        f.define("x", "f8", (256, 1024))
        for s in range(4):
            with f.step(s):
                f.put("x", np.full((256, 1024), float(s)))
    r = cairn.open("r", "r", engine="file", path=tmp_path)
    kept = r.get("x", 0)[10]  # a view of step 0's array, which is dropped
    for s in range(1, 4):
        a = r.get("x", s)
        assert (a == s).all()
        del a  # its memory serves the next read
    assert (kept == 0).all(), "the held view still shows step 0"
