"""Training under torch.distributed for tests/cpu/test_distributed.py (and the GPU test): small
models whose fused parts run through pyfuser, trained a few SGD steps either in one process on
the whole batch or in `world` ranks (DDP or FSDP2) on equal shares of it.

Scenarios (`SCENARIOS`):
- `jit_ddp`: a scripted module through `pyfuser.jit`, wrapped in an nn.Module (`JitModule`) that
  DDP wraps; the input normalisation group reads no parameter, so it runs as a fused kernel even
  in training (groups that read parameters run eagerly under autograd: pyfuser.jit has no
  backward), and an evaluation forward under no_grad fuses every group.
- `jit_fsdp2`: pyfuser.jit functions (input normalisation, RMS norm) called from a plain module
  that FSDP2 shards (`fully_shard` per linear layer and at the root): the functions get the
  unsharded parameters as ordinary tensors.
- `compile_ddp` / `compile_fsdp2`: the same models under `torch.compile(backend="pyfuser")`
  (issue 16's backend: forward and backward fused), with DDP or FSDP2 beneath; they need
  `compile_unavailable()` to be None.

`train(kind, rank, world, device)` returns plain data: the loss of each step (averaged over the
ranks), the last step's gradients and the final parameters (full tensors, by name), the
evaluation output, the kernels a fused call ran and this process's NVRTC compiles / disk-cache
loads during the scenario (nvrtc.stats deltas). `worker(...)` is a spawned rank's body.
"""
from __future__ import annotations

import os
import traceback

import torch
import torch.nn.functional as F
from torch import nn

SCENARIOS = ("jit_ddp", "jit_fsdp2", "compile_ddp", "compile_fsdp2")
STEPS, BATCH, IN, HIDDEN, OUT = 3, 8, 16, 32, 8


def compile_unavailable() -> str | None:
    """Why torch.compile(backend="pyfuser") cannot run here, or None when it can."""
    try:
        import pyfuser
        pyfuser.compile                               # noqa: B018 - an AttributeError says no
        from pyfuser.frontend.fx import pyfuser_backend  # noqa: F401
    except (ImportError, AttributeError) as e:
        return ("pyfuser.compile / the 'pyfuser' torch.compile backend is not importable "
                f"(issue 16's backend is not in this tree): {type(e).__name__}: {e}")
    return None


def compiled(model):
    """torch.compile(model, backend="pyfuser") when the entry point is installed, else the same
    backend through pyfuser.compile (a source tree not installed with it)."""
    import torch._dynamo
    if "pyfuser" in torch._dynamo.list_backends():
        return torch.compile(model, backend="pyfuser")
    import pyfuser
    return pyfuser.compile(model)


def normalize(x, mu, sigma):
    return (x - mu) / sigma * 0.5


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


class Net(nn.Module):
    """Input normalisation (buffers), linear, layer norm + GELU, RMS norm, linear."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.register_buffer("mu", torch.randn(IN, generator=g) * 0.1)
        self.register_buffer("sigma", torch.rand(IN, generator=g) + 0.5)
        self.fc1 = nn.Linear(IN, HIDDEN)
        self.ln = nn.LayerNorm(HIDDEN)
        self.w = nn.Parameter(torch.ones(HIDDEN) + 0.1 * torch.randn(HIDDEN, generator=g))
        self.fc2 = nn.Linear(HIDDEN, OUT)

    def forward(self, x):
        x = (x - self.mu) / self.sigma * 0.5
        h = F.gelu(self.ln(self.fc1(x)))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w
        return self.fc2(h)


class FunctionalNet(Net):
    """Net whose normalisations are pyfuser.jit functions called with the module's tensors."""

    def __init__(self, fused_normalize, fused_rms):
        super().__init__()
        self._normalize, self._rms = fused_normalize, fused_rms

    def forward(self, x):
        x = self._normalize(x, self.mu, self.sigma)
        h = F.gelu(self.ln(self.fc1(x)))
        return self.fc2(self._rms(h, self.w))


class JitModule(nn.Module):
    """A module run through pyfuser.jit that DDP can wrap: the scripted module is registered (its
    parameters are the original module's, so DDP, optimizers and state_dict see them, and
    train() / eval() reach the flags pyfuser.jit folded); forward calls the fused graph."""

    def __init__(self, module: nn.Module):
        super().__init__()
        import pyfuser
        self.net = torch.jit.script(module)
        self.fused = pyfuser.jit(self.net)

    def forward(self, x):
        return self.fused(x)


def data(device="cpu"):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH, IN, generator=g)
    y = torch.randn(BATCH, OUT, generator=g)
    x_eval = torch.randn(BATCH, IN, generator=g)
    return x.to(device), y.to(device), x_eval.to(device)


def _full(t):
    """A DTensor's full value (FSDP2 shards), else the tensor; detached, on the CPU."""
    if t is None:
        return None
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    return t.detach().cpu().clone()


def _build(kind: str, world: int, device):
    """(module whose parameters train, callable of the forward, what reports kernels)."""
    import pyfuser
    torch.manual_seed(0)
    if kind == "eager":
        module = Net().to(device)
        return module, module, []
    if kind.startswith("jit_"):
        if kind == "jit_ddp":
            module = JitModule(Net().to(device))
            fwd = module
            if world > 1:
                from torch.nn.parallel import DistributedDataParallel as DDP
                fwd = DDP(module, device_ids=[device.index] if device.type == "cuda" else None)
            return module, fwd, [module.fused]
        fn_norm = pyfuser.jit(torch.jit.script(normalize))
        fn_rms = pyfuser.jit(torch.jit.script(rms_norm))
        module = FunctionalNet(fn_norm, fn_rms).to(device)
        if world > 1:
            _shard(module)
        return module, module, [fn_norm, fn_rms]
    module = Net().to(device)
    if kind == "compile_ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        wrapped = module if world == 1 else \
            DDP(module, device_ids=[device.index] if device.type == "cuda" else None)
        return module, compiled(wrapped), []
    if world > 1:
        _shard(module)
    return module, compiled(module), []


