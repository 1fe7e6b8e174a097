"""Buffers of i1 -> buffers of i8, after bufferization and loops.

The LLVM lowering of memref.load/store in this MLIR build asserts on element types
narrower than a byte (the process aborts), so every boolean buffer (a predicate read by
scf.while or scf.if, a boolean program result) must hold bytes. One byte per element
is also the layout numpy uses for bool, so the ABI is unchanged. Loads truncate to i1
and stores zero-extend; every other op on these buffers only moves or views them.
Vector transfers of i1 vectors (elementwise ops on masks, vectorized) read and write
vectors of bytes the same way. Run it on loops: linalg ops reading i1 buffers are not
rewritten.
"""
from __future__ import annotations

import numpy as np
from mlir import ir
from mlir.dialects import arith, memref, vector

from polyblocks_jax.options import Options
from polyblocks_jax.passes.transform import blocks


def widen_bool_buffers(module: ir.Module, options: Options) -> bool:
    """Widen every boolean buffer; whether there was one."""
    values: list[ir.Value] = []
    ops: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        ops.append(op)
        values.extend(r for r in op.results if _is_bool_buffer(r.type))
        for block in blocks(op):
            values.extend(a for a in block.arguments if _is_bool_buffer(a.type))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    for v in values:
        v.set_type(_widened(v.type))
    rewritten = [_rewrite(op) for op in ops]
    return bool(values) or any(rewritten)


def _rewrite(op: ir.Operation) -> bool:
    if op.name == "memref.load" and _is_i1(op.result.type):  # from a widened buffer
        with ir.InsertionPoint(op), op.location:
            wide = memref.LoadOp(op.operands[0], list(op.operands[1:])).result
            op.result.replace_all_uses_with(arith.trunci(ir.IntegerType.get_signless(1), wide))
        op.erase()
        return True
    if op.name == "memref.store" and _is_i1(op.operands[0].type):
        with ir.InsertionPoint(op), op.location:
            wide = arith.extui(ir.IntegerType.get_signless(8), op.operands[0])
            memref.StoreOp(wide, op.operands[1], list(op.operands[2:]))
        op.erase()
        return True
    if op.name == "vector.transfer_read" and _is_i1(ir.VectorType(op.result.type).element_type):
        read = op.opview
        mask = read.mask
        with ir.InsertionPoint(op), op.location:
            i8 = ir.IntegerType.get_signless(8)
            wide_type = ir.VectorType.get(ir.VectorType(op.result.type).shape, i8)
            wide = vector.TransferReadOp(wide_type, read.base, list(read.indices), read.permutation_map,
                                         arith.extui(i8, read.padding), read.in_bounds, mask=mask).result
            op.result.replace_all_uses_with(arith.trunci(op.result.type, wide))
        op.erase()
        return True
    if op.name == "vector.transfer_write" and _is_i1(ir.VectorType(op.operands[0].type).element_type):
        write = op.opview
        if op.results:  # a write into a tensor: no buffer here
            return False
        mask = write.mask
        with ir.InsertionPoint(op), op.location:
            i8 = ir.IntegerType.get_signless(8)
            wide = arith.extui(ir.VectorType.get(ir.VectorType(op.operands[0].type).shape, i8), write.valueToStore)
            vector.TransferWriteOp(None, wide, write.base, list(write.indices), write.permutation_map,
                                   write.in_bounds, mask=mask)
        op.erase()
        return True
    if op.name == "memref.global":
        return _widen_global(op)
    if op.name == "func.func":
        return _widen_signature(op)
    return False


def _widen_global(op: ir.Operation) -> bool:
    type_ = ir.TypeAttr(op.attributes["type"]).value
    if not _is_bool_buffer(type_):
        return False
    wide = _widened(type_)
    op.attributes["type"] = ir.TypeAttr.get(wide)
    if "initial_value" in op.attributes and isinstance(op.attributes["initial_value"], ir.DenseElementsAttr):
        dense = ir.DenseIntElementsAttr(op.attributes["initial_value"])
        shape = ir.MemRefType(wide).shape
        flat = np.array([int(dense[i]) & 1 for i in range(len(dense))], dtype=np.int8)
        tensor = ir.RankedTensorType.get(shape, ir.IntegerType.get_signless(8))
        if dense.is_splat:
            attr = ir.DenseElementsAttr.get_splat(tensor, ir.IntegerAttr.get(tensor.element_type, int(flat[0])))
        else:
            attr = ir.DenseElementsAttr.get(flat.reshape(shape), type=tensor)
        op.attributes["initial_value"] = attr
    return True


def _widen_signature(op: ir.Operation) -> bool:
    ftype = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
    types = [*ftype.inputs, *ftype.results]
    if not any(_is_bool_buffer(t) for t in types):
        return False
    widen = [_widened(t) if _is_bool_buffer(t) else t for t in types]
    n = len(ftype.inputs)
    op.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(widen[:n], widen[n:]))
    return True


def _is_i1(type_: ir.Type) -> bool:
    return isinstance(type_, ir.IntegerType) and ir.IntegerType(type_).width == 1


def _is_bool_buffer(type_: ir.Type) -> bool:
    return isinstance(type_, ir.MemRefType) and _is_i1(ir.MemRefType(type_).element_type)


def _widened(type_: ir.Type) -> ir.Type:
    t = ir.MemRefType(type_)
    return ir.MemRefType.get(t.shape, ir.IntegerType.get_signless(8), t.layout, t.memory_space)
