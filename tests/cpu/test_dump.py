"""PYFUSER_DUMP: `help` lists every option with one line each; nvFuser's spellings are aliases."""
from __future__ import annotations

import os
import subprocess
import sys

import torch

from pyfuser import DataType, FusionDefinition
from pyfuser import dump as D

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_help_lists_every_dump_once_with_one_line():
    text = D.help_text()
    body = text.splitlines()[1:-1]
    assert len(body) == len(D.DUMP_NAMES)
    for line, (name, what) in zip(body, D.DUMP_NAMES.items()):
        assert line.split()[0] == name and line.rstrip().endswith(what) and what
    for alias, name in D.DUMP_ALIASES.items():
        assert name in D.DUMP_NAMES and alias not in D.DUMP_NAMES
        assert f"{alias} = {name}" in text.splitlines()[-1]


def test_help_is_printed_when_pyfuser_is_imported():
    env = dict(os.environ, PYFUSER_DUMP="help", PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", "import pyfuser"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stderr.strip() == D.help_text()
    r = subprocess.run([sys.executable, "-m", "pyfuser.dump"], env=dict(os.environ, PYTHONPATH=ROOT),
                       capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == D.help_text()


def test_nvfuser_spelling_enables_our_dump(monkeypatch, capsys):
    monkeypatch.setenv("PYFUSER_DUMP", "launch_param,fusion_ir_presched")
    assert D.is_enabled("launch_params") and D.is_enabled("fusion_ir")
    assert not D.is_enabled("cuda_kernel")
    with FusionDefinition() as fd:
        t = fd.define_tensor(symbolic_sizes=[-1], contiguous=[True], dtype=DataType.Float)
        fd.add_output(fd.ops.neg(t))
    fd.execute([torch.randn(37)])
    err = capsys.readouterr().err
    assert "===== [launch_params]" in err and "===== [fusion_ir]" in err
    assert "unknown PYFUSER_DUMP entry" not in err


def test_unknown_name_points_to_help(monkeypatch, capsys):
    monkeypatch.setenv("PYFUSER_DUMP", "no_such_dump_x")
    D.enabled_dumps()
    err = capsys.readouterr().err
    assert "'no_such_dump_x'" in err and "PYFUSER_DUMP=help" in err
