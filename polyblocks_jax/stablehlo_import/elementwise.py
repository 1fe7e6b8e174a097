"""Elementwise arithmetic, math, comparison and selection: arith/math on whole tensors.

The same converters build the scalar bodies of reductions (values are then plain
scalars). Integer edge cases follow XLA CPU: x / 0 = -1, x % 0 = x, INT_MIN / -1 =
INT_MIN. bf16/f16 transcendental math is computed in f32 and rounded, as XLA does.
The chlo ops JAX emits are expanded by the StableHLO project's own
chlo-legalize-to-stablehlo (the rewrite XLA applies) and the expansion is imported;
but erf, which XLA keeps as an op of its own and evaluates as one rational function.
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import ml_dtypes
import numpy as np
from jaxlib.mlir import ir as jir
from jaxlib.mlir import passmanager as jpassmanager
from jaxlib.mlir.dialects import func as jfunc
from jaxlib.mlir.dialects import stablehlo as jstablehlo
from mlir import ir
from mlir.dialects import arith, math

from polyblocks_jax.dtypes import DType
from polyblocks_jax.polynomials import polynomial
from polyblocks_jax.stablehlo_import import reader
from polyblocks_jax.tensor_ir import builders
from polyblocks_jax.stablehlo_import.registry import computes_composite, converts, converts_complex

F, I = arith.CmpFPredicate, arith.CmpIPredicate


def _dtype(op) -> DType:
    return op.operand_specs[0].dtype


def in_f32(fn: Callable[..., ir.Value], *values: ir.Value) -> ir.Value:
    """``fn(*values)``, computed in f32 when the values are bf16 or f16 (as XLA's CPU backend)."""
    elem = builders.elem_type_of(values[0])
    if not isinstance(elem, (ir.BF16Type, ir.F16Type)):
        return fn(*values)
    f32 = ir.F32Type.get()
    wide = [arith.extf(builders.shaped_like(v, f32), v) for v in values]
    return arith.truncf(builders.shaped_like(values[0], elem), fn(*wide))


def broadcast_like(value: ir.Value, like: ir.Value) -> ir.Value:
    """``value`` filled to ``like``'s shape when it is a rank-0 tensor and ``like`` is not
    (a linalg.fill: fusion folds it into its consumers' bodies as the scalar)."""
    t = value.type
    if isinstance(t, ir.RankedTensorType) and t.rank == 0 and ir.RankedTensorType(like.type).rank:
        return builders.filled(builders.to_scalar(value), ir.RankedTensorType(like.type).shape)
    return value


# ---------------------------------------------------------------- binary arithmetic

# op -> (float, signed, unsigned, bool) builders; None: the op is undefined for i1.
_BINARY = {
    "stablehlo.add": (arith.addf, arith.addi, arith.addi, arith.ori),
    "stablehlo.subtract": (arith.subf, arith.subi, arith.subi, None),
    "stablehlo.multiply": (arith.mulf, arith.muli, arith.muli, arith.andi),
    "stablehlo.maximum": (builders.exact_maximumf, arith.maxsi, arith.maxui, arith.ori),
    "stablehlo.minimum": (builders.exact_minimumf, arith.minsi, arith.minui, arith.andi),
}


def _pick(table: tuple, dt: DType, op):
    fn = table[("float", "sint", "uint", "bool").index(dt.kind)]
    if fn is None:
        raise op.unsupported_dtype(dt.name)
    return fn


@converts(*_BINARY)
def binary(cx, op):
    return [_pick(_BINARY[op.name], _dtype(op), op)(*op.operands)]


def _safe_divisor(lhs: ir.Value, rhs: ir.Value, dt: DType) -> tuple[ir.Value, ir.Value]:
    """(rhs == 0, a divisor that cannot trap): 1 replaces 0 and, for INT_MIN / -1, -1."""
    is_zero = arith.cmpi(I.eq, rhs, builders.constant_like(0, rhs))
    bad = is_zero
    if not dt.is_unsigned:
        int_min = builders.constant_like(-(2 ** (dt.bits - 1)), lhs)
        overflow = arith.andi(arith.cmpi(I.eq, lhs, int_min),
                              arith.cmpi(I.eq, rhs, builders.constant_like(-1, rhs)))
        bad = arith.ori(is_zero, overflow)
    return is_zero, arith.select(bad, builders.constant_like(1, rhs), rhs)


@converts("stablehlo.divide")
def divide(cx, op):
    lhs, rhs = op.operands
    dt = _dtype(op)
    if dt.is_float:
        reciprocal = _exact_reciprocal(op.op.operands[1], dt)
        if reciprocal is not None:  # attention's q / sqrt(64): a multiply, a tenth of a division's cost
            return [arith.mulf(lhs, builders.constant_like(reciprocal, lhs))]
        return [arith.divf(lhs, rhs)]
    if dt.is_bool:
        raise op.unsupported("dtype i1")
    is_zero, safe = _safe_divisor(lhs, rhs, dt)
    quotient = (arith.divui if dt.is_unsigned else arith.divsi)(lhs, safe)
    return [arith.select(is_zero, builders.constant_like(-1, lhs), quotient)]


def _exact_reciprocal(divisor: jir.Value, dt: DType) -> float | None:
    """1 / c where ``divisor`` is a constant power of two c whose reciprocal ``dt`` holds as
    a normal number: x / c and x * (1 / c) are then the same real number, rounded once, for
    every x (NaN, infinities and flushed subnormals alike)."""
    c = reader.scalar_constant(divisor)
    if c is None or dt.bits < 16 or not np.isfinite(c) or c == 0:
        return None
    mantissa, exponent = np.frexp(float(c))
    info = ml_dtypes.finfo(dt.numpy)
    if abs(mantissa) != 0.5 or not 1 - info.maxexp <= exponent - 1 <= -info.minexp:
        return None
    return 1.0 / float(c)


@converts("stablehlo.remainder")
def remainder(cx, op):
    lhs, rhs = op.operands
    dt = _dtype(op)
    if dt.is_float:
        return [in_f32(arith.remf, lhs, rhs)]
    if dt.is_bool:
        raise op.unsupported("dtype i1")
    is_zero, safe = _safe_divisor(lhs, rhs, dt)
    rem = (arith.remui if dt.is_unsigned else arith.remsi)(lhs, safe)
    return [arith.select(is_zero, lhs, rem)]


def _integer_power(base: ir.Value, exponent: ir.Value) -> ir.Value:
    """XLA's integer pow: six unrolled squaring steps, so only the exponent's low 6 bits
    count; a negative exponent gives 0 unless |base| == 1."""
    one, zero = builders.constant_like(1, base), builders.constant_like(0, base)
    acc, b, e = one, base, exponent
    for _ in range(6):
        odd = arith.cmpi(I.eq, arith.andi(e, one), one)
        acc = arith.select(odd, arith.muli(acc, b), acc)
        b = arith.muli(b, b)
        e = arith.shrui(e, one)
    # XLA applies the signed test to unsigned exponents too: 2**200 is 0 in ui8.
    unit = arith.ori(arith.cmpi(I.eq, base, one),
                     arith.cmpi(I.eq, base, builders.constant_like(-1, base)))
    negative_case = arith.select(unit, acc, zero)
    return arith.select(arith.cmpi(I.sge, exponent, zero), acc, negative_case)


@converts("stablehlo.power")
def power(cx, op):
    dt = _dtype(op)
    if dt.is_float:
        return [in_f32(math.powf, *op.operands)]
    if dt.is_bool:
        raise op.unsupported("dtype i1")
    return [_integer_power(*op.operands)]


@converts("stablehlo.atan2")
def atan2(cx, op):
    return [in_f32(math.atan2, *op.operands)]


# ---------------------------------------------------------------- unary float math

def _logistic(x: ir.Value) -> ir.Value:
    one = builders.constant_like(1.0, x)
    return arith.divf(one, arith.addf(one, math.exp(arith.negf(x))))


# log1p and expm1 through log and exp, in identities that cancel the rounding of 1 + x and of
# e^x: MLIR's LLVM lowering of math.log1p and math.expm1 computes log(1 + x) and e^x - 1,
# which lose x wherever those round (log1p(1e-10) and expm1(1e-10) gave 0, log1p(1e-5) was
# 0.1% off), and vectorized code gets log's and exp's polynomials (cpu/vector_math.py).
def log1p(x: ir.Value) -> ir.Value:
    """log(u) x / (u - 1) with u = 1 + x: x itself where u rounds to 1 (-0 included)."""
    one, inf = builders.constant_like(1.0, x), builders.constant_like(float("inf"), x)
    u = arith.addf(one, x)
    d = arith.subf(u, one)
    y = arith.mulf(math.log(u), arith.divf(x, d))
    y = arith.select(arith.cmpf(F.OEQ, d, builders.constant_like(0.0, x)), x, y)
    return arith.select(arith.cmpf(F.OEQ, u, inf), u, y)


def expm1(x: ir.Value) -> ir.Value:
    """(u - 1) x / log(u) with u = e^x (Kahan's): x where u rounds to 1, -1 where u - 1 does."""
    one, inf = builders.constant_like(1.0, x), builders.constant_like(float("inf"), x)
    u = math.exp(x)
    d = arith.subf(u, one)
    y = arith.mulf(d, arith.divf(x, math.log(u)))
    y = arith.select(arith.cmpf(F.OEQ, u, one), x, y)
    y = arith.select(arith.cmpf(F.OEQ, d, builders.constant_like(-1.0, x)), d, y)
    return arith.select(arith.cmpf(F.OEQ, u, inf), u, y)


_FLOAT_UNARY: dict[str, Callable[[ir.Value], ir.Value]] = {
    "stablehlo.exponential": math.exp, "stablehlo.exponential_minus_one": expm1,
    "stablehlo.log": math.log, "stablehlo.log_plus_one": log1p,
    "stablehlo.tanh": math.tanh, "stablehlo.logistic": _logistic,
    "stablehlo.sqrt": math.sqrt, "stablehlo.rsqrt": math.rsqrt, "stablehlo.cbrt": math.cbrt,
    "stablehlo.sine": math.sin, "stablehlo.cosine": math.cos, "stablehlo.tan": math.tan,
    "stablehlo.floor": math.floor, "stablehlo.ceil": math.ceil,
    "stablehlo.round_nearest_afz": math.round, "stablehlo.round_nearest_even": math.roundeven,
}


@converts(*_FLOAT_UNARY)
def float_unary(cx, op):
    if not _dtype(op).is_float:
        raise op.unsupported_dtype(_dtype(op).name)
    return [in_f32(_FLOAT_UNARY[op.name], op.operands[0])]


@converts("stablehlo.is_finite")
def is_finite(cx, op):
    x = op.operands[0]
    return [arith.cmpf(F.OLT, math.absf(x), builders.constant_like(float("inf"), x))]


@converts("stablehlo.abs")
def abs_(cx, op):
    x, dt = op.operands[0], _dtype(op)
    if dt.is_float:
        return [math.absf(x)]
    return [x if dt.is_unsigned else math.absi(x)]  # |INT_MIN| wraps to INT_MIN, as in XLA


@converts("stablehlo.negate")
def negate(cx, op):
    x = op.operands[0]
    if _dtype(op).is_float:
        return [arith.negf(x)]
    return [arith.subi(builders.constant_like(0, x), x)]


@converts("stablehlo.real", "stablehlo.imag")
def real_part(cx, op):
    # of a real operand (complex ones: complex.py): itself, and zero
    x = op.operands[0]
    return [x if op.name == "stablehlo.real" else builders.constant_like(0.0, x)]


@converts("stablehlo.sign")
def sign(cx, op):
    x, dt = op.operands[0], _dtype(op)
    one, minus_one = builders.constant_like(1, x), builders.constant_like(-1, x)
    zero = builders.constant_like(0, x)
    if dt.is_float:  # NaN and +-0 are their own sign
        unit = arith.select(arith.cmpf(F.OGT, x, zero), one, minus_one)
        return [arith.select(arith.cmpf(F.UEQ, x, zero), x, unit)]
    if dt.is_unsigned:
        return [arith.select(arith.cmpi(I.ne, x, zero), one, zero)]
    unit = arith.select(arith.cmpi(I.sgt, x, zero), one, minus_one)
    return [arith.select(arith.cmpi(I.eq, x, zero), zero, unit)]


# ---------------------------------------------------------------- compare, select, clamp

_FLOAT_PREDICATES = {"EQ": F.OEQ, "NE": F.UNE, "LT": F.OLT, "LE": F.OLE, "GT": F.OGT, "GE": F.OGE}
_INT_PREDICATES = {
    "SIGNED": {"EQ": I.eq, "NE": I.ne, "LT": I.slt, "LE": I.sle, "GT": I.sgt, "GE": I.sge},
    "UNSIGNED": {"EQ": I.eq, "NE": I.ne, "LT": I.ult, "LE": I.ule, "GT": I.ugt, "GE": I.uge},
}


def total_order_key(x: ir.Value, bits: int) -> ir.Value:
    """An integer whose signed order is the IEEE total order of the float ``x``."""
    int_t = ir.IntegerType.get_signless(bits)
    i = arith.bitcast(builders.shaped_like(x, int_t), x)
    sign_mask = arith.shrsi(i, builders.constant_like(bits - 1, i))  # all ones when negative
    magnitude_mask = arith.shrui(sign_mask, builders.constant_like(1, i))
    return arith.xori(i, magnitude_mask)  # negatives: flip all bits but the sign


@converts("stablehlo.compare")
def compare(cx, op):
    lhs, rhs = op.operands
    dt = _dtype(op)
    direction = reader.enum_name(op.attr("comparison_direction"))
    kind_attr = op.attr("compare_type")
    default = "FLOAT" if dt.is_float else "UNSIGNED" if dt.is_unsigned else "SIGNED"
    kind = reader.enum_name(kind_attr) if kind_attr is not None else default
    if kind == "FLOAT" and dt.is_float:
        return [arith.cmpf(_FLOAT_PREDICATES[direction], lhs, rhs)]
    if kind == "TOTALORDER" and dt.is_float:
        lhs, rhs, kind = total_order_key(lhs, dt.bits), total_order_key(rhs, dt.bits), "SIGNED"
    elif kind not in _INT_PREDICATES or dt.is_float:
        raise op.unsupported(f"compare_type {kind} on {dt.name}")
    return [arith.cmpi(_INT_PREDICATES[kind][direction], lhs, rhs)]


@converts("stablehlo.select")
def select(cx, op):
    pred, on_true, on_false = op.operands
    return [arith.select(broadcast_like(pred, on_true), on_true, on_false)]


@converts("stablehlo.clamp")
def clamp(cx, op):
    lo, x, hi = op.operands
    dt = op.operand_specs[1].dtype
    maximum = _pick(_BINARY["stablehlo.maximum"], dt, op)
    minimum = _pick(_BINARY["stablehlo.minimum"], dt, op)
    return [minimum(maximum(x, broadcast_like(lo, x)), broadcast_like(hi, x))]


# ---------------------------------------------------------------- chlo

# erf(x) = x P(x^2) / Q(x^2) on [-4, 4] (beyond, erf rounds to +-1 in f32): a rational
# least-squares fit on Chebyshev nodes, reweighted by 1/Q (Sanathanan-Koerner) to near
# minimax: 2.4e-9 from erf in exact arithmetic, 3.7e-7 (a few ulps) evaluated in f32.
# chlo's expansion evaluates two approximations, an exp and two divisions, and selects.
_ERF_P = (1.1283791681395319, 1.8527672747560367e-01, 5.4354099886575559e-02, 3.8564107522616889e-03,
          3.8087920107117629e-04, 4.7157361521793070e-06, -1.3363263605730949e-08)
_ERF_Q = (1.0, 4.9753062292617334e-01, 1.1401313025393779e-01, 1.5479783297068206e-02,
          1.3107041261312099e-03, 6.3409374636707320e-05)
_ERF_BOUND = 4.0
# From here erf is within half an ulp of +-1 in f32 (erfc(x) < 2^-25): it rounds to +-1,
# where the rational, evaluated in f32, falls an ulp or two short (erf(inf) was 1 - 2^-23).
_ERF_ONE = 3.9192059


def _erf(x: ir.Value) -> ir.Value:
    """erf on f32 (NaN propagates through the clamps; -0 stays -0)."""
    def const(v: float) -> ir.Value:
        return builders.constant_like(v, x)
    one = const(1.0)
    saturated = arith.cmpf(F.OGE, math.absf(x), const(_ERF_ONE))
    bound = const(_ERF_BOUND)
    clamped = arith.minimumf(arith.maximumf(x, arith.negf(bound)), bound)
    t = arith.mulf(clamped, clamped)
    # rounding may overshoot 1 by an ulp near the bound
    erf = arith.divf(arith.mulf(clamped, polynomial(t, _ERF_P, const)), polynomial(t, _ERF_Q, const))
    erf = arith.minimumf(arith.maximumf(erf, arith.negf(one)), one)
    return arith.select(saturated, math.copysign(one, x), erf)


# erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z / 2), for z >= 0 (Numerical Recipes' erfcc,
# after Chebyshev: fractional error under 1.2e-7 everywhere); erfc(-z) = 2 - erfc(z). One
# division, one exp and a polynomial, where chlo's expansion (and XLA's) evaluates erf's
# rational and two for erfc's tail, and selects. jax.nn.gelu(approximate=False) is x erfc.
# A PJRT program (a portable artifact) arrives with jaxlib's expansion of chlo ops in
# StableHLO, except erf and erfc, which our lowering rules wrap in composites named after
# them (pjrt/lowering_rules.py).
_ERFC_P = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398,
           1.48851587, -0.82215223, 0.17087277)


