"""Host cost of a call, and start-up: pyfuser.jit against eager and torch.compile (one GPU, one run).

    PYTHONPATH=. python3 bench/host.py              # GPU; writes $OUT/bench_host.md (+ .json)
    PYTHONPATH=. python3 bench/host.py --sections startup,pointwise --budget 200
    PYTHONPATH=. python3 bench/host.py --smoke      # CPU, tiny sizes: the script's own check

Cases (float32, under torch.no_grad()):
  (a) pointwise: `a + b * c` on three [1024] tensors (one fusion);
  (b) block: a pre-norm transformer block (LayerNorm, QKV linear, scaled-dot-product attention,
      projection, GELU MLP, residuals), d=768, 12 heads, [8, 512, 768], as a scripted module;
  (c) bert: HF transformers BertModel (4 layers, hidden 768, 12 heads, random weights, no
      download), ids and attention mask [8, 512], traced.
Each through: eager (the Python function / module), torch.compile, torch.compile(mode=
"reduce-overhead"), pyfuser.jit, pyfuser.jit(cuda_graphs=True); (a) also pyfuser.jit with the
native runner off (its Python path). Per variant, after a check against eager: the first call
(compile) time; **host** µs per call: calls enqueued while a sleep kernel keeps the GPU busy
(median of rounds, variants in turns), i.e. what a call costs the CPU; **wall** µs per call:
back-to-back calls then a synchronize, divided by the count; **kernels** and host-to-device
**copies** per call, from torch.profiler.
Start-up, each in a fresh process (pyfuser's bytecode compiled ahead, as an install does):
`import torch`, `import pyfuser` (and `pyfuser.jit`), then a
scripted GELU on [8192, 3072] through pyfuser.jit: the first call (jit + call + synchronize)
with an empty disk cache (cold compile) and again in a new process from that cache; whether
NVRTC was loaded and whether anything was built with a C++ compiler.

The native cached-call runner is built first (an install step, timed apart) in the user's cache.
Every section catches its own failure (reported in the table); `--budget` seconds (default 450)
bound the run: what would start after it is skipped, and the whole run fits 8 minutes.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

SMOKE = False


def _sync():
    if torch.cuda.is_available() and not SMOKE:
        torch.cuda.synchronize()


def _tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for e in x for t in _tensors(e)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    return []


def _differs(got, want) -> str:
    g, w = _tensors(got), _tensors(want)
    if len(g) != len(w):
        return f"{len(g)} tensors, eager has {len(w)}"
    for i, (a, b) in enumerate(zip(g, w)):
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"output {i}: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"
        if not torch.allclose(a.float(), b.float(), rtol=2e-3, atol=2e-3):
            return f"output {i}: max abs err {float((a.float() - b.float()).abs().max()):.3g}"
    return ""


# ---- timing ------------------------------------------------------------------------------------
def _sleep_cycles(us: float) -> int:
    return int(max(us, 1000.0) * 2000 * 2)      # twice the expected time at ~2 GHz


def host_us(variants: dict, est: dict, rounds: int = 9) -> dict:
    """{name: host µs per call}: per round and variant, n calls enqueued behind a sleep kernel
    that outlasts them (n keeps the queued kernels under the launch queue's depth), the order
    rotating; median round."""
    names = list(variants)
    times = {k: [] for k in names}
    for r in range(rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            fn, n = variants[k], est[k][1]
            _sync()
            if not SMOKE:
                torch.cuda._sleep(_sleep_cycles(est[k][0] * n))
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            times[k].append((time.perf_counter() - t0) / n * 1e6)
            _sync()
    return {k: statistics.median(v) for k, v in times.items()}


def wall_us(fn, calls: int, rounds: int = 5) -> float:
    out = []
    for _ in range(rounds):
        _sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        _sync()
        out.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(out)


def profile_counts(fn, calls: int = 3) -> tuple:
    """(kernels, host-to-device copies) per call, from torch.profiler."""
    if SMOKE:
        return None, None
    from torch.profiler import ProfilerActivity, profile
    fn()
    _sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        _sync()
    kernels = h2d = 0
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = e.name.lower()
        if name.startswith("memcpy"):
            h2d += "htod" in name.replace(" ", "")
        elif not name.startswith("memset"):
            kernels += 1
    return kernels / calls, h2d / calls


# ---- cases ---------------------------------------------------------------------------------------
def _pointwise(a, b, c):
    return a + b * c


class Block(torch.nn.Module):
    """A pre-norm transformer block."""

    def __init__(self, d: int = 768, heads: int = 12, ff: int = 3072):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, ff)
        self.fc2 = torch.nn.Linear(ff, d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        h = self.heads
        q = q.view(b, t, h, c // h).transpose(1, 2)
        k = k.view(b, t, h, c // h).transpose(1, 2)
        v = v.view(b, t, h, c // h).transpose(1, 2)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.proj(y)
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


def case_pointwise(device):
    n = 64 if SMOKE else 1024
    xs = [torch.randn(n, device=device) for _ in range(3)]
    return _pointwise, xs, torch.jit.script(_pointwise)


def case_block(device):
    torch.manual_seed(0)
    d, heads, ff, b, t = (64, 4, 128, 2, 16) if SMOKE else (768, 12, 3072, 8, 512)
    m = Block(d, heads, ff).to(device).eval()
    x = torch.randn(b, t, d, device=device)
    return m, [x], torch.jit.script(copy.deepcopy(m))


def case_bert(device):
    import logging
    import transformers
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    h, layers, heads, ff, b, t, vocab = (64, 2, 4, 128, 2, 16, 100) if SMOKE else \
        (768, 4, 12, 3072, 8, 512, 30522)
    cfg = transformers.BertConfig(vocab_size=vocab, hidden_size=h, num_hidden_layers=layers,
                                  num_attention_heads=heads, intermediate_size=ff,
                                  max_position_embeddings=max(512, t), return_dict=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.BertModel(cfg).eval().to(device)
        ids = torch.randint(0, vocab, (b, t), device=device)
        mask = torch.ones(b, t, dtype=torch.long, device=device)
        mask[1, t // 2:] = 0
        traced = torch.jit.trace(model, (ids, mask), strict=False, check_trace=False)
    return model, [ids, mask], traced


CASES = {"pointwise": ("(a) 3-input pointwise fusion a + b * c, [1024]", case_pointwise),
         "block": ("(b) transformer block, scripted, [8, 512, 768]", case_block),
         "bert": ("(c) BERT (HF, 4 layers, hidden 768), traced, [8, 512]", case_bert)}


def _variants(name, eager, inputs, ts):
    """{variant: builder() -> callable()}."""
    import pyfuser

    def pyf(**kw):
        return lambda: (lambda f: lambda: f(*inputs))(pyfuser.jit(ts, **kw))

    def tc(**kw):
        def build():
            c = torch.compile(eager, **kw)
            if kw.get("mode") == "reduce-overhead":
                def call():
                    torch.compiler.cudagraph_mark_step_begin()
                    return c(*inputs)
                return call
            return lambda: c(*inputs)
        return build

    out = {"eager": lambda: (lambda: eager(*inputs))}
    if not SMOKE:
        out["torch.compile"] = tc()
        out["torch.compile reduce-overhead"] = tc(mode="reduce-overhead")
    out["pyfuser"] = pyf()
    if name == "pointwise":
        out["pyfuser, native runner off"] = _python_path(ts, inputs)
    if not SMOKE:
        out["pyfuser CUDA graphs"] = pyf(cuda_graphs=True)
    return out


def _python_path(ts, inputs):
    """pyfuser.jit whose programs are never handed to the native runner (PYFUSER_NATIVE=0
    while its plan is made and first hit)."""
    def build():
        import pyfuser
        f = pyfuser.jit(ts)
        old = os.environ.get("PYFUSER_NATIVE")
        os.environ["PYFUSER_NATIVE"] = "0"
        try:
            f(*inputs)
            f(*inputs)
            f(*inputs)
        finally:
            if old is None:
                os.environ.pop("PYFUSER_NATIVE", None)
            else:
                os.environ["PYFUSER_NATIVE"] = old
        return lambda: f(*inputs)
    return build


def run_case(name, device, deadline) -> list:
    title, make = CASES[name]
    eager, inputs, ts = make(device)
    rows, calls, est = [], {}, {}
    with torch.no_grad():
        want = eager(*inputs)
        for vname, build in _variants(name, eager, inputs, ts).items():
            row = {"case": name, "variant": vname}
            rows.append(row)
            if time.perf_counter() > deadline:
                row["error"] = "skipped: time budget"
                continue
            try:
                t0 = time.perf_counter()
                fn = build()
                got = fn()
                _sync()
                row["first_call_s"] = time.perf_counter() - t0
                bad = _differs(got, want)
                for _ in range(3):
                    got = fn()
                bad = bad or _differs(got, want)
                if bad:
                    row["error"] = f"differs from eager: {bad}"
                    continue
                _sync()
                t0 = time.perf_counter()
                for _ in range(3):
                    fn()
                one = (time.perf_counter() - t0) / 3 * 1e6          # rough host estimate
                _sync()
                k, h2d = profile_counts(fn)
                row["kernels"], row["h2d_copies"] = k, h2d
                n = max(1, min(100, int(400 // max(k or 1, 1)), int(20000 // max(one, 1))))
                est[vname] = (one, n)
                calls[vname] = fn
                row["wall_us"] = wall_us(fn, max(3, min(1000, int(200000 // max(one, 1)))))
            except Exception as e:  # noqa: BLE001 - one variant's failure is a row
                traceback.print_exc()
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        if calls:
            hosts = host_us(calls, est)
            for row in rows:
                if row["variant"] in hosts:
                    row["host_us"] = hosts[row["variant"]]
    for row in rows:
        print(json.dumps(row), flush=True)
    return rows


# ---- start-up ------------------------------------------------------------------------------------
_STARTUP = r'''
import json, os, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import pyfuser
pyfuser.jit
t2 = time.perf_counter()
device = "cuda" if torch.cuda.is_available() and not os.environ.get("BENCH_SMOKE") else "cpu"
n = (64, 64) if device == "cpu" else (8192, 3072)
x = torch.randn(*n, device=device)
if device == "cuda":
    torch.cuda.synchronize()


def gelu(x):
    return torch.nn.functional.gelu(x)


t3 = time.perf_counter()
s = torch.jit.script(gelu)
t4 = time.perf_counter()
f = pyfuser.jit(s)
t5 = time.perf_counter()
with torch.no_grad():
    y = f(x)
    if device == "cuda":
        torch.cuda.synchronize()
    t6 = time.perf_counter()
    ok = torch.allclose(y, gelu(x), rtol=1e-5, atol=1e-5)
    f(x)
    if device == "cuda":
        torch.cuda.synchronize()
from pyfuser.runtime import disk_cache
print(json.dumps({"import_torch_s": t1 - t0, "import_pyfuser_s": t2 - t1, "script_s": t4 - t3,
                  "jit_s": t5 - t4, "first_call_s": t6 - t5, "after_import_s": t6 - t4,
                  "matches": bool(ok), "kernels": f.last_run.kernels,
                  "nvrtc_loaded": "cuda.bindings.nvrtc" in sys.modules,
                  "disk_hits": disk_cache.stats["hits"], "disk_stores": disk_cache.stats["stores"]}))
'''


def startup(deadline) -> list:
    rows = []
    d = tempfile.mkdtemp(prefix="pyfuser_bench_startup_")
    script = os.path.join(d, "startup_child.py")
    with open(script, "w") as f:
        f.write(_STARTUP)
    cache = os.path.join(d, "cache")
    env = dict(os.environ, PYFUSER_CACHE_DIR=cache, PYTHONPATH=ROOT + os.pathsep +
               os.environ.get("PYTHONPATH", ""))
    env.pop("PYFUSER_DUMP", None)
    if SMOKE:
        env["BENCH_SMOKE"] = "1"
    # bytecode compiled ahead, as `pip install` (and `make setup`) do: a source tree whose
    # __pycache__ cannot be written (or PYTHONDONTWRITEBYTECODE) would compile every module of
    # pyfuser in every process (about 0.19 s on the GPU machine)
    env["PYTHONPYCACHEPREFIX"] = os.path.join(d, "pycache")
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0",
                    os.path.join(ROOT, "pyfuser")], env=env, capture_output=True, timeout=120)
    for label in ("cold (empty disk cache)", "warm (from the disk cache, new process)",
                  "warm, again"):
        row = {"case": "startup", "variant": label}
        rows.append(row)
        if time.perf_counter() > deadline:
            row["error"] = "skipped: time budget"
            continue
        try:
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True,
                               timeout=180)
            row["process_s"] = time.perf_counter() - t0
            line = [x for x in p.stdout.splitlines() if x.startswith("{")]
            if p.returncode or not line:
                row["error"] = (p.stderr.strip().splitlines() or ["no output"])[-1][:200]
                continue
            row.update(json.loads(line[-1]))
            row["cpp_build"] = os.path.isdir(os.path.join(cache, "native")) or \
                "building the native" in p.stderr
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {e}"
        print(json.dumps(row), flush=True)
    return rows


# ---- report --------------------------------------------------------------------------------------
def _f(v, digits=1):
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def report(meta, startup_rows, case_rows) -> str:
    lines = [f"bench/host.py on {meta['gpu']}, torch {meta['torch']}, {meta['date']}; native "
             f"runner: {meta['native']}", ""]
    if startup_rows:
        lines += ["Start-up (fresh processes; GELU [8192, 3072] through pyfuser.jit):", "",
                  "| run | import torch s | import pyfuser s | jit s | first call s | jit + first "
                  "call s | NVRTC loaded | C++ build | matches | error |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in startup_rows:
            lines.append(f"| {r['variant']} | {_f(r.get('import_torch_s'), 3)} | "
                         f"{_f(r.get('import_pyfuser_s'), 3)} | {_f(r.get('jit_s'), 3)} | "
                         f"{_f(r.get('first_call_s'), 3)} | {_f(r.get('after_import_s'), 3)} | "
                         f"{_f(r.get('nvrtc_loaded'))} | {_f(r.get('cpp_build'))} | "
                         f"{_f(r.get('matches'))} | {r.get('error', '')} |")
        lines.append("")
    for name, (title, _) in CASES.items():
        rows = [r for r in case_rows if r["case"] == name]
        if not rows:
            continue
        lines += [title + ":", "",
                  "| variant | host µs/call | wall µs/call | kernels/call | H2D copies/call | "
                  "first call s | error |", "|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['variant']} | {_f(r.get('host_us'))} | {_f(r.get('wall_us'))} | "
                         f"{_f(r.get('kernels'))} | {_f(r.get('h2d_copies'))} | "
                         f"{_f(r.get('first_call_s'), 2)} | {r.get('error', '')} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    global SMOKE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default="startup,pointwise,block,bert")
    ap.add_argument("--budget", type=float, default=450.0)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny sizes, no torch.compile")
    args = ap.parse_args(argv)
    SMOKE = args.smoke
    start = time.perf_counter()
    deadline = start + args.budget
    if not SMOKE and not torch.cuda.is_available():
        print("bench/host.py needs a CUDA device (--smoke runs the script on the CPU)")
        return 2
    device = "cpu" if SMOKE else "cuda"
    sections = [s for s in args.sections.split(",") if s]
    meta = {"gpu": torch.cuda.get_device_name() if device == "cuda" else "CPU (smoke)",
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    t0 = time.perf_counter()
    try:
        from pyfuser.runtime import native
        mod = native.build() if device == "cuda" else None
        meta["native"] = (f"built/loaded in {time.perf_counter() - t0:.1f} s (install step)"
                          if mod is not None else "unavailable")
    except Exception as e:  # noqa: BLE001
        meta["native"] = f"unavailable: {type(e).__name__}: {e}"
    startup_rows, case_rows = [], []
    if "startup" in sections:
        startup_rows = startup(deadline)
    for name in CASES:
        if name not in sections:
            continue
        try:
            case_rows += run_case(name, device, deadline)
        except Exception as e:  # noqa: BLE001 - a case that cannot even be built
            traceback.print_exc()
            case_rows.append({"case": name, "variant": "-",
                              "error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"})
    text = report(meta, startup_rows, case_rows)
    print(text)
    print(f"total {time.perf_counter() - start:.0f} s")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "bench_host.md"), "w") as f:
            f.write(text + "\n")
        with open(os.path.join(out, "bench_host.json"), "w") as f:
            json.dump({"meta": meta, "startup": startup_rows, "cases": case_rows}, f, indent=1)
    failed = any("error" in r and not r["error"].startswith("skipped") for r in
                 startup_rows + case_rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
