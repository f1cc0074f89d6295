"""On-disk cache of compiled kernels, private to the user who writes it, shared by every process
of that user (the ranks of a torchrun job on one host included).

Location: `$PYFUSER_CACHE_DIR` (default `~/.cache/pyfuser`), one file `<key>.bin` per entry, where
the key is sha256 over everything that determines the binary (source, arch, full option list,
NVRTC version, kernel name: see `make_key`). `PYFUSER_DISABLE_DISK_CACHE=1` turns the cache off
(no reads, no writes, no locks: every process compiles for itself). The same directory holds the
plans of compiled graphs, `<key>.plan` (runtime/plan_store.py), in the same entry format, with
their own counters; `PYFUSER_DISABLE_DISK_CACHE=1` turns them off too.

Entry layout: MAGIC (8 bytes) | key length (u16 LE) | name length (u16 LE) | payload length
(u64 LE) | sha256(key | name | payload) (32 bytes) | key | name | payload. The entry carries the
full key it was written for and the kernel's name, and a load checks both against what is asked
for: a file copied or renamed from another entry, or forged with a valid checksum for another
kernel, is rejected (deleted, recompiled).

Several processes compiling the same kernel (`key_lock`): the first to take the key's lock file
`<key>.lock` (`fcntl.flock`, exclusive) compiles and stores the entry, then releases; the others
wait for the lock (polling, up to `$PYFUSER_CACHE_LOCK_TIMEOUT` seconds, default 120), then
look again and load what it stored. A waiter that times out compiles by itself (and stores the
same bytes). The caller's protocol is: load; on a miss take the lock; load again; compile and
store only if still missing; release (runtime/nvrtc.py `compile_cuda`).

Invariants:
- The cache directory is private: created with mode 0700; one that is group/other accessible is
  repaired to 0700 when this user owns it, and refused (no reads, no writes, no locks, logged
  once) when another user does. Entries and lock files are created 0600.
- Writers never expose a partial file: they write a temp file in the same directory and
  `os.replace` it over the entry (atomic on POSIX), so a reader sees the old entry, no entry or
  the whole new one, and concurrent writers of one key are safe (identical content, last wins).
  A crash leaves at most a stray `.tmp` file (never read; `clear()` removes it). No fsync: a
  cache needs no durability, and what a power loss could leave behind (an entry renamed before
  its bytes reached the disk: empty or torn) fails the checksum like any damaged entry and is
  compiled again (an fsync per entry, ~100 for a model, made every cold compile wait on the
  disk).
- Every load checks the checksum, key and name: a damaged or foreign entry (bad magic, wrong
  lengths, checksum mismatch, another key or kernel name, unreadable) is a miss; it is deleted
  (only if the file at the path is still the one read, so a good entry another process has just
  written over it survives) and the caller recompiles and overwrites it.
- Correctness never depends on the locks: they only keep N processes from compiling one kernel
  N times. The lock is the kernel's `flock` on an open file, so a process that dies (killed,
  crashed) releases it at once: a stale lock file never blocks anyone. The holder deletes the
  lock file before releasing it; a waiter that then wins the lock of a deleted file (checked by
  inode) opens the path again, so two processes never both believe they hold one key's lock
  (except after `clear()` removed a held lock file, which costs at most one extra compile).
  Where flock is unavailable (no fcntl, a file system without locks) or the cache is off, no
  lock is taken and each process compiles for itself.
- Nothing here ever raises for a cache problem; an unwritable directory only disables writing
  (logged once).
- Counters (`stats`, per process): hits, misses, stores, corrupt, foreign, errors, refused;
  lock_waits (a lock taken after waiting for another process), lock_timeouts (gave up waiting),
  lock_errors (locking unavailable).
"""
from __future__ import annotations

import hashlib
import logging
import os
import struct
import tempfile
import threading
import time

try:
    import fcntl
except ImportError:          # not POSIX: no locks, each process compiles for itself
    fcntl = None

log = logging.getLogger("pyfuser")

