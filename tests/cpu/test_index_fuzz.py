"""The advanced-indexing fuzzer (tests/cpu/index_fuzz.py): seeded random lookups `t[i0, ...,
ik-1]` and accumulating index_puts through pyfuser.compile, dynamic=True and traced TorchScript
graphs against eager. PYFUSER_INDEX_FUZZ_CASES=N runs another count (seeds 0..N-1);
`python tests/cpu/index_fuzz.py START COUNT` is the long run."""
from __future__ import annotations

import os

import pytest

import index_fuzz as IF

N_CASES = int(os.environ.get("PYFUSER_INDEX_FUZZ_CASES", "60"))


@pytest.fixture(autouse=True)
def _quiet_dynamo():
    """AOTAutograd cannot trace a 0-dim index (Python's indexing takes it as an int): Dynamo
    logs the backend's failure and runs that graph eagerly, for any backend; the fuzzer checks
    the results, the log is noise."""
    import logging
    log = logging.getLogger("torch._dynamo")
    level = log.level
    log.setLevel(logging.ERROR)
    yield
    log.setLevel(level)


def test_index_fuzz_cases_pass():
    failures = [f for _, f in IF.run_many(range(N_CASES)) if f is not None]
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("seed", [5384, 5732, 6040])
def test_bfloat16_sums_rounded_once_are_within_a_rounding(seed):
    """Regression (thirty-third session's campaign): bfloat16 sums into a table (index_put into
    zeros; a gradient of six equal rows: an exact tie) rounded once from float32, one ulp from
    the rounded float64 oracle where eager's step-by-step sum lands on it exactly: the checker
    allows a rounding of the result's dtype (train_corpus.assert_as_close_as_eager)."""
    assert IF.check(IF.case(seed)) is None


def test_cases_cover_the_forms():
    cases = [IF.case(s) for s in range(300)]
    assert {c.k for c in cases} == {1, 2, 3, 4}
    assert {c.layout for c in cases} == {"contiguous", "transposed", "sliced", "expanded"}
    assert {c.put for c in cases} == {"none", "input", "zeros"}
    assert all(any(f(c) for c in cases) for f in (
        lambda c: c.dynamic and c.k > 1, lambda c: c.traced and c.k == 1,
        lambda c: c.bad is not None and c.bad[0] > 0, lambda c: 0 in c.shape,
        lambda c: any(0 in s for s in c.index_shapes), lambda c: c.grad and c.put == "none",
        lambda c: c.index_layout == "expanded", lambda c: c.index_op == "arange"))
    assert IF.case(7).__dict__ == IF.case(7).__dict__


def test_the_checker_catches_a_missing_wrap(monkeypatch):
    """With the negative-index wrap of one index dropped from the lowering, the fuzzer fails
    (the kernel's bounds check raises where eager reads a row counted from the end)."""
    from pyfuser.frontend.fx.compile_graph import clear_cache
    from pyfuser.frontend.lowering import aten_indexing as AI
    monkeypatch.setenv("PYFUSER_DISABLE_DISK_CACHE", "1")     # lowered anew, never stored
    real = AI._leading_index

    def no_wrap(x, indices, what):
        if len(indices) == 1:
            return x, AI._index(indices[0], what)
        return real(x, indices, what)
    monkeypatch.setattr(AI, "_leading_index", no_wrap)
    seeds = [c.seed for c in map(IF.case, range(80)) if c.k == 1 and c.put == "none" and
             c.bad is None and not c.traced and 0 not in c.shape][:5]
    clear_cache()                         # regions the earlier tests lowered, in memory
    try:
        assert any(IF.check(IF.case(s)) for s in seeds)
    finally:
        clear_cache()                     # nor the wrong ones for the tests after
