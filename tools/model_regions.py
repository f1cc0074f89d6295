"""Where a model's kernels come from: every graph pyfuser compiled for one model of the training
corpus (tests/cpu/train_corpus.py), its fused regions' kernel counts and segments, what stayed
on aten and why, and (on CUDA) the kernels the torch profiler counted in one call.

    PYTHONPATH=. python3 tools/model_regions.py llama [--device cuda] [--size bench]
        [--dtype bfloat16] [--train] [--nodes]

The model is a name of train_corpus.TRAIN_CASES or of the slower zoo (tests/cpu/
test_model_zoo.MODELS: deepseek_v3, gemma2, deberta_v2, mamba; CPU, the small size only).
`--unfused` lists each graph's nodes left to aten but the matmuls, convolutions and attention
(the fusion gaps), with their input shapes.

Reads the compiled graphs through pyfuser.frontend.fx.compiled_graphs() and each region's last
RunReport (runtime/dispatch.last_report); a region of more than one kernel lists its segments
(kind, scheduler) so that a split the CPU count did not predict can be found on the device.
"""
from __future__ import annotations

import argparse
import contextlib
import re
import sys
from collections import Counter

import torch

sys.path.insert(0, "tests/cpu")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("model")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--size", choices=("small", "bench"), default="small")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--train", action="store_true", help="a training step, not a forward")
    p.add_argument("--nodes", action="store_true", help="each region's FX nodes (op, shape)")
    p.add_argument("--unfused", action="store_true",
                   help="the nodes left to aten but matmuls, convolutions and attention")
    p.add_argument("--ops", action="store_true",
                   help="CUDA: the aten ops of one call with their input shapes (what launches "
                        "the kernels that are not pyfuser's)")
    a = p.parse_args(argv)

    import train_corpus as TC
    import pyfuser
    from pyfuser.frontend import fx as F
    from pyfuser.runtime import dispatch

    case = _case(a, TC)
    model = case.model.train(a.train)
    fn = torch.compile(model, backend=pyfuser.backend)
    ctx = (lambda: torch.autocast(a.device, dtype=torch.bfloat16)) if a.dtype == "bfloat16" \
        else contextlib.nullcontext
    # an encoder-decoder's inference forward makes its decoder inputs from the labels (T5)
    keep = a.train or getattr(getattr(model, "config", None), "is_encoder_decoder", False)
    inputs = case.inputs if keep else {k: v for k, v in case.inputs.items() if k != "labels"}

    def call():
        if a.train:
            with ctx():
                loss = case.loss(fn(**inputs))
            loss.backward()
        else:
            with torch.no_grad(), ctx():
                fn(**inputs)

    for _ in range(3):
        call()
    if a.device == "cuda":
        torch.cuda.synchronize()
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU],
                     record_shapes=a.ops) as prof:
            call()
            torch.cuda.synchronize()
        names = Counter(e.name for e in prof.events() if e.device_type.name == "CUDA"
                        and not e.name.startswith(("Memcpy", "Memset")))
        print(f"profiler: {sum(names.values())} kernels in one call")
        for n, c in names.most_common(25):
            print(f"  {c:4d}  {n[:110]}")
        if a.ops:
            for e in prof.key_averages(group_by_input_shape=True):
                if e.key.startswith("aten::") and e.device_type.name == "CPU":
                    print(f"  op {e.count:4d}  {e.key}  {str(e.input_shapes)[:150]}")
    total = 0
    for g in F.compiled_graphs():
        print(f"\n== {g.kind} graph: {g.report()}")
        if a.unfused:
            _print_unfused(g)
        for r in g.regions:
            k = r.kernels()
            total += k
            rep = dispatch.last_report(r.fusion)
            segs = [] if rep is None else [(s.kind, s.scheduler) for s in rep.segments]
            line = f"  {r.__name__}: {len(r.ops)} nodes, {k} kernels"
            if k > 1 or any(kind == "eager" for kind, _ in segs):
                line += "  " + " ".join(f"{kind}:{s}" for kind, s in segs)
            print(line)
            if a.nodes:
                for n in r._region.nodes:
                    v = n.meta.get("val")
                    shape = list(v.shape) if isinstance(v, torch.Tensor) else ""
                    print(f"      {n.name}: {n.target} {shape}")
    print(f"\nfused regions' kernels: {total}")
    return 0


def _case(a, TC):
    """The TrainCase of a train_corpus name, or of a zoo model (its output's loss)."""
    if a.model in TC.TRAIN_CASES:
        return TC.TRAIN_CASES[a.model](a.device, TC.BENCH if a.size == "bench" else TC.SMALL)
    import test_model_zoo as Z
    model, inputs = Z._build(a.model)
    return TC.TrainCase(a.model, model.to(a.device),
                        {k: v.to(a.device) for k, v in inputs.items()}, lambda out: out.loss)


# matmuls, convolutions and attention: aten's by design (cuBLAS, cuDNN, SDPA)
_BY_DESIGN = re.compile(r"aten\.(mm|addmm|bmm|baddbmm|convolution|convolution_backward|"
                        r"_scaled_dot_product\w*)\.")


def _print_unfused(g) -> None:
    nodes = {n.name: n for n in g.gm.graph.nodes}
    for name, why in g.unsupported.items():
        n = nodes.get(name)
        if n is None or "view the graph returns" in why or _BY_DESIGN.search(why):
            continue
        shapes = [list(x.meta["val"].shape) for x in n.all_input_nodes
                  if isinstance(x.meta.get("val"), torch.Tensor)]
        print(f"    unfused {name}: {shapes}: {why}")


if __name__ == "__main__":
    sys.exit(main())
