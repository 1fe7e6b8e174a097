"""polyblocks_jax: a JAX backend that compiles StableHLO itself, through MLIR.

``compile(program)`` turns StableHLO (text, a VHLO artifact, or ``jax.jit(f).lower(...)``)
into an ``Executable`` called with numpy arrays; ``Executable.serialize`` and
``deserialize`` carry it to a process where MLIR is not installed. ``compile(program,
target=...)`` compiles for another target of ``polyblocks_jax.targets`` (an NVIDIA chip's
PTX, ``nvptx.GpuExecutable``). The PJRT plugin
(``polyblocks_jax.pjrt``) makes the same compiler the platform ``"polyblocks"`` of ``jax.jit``.
"""
from __future__ import annotations

from polyblocks_jax import logs, targets
from polyblocks_jax.errors import (CallbackError, CompilationError, DistributedError, InvalidArgumentError,
                                   InvalidProgramError, PolyblocksError, ResourceExhaustedError,
                                   UnsupportedDtypeError, UnsupportedError)
from polyblocks_jax.options import Options
from polyblocks_jax.runtime.executable import Executable, deserialize  # no MLIR: loads anywhere

__version__ = "0.1.0"
logs.configure()

__all__ = ["compile", "deserialize", "Executable", "Options", "PolyblocksError", "UnsupportedError",
           "UnsupportedDtypeError", "CompilationError", "InvalidProgramError", "InvalidArgumentError",
           "ResourceExhaustedError", "CallbackError", "DistributedError"]


def compile(program, options: Options | None = None, donate_argnums=None, *,  # noqa: A001 (mirrors jax's naming)
            target: str = targets.HOST):
    """Compile ``program`` for ``target`` (a name of ``polyblocks_jax.targets``: "cpu", this host,
    or "nvptx-<chip>"); see ``polyblocks_jax.compiler.compile``."""
    options = options or Options.from_env()
    prestart_compiler(options, target)  # a compile worker imports the compiler while this process does
    from polyblocks_jax import compiler  # the MLIR stack loads on first compile, not on import
    return compiler.compile(program, options, donate_argnums, target=target)


def prestart_compiler(options: Options, target: str = targets.HOST) -> None:
    """Start a compile worker for ``target`` now, without waiting for it, where its compiles
    run in workers and none is running."""
    kind = targets.get(target).compile_worker
    if not options.in_process and kind is not None:
        from polyblocks_jax import compile_workers
        compile_workers.prestart(kind)
