"""Where a new process's first call goes: cProfile of import + jit + first call of a scripted GELU.

    PYTHONPATH=. python3 tools/profile_first_call.py [N]    # N: rows printed (default 40)

Runs itself twice in fresh processes with one fresh PYFUSER_CACHE_DIR: the first fills the disk
cache (cold), the second (warm) is profiled and printed, by cumulative time then by own time.
"""
import os
import subprocess
import sys
import tempfile


def child(rows: int) -> None:
    import cProfile
    import pstats
    import time
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(8192, 3072, device=device)
    if device == "cuda":
        torch.cuda.synchronize()
    pr = cProfile.Profile()
    t = time.perf_counter()
    pr.enable()
    import pyfuser

    def gelu(x):
        return torch.nn.functional.gelu(x)
    f = pyfuser.jit(torch.jit.script(gelu))
    with torch.no_grad():
        f(x)
    if device == "cuda":
        torch.cuda.synchronize()
    pr.disable()
    print(f"import + jit + first call: {time.perf_counter() - t:.3f} s")
    if os.environ.get("PROFILE_PRINT"):
        st = pstats.Stats(pr)
        st.sort_stats("cumulative").print_stats(rows)
        st.sort_stats("tottime").print_stats(rows)


if __name__ == "__main__":
    rows = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] != "--child" else 40
    if "--child" in sys.argv:
        child(int(sys.argv[-1]))
        sys.exit(0)
    env = dict(os.environ, PYFUSER_CACHE_DIR=tempfile.mkdtemp(prefix="pyfuser_prof_"))
    for label, extra in (("cold", {}), ("warm", {"PROFILE_PRINT": "1"})):
        print(f"=== {label}", flush=True)
        subprocess.run([sys.executable, __file__, "--child", str(rows)],
                       env=dict(env, **extra), check=False)
