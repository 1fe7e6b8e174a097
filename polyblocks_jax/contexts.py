"""The upstream MLIR context a compile builds its IR in, the pass managers run in it, and
the jaxlib context its program is read in.

A new context loads every dialect the bindings register (17 ms, a tenth of a small
program's compile), and a pass manager initializes its passes on its first run in a
context (the canonicalizer gathers every loaded op's patterns); a jaxlib context is
cheaper, but its registry and the dialects a program uses cost 1 ms a compile. So in a
compile worker each thread keeps its contexts for its next compiles, with the pass
managers parsed in them, and starts fresh ones after ``MAX_COMPILES``: a context never frees the types, attributes
and locations it interns, so one kept for ever would grow with every program compiled.
The calling process (host-callback programs, ``in-process``) takes a fresh context per
compile: a context outliving a callback program's compile there crashed JAX's next
compile (a segfault in test_callbacks, not understood yet).
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator

from jaxlib.mlir import ir as jir
from mlir import ir, passmanager
from mlir._mlir_libs import _mlir

from polyblocks_jax.stablehlo_import import reader

MAX_COMPILES = 32

# Where the bindings find the dialects without a Python module of their own (see the package).
_mlir.globals.append_dialect_search_prefix("polyblocks_jax.dialects")


class _Slot(threading.local):
    def __init__(self) -> None:
        self.context: ir.Context | None = None
        self.compiles = 0
        self.pass_managers: dict[str, passmanager.PassManager] = {}
        self.program_context: jir.Context | None = None


_slot = _Slot()
_keep = False


def keep_per_thread() -> None:
    """Keep each thread's context from compile to compile (compile workers call this)."""
    global _keep
    _keep = True


@contextlib.contextmanager
def compile_context() -> Iterator[ir.Context]:
    """The context for one compile, entered with an unknown location: this thread's kept
    one (see ``keep_per_thread``), else a fresh one."""
    if not _keep:
        with ir.Context() as context, ir.Location.unknown():
            yield context
        return
    if _slot.context is None or _slot.compiles >= MAX_COMPILES:
        _slot.context, _slot.compiles, _slot.pass_managers, _slot.program_context = ir.Context(), 0, {}, None
    _slot.compiles += 1
    with _slot.context as context, ir.Location.unknown():
        yield context


def program_context() -> jir.Context:
    """The jaxlib context to read a program in, within ``compile_context``: this thread's
    kept one (see ``keep_per_thread``), else a fresh one."""
    if not _keep:
        return reader.new_context()
    if _slot.program_context is None:
        _slot.program_context = reader.new_context()
    return _slot.program_context


def pass_manager(pipeline: str, context: ir.Context) -> passmanager.PassManager:
    """The upstream ``pipeline`` (text anchored on its op, e.g. ``builtin.module(cse)``)
    without verification after each pass (passes/pipeline.py says why), parsed once per
    kept context."""
    kept = context is _slot.context
    if kept and pipeline in _slot.pass_managers:
        return _slot.pass_managers[pipeline]
    pm = passmanager.PassManager.parse(pipeline, context)
    pm.enable_verifier(False)
    if kept:
        _slot.pass_managers[pipeline] = pm
    return pm
