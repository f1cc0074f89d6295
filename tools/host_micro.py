"""Host cost of single torch calls the FX backend's graphs make, on the GPU machine: views as
methods and as aten OpOverloads, Inductor's `_reinterpret_tensor`, a CUDA allocation, and the
Philox draw of a random kernel's launch (rng.launch_state against the generator's own calls),
with and without autocast. Microseconds a call (timeit, after a warm-up).

    PYTHONPATH=. python3 tools/host_micro.py

Measured on an H200 host (2026-11-29): a view 1.2-1.3 µs, `_reinterpret_tensor` 0.6,
torch.empty_strided 2.1, launch_state 3.5 against 1.0 for the generator's calls.
"""
import torch, timeit, sys
sys.path.insert(0, ".")
from torch._C._dynamo.guards import _reinterpret_tensor as rt, assert_size_stride as ass
x = torch.randn(8, 512, 768, device="cuda", dtype=torch.bfloat16)
w = torch.randn(768, 768, device="cuda", dtype=torch.bfloat16)
n = 20000
def T(name, f):
    for _ in range(1000): f()
    t = timeit.timeit(f, number=n) / n * 1e6
    print(f"{name:40s} {t:6.2f} us")
for ac in (False, True):
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=ac):
        print("autocast", ac)
        T("x.view(4096,768)", lambda: x.view(4096, 768))
        T("aten.view.default", lambda: torch.ops.aten.view.default(x, [4096, 768]))
        T("w.t()", lambda: w.t())
        T("aten.t.default", lambda: torch.ops.aten.t.default(w))
        T("x.transpose(1,2)", lambda: x.transpose(1, 2))
        T("reinterpret", lambda: rt(x, (4096, 768), (768, 1), 0))
        T("assert_size_stride+reinterpret", lambda: (ass(x, (8, 512, 768), (393216, 768, 1)), rt(x, (4096, 768), (768, 1), 0)))
        T("torch.empty_strided 1 MB", lambda: torch.empty_strided((512, 1024), (1024, 1), dtype=torch.bfloat16, device="cuda"))
        T("x.stride()+x.shape", lambda: (x.shape, x.stride()))
from pyfuser.runtime.rng import launch_state
T("rng launch_state", lambda: launch_state(torch.device("cuda", 0), 4))
g = torch.cuda.default_generators[0]
T("gen get/set offset+seed", lambda: (g.set_offset(g.get_offset() + 4), g.initial_seed()))
