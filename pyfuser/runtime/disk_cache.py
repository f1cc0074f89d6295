"""On-disk cache of compiled kernels, shared by every process of a user.

Location: `$PYFUSER_CACHE_DIR` (default `~/.cache/pyfuser`), one file `<key>.bin` per entry, where
the key is sha256 over everything that determines the binary (source, arch, full option list,
NVRTC version: see `make_key`). `PYFUSER_DISABLE_DISK_CACHE=1` turns the cache off (no reads, no
writes).

Entry layout: MAGIC (8 bytes) | payload length (u64 LE) | sha256(payload) (32 bytes) | payload.

Invariants:
- Writers never expose a partial file: they write a temp file in the same directory and
  `os.replace` it over the entry (atomic on POSIX), so concurrent writers of one key are safe and
  the last one wins with identical content.
- A damaged entry (bad magic, wrong length, checksum mismatch, unreadable) is treated as a miss:
  it is deleted and the caller recompiles. Nothing here ever raises for a cache problem; an
  unwritable directory only disables writing (logged once).
"""
from __future__ import annotations

import hashlib
import logging
import os
import struct
import tempfile

log = logging.getLogger("pyfuser")

MAGIC = b"PFCUBIN1"
_HEADER = struct.Struct("<8sQ32s")
SUFFIX = ".bin"

# Counters for tests and the benchmark (process-wide).
stats = {"hits": 0, "misses": 0, "stores": 0, "corrupt": 0, "errors": 0}
_warned: set[str] = set()


def enabled() -> bool:
    return os.environ.get("PYFUSER_DISABLE_DISK_CACHE", "").strip().lower() not in (
        "1", "true", "yes", "on")


def cache_dir() -> str:
    d = os.environ.get("PYFUSER_CACHE_DIR")
    if d:
        return os.path.expanduser(d)
    return os.path.join(os.path.expanduser("~"), ".cache", "pyfuser")


def make_key(*parts) -> str:
    """sha256 hex over the repr of each part (strings, tuples of strings and numbers)."""
    h = hashlib.sha256()
    for p in parts:
        data = p.encode() if isinstance(p, str) else repr(p).encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def entry_path(key: str) -> str:
    return os.path.join(cache_dir(), key + SUFFIX)


def encode(payload: bytes) -> bytes:
    return _HEADER.pack(MAGIC, len(payload), hashlib.sha256(payload).digest()) + payload


def decode(blob: bytes) -> bytes | None:
    """The payload of a well-formed entry, else None."""
    if len(blob) < _HEADER.size:
        return None
    magic, length, digest = _HEADER.unpack_from(blob)
    payload = blob[_HEADER.size:]
    if magic != MAGIC or length != len(payload) or hashlib.sha256(payload).digest() != digest:
        return None
    return payload


def load(key: str) -> bytes | None:
    """The cached payload for `key`, or None (cache off, miss, or a damaged entry, now deleted)."""
    if not enabled():
        return None
    path = entry_path(key)
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except FileNotFoundError:
        stats["misses"] += 1
        return None
    except OSError as e:
        stats["errors"] += 1
        log.debug("pyfuser disk cache: cannot read %s: %s", path, e)
        return None
    payload = decode(blob)
    if payload is None:
        stats["corrupt"] += 1
        log.info("pyfuser disk cache: damaged entry %s ignored and removed", path)
        try:
            os.remove(path)
        except OSError:
            pass
        return None
    stats["hits"] += 1
    return payload


def store(key: str, payload: bytes) -> bool:
    """Write the entry atomically; False (never an exception) when the cache is off or unwritable."""
    if not enabled():
        return False
    d = cache_dir()
    tmp = None
    try:
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=d)
        with os.fdopen(fd, "wb") as f:
            f.write(encode(payload))
        os.replace(tmp, entry_path(key))
        tmp = None
        stats["stores"] += 1
        return True
    except OSError as e:
        stats["errors"] += 1
        if d not in _warned:
            _warned.add(d)
            log.warning("pyfuser disk cache: cannot write to %s (%s); compiled kernels will not be "
                        "cached on disk", d, e)
        return False
    finally:
        if tmp is not None:
            try:
                os.remove(tmp)
            except OSError:
                pass


def clear() -> int:
    """Remove every entry (and stray temp files); returns how many files were removed."""
    d, n = cache_dir(), 0
    try:
        names = os.listdir(d)
    except OSError:
        return 0
    for name in names:
        if name.endswith(SUFFIX) or name.endswith(".tmp"):
            try:
                os.remove(os.path.join(d, name))
                n += 1
            except OSError:
                pass
    return n
