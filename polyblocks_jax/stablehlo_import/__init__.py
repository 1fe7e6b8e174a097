"""StableHLO (read with jaxlib's MLIR) -> linalg on tensors (upstream MLIR).

``import_program`` (in ``program``) is the stage's one entry point. The package loads the
upstream bindings and the converters only when that is asked for: ``reader`` alone (jaxlib's
MLIR) serves a process that loads compiled programs, as from JAX's persistent cache, and
never compiles.
"""
from __future__ import annotations

__all__ = ["import_program", "ImportedProgram", "COMPLEX_CONVERTERS", "CONVERTERS", "FAMILY"]


def __getattr__(name: str):
    if name in __all__:
        from polyblocks_jax.stablehlo_import import program
        return getattr(program, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
