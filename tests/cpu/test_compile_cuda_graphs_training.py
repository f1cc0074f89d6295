"""CUDA graphs for torch.compile's training graphs (frontend/fx/cuda_graphs_training.py), on the
CPU with the stand-in graphs of fake_graphs.py (a replay runs the captured call again at the
captured addresses and writes the captured output storages): losses, gradients and parameters
equal eager's step after step; the forward's saved tensors and the gradients are handed out
from the graph's memory, and a call whose previous results are still in use (two forwards
before their backwards, a gradient kept across steps, retain_graph) runs as it is; dropout
keeps the graphs off."""
import copy

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import cuda_graphs as CG
from pyfuser.frontend.fx import cuda_graphs_training as CGT
from pyfuser.frontend.fx.cuda_graphs_training import GraphedTraining

pytestmark = pytest.mark.usefixtures("fresh_compile", "no_graphed_calls")



def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(),
                               torch.nn.Linear(16, 4))


def _graphed():
    got = {g.__name__.split("_")[1]: g for g in CG.graphed_calls()}
    assert all(isinstance(g, GraphedTraining) for g in got.values())
    return got["forward"], got["backward"]


def _assert_same_params(m, ref):
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, msg=name)
        torch.testing.assert_close(p.grad, q.grad, msg=f"{name}.grad")


def test_a_replaced_parameter_is_a_new_signature(fake_graphs):
    """A training graph's key holds its parameters' addresses (the replay does not check them
    again): a parameter replaced by a new tensor is captured anew, and the steps before and
    after equal eager's."""
    m = _model()
    ref = copy.deepcopy(m)
    c = torch.compile(m, backend=pyfuser.backend, mode="reduce-overhead")
    for step in range(8):
        if step == 4:
            w = torch.randn(4, 16)
            m[3].weight, ref[3].weight = torch.nn.Parameter(w), torch.nn.Parameter(w.clone())
        x = torch.randn(5, 8)
        for mod in (c, ref):
            mod.zero_grad()
            mod(x).square().mean().backward()
        _assert_same_params(m, ref)
    fw, bw = _graphed()
    assert fw.captures == 2 and fw.replays >= 4 and len(fw.entries) == 2


@pytest.mark.parametrize("set_to_none", [True, False])
def test_training_steps_equal_eager_and_replay(fake_graphs, set_to_none):
    m = _model()
    ref = copy.deepcopy(m)
    c = torch.compile(m, backend=pyfuser.backend, mode="reduce-overhead")
    opt, opt_ref = (torch.optim.SGD(p.parameters(), lr=0.1) for p in (m, ref))
    losses = []
    for _ in range(6):
        x = torch.randn(5, 8)
        for mod, o in ((c, opt), (ref, opt_ref)):
            o.zero_grad(set_to_none=set_to_none)
            loss = mod(x).square().mean()
            loss.backward()
            o.step()
            losses.append(loss)
        _assert_same_params(m, ref)
    for got, want in zip(losses[::2], losses[1::2]):   # earlier losses were not overwritten
        torch.testing.assert_close(got, want)
    fw, bw = _graphed()
    assert (fw.captures, fw.replays, fw.busy) == (1, 5, 0)
    # the backward of the forward's first (plain) run has other saved addresses: its own
    # signature, run as it is; the replayed forwards' backwards are captured, then replayed
    assert (bw.captures, bw.replays, bw.busy) == (1, 4, 0)
    assert any(isinstance(h, tuple) and h[0] in (CGT._INPUT, CGT._VIEW)
               for e in fw.entries.values() if e.plan for h in e.plan), \
        "a parameter saved for the backward is handed back as the parameter"


@pytest.mark.parametrize("native_on", ["1", "0"])
def test_native_and_python_keys_and_hand_outs_agree(fake_graphs, monkeypatch, native_on):
    """The signature key and the handed-out tensors come from the native runner (graph_key,
    hand_out: one C++ call each) where it is built, else from Python: the same replays, the
    same parameters after the same steps as eager."""
    from pyfuser.runtime import native
    monkeypatch.setenv("PYFUSER_NATIVE", native_on)
    if native_on == "1":
        assert native.build() is not None
    m = _model()
    ref = copy.deepcopy(m)
    c = torch.compile(m, backend=pyfuser.backend, mode="reduce-overhead")
    opt, opt_ref = (torch.optim.SGD(p.parameters(), lr=0.1) for p in (m, ref))
    for _ in range(5):
        x = torch.randn(5, 8)
        for mod, o in ((c, opt), (ref, opt_ref)):
            o.zero_grad()
            mod(x).square().mean().backward()
            o.step()
        _assert_same_params(m, ref)
    fw, bw = _graphed()
    assert (fw.replays, bw.replays) == (4, 3)
    kind = bytes if native_on == "1" else tuple
    for g in (fw, bw):
        assert g.entries and all(isinstance(k, kind) for k in g.entries)
        assert all((e.made is not None) == (native_on == "1") for e in g.entries.values()
                   if e.plan is not None)


