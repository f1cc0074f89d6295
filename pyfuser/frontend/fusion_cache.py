"""FusionCache: every fusion a FusionDefinition made in this process, by definition.

    fc = FusionCache.get()        # the process's cache (one per process)
    fc.num_fusions()              # how many distinct definitions were made
    Fusion(fusion_id)             # the fusion of an id (fs.id() / fd.id())

A definition is identified by its canonical source (the recorded `fd.` calls, see
definition.py): a second definition that records the same calls is a cache hit and gets the
first one's id and Fusion IR, so it shares its segmentation, executors and compiled kernels;
sizes are not part of a definition (symbolic sizes), so one fusion serves every size.

Invariants: ids are 0, 1, 2... in order of first definition; an entry is never changed after it
is added (only `reset()` drops them all); at most `max_fusions` entries (a further new
definition raises, naming the limit).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import FusionDefinitionError

DEFAULT_MAX_FUSIONS = 8192


@dataclass
class CacheEntry:
    id: int
    key: str
    ir: object                          # the pyfuser.ir.Fusion
    lines: list                         # the recorded definition calls
    hidden_outputs: frozenset = frozenset()   # outputs written into an input (alias_input=)
    output_orders: dict = field(default_factory=dict)   # output index -> add_output stride_order


class FusionCache:
    _instance: "FusionCache | None" = None

    def __init__(self, max_fusions: int = DEFAULT_MAX_FUSIONS):
        self.max_fusions = max_fusions
        self._by_key: dict[str, CacheEntry] = {}
        self._entries: list[CacheEntry] = []

    @staticmethod
    def get(max_fusions: int = DEFAULT_MAX_FUSIONS) -> "FusionCache":
        """The process's FusionCache (made on first use)."""
        if FusionCache._instance is None:
            FusionCache._instance = FusionCache(max_fusions)
        return FusionCache._instance

    @staticmethod
    def reset() -> None:
        """Forget every fusion (ids start again at 0)."""
        FusionCache._instance = None

    def num_fusions(self) -> int:
        return len(self._entries)

    def lookup(self, key: str) -> CacheEntry | None:
        return self._by_key.get(key)

    def add(self, key: str, ir, lines, hidden_outputs, output_orders) -> CacheEntry:
        if len(self._entries) >= self.max_fusions:
            raise FusionDefinitionError(
                f"FusionCache: {self.max_fusions} fusions are defined already (max_fusions); "
                "call FusionCache.reset() or FusionCache.get(max_fusions=...) first")
        entry = CacheEntry(len(self._entries), key, ir, list(lines), frozenset(hidden_outputs),
                           dict(output_orders))
        self._entries.append(entry)
        self._by_key[key] = entry
        return entry

    def entry(self, fusion_id) -> CacheEntry:
        if not isinstance(fusion_id, int) or isinstance(fusion_id, bool) or \
                not 0 <= fusion_id < len(self._entries):
            raise FusionDefinitionError(
                f"FusionCache: no fusion with id {fusion_id!r} ({len(self._entries)} are defined)")
        return self._entries[fusion_id]
