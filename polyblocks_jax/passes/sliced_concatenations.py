"""Slices of a concatenation read from its parts, as XLA's algebraic simplifier does.

A concatenation is slices inserted into a fresh tensor. A slice of it that lies within one
part is a slice of that part; one that spans several parts is the concatenation of their
slices. Padding modes built from the padded value's own edges (``jnp.pad``'s reflect,
symmetric, wrap and edge) slice the concatenation built so far at every step: each
intermediate concatenation had two readers, the slice and the next concatenation, and
bufferization gave each its own buffer, copying the whole value once per padded side.
Read from the parts instead, each intermediate has one reader, and the in-place stage
builds every part in the result's buffer: one pass over the data.

A slice within one part stays a view (no copy). A slice across parts is a new, small
concatenation: built only where it leaves the large one a single reader, the insertion
into another tensor, so that one copy of the slice saves a copy of the whole. A
concatenation inserted into another, read nowhere else, becomes the insertions of its
parts: one concatenation, which the in-place stage builds in its destination (upstream's
empty-tensor elimination stops at the nested one, whose destination comes later).

An elementwise op whose only reader of a concatenation it is (``jnp.roll(x, 5) + y``: two
slices of x concatenated) is first the concatenation of the op on each part's box, its
other operands sliced to match: the slices of the concatenation then read from its parts,
and each part's op writes its piece of the result in place, where the concatenation was a
copy of the whole, read back by the op.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from mlir import ir
from mlir.dialects import linalg, tensor

from polyblocks_jax.options import Options
from polyblocks_jax.passes.transform import indexing_maps, is_elementwise_generic, move_body, walk

_STATIC = ("static_offsets", "static_sizes", "static_strides")
# Boxes a chain of ops is computed on at most when several concatenations refine their parts
# (jnp.roll along both axes: 9); beyond, each op by its own concatenations.
_MAX_PIECES = 64


@dataclass(frozen=True)
class _Part:
    """A value inserted into a concatenation, and the box of the concatenation it fills."""
    value: ir.Value
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]


def slice_concatenations(module: ir.Module, options: Options) -> bool:
    """Split every elementwise op of a concatenation into the op of each part, then rewrite
    every static slice of a concatenation into slices of its parts, then every concatenation
    inserted into another into its parts' insertions (with ``options.fusion``); whether any
    was."""
    if not options.fusion:
        return False
    changed = _compute_by_parts(module)
    ops = walk(module.operation)
    pending = [op for op in ops if op.name == "tensor.extract_slice"]
    while pending:
        op = pending.pop()
        parts = _concatenated_parts(op.operands[0]) if _static_box(op) is not None else None
        if parts is None:
            continue
        new_slices = _read_from_parts(op, parts)
        if new_slices is not None:
            pending += new_slices
            changed = True
    # Nothing rewritten since: the ops walked above are still the module's (no second walk).
    inserts = [op for op in (walk(module.operation) if changed else ops) if op.name == "tensor.insert_slice"]
    for op in inserts:
        changed = _insert_parts(op) or changed
    return changed


def _insert_parts(op: ir.Operation) -> bool:
    """Replace the insertion ``op`` of a concatenation read nowhere else by the insertions of
    its parts (a concatenation of concatenations is one); whether it was."""
    source = op.operands[0]
    box = _static_box(op)
    parts = _concatenated_parts(source) if box is not None and len(list(source.uses)) == 1 else None
    if parts is None:
        return False
    value = op.operands[1]
    with ir.InsertionPoint(op), op.location:
        for part in parts:
            value = tensor.InsertSliceOp(part.value, value, [], [], [], [o + p for o, p in zip(box[0], part.offsets)],
                                         list(part.sizes), [1] * len(part.sizes)).result
    op.results[0].replace_all_uses_with(value)
    op.erase()
    while not list(source.uses):  # the concatenation's insertions, then its empty tensor
        dead = source.owner.operation
        source = dead.operands[1] if dead.name == "tensor.insert_slice" else None
        dead.erase()
        if source is None:
            break
    return True


def _static_box(op: ir.Operation) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The offsets and sizes of a slice op with static offsets, sizes and unit strides, or None
    (an insertion also of the rank of its destination)."""
    if len(op.operands) != (1 if op.name == "tensor.extract_slice" else 2):
        return None
    offsets, sizes, strides = (tuple(ir.DenseI64ArrayAttr(op.attributes[a])) for a in _STATIC)
    if op.name == "tensor.insert_slice" and ir.RankedTensorType(op.operands[0].type).rank != len(sizes):
        return None
    return (offsets, sizes) if all(s == 1 for s in strides) else None


def _concatenated_parts(value: ir.Value) -> list[_Part] | None:
    """The parts of ``value`` when it is slices inserted, without overlapping, into an empty
    tensor, first inserted first; None otherwise."""
    parts: list[_Part] = []
    while not isinstance(value.owner, ir.Block) and value.owner.name == "tensor.insert_slice":
        box = _static_box(value.owner.operation)
        if box is None:
            return None
        parts.append(_Part(value.owner.operands[0], *box))
        value = value.owner.operands[1]
    if isinstance(value.owner, ir.Block) or value.owner.name != "tensor.empty" or not parts:
        return None
    if any(_overlap(a.offsets, a.sizes, b.offsets, b.sizes) is not None
           for i, a in enumerate(parts) for b in parts[i + 1:]):
        return None
    return parts[::-1]


