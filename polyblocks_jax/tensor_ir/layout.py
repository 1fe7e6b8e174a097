"""Layout helpers on whole tensors: reshapes (collapse/expand), transposes, reversals.

Each returns its operand unchanged where the op would be an identity, so converters
need not test for that themselves.
"""
from __future__ import annotations

import math
from typing import Sequence

from mlir import ir
from mlir.dialects import linalg, tensor

from polyblocks_jax.tensor_ir import builders

Groups = list[list[int]]  # a reassociation: consecutive dims merged into one


def reassociation_attr(groups: Groups) -> ir.ArrayAttr:
    i64 = ir.IntegerType.get_signless(64)
    return ir.ArrayAttr.get([ir.ArrayAttr.get([ir.IntegerAttr.get(i64, d) for d in g]) for g in groups])


def collapse(value: ir.Value, groups: Groups, shape: Sequence[int]) -> ir.Value:
    """tensor.collapse_shape of ``value`` to ``shape``, merging each of ``groups``."""
    if builders.shape_of(value) == list(shape):
        return value
    t = ir.RankedTensorType.get(list(shape), builders.elem_type_of(value))
    return tensor.collapse_shape(t, value, reassociation_attr(groups))


def expand(value: ir.Value, groups: Groups, shape: Sequence[int]) -> ir.Value:
    """tensor.expand_shape of ``value`` to ``shape``, dim i becoming the dims ``groups[i]``."""
    if builders.shape_of(value) == list(shape):
        return value
    t = ir.RankedTensorType.get(list(shape), builders.elem_type_of(value))
    return tensor.expand_shape(t, value, reassociation_attr(groups), [], list(shape))


def reshape(value: ir.Value, shape: Sequence[int]) -> ir.Value:
    """``value`` (row-major) with ``shape``: a collapse or an expand where one suffices,
    else a collapse to 1-D then an expand."""
    src, shape = builders.shape_of(value), list(shape)
    if src == shape:
        return value
    groups = _collapse_groups(src, shape)
    if groups is not None:
        return collapse(value, groups, shape)
    groups = _collapse_groups(shape, src)
    if groups is not None:
        return expand(value, groups, shape)
    return reshape(reshape(value, [math.prod(shape)]), shape)


def _collapse_groups(src: Sequence[int], dst: Sequence[int]) -> Groups | None:
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


def transpose(value: ir.Value, perm: Sequence[int]) -> ir.Value:
    """``value`` with dim i taken from dim ``perm[i]`` (linalg.transpose)."""
    perm = list(perm)
    if perm == sorted(perm):
        return value
    shape = builders.shape_of(value)
    init = tensor.EmptyOp([shape[p] for p in perm], builders.elem_type_of(value)).result
    return linalg.transpose(value, outs=[init], permutation=perm).results[0]


def reverse(value: ir.Value, dims: Sequence[int]) -> ir.Value:
    """``value`` with the order of elements along ``dims`` reversed."""
    shape = builders.shape_of(value)
    flipped = {d for d in dims if shape[d] > 1}
    if not flipped:
        return value
    exprs = [ir.AffineConstantExpr.get(n - 1) - ir.AffineDimExpr.get(d) if d in flipped
             else ir.AffineDimExpr.get(d) for d, n in enumerate(shape)]
    init = tensor.EmptyOp(shape, builders.elem_type_of(value)).result
    return builders.parallel_generic([value], init, [ir.AffineMap.get(len(shape), 0, exprs)],
                                     lambda v, _: v)
