"""An entry that takes its arguments packed: one pointer to an array of the bare entry's
pointer arguments. A caller in C (pjrt/native.c) then calls a program of any argument count
through one signature, where calling the bare entry needs a cast per argument count."""
from __future__ import annotations

from mlir import ir
from mlir.dialects import llvm

from polyblocks_jax.cpu.executable import PACKED_ENTRY


def add_packed_entry(module: ir.Module, entry: str = "main") -> None:
    """Define ``PACKED_ENTRY`` beside ``entry``, an ``llvm.func`` whose arguments are all
    pointers (the bare-pointer convention); nothing where it has other arguments."""
    function = next((op for op in module.body.operations
                     if op.operation.name == "llvm.func" and op.sym_name.value == entry), None)
    if function is None:
        return
    pointer = ir.Type.parse("!llvm.ptr")
    arguments = list(function.regions[0].blocks[0].arguments)
    if any(a.type != pointer for a in arguments):
        return
    with ir.InsertionPoint(module.body), function.location:
        packed = llvm.LLVMFuncOp(PACKED_ENTRY, ir.TypeAttr.get(ir.Type.parse("!llvm.func<void (ptr)>")))
        block = packed.body.blocks.append(pointer)
    no_flags = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 0)
    with ir.InsertionPoint(block), function.location:
        values = []
        for i in range(len(arguments)):
            slot = llvm.getelementptr(pointer, block.arguments[0], [], [i], pointer, no_flags)
            values.append(llvm.load(pointer, slot))
        llvm.CallOp(None, values, [], [], callee=ir.FlatSymbolRefAttr.get(entry))
        llvm.return_()
