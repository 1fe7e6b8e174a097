"""Object code by content: a part's object file, keyed by its LLVM IR and by all else that
shapes its code (``key``), kept in memory and in a bounded folder on disk.

A retrace, the same program in the next process or test case, or a part that another
program shares byte for byte then links its object without running LLVM. The folder is
shared by processes (compile workers, test runs): an entry is written whole or not at all
(a temporary file renamed), read back only if its checksum holds (else deleted and
compiled again), and it is pruned, least recently used first, when it outgrows its bound.
Entries sit in 256 shards by their key's first two hex digits; keys are hashes, so each
shard holds about the same share, and a write measures and bounds only its own shard: a
walk of the whole folder (tens of thousands of entries) took a second of a compile.
"""
from __future__ import annotations

import collections
import hashlib
import os
import threading

from polyblocks_jax import files

DISK_BYTES = 1 << 30
MEMORY_BYTES = 64 << 20
_MAGIC = b"polyblocks object 1\n"
_DIGEST_BYTES = 32
_SHARDS = 256  # folders, by a key's first two hex digits


def key(text: str, *context: str) -> str:
    """The key of LLVM IR ``text`` compiled under ``context`` (levels, options, CPU, LLVM)."""
    digest = hashlib.sha256()
    for item in (*context, text):
        digest.update(item.encode())
        digest.update(b"\0")
    return digest.hexdigest()


class ObjectCache:
    """Object files by ``key``: ``memory_bytes`` of them in this process, ``disk_bytes`` in
    ``folder`` (None: none on disk). ``hits`` and ``misses`` count lookups."""

    def __init__(self, folder: str | None, disk_bytes: int = DISK_BYTES, memory_bytes: int = MEMORY_BYTES) -> None:
        self.folder, self.disk_bytes, self.memory_bytes = folder, disk_bytes, memory_bytes
        self.hits = self.misses = 0
        self._memory: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def get(self, name: str) -> bytes | None:
        with self._lock:
            code = self._memory.get(name)
            if code is not None:
                self._memory.move_to_end(name)
        if code is None and self.folder:
            code = self._read(self._path(name))
            if code is not None:
                self._remember(name, code)
        with self._lock:
            if code is None:
                self.misses += 1
            else:
                self.hits += 1
        return code

    def put(self, name: str, code: bytes) -> None:
        self._remember(name, code)
        if not self.folder:
            return
        path = self._path(name)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            files.write_atomically(path, _MAGIC + hashlib.sha256(code).digest() + code)
        except OSError:  # a full or read-only disk: the cache is only an optimization
            return
        self._prune(os.path.dirname(path))

    def _prune(self, shard: str) -> None:
        """Delete the least recently used entries of ``shard`` while it holds more than its
        share of the bound, down to three quarters of that."""
        entries = []
        try:
            listing = list(os.scandir(shard))
        except OSError:
            return
        for entry in listing:
            try:
                status = entry.stat()
            except OSError:  # deleted meanwhile, by another process
                continue
            entries.append((status.st_mtime, status.st_size, entry.path))
        share = self.disk_bytes // _SHARDS
        total = sum(size for _, size, _ in entries)
        if total <= share:
            return
        for _, size, path in sorted(entries):  # least recently used first
            if total <= share * 3 // 4:
                break
            try:
                os.unlink(path)
            except OSError:
                pass
            total -= size

    def clear_memory(self) -> None:
        with self._lock:
            self._memory.clear()
            self._held = 0

    def _remember(self, name: str, code: bytes) -> None:
        with self._lock:
            if name not in self._memory:
                self._memory[name] = code
                self._held += len(code)
            while self._held > self.memory_bytes and self._memory:
                self._held -= len(self._memory.popitem(last=False)[1])

    def _path(self, name: str) -> str:
        return os.path.join(self.folder, name[:2], name + ".o")

    @staticmethod
    def _read(path: str) -> bytes | None:
        """The entry at ``path``, or None: missing, or damaged (then deleted)."""
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return None
        head = len(_MAGIC) + _DIGEST_BYTES
        code = data[head:]
        if data[:len(_MAGIC)] != _MAGIC or hashlib.sha256(code).digest() != data[len(_MAGIC):head]:
            try:
                os.unlink(path)
            except OSError:
                pass
            return None
        try:
            os.utime(path)  # recently used: pruned last
        except OSError:
            pass
        return code
