"""The driver: program -> import -> shared stages -> target stages -> executable.

Compiled executables are cached in memory, keyed by the program printed without its
debug locations (the same program traced from two source lines compiles once), the
options that change code generation and the requested donation; the cache is bounded
and evicts the least recently used entry. A program missing from the cache compiles in a
compile worker (``polyblocks_jax.compile_workers``), so that a crash of MLIR or LLVM is a
CompilationError and not the end of this process; ``Options.in_process`` compiles here.
This module loads MLIR: the runtime (``polyblocks_jax.runtime``) runs what it builds without it.
"""
from __future__ import annotations

import collections
import contextlib
import gc
import hashlib
import threading
import time
from typing import Callable, Sequence


from polyblocks_jax import compile_workers, contexts, cpu, donation, logs, passes
from polyblocks_jax.cpu import codegen
from polyblocks_jax.dumps import Dump
from polyblocks_jax.errors import CompilationError
from polyblocks_jax.options import Options
from polyblocks_jax.passes import results, work
from polyblocks_jax.runtime import host_callbacks as runtime_callbacks
from polyblocks_jax.runtime.executable import Executable, deserialize  # noqa: F401 (compiler.deserialize)
from polyblocks_jax.stablehlo_import import ImportedProgram, host_callbacks, import_program, reader

CACHE_CAPACITY = 256


class _Cache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: collections.OrderedDict[str, Executable] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> Executable | None:
        with self._lock:
            exe = self._entries.get(key)
            if exe is not None:
                self._entries.move_to_end(key)
            return exe

    def put(self, key: str, exe: Executable) -> None:
        with self._lock:
            self._entries[key] = exe
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


CACHE = _Cache(CACHE_CAPACITY)


def fingerprint(source: str | bytes, options: Options, donate_argnums: Sequence[int] | None = None) -> str:
    """The cache key of ``source`` (text or bytes of a program) compiled with ``options``."""
    return _key(_read(source)[0], options, donate_argnums)


def compile(program, options: Options | None = None,  # noqa: A001 (public API name)
            donate_argnums: Sequence[int] | None = None) -> Executable:
    """Compile StableHLO text, VHLO artifact bytes or a ``jax.stages.Lowered`` for the host.

    ``donate_argnums``: the arguments whose buffers the outputs may reuse (None: those the
    program marks, as ``jax.jit(f, donate_argnums=...)`` does); see ``polyblocks_jax.donation``.
    """
    options = options or Options.from_env()
    source = reader.program_source(program)
    text, marks = _read(source)
    key = _key(text, options, donate_argnums)
    name = logs.program_name(text)
    cached = CACHE.get(key)
    if cached is not None:
        logs.logger.info("%s: in the compile cache", name)
        return cached
    exe = None
    # A program calling back into Python compiles here: its callbacks are objects of this
    # process, and its code calls them at this process's addresses.
    if not options.in_process and runtime_callbacks.TARGET not in text:
        with logs.CompileReport(name, "compile worker") as report:
            exe = compile_workers.compile(compile_workers.Job(source, options, key, marks, donate_argnums), text,
                                          report.follow)
            if exe is not None:
                report.note = _objects_note(exe.timings)
    if exe is None:  # in process, or no worker could start (logged)
        with logs.CompileReport(name, "in process") as report:
            exe = compile_in_process(source, options, key, marks, donate_argnums, report.stage)
            exe.load()
            report.note = _objects_note(exe.timings)
    CACHE.put(key, exe)
    return exe


def _objects_note(timings: dict[str, float]) -> str:
    cached, parts = codegen.cached_parts(timings)
    return f"objects cached: {cached} of {parts}"


def compile_in_process(source: str | bytes, options: Options, key: str, marks: dict[int, int | None],
                       donate_argnums: Sequence[int] | None,
                       on_stage: Callable[[str], None] | None = None) -> Executable:
    """Compile here, uncached (what a compile worker runs), the code not loaded yet (the
    worker only sends it); ``on_stage`` is told each stage's name."""
    with _cyclic_gc_paused():
        return _compile_uncached(source, options, key, marks, donate_argnums, on_stage or _ignore)


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


def _key(text: str, options: Options, donate_argnums: Sequence[int] | None) -> str:
    requested = "" if donate_argnums is None else "-donate" + ",".join(map(str, donate_argnums))
    return hashlib.sha256(text.encode()).hexdigest()[:32] + "-" + options.cache_key() + requested


def _ignore(stage: str) -> None:
    pass


def _compile_uncached(source: str | bytes, options: Options, key: str,
                      marks: dict[int, int | None] | None = None,
                      donate_argnums: Sequence[int] | None = None,
                      on_stage: Callable[[str], None] = _ignore) -> Executable:
    """Compile in this process; ``on_stage`` is told each stage's name as it starts."""
    dump = Dump(None, "")
    if options.dump_dir:
        dump = Dump(options.dump_dir, f"{logs.program_name(program_text(source))}-{key}")
        dump.stablehlo(source)
    with contexts.compile_context() as context:
        on_stage("import")
        imported = import_program(source, context)
        inputs, outputs = imported.inputs, imported.outputs
        donated = donation.plan(donation.requested_marks(marks or {}, donate_argnums, len(inputs)), inputs, outputs)
        try:
            return _compile_imported(imported, options, key, donated, on_stage, dump)
        except CompilationError as e:
            if e.stage != "bufferize" or not donated.aliases:
                raise
    # Bufferization cannot always honour a tie (a loop carrying the donated argument may
    # leave a conflict it cannot resolve): compile again with the inputs given up, not reused.
    with contexts.compile_context() as context:
        on_stage("import")
        imported = import_program(source, context)
        return _compile_imported(imported, options, key, donation.Donation(donated.donated), on_stage, dump)


def _compile_imported(imported: ImportedProgram, options: Options, key: str,
                      donated: donation.Donation, on_stage: Callable[[str], None], dump: Dump) -> Executable:
    if donated.aliases:
        results.mark_donated_arguments(imported.module, donated.aliases)
    callbacks = host_callbacks.entries(imported.module)
    start = time.perf_counter()
    tier = work.tier(imported.module, options.fast_tier)
    estimated = time.perf_counter() - start
    stages = cpu.host_stages(options, tier.small)
    timings = passes.run_stages(imported.module, stages, options, dump, on_stage)
    timings["work estimate"] = estimated
    recorded = results.output_aliases(imported.module)
    aliases = None if recorded is None else [None if a < 0 else a for a in recorded]
    on_stage("codegen")  # translation to LLVM IR, then LLVM (cpu/codegen.py)
    # A tiny program's code at LLVM's first level (passes/work.py): as fast to run at its
    # size. Not -O0: its FastISel fuses no multiply and add marked contractible, so a*b+c
    # would differ in its last bit from the other levels' code and XLA's, and the whole-block
    # selection at -O0 aborts on a scalar bf16 bitcast (jnp.signbit).
    exe = cpu.build(imported.module, imported.inputs, imported.outputs,
                    options.replace(opt_level=1) if tier.tiny else options, aliases,
                    overwritten=donated.aliases, timings=timings, dump=dump)  # the donors bufferization may write
    dump.timings(timings)
    return Executable(exe, key, timings, donated.donated, callbacks, imported.replicas, imported.partitions,
                      imported.collectives)
