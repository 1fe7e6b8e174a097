"""Strided memref.copy -> linalg.copy, so that copies into views become loops.

Bufferizing tensor.insert_slice (padding, dilation, concatenation, updates) emits
memref.copy into a subview. LLVM lowering turns a copy between non-contiguous
memrefs into a call to ``memrefCopy`` from MLIR's runner-utils library, which our
libraries do not link; upstream has no pass choosing linalg.copy after bufferization
(only the transform op's ``memcpy_op``), so this rewrite does it. Contiguous copies
are left alone: they lower to memcpy. Where a target has vectors, the copies from views
strided along their rows read contiguous spans instead (``vectorize_strided_copies``).
"""
from __future__ import annotations

import contextlib

from mlir import ir
from mlir.dialects import arith, linalg, memref, scf, ub, vector

from polyblocks_jax.options import Options
from polyblocks_jax.passes.arena import identity_layout
from polyblocks_jax.passes.transform import walk
from polyblocks_jax.passes.vectorize import is_32_bit


def strided_copies_to_linalg(module: ir.Module, options: Options) -> None:
    copies = [op for op in walk(module.operation) if op.name == "memref.copy" and not all(
        isinstance(v.type, ir.MemRefType) and identity_layout(ir.MemRefType(v.type)) for v in op.operands)]
    for copy in copies:
        with ir.InsertionPoint(copy), copy.location:
            linalg.copy(copy.operands[0], outs=[copy.operands[1]])
        copy.erase()


# A gap of up to 3 elements between those copied: each vector read spans at most 4 vectors.
_MAX_STRIDE = 4


def vectorize_strided_copies(module: ir.Module, lanes: int) -> bool:
    """A copy from a view strided along its rows (``a[:, ::2]``, ``a[..., 1::2]``) reads
    each vector of ``lanes`` elements as one contiguous span of stride x lanes, masked at the
    row's end, and keeps every stride-th lane: LLVM's loop vectorizer is off (see
    cpu/codegen.py), so the copy's loops moved one element at a time (``a[:, ::2, 1::2]`` on
    64x128x256: 0.17 -> 0.06-0.08 ms; XLA 0.06). Whether there was one."""
    copies = [(op, stride) for op in walk(module.operation)
              if op.name == "linalg.copy" and (stride := _row_stride(op, lanes))]
    for copy, stride in copies:
        with ir.InsertionPoint(copy), copy.location:
            _copy_by_spans(copy, stride, lanes)
        copy.erase()
    return bool(copies)


def _row_stride(copy: ir.Operation, lanes: int) -> int | None:
    """The source's stride along its rows where the copy can read spans: static shapes of
    32-bit elements, rows of a vector or more, written contiguously."""
    source, target = (v.type for v in copy.operands)
    if not (isinstance(source, ir.MemRefType) and isinstance(target, ir.MemRefType)):
        return None
    source, target = ir.MemRefType(source), ir.MemRefType(target)
    if not (source.has_static_shape and source.rank and source.shape[-1] >= lanes):
        return None
    if not is_32_bit(source.element_type):
        return None
    stride = source.get_strides_and_offset()[0][-1]
    if not 2 <= stride <= _MAX_STRIDE or target.get_strides_and_offset()[0][-1] != 1:
        return None
    return stride


def _copy_by_spans(copy: ir.Operation, stride: int, lanes: int) -> None:
    source, target = copy.operands
    source_type = ir.MemRefType(source.type)
    rank, row = source_type.rank, source_type.shape[-1]
    index = ir.IndexType.get()
    dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
    # The same rows, contiguous along them: from the first element copied to the last.
    metadata = memref.ExtractStridedMetadataOp(source)
    base, offset, strides = metadata.results[0], metadata.results[1], list(metadata.results)[2 + rank:]
    span = [*source_type.shape[:-1], (row - 1) * stride + 1]
    rows = memref.ReinterpretCastOp(
        ir.MemRefType.get(span, source_type.element_type,
                          ir.StridedLayoutAttr.get(dynamic, [dynamic] * (rank - 1) + [1])),
        base, [offset], [], strides[:-1], [dynamic], span, [dynamic] * (rank - 1) + [1]).result
    outer = source_type.shape[:-1]
    loop = scf.ForallOp([0] * len(outer), outer, [1] * len(outer), []) if outer else None
    with ir.InsertionPoint(loop.body) if loop else contextlib.nullcontext():
        ivs = list(loop.induction_variables) if loop else []
        chunks = scf.ForOp(arith.constant(index, 0), arith.constant(index, row), arith.constant(index, lanes))
        with ir.InsertionPoint(chunks.body):
            start = chunks.induction_variable
            minor = ir.AffineMapAttr.get(ir.AffineMap.get_minor_identity(rank, 1))
            read = vector.TransferReadOp(
                ir.VectorType.get([lanes * stride], source_type.element_type), rows,
                [*ivs, arith.muli(start, arith.constant(index, stride))], minor,
                ub.poison(source_type.element_type), [False]).result
            kept = vector.shuffle(read, read, [i * stride for i in range(lanes)])
            vector.TransferWriteOp(None, kept, target, [*ivs, start], minor, [row % lanes == 0])
            scf.YieldOp([])
        if loop:
            scf.InParallelOp()
