"""`fd.sched`: the scheduling calls of a FusionDefinition subclass's `schedule()`.

nvFuser lets a FusionDefinition subclass schedule its own fusion:

    class MyFusion(FusionDefinition):
        def definition(self):
            self.t0 = self.from_pytorch(x)
            self.t1 = self.ops.relu(self.t0)
            self.add_output(self.t1)
        def schedule(self):
            self.sched.split(self.t1, 1, 4)
            self.sched.merge(self.t1, 0)

pyfuser accepts such programs: `schedule()` runs once the definition is complete, and each
`fd.sched` call is checked (made inside schedule(), on a tensor of this definition, with axes in
range of the tensor's loop domain as the earlier calls left it) and recorded in `calls`. The
kernel's schedule stays the one pyfuser's schedulers choose (the recorded transforms are not
applied), so results never depend on a user schedule; `execute(override_user_schedule=True)`
gives the same results by construction (docs/nvfuser_frontend.md).
"""
from __future__ import annotations

from ..errors import FusionDefinitionError
from .definition_values import Tensor


class UserSchedule:
    def __init__(self, fd):
        self._fd = fd
        self.calls: list[tuple] = []
        self._ranks: dict[int, int] = {}

    def _fail(self, call: str, message: str):
        raise FusionDefinitionError(f"{self._fd._title()}: fd.sched.{call}: {message}")

    def _rank(self, call: str, t, axes) -> int:
        fd = self._fd
        if fd._phase != "schedule":
            where = "inside definition()" if fd._phase == "define" else "outside schedule()"
            self._fail(call, f"scheduling calls are only valid inside schedule(), once the "
                             f"definition is complete (this one was made {where})")
        if not isinstance(t, Tensor) or t._fd is not fd:
            self._fail(call, f"expects a tensor of this FusionDefinition, got {t!r}")
        rank = self._ranks.get(id(t._val), t.ndim)
        for a in axes:
            if not isinstance(a, int) or isinstance(a, bool) or not -rank <= a < rank:
                self._fail(call, f"axis {a!r} is out of range for the {rank} loop axes of {t!r}")
        return rank

    def split(self, tensor, axis: int, factor: int, inner_split: bool = True) -> None:
        rank = self._rank("split", tensor, [axis])
        if not isinstance(factor, int) or isinstance(factor, bool) or factor < 1:
            self._fail("split", f"factor must be a positive int, got {factor!r}")
        self._ranks[id(tensor._val)] = rank + 1
        self.calls.append(("split", repr(tensor), axis, factor, inner_split))

    def merge(self, tensor, axis: int) -> None:
        rank = self._rank("merge", tensor, [axis])
        if axis % rank == rank - 1:
            self._fail("merge", f"axis {axis} is the last of the {rank} loop axes of {tensor!r}; "
                                "it merges with the axis after it")
        self._ranks[id(tensor._val)] = rank - 1
        self.calls.append(("merge", repr(tensor), axis))

    def reorder(self, tensor, old2new: dict) -> None:
        if not isinstance(old2new, dict):
            self._fail("reorder", f"expects a dict old axis -> new axis, got {old2new!r}")
        rank = self._rank("reorder", tensor, list(old2new) + list(old2new.values()))
        if len({v % rank for v in old2new.values()}) != len(old2new):
            self._fail("reorder", f"targets of {old2new} are not distinct")
        self.calls.append(("reorder", repr(tensor), dict(old2new)))

    def parallelize(self, tensor, axis: int, parallel_type) -> None:
        self._rank("parallelize", tensor, [axis])
        self.calls.append(("parallelize", repr(tensor), axis, parallel_type))
