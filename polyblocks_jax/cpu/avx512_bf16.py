"""AVX-512 BF16: VDPBF16PS as a matrix unit of 1 x 16 x 2 tiles, and its kernel.

VDPBF16PS adds to each of 16 f32 lanes the dot product of one pair of bf16 from each
operand. With the rhs in VNNI pairs (a row of 16 columns x 2 k values is one 32 x bf16
vector) and a pair of lhs values broadcast to every lane, one instruction is a
(1 x 2) @ (2 x 16) product: the same packed form as AMX (``passes/matrix_forms.py``).
The upstream ``x86vector.avx512.dot`` op lowers to it with
``convert-vector-to-llvm{enable-x86vector}``.

``kernel``: an (mb rows x nb vectors) block of f32 accumulators lives in registers over
the whole k loop; each step loads nb rhs vectors and broadcasts mb lhs pairs.

``rows_kernel`` (the ``DPBF16_ROWS`` product) reads the rhs as stored, (K, N) rows: for few
lhs rows the packed copy of the rhs costs more than the products (4 x 1024 x 1024: a copy
of 2 MB read and written per call for 4 M multiply-adds). Two rows of k, 32 columns each,
interleave into VNNI pairs with VPUNPCKLWD / VPUNPCKHWD, which work within 128-bit lanes:
the low half holds columns 0-3, 8-11, 16-19, 24-27, the high half the others. Accumulators
keep that order over the k loop and are put back in column order once, when stored.

``round_computed_vectors``: VCVTNEPS2BF16 rounds 16 f32 lanes to bf16 (nearest even) in one
instruction, where the integer rounding of arith-expand takes seven and a narrowing; bf16
arithmetic rounds after each op (cpu/bf16.py's emulate_bf16_arithmetic). Only roundings whose
value leaves f32 (stored, returned): one widened again stays integer ops, which LLVM folds
with the widening into one mask (with the instruction, GELU took 1.45x as long). The
instruction flushes subnormals to zero: as XLA, which computes with subnormals flushed,
does for computed values; a value merely converted (an f32 input cast to bf16) keeps the
exact integer rounding.
"""
from __future__ import annotations

import math
import struct
from typing import Callable

from mlir import ir
from mlir.dialects import arith, vector

from polyblocks_jax.cpu import interleaving
from polyblocks_jax.options import Options
from polyblocks_jax.passes import templates
from polyblocks_jax.passes.transform import FLOAT_EXTREMA, float_constant, walk
from polyblocks_jax.passes.matrix_units import MatrixUnit, TileShape, UnitOp

DPBF16 = UnitOp("bf16", "bf16", "f32", TileShape(1, 16, 2), pack=2, macs_per_cycle=64)  # 2 a cycle
# Two interleaving shuffles per 32 columns and two rows of k share a port with one of the
# two VDPBF16PS a cycle: 3 cycles for 4 rows of products at most, 48 multiply-adds a cycle.
DPBF16_ROWS = UnitOp("bf16", "bf16", "f32", TileShape(1, 32, 2), pack=2, macs_per_cycle=48, rhs_rows=True,
                     registers=2)
VECTOR_REGISTERS = 32
_LANES = 16


def unit() -> MatrixUnit:
    return MatrixUnit("avx512bf16", (DPBF16, DPBF16_ROWS), VECTOR_REGISTERS)


