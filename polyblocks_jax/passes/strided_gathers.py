"""Gathers from strided memory, rewritten to gather from a contiguous view.

convert-vector-to-llvm lowers a ``vector.gather`` only from memory whose innermost stride
is 1 (the lanes' addresses are the base pointer plus the indices); a gather whose source
bufferization placed in a strided view (a column of a larger buffer: the sort closing
JAX's QDWH eigensolver reads one) stayed unconverted, and LLVM's translation failed.
Upstream's gather lowering patterns give up on such a source too. So the gather reads the
view's whole span as one contiguous 1-D memref instead, its indices scaled by the stride
and offset by the base position's linear offset: the same elements, one hardware gather.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, memref, vector

from polyblocks_jax.options import Options
from polyblocks_jax.passes.transform import walk


def lower_strided_gathers(module: ir.Module, options: Options) -> None:
    """Give every gather from a view of non-unit innermost stride a contiguous source."""
    for op in walk(module.operation):
        if op.name == "vector.gather" and _static_strided(op.operands[0].type):
            _gather_contiguously(op)


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
    source_type = ir.MemRefType(source.type)
    rank = source_type.rank
    positions, indices, mask, passthru = op.operands[1:1 + rank], *op.operands[1 + rank:]
    strides, _ = source_type.get_strides_and_offset()
    index = ir.IndexType.get()
    with ir.InsertionPoint(op), op.location:
        metadata = memref.ExtractStridedMetadataOp(source)
        span = 1 + sum((size - 1) * stride for size, stride in zip(source_type.shape, strides))
        dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
        flat_type = ir.MemRefType.get([span], source_type.element_type,
                                      ir.StridedLayoutAttr.get(dynamic, [1]), source_type.memory_space)
        flat = memref.ReinterpretCastOp(flat_type, metadata.base_buffer, [metadata.offset], [], [],
                                        [dynamic], [span], [1]).result
        linear = arith.constant(index, 0)
        for position, stride in zip(positions, strides):
            linear = arith.addi(linear, arith.muli(position, arith.constant(index, stride)))
        index_type = ir.VectorType(indices.type)
        scaled = arith.muli(indices, arith.constant(index_type, ir.DenseElementsAttr.get_splat(
            index_type, ir.IntegerAttr.get(index, strides[-1]))))
        shifted = arith.addi(scaled, vector.broadcast(index_type, linear))
        gathered = vector.gather(op.results[0].type, flat, [arith.constant(index, 0)], shifted, mask, passthru)
    op.results[0].replace_all_uses_with(gathered)
    op.erase()
