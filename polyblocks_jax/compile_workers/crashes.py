"""A compile worker that died: the error naming its stage, and the input saved to replay it.

The reproducer is the program's text (without locations, as the cache key reads it) with
a comment line giving the options; ``pb.compile(open(path).read())`` replays it. A program
handed over as bytecode is also saved as such beside it (``.mlirbc``): text does not
always parse back. Files go to ``POLYBLOCKS_DUMP`` when set, else to a folder of the
system's temporary directory.
"""
from __future__ import annotations

import os
import signal
import tempfile
from typing import Sequence

from polyblocks_jax.errors import CompilationError
from polyblocks_jax.files import write_atomically
from polyblocks_jax.options import Options

FOLDER = "polyblocks-crashes"


def crash_error(stage: str, returncode: int | None, output: str, reproducer: str) -> CompilationError:
    """The error of a compile that ended its worker with ``returncode`` during ``stage``."""
    tail = f"\nits last output:\n{output.rstrip()}" if output.strip() else ""
    return CompilationError(stage, f"the compile worker crashed ({death(returncode)}); reproducer: {reproducer}{tail}")


def memory_error(stage: str, resident: int, limit: int, reproducer: str) -> CompilationError:
    """The error of a compile whose worker was stopped for holding ``resident`` bytes."""
    return CompilationError(stage, f"the compile ran out of memory: its worker held {resident / 2 ** 30:.2f} GiB, "
                                   f"over the {limit / 2 ** 30:.2f} GiB a compile worker may use (set by "
                                   f"POLYBLOCKS_WORKER_MEMORY_GB); reproducer: {reproducer}")


def save_reproducer(text: str, source: str | bytes, options: Options,
                    donate_argnums: Sequence[int] | None, key: str) -> str:
    """Write the program that crashed the compiler; returns the path of its text."""
    folder = options.dump_dir or os.path.join(tempfile.gettempdir(), FOLDER)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"crash-{key}.mlir")
    donation = "" if donate_argnums is None else f", donate_argnums={list(donate_argnums)}"
    header = (f"// polyblocks_jax compile crash; replay: POLYBLOCKS_FLAGS='{options.flags()}' "
              f"python -c \"import polyblocks_jax as pb; pb.compile(open('{path}').read(){donation})\"\n")
    write_atomically(path, (header + text).encode())
    if isinstance(source, bytes):
        write_atomically(path + "bc", source)
    return path


def death(returncode: int | None) -> str:
    if returncode is None:
        return "the worker closed its pipe"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"

