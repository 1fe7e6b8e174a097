"""stablehlo.constant and stablehlo.iota."""
from __future__ import annotations

from polyblocks_jax.stablehlo_import import builders, reader
from polyblocks_jax.stablehlo_import.registry import converts


@converts("stablehlo.constant")
def constant(cx, op):
    spec = op.result_specs[0]
    values = reader.dense_values(op.attr("value"), spec)
    if op.scalar:
        return [builders.splat(values.reshape(-1)[0], op.result_type())]
    return [builders.dense_constant(values, spec)]