def _shard(module):
    from torch.distributed.fsdp import fully_shard
    fully_shard(module.fc1)
    fully_shard(module.fc2)
    fully_shard(module)


def train(kind: str, rank: int = 0, world: int = 1, device="cpu") -> dict:
    import torch.distributed as dist

    from pyfuser.runtime import nvrtc
    device = torch.device(device)
    before = dict(nvrtc.stats)
    x, y, x_eval = data(device)
    if world > 1:
        x, y = x.chunk(world)[rank], y.chunk(world)[rank]
    module, fwd, fused = _build(kind, world, device)
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    losses, kernels = [], 0
    for _ in range(STEPS):
        opt.zero_grad()
        loss = F.mse_loss(fwd(x), y)
        loss.backward()
        value = loss.detach().clone()
        if world > 1:
            dist.all_reduce(value)
            value /= world
        losses.append(value.item())
        kernels = sum(f.last_run.kernels for f in fused)
        grads = {n: _full(p.grad) for n, p in module.named_parameters()}
        opt.step()
    with torch.no_grad():
        out_eval = fwd(x_eval)
        eval_kernels = sum(f.last_run.kernels for f in fused)
    return {"losses": losses, "grads": grads,
            "params": {n: _full(p) for n, p in module.named_parameters()},
            "eval": out_eval.detach().cpu(), "train_kernels": kernels,
            "eval_kernels": eval_kernels,
            "nvrtc": nvrtc.stats["nvrtc"] - before["nvrtc"],
            "disk": nvrtc.stats["disk"] - before["disk"]}


def forget_compiled() -> None:
    """Drop Dynamo's graphs and pyfuser's in-memory kernels, fusions and regions, so that the
    next scenario compiles (or loads from its own disk cache) everything it runs."""
    import torch._dynamo

    from pyfuser.runtime import dispatch
    torch._dynamo.reset()
    dispatch.clear_caches()
    try:
        from pyfuser.frontend.fx.compile_graph import clear_cache
        clear_cache()
    except ImportError:               # no torch.compile backend in this tree
        pass


def train_eager(device="cpu") -> dict:
    """Net trained by eager PyTorch in one process (the reference of every scenario)."""
    return train("eager", device=device)


def worker(rank: int, world: int, init: str, outdir: str, scenarios, backend="gloo",
           device="cpu", timeout_s: float = 120) -> None:
    """A spawned rank: each scenario with its own shared cache directory `outdir/cache-<kind>`;
    results (or the traceback) saved to `outdir/<kind>-rank<r>.pt`. Collectives time out after
    `timeout_s` (a failing rank must not hang the others for torch's default 30 minutes)."""
    import datetime

    import torch.distributed as dist
    os.environ.pop("PYFUSER_DISABLE_DISK_CACHE", None)
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = f"cuda:{torch.cuda.current_device()}"
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        for kind in scenarios:
            forget_compiled()
            os.environ["PYFUSER_CACHE_DIR"] = os.path.join(outdir, f"cache-{kind}")
            try:
                result = train(kind, rank, world, device)
            except Exception:  # noqa: BLE001 - the test reports it
                result = {"error": traceback.format_exc()}
            dist.barrier()                    # every rank done: the cache holds all it will
            from pyfuser.runtime.nvrtc import kernel_entries
            result["cache_kernels"] = kernel_entries()
            torch.save(result, os.path.join(outdir, f"{kind}-rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def run_ranks(outdir, scenarios, world: int = 2, backend: str = "gloo", device: str = "cpu") -> dict:
    """`scenarios` run in `world` spawned ranks (a file:// store in `outdir`);
    {kind: [rank 0's result, rank 1's, ...]}."""
    torch.multiprocessing.start_processes(
        worker, args=(world, f"file://{outdir}/store", str(outdir), list(scenarios), backend,
                      device), nprocs=world, join=True, start_method="spawn")
    return {kind: [torch.load(os.path.join(outdir, f"{kind}-rank{r}.pt"), weights_only=False)
                   for r in range(world)] for kind in scenarios}


def check_ranks(results, single, eager, rtol=1e-5, atol=1e-6) -> None:
    """Every rank's result equals one process's (`single`, the same scenario on the whole
    batch): losses, gradients, parameters after the steps, evaluation output; `single` equals
    eager PyTorch's; the ranks shared one cache: each kernel was compiled by one rank only."""
    def close(a, b, what):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")
    for r in results:
        assert "error" not in r, r["error"]
    for got in results:
        assert len(got["losses"]) == STEPS
        close(torch.tensor(got["losses"]), torch.tensor(single["losses"]), "losses")
        assert got["grads"].keys() == single["grads"].keys() == got["params"].keys()
        for name in single["grads"]:
            close(got["grads"][name], single["grads"][name], f"grad of {name}")
            close(got["params"][name], single["params"][name], f"{name} after the steps")
        close(got["eval"], single["eval"], "evaluation output")
    close(torch.tensor(single["losses"]), torch.tensor(eager["losses"]), "losses vs eager")
    close(single["eval"], eager["eval"], "evaluation vs eager")
    # each kernel in the shared cache was compiled by exactly one rank (a rank may load the same
    # kernel more than once: identical kernels of two fusions); every rank got every kernel
    kernels = results[0]["cache_kernels"]
    assert kernels > 0
    assert sum(r["nvrtc"] for r in results) == kernels, ([r["nvrtc"] for r in results], kernels)
    assert all(r["nvrtc"] + r["disk"] >= kernels for r in results), results
