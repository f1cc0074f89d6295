"""On-disk cache of compiled kernels, private to the user who writes it.

Location: `$PYFUSER_CACHE_DIR` (default `~/.cache/pyfuser`), one file `<key>.bin` per entry, where
the key is sha256 over everything that determines the binary (source, arch, full option list,
NVRTC version, kernel name: see `make_key`). `PYFUSER_DISABLE_DISK_CACHE=1` turns the cache off
(no reads, no writes).

Entry layout: MAGIC (8 bytes) | key length (u16 LE) | name length (u16 LE) | payload length
(u64 LE) | sha256(key | name | payload) (32 bytes) | key | name | payload. The entry carries the
full key it was written for and the kernel's name, and a load checks both against what is asked
for: a file copied or renamed from another entry, or forged with a valid checksum for another
kernel, is rejected (deleted, recompiled).

Invariants:
- The cache directory is private: created with mode 0700; one that is group/other accessible is
  repaired to 0700 when this user owns it, and refused (no reads, no writes, logged once) when
  another user does. Entries are created 0600 (mkstemp).
- Writers never expose a partial file: they write a temp file in the same directory and
  `os.replace` it over the entry (atomic on POSIX), so concurrent writers of one key are safe and
  the last one wins with identical content.
- A damaged or foreign entry (bad magic, wrong lengths, checksum mismatch, another key or kernel
  name, unreadable) is treated as a miss: it is deleted and the caller recompiles. Nothing here
  ever raises for a cache problem; an unwritable directory only disables writing (logged once).
"""
from __future__ import annotations

import hashlib
import logging
import os
import struct
import tempfile

log = logging.getLogger("pyfuser")

MAGIC = b"PFCUBIN2"
_HEADER = struct.Struct("<8sHHQ32s")
SUFFIX = ".bin"

# Counters for tests and the benchmark (process-wide).
stats = {"hits": 0, "misses": 0, "stores": 0, "corrupt": 0, "errors": 0, "foreign": 0,
         "refused": 0}
_warned: set[str] = set()
_private: dict = {}       # directory -> True (private, or made so) / False (refused)


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


def _digest(key: bytes, name: bytes, payload: bytes) -> bytes:
    h = hashlib.sha256()
    for part in (key, name, payload):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.digest()


def encode(payload: bytes, key: str = "", name: str = "") -> bytes:
    k, n = key.encode(), name.encode()
    return _HEADER.pack(MAGIC, len(k), len(n), len(payload), _digest(k, n, payload)) + k + n + payload


def parse(blob: bytes) -> tuple | None:
    """(key, name, payload) of a well-formed entry, else None."""
    if len(blob) < _HEADER.size:
        return None
    magic, klen, nlen, length, digest = _HEADER.unpack_from(blob)
    body = blob[_HEADER.size:]
    if magic != MAGIC or klen + nlen + length != len(body):
        return None
    k, n, payload = body[:klen], body[klen:klen + nlen], body[klen + nlen:]
    if _digest(k, n, payload) != digest:
        return None
    try:
        return k.decode(), n.decode(), payload
    except UnicodeDecodeError:
        return None


def decode(blob: bytes, key: str = "", name: str = "") -> bytes | None:
    """The payload of a well-formed entry written for exactly this key and kernel name."""
    entry = parse(blob)
    if entry is None or entry[0] != key or entry[1] != name:
        return None
    return entry[2]


def ensure_private(d: str, create: bool) -> bool:
    """Whether directory `d` is (now) private to this user: made 0700 when created or when
    this user owns it with looser permissions; False when another user owns it (or it cannot
    be checked). Decided once per directory and process."""
    known = _private.get(d)
    if known is not None:
        return known
    try:
        if create:
            os.makedirs(d, mode=0o700, exist_ok=True)
        st = os.stat(d)
    except FileNotFoundError:
        return True                      # nothing to read yet; store() creates it private
    except OSError:
        return False
    ok = True
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        ok = False
        _warn_once(d, f"pyfuser disk cache: {d} belongs to another user (uid {st.st_uid}); it "
                      "is not used (set PYFUSER_CACHE_DIR to a directory of your own)")
    elif st.st_mode & 0o077:
        try:
            os.chmod(d, 0o700)
            log.warning("pyfuser disk cache: %s was accessible to other users (mode %o); made "
                        "it private (0700)", d, st.st_mode & 0o777)
        except OSError as e:
            ok = False
            _warn_once(d, f"pyfuser disk cache: {d} is accessible to other users and cannot be "
                          f"made private ({e}); it is not used")
    if not ok:
        stats["refused"] += 1
    _private[d] = ok
    return ok


def _warn_once(d: str, message: str) -> None:
    if d not in _warned:
        _warned.add(d)
        log.warning("%s", message)


def load(key: str, name: str = "") -> bytes | None:
    """The cached payload for `key` and kernel `name`, or None (cache off or not private, miss,
    or a damaged or foreign entry, now deleted)."""
    if not enabled() or not ensure_private(cache_dir(), create=False):
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
    entry = parse(blob)
    payload = entry[2] if entry is not None and entry[:2] == (key, name) else None
    if payload is None:
        stats["corrupt" if entry is None else "foreign"] += 1
        what = "damaged entry" if entry is None else \
            f"entry written for another {'key' if entry[0] != key else 'kernel'}"
        log.info("pyfuser disk cache: %s %s ignored and removed", what, path)
        try:
            os.remove(path)
        except OSError:
            pass
        return None
    stats["hits"] += 1
    return payload


def store(key: str, payload: bytes, name: str = "") -> bool:
    """Write the entry atomically; False (never an exception) when the cache is off, not
    private or unwritable."""
    if not enabled():
        return False
    d = cache_dir()
    tmp = None
    try:
        if not ensure_private(d, create=True):
            return False
        fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=d)
        with os.fdopen(fd, "wb") as f:
            f.write(encode(payload, key, name))
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
