"""What `pyfuser explain` reports, as plain data: the text, JSON and HTML views all read this.

An `Explanation` holds, for one program run once on example inputs:
- `groups`: each fusion group (a `prim::PyfuserGroup` of a TorchScript graph, or the whole Fusion
  of a FusionDefinition) with its `segments` in run order, the `cuts` between them and, when the
  group is more than one segment, `split_reason` (why no scheduler took it whole);
- each kernel segment's `verdicts`: every scheduler in the registry's priority order with its
  compile check and, where that passed, its run check for these inputs; the first that passed
  both is the one that planned the kernel (`KernelInfo`: name, params, launch configuration,
  bytes moved, CUDA source, and `bench` with --bench on a GPU);
- `fallbacks`: every op of the graph that computes tensors outside the groups, with why, and
  the op that blocked its fusion (`blocker`, None when nothing else did);
- `picture`: the graph outside the groups (nodes and edges) for the HTML view.

Invariant: every field is JSON-serialisable through `as_dict()` (numbers, strings, lists, dicts).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Verdict:
    scheduler: str
    compile_ok: bool
    compile_reason: str = ""
    run_ok: bool | None = None       # None: not asked (its compile check refused)
    run_reason: str = ""
    chosen: bool = False

    @property
    def refusal(self) -> str:
        if not self.compile_ok:
            return self.compile_reason or "refused"
        if self.run_ok is False:
            return "for these inputs: " + (self.run_reason or "refused")
        return ""


@dataclass
class KernelInfo:
    name: str
    scheduler: str
    params: dict
    launch: dict                     # grid, block, shared_mem
    index_type: str
    bytes_in: int                    # distinct elements read (a broadcast input counts once)
    bytes_out: int
    cuda: str                        # header, index typedef and the kernel function (no prelude)
    bench: dict | None = None        # us, copy_us, pct_of_copy (GPU with --bench)

    @property
    def bytes_moved(self) -> int:
        return self.bytes_in + self.bytes_out


@dataclass
class SegmentInfo:
    index: int
    kind: str                        # kernel / host / eager
    ops: list                        # "T3 = add(T1, T2)" per expr
    inputs: list
    outputs: list
    scheduler: str | None = None     # the scheduler that planned the kernel
    segmenter_scheduler: str | None = None   # the one the segmenter's compile checks named
    verdicts: list = field(default_factory=list)
    reason: str = ""                 # eager segments: why no scheduler takes them
    kernel: KernelInfo | None = None
    error: str = ""                  # planning failed (the group then runs eagerly)


@dataclass
class CutInfo:
    tensor: str
    from_segment: int
    to_segment: int
    nbytes: int                      # at these inputs' sizes
    reason: str


@dataclass
class GroupInfo:
    index: int
    name: str
    ops: list                        # the group's ops as the frontend wrote them (TorchScript lines)
    inputs: list
    outputs: list
    status: str = "fused"            # fused / eager
    eager_reason: str = ""
    split_reason: str = ""
    segments: list = field(default_factory=list)
    cuts: list = field(default_factory=list)
    fusion_ir: str = ""

    @property
    def kernels(self) -> list:
        return [s.kernel for s in self.segments if s.kernel is not None]


@dataclass
class Blocker:
    node: str                        # the op (or graph input) that kept this one out
    why: str


@dataclass
class FallbackInfo:
    node: str                        # "aten::linear (line 3) -> %5"
    kind: str
    reason: str
    category: str                    # "not fused" (a fusion candidate) / "no lowering" / "in place"
    blocker: Blocker | None = None
    ident: str = ""                  # the picture node it is drawn as


@dataclass
class PictureNode:
    ident: str
    label: str
    kind: str                        # op / group / input / output / fallback
    group: int | None = None         # GroupInfo.index for kind "group"
    title: str = ""


@dataclass
class Picture:
    nodes: list = field(default_factory=list)
    edges: list = field(default_factory=list)   # (from ident, to ident)


@dataclass
class Explanation:
    source: str
    frontend: str                    # torchscript / fusion_definition (the FX backend: "fx")
    device: str
    executor: str                    # cuda / interpret
    groups: list = field(default_factory=list)
    fallbacks: list = field(default_factory=list)
    picture: Picture | None = None
    notes: list = field(default_factory=list)
    prelude: str = ""                # the CUDA prelude every kernel starts with

    @property
    def kernels(self) -> list:
        return [k for g in self.groups for k in g.kernels]

    def summary(self) -> dict:
        segs = [s for g in self.groups if g.status == "fused" for s in g.segments]
        return {"groups": len(self.groups),
                "eager_groups": sum(g.status != "fused" for g in self.groups),
                "kernels": sum(s.kind == "kernel" for s in segs),
                "host_segments": sum(s.kind == "host" for s in segs),
                "eager_segments": sum(s.kind == "eager" for s in segs),
                "cuts": sum(len(g.cuts) for g in self.groups),
                "fallbacks": len(self.fallbacks),
                "bytes_moved": sum(k.bytes_moved for k in self.kernels)}

    def as_dict(self, prelude: bool = False) -> dict:
        d = asdict(self)
        d["summary"] = self.summary()
        if not prelude:
            d.pop("prelude")
        return d

    def text(self, verbose: bool = False, op: str | None = None) -> str:
        """Plain text; `op` keeps the groups and outside ops that mention it."""
        from .text import render
        return render(self, verbose, op)

    def to_html(self, path=None) -> str:
        """The self-contained HTML report; written to `path` when given."""
        from .html import render
        page = render(self)
        if path is not None:
            with open(path, "w", encoding="utf-8") as f:
                f.write(page)
        return page

    def __str__(self) -> str:
        return self.text()
