"""Vector reads the host's lowerings take badly, rewritten before them (one walk for all).

Gathers from strided memory: convert-vector-to-llvm lowers a ``vector.gather`` only from
memory whose innermost stride is 1 (the lanes' addresses are the base pointer plus the
indices); a gather whose source bufferization placed in a strided view (a column of a
larger buffer: the sort closing JAX's QDWH eigensolver reads one) stayed unconverted, and
LLVM's translation failed. Upstream's gather lowering patterns give up on such a source
too. So the gather reads the view's whole span as one contiguous 1-D memref instead, its
indices scaled by the stride and offset by the base position's linear offset: the same
elements, one hardware gather.

Reads of one element: the vectorizer reads an operand that is invariant along the
vector's dims (a reflector's element times a matrix row, in a Householder step) as a
``vector.transfer_read`` whose permutation map broadcasts: ``(d0, d1) -> (d0, 0)`` from a
1x1 view. The transfer lowering (``convert-vector-to-scf``, then LLVM) takes only
minor-identity maps to vector loads and unrolls every other into one scalar load and
insert per lane: 64 of them per step of the QR's inner loop. A read whose every source
dim is read at one position is one element: loaded once, then broadcast. Upstream's
lower_transfer patterns do the same for minor-identity maps, but only as part of turning
every transfer up to a rank into plain loads and stores, which would change every other
kernel's lowering.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, memref, vector

from polyblocks_jax.options import Options
from polyblocks_jax.passes.transform import walk


def lower_vector_reads(module: ir.Module, options: Options) -> bool:
    """Give every gather from a view of non-unit innermost stride a contiguous source, and
    make every unmasked, in-bounds transfer_read of a single memref element a load; whether
    there was such a read."""
    changed = False
    for op in walk(module.operation):
        if op.name == "vector.gather" and _static_strided(op.operands[0].type):
            _gather_contiguously(op)
            changed = True
        elif op.name == "vector.transfer_read" and _reads_one_element(op.opview):
            _load_and_broadcast(op)
            changed = True
        elif op.name == "vector.transfer_read" and _reads_narrow_stride(op.opview):
            _load_span_and_shuffle(op)
            changed = True
    return changed


def _static_strided(source: ir.Type) -> bool:
    """A memref of static shape and strides whose innermost stride is not 1 (tensors:
    bufferization decides their layout later)."""
    if not isinstance(source, ir.MemRefType):
        return False
    memref_type = ir.MemRefType(source)
    strides, _ = memref_type.get_strides_and_offset()
    dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
    return bool(strides) and strides[-1] != 1 and memref_type.has_static_shape and dynamic not in strides


def _gather_contiguously(op: ir.Operation) -> None:
    source = op.operands[0]
    rank = ir.MemRefType(source.type).rank
    positions, indices, mask, passthru = op.operands[1:1 + rank], *op.operands[1 + rank:]
    stride = ir.MemRefType(source.type).get_strides_and_offset()[0][-1]
    index = ir.IndexType.get()
    with ir.InsertionPoint(op), op.location:
        flat, linear = flat_span(source, positions)
        index_type = ir.VectorType(indices.type)
        scaled = arith.muli(indices, arith.constant(index_type, ir.DenseElementsAttr.get_splat(
            index_type, ir.IntegerAttr.get(index, stride))))
        shifted = arith.addi(scaled, vector.broadcast(index_type, linear))
        gathered = vector.gather(op.results[0].type, flat, [arith.constant(index, 0)], shifted, mask, passthru)
    op.results[0].replace_all_uses_with(gathered)
    op.erase()


def flat_span(source: ir.Value, positions, extra: int = 0) -> tuple[ir.Value, ir.Value]:
    """The whole span of the strided memref ``source`` (and ``extra`` elements after it) as a
    contiguous 1-D memref, and the linear index in it of the element at ``positions``."""
    source_type = ir.MemRefType(source.type)
    strides, _ = source_type.get_strides_and_offset()
    index = ir.IndexType.get()
    metadata = memref.ExtractStridedMetadataOp(source)
    span = 1 + extra + sum((size - 1) * stride for size, stride in zip(source_type.shape, strides))
    dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
    flat_type = ir.MemRefType.get([span], source_type.element_type,
                                  ir.StridedLayoutAttr.get(dynamic, [1]), source_type.memory_space)
    flat = memref.ReinterpretCastOp(flat_type, metadata.base_buffer, [metadata.offset], [], [],
                                    [dynamic], [span], [1]).result
    linear = arith.constant(index, 0)
    for position, stride in zip(positions, strides):
        linear = arith.addi(linear, arith.muli(position, arith.constant(index, stride)))
    return flat, linear


# A strided read loads this many times its elements at most (the stride).
_MAX_READ_STRIDE = 8


def _reads_narrow_stride(read: vector.TransferReadOp) -> bool:
    """An in-bounds, unmasked 1-D read along the innermost dim of a static memref whose
    innermost stride is 2 to _MAX_READ_STRIDE (a column of narrow rows: boxes' x0)."""
    source = read.base.type
    if not _static_strided(source) or read.mask is not None or ir.VectorType(read.result.type).rank != 1:
        return False
    rank = ir.MemRefType(source).rank
    results = ir.AffineMapAttr(read.permutation_map).value.results
    stride = ir.MemRefType(source).get_strides_and_offset()[0][-1]
    return (all(ir.BoolAttr(b).value for b in read.in_bounds) and 2 <= stride <= _MAX_READ_STRIDE
            and len(results) == 1 and isinstance(results[0], ir.AffineDimExpr)
            and ir.AffineDimExpr(results[0]).position == rank - 1)


def _load_span_and_shuffle(op: ir.Operation) -> None:
    """The read's elements and those between them as one contiguous vector load, then its
    lanes at the stride picked out by a shuffle (the transfer lowering loads and inserts
    one lane at a time, as in (N, 4) boxes' (x1 - x0) * (y1 - y0))."""
    read = op.opview
    vtype = ir.VectorType(read.result.type)
    stride = ir.MemRefType(read.base.type).get_strides_and_offset()[0][-1]
    lanes = vtype.shape[0]
    with ir.InsertionPoint(op), op.location:
        flat, linear = flat_span(read.base, list(read.indices))
        span = vector.load(ir.VectorType.get([(lanes - 1) * stride + 1], vtype.element_type), flat, [linear])
        picked = vector.shuffle(span, span, [lane * stride for lane in range(lanes)])
    op.results[0].replace_all_uses_with(picked)
    op.erase()


def _reads_one_element(read: vector.TransferReadOp) -> bool:
    if not isinstance(read.base.type, ir.MemRefType) or read.mask is not None:
        return False
    if not all(ir.BoolAttr(b).value for b in read.in_bounds):
        return False
    shape = ir.VectorType(read.result.type).shape
    results = ir.AffineMapAttr(read.permutation_map).value.results
    # Each vector dim (a result of the map) reads a source dim at one position (size 1) or is
    # broadcast (the constant 0 of the map): no vector dim steps through the source.
    return any(isinstance(e, ir.AffineConstantExpr) for e in results) and all(
        isinstance(e, ir.AffineConstantExpr) or size == 1 for e, size in zip(results, shape))


def _load_and_broadcast(op: ir.Operation) -> None:
    read = op.opview
    with ir.InsertionPoint(op), op.location:
        element = memref.load(read.base, list(read.indices))
        broadcast = vector.broadcast(read.result.type, element)
    op.results[0].replace_all_uses_with(broadcast)
    op.erase()