def kernel(lhs: ir.MemRefType, rhs: ir.MemRefType, acc: ir.MemRefType, tile: TileShape, pack: int,
           blocking: tuple[int, int], zero_init: bool) -> str:
    """The template computing the packed contraction with VDPBF16PS (identity-layout buffers)."""
    *lead, pm, k2, _ = lhs.shape
    lanes = tile.n
    panels = rhs.shape[-4]
    pn = panels * lanes
    mb, nb = blocking
    r = len(lead)
    b_type = templates.shape_type("memref", [*lead, panels, k2, lanes * pack], "bf16")
    c_type = templates.shape_type("memref", [*lead, pm, pn], "f32")
    vec, pairs = f"vector<{lanes}xf32>", f"vector<{lanes * pack}xbf16>"
    lead_ix = [f"%b{d}" for d in range(r)]
    accs = [(i, j) for i in range(mb) for j in range(nb)]
    index = templates.IndexConstants()

    def at(*rest: str) -> str:
        return ", ".join([*lead_ix, *rest])

    body = [
        f"%b = memref.collapse_shape %rhs {[[d] for d in range(r)] + [[r], [r + 1], [r + 2, r + 3]]} : {rhs} into {b_type}",
        f"%c = memref.collapse_shape %acc {[[d] for d in range(r)] + [[r], [r + 1, r + 2]]} : {acc} into {c_type}",
        f"scf.parallel ({', '.join(lead_ix + ['%i', '%j'])}) = ({', '.join([index.const(0)] * (r + 2))}) "
        f"to ({', '.join(index.const(d) for d in [*lead, pm, pn])}) "
        f"step ({', '.join([index.const(1)] * r + [index.const(mb), index.const(nb * lanes)])}) {{",
        *[f"  %row{i} = arith.addi %i, {index.const(i)} : index" for i in range(mb)],
        *[f"  %col{j} = arith.addi %j, {index.const(j * lanes)} : index" for j in range(nb)],
        *[f"  %panel{j} = arith.divui %col{j}, {index.const(lanes)} : index" for j in range(nb)],
    ]
    if zero_init:
        body.append(f"  %zero = arith.constant dense<0.0> : {vec}")
        inits = ["%zero"] * len(accs)
    else:
        body += [f"  %init{i}_{j} = vector.load %c[{at(f'%row{i}', f'%col{j}')}] : {c_type}, {vec}" for i, j in accs]
        inits = [f"%init{i}_{j}" for i, j in accs]
    carried = ", ".join(f"%c{i}_{j} = {init}" for (i, j), init in zip(accs, inits))
    body += [
        f"  %sums:{len(accs)} = scf.for %k2 = {index.const(0)} to {index.const(k2)} step {index.const(1)} "
        f"iter_args({carried}) -> ({', '.join([vec] * len(accs))}) {{",
        *[f"    %vb{j} = vector.load %b[{at(f'%panel{j}', '%k2', index.const(0))}] : {b_type}, {pairs}"
          for j in range(nb)],
    ]
    body += interleaving.broadcast_pairs(lhs, mb, at, index, "bf16", _LANES)
    body += [
        *[f"    %d{i}_{j} = x86vector.avx512.dot %c{i}_{j}, %va{i}, %vb{j} : {pairs} -> {vec}" for i, j in accs],
        f"    scf.yield {', '.join(f'%d{i}_{j}' for i, j in accs)} : {', '.join([vec] * len(accs))}",
        "  }",
        *[f"  vector.store %sums#{n}, %c[{at(f'%row{i}', f'%col{j}')}] : {c_type}, {vec}"
          for n, (i, j) in enumerate(accs)],
        "  scf.reduce",
        "}",
        "return",
    ]
    return templates.function([f"%lhs: {lhs}", f"%rhs: {rhs}", f"%acc: {acc}"], [], index.lines + body)


def rows_kernel(lhs: ir.MemRefType, rhs: ir.MemRefType, acc: ir.MemRefType, tile: TileShape, pack: int,
                blocking: tuple[int, int], zero_init: bool) -> str:
    """The template computing the contraction on the rhs as stored, lhs (.., M', K'/2, 2) @
    rhs (.., K'/2, 2, N') into (.., M', N'), with VDPBF16PS (identity-layout buffers)."""
    return interleaving.pair_rows_kernel(lhs, rhs, acc, tile, blocking, zero_init, _ROWS_PRODUCT)


def _dot(out: str, acc: str, a: str, b: str) -> list[str]:
    pairs = f"vector<{2 * _LANES}xbf16>"
    return [f"    {out} = x86vector.avx512.dot {acc}, {a}, {b} : {pairs} -> vector<{_LANES}xf32>"]


_ROWS_PRODUCT = interleaving.PairProduct(_LANES, "f32", "bf16", "bf16", _dot)


_SIGN_OPS = frozenset({"math.absf", "math.copysign"})  # exact: a loaded subnormal stays one
_COMPUTING = frozenset({"arith.addf", "arith.subf", "arith.mulf", "arith.divf", "arith.remf", "vector.fma",
                        "x86vector.avx512.mask.scalef"})
_CONVERT = "x86vector.avx512.cvt.packed.f32_to_bf16"


def round_computed_vectors(module: ir.Module, options: Options) -> bool:
    """bf16 vector arithmetic as f32 arithmetic; each f32 -> bf16 rounding of a value an
    arith or math op computed, not widened again -> VCVTNEPS2BF16 on 16-lane parts (8 for
    narrower vectors); of an extremum of bf16 values (exact) -> its high half. Whether
    there was one. After cpu/bf16.py's emulate_bf16_arithmetic, which made the f32 ops."""
    ops = walk(module.operation)
    products = _invariant_divisions_as_products(ops)
    # No division rewritten: the ops walked are still the module's (no second walk).
    rewrites = [(op, kind) for op in (walk(module.operation) if products else ops) if op.name == "arith.truncf"
                for kind in [_rounding(op)] if kind is not None]
    for op, kind in rewrites:
        with ir.InsertionPoint(op), op.location:
            op.results[0].replace_all_uses_with(kind(op.operands[0], ir.VectorType(op.results[0].type)))
        op.erase()
    return products or bool(rewrites)


