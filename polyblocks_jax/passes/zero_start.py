"""Accumulators that start at zero: a tiled contraction's first k tile reads no zero fill.

A matmul's or convolution's result starts as a fill of zeros, which each register tile
loads before every k tile and stores after it. The fill is a pass over the whole result,
and the first k tile's loads read only its zeros (a 1x1 convolution of 64 channels into
256: 25 MB written, then read, for nothing). Here, after tiling, each accumulator read in
the first k tile yields zeros instead (an ``scf.if`` on the k-tile loop's first iteration,
or a constant where one k tile covers k), and a fill read by nothing else is dropped: the
first k tile writes every element of the result.

This rests on the shape of the nests the matmul tiling (``passes/tiling.py``) and the
convolution tiling (``cpu/vectorize.py``) make, whose loops they mark: within one k tile,
every element of the result is read once, by the register tile that then writes it, so a
read in the first k tile sees the value the nest started with.

A matmul split into parts over rows (or columns) of whole register tiles and the rest
(tiling.py) is a chain: each part's nest takes a slice of what the parts before it left,
and its result goes back over the same slice. A part whose slice is disjoint from those
written before reads zeros too; where the parts' slices cover the result, the fill goes
(ViT-Tiny at batch 1: 16 MB of zeros written per call, its 197 rows a split of whole
register tiles and a remainder). Parts nested in parts (rows and columns; a parallel
loop's halves, each split again) keep their fill. Within a nest, the block of rows peeled
after a loop over blocks reads the slice beside what the loop wrote: zeros too.

Some nests write every element of the accumulator they take, marked so: a matmul's of one
part, a convolution's (its tiles divide the result). Their results may be read by anything,
even another product (a 1-D convolution's next tap), and a slice of the fill taken only by
such nests, at any offset, needs none of the fill.
"""
from __future__ import annotations

import math

from mlir import ir
from mlir.dialects import arith, scf

from polyblocks_jax.passes.transform import constant_index, walk

NEST_ATTR = "polyblocks.nest"       # on a contraction's loops over tiles of its result
K_TILES_ATTR = "polyblocks.k_tiles"  # on a matmul's k-tile loop
# On the outer loop of a matmul not split into parts, and the loops of a convolution's nest:
# loops that write every element of the accumulator they take.
WHOLE_NEST_ATTR = "polyblocks.whole_nest"
# Ops that write into (a slice of) the accumulator, or yield it, without reading it.
_WRITES = ("tensor.insert_slice", "tensor.parallel_insert_slice", "vector.transfer_write", "scf.yield")
# How the next part of a split matmul, or a peeled last k tile, reads a nest's result.
_PART_READS = ("vector.transfer_read", "vector.transfer_write", "tensor.insert_slice")


def zero_filled(value: ir.Value) -> bool:
    """Whether ``value`` is a linalg.fill of a constant +0 (the usual dot accumulator)."""
    fill = value.owner
    return isinstance(fill, (ir.Operation, ir.OpView)) and fill.name == "linalg.fill" \
        and zero_constant(fill.operands[0])


def zero_constant(value: ir.Value) -> bool:
    """Whether ``value`` is a constant +0, all of its bits zero (what a memset writes)."""
    constant = value.owner
    if not isinstance(constant, (ir.Operation, ir.OpView)) or constant.name != "arith.constant":
        return False
    attr = constant.attributes["value"]
    if isinstance(attr, ir.FloatAttr):
        return attr.value == 0 and math.copysign(1.0, attr.value) > 0
    return ir.IntegerAttr(attr).value == 0


def start_accumulators_at_zero(root: ir.Operation) -> None:
    """Rewrite the accumulator reads of every tiled contraction started from a zero fill
    (the nests' loops and their k-tile loops marked), then drop the marks."""
    fills, marked = [], []
    for op in walk(root):
        if op.name == "linalg.fill" and zero_filled(op.results[0]):
            fills.append(op)
        elif _is_nest(op):
            marked.append(op)
    for fill in fills:
        if _start_nests(fill.results[0]):
            # The nest writes every element before anything reads it: no fill needed.
            fill.results[0].replace_all_uses_with(fill.operands[1])
            fill.erase()
    for op in marked:
        for name in (NEST_ATTR, K_TILES_ATTR, WHOLE_NEST_ATTR):
            if name in op.attributes:
                del op.attributes[name]


