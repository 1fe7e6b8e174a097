"""The host's matrix-unit lowering: each packed contraction the shared matrix-unit stage
marked (``passes/matrix_forms.py``) becomes its unit's kernel, on buffers, before the
loops stage. A marked contraction this lowering cannot take (a unit without a kernel here,
a strided buffer, AMX at opt_level 0) stays a linalg.contract and runs as loops: slower,
never wrong.
"""
from __future__ import annotations

from mlir import ir

from polyblocks_jax.cpu import amx, avx512_bf16, avx512_vnni
from polyblocks_jax.options import Options
from polyblocks_jax.passes import templates
from polyblocks_jax.passes.matrix_forms import MATRIX_UNIT_ATTR
from polyblocks_jax.passes.matrix_units import TileShape
from polyblocks_jax.passes.transform import identity_layout, walk

# (unit, whether the rhs is read as stored rows) -> kernel
KERNELS = {("amx", False): amx.kernel, ("amx", True): amx.rows_kernel, ("avx512bf16", False): avx512_bf16.kernel,
           ("avx512bf16", True): avx512_bf16.rows_kernel, ("avx512vnni", True): avx512_vnni.rows_kernel}


def lower_matrix_units(module: ir.Module, options: Options) -> bool:
    """Replace each marked contraction on identity-layout buffers with its unit's kernel;
    whether one was marked."""
    marked = [op for op in walk(module.operation) if MATRIX_UNIT_ATTR in op.attributes]
    for op in marked:
        attr = ir.DictAttr(op.attributes[MATRIX_UNIT_ATTR])
        unit = ir.StringAttr(attr["unit"]).value
        kernel = KERNELS.get((unit, ir.BoolAttr(attr["rhs_rows"]).value))
        types = [ir.MemRefType(v.type) for v in op.operands]
        if kernel is None or not all(identity_layout(t) for t in types):
            continue
        if unit == "amx" and options.opt_level == 0:
            continue  # LLVM 22 at -O0 (X86LowerAMXType) crashes on tiles carried around a loop
        text = kernel(*types, TileShape(*ir.DenseI64ArrayAttr(attr["tile"])),
                             ir.IntegerAttr(attr["pack"]).value, tuple(ir.DenseI64ArrayAttr(attr["blocking"])),
                             ir.BoolAttr(attr["zero_init"]).value)
        if ir.BoolAttr(attr["zero_init"]).value:
            _drop_fill(op)
        templates.splice(text, op, list(op.operands))
        op.erase()
    return bool(marked)


def _drop_fill(op: ir.Operation) -> None:
    """Erase the fill of the accumulator just before ``op``: a kernel that starts from zero
    tiles writes every element of it (bf16 2048^3: a 16 MB memset a call)."""
    ops = list(op.block.operations)
    before = ops[ops.index(op) - 1].operation if ops.index(op) else None
    if before is not None and before.name == "linalg.fill" and before.operands[1] == op.operands[2]:
        before.erase()
