"""The README's Python examples run as written (on a CPU-only machine too: they pick the device
by what is present), each as its own script, as a newcomer would paste it."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[2]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_readme_has_examples():
    assert len(BLOCKS) >= 2
    assert all("cuda\" if torch.cuda.is_available()" in b for b in BLOCKS if "device" in b)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index, tmp_path):
    script = tmp_path / f"readme_{index}.py"
    script.write_text(BLOCKS[index])
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYFUSER_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("PYFUSER_CPU_EXECUTOR", None)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if "fused.last_run" in BLOCKS[index]:
        assert "1 1 []" in proc.stdout            # one group, one kernel, no fallback
