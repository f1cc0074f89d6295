"""Frontends: readers of the programs pyfuser compiles (TorchScript IR text for now)."""
