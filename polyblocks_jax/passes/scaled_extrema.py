"""A max or min over a positively scaled tensor becomes the max or min of the tensor, scaled.

Softmax over ``scores / sqrt(d)`` reads the scaled scores twice: their row max, then
``exp(scaled - max)``. Elementwise fusion cannot fuse the scaling, a producer with two
consumers, so it stays a pass of its own over the scores (attention: 4% of its time).
Rounding is monotone: for ``g(x) = x / c`` or ``x * c`` with a finite ``c > 0``,
``max(g(x)) == g(max(x))`` exactly (NaN, infinities and the sign of zero included, g keeping
each value's sign), so the reduction reads ``x`` and ``g`` is applied to its few results.
The scaling then has one consumer left, into which fusion folds it.
"""
from __future__ import annotations

import math

from mlir import ir
from mlir.dialects import tensor

from polyblocks_jax.passes import signed_extrema
from polyblocks_jax.passes.transform import FLOAT_EXTREMA, float_constant, indexing_maps, is_elementwise_generic, walk
from polyblocks_jax.tensor_ir.builders import parallel_generic

_SCALINGS = ("arith.divf", "arith.mulf")


def reduce_before_scaling(module: ir.Module) -> bool:
    """Move the scaling past every max/min reduction of a scaled tensor; whether any moved."""
    moved = False
    for op in list(walk(module.operation)):
        scaling = _scaled_input(op)
        if scaling is not None and _init_is_fixed_point(op):
            _move_past(op, scaling)
            moved = True
    return moved


def _scaled_input(op: ir.Operation) -> ir.Operation | None:
    """The elementwise scaling by a positive constant that ``op``, a max/min reduction with
    one input, reads; None when ``op`` is not such a reduction of such a scaling."""
    if op.name != "linalg.generic" or len(op.operands) != 2 or len(op.results) != 1 \
            or "reduction" not in str(op.attributes["iterator_types"]) or not _is_extremum(op):
        return None
    producer = op.operands[0].owner
    if not isinstance(producer, ir.OpView) or not _is_scaling(producer.operation):
        return None
    return producer.operation


def _is_extremum(op: ir.Operation) -> bool:
    block = op.regions[0].blocks[0]
    accumulator, yielded = block.arguments[1], list(block.operations)[-1].operands[0]
    if signed_extrema.is_signed_zero_combiner(accumulator, yielded):
        return True
    combine = yielded.owner
    return isinstance(combine, ir.OpView) and combine.operation.name in FLOAT_EXTREMA \
        and set(combine.operation.operands) == set(block.arguments)


def _is_scaling(op: ir.Operation) -> bool:
    """A one-input generic, identity maps, computing ``in / c``, ``in * c`` or ``c * in``."""
    if not is_elementwise_generic(op) or len(op.operands) != 2:
        return False
    if not all(_is_identity(m) for m in indexing_maps(op)):
        return False
    body = list(op.regions[0].blocks[0].operations)
    value = op.regions[0].blocks[0].arguments[0]
    if len(body) != 2 or body[0].name not in _SCALINGS or body[1].operands[0] != body[0].results[0]:
        return False
    lhs, rhs = body[0].operands
    scale = rhs if lhs == value else lhs if body[0].name == "arith.mulf" and rhs == value else None
    c = None if scale is None else float_constant(scale)
    # (a constant inside the body would be out of reach of the new generic)
    return c is not None and 0.0 < c and math.isfinite(c) and scale.owner.operation.parent != op


def _is_identity(m: ir.AffineMap) -> bool:
    return m == ir.AffineMap.get_identity(m.n_dims)


def _init_is_fixed_point(op: ir.Operation) -> bool:
    """Whether the reduction starts from a fill that the scaling leaves as it is (+-inf, 0)."""
    fill = op.operands[1].owner
    if not isinstance(fill, ir.OpView) or fill.operation.name != "linalg.fill":
        return False
    start = float_constant(fill.operation.operands[0])
    return start is not None and (math.isinf(start) or start == 0.0)


def _move_past(reduction: ir.Operation, scaling: ir.Operation) -> None:
    """``reduction`` reads what ``scaling`` reads; its result is scaled in a new generic."""
    reduction.operands[0] = scaling.operands[0]
    result = reduction.results[0]
    body = list(scaling.regions[0].blocks[0].operations)[0]
    shaped = ir.RankedTensorType(result.type)
    with ir.InsertionPoint.after(reduction), reduction.location:
        init = tensor.EmptyOp(shaped.shape, shaped.element_type)
        scaled = parallel_generic([result], init.result, [ir.AffineMap.get_identity(shaped.rank)],
                                  lambda x, _out: _scale_like(body, x))
    result.replace_all_uses_except(scaled, scaled.owner.operation)


def _scale_like(op: ir.Operation, x: ir.Value) -> ir.Value:
    """``op`` (the scaling's divf or mulf) applied to ``x`` in place of its block argument."""
    clone = op.clone()
    for index, operand in enumerate(op.operands):
        if isinstance(operand, ir.BlockArgument):
            clone.operands[index] = x
    return clone.results[0]
