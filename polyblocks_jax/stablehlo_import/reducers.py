"""What a reduction body (of stablehlo.reduce, reduce_window) computes, read from its ops."""
from __future__ import annotations

from typing import Callable, Sequence

from jaxlib.mlir import ir as jir
from mlir import ir
from mlir.dialects import arith

from polyblocks_jax.dtypes import TensorSpec
from polyblocks_jax.tensor_ir import builders

# The body ops a 16-bit float reduction computes in f32, with their f32 combiners.
_WIDENED = {"stablehlo.add": arith.addf, "stablehlo.maximum": builders.exact_maximumf,
            "stablehlo.minimum": builders.exact_minimumf}


def single_op(body: jir.Block) -> str | None:
    """The name of the one op that ``body`` applies to its two arguments, if that is all it does."""
    ops = [o.operation for o in body.operations]
    if len(ops) != 2 or len(body.arguments) != 2 or set(ops[0].operands) != set(body.arguments):
        return None
    return ops[0].name if list(ops[1].operands) == list(ops[0].results) else None


def half_precision_combiner(body: jir.Block, specs: Sequence[TensorSpec]) -> Callable[[ir.Value, ir.Value], ir.Value] | None:
    """The f32 combiner (accumulator, element) that a reduction ``body`` over one 16-bit float
    operand of ``specs`` runs with, when it is one add, max or min; else None. A sum then
    accumulates in f32 and rounds once, as jnp.sum does (rounded at every step the partial
    sums drift by as many roundings as terms); a max or min is exact either way, and runs on
    f32 vectors rather than on 16-bit ones that each step widens and narrows again."""
    if len(specs) != 1 or not specs[0].dtype.is_float or specs[0].dtype.bits != 16:
        return None
    return _WIDENED.get(single_op(body))