def _start_nests(fill: ir.Value) -> bool:
    """Zero-start the nests that take ``fill`` or a slice of it (the parts of a split
    matmul); whether nothing else reads it: whole nests', or chains of parts', which read
    none of it."""
    unread, parts = True, []
    for use in list(fill.uses):
        op, index = use.owner, use.operand_number
        if _is_nest(op):
            unread &= _start_nest(op, index) and (WHOLE_NEST_ATTR in op.attributes
                                                  or _read_whole(_loop_result(op.operation, index)))
        else:
            parts.append(use)
    return _parts_write(fill, parts, ()) and unread


def _parts_write(source: ir.Value, uses: list, written: tuple) -> bool:
    """Zero-start the parts that ``uses`` of ``source`` (the fill with the slices ``written``
    written) begin: slices of it for a part's nests, and those nests' results written back
    into it. Whether every use is one of those and every chain writes the rest before
    anything reads it."""
    whole, written_back, inserts = True, [], []
    for use in uses:
        op, index = use.owner, use.operand_number
        if op.name == "tensor.extract_slice" and index == 0:
            chained = _start_parts(op, source, written)
            whole &= chained is not None
            written_back += chained or []
        elif op.name == "tensor.insert_slice" and index == 1:
            inserts.append(op)  # a part's result written back, if one of the chains' own
        else:
            whole = False
    return whole and all(any(i == w for w in written_back) for i in inserts)


def _start_parts(extract: ir.OpView, source: ir.Value, written: tuple) -> list[ir.OpView] | None:
    """Zero-start the nests that take the slice ``extract`` of ``source`` where it is disjoint
    from the slices ``written`` (any slice of the fill itself). Returns their results'
    inserts back into ``source`` when each nest reads none of its slice and the parts after
    it write the rest before anything reads it; else None (the fill stays: parts of a split
    k start from the first one's result)."""
    region = _region(extract)
    if written and (region is None or any(_overlap(region, other) for other in written)):
        return None
    inserts: list[ir.OpView] | None = [] if region is not None else None
    whole_nests = not written  # nests of the fill's slice that write all of it, each
    for use in list(extract.results[0].uses):
        nest, index = use.owner, use.operand_number
        if not (_is_nest(nest) and _start_nest(nest, index)):
            inserts, whole_nests = None, False  # (the other nests still start at zero)
            continue
        whole_nests &= WHOLE_NEST_ATTR in nest.attributes
        uses = list(_loop_result(nest.operation, index).uses)
        insert = uses[0].owner if len(uses) == 1 else None
        if inserts is None or insert is None or insert.name != "tensor.insert_slice" \
                or uses[0].operand_number != 0 or insert.operands[1] != source or _region(insert) != region \
                or not _rest_written(insert.results[0], (*written, region)):
            inserts = None
        else:
            inserts.append(insert)
    # Nests that write all of their slice read none of the fill and leave none of it in their
    # results, whatever reads these next (a convolution's tiles fused with its epilogue, in a
    # parallel loop over a dynamic slice of the fill: UNet at batch 8, 97 MB of zeros a call)
    return [] if inserts is None and whole_nests else inserts


def _rest_written(value: ir.Value, written: tuple) -> bool:
    """Whether ``value`` (the fill with the disjoint slices ``written`` written) is read
    whole once they cover it, and before that only by the next parts of its chain."""
    if sum(math.prod(sizes) for _, sizes in written) == math.prod(ir.RankedTensorType(value.type).shape):
        return _read_whole(value)
    return _parts_write(value, list(value.uses), written)


