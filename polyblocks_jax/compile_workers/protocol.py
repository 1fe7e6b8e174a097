"""What a compile worker and its parent say to each other, and how an exception crosses.

Messages are pickled tuples on two pipes of their own (``multiprocessing.connection``
frames them), never on the worker's stdout, which prints may write to. The worker says
``("ready", device kind)`` once imported, then answers each request (a ``Job``) with
``("done", serialized executable, timings)`` or ``("error", encoded exception)``. The
stage under way is no message: the worker writes its name in a ``StageSlot``, memory it
shares with its parent, which reads it when it wants it (progress reports, a crash). A
message per stage, some 40 in a small program, cost the worker 6 ms a compile (Xeon, 2
cores, loaded) in pipe writes, each waking the parent.

Our exceptions do not pickle (``UnsupportedError(op, reason, location)`` cannot be rebuilt
from its message alone), so an exception crosses as its class's name, ``args`` and
attributes, and is rebuilt without calling ``__init__``: the same type, message and fields.
"""
from __future__ import annotations

import dataclasses
import importlib
import mmap
import os
import pickle
import tempfile
import traceback
from multiprocessing.connection import Connection
from typing import Sequence

from polyblocks_jax.errors import CompilationError
from polyblocks_jax.options import Options

READY, DONE, ERROR = "ready", "done", "error"


@dataclasses.dataclass(frozen=True)
class Job:
    """One compile: what ``in_process.compile_in_process`` takes."""
    source: str | bytes                    # StableHLO text, MLIR bytecode or a VHLO artifact
    options: Options
    key: str                               # the cache key: the executable's fingerprint, the dumps' folder
    marks: dict[int, int | None]           # the donation the program marks
    donate_argnums: Sequence[int] | None   # the donation requested instead
    target: str                            # the name of the target it compiles for (polyblocks_jax.targets)


class StageSlot:
    """The name of the stage a worker is in (None: none yet), in memory shared through the
    file descriptor ``fd``. Written by one process, read by another at any time: a read
    racing a write may see a mix of two names (a progress line's stage); after the writer's
    end it is its last stage."""

    SIZE = 256

    def __init__(self, fd: int) -> None:
        self._memory = mmap.mmap(fd, self.SIZE)

    @classmethod
    def create(cls) -> tuple["StageSlot", int]:
        """A new, empty slot, and the file descriptor a worker opens it by (its creator closes it)."""
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create("polyblocks-stage")
        else:  # no memfd: an unlinked temporary file, which stays in the page cache
            with tempfile.TemporaryFile() as f:
                fd = os.dup(f.fileno())
        os.ftruncate(fd, cls.SIZE)
        return cls(fd), fd

    def write(self, name: str | None) -> None:
        self._memory[:] = (name or "").encode()[:self.SIZE - 1].ljust(self.SIZE, b"\0")

    def read(self) -> str | None:
        return self._memory[:].split(b"\0", 1)[0].decode(errors="replace") or None


def reader(fd: int) -> Connection:
    return Connection(fd, writable=False)


def writer(fd: int) -> Connection:
    return Connection(fd, readable=False)


def encode_error(error: BaseException) -> dict:
    cls = type(error)
    args = error.args
    if isinstance(error, OSError) and error.filename is not None:  # the file names are no args
        args = (error.errno, error.strerror, error.filename, None, error.filename2)
    return {"module": cls.__module__, "name": cls.__qualname__, "message": str(error),
            "args": _picklable(args, ()), "traceback": "".join(traceback.format_exception(error)),
            "attributes": {k: v for k, v in vars(error).items() if _picklable(v, _UNPICKLABLE) is not _UNPICKLABLE}}


def decode_error(encoded: dict, stage: str) -> BaseException:
    """The exception the worker raised, of its type when that rebuilds with the same message;
    else a CompilationError of ``stage`` that names the type."""
    error = _rebuilt(encoded)
    if error is None:
        error = CompilationError(stage, f"{encoded['name']}: {encoded['message']}")
    error.add_note("raised in the compile worker:\n" + encoded["traceback"].rstrip())
    return error


_UNPICKLABLE = object()


def _picklable(value, otherwise):
    try:
        pickle.dumps(value)
        return value
    except Exception:  # noqa: BLE001 (any object may fail to pickle in its own way)
        return otherwise


def _rebuilt(encoded: dict) -> BaseException | None:
    try:
        cls = importlib.import_module(encoded["module"])
        for part in encoded["name"].split("."):
            cls = getattr(cls, part)
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            return None
        error = _instance(cls, tuple(encoded["args"]))
        vars(error).update(encoded["attributes"])
    except Exception:  # noqa: BLE001 (a class that does not rebuild this way)
        return None
    return error if str(error) == encoded["message"] else None


def _instance(cls: type, args: tuple) -> BaseException:
    try:
        error = cls.__new__(cls, *args)  # no __init__: ours take fields, not their message
    except TypeError:  # a __new__ that refuses its class (MemoryError's, for ResourceExhaustedError)
        error = cls(*args)
    if not error.args and args:  # MemoryError's __new__ keeps none
        error.args = args
    return error
