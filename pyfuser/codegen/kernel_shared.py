"""A kernel's shared memory: where each shared array lives in its block's shared memory, and
whether the arrays are declared statically or carved out of the launch's dynamic shared memory.

A block may declare at most 48 KB of static shared memory; past that (a row staged whole over a
cluster of 2-4 blocks: 64-128 KB a block) every shared array of the kernel becomes a slice of one
`extern __shared__` buffer whose size the launch passes (LaunchConfig.shared_mem; the runtime
raises the function's dynamic limit, runtime/launch.py). The kernel IR is the same either way:
the interpreter runs it unchanged, only the printer and the launch differ.

Invariants: arrays are laid out in kernel-IR order, each at a 16-byte-aligned offset (cp.async
writes 16-byte vectors); a kernel needing more than SHARED_LIMIT (sm_90's opt-in maximum a block)
is refused where it is printed, never launched to fail.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import kernel_ir as K

STATIC_LIMIT = 48 * 1024        # static shared memory a block may declare
SHARED_LIMIT = 227 * 1024       # shared memory a block may use on sm_90 (opt-in)
ALIGN = 16


@dataclass(frozen=True)
class SharedLayout:
    offsets: dict               # shared array name -> byte offset in the block's buffer
    total: int                  # bytes of every shared array, aligned
    dynamic: bool               # printed as slices of the launch's dynamic shared memory

    @property
    def launch_bytes(self) -> int:
        """The dynamic shared memory a launch must pass (0 where the arrays are static)."""
        return self.total if self.dynamic else 0


def array_bytes(a: K.Alloc) -> int:
    n = a.dtype.itemsize
    for d in a.dims:
        if not isinstance(d, int):
            raise ValueError(f"shared array {a.name}: extent {d!r} is not a constant")
        n *= d
    return n


def shared_layout(k: K.Kernel) -> SharedLayout:
    offsets, total = {}, 0
    for s in k.walk():
        if isinstance(s, K.Alloc) and s.space == "shared":
            if s.name in offsets:
                raise ValueError(f"kernel {k.name}: shared array {s.name} declared twice")
            offsets[s.name] = total
            total += -(-array_bytes(s) // ALIGN) * ALIGN
    if total > SHARED_LIMIT:
        raise ValueError(f"kernel {k.name}: {total} bytes of shared memory a block, more than "
                         f"the {SHARED_LIMIT} an sm_90 block may use")
    return SharedLayout(offsets, total, total > STATIC_LIMIT)