def _invariant_divisions_as_products(ops: list[ir.Operation]) -> bool:
    """A bf16 division by a value computed outside its loop (a softmax's row sum) becomes a
    product with that value's reciprocal, computed there: VDIVPS takes five times a multiply's
    cycles. The f32 product's error (at most 1.5 ulp of f32) vanishes in the rounding to bf16,
    but where the quotient lies within it of a midpoint between two bf16 values (1 in 2^15
    or so): then it may round the other way, one bf16 ulp. ``ops``: the module's, walked.
    Whether there was one."""
    rewritten = False
    for op in ops:
        if op.name != "arith.divf" or not _only_rounded_to_bf16(op.results[0]):
            continue
        divisor = op.operands[1]
        if not _owner_name(divisor) or divisor.owner.operation.block == op.block:
            continue  # a block argument (a loop's), or computed in the division's block
        with ir.InsertionPoint.after(divisor.owner.operation), op.location:
            one = arith.constant(divisor.type, ir.DenseElementsAttr.get_splat(
                divisor.type, ir.FloatAttr.get(ir.VectorType(divisor.type).element_type, 1.0)))
            reciprocal = arith.divf(one, divisor)
        with ir.InsertionPoint(op), op.location:
            op.results[0].replace_all_uses_with(arith.mulf(op.operands[0], reciprocal))
        op.erase()
        rewritten = True
    return rewritten


def _only_rounded_to_bf16(value: ir.Value) -> bool:
    """An f32 vector whose every use rounds it to bf16."""
    uses = list(value.uses)
    return isinstance(value.type, ir.VectorType) and bool(uses) and all(
        use.owner.name == "arith.truncf" and isinstance(ir.VectorType(use.owner.results[0].type).element_type,
                                                         ir.BF16Type) for use in uses)


def _rounding(op: ir.Operation) -> Callable[[ir.Value, ir.VectorType], ir.Value] | None:
    """How ``op`` (an arith.truncf) is rewritten: ``_converted``, ``_high_half`` or None."""
    source, result = op.operands[0].type, op.results[0].type
    if not (isinstance(source, ir.VectorType) and isinstance(source.element_type, ir.F32Type)
            and isinstance(ir.VectorType(result).element_type, ir.BF16Type)):
        return None
    if _is_bf16_extremum(op.operands[0]):
        return _high_half
    widened = any(use.owner.name == "arith.extf" for use in op.results[0].uses)
    return _converted if (math.prod(source.shape) % 8 == 0 and not widened
                          and _is_computed(op.operands[0])) else None


def _owner_name(value: ir.Value) -> str:
    """The name of the op defining ``value``; "" for a block argument."""
    owner = value.owner
    return owner.operation.name if isinstance(owner, (ir.Operation, ir.OpView)) else ""


def _is_computed(value: ir.Value) -> bool:
    """Computed by arithmetic (a select between such values and constants included, and a
    vector assembled from computed parts: exp's 16-lane VSCALEFPS results)."""
    name = _owner_name(value)
    if name in ("arith.select", "vector.insert_strided_slice"):
        operands = list(value.owner.operands)
        values = operands[1:] if name == "arith.select" else operands  # not a select's condition
        return all(_is_computed(v) or _owner_name(v) == "arith.constant" for v in values)
    return name in _COMPUTING or name in FLOAT_EXTREMA or name.startswith("math.") and name not in _SIGN_OPS


def _is_bf16_extremum(value: ir.Value) -> bool:
    """The max or min of values widened from bf16 (or bf16 constants): one of them, exactly."""
    return _owner_name(value) in FLOAT_EXTREMA and all(_is_bf16_value(v) for v in value.owner.operands)


def _is_bf16_value(value: ir.Value) -> bool:
    name = _owner_name(value)
    if name == "arith.extf":
        return isinstance(ir.VectorType(value.owner.operands[0].type).element_type, ir.BF16Type)
    constant = float_constant(value)
    return constant is not None and struct.unpack("<I", struct.pack("<f", constant))[0] & 0xFFFF == 0


def _high_half(value: ir.Value, result: ir.VectorType) -> ir.Value:
    """An f32 vector holding bf16 values -> those values (the high 16 bits of each lane)."""
    wide = ir.VectorType.get(result.shape, ir.IntegerType.get_signless(32))
    shift = arith.constant(wide, ir.DenseElementsAttr.get_splat(wide, ir.IntegerAttr.get(wide.element_type, 16)))
    high = arith.trunci(ir.VectorType.get(result.shape, ir.IntegerType.get_signless(16)),
                        arith.shrui(arith.bitcast(wide, value), shift))
    return arith.bitcast(result, high)


def _converted(value: ir.Value, result: ir.VectorType) -> ir.Value:
    """VCVTNEPS2BF16 on each 16-lane (or 8-lane) part of ``value``."""
    count = math.prod(result.shape)
    lanes = 16 if count % 16 == 0 else 8
    flat_f32, flat_bf16, part = (ir.VectorType.get([n], t) for n, t in (
        (count, ir.F32Type.get()), (count, result.element_type), (lanes, result.element_type)))
    flat = vector.shape_cast(flat_f32, value) if result.rank != 1 else value
    rounded = arith.constant(flat_bf16, ir.DenseElementsAttr.get_splat(flat_bf16, ir.FloatAttr.get(result.element_type, 0.0)))
    for offset in range(0, count, lanes):
        piece = vector.extract_strided_slice(ir.VectorType.get([lanes], flat_f32.element_type), flat, [offset], [lanes], [1])
        converted = ir.Operation.create(_CONVERT, results=[part], operands=[piece]).results[0]
        rounded = vector.insert_strided_slice(converted, rounded, [offset], [1])
    return vector.shape_cast(result, rounded) if result.rank != 1 else rounded
