"""Checks of the channels-last layout pass (pyfuser/frontend/fx/layout_channels_last.py), shared
by tests/cpu/test_compile_channels_last.py (kernel interpreter, PYFUSER_CHANNELS_LAST=train) and
tests/gpu/test_channels_last_gpu.py (CUDA, `auto` and `train`).

`ConvNet`: conv-BN-ReLU, conv-BN, a strided 1x1 downsample conv-BN, the residual add and a ReLU
(ResNet's basic block), then global average pooling and a linear head.
`step_beside_eager(model, x, train, device)`: the model through pyfuser.compile beside a float32
eager copy and a float64 eager copy (the oracle): eval (a no_grad forward: the inference graph)
or train (forward, loss, backward: forward and backward graphs); checks values (as close to the
oracle as eager), shapes, dtypes and strides of the output and of every gradient, and returns
the compiled graphs. `assert_channels_last(graphs)`: the pass fired on every graph with a
convolution, every convolution reads its operands channels_last, and the only copies in the
graph are the pass's conversions (weights, the first input) and its restores of graph outputs.
"""
from __future__ import annotations

import copy

import torch

from train_corpus import assert_as_close_as_eager

aten = torch.ops.aten
CONVS = (aten.convolution.default, aten.convolution_backward.default, torch.convolution)


class ConvNet(torch.nn.Module):
    def __init__(self, cin: int = 3, c: int = 8, classes: int = 5):
        super().__init__()
        self.stem = torch.nn.Conv2d(cin, c, 3, padding=1, bias=False)
        self.bn0 = torch.nn.BatchNorm2d(c)
        self.conv1 = torch.nn.Conv2d(c, 2 * c, 3, stride=2, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(2 * c)
        self.conv2 = torch.nn.Conv2d(2 * c, 2 * c, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(2 * c)
        self.down = torch.nn.Conv2d(c, 2 * c, 1, stride=2, bias=False)
        self.bnd = torch.nn.BatchNorm2d(2 * c)
        self.fc = torch.nn.Linear(2 * c, classes)

    def forward(self, x):
        x = torch.relu(self.bn0(self.stem(x)))
        y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        y = torch.relu(y + self.bnd(self.down(x)))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(y, 1), 1))


def conv_net(seed: int = 0):
    torch.manual_seed(seed)
    m = ConvNet()
    with torch.no_grad():           # batch norms that are not the identity
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.5, 0.5)
                mod.running_mean.uniform_(-0.2, 0.2)
                mod.running_var.uniform_(0.5, 1.5)
    return m


def step_beside_eager(model, x, train: bool, device: str = "cpu", factor: float = 4.0,
                      compiled=None):
    """Run `model` (compiled) beside eager float32 / float64 copies; check values and strides.
    Returns the outputs (ours, eager)."""
    import pyfuser
    m32, m64 = copy.deepcopy(model), copy.deepcopy(model).double()
    for m in (model, m32, m64):
        m.train(train)
    fn = compiled if compiled is not None else pyfuser.compile(model)
    xs = [x.clone(), x.clone(), x.double()]
    if not train:
        with torch.no_grad():
            outs = [fn(xs[0]), m32(xs[1]), m64(xs[2])]
        assert_as_close_as_eager(*outs, "forward", factor=factor)
        assert outs[0].stride() == outs[1].stride()
        return outs
    xs = [t.requires_grad_() for t in xs]
    outs = [fn(xs[0]), m32(xs[1]), m64(xs[2])]
    assert_as_close_as_eager(*outs, "forward", factor=factor)
    assert outs[0].stride() == outs[1].stride()
    for o in outs:
        (o * o.detach().cos()).sum().backward()
    assert_as_close_as_eager(xs[0].grad, xs[1].grad, xs[2].grad, "dx", factor=factor)
    assert xs[0].grad.stride() == xs[1].grad.stride()
    p64 = dict(m64.named_parameters())
    for (name, p), (_, q) in zip(model.named_parameters(), m32.named_parameters()):
        assert_as_close_as_eager(p.grad, q.grad, p64[name].grad, name, factor=factor)
        assert p.grad.stride() == q.grad.stride(), name
    b64 = dict(m64.named_buffers())
    for (name, b), (_, c) in zip(model.named_buffers(), m32.named_buffers()):
        if b.is_floating_point():
            assert_as_close_as_eager(b, c, b64[name], name, factor=factor)
        else:
            assert torch.equal(b, c), name
    return outs


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _is_nhwc_copy(n) -> bool:
    return n.op in ("call_function", "call_method") and str(n.target).endswith("clone") and \
        n.kwargs.get("memory_format") is torch.channels_last


def layout_counts(g) -> dict:
    """Of a CompiledGraph: convolutions, how many read every operand channels_last, the
    pass's NHWC conversions and other copies left in the graph (eager copy kernels)."""
    convs = [n for n in g.gm.graph.nodes if n.op == "call_function" and n.target in CONVS]
    nhwc = 0
    for n in convs:
        ops = (0, 1) if n.target is not aten.convolution_backward.default else (0, 1, 2)
        vals = [_val(n.args[i]) for i in ops]
        if all(isinstance(v, torch.Tensor) and v.is_contiguous(memory_format=torch.channels_last)
               for v in vals):
            nhwc += 1
    copies = [n for n in g.gm.graph.nodes if n.op in ("call_function", "call_method") and
              str(n.target).endswith("clone")]
    conversions = [n for n in copies if _is_nhwc_copy(n)]
    return {"convolutions": len(convs), "nhwc_convolutions": nhwc,
            "conversions": len(conversions), "other_copies": len(copies) - len(conversions),
            "kernels": g.kernels()}


def assert_channels_last(graphs) -> list:
    """Every graph with a convolution went through the pass; each of its convolutions reads
    NHWC operands; the only eager copies are the pass's conversions (one per weight and first
    input, none of an activation) and every fused region wrote its outputs in the layouts the
    graph expects (no relayout, no eager fallback). Returns layout_counts per graph."""
    out = []
    for g in graphs:
        c = layout_counts(g)
        out.append((g.kind, c))
        if not c["convolutions"]:
            continue
        assert g.layout is not None and g.layout.convolutions == c["convolutions"], g.kind
        assert c["nhwc_convolutions"] == c["convolutions"], (g.kind, c)
        assert c["conversions"] == len(g.layout.converted), (g.kind, c)
        assert c["other_copies"] == 0, (g.kind, c)
        converted = {_arg_name(g, conv, i) for conv, i in g.layout.converted}
        assert all(not name.startswith(("relu", "getitem", "add", "convolution"))
                   for name in converted), converted     # graph inputs only: weights, images
        assert all(r.eager_calls == 0 for r in g.regions), g.kind
    return out


def _arg_name(g, conv_name, i):
    node = next(n for n in g.gm.graph.nodes if n.name == conv_name)
    clone = node.args[i]
    return clone.args[0].name if _is_nhwc_copy(clone) else clone.name
