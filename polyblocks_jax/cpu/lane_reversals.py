"""Operands read backwards along the vectors' dim (jnp.flip of the last axis), as reversed
vector loads.

The linalg vectorizer takes projected permutations only: an op with ``c - d`` in an
operand's innermost index stayed scalar loops (reversals.py moves only outer reversed
loops out of the maps). Here, before planning, such an operand becomes the result of a
reversal op of its own (marked ``polyblocks.lane_reversal``), which the op then reads in
order: the op is planned and vectorized like any other. After vectorization, every read
of the reversal's result (a 1-D vector along its innermost dim, through slices) becomes a
read of the reversed operand ending where the original one starts, its lanes reversed by
one shuffle; the reversal op, then unread, goes away. One read of another form (the op was
left scalar) keeps the reversal op: a copy, correct and no faster than before.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, tensor, vector

from polyblocks_jax.cpu.reversals import loop_of
from polyblocks_jax.passes.tiling import Hardware
from polyblocks_jax.passes.transform import indexing_maps, reversal, walk
from polyblocks_jax.tensor_ir.builders import parallel_generic

LANE_REVERSAL_ATTR = "polyblocks.lane_reversal"


def split_lane_reversals(module: ir.Module, hw: Hardware) -> None:
    """Give each operand a generic reads backwards along the result's innermost loop a
    reversal op of its own, read in order (where whole vectors divide that loop: a narrower
    one merges trailing dims, collapsed_dims.py, which no reversed read survives)."""
    for op in walk(module.operation):
        if op.name != "linalg.generic" or LANE_REVERSAL_ATTR in op.attributes:
            continue
        inner = _result_inner_loop(op)
        if inner is None:
            continue
        maps = indexing_maps(op)
        inputs = len(op.operands) - len(op.results)
        for i, (value, m) in enumerate(zip(list(op.operands)[:inputs], maps)):
            if _reads_lanes_backwards(value, m, inner, hw):
                _split(op, i, m)


def read_lane_reversals(module: ir.Module) -> None:
    """Replace the reads of every reversal op's result with reversed reads of its operand,
    where each read is a rewritable one (the slices and the reversal op, then unused, are
    left to the canonicalizer)."""
    for op in walk(module.operation):
        if op.name == "linalg.generic" and LANE_REVERSAL_ATTR in op.attributes:
            reads: list[tuple[ir.Operation, list[ir.Operation]]] = []
            if _collect_reads(op.results[0], [], reads):
                for read, slices in reads:
                    _reverse_read(op, read, slices)


def _result_inner_loop(op: ir.Operation) -> int | None:
    """The loop indexing the innermost dim of ``op``'s results (all of them), if parallel,
    on static tensors."""
    maps = indexing_maps(op)[len(op.operands) - len(op.results):]
    last = {m.results[len(m.results) - 1] if len(m.results) else None for m in maps}
    if len(last) != 1 or not isinstance(e := last.pop(), ir.AffineDimExpr):
        return None
    if "reduction" in str(ir.ArrayAttr(op.attributes["iterator_types"])[e.position]):
        return None
    if not all(isinstance(v.type, ir.RankedTensorType) and v.type.has_static_shape for v in op.operands):
        return None
    return e.position


def _reads_lanes_backwards(value: ir.Value, m: ir.AffineMap, inner: int, hw: Hardware) -> bool:
    """Whether ``value`` is read at ``c - inner`` along its innermost dim, every other index
    a loop, ``c - loop`` or a constant, and whole vectors fill that dim."""
    if not len(m.results) or (r := reversal(m.results[len(m.results) - 1])) is None or r[0] != inner:
        return False
    if not all(loop_of(e) is not None or isinstance(e, ir.AffineConstantExpr) for e in m.results):
        return False
    t = ir.RankedTensorType(value.type)
    # A reversal's constant is the dim's last index (jnp.flip): the reversal op covers the
    # whole operand, in bounds.
    if not all(reversal(e) is None or reversal(e)[1] == size - 1 for e, size in zip(m.results, t.shape)):
        return False
    bits = t.element_type.width if isinstance(t.element_type, (ir.IntegerType, ir.FloatType)) else 0
    extent = t.shape[-1]
    lanes = hw.lanes(bits // 8, extent) if bits >= 8 else 0
    return lanes > 0 and extent % lanes == 0


def _split(op: ir.Operation, operand: int, m: ir.AffineMap) -> None:
    """Operand ``operand`` of ``op`` as the result of a marked reversal op over its own
    dims, ``op`` reading that result with the reversals of ``m`` made plain."""
    value = op.operands[operand]
    t = ir.RankedTensorType(value.type)
    # The reversal's map: operand dim k read at dim k, reversed or at a constant as in ``m``.
    inner_map = ir.AffineMap.get(t.rank, 0, [
        e if isinstance(e, ir.AffineConstantExpr)
        else ir.AffineExpr.get_dim(k) if reversal(e) is None
        else ir.AffineConstantExpr.get(reversal(e)[1]) - ir.AffineExpr.get_dim(k)
        for k, e in enumerate(m.results)])
    shape = [1 if isinstance(e, ir.AffineConstantExpr) else size for e, size in zip(m.results, t.shape)]
    with ir.InsertionPoint(op), op.location:
        init = tensor.EmptyOp(shape, t.element_type).result
        result = parallel_generic([value], init, [inner_map], lambda x, _: x)
    result.owner.attributes[LANE_REVERSAL_ATTR] = ir.UnitAttr.get()
    plain = [ir.AffineConstantExpr.get(0) if isinstance(e, ir.AffineConstantExpr) else ir.AffineExpr.get_dim(loop_of(e))
             for e in m.results]
    maps = indexing_maps(op)
    maps[operand] = ir.AffineMap.get(m.n_dims, m.n_symbols, plain)
    op.attributes["indexing_maps"] = ir.ArrayAttr.get([ir.AffineMapAttr.get(x) for x in maps])
    op.operands[operand] = result


def _collect_reads(value: ir.Value, slices: list[ir.Operation],
                   reads: list[tuple[ir.Operation, list[ir.Operation]]]) -> bool:
    """Add to ``reads`` each read of ``value`` (through the chain of ``slices`` taken of the
    reversal's result), with the slices it reads through; whether every use is one: a slice
    of unit strides and the same rank, or an unmasked in-bounds read of a 1-D vector along
    the innermost dim."""
    for use in value.uses:
        user = use.owner.operation if isinstance(use.owner, ir.OpView) else use.owner
        if use.operand_number != 0:
            return False
        if user.name == "tensor.extract_slice":
            strides = list(ir.DenseI64ArrayAttr(user.attributes["static_strides"]))
            if any(s != 1 for s in strides) or ir.RankedTensorType(user.results[0].type).rank != len(strides):
                return False
            if not _collect_reads(user.results[0], [*slices, user], reads):
                return False
        elif user.name == "vector.transfer_read":
            rank = ir.RankedTensorType(value.type).rank
            if (ir.VectorType(user.results[0].type).rank != 1 or len(user.operands) != rank + 2
                    or list(ir.ArrayAttr(user.attributes["in_bounds"])) != [ir.BoolAttr.get(True)]
                    or ir.AffineMapAttr(user.attributes["permutation_map"]).value
                    != ir.AffineMap.get_minor_identity(rank, 1)):
                return False
            reads.append((user, slices))
        else:
            return False
    return True


def _reverse_read(reversal_op: ir.Operation, read: ir.Operation, slices: list[ir.Operation]) -> None:
    """``read`` (of the reversal's result through ``slices``) as a read of the reversal's
    operand where it ends at the read's first element, its lanes then reversed."""
    source = reversal_op.operands[0]
    (m,) = indexing_maps(reversal_op)[:1]
    lanes = ir.VectorType(read.results[0].type).shape[0]
    index = ir.IndexType.get()
    with ir.InsertionPoint(read), read.location:
        positions = list(read.operands[1:-1])
        for s in reversed(slices):
            positions = [arith.addi(p, o) for p, o in zip(positions, _offsets(s))]
        last = len(positions) - 1
        indices = []
        for k, (e, p) in enumerate(zip(m.results, positions)):
            if isinstance(e, ir.AffineConstantExpr):
                indices.append(arith.constant(index, e.value))
            elif (r := reversal(e)) is not None:
                end = r[1] - (lanes - 1 if k == last else 0)
                indices.append(arith.subi(arith.constant(index, end), p))
            else:
                indices.append(p)
        loaded = vector.TransferReadOp(read.results[0].type, source, indices,
                                       ir.AffineMapAttr.get(ir.AffineMap.get_minor_identity(len(indices), 1)),
                                       read.operands[-1], ir.ArrayAttr.get([ir.BoolAttr.get(True)])).result
        flipped = vector.ShuffleOp(loaded, loaded, list(range(lanes - 1, -1, -1))).result
    read.results[0].replace_all_uses_with(flipped)
    read.erase()


def _offsets(s: ir.Operation) -> list[ir.Value]:
    """The offsets of the slice ``s``, as index values."""
    dynamic = iter(s.operands[1:])
    index = ir.IndexType.get()
    return [next(dynamic) if o == ir.ShapedType.get_dynamic_stride_or_offset() else arith.constant(index, o)
            for o in ir.DenseI64ArrayAttr(s.attributes["static_offsets"])]