def _overlap(offsets: tuple[int, ...], sizes: tuple[int, ...], other_offsets: tuple[int, ...],
             other_sizes: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The box common to two boxes (offsets and sizes), or None when they are disjoint."""
    low = tuple(max(a, b) for a, b in zip(offsets, other_offsets))
    high = tuple(min(a + n, b + m) for a, n, b, m in zip(offsets, sizes, other_offsets, other_sizes))
    return None if any(h <= l for l, h in zip(low, high)) else (low, tuple(h - l for l, h in zip(low, high)))


def _read_from_parts(op: ir.Operation, parts: list[_Part]) -> list[ir.Operation] | None:
    """Replace the slice ``op`` of the concatenation of ``parts`` by a slice of the part
    holding it, or by the concatenation of the parts' slices where that leaves the
    concatenation one reader; the new slice ops, or None when ``op`` was left alone."""
    offsets, sizes = _static_box(op)
    pieces = [(part, box) for part in parts
              if (box := _overlap(offsets, sizes, part.offsets, part.sizes)) is not None]
    if not pieces:
        return None  # an undefined region: nothing to read from
    result_type = ir.RankedTensorType(op.results[0].type)
    single = len(pieces) == 1 and pieces[0][1][1] == sizes
    if not single and (list(result_type.shape) != list(sizes) or not _spanning_pays(op.operands[0])):
        return None  # a rank-reducing slice across parts is left as it is
    new_slices = []
    with ir.InsertionPoint(op), op.location:
        if single:
            replacement = _slice_of(pieces[0][0], *pieces[0][1], result_type.shape, new_slices)
        else:
            replacement = tensor.EmptyOp(list(sizes), result_type.element_type).result
            for part, (box_offsets, box_sizes) in pieces:
                piece = _slice_of(part, box_offsets, box_sizes, list(box_sizes), new_slices)
                replacement = tensor.InsertSliceOp(
                    piece, replacement, [], [], [], [o - s for o, s in zip(box_offsets, offsets)],
                    list(box_sizes), [1] * len(box_sizes)).result
    op.results[0].replace_all_uses_with(replacement)
    op.erase()
    return new_slices


def _slice_of(part: _Part, offsets: tuple[int, ...], sizes: tuple[int, ...], shape: list[int],
              new_slices: list[ir.Operation]) -> ir.Value:
    """The ``sizes`` box of the concatenation at ``offsets``, read from ``part`` (the part
    itself when it is the whole box), of ``shape``."""
    if sizes == part.sizes and list(shape) == list(part.sizes):
        return part.value
    element = ir.RankedTensorType(part.value.type).element_type
    new = tensor.ExtractSliceOp(ir.RankedTensorType.get(shape, element), part.value, [], [], [],
                                [o - p for o, p in zip(offsets, part.offsets)], list(sizes), [1] * len(sizes))
    new_slices.append(new.operation)
    return new.result


def _spanning_pays(concatenation: ir.Value) -> bool:
    """Whether ``concatenation`` has, besides slices, exactly one reader and that reader
    inserts it into another tensor: rewriting its slices leaves it to be built in place."""
    users = [use.owner for use in concatenation.uses]
    others = [user for user in users if user.name != "tensor.extract_slice"]
    return len(others) == 1 and others[0].name == "tensor.insert_slice" \
        and others[0].operands[0] == concatenation


Box = tuple[tuple[int, ...], tuple[int, ...]]  # offsets and sizes over an op's loops


def _compute_by_parts(module: ir.Module) -> bool:
    """Replace each elementwise op reading concatenations that cover it all, and only it
    reads, by the concatenation of the op on each box of their parts' common refinement
    (each box within one part of every one of them). The ops of a chain (elementwise ops
    each read only by the next, over the same loops) split alike, by the refinement of all
    their concatenations: each piece then reads its producer's piece whole, where a
    producer split by its own concatenations alone (a stencil's ``jnp.roll`` along rows,
    then one along columns) would be sliced across its pieces and copied whole. Whether any
    op was."""
    ops = walk(module.operation)
    boxes_of: dict[ir.Operation, list[Box]] = {}
    for op in reversed(ops):  # each chain from its last op
        if op in boxes_of or _loops(op) is None:
            continue
        chain = _chain(op)
        boxes = _refinement(chain)
        if boxes is None:  # too many pieces together: each op by its first concatenation's parts
            for member in chain:
                boxes_of[member] = _refinement([member], first_only=True)
        else:
            boxes_of.update((member, boxes) for member in chain)
    # Producers first: a consumer's piece then reads its producer's whole. (Planned before any
    # rewrite: the ops' hashes do not survive it.)
    plan = [(op, boxes_of[op]) for op in ops if len(boxes_of.get(op) or ()) > 1]
    for op, boxes in plan:
        _split_by_parts(op, indexing_maps(op), boxes)
    return bool(plan)


def _loops(op: ir.Operation) -> list[int] | None:
    """The loop extents of ``op`` where it is an elementwise generic whose operands are
    indexed by loops or constants and whose result by the loops in order; else None."""
    if not is_elementwise_generic(op):
        return None
    maps = indexing_maps(op)
    if not (all(isinstance(e, (ir.AffineDimExpr, ir.AffineConstantExpr)) for m in maps for e in m.results)
            and maps[-1] == ir.AffineMap.get_identity(maps[-1].n_dims)):
        return None
    return list(ir.RankedTensorType(op.results[0].type).shape)


def _chain(last: ir.Operation) -> list[ir.Operation]:
    """``last`` and, recursively, each elementwise producer over the same loops that it alone
    reads, through the loops in order."""
    chain, pending = [last], [last]
    while pending:
        op = pending.pop()
        maps = indexing_maps(op)
        for value, m in zip(list(op.operands)[:-1], maps):
            producer = value.owner
            if (m == maps[-1] and isinstance(producer, ir.OpView) and producer.operation not in chain
                    and _loops(producer.operation) == _loops(last)
                    and all(use.owner == op for use in value.uses)):
                chain.append(producer.operation)
                pending.append(producer.operation)
    return chain


def _refinement(chain: list[ir.Operation], first_only: bool = False) -> list[Box] | None:
    """The common refinement of the parts of every concatenation an op of ``chain`` reads
    through the loops in order, that covers the loops and that ops of ``chain`` alone read
    (one box, the whole, where there is none); None beyond ``_MAX_PIECES`` boxes.
    ``first_only``: the parts of the first such concatenation, however many."""
    shape = _loops(chain[0])
    boxes: list[Box] = [((0,) * len(shape), tuple(shape))]
    for op in chain:
        maps = indexing_maps(op)
        for value, m in zip(list(op.operands)[:-1], maps):
            parts = _concatenated_parts(value) if m == maps[-1] else None
            if (parts is None or not all(use.owner in chain for use in value.uses)
                    or sum(math.prod(p.sizes) for p in parts) != math.prod(shape)):
                continue
            if first_only:
                return [(p.offsets, p.sizes) for p in parts]
            boxes = [box for a in boxes for b in parts if (box := _overlap(*a, b.offsets, b.sizes)) is not None]
            if len(boxes) > _MAX_PIECES:
                return None
    return boxes


def _split_by_parts(op: ir.Operation, maps: list[ir.AffineMap], boxes: list[Box]) -> None:
    """``op`` as the concatenation of ``op`` on each of ``boxes`` (offsets and sizes over its
    loops): each operand sliced along the loops indexing it (whole along a constant index)."""
    result_type = ir.RankedTensorType(op.results[0].type)
    with ir.InsertionPoint(op), op.location:
        result = tensor.EmptyOp(list(result_type.shape), result_type.element_type).result
        # A body that reads no element of the init (elementwise ops: the init is the result's
        # shape only, often the concatenation itself) writes each piece into an empty tensor.
        reads_init = bool(list(op.regions[0].blocks[0].arguments[len(op.operands) - 1].uses))
        for box_offsets, box_sizes in boxes:
            sliced = []
            for value, m in zip(op.operands if reads_init else list(op.operands)[:-1], maps):
                offsets, sizes = _box_of(m, box_offsets, box_sizes, ir.RankedTensorType(value.type).shape)
                element = ir.RankedTensorType(value.type).element_type
                sliced.append(tensor.ExtractSliceOp(ir.RankedTensorType.get(sizes, element), value, [], [], [],
                                                    offsets, sizes, [1] * len(sizes)).result)
            if not reads_init:
                sliced.append(tensor.EmptyOp(list(box_sizes), result_type.element_type).result)
            piece = linalg.GenericOp([sliced[-1].type], sliced[:-1], [sliced[-1]], op.attributes["indexing_maps"],
                                     op.attributes["iterator_types"])
            body = op.clone()  # its body moves into the piece
            move_body(body, piece.operation)
            body.erase()
            result = tensor.InsertSliceOp(piece.result, result, [], [], [], list(box_offsets), list(box_sizes),
                                          [1] * len(box_sizes)).result
    op.results[0].replace_all_uses_with(result)
    op.erase()


def _box_of(m: ir.AffineMap, box_offsets: tuple[int, ...], box_sizes: tuple[int, ...],
            shape: list[int]) -> tuple[list[int], list[int]]:
    """The offsets and sizes of the operand of ``shape`` indexed by ``m`` that the loops over
    a box read (loop d over the box's dim d); a dim at a constant index whole, the sliced op
    reading it at that index still."""
    offsets, sizes = [], []
    for e, size in zip(m.results, shape):
        if isinstance(e, ir.AffineDimExpr):
            offsets.append(box_offsets[e.position])
            sizes.append(box_sizes[e.position])
        else:
            offsets.append(0)
            sizes.append(size)
    return offsets, sizes