def test_two_forwards_before_their_backwards(fake_graphs):
    m = _model()
    ref = copy.deepcopy(m)
    c = torch.compile(m, backend=pyfuser.backend, mode="reduce-overhead")
    for _ in range(4):
        x1, x2 = torch.randn(5, 8), torch.randn(5, 8)
        for mod in (c, ref):
            mod.zero_grad()
            (mod(x1).square().mean() + mod(x2).abs().mean()).backward()
        _assert_same_params(m, ref)
    fw, _ = _graphed()
    assert fw.replays >= 2 and fw.busy >= 2     # the second forward of a step runs as it is


def test_gradient_kept_across_steps_is_not_overwritten(fake_graphs):
    m = _model()
    c = torch.compile(m, backend=pyfuser.backend, mode="reduce-overhead")
    kept = []
    for _ in range(4):
        m.zero_grad()
        c(torch.randn(5, 8)).sum().backward()
        kept.append((m[0].weight.grad, m[0].weight.grad.clone()))
    for g, value in kept:
        torch.testing.assert_close(g, value)
    _, bw = _graphed()
    assert bw.busy >= 1 and bw.replays >= 1


def test_retained_graph_backward_twice(fake_graphs):
    m = _model()
    ref = copy.deepcopy(m)
    c = torch.compile(m, backend=pyfuser.backend, mode="reduce-overhead")
    for _ in range(4):
        x = torch.randn(5, 8)
        for mod in (c, ref):
            mod.zero_grad()
            loss = mod(x).square().mean()
            loss.backward(retain_graph=True)
            loss.backward()
        _assert_same_params(m, ref)
    fw, bw = _graphed()
    assert fw.replays >= 1 and bw.replays >= 1


def test_view_of_a_gradient_kept_alive_counts(fake_graphs):
    """A view the caller keeps of a handed-out tensor keeps its memory in use (the gradient
    itself is dropped by zero_grad)."""
    m = _model()
    c = torch.compile(m, backend=pyfuser.backend, mode="reduce-overhead")
    kept = []
    for _ in range(4):
        m.zero_grad(set_to_none=True)
        c(torch.randn(5, 8)).sum().backward()
        view = m[0].weight.grad[:2]
        kept.append((view, view.clone()))
    for view, value in kept:
        torch.testing.assert_close(view, value)
    _, bw = _graphed()
    assert bw.busy >= 1


def test_user_outputs_are_copies(fake_graphs):
    m = _model()
    c = torch.compile(lambda x: m(x).relu(), backend=pyfuser.backend, mode="reduce-overhead")
    outs = []
    for _ in range(4):
        y = c(torch.randn(5, 8))
        outs.append((y, y.detach().clone()))
        y.sum().backward()
    for y, value in outs:
        torch.testing.assert_close(y, value)
    fw, _ = _graphed()
    assert fw.replays >= 2 and fw.busy == 0


def test_dropout_training_steps_replay_with_new_masks(fake_graphs):
    """A training step with dropout is graphed (forward and backward) and each replayed
    forward draws a new mask; the backward uses the mask its forward drew (the saved mask):
    the gradients equal eager's for the mask seen in the output."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.5))
    c = torch.compile(m, backend=pyfuser.backend, mode="reduce-overhead")
    masks = []
    for _ in range(5):
        m.zero_grad()
        x = torch.randn(8, 16)
        y = c(x)
        y.sum().backward()
        lin = x @ m[0].weight.detach().T + m[0].bias.detach()
        keep = y.detach() != 0
        torch.testing.assert_close(y.detach(), torch.where(keep, lin * 2, 0.0))
        d = keep.float() * 2                           # d(sum y) / d(lin)
        torch.testing.assert_close(m[0].weight.grad, d.T @ x)
        torch.testing.assert_close(m[0].bias.grad, d.sum(0))
        masks.append(keep)
    fw, bw = _graphed()
    assert fw.why_not is None and fw.replays >= 2 and bw.replays >= 2
    assert all(not torch.equal(a, b) for a, b in zip(masks[2:], masks[3:]))


def test_batch_norm_running_statistics_and_new_batch_sizes(fake_graphs):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU())
    ref = copy.deepcopy(m)
    c = torch.compile(m, backend=pyfuser.backend, mode="reduce-overhead", dynamic=True)
    for n in (5, 5, 5, 7, 7, 7, 5):
        x = torch.randn(n, 8)
        for mod in (c, ref):
            mod.zero_grad()
            mod(x).square().mean().backward()
        _assert_same_params(m, ref)
        torch.testing.assert_close(m[1].running_mean, ref[1].running_mean)
        torch.testing.assert_close(m[1].running_var, ref[1].running_var)
        assert m[1].num_batches_tracked == ref[1].num_batches_tracked
    fw, bw = _graphed()
    assert fw.captures == 2 and fw.replays >= 3 and bw.replays >= 2


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_hf_training_steps_equal_the_same_graphs_run_as_they_are(fake_graphs, name):
    """A real model's forward and backward graphs (AOTAutograd's, with the tensors it saves,
    the parameters it hands back and the gradients) through the stand-in graphs: step after
    step the losses, gradients and parameters of the same compiled graphs without graphs."""
    import train_corpus as TC
    case = TC.TRAIN_CASES[name]("cpu")
    runs = []
    for graphs in (False, True):
        model = copy.deepcopy(case.model)
        fn = pyfuser.compile(model, cuda_graphs=graphs)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        steps = []
        for _ in range(4):
            opt.zero_grad(set_to_none=True)
            loss = TC.step(TC.TrainCase(name, model, case.inputs, case.loss), fn, opt)
            steps.append((loss, TC.grads(model)))
        runs.append((steps, TC.params(model)))
    fw, bw = _graphed()
    assert fw.replays >= 2 and bw.replays >= 1 and fw.busy == bw.busy == 0
    (s0, p0), (s1, p1) = runs
    for (l0, g0), (l1, g1) in zip(s0, s1):
        torch.testing.assert_close(l1, l0, rtol=0, atol=0)
        for n in g0:
            torch.testing.assert_close(g1[n], g0[n], rtol=0, atol=0, msg=n)
    for n in p0:
        torch.testing.assert_close(p1[n], p0[n], rtol=0, atol=0, msg=n)


class _TwoBiases(torch.nn.Module):
    """x + a + b: the backward's gradients of a and b are one tensor (the tangent)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Parameter(torch.randn(4))
        self.b = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        return x + self.a + self.b


