"""The graph fuser's passes over TorchScript graphs (run in order by pipeline.py).

inplace -> decompose -> alias_copy -> fusion_scan -> alias_copy.revert -> cleanup; guards.py
holds the run-time input checks of each fusion group. See docs/fuser.md.
"""
from .pipeline import FuseReport, run_pipeline  # noqa: F401
