"""The host's matrix-unit lowering: each packed contraction the shared matrix-unit stage
marked (``passes/matrix_forms.py``) becomes its unit's kernel, on buffers, before the
loops stage. An operand in a strided view (a scan's step of its sequence, xs[t]) is copied
into a contiguous buffer first, and an accumulator back after: the kernels read identity
layouts. A marked contraction this lowering cannot take (a unit without a kernel here, a
view of dynamic shape, AMX at opt_level 0) stays a linalg.contract and runs as loops: slower,
never wrong.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import memref

from polyblocks_jax.cpu import amx, avx2_pmaddwd, avx512_bf16, avx512_vnni
from polyblocks_jax.options import Options
from polyblocks_jax.passes import templates
from polyblocks_jax.passes.matrix_forms import MATRIX_UNIT_ATTR
from polyblocks_jax.passes.matrix_units import TileShape
from polyblocks_jax.passes.transform import identity_layout, walk

# (unit, whether the rhs is read as stored rows) -> kernel
KERNELS = {("amx", False): amx.kernel, ("amx", True): amx.rows_kernel, ("avx512bf16", False): avx512_bf16.kernel,
           ("avx512bf16", True): avx512_bf16.rows_kernel, ("avx512vnni", True): avx512_vnni.rows_kernel,
           ("avx2", True): avx2_pmaddwd.rows_kernel}


def lower_matrix_units(module: ir.Module, options: Options) -> bool:
    """Replace each marked contraction on identity-layout buffers with its unit's kernel;
    whether one was marked."""
    marked = [op for op in walk(module.operation) if MATRIX_UNIT_ATTR in op.attributes]
    for op in marked:
        attr = ir.DictAttr(op.attributes[MATRIX_UNIT_ATTR])
        unit = ir.StringAttr(attr["unit"]).value
        kernel = KERNELS.get((unit, ir.BoolAttr(attr["rhs_rows"]).value))
        types = [ir.MemRefType(v.type) for v in op.operands]
        if kernel is None or not all(t.has_static_shape for t in types):
            continue
        if unit == "amx" and options.opt_level == 0:
            continue  # LLVM 22 at -O0 (X86LowerAMXType) crashes on tiles carried around a loop
        zero_init = ir.BoolAttr(attr["zero_init"]).value
        if zero_init:
            _drop_fill(op)
        operands = _contiguous_operands(op, zero_init)
        text = kernel(*[ir.MemRefType(v.type) for v in operands], TileShape(*ir.DenseI64ArrayAttr(attr["tile"])),
                      ir.IntegerAttr(attr["pack"]).value, tuple(ir.DenseI64ArrayAttr(attr["blocking"])), zero_init)
        templates.splice(text, op, operands)
        op.erase()
    return bool(marked)


def _contiguous_operands(op: ir.Operation, zero_init: bool) -> list[ir.Value]:
    """``op``'s operands, each one in a strided view replaced by a contiguous copy (made
    before ``op``, freed after it; the accumulator's copied back, and copied in unless the
    kernel starts from zero)."""
    operands = list(op.operands)
    for i, value in enumerate(operands):
        type_ = ir.MemRefType(value.type)
        if identity_layout(type_):
            continue
        with ir.InsertionPoint(op), op.location:
            buffer = memref.alloc(ir.MemRefType.get(type_.shape, type_.element_type), [], [])
            if i < 2 or not zero_init:
                memref.copy(value, buffer)
        with ir.InsertionPoint.after(op), op.location:
            dealloc = memref.DeallocOp(buffer)
        if i == 2:  # the accumulator: its result goes back into the view
            with ir.InsertionPoint(dealloc), op.location:
                memref.copy(buffer, value)
        operands[i] = buffer
    return operands


def _drop_fill(op: ir.Operation) -> None:
    """Erase the fill of the accumulator just before ``op``: a kernel that starts from zero
    tiles writes every element of it (bf16 2048^3: a 16 MB memset a call)."""
    ops = list(op.block.operations)
    before = ops[ops.index(op) - 1].operation if ops.index(op) else None
    if before is not None and before.name == "linalg.fill" and before.operands[1] == op.operands[2]:
        before.erase()
