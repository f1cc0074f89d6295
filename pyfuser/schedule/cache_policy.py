"""Cache policies of a kernel's global loads and stores (speed only, never correctness).

A policy is one of CACHE_POLICIES: "" (plain access), "cs" (`ld/st.global.cs`, streaming:
evict-first in L1 and L2), "ef" (L2 evict_first; loads also skip L1) or "el" (L2 evict_last).
Schedulers put them in their params (`load_cache`, `store_cache`) for the contiguous accesses of
fusion inputs and outputs; codegen prints them as the prelude's `pf_ldc<PF_*, N>` / `pf_stc`
(codegen/kernel_ir.CACHE_POLICIES maps the names to the C++ constants).

`$PYFUSER_LOAD_CACHE` / `$PYFUSER_STORE_CACHE` override the scheduler's choice ("plain" for none).
"""
from __future__ import annotations

import os

CACHE_POLICIES = ("", "cs", "ef", "el")


def env_override(name: str, default: str) -> str:
    """The policy named by $name ("plain" = ""), else `default`; an unknown name is an error."""
    v = os.environ.get(name)
    if not v:
        return default
    policy = "" if v == "plain" else v
    if policy not in CACHE_POLICIES:
        raise ValueError(f"${name}={v!r}: expected one of plain, cs, ef, el")
    return policy


def choose(load_default: str = "", store_default: str = "") -> tuple[str, str]:
    """(load policy, store policy): the defaults unless the environment overrides them."""
    return (env_override("PYFUSER_LOAD_CACHE", load_default),
            env_override("PYFUSER_STORE_CACHE", store_default))