def _erfc(x: ir.Value) -> ir.Value:
    """erfc on f32 (NaN propagates; erfc(+-inf) = 0, 2)."""
    def const(v: float) -> ir.Value:
        return builders.constant_like(v, x)
    z = math.absf(x)
    t = arith.divf(const(1.0), arith.addf(const(1.0), arith.mulf(const(0.5), z)))
    y = arith.mulf(t, math.exp(arith.subf(polynomial(t, _ERFC_P, const), arith.mulf(z, z))))
    negative = arith.cmpf(arith.CmpFPredicate.OLT, x, const(0.0))
    return arith.select(negative, arith.subf(const(2.0), y), y)


_OWN_F32 = {"chlo.erf": _erf, "chlo.erfc": _erfc}


@converts(*_OWN_F32)
def erf_erfc(cx, op) -> Sequence[ir.Value]:
    """Ours on f32 (and bf16/f16 through f32); chlo's expansion on f64."""
    if not _dtype(op).is_float:
        raise op.unsupported_dtype(_dtype(op).name)
    return _own_erf(op.name, op) or chlo_op(cx, op)


@computes_composite(*_OWN_F32)
def erf_erfc_composite(cx, op) -> Sequence[ir.Value] | None:
    """A composite wrapping chlo.erf or chlo.erfc: ours where ``erf_erfc`` would be."""
    return _own_erf(jir.StringAttr(op.attr("name")).value, op)


