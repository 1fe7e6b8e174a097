"""bf16 on a host without bf16 arithmetic: bit operations, and the one rounding routine.

x86 without AVX512-BF16 keeps bf16 as a storage type only: LLVM promotes any other
bf16 operation to f32 and rounds the result back with a call to ``__truncsfbf2``, a
compiler-rt routine that our libraries do not link. ``emulate_bf16_arithmetic`` turns
bf16 arithmetic into f32 arithmetic whose every result is rounded to bf16, as StableHLO's
types say (x * y + z rounds x * y), and arith-expand (in cpu/lowering.py) makes the
roundings integer ops, but two kinds of bf16 operation still reach LLVM:

- ops that do no arithmetic, which arith-emulate leaves alone (select), and sign ops
  that LLVM's instcombine narrows back to bf16 (``fneg (fpext x)`` -> ``fpext (fneg x)``).
  Both are exact on the bits, so ``bits_for_bf16_moves`` rewrites them as i16 operations;
- whatever else LLVM narrows. ``define_truncsfbf2`` defines the routine in the module
  itself (integer ops, round to nearest even as compiler-rt), so the library resolves
  it there instead of failing to load.

On a host with AVX-512 BF16, where bf16 vectors are legal types, llc's type legalizer
aborts on loads, stores, selects and element moves of a bf16 vector of 8k+1 lanes
(k >= 1: the remainder of a row of 25 after a vector of 16, which the vectorize stage
gives its own vector of 9): the lane it splits off becomes a promoted scalar it cannot put
back in a vector. ``bf16_vectors_as_bits`` moves every bf16 vector as i16 lanes.
"""
from __future__ import annotations

from typing import Callable

from mlir import ir
from mlir.dialects import arith, llvm

from polyblocks_jax.options import Options
from polyblocks_jax.contexts import pass_manager
from polyblocks_jax.passes.transform import walk

_SIGN, _MAGNITUDE = 0x8000, 0x7FFF


def emulate_bf16_arithmetic(module: ir.Module, options: Options) -> bool:
    """bf16 arith ops -> f32 ops between an extf and a truncf (arith-emulate-unsupported-floats),
    every rounding kept: the pass marks its conversions ``contract``, which lets
    extf(truncf(p)) fold to p, and a bf16 product then reaches an add or an fptosi
    unrounded. Whether there was a conversion."""
    pass_manager("builtin.module(func.func(arith-emulate-unsupported-floats{source-types=bf16 target-type=f32}))",
                 module.context).run(module.operation)
    conversions = [op for op in walk(module.operation) if op.name in ("arith.extf", "arith.truncf")
                   and "fastmath" in op.attributes and any(_is_bf16(t) for t in _value_types(op))]
    for op in conversions:
        del op.attributes["fastmath"]
    return bool(conversions)


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


# LLVM-dialect ops that only move the values of their bf16 operands and results (or make
# one of no value).
_MOVES = frozenset((
    "llvm.mlir.poison", "llvm.mlir.undef", "llvm.mlir.zero", "llvm.load", "llvm.store", "llvm.select",
    "llvm.shufflevector", "llvm.extractelement", "llvm.insertelement", "llvm.intr.masked.load",
    "llvm.intr.masked.store", "llvm.intr.masked.gather", "llvm.intr.masked.scatter",
    "llvm.intr.masked.expandload", "llvm.intr.masked.compressstore"))


def bf16_vectors_as_bits(module: ir.Module, options: Options) -> bool:
    """Every LLVM-dialect move of a bf16 vector (and of the bf16 scalars it exchanges with
    one) as the same move of i16 bits; whether there was one. The bits meet the bf16
    values the rest of the code uses through bitcasts, which cancel between two moves."""
    ops = [op for op in walk(module.operation) if op.name in _MOVES and _has_bf16_vector(op)]
    casts = []
    for op in ops:
        with ir.InsertionPoint(op), op.location:
            moved = ir.Operation.create(
                op.name, results=[_bits_type(r.type) for r in op.results],
                operands=[_as_bits(v, casts) for v in op.operands],
                attributes={name: op.attributes[name] for name in op.attributes})
            for old, new in zip(op.results, moved.results):
                if old.type != new.type:
                    new = llvm.bitcast(old.type, new)
                    casts.append(new.owner.operation)
                old.replace_all_uses_with(new)
        op.erase()
    for cast in reversed(casts):  # the casts of a move's result that the next move took back
        if not list(cast.result.uses):
            cast.erase()
    return bool(ops)


def _has_bf16_vector(op: ir.Operation) -> bool:
    """Whether a result or an operand of ``op`` is a bf16 vector. The results' types come in
    one call: this runs on every load and store of a model's LLVM dialect (ResNet-18: 4600)."""
    return any(_is_bf16_vector(t) for t in op.results.types) or any(_is_bf16_vector(v.type) for v in op.operands)


def _is_bf16_vector(type_: ir.Type) -> bool:
    return isinstance(type_, ir.VectorType) and isinstance(type_.element_type, ir.BF16Type)


def _value_types(op: ir.Operation) -> list[ir.Type]:
    return [v.type for v in (*op.operands, *op.results)]


def _bits_type(type_: ir.Type) -> ir.Type:
    return _same_shape(type_, ir.IntegerType.get_signless(16)) if _is_bf16(type_) else type_


def _as_bits(value: ir.Value, casts: list) -> ir.Value:
    """``value`` as i16 bits: the source of a cast from them, else a new cast."""
    if not _is_bf16(value.type):
        return value
    if isinstance(value, ir.OpResult):
        source = value.owner.operation
        if source.name == "llvm.bitcast" and source.operands[0].type == _bits_type(value.type):
            return source.operands[0]
    cast = llvm.bitcast(_bits_type(value.type), value)
    casts.append(cast.owner.operation)
    return cast


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
