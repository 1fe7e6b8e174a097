"""Denormal floats flushed to zero while a program runs, as XLA's CPU runtime does.

XLA CPU runs its programs with the MXCSR's flush-to-zero and denormals-are-zero bits set: a
product of 1e-30 and 1e-10 is 0, an input of 1e-40 counts as 0. Beyond agreeing with it,
x86 takes a microcode assist (about a hundred cycles) for each instruction meeting a denormal:
the gradient of a softmax, whose probabilities underflow into denormals, ran 30 times slower
than XLA's. ``main`` sets both bits on entry and gives the caller its MXCSR back on return;
libomp hands the primary thread's MXCSR to its workers at every fork (KMP_INHERIT_FP_CONTROL,
on by default), so the kernels' threads flush too.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, func, llvm

from polyblocks_jax.options import Options

_FLUSH_TO_ZERO, _DENORMALS_ARE_ZERO = 1 << 15, 1 << 6


def flush_denormals(module: ir.Module, options: Options) -> None:
    """Wrap the body of ``main`` in the MXCSR setting that flushes denormals."""
    main = next((op for op in module.body.operations if isinstance(op, func.FuncOp)
                 and op.sym_name.value == "main" and not op.is_external), None)
    if main is None:
        return
    i32, ptr = ir.IntegerType.get_signless(32), llvm.PointerType.get()
    entry = main.body.blocks[0]
    with ir.InsertionPoint.at_block_begin(entry), main.location:
        one = arith.constant(i32, 1)
        saved, flushing = llvm.alloca(ptr, one, i32), llvm.alloca(ptr, one, i32)
        _mxcsr("stmxcsr", saved)
        bits = arith.ori(llvm.load(i32, saved), arith.constant(i32, _FLUSH_TO_ZERO | _DENORMALS_ARE_ZERO))
        llvm.store(bits, flushing)
        _mxcsr("ldmxcsr", flushing)
    returns = [op for block in main.body.blocks for op in block.operations if isinstance(op, func.ReturnOp)]
    for ret in returns:
        with ir.InsertionPoint(ret), ret.location:
            _mxcsr("ldmxcsr", saved)


def _mxcsr(instruction: str, address: ir.Value) -> None:
    llvm.call_intrinsic(None, f"llvm.x86.sse.{instruction}", [address], [], [])
