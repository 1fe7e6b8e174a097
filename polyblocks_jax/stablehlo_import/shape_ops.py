"""Shape and data-movement ops: broadcast_in_dim, reshape, transpose, reverse, slice,
concatenate, pad, dynamic_slice and dynamic_update_slice.

They become linalg ops (generic, transpose, fill) and tensor slicing/reshaping ops on
whole tensors; all bufferize with one-shot-bufferize. Slices inserted into a fresh
destination (concatenate, pad) bufferize in place: no copy of the destination is made.
An op that leaves its operand unchanged returns it: this also covers the rank-0
scalars of reduction bodies, where these ops can only be identities.
"""
from __future__ import annotations

from typing import Sequence

from mlir import ir
from mlir.dialects import arith, linalg, tensor

from polyblocks_jax.dtypes import TensorSpec
from polyblocks_jax.stablehlo_import import builders, reader
from polyblocks_jax.stablehlo_import.registry import converts
from polyblocks_jax.stablehlo_import.types import tensor_type

Offset = int | ir.Value  # a static offset, or an index value computed at run time


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
    return [_reshape(op.operands[0], op.operand_specs[0].shape, op.result_specs[0])]


def _reshape(x: ir.Value, shape: Sequence[int], dst: TensorSpec) -> ir.Value:
    """A collapse or an expand where one suffices, else a collapse to 1-D then an expand."""
    if tuple(shape) == dst.shape:
        return x
    groups = _collapse_groups(shape, dst.shape)
    if groups is not None:
        return tensor.CollapseShapeOp(tensor_type(dst), x, _reassociation(groups)).result
    groups = _collapse_groups(dst.shape, shape)
    if groups is not None:
        return tensor.ExpandShapeOp(tensor_type(dst), x, _reassociation(groups), [], list(dst.shape)).result
    flat = TensorSpec((dst.size,), dst.dtype)
    return _reshape(_reshape(x, shape, flat), flat.shape, dst)


def _collapse_groups(src: Sequence[int], dst: Sequence[int]) -> list[list[int]] | None:
    """Groups of consecutive ``src`` dims whose products are ``dst``'s dims, or None."""
    if not dst:
        return []  # src holds only 1s (equal sizes)
    if len(dst) == 1:
        return [list(range(len(src)))] if src else None
    if 0 in src or 0 in dst:
        return None  # products of 0 are ambiguous: go through 1-D
    groups, i = [], 0
    for size in dst:
        if i == len(src):
            return None
        group, product = [i], src[i]
        i += 1
        while product < size and i < len(src):
            group.append(i)
            product *= src[i]
            i += 1
        if product != size:
            return None
        groups.append(group)
    if any(s != 1 for s in src[i:]):
        return None
    groups[-1] += range(i, len(src))  # trailing 1s join the last group
    return groups


def _reassociation(groups: list[list[int]]) -> ir.ArrayAttr:
    i64 = ir.IntegerType.get_signless(64)
    return ir.ArrayAttr.get([ir.ArrayAttr.get([ir.IntegerAttr.get(i64, d) for d in g]) for g in groups])


@converts("stablehlo.transpose")
def transpose(cx, op):
    perm = reader.i64_list(op.attr("permutation"))
    if perm == sorted(perm):
        return [op.operands[0]]
    init = builders.empty(op.result_specs[0])
    return [linalg.transpose(op.operands[0], outs=[init], permutation=perm).results[0]]


@converts("stablehlo.reverse")
def reverse(cx, op):
    (x,), spec = op.operands, op.result_specs[0]
    dims = {d for d in reader.i64_list(op.attr("dimensions")) if spec.shape[d] > 1}
    if not dims:
        return [x]
    exprs = [ir.AffineConstantExpr.get(spec.shape[d] - 1) - ir.AffineDimExpr.get(d) if d in dims
             else ir.AffineDimExpr.get(d) for d in range(spec.rank)]
    in_map = ir.AffineMap.get(spec.rank, 0, exprs)
    return [builders.parallel_generic([x], builders.empty(spec), [in_map], lambda v, _: v)]


@converts("stablehlo.slice")
def slice_(cx, op):
    (x,), src, dst = op.operands, op.operand_specs[0], op.result_specs[0]
    starts = reader.i64_list(op.attr("start_indices"))
    strides = reader.i64_list(op.attr("strides"))
    if src.shape == dst.shape and all(s == 1 for s in strides):
        return [x]
    return [_extract_slice(x, dst, starts, strides)]