def _own_erf(name: str, op) -> list[ir.Value] | None:
    dt = _dtype(op)
    if not dt.is_float or dt.bits == 64:
        return None
    return [in_f32(_OWN_F32[name], op.operands[0])]


# The chlo ops JAX 0.10 emits for lax.erf, lgamma, sinh, ... (all on floats).
_CHLO_EXPANDED = (
    "acos", "acosh", "asin", "asinh", "atan", "atanh", "bessel_i1e", "conj", "cosh", "digamma",
    "erf_inv", "is_inf", "is_neg_inf", "is_pos_inf", "lgamma", "next_after",
    "polygamma", "sinh", "square", "tan", "zeta")
# Ops on the bit pattern, or with a boolean result: expanded in their own type.
_CHLO_EXACT = ("chlo.next_after", "chlo.is_inf", "chlo.is_neg_inf", "chlo.is_pos_inf")


@functools.cache
def _register_stablehlo_passes() -> None:
    jstablehlo.register_stablehlo_passes()


def _f32_like(t: jir.Type) -> jir.Type:
    return jir.RankedTensorType.get(jir.RankedTensorType(t).shape, jir.F32Type.get())


def _expanded_chlo(op, in_f32: bool) -> jir.Module:
    """A jaxlib module whose @f holds ``op`` alone (retyped to f32 with ``in_f32``),
    expanded into StableHLO ops."""
    _register_stablehlo_passes()
    jop = op.op
    with jop.context, jop.location:
        operand_types = [_f32_like(v.type) if in_f32 else v.type for v in jop.operands]
        result_types = [_f32_like(r.type) if in_f32 else r.type for r in jop.results]
        module = jir.Module.create()
        with jir.InsertionPoint(module.body):
            fn = jfunc.FuncOp("f", jir.FunctionType.get(operand_types, result_types))
            entry = fn.add_entry_block()
            with jir.InsertionPoint(entry):
                clone = jir.Operation.create(
                    jop.name, results=result_types, operands=list(entry.arguments),
                    attributes={a.name: a.attr for a in jop.attributes})
                jfunc.ReturnOp(clone.results)
        jpassmanager.PassManager.parse(
            "builtin.module(func.func(chlo-legalize-to-stablehlo))").run(module.operation)
    return module


@converts(*(f"chlo.{name}" for name in _CHLO_EXPANDED))
@converts_complex(*(f"chlo.{name}" for name in _CHLO_EXPANDED))
def chlo_op(cx, op) -> Sequence[ir.Value]:
    """bf16/f16 expansions run in f32 and round once at the end, as XLA's CPU backend
    does (it keeps the excess precision between the expanded ops). A complex expansion
    is imported with the complex converters (complex.py)."""
    dt = _dtype(op)
    if not (dt.is_float or dt.is_complex):
        raise op.unsupported_dtype(dt.name)
    widen = dt.bits == 16 and op.name not in _CHLO_EXACT
    module = _expanded_chlo(op, widen)  # owns the block imported below
    body = module.body.operations[0].regions[0].blocks[0]
    if not widen:
        return cx.import_block(body, op.operands)
    f32, elem = ir.F32Type.get(), builders.elem_type_of(op.operands[0])
    wide = [arith.extf(builders.shaped_like(v, f32), v) for v in op.operands]
    results = cx.import_block(body, wide)
    return [arith.truncf(builders.shaped_like(r, elem), r) for r in results]
