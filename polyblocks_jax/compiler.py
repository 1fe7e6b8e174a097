"""The driver: program -> import -> a target's stages -> the target's executable, for every target.

A target (``polyblocks_jax.targets``: the host, an NVIDIA chip) gives its options, its
stages and its build step; the driver owns the rest. Compiled executables are cached in
memory, keyed by the program printed without its debug locations (the same program traced
from two source lines compiles once), the target, the options that change code generation
and the requested donation; the cache is bounded and evicts the least recently used entry.
A program missing from the cache compiles in a compile worker
(``polyblocks_jax.compile_workers``), so that a crash of MLIR or LLVM is a
CompilationError and not the end of this process; ``Options.in_process`` compiles here
(``in_process``: import, stages, build, with donation planned, dumps written and every step
timed). This module reads programs with jaxlib's MLIR only: the upstream stack loads where
a compile runs, and each target's run side runs what it builds without it.
"""
from __future__ import annotations

import collections
import hashlib
import threading
from typing import Sequence

from polyblocks_jax import compile_workers, donation, logs, targets
from polyblocks_jax.options import Options
from polyblocks_jax.runtime import host_callbacks as runtime_callbacks
from polyblocks_jax.runtime.executable import deserialize  # noqa: F401 (compiler.deserialize)
from polyblocks_jax.stablehlo_import import reader
from polyblocks_jax.targets import CompiledProgram, Target

CACHE_CAPACITY = 256


class _Cache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: collections.OrderedDict[str, CompiledProgram] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> CompiledProgram | None:
        with self._lock:
            exe = self._entries.get(key)
            if exe is not None:
                self._entries.move_to_end(key)
            return exe

    def put(self, key: str, exe: CompiledProgram) -> None:
        with self._lock:
            self._entries[key] = exe
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


CACHE = _Cache(CACHE_CAPACITY)


def fingerprint(source: str | bytes, options: Options, donate_argnums: Sequence[int] | None = None,
                target: str = targets.HOST) -> str:
    """The cache key of ``source`` (text or bytes of a program) compiled with ``options`` for ``target``."""
    chosen = targets.get(target)
    return _key(_read(source)[0], chosen.options(options), donate_argnums, chosen)


def compile(program, options: Options | None = None,  # noqa: A001 (public API name)
            donate_argnums: Sequence[int] | None = None, *, target: str = targets.HOST) -> CompiledProgram:
    """Compile StableHLO text, VHLO artifact bytes or a ``jax.stages.Lowered`` for ``target``
    (a name of ``polyblocks_jax.targets``; by default this host).

    ``donate_argnums``: the arguments whose buffers the outputs may reuse (None: those the
    program marks, as ``jax.jit(f, donate_argnums=...)`` does); see ``polyblocks_jax.donation``.
    """
    chosen = targets.get(target)
    options = chosen.options(options or Options.from_env())
    source = reader.program_source(program)
    text, marks = _read(source)
    key = _key(text, options, donate_argnums, chosen)
    name = logs.program_name(text)
    cached = CACHE.get(key)
    if cached is not None:
        logs.logger.info("%s: in the compile cache", name)
        return cached
    exe = None
    # A program calling back into Python compiles here: its callbacks are objects of this
    # process, and its code calls them at this process's addresses.
    if not options.in_process and chosen.compile_worker is not None and runtime_callbacks.TARGET not in text:
        with logs.CompileReport(name, "compile worker") as report:
            exe = compile_workers.compile(
                compile_workers.Job(source, options, key, marks, donate_argnums, chosen.name), text, report.follow,
                chosen.compile_worker)
            if exe is not None:
                report.note = logs.objects_note(exe.timings)
    if exe is None:  # in process, or no worker could start (logged)
        # The compiler's own modules (the upstream MLIR stack) load where a compile runs here:
        # a process whose compiles all run in workers never pays for them.
        from polyblocks_jax import in_process
        with logs.CompileReport(name, "in process") as report:
            exe = in_process.compile_in_process(source, options, key, marks, donate_argnums, report.stage,
                                                chosen.name)
            exe.load()
            report.note = logs.objects_note(exe.timings)
    CACHE.put(key, exe)
    return exe


def _read(source: str | bytes) -> tuple[str, dict[int, int | None]]:
    """The program's text without locations, and its donation marks (one parse)."""
    context = reader.new_context()
    module = reader.parse(source, context)
    with context:
        mains = [op for op in module.body.operations
                 if op.operation.name == "func.func" and op.attributes["sym_name"].value == "main"]
        marks = donation.program_marks(mains[0]) if mains else {}
        return module.operation.get_asm(enable_debug_info=False), marks


def program_text(source: str | bytes) -> str:
    """The program's text (bytecode printed), without locations."""
    return _read(source)[0]


def _key(text: str, options: Options, donate_argnums: Sequence[int] | None, target: Target) -> str:
    requested = "" if donate_argnums is None else "-donate" + ",".join(map(str, donate_argnums))
    return hashlib.sha256(text.encode()).hexdigest()[:32] + "-" + options.cache_key() + requested + "-" + target.name
