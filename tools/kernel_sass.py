"""The CUBINs and SASS instruction counts of the kernels pyfuser generates for chosen rows of
bench/normalization.py (what the kernels execute per element, without hardware counters):

    PYTHONPATH=. python3 tools/kernel_sass.py --only "softmax 8192,cross_entropy" --out DIR

Runs each row once through pyfuser with the `cuda_to_file` dump into DIR/<row>/, compiles each
dumped source with pyfuser's NVRTC options for this machine's GPU (sm_90 without one), writes
`<kernel>.cubin` beside it, then runs `cuobjdump -sass` (when it is on the PATH) into
`<kernel>.sass` and prints each kernel's instruction count by opcode (the first word), the
largest first. Needs a GPU: the benchmark's rows make their inputs on CUDA, at its sizes.
"""
from __future__ import annotations

import collections
import glob
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, ROOT)


def sass_histogram(sass: str) -> collections.Counter:
    """Opcode -> count over the SASS text's instruction lines (`/*0123*/  OPC.MOD args ;`)."""
    ops = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m:
            ops[m.group(1).split(".")[0]] += 1
    return ops


def main() -> int:
    from profile_reduction_rows import parse_rows, row_parser
    ap = row_parser("softmax 8192")
    ap.add_argument("--out", default="/tmp/kernel_sass")
    a, rows = parse_rows(ap)
    if rows is None:
        return 0
    import torch
    from pyfuser.runtime import nvrtc
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtypes = [getattr(torch, d) for d in a.dtypes.split(",")]
    os.environ["PYFUSER_DUMP"] = "cuda_to_file"
    os.environ["PYFUSER_DISABLE_DISK_CACHE"] = "1"
    import pyfuser
    for name, fn, make in rows:
        for dt in dtypes:
            d = os.path.join(a.out, re.sub(r"[^\w.-]+", "_", f"{name}_{dt}".replace("torch.", "")))
            os.makedirs(d, exist_ok=True)
            os.environ["PYFUSER_DUMP_DIR"] = d
            xs = [x.to(device) if hasattr(x, "to") else x for x in make(dt)]
            pyfuser.jit(torch.jit.script(fn))(*xs)
            for src in sorted(glob.glob(os.path.join(d, "*.cu"))):
                kname = os.path.basename(src)[:-3]
                b = nvrtc.compile_cuda(open(src).read(), kname)
                cubin = src[:-3] + ".cubin"
                with open(cubin, "wb") as f:
                    f.write(b.cubin)
                if shutil.which("cuobjdump") is None:
                    print(f"{name} {dt}: {kname}: {len(b.cubin)} bytes of CUBIN "
                          "(no cuobjdump here)")
                    continue
                sass = subprocess.run(["cuobjdump", "-sass", cubin], capture_output=True,
                                      text=True).stdout
                with open(src[:-3] + ".sass", "w") as f:
                    f.write(sass)
                ops = sass_histogram(sass)
                top = ", ".join(f"{o} {c}" for o, c in ops.most_common(18))
                print(f"{name} {dt}: {kname}: {sum(ops.values())} instructions: {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
