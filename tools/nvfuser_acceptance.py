"""Run nvFuser's own frontend test files against pyfuser, changing only the module names (and, for
the CPU run, the device): the acceptance check of docs/nvfuser_frontend.md.

    python tools/nvfuser_acceptance.py ORIG_DIR OUT_DIR cpu|gpu [pytest args...]

ORIG_DIR holds the unchanged test files (pytorch's test/test_nvfuser_frontend.py, NVIDIA/Fuser's
python_tests/test_python_frontend.py; they are not part of this repository). Each is rewritten
into OUT_DIR and run in its own pytest process (a file's FusionCache counts assume a fresh
process). Needs torch's test utilities (torch.testing._internal, which imports `expecttest`).
The rewrite:
- module names: `nvfuser`, `nvfuser._C`, `torch._C._nvfuser` -> `pyfuser` / `pyfuser._C`;
  `nvfuser.pytorch_utils`, `nvfuser.nvfuser_version` -> `pyfuser.pytorch_utils`,
  `pyfuser.nvfuser_version`; the old file's `if hasattr(torch._C, "_nvfuser"):` import guard
  (a test for the module's existence) -> `if True:`;
- cpu only: device "cuda" -> "cpu", `.cuda()` -> `.cpu()`, and the CUDA-only skip guards
  (RUN_NVFUSER, is_pre_volta) turned off.
"""
import pathlib
import subprocess
import sys

MODULES = [
    ("from torch._C._nvfuser import", "from pyfuser import"),
    ('if hasattr(torch._C, "_nvfuser"):', "if True:  # was: torch._C has the _nvfuser module"),
    ("from nvfuser._C import", "from pyfuser._C import"),
    ("from nvfuser.pytorch_utils import", "from pyfuser.pytorch_utils import"),
    ("from nvfuser.nvfuser_version import", "from pyfuser.nvfuser_version import"),
    ("from nvfuser import", "from pyfuser import"),
]
DEVICE = [
    ("device='cuda'", "device='cpu'"), ('device="cuda"', 'device="cpu"'),
    ("device = 'cuda'", "device = 'cpu'"), ('device = "cuda"', 'device = "cpu"'),
    (".cuda()", ".cpu()"),
    ("RUN_NVFUSER = RUN_CUDA and not TEST_WITH_ROCM", "RUN_NVFUSER = True"),
    ("def is_pre_volta():\n", "def is_pre_volta():\n    return False\n"),
]


def convert(text: str, kind: str) -> str:
    for old, new in MODULES + (DEVICE if kind == "cpu" else []):
        text = text.replace(old, new)
    return text


def main(argv) -> int:
    orig, out, kind, *pytest_args = argv
    out_dir = pathlib.Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    status = 0
    for src in sorted(pathlib.Path(orig).glob("*.py")):
        dst = out_dir / ("test_" + src.stem.removeprefix("test_") + ".py")
        dst.write_text(convert(src.read_text(), kind))
        print(f"== {src.name} ({kind})", flush=True)
        rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              "-rA", *pytest_args, dst.name], cwd=out_dir)
        status = status or rc
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
