"""The host's build step: the LLVM-dialect module its stages leave -> a shared library -> an Executable."""
from __future__ import annotations

from typing import Iterable, Sequence

from polyblocks_jax.cpu import codegen
from polyblocks_jax.cpu.arena import arena_bytes
from polyblocks_jax.cpu.executable import CpuExecutable, openmp_runtime
from polyblocks_jax.cpu.target import host
from polyblocks_jax.dtypes import TensorSpec
from polyblocks_jax.options import Options
from polyblocks_jax.passes import results
from polyblocks_jax.runtime.executable import Executable
from polyblocks_jax.targets import LoweredProgram


def build(llvm_module, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], options: Options,
          aliases: Sequence[int | None] | None = None, overwritten: Iterable[int] = (),
          timings: dict[str, float] | None = None, dump=None) -> CpuExecutable:
    """Compile an LLVM-dialect module into a CpuExecutable; the times of LLVM's tools go
    into ``timings``, their inputs and outputs into ``dump``."""
    library = codegen.shared_library(llvm_module, options.opt_level, openmp_runtime(), host().cores, timings, dump,
                                     options.object_cache)
    return CpuExecutable(library, inputs, outputs, aliases, overwritten, arena_bytes(llvm_module))


def build_program(program: LoweredProgram, options: Options) -> Executable:
    """The Executable of ``program``: its library, signature, donation, callbacks and devices."""
    imported, donated = program.imported, program.donation
    recorded = results.output_aliases(imported.module)
    aliases = None if recorded is None else [None if a < 0 else a for a in recorded]
    # A tiny program's code at LLVM's first level (passes/work.py): as fast to run at its
    # size. Not -O0: its FastISel fuses no multiply and add marked contractible, so a*b+c
    # would differ in its last bit from the other levels' code and XLA's, and the whole-block
    # selection at -O0 aborts on a scalar bf16 bitcast (jnp.signbit).
    # overwritten: the donors bufferization may write.
    exe = build(imported.module, imported.inputs, imported.outputs,
                options.replace(opt_level=1) if program.tier.tiny else options, aliases,
                overwritten=donated.aliases, timings=program.timings, dump=program.dump)
    return Executable(exe, program.key, program.timings, donated.donated, program.callbacks, imported.replicas,
                      imported.partitions, imported.collectives)
