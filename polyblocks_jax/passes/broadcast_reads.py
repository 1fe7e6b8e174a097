"""Vector reads of one element, rewritten as a scalar load and a broadcast.

The vectorizer reads an operand that is invariant along the vector's dims (a reflector's
element times a matrix row, in a Householder step) as a ``vector.transfer_read`` whose
permutation map broadcasts: ``(d0, d1) -> (d0, 0)`` from a 1x1 view. The transfer
lowering (``convert-vector-to-scf``, then LLVM) takes only minor-identity maps to vector
loads and unrolls every other into one scalar load and insert per lane: 64 of them per
step of the QR's inner loop. A read whose every source dim is read at one position is
one element: loaded once, then broadcast. Upstream's lower_transfer patterns do the same
for minor-identity maps, but only as part of turning every transfer up to a rank into
plain loads and stores, which would change every other kernel's lowering.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import memref, vector

from polyblocks_jax.options import Options
from polyblocks_jax.passes.transform import walk


def broadcast_single_element_reads(module: ir.Module, options: Options) -> None:
    """Replace every unmasked, in-bounds transfer_read of a single memref element."""
    for op in walk(module.operation):
        if op.name == "vector.transfer_read" and _reads_one_element(op):
            _load_and_broadcast(op)


def _reads_one_element(op: ir.Operation) -> bool:
    read = op.opview
    if not isinstance(read.base.type, ir.MemRefType) or read.mask is not None:
        return False
    shape = ir.VectorType(read.result.type).shape
    results = ir.AffineMapAttr(read.permutation_map).value.results
    if not all(ir.BoolAttr(b).value for b in read.in_bounds):
        return False
    # Each source dim maps to a vector dim of size 1 (read at one position) or is
    # broadcast (the constant 0 of the map): no vector dim steps through the source.
    return any(isinstance(e, ir.AffineConstantExpr) for e in results) and all(
        isinstance(e, ir.AffineConstantExpr) or shape[ir.AffineDimExpr(e).position] == 1
        for e in results)


def _load_and_broadcast(op: ir.Operation) -> None:
    read = op.opview
    with ir.InsertionPoint(op), op.location:
        element = memref.load(read.base, list(read.indices))
        broadcast = vector.broadcast(read.result.type, element)
    op.results[0].replace_all_uses_with(broadcast)
    op.erase()