MAGIC = b"PFCUBIN2"
_HEADER = struct.Struct("<8sHHQ32s")
SUFFIX = ".bin"
PLAN_SUFFIX = ".plan"          # plans of compiled graphs (runtime/plan_store.py), not CUBINs
GRAPH_SUFFIX = ".graph"        # AOTAutograd's results (frontend/fx/graph_cache.py)
LOCK_SUFFIX = ".lock"
DEFAULT_LOCK_TIMEOUT_S = 120.0

# Counters for tests and the benchmark (process-wide).
stats = {"hits": 0, "misses": 0, "stores": 0, "corrupt": 0, "errors": 0, "foreign": 0,
         "refused": 0, "lock_waits": 0, "lock_timeouts": 0, "lock_errors": 0}
_warned: set[str] = set()
_stats_lock = threading.Lock()     # compiles run in threads (nvrtc.compile_async)
_private: dict = {}       # directory -> True (private, or made so) / False (refused)


def _count(name: str, n: int = 1, counts: dict | None = None) -> None:
    with _stats_lock:
        counts = stats if counts is None else counts
        counts[name] = counts.get(name, 0) + n


def _new_lock_in_child() -> None:
    global _stats_lock
    _stats_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)


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


def entry_path(key: str, suffix: str = SUFFIX) -> str:
    return os.path.join(cache_dir(), key + suffix)


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
        _count("refused")
    _private[d] = ok
    return ok


def _warn_once(d: str, message: str) -> None:
    if d not in _warned:
        _warned.add(d)
        log.warning("%s", message)


def load(key: str, name: str = "", suffix: str = SUFFIX,
         counts: dict | None = None) -> bytes | None:
    """The cached payload for `key` and kernel `name`, or None (cache off or not private, miss,
    or a damaged or foreign entry, now deleted). `suffix`: the kind of entry (`SUFFIX` CUBINs,
    `PLAN_SUFFIX` plans: runtime/plan_store.py, `GRAPH_SUFFIX` AOTAutograd's results:
    frontend/fx/graph_cache.py); `counts`: the counters to bump (`stats`)."""
    if not enabled() or not ensure_private(cache_dir(), create=False):
        return None
    path = entry_path(key, suffix)
    try:
        with open(path, "rb") as f:
            blob = f.read()
            read_id = _file_id(os.fstat(f.fileno()))
    except FileNotFoundError:
        _count("misses", 1, counts)
        return None
    except OSError as e:
        _count("errors", 1, counts)
        log.debug("pyfuser disk cache: cannot read %s: %s", path, e)
        return None
    entry = parse(blob)
    payload = entry[2] if entry is not None and entry[:2] == (key, name) else None
    if payload is None:
        _count("corrupt" if entry is None else "foreign", 1, counts)
        what = "damaged entry" if entry is None else \
            f"entry written for another {'key' if entry[0] != key else 'kernel'}"
        log.info("pyfuser disk cache: %s %s ignored and removed", what, path)
        _remove_if_same(path, read_id)
        return None
    _count("hits", 1, counts)
    return payload


def _file_id(st) -> tuple:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _remove_if_same(path: str, file_id: tuple) -> None:
    """Delete `path` unless another process has replaced it since it was read (a good entry
    written over a damaged one must survive the reader that saw the damaged one)."""
    try:
        if _file_id(os.stat(path)) == file_id:
            os.remove(path)
    except OSError:
        pass


def store(key: str, payload: bytes, name: str = "", suffix: str = SUFFIX,
          counts: dict | None = None) -> bool:
    """Write the entry atomically; False (never an exception) when the cache is off, not
    private or unwritable. `suffix`, `counts`: as for `load`."""
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
        os.replace(tmp, entry_path(key, suffix))
        tmp = None
        _count("stores", 1, counts)
        return True
    except OSError as e:
        _count("errors", 1, counts)
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
    """Remove every entry (and stray temp and lock files); returns how many files were removed."""
    d, n = cache_dir(), 0
    try:
        names = os.listdir(d)
    except OSError:
        return 0
    for name in names:
        if name.endswith((SUFFIX, PLAN_SUFFIX, GRAPH_SUFFIX, ".tmp", LOCK_SUFFIX)):
            try:
                os.remove(os.path.join(d, name))
                n += 1
            except OSError:
                pass
    return n


