"""A few random cross-entropy programs (pick_fuzz.py) through pyfuser.compile against eager on
the CPU interpreter, in every CI run; `python tests/cpu/pick_fuzz.py START COUNT` is the long
run (PYFUSER_PICK_FUZZ_SEEDS=a,b,c here for other seeds)."""
import os

import pytest

import pick_fuzz as PF

# seeds of the long run spread over programs, dtypes, layouts, grad modes and second calls
SEEDS = [int(s) for s in os.environ.get("PYFUSER_PICK_FUZZ_SEEDS", "").split(",") if s] or \
    [0, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987, 1597, 2584, 4181, 6765, 10946,
     17711]


@pytest.mark.parametrize("seed", SEEDS)
def test_pick_case_matches_eager(seed):
    why = PF.check(seed)
    assert why is None, why


def test_cases_cover_the_generator_and_repeat():
    """Within a few hundred seeds every program, dtype, layout, reduction and knob set is drawn,
    some cases take a backward or a second call; a seed's case is the same each time."""
    cases = [PF.case(s) for s in range(400)]
    assert {c.program for c in cases} == set(PF.PROGRAMS)
    assert {c.dtype for c in cases} == set(PF.DT)
    assert {str(c.knobs) for c in cases} == {str(k) for k in PF.KNOBS}
    assert {c.reduction for c in cases} == {"mean", "sum", "none"}
    assert {c.layout for c in cases} >= {"contiguous", "transposed", "sliced", "row_step",
                                         "col_step", "permuted", "classes_first"}
    assert {c.grad for c in cases} == {"no_grad", "enabled", "backward"}
    assert {c.again for c in cases} == {"", "rows", "classes", "layout"}
    assert any(len(c.shape) == 3 and c.flatten == "shift" for c in cases)
    assert any(c.shape[-1] == 1 for c in cases) and max(c.shape[-1] for c in cases) >= 2999
    assert PF.case(7).describe() == PF.case(7).describe()
    x1, t1, _, _ = PF.inputs(PF.case(7))
    x2, t2, _, _ = PF.inputs(PF.case(7))
    assert x1.equal(x2) and t1.equal(t2) and x1.stride() == x2.stride()


def test_a_wrong_value_is_reported():
    """The comparison fails on a value eager and float64 both disagree with, and on a NaN
    eager has not."""
    import torch
    want = torch.tensor([1.0, 2.0])
    assert PF._compare("o", want + 1e-3, want, want.double(), 1e-5) is not None
    assert PF._compare("o", torch.tensor([1.0, float("nan")]), want, want.double(), 1e-5)
    assert PF._compare("o", want.clone(), want, want.double(), 1e-5) is None
