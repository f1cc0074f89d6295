"""Training under torch.distributed: eager vs torch.compile (Inductor) vs pyfuser, DDP and FSDP2.

    torchrun --nproc_per_node=2 bench/distributed.py                 # 2 GPUs (any count: 1, 2, 8)
    PYTHONPATH=. python3 bench/distributed.py                        # world size 1, no torchrun
    torchrun --nproc_per_node=2 bench/distributed.py --dry-run       # CPU ranks (gloo), tiny sizes
    PYTHONPATH=. python3 bench/distributed.py --report DIR           # the table of every run in DIR

Models: HF transformers BERT (masked LM) and Llama (causal LM), random weights (no download),
built by tests/cpu/train_corpus.py where it is present (the training corpus of the compile
backend), else from the same configs here; `--size batch,seq,hidden,layers` per rank (default
8,512,768,4, bench/models.py's size; heads = hidden / 64, vocabulary 8192, dropout 0). Each
rank trains on its own seeded batch (weak scaling: the global batch is world x batch).

Cases: model x wrapper x mode. Wrappers: `ddp` (DistributedDataParallel), `fsdp2`
(torch.distributed.fsdp.fully_shard on every transformer layer, then the root). Modes: `eager`;
`inductor` (torch.compile's default backend); `pyfuser` (torch.compile(backend="pyfuser"): the
forward and backward fused; skipped, with the reason, where that backend is not importable);
`pyfuser_jit` (the model traced and run through pyfuser.jit inside DDP: under autograd only the
groups reading no parameter fuse, the rest runs eagerly; not under FSDP2, whose parameter
swaps a traced module does not see).

Per case, measured on every rank and gathered by rank 0:
- `step_ms`: median wall time of a training step (forward, loss, backward with the wrapper's
  collectives, SGD step), synchronised, after `--warmup` steps; rank 0's, and the slowest
  rank's median (`step_ms_max`); `tokens_per_s`: world x batch x seq / step time;
- `first_s`: the first step per rank (compilation included: every compiler starts from empty,
  rank-shared cache directories: pyfuser's (a fresh PYFUSER_CACHE_DIR per case), Inductor's and
  Triton's (fresh per run));
- `kernels`: distinct pyfuser kernels in the case's shared cache directory afterwards;
  `compiled` / `loaded`: per rank, kernels it compiled with NVRTC / loaded from that cache
  (runtime.nvrtc.stats), e.g. `[7, 5]` / `[5, 7]` for 12 kernels: each compiled by the rank
  that asked first, loaded by the other (the sum of `compiled` equals `kernels` when no rank
  compiled a kernel twice; `loaded` also counts a rank reloading a kernel it compiled, when
  two of its fusions have the same one);
- `loss_err`: the largest relative difference of the loss (averaged over the ranks) from
  eager's in the same world size, wrapper and size, over all steps (the same data and steps).
Output under `--out` (default $OUT/distributed, else ./bench_distributed):
`distributed_w<N>-<time>.json` (this run's rows, with every step's loss, and its setup) and
`distributed.md`, the table of every such file in that directory (the newest row of a case wins),
where runs of several world sizes, or of several subsets of cases, come together: the
weak-scaling efficiency (`scaling` = tokens/s at world N / (N x tokens/s at world 1), same case
and size) and `loss_err` (against eager's row of the same model, wrapper, size and world) are
computed there. Run the script once per world size (or subset) into one directory. New cases
stop starting after `--budget` seconds.
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import socket
import statistics
import sys
import tempfile
import time
import traceback
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "cpu"))

MODELS = ("bert", "llama")
WRAPS = ("ddp", "fsdp2")
MODES = ("eager", "inductor", "pyfuser", "pyfuser_jit")


# ---- setup ----------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(device_type: str):
    """(rank, world, device): torchrun's environment, or a world of one without it."""
    import torch.distributed as dist
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(_free_port()))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device_type == "cuda":
        torch.cuda.set_device(local % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo",
                            timeout=datetime.timedelta(seconds=600))
    return dist.get_rank(), dist.get_world_size(), device


def shared_dir(rank: int, given: str | None) -> str:
    """A directory every rank of this host uses: `given`, or a fresh one made by rank 0."""
    import torch.distributed as dist
    box = [given or (tempfile.mkdtemp(prefix="pyfuser_bench_dist_") if rank == 0 else None)]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def compile_unavailable() -> str | None:
    try:
        import pyfuser
        pyfuser.compile                                   # noqa: B018
        from pyfuser.frontend.fx import pyfuser_backend   # noqa: F401
    except (ImportError, AttributeError) as e:
        return f"torch.compile(backend='pyfuser') is not importable here: {e}"
    return None


