"""Copies between views, and fills, as loops of vectors: the host's copies.

After bufferization (passes/copies.py makes strided copies linalg.copy), the copies into and
out of views, and fills of other values than zero, run on the host's vectors.
"""
from __future__ import annotations

import contextlib
import math

from mlir import ir
from mlir.dialects import arith, memref, scf, ub, vector

from polyblocks_jax.cpu.vectorize import is_32_bit
from polyblocks_jax.passes.transform import identity_layout, walk
from polyblocks_jax.passes.zero_start import zero_constant


# A gap of up to 3 elements between those copied: each vector read spans at most 4 vectors.
_MAX_STRIDE = 4
# Smaller fills stay loops of scalar stores, which LLVM unrolls.
_MIN_FILL_VECTORS = 4


def vectorize_copies(module: ir.Module, lanes: int) -> bool:
    """Copies between views, and fills of anything but a constant +0, as loops of vectors of
    ``lanes`` elements along their rows. LLVM's loop vectorizer is off (see cpu/codegen.py):
    its loop idioms make a zero fill a memset and a contiguous copy a memcpy, but a copy into
    a padded buffer's interior would move one element at a time, and a max pooling's
    padding of -inf would be stored so.

    A copy from a view strided along its rows (``a[:, ::2]``, ``a[..., 1::2]``) reads each
    vector as one contiguous span of stride x lanes, masked at the row's end, and keeps every
    stride-th lane (``a[:, ::2, 1::2]``) rather than gathering lane by lane.
    Rows shorter than a vector (an image's 3 colour channels) are merged with the dims
    before them while both sides stay contiguous. Whether there was one."""
    planned = [(op, plan) for op in walk(module.operation) if (plan := _rows(op, lanes))]
    for op, (merged, stride) in planned:
        with ir.InsertionPoint(op), op.location:
            _by_rows(op, merged, stride, lanes)
        op.erase()
    return bool(planned)


def _rows(op: ir.Operation, lanes: int) -> tuple[int, int] | None:
    """For a copy or a fill that vectors take: how many trailing dims make a row, and the
    source's stride along it (1 for a fill)."""
    if op.name == "linalg.copy":
        types = [v.type for v in op.operands]
    elif op.name == "linalg.fill" and not zero_constant(op.operands[0]):  # (zeros: a memset)
        types = [op.operands[1].type]
    else:
        return None
    if not all(isinstance(t, ir.MemRefType) and ir.MemRefType(t).has_static_shape and ir.MemRefType(t).rank
               and is_32_bit(ir.MemRefType(t).element_type) for t in types):
        return None
    types = [ir.MemRefType(t) for t in types]
    strides = [t.get_strides_and_offset()[0] for t in types]
    target, shape = strides[-1], types[0].shape
    stride = strides[0][-1]
    if target[-1] != 1 or not 1 <= stride <= _MAX_STRIDE:
        return None
    merged = 1
    while stride == 1 and shape[-merged] < lanes and merged < len(shape) and all(
            s[-merged - 1] == s[-merged] * shape[-merged] for s in strides):
        merged += 1
    row = math.prod(shape[-merged:])
    if row < lanes or (op.name == "linalg.fill" and math.prod(shape) < _MIN_FILL_VECTORS * lanes):
        return None
    return merged, stride


def _by_rows(op: ir.Operation, merged: int, stride: int, lanes: int) -> None:
    """``op`` (a copy, or a fill) as an scf.forall over its rows of ``merged`` trailing dims,
    each a loop of vectors, the last one masked where they do not divide the row."""
    target = _merge_rows(op.operands[-1], merged)
    shape, element = ir.MemRefType(target.type).shape, ir.MemRefType(target.type).element_type
    rank, row, index = len(shape), shape[-1], ir.IndexType.get()
    source = _spans(op.operands[0], stride) if op.name == "linalg.copy" else None
    if source is not None and stride == 1:
        source = _merge_rows(source, merged)
    loop = scf.ForallOp([0] * (rank - 1), shape[:-1], [1] * (rank - 1), []) if rank > 1 else None
    with ir.InsertionPoint(loop.body) if loop else contextlib.nullcontext():
        ivs = list(loop.induction_variables) if loop else []
        chunks = scf.ForOp(arith.constant(index, 0), arith.constant(index, row), arith.constant(index, lanes))
        with ir.InsertionPoint(chunks.body):
            start = chunks.induction_variable
            minor = ir.AffineMapAttr.get(ir.AffineMap.get_minor_identity(rank, 1))
            if source is None:
                value = vector.broadcast(ir.VectorType.get([lanes], element), op.operands[0])
            else:
                value = vector.TransferReadOp(
                    ir.VectorType.get([lanes * stride], element), source,
                    [*ivs, arith.muli(start, arith.constant(index, stride))], minor,
                    ub.poison(element), [stride == 1 and row % lanes == 0]).result
                if stride > 1:
                    value = vector.shuffle(value, value, [i * stride for i in range(lanes)])
            vector.TransferWriteOp(None, value, target, [*ivs, start], minor, [row % lanes == 0])
            scf.YieldOp([])
        if loop:
            scf.InParallelOp()


def _spans(source: ir.Value, stride: int) -> ir.Value:
    """``source``, strided by ``stride`` along its rows, as the same rows contiguous along
    them: from the first element copied to the last."""
    if stride == 1:
        return source
    source_type = ir.MemRefType(source.type)
    rank, row = source_type.rank, source_type.shape[-1]
    dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
    metadata = memref.ExtractStridedMetadataOp(source)
    base, offset, strides = metadata.results[0], metadata.results[1], list(metadata.results)[2 + rank:]
    span = [*source_type.shape[:-1], (row - 1) * stride + 1]
    return memref.ReinterpretCastOp(
        ir.MemRefType.get(span, source_type.element_type,
                          ir.StridedLayoutAttr.get(dynamic, [dynamic] * (rank - 1) + [1])),
        base, [offset], [], strides[:-1], [dynamic], span, [dynamic] * (rank - 1) + [1]).result


def _merge_rows(view: ir.Value, merged: int) -> ir.Value:
    """``view`` with its ``merged`` trailing dims (contiguous) collapsed into one."""
    if merged == 1:
        return view
    type_ = ir.MemRefType(view.type)
    rank, shape = type_.rank, type_.shape
    strides, offset = type_.get_strides_and_offset()
    collapsed = [*shape[:rank - merged], math.prod(shape[rank - merged:])]
    layout = None if identity_layout(type_) else ir.StridedLayoutAttr.get(offset, [*strides[:rank - merged], 1])
    result = ir.MemRefType.get(collapsed, type_.element_type, layout)
    groups = [[d] for d in range(rank - merged)] + [list(range(rank - merged, rank))]
    return memref.collapse_shape(result, view, groups)
