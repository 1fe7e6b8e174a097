"""Large constants reach the shared library as raw bytes, not as LLVM IR.

A program that closes over its weights (``jax.jit(lambda x: model.apply(params, x))``)
carries them as constants. Translated to LLVM IR, each element became a ConstantFP and a
line of text that opt and llc parsed again (ResNet-18's 45 MB: 62 s of compile time, 57 of
them there). Instead each constant global beyond ``INLINE_BYTES`` becomes an external
declaration, and an assembly file defines it with ``.incbin`` of its bytes, assembled
beside the code and linked into the same library (hidden: no other library sees it).
Small ones stay in the IR, where LLVM can fold their loads.
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np
from mlir import ir

INLINE_BYTES = 16 << 10
_ALIGNMENT = 64


@dataclasses.dataclass(frozen=True)
class Blob:
    symbol: str
    data: bytes
    alignment: int


def detach_large_constants(llvm_module: ir.Module) -> list[Blob]:
    """Turn every constant ``llvm.mlir.global`` of ``llvm_module`` holding more than
    ``INLINE_BYTES`` into an external declaration; returns their contents."""
    blobs = []
    for op in llvm_module.body.operations:
        op = op.operation
        if op.name != "llvm.mlir.global" or "constant" not in op.attributes or "value" not in op.attributes:
            continue
        data = _contents(op.attributes["value"])
        if data is None or len(data) <= INLINE_BYTES:
            continue
        alignment = ir.IntegerAttr(op.attributes["alignment"]).value if "alignment" in op.attributes else _ALIGNMENT
        blobs.append(Blob(ir.StringAttr(op.attributes["sym_name"]).value, data, max(alignment, 1)))
        del op.attributes["value"]
        with llvm_module.context:
            op.attributes["linkage"] = ir.Attribute.parse("#llvm.linkage<external>")
            op.attributes["dso_local"] = ir.UnitAttr.get()  # defined in this library: no GOT
    return blobs


def _contents(value: ir.Attribute) -> bytes | None:
    """The bytes of a dense elements attribute in memory order, or None where numpy has no
    type for its elements."""
    if not isinstance(value, ir.DenseElementsAttr):
        return None
    try:
        return np.ascontiguousarray(np.asarray(value)).tobytes()
    except (TypeError, ValueError, RuntimeError):
        return None


def assembly(blobs: list[Blob], directory: str) -> str:
    """Write each blob's bytes into ``directory`` and an assembly file defining the symbols;
    returns the assembly file's path."""
    lines = ['.section .rodata.polyblocks_constants,"a"']
    for i, blob in enumerate(blobs):
        path = os.path.join(directory, f"constant{i}.bin")
        with open(path, "wb") as f:
            f.write(blob.data)
        lines += [f".p2align {blob.alignment.bit_length() - 1}", f'.globl "{blob.symbol}"',
                  f'.hidden "{blob.symbol}"', f'"{blob.symbol}":', f'.incbin "{path}"']
    source = os.path.join(directory, "constants.s")
    with open(source, "w") as f:
        f.write("\n".join(lines) + "\n")
    return source
