"""Elementwise siblings merged into one generic of several results.

Upstream's elementwise fusion fuses a producer into its consumer only where that consumer is
its one use. Two elementwise ops over the same loops reading the same value (a binary search's
step: ``lo = where(m, lo, mid)`` and ``hi = where(m, mid, hi)``, both reading the mask ``m``
and the midpoint ``mid``) leave that value a tensor written whole, then read back by each
sibling in a loop of its own: per step of a loop of small steps, a kernel per op and the
mask's round trip through memory. Merged into one generic with a result per sibling, the
shared values have one consumer again, which fusion then computes in registers: one loop.

Two siblings merge where they run over the same loops, read one value through the same
indexing map, and one can move to the other: the later one up where every value it reads is
defined before the earlier one, or the earlier one down where nothing between them uses its
results. A merged op takes each shared input once.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import linalg

from polyblocks_jax.passes.transform import indexing_maps, input_position, nested_in, walk


def merge_siblings(module: ir.Module) -> bool:
    """Merge elementwise generics that share an input, pairwise until none is left; whether
    any were."""
    merged = False
    while True:
        pair = _mergeable_pair(module)
        if pair is None:
            return merged
        _merge(*pair)
        merged = True


def _elementwise(op: ir.Operation) -> bool:
    """A linalg.generic on static tensors whose loops are all parallel (any number of results)
    and whose body computes: a copy (a broadcast, a transpose) stays an op of its own, as
    the stages after fusion recognize it (tile fusion, folds of transposed broadcasts)."""
    return (op.name == "linalg.generic" and "reduction" not in str(op.attributes["iterator_types"])
            and all(isinstance(v.type, ir.RankedTensorType) and ir.RankedTensorType(v.type).has_static_shape
                    for v in op.operands)
            and len(op.regions[0].blocks[0].operations) > 1)


def _loop_ranges(op: ir.Operation) -> tuple[int, ...] | None:
    """The extent of each loop of ``op``, read from the operands its maps index plainly."""
    maps = indexing_maps(op)
    ranges: list[int | None] = [None] * maps[0].n_dims
    for value, m in zip(op.operands, maps):
        for size, e in zip(ir.RankedTensorType(value.type).shape, m.results):
            if isinstance(e, ir.AffineDimExpr):
                ranges[e.position] = size
    return None if None in ranges else tuple(ranges)


def _mergeable_pair(module: ir.Module) -> tuple[ir.Operation, ir.Operation, ir.Operation] | None:
    """(earlier, later, anchor) of two siblings to merge, the merged op to be placed before
    ``anchor``; None when no two are."""
    readers: dict[ir.Value, list[tuple[ir.Operation, ir.AffineMap]]] = {}
    for op in walk(module.operation):
        if not _elementwise(op):
            continue
        n_inputs = len(op.operands) - len(op.results)
        for value, m in zip(list(op.operands)[:n_inputs], indexing_maps(op)):
            siblings = readers.setdefault(value, [])
            if all(other != op for other, _ in siblings):
                siblings.append((op, m))
    for siblings in readers.values():
        for i, (a, map_a) in enumerate(siblings):
            for b, map_b in siblings[i + 1:]:
                if map_a != map_b or a.block != b.block or _loop_ranges(a) != _loop_ranges(b) \
                        or a.attributes["iterator_types"] != b.attributes["iterator_types"]:
                    continue
                order = _block_order(a)
                first, second = (a, b) if order[a] < order[b] else (b, a)
                anchor = _anchor(first, second, order)
                if anchor is not None:
                    return first, second, anchor
    return None


def _block_order(op: ir.Operation) -> dict[ir.Operation, int]:
    """The position of each op of ``op``'s block."""
    block = op.block
    return {o.operation: k for k, o in enumerate(block.operations)}


def _anchor(first: ir.Operation, second: ir.Operation, order: dict[ir.Operation, int]) -> ir.Operation | None:
    """Where the merge of ``first`` and ``second`` (later in the same block) may go: before
    ``second`` when no op up to ``second`` uses ``first``'s results, else before ``first`` when
    every value ``second`` reads is defined before ``first``; None when neither holds."""
    if all(order.get(_in_block(use.owner.operation, first.block), len(order)) > order[second]
           for r in first.results for use in r.uses):
        return second
    for inner in [second, *walk(second)]:
        for value in inner.operands:
            owner = value.owner
            defining = owner.owner.operation if isinstance(owner, ir.Block) else owner.operation
            ancestor = _in_block(defining, first.block)
            if ancestor is not None and ancestor != second and not nested_in(ancestor, second) \
                    and order[ancestor] >= order[first]:
                return None
    return first


def _in_block(op: ir.Operation, block: ir.Block) -> ir.Operation | None:
    """The ancestor of ``op`` (itself included) that lies in ``block``, or None."""
    while op.parent is not None:  # (the module has no block)
        if op.block == block:
            return op
        op = op.parent.operation
    return None


def _merge(first: ir.Operation, second: ir.Operation, anchor: ir.Operation) -> None:
    """One generic computing ``first``'s results, then ``second``'s, placed before ``anchor``."""
    inputs: list[ir.Value] = []
    maps: list[ir.AffineMap] = []
    positions: list[list[int]] = []  # per op, the merged block argument of each of its own
    for op in (first, second):
        n_inputs = len(op.operands) - len(op.results)
        own = []
        for value, m in zip(list(op.operands)[:n_inputs], indexing_maps(op)):
            own.append(input_position(inputs, maps, value, m))
        positions.append(own)
    outputs = [v for op in (first, second) for v in list(op.operands)[len(op.operands) - len(op.results):]]
    output_maps = [m for op in (first, second) for m in indexing_maps(op)[len(op.operands) - len(op.results):]]
    for k, op in enumerate((first, second)):
        start = len(inputs) + sum(len(o.results) for o in (first, second)[:k])
        positions[k] += list(range(start, start + len(op.results)))
    with ir.InsertionPoint(anchor), first.location:
        merged = linalg.GenericOp([v.type for v in outputs], inputs, outputs,
                                  ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps + output_maps]),
                                  first.attributes["iterator_types"])
    block = merged.regions[0].blocks.append(*[ir.RankedTensorType(v.type).element_type for v in inputs + outputs])
    yielded: list[ir.Value] = []
    point = ir.InsertionPoint(block)
    for op, own in zip((first, second), positions):
        body = op.regions[0].blocks[0]
        for arg, k in zip(body.arguments, own):
            arg.replace_all_uses_with(block.arguments[k])
        ops = list(body.operations)
        for inner in ops[:-1]:
            point.insert(inner.operation.detach_from_parent())
        yielded += list(ops[-1].operands)
    with point, first.location:
        linalg.YieldOp(yielded)
    results = list(merged.results)
    for op in (first, second):
        for r in op.results:
            r.replace_all_uses_with(results.pop(0))
        op.erase()