# ---- models ---------------------------------------------------------------------------------------
def build_model(name: str, size, device):
    """The HF model (train mode, dropout 0) of train_corpus where present, else built here."""
    try:
        import train_corpus as TC
    except ImportError:
        TC = None
    batch, seq, hidden, layers = size
    heads, vocab = max(1, hidden // 64), 8192
    if TC is not None:
        s = TC.Size(batch=batch, seq=seq, hidden=hidden, layers=layers, heads=heads, vocab=vocab)
        return TC.TRAIN_CASES[name](device, s, dropout=0.0).model
    import logging

    import transformers as T
    logging.getLogger("transformers").setLevel(logging.ERROR)
    if name == "bert":
        cfg = T.BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                           num_attention_heads=heads, intermediate_size=4 * hidden,
                           max_position_embeddings=max(64, seq), hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0)
        cls = T.BertForMaskedLM
    else:
        cfg = T.LlamaConfig(vocab_size=vocab, hidden_size=hidden,
                            intermediate_size=(8 * hidden) // 3 // 8 * 8,
                            num_hidden_layers=layers, num_attention_heads=heads,
                            num_key_value_heads=max(1, heads // 2),
                            max_position_embeddings=max(64, seq), use_cache=False,
                            bos_token_id=0, eos_token_id=0, pad_token_id=0)
        cls = T.LlamaForCausalLM
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(cfg).to(device).train()


def batch_of(name: str, size, rank: int, device) -> dict:
    b, seq = size[0], size[1]
    g = torch.Generator().manual_seed(1000 + rank)
    ids = torch.randint(0, 8192, (b, seq), generator=g)
    inputs = {"input_ids": ids.to(device)}
    if name == "bert":
        mask = torch.ones_like(ids)
        mask[-1, seq - seq // 8:] = 0                 # a padded sequence
        inputs["attention_mask"] = mask.to(device)
    inputs["labels"] = torch.randint(0, 8192, (b, seq), generator=g).to(device)
    return inputs


def loss_of(out):
    if hasattr(out, "loss"):
        return out.loss
    if isinstance(out, dict):
        return out["loss"]
    return out[0]


class TracedJit(torch.nn.Module):
    """A model traced on example inputs and run through pyfuser.jit, as a module DDP can wrap
    (the traced module is registered: its parameters are the model's own)."""

    def __init__(self, model, inputs: dict):
        super().__init__()
        import pyfuser
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            self.traced = torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False,
                                          check_trace=False)
        self.fused = pyfuser.jit(self.traced)
        self.order = list(inputs)

    def forward(self, **inputs):
        return self.fused(*[inputs[k] for k in self.order])


def shard(model) -> None:
    from torch import nn
    from torch.distributed.fsdp import fully_shard
    for module in list(model.modules()):
        if isinstance(module, nn.ModuleList):
            for layer in module:
                fully_shard(layer)
    fully_shard(model)


def prepare(name, wrap, mode, size, rank, device):
    """(module whose parameters train, forward callable) for one case."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = build_model(name, size, device)
    ids = [device.index] if device.type == "cuda" else None
    if mode == "pyfuser_jit":
        if wrap != "ddp":
            raise NotImplementedError("pyfuser.jit of a whole model is DDP only (FSDP2 replaces "
                                      "parameters the traced module keeps)")
        module = TracedJit(model, batch_of(name, size, rank, device))
        return model, DDP(module, device_ids=ids)
    if wrap == "ddp":
        wrapped = DDP(model, device_ids=ids)
    else:
        shard(model)
        wrapped = model
    if mode == "eager":
        return model, wrapped
    if mode == "inductor":
        return model, torch.compile(wrapped)
    reason = compile_unavailable()
    if reason:
        raise NotImplementedError(reason)
    from torch import _dynamo
    if "pyfuser" in _dynamo.list_backends():
        return model, torch.compile(wrapped, backend="pyfuser")
    import pyfuser
    return model, pyfuser.compile(wrapped)


# ---- one case -------------------------------------------------------------------------------------
def run_case(name, wrap, mode, size, steps, warmup, dtype, rank, world, device) -> dict:
    import torch.distributed as dist

    from pyfuser.runtime import nvrtc
    before = dict(nvrtc.stats)
    model, fwd = prepare(name, wrap, mode, size, rank, device)
    inputs = batch_of(name, size, rank, device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    amp = torch.autocast(device.type, dtype=torch.bfloat16) if dtype == "bfloat16" else None

    def step():
        opt.zero_grad(set_to_none=True)
        if amp is not None:
            with amp:
                loss = loss_of(fwd(**inputs))
        else:
            loss = loss_of(fwd(**inputs))
        loss.backward()
        opt.step()
        return loss.detach().float()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    losses = []
    dist.barrier()
    t0 = time.perf_counter()
    losses.append(step())
    sync()
    first = time.perf_counter() - t0
    for _ in range(warmup):
        losses.append(step())
    sync()
    dist.barrier()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        losses.append(step())
        sync()
        times.append(time.perf_counter() - t)
    mean_losses = torch.stack(losses)
    dist.all_reduce(mean_losses)
    mean_losses /= world
    return {"step_ms": statistics.median(times) * 1e3, "first_s": first,
            "losses": [float(x) for x in mean_losses.cpu()],
            "compiled": nvrtc.stats["nvrtc"] - before["nvrtc"],
            "loaded": nvrtc.stats["disk"] - before["disk"]}


def _cleanup():
    """Forget the case: Dynamo's graphs and every in-memory cache of compiled kernels, fusions
    and regions (the next case's compile work starts from its own empty disk cache)."""
    import gc

    from torch import _dynamo

    from pyfuser.runtime import dispatch
    _dynamo.reset()
    dispatch.clear_caches()
    try:
        from pyfuser.frontend.fx.compile_graph import clear_cache
        clear_cache()
    except ImportError:               # no torch.compile backend in this tree
        pass
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---- tables ---------------------------------------------------------------------------------------
COLUMNS = ["model", "wrap", "mode", "world", "dtype", "size", "step_ms", "step_ms_max", "tokens_per_s",
           "scaling", "first_s", "kernels", "compiled", "loaded", "loss_err", "error"]


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e-2 and v != 0 else f"{v:.2f}" if abs(v) < 100 else f"{v:.0f}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def _key(row) -> tuple:
    return row["model"], row["wrap"], row["dtype"], row.get("size", "")


def report(out_dir: str) -> str:
    """Markdown table of every distributed_w*.json in `out_dir`, with weak-scaling efficiency."""
    latest, setups = {}, []
    for path in sorted(glob.glob(os.path.join(out_dir, "distributed_w*.json"))):  # oldest first
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        for r in data["rows"]:
            r.setdefault("size", "x".join(map(str, data["setup"]["size"])))
            latest[_key(r) + (r["mode"], r["world"])] = r      # a newer run of a case wins
        setups.append(data["setup"])
    rows = list(latest.values())
    for r in rows:
        if not r.get("tokens_per_s"):
            continue
        one = latest.get(_key(r) + (r["mode"], 1))
        if one and one.get("tokens_per_s"):
            r["scaling"] = r["tokens_per_s"] / (r["world"] * one["tokens_per_s"])
        eager = latest.get(_key(r) + ("eager", r["world"]))
        if eager and eager.get("losses") and r.get("losses"):
            r["loss_err"] = max(abs(a - b) / max(abs(b), 1e-12)
                                for a, b in zip(r["losses"], eager["losses"]))
    rows.sort(key=lambda r: (_key(r), MODES.index(r["mode"]) if r["mode"] in MODES else 9,
                             r["world"]))
    from bench.common import markdown
    used = [c for c in COLUMNS if any(r.get(c) not in (None, "") for r in rows)]
    lines = [f"- world {s['world']}: {s['device']}, torch {s['torch']}, size {s['size']} "
             f"(batch, seq, hidden, layers per rank), {s['steps']} timed steps, {s['date']}"
             for s in setups]
    return "\n".join(lines) + "\n\n" + markdown([[_fmt(r.get(c)) for c in used] for r in rows],
                                               used) + "\n"


def speed_rows(out_dir: str) -> list:
    """Plot rows of the runs in `out_dir`: per model, wrapper and world size, each mode's step
    speed as % of eager's in the same case (eager = 100), for bench/plot.py."""
    latest = {}
    for path in sorted(glob.glob(os.path.join(out_dir, "distributed_w*.json"))):
        with open(path, encoding="utf-8") as f:
            for r in json.load(f)["rows"]:
                if r.get("step_ms"):
                    latest[(r["model"], r["wrap"], r["world"], r["dtype"], r["mode"])] = r
    labels = {"eager": "eager", "inductor": "torch.compile", "pyfuser": "pyfuser"}
    out = []
    for (m, w, world, d, mode), r in sorted(latest.items()):
        if mode != "eager":
            continue
        row = {"workload": f"{m} {w} x{world} {d}"}
        for mo, label in labels.items():
            t = latest.get((m, w, world, d, mo), {}).get("step_ms")
            row[label] = 100.0 * r["step_ms"] / t if t else None
        out.append(row)
    return out


# ---- main -----------------------------------------------------------------------------------------
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--wraps", default=",".join(WRAPS))
    p.add_argument("--modes", default="", help=f"comma list of {', '.join(MODES)} (default: all; "
                   "without inductor with --dry-run)")
    p.add_argument("--size", default="", help="batch,seq,hidden,layers per rank")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--out", default="")
    p.add_argument("--cache-dir", default="", help="the ranks' shared cache root (default: new)")
    p.add_argument("--budget", type=float, default=480.0)
    p.add_argument("--dry-run", action="store_true", help="CPU ranks (gloo), tiny sizes")
    p.add_argument("--report", metavar="DIR", help="only print the table of the runs in DIR")
    p.add_argument("--plot", metavar="FILE", help="with --report: also draw each mode's step "
                   "speed as %% of eager's into FILE (.svg or .png; needs matplotlib)")
    args = p.parse_args(argv)
    if args.report:
        print(report(args.report))
        if args.plot:
            from bench.common import _plot_module
            _plot_module().plot(speed_rows(args.report), args.plot,
                                "bench/distributed.py: training step, DDP / FSDP2",
                                xlabel="speed as % of eager's (eager's step time / the mode's)")
        return 0

    import torch.distributed as dist
    device_type = "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"
    size = tuple(int(x) for x in (args.size or ("2,16,64,2" if device_type == "cpu"
                                                 else "8,512,768,4")).split(","))
    assert len(size) == 4, "--size batch,seq,hidden,layers"
    rank, world, device = init_distributed(device_type)
    out_dir = args.out or os.path.join(os.environ.get("OUT", "."), "distributed" if
                                       os.environ.get("OUT") else "bench_distributed")
    root = shared_dir(rank, args.cache_dir or None)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(root, "inductor")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(root, "triton")
    modes = args.modes or (",".join(m for m in MODES if m != "inductor") if args.dry_run
                           else ",".join(MODES))
    # (pyfuser.jit of a whole model is DDP only: FSDP2 swaps parameters a traced module keeps)
    cases = [(m, w, mode) for w in args.wraps.split(",") for m in args.models.split(",")
             for mode in modes.split(",") if not (mode == "pyfuser_jit" and w != "ddp")]
    gpu = torch.cuda.get_device_name() if device_type == "cuda" else "CPU (kernel interpreter)"
    setup = {"world": world, "device": f"{world} x {gpu}", "torch": torch.__version__,
             "size": list(size), "steps": args.steps, "warmup": args.warmup,
             "date": datetime.date.today().isoformat()}
    json_path = os.path.join(out_dir, "distributed_w{}-{}.json".format(
        world, datetime.datetime.now().strftime("%Y%m%d-%H%M%S")))

    def save(rows):
        os.makedirs(out_dir, exist_ok=True)
        with open(json_path, "w") as f:
            json.dump({"setup": setup, "rows": rows}, f, indent=1)

    start, rows = time.perf_counter(), []
    for name, wrap, mode in cases:
        row = {"model": name, "wrap": wrap, "mode": mode, "world": world, "dtype": args.dtype,
               "size": "x".join(map(str, size))}
        go = [time.perf_counter() - start <= args.budget]
        dist.broadcast_object_list(go, src=0)
        if not go[0]:
            row["error"] = "skipped: time budget"
            rows.append(row)
            continue
        os.environ["PYFUSER_CACHE_DIR"] = os.path.join(root, "pyfuser", f"{name}-{wrap}-{mode}")
        try:
            res = run_case(name, wrap, mode, size, args.steps, args.warmup, args.dtype, rank,
                           world, device)
        except Exception as e:  # noqa: BLE001 - one case's failure is a row, not the end
            first = (str(e).splitlines() or [""])[0][:160]
            if isinstance(e, NotImplementedError):
                res = {"error": f"not run: {first}"}
            else:
                traceback.print_exc()
                res = {"error": f"{type(e).__name__}: {first}"}
        every = [None] * world
        dist.all_gather_object(every, res)         # (every rank is done with the case)
        _cleanup()
        errors = [r["error"] for r in every if "error" in r]
        if errors:
            row["error"] = errors[0]
        else:
            r0 = every[0]
            row.update(step_ms=r0["step_ms"], step_ms_max=max(r["step_ms"] for r in every),
                       tokens_per_s=world * size[0] * size[1] / (r0["step_ms"] / 1e3),
                       first_s=max(r["first_s"] for r in every), first_s_ranks=[
                           r["first_s"] for r in every],
                       losses=r0["losses"])
            if mode != "eager" and mode != "inductor":
                from pyfuser.runtime.nvrtc import kernel_entries
                row.update(compiled=[r["compiled"] for r in every],
                           loaded=[r["loaded"] for r in every], kernels=kernel_entries())
        rows.append(row)
        if rank == 0:
            print(json.dumps({k: v for k, v in row.items() if k != "losses"}), flush=True)
            save(rows)                     # after every case: a run cut short keeps its rows
    if rank == 0:
        text = report(out_dir)
        with open(os.path.join(out_dir, "distributed.md"), "w") as f:
            f.write(text)
        print(text)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
