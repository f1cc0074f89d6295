"""The README's Python examples run as written (on a CPU-only machine too: they pick the device
by what is present), each as its own script, as a newcomer would paste it. An example followed
by "prints" and a plain block prints exactly that block."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[2]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)
PRINTS = dict(re.findall(r"```python\n(.*?)```\n\nprints\n\n```\n(.*?)```", README, re.S))


def test_readme_has_examples():
    assert len(BLOCKS) >= 2
    assert all("cuda\" if torch.cuda.is_available()" in b for b in BLOCKS if "device" in b)
    assert any('backend="pyfuser"' in b for b in PRINTS)


def _backend_entry_point(tmp_path) -> list:
    """Where this checkout is used through PYTHONPATH, not installed (so the installed metadata,
    if any, lacks the `torch_dynamo_backends` entry point of pyproject.toml), a directory with
    the metadata `pip install` would write for it, to add to PYTHONPATH; [] where the installed
    pyfuser has the entry point (CI's `pip install -e`)."""
    from importlib.metadata import entry_points
    if any(ep.name == "pyfuser" for ep in entry_points(group="torch_dynamo_backends")):
        return []
    m = re.search(r'\[project\.entry-points\.torch_dynamo_backends\]\npyfuser = "([^"]+)"',
                  (ROOT / "pyproject.toml").read_text())
    assert m, "pyproject.toml declares the torch_dynamo_backends entry point"
    info = tmp_path / "meta" / "pyfuser_checkout-0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pyfuser-checkout\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(f"[torch_dynamo_backends]\npyfuser = {m.group(1)}\n")
    return [str(tmp_path / "meta")]


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index, tmp_path):
    block = BLOCKS[index]
    script = tmp_path / f"readme_{index}.py"
    script.write_text(block)
    path = [str(ROOT)] + (_backend_entry_point(tmp_path) if 'backend="pyfuser"' in block else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path),
               PYFUSER_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("PYFUSER_CPU_EXECUTOR", None)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if "fused.last_run" in block:
        assert "1 1 []" in proc.stdout            # one group, one kernel, no fallback
    if block in PRINTS:
        assert proc.stdout == PRINTS[block], proc.stdout