def test_one_gradient_for_two_parameters_is_not_shared_memory(fake_graphs):
    """A backward returning one tensor as two gradients: a run returns it twice (autograd
    keeps one and copies the other into .grad); two tensors on its memory would both become
    .grad, and clipping one in place (clip_grad_norm_) would scale the other twice."""
    m = _TwoBiases()
    ref = copy.deepcopy(m)
    c = torch.compile(m, backend=pyfuser.backend, mode="reduce-overhead")
    for _ in range(4):
        x = torch.randn(4)
        for mod, mm in ((c, m), (ref, ref)):
            mm.zero_grad()
            mod(x).square().mean().backward()
            torch.nn.utils.clip_grad_norm_(mm.parameters(), 0.1)
        _assert_same_params(m, ref)
    _, bw = _graphed()
    assert bw.replays >= 2


def test_effect_tokens_leave_the_results_copies(fake_graphs):
    """linalg.inv's error check is an effectful op: the forward's outputs start with its effect
    token, before the results: a result is a copy (kept across steps, the next forward still
    replays), not the graph's memory."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4, 4) + 4 * torch.eye(4))
    wr = w.detach().clone().requires_grad_()

    def f(w, x):
        return torch.tanh(x @ torch.linalg.inv(w))
    c = torch.compile(f, backend=pyfuser.backend, mode="reduce-overhead")
    kept = []
    for _ in range(4):
        x = torch.randn(3, 4)
        w.grad = wr.grad = None
        y, yr = c(w, x), f(wr, x)
        kept.append((y, yr))
        y.square().sum().backward()
        yr.square().sum().backward()
        torch.testing.assert_close(w.grad, wr.grad)
    for y, yr in kept:
        torch.testing.assert_close(y, yr)
    fw, _ = _graphed()
    assert fw.replays >= 2 and fw.busy == 0


def test_parameters_on_one_storage_keep_their_version_counters(fake_graphs):
    """Two parameters on one flat buffer (`p.data = flat[a:b]`, as contiguous-parameter
    optimizers do): the saved weight is handed back as that parameter, not as a view of the
    other, so updating it in place before the backward is the error it is in eager."""
    torch.manual_seed(0)
    m = torch.nn.Module()
    m.b = torch.nn.Parameter(torch.randn(4))
    m.w = torch.nn.Parameter(torch.randn(4, 4))
    flat = torch.cat([m.b.detach(), m.w.detach().view(-1)])
    m.b.data, m.w.data = flat[:4], flat[4:].view(4, 4)
    c = torch.compile(lambda x: m.b + x @ m.w, backend=pyfuser.backend, mode="reduce-overhead")
    for _ in range(4):
        loss = c(torch.randn(3, 4, requires_grad=True)).square().sum()
        with torch.no_grad():
            m.w.add_(1)
        with pytest.raises(RuntimeError, match="inplace"):
            loss.backward()
    # no backward ran: none was compiled (or, through the graph cache, none replayed)
    fw = next(g for g in CG.graphed_calls() if "forward" in g.__name__)
    assert fw.replays >= 2
    assert all(g.replays == 0 for g in CG.graphed_calls() if "backward" in g.__name__)


def test_distributed_runs_keep_the_training_graphs_off(fake_graphs, monkeypatch):
    """DDP / FSDP read gradients on their own streams, which a replay would not wait for."""
    from pyfuser.frontend.fx import backend
    monkeypatch.setattr(backend, "_distributed", lambda: True)
    m = _model()
    c = torch.compile(m, backend=pyfuser.backend, mode="reduce-overhead")
    for _ in range(3):
        c(torch.randn(5, 8)).sum().backward()
    fw, bw = _graphed()
    assert "distributed" in fw.why_not and "distributed" in bw.why_not
    assert fake_graphs.captures == 0
