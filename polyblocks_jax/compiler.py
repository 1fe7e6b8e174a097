"""The driver: program -> import -> a target's stages -> the target's executable, for every target.

A target (``polyblocks_jax.targets``: the host, an NVIDIA chip) gives its options, its
stages and its build step; the driver owns the rest. Compiled executables are cached in
memory, keyed by the program printed without its debug locations (the same program traced
from two source lines compiles once), the target, the options that change code generation
and the requested donation; the cache is bounded and evicts the least recently used entry.
A program missing from the cache compiles in a compile worker
(``polyblocks_jax.compile_workers``), so that a crash of MLIR or LLVM is a
CompilationError and not the end of this process; ``Options.in_process`` compiles here.
The driver plans donation (for targets whose code reuses donated buffers), writes the dumps
(``POLYBLOCKS_DUMP``) and times every step. This module loads MLIR: each target's run side
runs what it builds without it.
"""
from __future__ import annotations

import collections
import contextlib
import gc
import hashlib
import threading
import time
from typing import Callable, Sequence


from polyblocks_jax import compile_workers, contexts, donation, logs, passes, targets
from polyblocks_jax.dumps import Dump
from polyblocks_jax.errors import CompilationError, UnsupportedError
from polyblocks_jax.options import Options
from polyblocks_jax.passes import results, work
from polyblocks_jax.runtime import host_callbacks as runtime_callbacks
from polyblocks_jax.runtime.executable import deserialize  # noqa: F401 (compiler.deserialize)
from polyblocks_jax.stablehlo_import import ImportedProgram, host_callbacks, import_program, reader
from polyblocks_jax.targets import CompiledProgram, LoweredProgram, Target

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
    if not options.in_process and chosen.compiles_in_workers and runtime_callbacks.TARGET not in text:
        with logs.CompileReport(name, "compile worker") as report:
            exe = compile_workers.compile(
                compile_workers.Job(source, options, key, marks, donate_argnums, chosen.name), text, report.follow)
            if exe is not None:
                report.note = logs.objects_note(exe.timings)
    if exe is None:  # in process, or no worker could start (logged)
        with logs.CompileReport(name, "in process") as report:
            exe = compile_in_process(source, options, key, marks, donate_argnums, report.stage, chosen.name)
            exe.load()
            report.note = logs.objects_note(exe.timings)
    CACHE.put(key, exe)
    return exe


def compile_in_process(source: str | bytes, options: Options, key: str, marks: dict[int, int | None],
                       donate_argnums: Sequence[int] | None, on_stage: Callable[[str], None] | None = None,
                       target: str = targets.HOST) -> CompiledProgram:
    """Compile here for ``target`` with its ``options``, uncached (what a compile worker runs),
    the code not loaded yet (the worker only sends it); ``on_stage`` is told each stage's name."""
    with _cyclic_gc_paused():
        return _compile_uncached(source, options, key, targets.get(target), marks, donate_argnums,
                                 on_stage or _ignore)


_gc_pauses = 0
_gc_lock = threading.Lock()
_gc_was_enabled = False


@contextlib.contextmanager
def _cyclic_gc_paused():
    """No cyclic garbage collection while compiling: a compile allocates some 10^5 IR
    wrappers, tuples and dicts, enough to set off a full collection now and then, which in
    a process holding JAX and a model walks every object (80 ms) and found nothing of ours
    to free (ResNet-18's repeated-layer search 0.02 s, or 0.10 s when one fell in it).
    Reference counting frees nearly all of it; the rest waits for the next collection.
    Nested and concurrent compiles resume collection when the last one ends."""
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


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


def _ignore(stage: str) -> None:
    pass


def _compile_uncached(source: str | bytes, options: Options, key: str, target: Target,
                      marks: dict[int, int | None] | None = None,
                      donate_argnums: Sequence[int] | None = None,
                      on_stage: Callable[[str], None] = _ignore) -> CompiledProgram:
    """Compile in this process; ``on_stage`` is told each stage's name as it starts."""
    dump = Dump(None, "")
    if options.dump_dir:
        dump = Dump(options.dump_dir, f"{logs.program_name(program_text(source))}-{key}")
        dump.stablehlo(source)
    with contexts.compile_context() as context:
        on_stage("import")
        imported = import_program(source, context)
        inputs, outputs = imported.inputs, imported.outputs
        requested = donation.requested_marks(marks or {}, donate_argnums, len(inputs))
        # A target whose code cannot reuse a donated buffer gets no donation: the caller's
        # arguments stay valid, as XLA leaves buffers it cannot reuse.
        donated = donation.plan(requested, inputs, outputs) if target.donates else donation.Donation()
        try:
            return _compile_imported(imported, options, key, target, donated, on_stage, dump)
        except CompilationError as e:
            if e.stage != "bufferize" or not donated.aliases:
                raise
    # Bufferization cannot always honour a tie (a loop carrying the donated argument may
    # leave a conflict it cannot resolve): compile again with the inputs given up, not reused.
    with contexts.compile_context() as context:
        on_stage("import")
        imported = import_program(source, context)
        return _compile_imported(imported, options, key, target, donation.Donation(donated.donated), on_stage, dump)


def _compile_imported(imported: ImportedProgram, options: Options, key: str, target: Target,
                      donated: donation.Donation, on_stage: Callable[[str], None], dump: Dump) -> CompiledProgram:
    if donated.aliases:
        results.mark_donated_arguments(imported.module, donated.aliases)
    callbacks = host_callbacks.entries(imported.module)
    if callbacks and not target.calls_back:
        raise UnsupportedError(host_callbacks.PREFIX, f"calls back into Python from a {target.name} program")
    start = time.perf_counter()
    tier = work.tier(imported.module, options.fast_tier)
    estimated = time.perf_counter() - start
    timings = passes.run_stages(imported.module, target.stages(options, tier), options, dump, on_stage)
    timings["work estimate"] = estimated
    exe = target.build(LoweredProgram(imported, key, donated, callbacks, tier, timings, dump, on_stage), options)
    dump.timings(timings)
    return exe
