"""The result of segmentation: a Fusion as an ordered list of segments, and the report of a run.

A Segment is one of
- "kernel": `exprs` run as one generated kernel; `fusion` is the sub-Fusion (extract.py) the
  scheduler named in `scheduler` accepted (for a Fusion that is one kernel with no host ops, the
  original Fusion itself);
- "host":   metadata-only exprs (view, permute, broadcast, squeeze, expand) run as PyTorch views
  on the host, no kernel, no copy (host.py);
- "eager":  exprs no scheduler takes, run by the reference evaluator on the sub-Fusion; `reason`
  says why (logged as a fallback).
`inputs` / `outputs` are Vals of the original Fusion; `sub_inputs` lists, for a kernel or eager
segment, the original Val feeding each input of `fusion` (tensors, then scalars).

Invariants:
- `segments` is a valid run order: every tensor a segment reads is a fusion input or an output
  of an earlier segment;
- every Expr the fusion outputs need is in one segment (scalar-only exprs are computed on the
  host by `bind`, in no segment), except that a kernel segment may recompute cheap pointwise
  exprs of another one from that one's inputs, or load-free values (iotas and cheap ops of
  them) from nothing, rather than read their result (`recomputed`, recompute.py,
  load_free.py); a value is an output of at most one segment.
`cuts` lists, when the compute exprs did not fit one scheduler (`split_reason` says why), each
tensor passed between two kernel / eager segments and why those two stayed apart (`Cut`).
`RunReport` (what `fs.last_run` shows) lists per run the segments in order with their kind and
scheduler, how many kernels ran and how (cuda / interpret / evaluator), and how many in-place
outputs (Fusion.aliases) no kernel wrote into their input, copied in after the kernels.
"""
from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("kernel", "host", "eager")


@dataclass(eq=False)
class Segment:
    kind: str
    exprs: list
    inputs: list
    outputs: list
    scheduler: str | None = None
    fusion: object = None
    sub_inputs: list = field(default_factory=list)
    reason: str = ""
    recomputed: list = field(default_factory=list)   # exprs another segment computes too

    def describe(self) -> str:
        head = f"{self.kind}" + (f" [{self.scheduler}]" if self.scheduler else "")
        if self.reason:
            head += f" ({self.reason})"
        ins = ", ".join(v.name for v in self.inputs)
        outs = ", ".join(v.name for v in self.outputs)
        again = {id(e) for e in self.recomputed}
        body = "\n".join(f"    {_expr_text(e)}" + ("   (recomputed)" if id(e) in again else "")
                         for e in self.exprs)
        return f"  {head}\n    inputs: {ins}\n    outputs: {outs}\n{body}"


def _expr_text(e) -> str:
    ins = ", ".join(getattr(v, "name", str(v)) for v in e.inputs)
    outs = ", ".join(v.name for v in e.outputs)
    return f"{outs} = {e.op_name}({ins})"


@dataclass(eq=False)
class Cut:
    """A tensor that crosses from one segment's exprs to another's (it goes through memory)."""
    tensor: object        # the TensorView of the original Fusion
    producer: list        # exprs of the segment that writes it
    consumer: list        # exprs of the segment that reads it
    nbytes: int           # the segmenter's estimate (an unknown extent counts as 1024)
    reason: str           # why the two segments were not joined

    def describe(self) -> str:
        ops = lambda es: ", ".join(e.op_name for e in es)  # noqa: E731
        return f"  cut {self.tensor.name}: [{ops(self.producer)}] -> [{ops(self.consumer)}]: {self.reason}"


@dataclass(eq=False)
class SegmentedFusion:
    fusion: object
    segments: list
    cuts: list = field(default_factory=list)
    split_reason: str = ""      # why the compute exprs are not one segment ("" when they are)

    @property
    def num_kernels(self) -> int:
        return sum(s.kind == "kernel" for s in self.segments)

    def kinds(self) -> list[tuple[str, str | None]]:
        return [(s.kind, s.scheduler) for s in self.segments]

    def __str__(self) -> str:
        lines = [f"SegmentedFusion: {len(self.segments)} segment(s), {self.num_kernels} kernel(s)"]
        for i, s in enumerate(self.segments):
            lines.append(f" segment {i}:\n{s.describe()}")
        lines += [c.describe() for c in self.cuts]
        return "\n".join(lines)


@dataclass
class SegmentRun:
    kind: str
    scheduler: str | None
    exprs: list          # op names, in order
    backend: str | None  # "cuda" / "interpret" / "evaluator" for kernels; None for host


@dataclass
class RunReport:
    """What one `execute` did: segments in run order, kernels launched, host segments."""
    segments: list = field(default_factory=list)
    kernels: int = 0           # kernel segments run (launched, interpreted or evaluated)
    launched: int = 0          # of which launched on a GPU or run by the CPU interpreter
    host_segments: int = 0
    eager_segments: int = 0
    copies: int = 0            # in-place outputs copied into their inputs after the kernels

    def as_dict(self) -> dict:
        return {"kernels": self.kernels, "launched": self.launched,
                "host_segments": self.host_segments, "eager_segments": self.eager_segments,
                "copies": self.copies,
                "segments": [{"kind": s.kind, "scheduler": s.scheduler, "exprs": s.exprs,
                              "backend": s.backend} for s in self.segments]}

    def __str__(self) -> str:
        parts = [f"{s.kind}" + (f"[{s.scheduler}]" if s.scheduler else "") for s in self.segments]
        return f"RunReport({self.kernels} kernel(s): {' -> '.join(parts) or 'nothing'})"
