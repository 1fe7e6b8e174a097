"""Elementwise ops whose innermost dim no vector divides, run over trailing dims as one.

The vector plans (vectorize.py) carry vectors along an op's innermost dim: an image's 3
colour channels left ``x * s + b`` on (8, 224, 224, 3) scalar. With its last two dims
merged it runs on (8, 224, 672): 672 is 42 vectors of 16 (a dim that narrower vectors
divide, 8 channels, keeps them: a padded copy or a concatenation is built in place from
the op's own result, not from a reshape of it). The dims merged are the fewest
trailing ones whose elements make whole vectors; every operand must hold them in the same
order, side by side (a reshape then makes them one dim, a view after bufferization), or
none of them (a broadcast along all of them). An operand broadcast along only some of
them (a per-channel mean, read as ``[c]``) is first copied over the whole group: 672
elements, once a call. An operand's dims of one, indexed by a constant (None in the
``LoopNest``: a broadcast kept at its rank, ``[n, 0, 0, c]``), are reshaped away first.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from mlir import ir
from mlir.dialects import linalg, tensor

from polyblocks_jax.passes.transform import collapse, move_body, reassociation
from polyblocks_jax.tensor_ir.builders import parallel_generic

if TYPE_CHECKING:
    from polyblocks_jax.passes.tiling import Hardware
    from polyblocks_jax.cpu.vectorize import LoopNest

# A broadcast operand copied over the merged dims: at most this share of the op's elements.
_MAX_COPY_SHARE = 1 / 16


def merged_dims(nest: LoopNest, hw: Hardware) -> int | None:
    """The first of the trailing loops to merge into one (together they make whole vectors
    of 32-bit elements, no vector divides the innermost alone), or None: nothing to gain, a
    constant index in the result, a result holding the loops apart, or broadcasts too large
    to copy."""
    ranges, lanes = nest.ranges, hw.lanes(4)
    if nest.reductions or len(ranges) < 2 or ranges[-1] % hw.lanes(4, ranges[-1]) == 0 or None in nest.result:
        return None
    first = next((k for k in range(len(ranges) - 2, -1, -1) if math.prod(ranges[k:]) % lanes == 0), None)
    if first is None or _held_apart(nest.result, first, len(ranges)):
        return None
    inputs = [_loops(dims) for dims in nest.inputs]
    copied = sum(_copy_size(dims, first, ranges) for dims in inputs if _held_apart(dims, first, len(ranges)))
    return first if copied <= _MAX_COPY_SHARE * math.prod(ranges) else None


def merge_trailing_dims(op: ir.Operation, nest: LoopNest, first: int) -> None:
    """Replace the elementwise ``op`` by one over its loops ``first``.. merged (see
    ``merged_dims``), its operands and result reshaped to match."""
    ranges = nest.ranges
    parallel = ir.Attribute.parse("#linalg.iterator_type<parallel>")
    with ir.InsertionPoint(op), op.location:
        operands, maps = [], []
        for value, dims in zip(op.operands, [*nest.inputs, nest.result]):
            if None in dims:
                value, dims = _without_unit_dims(value, dims)
            if _held_apart(dims, first, len(ranges)):
                value, dims = _copied_over(value, dims, first, ranges)
            loops, groups = _merged(dims, first)
            if len(groups) < len(dims):
                value = _collapsed(value, groups)
            operands.append(value)
            maps.append(ir.AffineMap.get(first + 1, 0, [ir.AffineExpr.get_dim(d) for d in loops]))
        new = linalg.GenericOp([operands[-1].type], operands[:-1], [operands[-1]],
                               ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps]),
                               ir.ArrayAttr.get([parallel] * (first + 1)))
        move_body(op, new.operation)
        shape = ir.RankedTensorType(op.results[0].type).shape
        groups = _merged(nest.result, first)[1]
        result = tensor.ExpandShapeOp(op.results[0].type, new.result, reassociation(_positions(groups)),
                                      [], ir.DenseI64ArrayAttr.get(list(shape))).result
    op.results[0].replace_all_uses_with(result)
    op.erase()


def _loops(dims: tuple[int | None, ...]) -> tuple[int, ...]:
    return tuple(d for d in dims if d is not None)


def _without_unit_dims(value: ir.Value, dims: tuple[int | None, ...]) -> tuple[ir.Value, tuple[int, ...]]:
    """``value`` without its dims of one that a constant indexes: each joins the dim of a
    loop before it (or, before any, the first one); with none left, a tensor of rank 0."""
    groups: list[list[int | None]] = []
    leading = 0
    for d in dims:
        if d is not None:
            groups.append([None] * leading + [d])
            leading = 0
        elif groups:
            groups[-1].append(d)
        else:
            leading += 1
    return _collapsed(value, groups), _loops(dims)


def _collapsed(value: ir.Value, groups: list[list[int | None]]) -> ir.Value:
    """``value`` with the dims of each group merged (no group: a tensor of rank 0)."""
    shape = ir.RankedTensorType(value.type).shape
    runs = _positions(groups)
    return collapse(value, [math.prod(shape[p] for p in run) for run in runs], runs)


def _held_apart(dims: tuple[int, ...], first: int, rank: int) -> bool:
    """Whether an operand reads some of the loops ``first``.. but not all of them, in
    order, side by side (a broadcast along only some of them)."""
    inner = [i for i, d in enumerate(dims) if d >= first]
    together = [dims[i] for i in inner] == list(range(first, rank)) and inner[-1] - inner[0] + 1 == len(inner)
    return bool(inner) and not together


def _copy_size(dims: tuple[int, ...], first: int, ranges: tuple[int, ...]) -> int:
    return math.prod(ranges[d] for d in dims if d < first) * math.prod(ranges[first:])


def _copied_over(value: ir.Value, dims: tuple[int, ...], first: int,
                 ranges: tuple[int, ...]) -> tuple[ir.Value, tuple[int, ...]]:
    """``value`` (indexed by loops ``dims``) copied into a tensor indexed by its outer loops,
    then by every loop from ``first``: its dims then merge."""
    copied = tuple(d for d in dims if d < first) + tuple(range(first, len(ranges)))
    elem = ir.RankedTensorType(value.type).element_type
    init = tensor.EmptyOp([ranges[d] for d in copied], elem).result
    read = ir.AffineMap.get(len(copied), 0, [ir.AffineExpr.get_dim(copied.index(d)) for d in dims])
    return parallel_generic([value], init, [read], lambda x, _out: x), copied


def _merged(dims: tuple[int, ...], first: int) -> tuple[list[int], list[list[int]]]:
    """An operand's loops once merged (loop ``first`` stands for the merged ones), and the
    loops of each of its new dims."""
    loops: list[int] = []
    groups: list[list[int]] = []
    for d in dims:
        if d >= first and groups and groups[-1][-1] >= first:
            groups[-1].append(d)
        else:
            loops.append(min(d, first))
            groups.append([d])
    return loops, groups


def _positions(groups: list[list]) -> list[list[int]]:
    """Groups of dims as runs of positions: [[0], [2, 3]] -> [[0], [1, 2]]."""
    runs, start = [], 0
    for g in groups:
        runs.append(list(range(start, start + len(g))))
        start += len(g)
    return runs
