"""Shape and data-movement ops: broadcast_in_dim, reshape, transpose, reverse, slice,
concatenate, pad, dynamic_slice and dynamic_update_slice.

They become linalg ops (generic, transpose, fill) and tensor slicing/reshaping ops on
whole tensors (layout.py, slices.py); all bufferize with one-shot-bufferize. Slices
inserted into a fresh destination (concatenate, pad) bufferize in place: no copy of the
destination is made.
An op that leaves its operand unchanged returns it: this also covers the rank-0
scalars of reduction bodies, where these ops can only be identities.
"""
from __future__ import annotations

from mlir import ir

from polyblocks_jax.dtypes import TensorSpec
from polyblocks_jax.stablehlo_import import reader
from polyblocks_jax.tensor_ir import builders, layout, slices
from polyblocks_jax.stablehlo_import.registry import converts


@converts("stablehlo.broadcast_in_dim")
def broadcast_in_dim(cx, op):
    (x,), src, dst = op.operands, op.operand_specs[0], op.result_specs[0]
    dims = reader.i64_list(op.attr("broadcast_dimensions"))
    if src.shape == dst.shape and dims == list(range(dst.rank)):
        return [x]
    # Operand dim i follows result dim dims[i], or stays at 0 where a size-1 dim expands.
    exprs = [ir.AffineConstantExpr.get(0) if src.shape[i] != dst.shape[d] else ir.AffineDimExpr.get(d)
             for i, d in enumerate(dims)]
    in_map = ir.AffineMap.get(dst.rank, 0, exprs)
    return [builders.parallel_generic([x], builders.empty(dst), [in_map], lambda v, _: v)]


@converts("stablehlo.reshape")
def reshape(cx, op):
    return [layout.reshape(op.operands[0], op.result_specs[0].shape)]


@converts("stablehlo.transpose")
def transpose(cx, op):
    return [layout.transpose(op.operands[0], reader.i64_list(op.attr("permutation")))]


@converts("stablehlo.reverse")
def reverse(cx, op):
    return [layout.reverse(op.operands[0], reader.i64_list(op.attr("dimensions")))]


@converts("stablehlo.slice")
def slice_(cx, op):
    (x,), src, dst = op.operands, op.operand_specs[0], op.result_specs[0]
    starts = reader.i64_list(op.attr("start_indices"))
    strides = reader.i64_list(op.attr("strides"))
    if src.shape == dst.shape and all(s == 1 for s in strides):
        return [x]
    return [slices.extract_slice(x, dst.shape, starts, strides)]


@converts("stablehlo.concatenate")
def concatenate(cx, op):
    dim, dst = reader.i64(op.attr("dimension")), op.result_specs[0]
    if len(op.operands) == 1:
        return [op.operands[0]]
    result, offset = builders.empty(dst), 0
    for x, spec in zip(op.operands, op.operand_specs):
        if spec.size:
            result = slices.insert_slice(x, result, [offset if d == dim else 0 for d in range(dst.rank)])
        offset += spec.shape[dim]
    return [result]


@converts("stablehlo.pad")
def pad(cx, op):
    x, value = op.operands
    low, high = reader.i64_list(op.attr("edge_padding_low")), reader.i64_list(op.attr("edge_padding_high"))
    interior = reader.i64_list(op.attr("interior_padding"))
    if not any(interior) and any([*low, *high]):
        selected = slices.pad_unit_dims(x, value, low, high)
        if selected is not None:
            return [selected]
    return [slices.pad(x, value, low, high, interior)]


@converts("stablehlo.dynamic_slice")
def dynamic_slice(cx, op):
    (x, *starts), src, dst = op.operands, op.operand_specs[0], op.result_specs[0]
    if src.shape == dst.shape:
        return [x]  # the clamped starts are all 0
    offsets = [_clamped_start(s, spec, n - size)
               for s, spec, n, size in zip(starts, op.operand_specs[1:], src.shape, dst.shape)]
    return [slices.extract_slice(x, dst.shape, offsets)]


@converts("stablehlo.dynamic_update_slice")
def dynamic_update_slice(cx, op):
    (x, update, *starts), (src, upd) = op.operands, op.operand_specs[:2]
    if upd.shape == src.shape:
        return [update]
    if not upd.size:
        return [x]
    offsets = [_clamped_start(s, spec, n - size)
               for s, spec, n, size in zip(starts, op.operand_specs[2:], src.shape, upd.shape)]
    return [slices.insert_slice(update, x, offsets)]


def _clamped_start(start: ir.Value, spec: TensorSpec, limit: int) -> slices.Offset:
    """XLA clamps a start index into [0, limit] so that the slice stays in bounds."""
    if limit == 0:
        return 0
    unsigned = spec.dtype.is_unsigned  # zero-extended, so never below 0
    return slices.clamp_start(slices.to_index(builders.to_scalar(start), unsigned), limit, unsigned)
