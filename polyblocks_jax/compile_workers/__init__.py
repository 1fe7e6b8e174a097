"""Compiling in worker processes, so that no compile can end the caller's process.

An abort or a segfault inside MLIR or LLVM ends the process it happens in. The host's
programs therefore compile in compile workers (``pool``): processes of the same Python
running ``worker``, started when a compile finds none idle (up to one per core this
process may run on), kept for the next compiles, replaced after a crash. A job travels as
the program's StableHLO, the options and the requested donation; the executable comes back
serialized, the in-memory cache stays here. A worker that dies during a compile becomes a
CompilationError naming the stage it died in, with the program saved to replay (``crashes``);
an error raised in the worker reaches the caller with its type and message (``protocol``).
A worker whose resident memory passes its share of the machine's during a compile is
stopped, and the compile is a CompilationError saying so (``POLYBLOCKS_WORKER_MEMORY_GB``).

``POLYBLOCKS_FLAGS=in-process`` (``Options(in_process=True)``) compiles in the calling
process instead, for pdb and profilers; so does every compile when no worker can start
(a warning says why). A host program that calls back into Python compiles in its caller. A
target names the kind of worker it compiles in (``Target.compile_worker``): "host" workers load
the host's LLVM with our options (and warm up on a small host program), "plain" ones (the
NVIDIA chips, whose PTX those options would change) run MLIR alone; one pool per kind.

A worker's start (Python, numpy, MLIR and the compiler: over a second) overlaps the
caller's: ``polyblocks_jax.compile`` starts one before importing the compiler itself.
"""
from __future__ import annotations

from typing import Callable

from polyblocks_jax.compile_workers.pool import POOLS
from polyblocks_jax.compile_workers.protocol import Job
from polyblocks_jax.targets import CompiledProgram

__all__ = ["Job", "compile", "prestart"]


def compile(job: Job, text: str,  # noqa: A001 (the driver's verb)
            follow: Callable[[Callable[[], str | None]], None] | None = None, kind: str = "host") -> CompiledProgram | None:
    """``job`` compiled in a worker of ``kind`` (``text``: the program without locations, for a
    reproducer; ``follow``: given, once a worker has the job, the function that reads the
    stage it is in); None when no worker can start."""
    return POOLS[kind].compile(job, text, follow)


def prestart(kind: str = "host") -> None:
    """Start a worker of ``kind`` unless one runs, without waiting for it."""
    POOLS[kind].prestart()