# ---- one compiler per key across processes -------------------------------------------------------
def lock_path(key: str) -> str:
    return os.path.join(cache_dir(), key + LOCK_SUFFIX)


def lock_timeout() -> float:
    """Seconds a process waits for another one compiling the same key
    (`$PYFUSER_CACHE_LOCK_TIMEOUT`, default 120; 0: never wait)."""
    raw = os.environ.get("PYFUSER_CACHE_LOCK_TIMEOUT", "").strip()
    if not raw:
        return DEFAULT_LOCK_TIMEOUT_S
    try:
        return max(0.0, float(raw))
    except ValueError:
        _warn_once("PYFUSER_CACHE_LOCK_TIMEOUT", f"pyfuser disk cache: PYFUSER_CACHE_LOCK_TIMEOUT="
                   f"{raw!r} is not a number of seconds; using {DEFAULT_LOCK_TIMEOUT_S:g}")
        return DEFAULT_LOCK_TIMEOUT_S


class key_lock:
    """`with key_lock(key) as lock:` holds `key`'s lock file against other processes (and other
    threads: each opens its own file description) for the body. `lock.held` says whether it is
    held: False when the cache is off or refused, locking is unavailable, or `timeout` seconds
    (default `lock_timeout()`) passed while another process held it; the body runs either way
    (without the lock the caller just may duplicate work). `lock.waited_s`: time spent waiting."""

    def __init__(self, key: str, timeout: float | None = None, poll_s: float = 0.002):
        self.key, self.timeout, self.poll_s = key, timeout, poll_s
        self.held, self.timed_out, self.waited_s = False, False, 0.0
        self._fd, self._path, self._id = None, None, None

    def __enter__(self) -> "key_lock":
        if fcntl is None or not enabled() or not ensure_private(cache_dir(), create=True):
            return self
        if self.timeout is None:
            self.timeout = lock_timeout()
        self._path = lock_path(self.key)
        t0 = time.monotonic()
        try:
            self._acquire(t0 + self.timeout)
        except OSError as e:          # no locks on this file system, or the directory went away
            _count("lock_errors")
            self._close()
            _warn_once("lock:" + cache_dir(), f"pyfuser disk cache: cannot lock {self._path} "
                       f"({e}); processes may compile the same kernel more than once")
        self.waited_s = time.monotonic() - t0
        return self

    def _acquire(self, deadline: float) -> None:
        delay, waited = self.poll_s, False
        while True:
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0),
                               0o600)
            while True:
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    waited = True
                    if time.monotonic() >= deadline:
                        _count("lock_timeouts")
                        log.log(logging.WARNING if self.timeout > 0 else logging.DEBUG,
                                "pyfuser disk cache: waited %.1f s for another process "
                                "compiling %s; compiling it here too", self.timeout, self._path)
                        self._close()
                        self.timed_out = True
                        return
                    time.sleep(delay)
                    delay = min(2 * delay, 0.05)
            mine = os.fstat(self._fd)
            try:
                now = os.stat(self._path)
            except FileNotFoundError:
                now = None
            if now is not None and (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
                self._id = (mine.st_dev, mine.st_ino)
                self.held = True
                _count("lock_waits", int(waited))
                return
            # the previous holder deleted this file before releasing it: take the path's new one
            self._close()

    def __exit__(self, *exc) -> None:
        if self.held:
            try:                      # delete our lock file (only ours), then release it
                st = os.stat(self._path)
                if (st.st_dev, st.st_ino) == self._id:
                    os.remove(self._path)
            except OSError:
                pass
            try:                      # explicitly: a child forked meanwhile shares the open file
                fcntl.flock(self._fd, fcntl.LOCK_UN)   # and would keep it locked for waiters
            except OSError:                           # already blocked on it
                pass
        self._close()
        self.held = False

    def _close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)    # releases the flock
            except OSError:
                pass
            self._fd = None