def _region(slice_op: ir.OpView) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The (offsets, sizes) of a slice op with static offsets, sizes and unit strides."""
    offsets, sizes, strides = (list(ir.DenseI64ArrayAttr(slice_op.attributes[f"static_{name}"]))
                               for name in ("offsets", "sizes", "strides"))
    dynamic = ir.ShapedType.get_dynamic_size()
    if dynamic in offsets or dynamic in sizes or any(s != 1 for s in strides):
        return None
    return tuple(offsets), tuple(sizes)


def _overlap(a: tuple, b: tuple) -> bool:
    """Whether two regions (offsets, sizes) share an element."""
    return all(oa < ob + sb and ob < oa + sa for oa, sa, ob, sb in zip(*a, *b))


def _start_nest(nest: ir.OpView, operand: int) -> bool:
    """Zero-start the reads in ``nest`` of its init ``operand``; whether it has no other reads."""
    accumulator = _region_argument(nest.operation, operand)
    if accumulator is None:
        return False
    # (in a nest of one parallel tile, the k-tile loop is the outermost)
    return _zero_start(accumulator, nest if K_TILES_ATTR in nest.attributes else None)


def _read_whole(result: ir.Value) -> bool:
    """Whether no part of a matmul, nor the last k tile peeled off its loop, reads ``result``:
    its consumers read it whole, once all of it is written."""
    for use in result.uses:
        op = use.owner
        if _is_nest(op) or op.name in _PART_READS:
            return False
        if op.name == "tensor.extract_slice" and not _read_whole(op.results[0]):
            return False
    return True


def _is_nest(op: ir.OpView) -> bool:
    return NEST_ATTR in op.attributes or K_TILES_ATTR in op.attributes


def _zero_start(value: ir.Value, k_loop: ir.OpView | None, written: tuple = ()) -> bool:
    """Rewrite the reads of ``value``, the accumulator or a slice of it, in the first k tile
    (within ``k_loop``'s first iteration, or anywhere without one); whether nothing else
    reads it. Values are followed into the nest's loops (a tile's value in an iteration of a
    loop over m or n tiles: the earlier iterations wrote other tiles; any other loop, a
    reduction's not hoisted out, stops it), not through what writes them, but for the
    regions ``written`` (None where not static) over ``value`` since its start: a slice
    disjoint from them still holds the start (the block of rows peeled after a parallel
    tile's loop over blocks: ViT's 788 rows a core, 2 x 264 and 260), read as zeros too."""
    unread = True
    for use in list(value.uses):
        op, index = use.owner, use.operand_number
        if op.name == "tensor.extract_slice" and index == 0 and (not written or _disjoint(_region(op), written)):
            unread &= _zero_start(op.results[0], k_loop)
        elif op.name == "tensor.insert_slice" and index == 1:
            unread &= _zero_start(op.results[0], k_loop, (*written, _region(op)))
        elif written:  # any other read may see what was written
            unread &= _write(use, ())
        elif op.name == "vector.transfer_read" and index == 0 and not _masked(op):
            _read_zeros(op, k_loop)
        elif _is_nest(op) and (inner := _region_argument(op.operation, index)) is not None:
            if K_TILES_ATTR not in op.attributes:
                unread &= _zero_start(inner, k_loop) and _zero_start(
                    _loop_result(op.operation, index), k_loop, (_loop_region(op, inner),))
            elif k_loop is None:
                unread &= _zero_start(inner, k_loop=op)  # its results: all written
            else:
                unread = False
        else:
            unread &= _write(use, ())
    return unread


def _loop_region(loop: ir.OpView, accumulator: ir.Value) -> tuple | None:
    """The region (offsets, sizes) of ``accumulator`` that an scf.for over tiles writes: each
    iteration inserts a tile a step long at the induction variable in one dim and at the
    same place in the others (a loop over blocks of rows, before its peeled last block);
    None for any other loop."""
    if loop.name != "scf.for":
        return None
    bounds = [constant_index(v) for v in (loop.lowerBound, loop.upperBound, loop.step)]
    insert = loop.body.operations[len(loop.body.operations) - 1].operands[
        list(loop.inner_iter_args).index(accumulator)].owner
    # (one dynamic offset: operands source, dest and that offset)
    if None in bounds or not isinstance(insert, (ir.Operation, ir.OpView)) \
            or insert.name != "tensor.insert_slice" or list(insert.operands) != [
            insert.operands[0], accumulator, loop.induction_variable]:
        return None
    offsets, sizes, strides = (list(ir.DenseI64ArrayAttr(insert.attributes[f"static_{name}"]))
                               for name in ("offsets", "sizes", "strides"))
    dynamic = [d for d, o in enumerate(offsets) if o == ir.ShapedType.get_dynamic_size()]
    if len(dynamic) != 1 or sizes[dynamic[0]] != bounds[2] or any(s != 1 for s in strides):
        return None  # (the dynamic operand a size, or tiles not a step long)
    (lower, upper, _), dim = bounds, dynamic[0]
    offsets[dim], sizes[dim] = lower, upper - lower
    return tuple(offsets), tuple(sizes)


def _disjoint(region: tuple | None, others: tuple) -> bool:
    return region is not None and all(o is not None and not _overlap(region, o) for o in others)


def _masked(read: ir.OpView) -> bool:
    """Whether ``read`` has a mask (its masked lanes read the padding value, not zeros)."""
    return list(ir.DenseI32ArrayAttr(read.attributes["operandSegmentSizes"]))[-1] > 0


def _only_written(value: ir.Value, written: tuple = ()) -> bool:
    """Whether ``value`` (a tile written into the accumulator) is only written into and yielded."""
    return all(_write(use, written) for use in value.uses)


def _write(use: ir.OpOperand, written: tuple) -> bool:
    """Whether ``use`` writes its value into a tensor then only written into and yielded, or,
    once tiles are inserted, reads a slice beside the ``written`` regions: that holds the
    accumulator's start, which ``_zero_start`` zero-starts (or the fill stays)."""
    op, index = use.owner, use.operand_number
    if op.name == "tensor.extract_slice" and index == 0 and written and _disjoint(_region(op), written):
        return True
    inserted = (*written, _region(op)) if op.name == "tensor.insert_slice" else ()
    return op.name in _WRITES and all(_only_written(r, inserted) for r in op.results)


def _region_argument(loop: ir.Operation, operand: int) -> ir.Value | None:
    """The block argument of ``loop`` that its init operand ``operand`` starts, if any."""
    block = loop.regions[0].blocks[0]
    inits = len(loop.results)
    first = len(loop.operands) - inits
    if operand < first:
        return None
    return block.arguments[len(block.arguments) - inits + operand - first]


def _loop_result(loop: ir.Operation, operand: int) -> ir.Value:
    """The result of ``loop`` that its init operand ``operand`` becomes."""
    return loop.results[operand - (len(loop.operands) - len(loop.results))]


def _read_zeros(read: ir.OpView, k_loop: ir.OpView | None) -> None:
    """``read`` yields zeros in the first iteration of ``k_loop`` (always without one)."""
    vector = ir.VectorType(read.results[0].type)
    with ir.InsertionPoint(read), read.location:
        zeros = arith.constant(vector, ir.DenseElementsAttr.get_splat(vector, _zero(vector.element_type)))
        if k_loop is None:
            read.results[0].replace_all_uses_with(zeros)
            read.operation.erase()
            return
        loop = k_loop.operation.opview
        first = arith.cmpi(arith.CmpIPredicate.eq, loop.induction_variable, loop.lowerBound)
        branch = scf.IfOp(first, [vector], has_else=True)
    uses = list(read.results[0].uses)
    with ir.InsertionPoint(branch.then_block), read.location:
        scf.YieldOp([zeros])
    with ir.InsertionPoint(branch.else_block), read.location:
        taken = scf.YieldOp([read.results[0]])
    read.operation.move_before(taken)
    for use in uses:
        use.owner.operands[use.operand_number] = branch.results[0]


def _zero(element: ir.Type) -> ir.Attribute:
    if isinstance(element, ir.FloatType):
        return ir.FloatAttr.get(element, 0.0)
    return ir.IntegerAttr.get(element, 0)
