"""Compiling in this process: StableHLO -> import -> the target's stages -> its build.

What a compile worker runs for the driver (``compiler``), and what the driver runs itself
with ``Options.in_process``. It plans donation (for targets whose code reuses donated
buffers), writes the dumps (``POLYBLOCKS_DUMP``) and times every step. Loading it loads the
upstream MLIR stack and the whole compiler.
"""
from __future__ import annotations

import contextlib
import gc
import threading
import time
from typing import Callable, Sequence

from polyblocks_jax import contexts, donation, logs, passes, targets
from polyblocks_jax.compiler import program_text
from polyblocks_jax.dumps import Dump
from polyblocks_jax.errors import CompilationError, UnsupportedError
from polyblocks_jax.options import Options
from polyblocks_jax.passes import results, work
from polyblocks_jax.stablehlo_import import ImportedProgram, host_callbacks, import_program
from polyblocks_jax.targets import CompiledProgram, LoweredProgram, Target


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