@converts("stablehlo.concatenate")
def concatenate(cx, op):
    dim, dst = reader.i64(op.attr("dimension")), op.result_specs[0]
    if len(op.operands) == 1:
        return [op.operands[0]]
    result, offset = builders.empty(dst), 0
    for x, spec in zip(op.operands, op.operand_specs):
        if spec.size:
            result = _insert_slice(x, spec, result, [offset if d == dim else 0 for d in range(dst.rank)])
        offset += spec.shape[dim]
    return [result]


@converts("stablehlo.pad")
def pad(cx, op):
    (x, value), src, dst = op.operands, op.operand_specs[0], op.result_specs[0]
    low, high = reader.i64_list(op.attr("edge_padding_low")), reader.i64_list(op.attr("edge_padding_high"))
    interior = reader.i64_list(op.attr("interior_padding"))
    if not any(low + high + interior):
        return [x]
    filled = linalg.fill(builders.to_scalar(value), outs=[builders.empty(dst)])
    # Operand element i lands at low + i * step; negative padding drops those outside.
    steps = [n + 1 for n in interior]
    firsts = [-(lo // step) if lo < 0 else 0 for lo, step in zip(low, steps)]  # ceil(-lo / step)
    lasts = [min(n - 1, (out - 1 - lo) // step) for n, out, lo, step in zip(src.shape, dst.shape, low, steps)]
    counts = [last - first + 1 for first, last in zip(firsts, lasts)]
    if min(counts) <= 0:
        return [filled]
    kept = TensorSpec(tuple(counts), src.dtype)
    if kept != src:
        x = _extract_slice(x, kept, firsts, [1] * src.rank)
    offsets = [lo + first * step for lo, first, step in zip(low, firsts, steps)]
    return [_insert_slice(x, kept, filled, offsets, steps)]


@converts("stablehlo.dynamic_slice")
def dynamic_slice(cx, op):
    (x, *starts), src, dst = op.operands, op.operand_specs[0], op.result_specs[0]
    if src.shape == dst.shape:
        return [x]  # the clamped starts are all 0
    offsets = [_clamped_start(s, spec, n - size)
               for s, spec, n, size in zip(starts, op.operand_specs[1:], src.shape, dst.shape)]
    return [_extract_slice(x, dst, offsets, [1] * dst.rank)]


@converts("stablehlo.dynamic_update_slice")
def dynamic_update_slice(cx, op):
    (x, update, *starts), (src, upd) = op.operands, op.operand_specs[:2]
    if upd.shape == src.shape:
        return [update]
    if not upd.size:
        return [x]
    offsets = [_clamped_start(s, spec, n - size)
               for s, spec, n, size in zip(starts, op.operand_specs[2:], src.shape, upd.shape)]
    return [_insert_slice(update, upd, x, offsets)]


def _clamped_start(start: ir.Value, spec: TensorSpec, limit: int) -> Offset:
    """XLA clamps a start index into [0, limit] so that the slice stays in bounds."""
    if limit == 0:
        return 0
    index = ir.IndexType.get()
    value, hi = builders.to_scalar(start), arith.constant(index, limit)
    if spec.dtype.is_unsigned:  # zero-extended, so never below 0
        return arith.minui(arith.index_castui(index, value), hi)
    return arith.minsi(arith.maxsi(arith.index_cast(index, value), arith.constant(index, 0)), hi)


def _extract_slice(x: ir.Value, dst: TensorSpec, offsets: Sequence[Offset],
                   strides: Sequence[int]) -> ir.Value:
    if not dst.size:
        return builders.empty(dst)  # the verifier rejects offsets into a zero-size dim
    dynamic, static = _split_offsets(offsets)
    return tensor.ExtractSliceOp(tensor_type(dst), x, dynamic, [], [], static,
                                 list(dst.shape), list(strides)).result


def _insert_slice(x: ir.Value, spec: TensorSpec, dest: ir.Value, offsets: Sequence[Offset],
                  strides: Sequence[int] | None = None) -> ir.Value:
    dynamic, static = _split_offsets(offsets)
    strides = list(strides) if strides is not None else [1] * spec.rank
    return tensor.InsertSliceOp(x, dest, dynamic, [], [], static, list(spec.shape), strides).result


def _split_offsets(offsets: Sequence[Offset]) -> tuple[list[ir.Value], list[int]]:
    """Operands and the static attribute of mixed offsets (dynamic ones get a sentinel)."""
    dynamic = [o for o in offsets if isinstance(o, ir.Value)]
    sentinel = ir.ShapedType.get_dynamic_stride_or_offset()
    static = [sentinel if isinstance(o, ir.Value) else o for o in offsets]
    return dynamic, static
