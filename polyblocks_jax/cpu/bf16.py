"""bf16 on a host without bf16 arithmetic: bit operations, and the one rounding routine.

x86 without AVX512-BF16 keeps bf16 as a storage type only: LLVM promotes any other
bf16 operation to f32 and rounds the result back with a call to ``__truncsfbf2``, a
compiler-rt routine that our libraries do not link. arith-emulate-unsupported-floats
and arith-expand (in cpu/lowering.py) turn bf16 arithmetic into f32 arithmetic and
integer rounding, but two kinds of bf16 operation still reach LLVM:

- ops that do no arithmetic, which arith-emulate leaves alone (select), and sign ops
  that LLVM's instcombine narrows back to bf16 (``fneg (fpext x)`` -> ``fpext (fneg x)``).
  Both are exact on the bits, so ``bits_for_bf16_moves`` rewrites them as i16 operations;
- whatever else LLVM narrows. ``define_truncsfbf2`` defines the routine in the module
  itself (integer ops, round to nearest even as compiler-rt), so the library resolves
  it there instead of failing to load.
"""
from __future__ import annotations

from typing import Callable

from mlir import ir
from mlir.dialects import arith

from polyblocks_jax.options import Options
from polyblocks_jax.passes.transform import walk

_SIGN, _MAGNITUDE = 0x8000, 0x7FFF


def bits_for_bf16_moves(module: ir.Module, options: Options) -> bool:
    """arith.select, arith.negf and math.absf on bf16 (scalars or vectors) -> i16 ops;
    whether there was one."""
    ops = [op for op in walk(module.operation)
           if op.name in _ON_BITS and len(op.results) == 1 and _is_bf16(op.result.type)]
    for op in ops:
        with ir.InsertionPoint(op), op.location:
            bits_t = _same_shape(op.result.type, ir.IntegerType.get_signless(16))
            result = _ON_BITS[op.name](bits_t, list(op.operands))
            op.result.replace_all_uses_with(arith.bitcast(op.result.type, result))
        op.erase()
    return bool(ops)


def _select(bits_t: ir.Type, operands: list[ir.Value]) -> ir.Value:
    cond, on_true, on_false = operands
    return arith.select(cond, arith.bitcast(bits_t, on_true), arith.bitcast(bits_t, on_false))


def _with_mask(combine: Callable, mask: int) -> Callable[[ir.Type, list[ir.Value]], ir.Value]:
    def build(bits_t: ir.Type, operands: list[ir.Value]) -> ir.Value:
        elem = ir.IntegerType.get_signless(16)
        scalar = arith.constant(elem, ir.IntegerAttr.get(elem, mask))
        splat = (arith.constant(bits_t, ir.DenseElementsAttr.get_splat(bits_t, ir.IntegerAttr.get(elem, mask)))
                 if isinstance(bits_t, ir.VectorType) else scalar)
        return combine(arith.bitcast(bits_t, operands[0]), splat)
    return build


_ON_BITS = {"arith.select": _select,
            "arith.negf": _with_mask(arith.xori, _SIGN),
            "math.absf": _with_mask(arith.andi, _MAGNITUDE)}


def _is_bf16(type_: ir.Type) -> bool:
    """A bf16 scalar or vector (a select of bf16 buffers, a branch's, moves no bf16 value)."""
    elem = ir.VectorType(type_).element_type if isinstance(type_, ir.VectorType) else type_
    return isinstance(elem, ir.BF16Type)


def _same_shape(type_: ir.Type, elem: ir.Type) -> ir.Type:
    """A scalar or a vector like ``type_`` (these run on loops and vectors, not tensors)."""
    return ir.VectorType.get(ir.VectorType(type_).shape, elem) if isinstance(type_, ir.VectorType) else elem


# f32 -> bf16, round to nearest even; a NaN stays a NaN of the same sign, made quiet.
_TRUNCSFBF2 = """
llvm.func weak @__truncsfbf2(%x: f32) -> bf16 {
  %c16 = llvm.mlir.constant(16 : i32) : i32
  %one = llvm.mlir.constant(1 : i32) : i32
  %half = llvm.mlir.constant(32767 : i32) : i32
  %quiet = llvm.mlir.constant(64 : i32) : i32
  %bits = llvm.bitcast %x : f32 to i32
  %high = llvm.lshr %bits, %c16 : i32
  %odd = llvm.and %high, %one : i32
  %bias = llvm.add %odd, %half : i32
  %biased = llvm.add %bits, %bias : i32
  %rounded = llvm.lshr %biased, %c16 : i32
  %nan_bits = llvm.or %high, %quiet : i32
  %is_nan = llvm.fcmp "uno" %x, %x : f32
  %chosen = llvm.select %is_nan, %nan_bits, %rounded : i1, i32
  %short = llvm.trunc %chosen : i32 to i16
  %result = llvm.bitcast %short : i16 to bf16
  llvm.return %result : bf16
}
"""


def define_truncsfbf2(module: ir.Module, options: Options) -> None:
    """Add ``__truncsfbf2`` to an LLVM-dialect module that has none."""
    if "__truncsfbf2" not in ir.SymbolTable(module.operation):
        helper = ir.Module.parse(_TRUNCSFBF2, module.context)
        module.body.append(helper.body.operations[0])
