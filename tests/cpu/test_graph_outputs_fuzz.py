"""A slice of graph_outputs_fuzz.py's random call sequences of graphed torch.compile inference
calls (outputs on the graph's own memory, invalidated when a replay or a dropped graph takes it)
against eager, in every CI run; `python tests/cpu/graph_outputs_fuzz.py START COUNT` is the long
run (PYFUSER_GRAPH_OUTPUTS_FUZZ_SEEDS=a,b,c here for other seeds). Also: the generator covers
its menus, and the driver's checks catch a hand-out that lets a replay change a held output."""
import os

import pytest

import graph_outputs_fuzz as GF
from pyfuser.frontend.fx.cuda_graph_outputs import SharedOutputs

pytestmark = pytest.mark.usefixtures("fresh_compile", "no_graphed_calls")

# 218, 225: an output fed to a call of a new signature that pushed its graph out (fixed); the
# rest spread over evictions, feeds, views, recompiles and dynamic shapes
SEEDS = [int(s) for s in os.environ.get("PYFUSER_GRAPH_OUTPUTS_FUZZ_SEEDS", "").split(",")
         if s] or [218, 225, 0, 2, 3, 5, 6, 10, 11, 16, 18, 19, 24, 34, 36, 39, *range(40, 60)]


@pytest.mark.parametrize("seed", SEEDS)
def test_graphed_outputs_match_eager_or_are_invalidated(seed):
    why = GF.check(seed)
    assert why is None, why


def test_cases_cover_the_generator_and_repeat():
    cases = [GF.case(s) for s in range(300)]
    assert {p for c in cases for p in c.pre} == set(GF.PRE)
    assert {o for c in cases for o in c.outs} == set(GF.OUTS)
    assert {a for c in cases for _, a, _, _ in c.calls} == set(GF.ACTIONS)
    assert {c.max_graphs for c in cases} == {0, 1, 2}
    assert {c.dynamic for c in cases} == {False, True}
    assert {c.inputs for c in cases} == {1, 2} and any(c.bare for c in cases)
    assert any(1 in s for c in cases for s in c.shapes)           # zero-size views, a 1 dim
    assert {len(c.calls) for c in cases} == set(range(6, 16))
    assert GF.case(7).describe() == GF.case(7).describe()


def test_the_driver_catches_an_output_a_replay_changes(monkeypatch):
    """With a hand-out that invalidates nothing before a replay, a seed that keeps outputs
    across replays fails (values differ): the checks can fail."""
    monkeypatch.setattr(SharedOutputs, "retire", lambda self: 0)
    why = GF.check(4)
    assert why is not None and "values differ" in why, why
