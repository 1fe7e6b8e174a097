"""The importer's entry point: StableHLO -> linalg on tensors in an upstream MLIR context.

Converters live one module per op family; importing them here fills the converter table.
"""
from __future__ import annotations

from mlir import ir

from polyblocks_jax import contexts
from polyblocks_jax.errors import CompilationError
from polyblocks_jax.stablehlo_import import reader
from polyblocks_jax.stablehlo_import.importer import ImportedProgram, Importer
from polyblocks_jax.stablehlo_import.registry import COMPLEX_CONVERTERS, CONVERTERS, FAMILY  # noqa: F401 (the package's)
# Op families: each registers its converters on import.
from polyblocks_jax.stablehlo_import import (  # noqa: F401
    bit_ops, calls, collectives, complex, constants, control_flow, convert, convolution, custom_call, dot,
    elementwise, fft, host_callbacks, indexing, linear_algebra, reduce, rng, shape_ops, sort, windows)


def import_program(program, context: ir.Context) -> ImportedProgram:
    """Convert ``program`` (text, VHLO bytes or jax Lowered) into a module owned by ``context``."""
    source = reader.program_source(program)
    jctx = contexts.program_context()
    jmodule = reader.parse(source, jctx)
    with jctx, context, ir.Location.unknown(context):
        imported = Importer(jmodule).import_main()
    if not imported.module.operation.verify():
        raise CompilationError("import", "the imported module does not verify",
                               str(imported.module))
    return imported
