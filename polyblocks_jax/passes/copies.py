"""Strided memref.copy -> linalg.copy, so that copies into views become loops.

Bufferizing tensor.insert_slice (padding, dilation, concatenation, updates) emits
memref.copy into a subview. LLVM lowering turns a copy between non-contiguous
memrefs into a call to ``memrefCopy`` from MLIR's runner-utils library, which our
libraries do not link; upstream has no pass choosing linalg.copy after bufferization
(only the transform op's ``memcpy_op``), so this rewrite does it. Contiguous copies
are left alone: they lower to memcpy. A target with vectors may then run these copies on
them.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import linalg

from polyblocks_jax.options import Options
from polyblocks_jax.passes.transform import identity_layout, walk


def strided_copies_to_linalg(module: ir.Module, options: Options) -> None:
    copies = [op for op in walk(module.operation) if op.name == "memref.copy" and not all(
        isinstance(v.type, ir.MemRefType) and identity_layout(ir.MemRefType(v.type)) for v in op.operands)]
    for copy in copies:
        with ir.InsertionPoint(copy), copy.location:
            linalg.copy(copy.operands[0], outs=[copy.operands[1]])
        copy.erase()
