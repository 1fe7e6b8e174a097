"""Complex numbers: arithmetic and math on (real, imaginary) pairs of real tensors.

The representation is complex_values.py's. Elementwise ops are formulas on the parts, built
with arith/math on whole tensors as the real converters are (so they fuse and vectorize);
ops that only move data run their real converter once per part; dot_general and
convolution are four real products. Edge cases follow XLA CPU: division is Smith's with
C99's infinity and zero-divisor cases, abs is NaN when a part is NaN, 0^w is 1 for w = 0,
0 for a positive real w and NaN otherwise, 1^w is 1.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from mlir import ir
from mlir.dialects import arith, math

from polyblocks_jax.stablehlo_import import reader
from polyblocks_jax.tensor_ir import builders
from polyblocks_jax.stablehlo_import.complex_values import Pair, map_parts, part_spec
from polyblocks_jax.stablehlo_import.convert import convert_value
from polyblocks_jax.stablehlo_import.elementwise import expm1, log1p
from polyblocks_jax.stablehlo_import.registry import CONVERTERS, converts_complex
from polyblocks_jax.tensor_ir.types import element_type

F = arith.CmpFPredicate


def _c(value: float, like: ir.Value) -> ir.Value:
    return builders.constant_like(value, like)


def _add(x: Pair, y: Pair) -> Pair:
    return Pair(arith.addf(x.re, y.re), arith.addf(x.im, y.im))


def multiply(x: Pair, y: Pair) -> Pair:
    (a, b), (c, d) = x, y
    return Pair(arith.subf(arith.mulf(a, c), arith.mulf(b, d)), arith.addf(arith.mulf(a, d), arith.mulf(b, c)))


def _scale(x: Pair, s: ir.Value) -> Pair:
    return Pair(arith.mulf(x.re, s), arith.mulf(x.im, s))


def _select(pred: ir.Value, x: Pair, y: Pair) -> Pair:
    return Pair(arith.select(pred, x.re, y.re), arith.select(pred, x.im, y.im))


def _is_inf(x: ir.Value) -> ir.Value:
    return arith.cmpf(F.OEQ, math.absf(x), _c(float("inf"), x))


def _is_finite(x: ir.Value) -> ir.Value:
    return arith.cmpf(F.ONE, math.absf(x), _c(float("inf"), x))


def divide(x: Pair, y: Pair) -> Pair:
    """Smith's division; where it gives NaN in both parts, C99's zero-divisor, infinite
    numerator and infinite denominator results, as XLA computes them."""
    (a, b), (c, d) = x, y
    zero, one, inf = _c(0.0, a), _c(1.0, a), _c(float("inf"), a)
    c_over_d = arith.divf(c, d)
    denom_d = arith.addf(d, arith.mulf(c_over_d, c))
    d_over_c = arith.divf(d, c)
    denom_c = arith.addf(c, arith.mulf(d_over_c, d))
    d_larger = arith.cmpf(F.OLT, math.absf(c), math.absf(d))
    smith = _select(d_larger,
                    Pair(arith.divf(arith.addf(arith.mulf(c_over_d, a), b), denom_d),
                         arith.divf(arith.subf(arith.mulf(c_over_d, b), a), denom_d)),
                    Pair(arith.divf(arith.addf(arith.mulf(d_over_c, b), a), denom_c),
                         arith.divf(arith.subf(b, arith.mulf(d_over_c, a)), denom_c)))

    def unit_if(pred: ir.Value, sign_of: ir.Value) -> ir.Value:  # +-1 where pred, else +-0
        return math.copysign(arith.select(pred, one, zero), sign_of)

    zero_divisor = arith.andi(arith.andi(arith.cmpf(F.OEQ, c, zero), arith.cmpf(F.OEQ, d, zero)),
                              arith.ori(arith.cmpf(F.ORD, a, a), arith.cmpf(F.ORD, b, b)))
    signed_inf = math.copysign(inf, c)
    zero_divisor_result = Pair(arith.mulf(signed_inf, a), arith.mulf(signed_inf, b))
    inf_over_finite = arith.andi(arith.ori(_is_inf(a), _is_inf(b)), arith.andi(_is_finite(c), _is_finite(d)))
    a1, b1 = unit_if(_is_inf(a), a), unit_if(_is_inf(b), b)
    inf_over_finite_result = Pair(arith.mulf(inf, arith.addf(arith.mulf(a1, c), arith.mulf(b1, d))),
                                  arith.mulf(inf, arith.subf(arith.mulf(b1, c), arith.mulf(a1, d))))
    finite_over_inf = arith.andi(arith.ori(_is_inf(c), _is_inf(d)), arith.andi(_is_finite(a), _is_finite(b)))
    c1, d1 = unit_if(_is_inf(c), c), unit_if(_is_inf(d), d)
    finite_over_inf_result = Pair(arith.mulf(zero, arith.addf(arith.mulf(a, c1), arith.mulf(b, d1))),
                                  arith.mulf(zero, arith.subf(arith.mulf(b, c1), arith.mulf(a, d1))))
    both_nan = arith.andi(arith.cmpf(F.UNO, smith.re, smith.re), arith.cmpf(F.UNO, smith.im, smith.im))
    fixed = _select(zero_divisor, zero_divisor_result,
                    _select(inf_over_finite, inf_over_finite_result,
                            _select(finite_over_inf, finite_over_inf_result, smith)))
    return _select(both_nan, fixed, smith)


def magnitude(x: Pair) -> ir.Value:
    """max * sqrt(1 + (min / max)^2) on the parts' magnitudes: no overflow before the result
    does; 0 for 0, infinity where a part is infinite, NaN where a part is NaN."""
    a, b = math.absf(x.re), math.absf(x.im)
    big, small = arith.maximumf(a, b), arith.minimumf(a, b)  # NaN propagates
    ratio = arith.divf(small, big)
    scaled = arith.mulf(big, math.sqrt(arith.addf(_c(1.0, a), arith.mulf(ratio, ratio))))
    # (0, 0) and (inf, inf) make ratio NaN: the result is then big.
    exact = arith.ori(arith.cmpf(F.OEQ, big, _c(0.0, a)), arith.cmpf(F.OEQ, small, _c(float("inf"), a)))
    return arith.select(exact, big, scaled)


def _arg(x: Pair) -> ir.Value:
    return math.atan2(x.im, x.re)


def _exp(x: Pair) -> Pair:
    e = math.exp(x.re)
    # exp(a + 0i) is exp(a) + 0i even for infinite a, where e * sin(0) would be NaN.
    real_only = arith.cmpf(F.OEQ, x.im, _c(0.0, x.im))
    return Pair(arith.select(real_only, e, arith.mulf(e, math.cos(x.im))),
                arith.select(real_only, x.im, arith.mulf(e, math.sin(x.im))))


def _log_abs(x: Pair) -> ir.Value:
    """log |z| as log max + log1p((min / max)^2) / 2: finite where |z| itself overflows."""
    a, b = math.absf(x.re), math.absf(x.im)
    big, small = arith.maximumf(a, b), arith.minimumf(a, b)
    ratio = arith.divf(small, big)
    scaled = arith.addf(math.log(big), arith.mulf(_c(0.5, a), log1p(arith.mulf(ratio, ratio))))
    exact = arith.ori(arith.cmpf(F.OEQ, big, _c(0.0, a)), arith.cmpf(F.OEQ, small, _c(float("inf"), a)))
    return arith.select(exact, math.log(big), scaled)


def _log(x: Pair) -> Pair:
    return Pair(_log_abs(x), _arg(x))


def sqrt(x: Pair) -> Pair:
    """The principal root: t = sqrt((|a| + |z|) / 2), then (t, b / 2t) for a >= 0 and
    (|b| / 2t, +-t) otherwise; (0, b) at 0 and (inf, b) for infinite b."""
    a, b = x
    zero, one = _c(0.0, a), _c(1.0, a)
    # t = 2 sqrt((|a| + |z|) / 8) for large parts, where |a| + |z| may overflow.
    large = arith.cmpf(F.OGT, arith.maximumf(math.absf(a), math.absf(b)), one)
    scale = arith.select(large, _c(0.125, a), _c(0.5, a))
    scaled_abs = magnitude(Pair(arith.mulf(scale, a), arith.mulf(scale, b)))
    t = arith.mulf(math.sqrt(arith.addf(arith.mulf(scale, math.absf(a)), scaled_abs)),
                   arith.select(large, _c(2.0, a), one))
    two_t = arith.addf(t, t)
    nonnegative = arith.cmpf(F.OGE, a, zero)
    # -0 counts as positive in b's sign, as in XLA: sqrt(-1 - 0i) is +i.
    root = _select(nonnegative, Pair(t, arith.divf(b, two_t)),
                   Pair(arith.divf(math.absf(b), two_t),
                        arith.select(arith.cmpf(F.OLT, b, zero), arith.negf(t), t)))
    root = _select(arith.cmpf(F.OEQ, t, zero), Pair(zero, b), root)
    return _select(_is_inf(b), Pair(_c(float("inf"), a), b), root)


def _rsqrt(x: Pair) -> Pair:
    one = _c(1.0, x.re)
    return divide(Pair(one, _c(0.0, one)), sqrt(x))


def _pow(x: Pair, y: Pair) -> Pair:
    """exp(y log x), with XLA's exact cases: x^0 and 1^y are 1 for every x and y (NaN and
    infinite y included), 0^y is 0 for a positive real y and NaN otherwise, and +inf^c for a
    real c is the real power (inf or 0)."""
    zero, one, nan, inf = _c(0.0, x.re), _c(1.0, x.re), _c(float("nan"), x.re), _c(float("inf"), x.re)
    power = _exp(multiply(y, _log(x)))
    real_x = arith.cmpf(F.OEQ, x.im, zero)
    base_zero = arith.andi(arith.cmpf(F.OEQ, x.re, zero), real_x)
    real_y = arith.cmpf(F.OEQ, y.im, zero)
    at_zero = arith.select(arith.andi(real_y, arith.cmpf(F.OGT, y.re, zero)), zero, nan)
    power = _select(base_zero, Pair(at_zero, at_zero), power)
    infinite_base = arith.andi(arith.andi(real_x, arith.cmpf(F.OEQ, x.re, inf)),
                               arith.andi(real_y, arith.cmpf(F.ORD, y.re, y.re)))
    power = _select(infinite_base, Pair(arith.select(arith.cmpf(F.OGT, y.re, zero), inf, zero), zero), power)
    unit_base = arith.andi(real_x, arith.cmpf(F.OEQ, x.re, one))
    return _select(arith.ori(unit_base, arith.andi(real_y, arith.cmpf(F.OEQ, y.re, zero))), Pair(one, zero), power)


def _cosh_sinh(b: ir.Value) -> tuple[ir.Value, ir.Value]:
    """cosh b and sinh b; sinh through expm1 so that it keeps small arguments."""
    half = _c(0.5, b)
    e, e_neg = math.exp(b), math.exp(arith.negf(b))
    return (arith.mulf(half, arith.addf(e, e_neg)),
            arith.mulf(half, arith.subf(expm1(b), expm1(arith.negf(b)))))


def _sin(x: Pair) -> Pair:
    cosh, sinh = _cosh_sinh(x.im)
    return Pair(arith.mulf(math.sin(x.re), cosh), arith.mulf(math.cos(x.re), sinh))


def _cos(x: Pair) -> Pair:
    cosh, sinh = _cosh_sinh(x.im)
    return Pair(arith.mulf(math.cos(x.re), cosh), arith.negf(arith.mulf(math.sin(x.re), sinh)))


def _tan(x: Pair) -> Pair:
    """(sin a cos a + i sinh b cosh b) / (cos^2 a + sinh^2 b): a denominator without
    cancellation near the poles. For large |b|, where sinh^2 b overflows, the imaginary part
    is +-1 and the real part 4 sin a cos a e^-2|b|."""
    sin_a, cos_a = math.sin(x.re), math.cos(x.re)
    cosh, sinh = _cosh_sinh(x.im)
    denominator = arith.addf(arith.mulf(cos_a, cos_a), arith.mulf(sinh, sinh))
    sin_cos = arith.mulf(sin_a, cos_a)
    large = arith.cmpf(F.OGT, math.absf(x.im), _c(20.0, x.im))
    tail = arith.mulf(arith.mulf(_c(4.0, sin_a), sin_cos), math.exp(arith.mulf(_c(-2.0, x.im), math.absf(x.im))))
    # An infinite or NaN a gives NaN, but for an infinite b: then +-0 + +-i, as C99's ctan.
    nan = _c(float("nan"), sin_a)
    finite_a, infinite_b = _is_finite(x.re), _is_inf(x.im)
    tail = arith.select(finite_a, tail, arith.select(infinite_b, _c(0.0, nan), nan))
    unit = arith.select(arith.ori(finite_a, infinite_b), math.copysign(_c(1.0, x.im), x.im), nan)
    real = arith.select(large, tail, arith.divf(sin_cos, denominator))
    # tan(+-0 + NaN i) is +-0 + NaN i (C99's ctan, and XLA's): the denominator's NaN must not reach it.
    real = arith.select(arith.andi(arith.cmpf(F.OEQ, x.re, _c(0.0, x.re)), arith.cmpf(F.UNO, x.im, x.im)), x.re, real)
    return Pair(real,
                arith.select(large, unit, arith.divf(arith.mulf(sinh, cosh), denominator)))


def _tanh(x: Pair) -> Pair:
    """tanh z = -i tan(i z)."""
    t = _tan(Pair(arith.negf(x.im), x.re))
    return Pair(t.im, arith.negf(t.re))


def _expm1(x: Pair) -> Pair:
    """(expm1(a) cos b - 2 sin^2(b/2), e^a sin b): no cancellation near 0."""
    a, b = x
    s = math.sin(arith.mulf(_c(0.5, b), b))
    real_only = arith.cmpf(F.OEQ, b, _c(0.0, b))  # keeps e^a sin 0 = 0 for infinite a
    return Pair(arith.subf(arith.mulf(expm1(a), math.cos(b)), arith.mulf(_c(2.0, b), arith.mulf(s, s))),
                arith.select(real_only, b, arith.mulf(math.exp(a), math.sin(b))))


def _log1p(x: Pair) -> Pair:
    """log|1 + z| as log1p(2a + a^2 + b^2) / 2 near 0 (no cancellation), else through abs."""
    a, b = x
    one, half = _c(1.0, a), _c(0.5, a)
    shifted = Pair(arith.addf(one, a), b)
    near = arith.mulf(half, log1p(arith.addf(arith.mulf(a, arith.addf(_c(2.0, a), a)), arith.mulf(b, b))))
    small = arith.cmpf(F.OLT, arith.maximumf(math.absf(a), math.absf(b)), half)
    return Pair(arith.select(small, near, _log_abs(shifted)), _arg(shifted))


def _sign(x: Pair) -> Pair:
    """z / |z|; 0 stays itself (signs of zero kept), NaN parts make NaN."""
    m = magnitude(x)
    return _select(arith.cmpf(F.OEQ, m, _c(0.0, m)), x, Pair(arith.divf(x.re, m), arith.divf(x.im, m)))


def _logistic(x: Pair) -> Pair:
    one = _c(1.0, x.re)
    e = _exp(Pair(arith.negf(x.re), arith.negf(x.im)))
    return divide(Pair(one, _c(0.0, one)), Pair(arith.addf(one, e.re), e.im))


_BINARY: dict[str, Callable[[Pair, Pair], Pair]] = {
    "stablehlo.add": _add,
    "stablehlo.subtract": lambda x, y: Pair(arith.subf(x.re, y.re), arith.subf(x.im, y.im)),
    "stablehlo.multiply": multiply, "stablehlo.divide": divide, "stablehlo.power": _pow,
}

_UNARY: dict[str, Callable[[Pair], Pair]] = {
    "stablehlo.negate": lambda x: Pair(arith.negf(x.re), arith.negf(x.im)),
    "stablehlo.exponential": _exp, "stablehlo.exponential_minus_one": _expm1,
    "stablehlo.log": _log, "stablehlo.log_plus_one": _log1p,
    "stablehlo.sqrt": sqrt, "stablehlo.rsqrt": _rsqrt,
    "stablehlo.sine": _sin, "stablehlo.cosine": _cos, "stablehlo.tan": _tan, "stablehlo.tanh": _tanh,
    "stablehlo.sign": _sign, "stablehlo.logistic": _logistic,
}


@converts_complex(*_BINARY)
def binary(cx, op):
    return [_BINARY[op.name](*op.operands)]


@converts_complex(*_UNARY)
def unary(cx, op):
    return [_UNARY[op.name](op.operands[0])]


@converts_complex("stablehlo.abs")
def abs_(cx, op):
    return [magnitude(op.operands[0])]


@converts_complex("stablehlo.real")
def real(cx, op):
    return [op.operands[0].re]


@converts_complex("stablehlo.imag")
def imag(cx, op):
    return [op.operands[0].im]


@converts_complex("stablehlo.complex")
def complex_(cx, op):
    return [Pair(*op.operands)]


@converts_complex("stablehlo.compare")
def compare(cx, op):
    (a, b), (c, d) = op.operands
    direction = reader.enum_name(op.attr("comparison_direction"))
    if direction == "EQ":
        return [arith.andi(arith.cmpf(F.OEQ, a, c), arith.cmpf(F.OEQ, b, d))]
    if direction == "NE":
        return [arith.ori(arith.cmpf(F.UNE, a, c), arith.cmpf(F.UNE, b, d))]
    raise op.unsupported(f"comparison {direction} of complex numbers (only EQ and NE are defined)")


@converts_complex("stablehlo.constant")
def constant(cx, op):
    spec = op.result_specs[0]
    values = reader.complex_constant_values(op.op, spec)
    parts = (values.real, values.imag)
    if op.scalar:
        elem = element_type(spec.dtype.component)
        return [Pair(*(builders.splat(p.reshape(-1)[0], elem) for p in parts))]
    return [Pair(*(builders.dense_constant(p, part_spec(spec)) for p in parts))]


@converts_complex("stablehlo.convert")
def convert(cx, op):
    """Real -> complex: a zero imaginary part; complex -> real: the real part (as XLA);
    complex -> bool: whether either part is nonzero."""
    x, src, dst = op.operands[0], op.operand_specs[0].dtype, op.result_specs[0].dtype
    if not src.is_complex:
        re = convert_value(x, src, dst.component)
        return [Pair(re, _c(0.0, re))]
    if dst.is_complex:
        return [map_parts(lambda p: convert_value(p, src.component, dst.component), x)]
    if dst.is_bool:
        zero = _c(0.0, x.re)
        return [arith.ori(arith.cmpf(F.UNE, x.re, zero), arith.cmpf(F.UNE, x.im, zero))]
    return [convert_value(x.re, src.component, dst)]


@converts_complex("stablehlo.iota")
def iota(cx, op):
    re = CONVERTERS[op.name](cx, _part_view(op, 0))[0]
    return [Pair(re, _c(0.0, re))]


# Ops that move or pick elements without computing on them: the real converter runs once
# on the real parts and once on the imaginary parts (index and predicate operands are shared).
_MOVES = ("stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.transpose", "stablehlo.reverse",
          "stablehlo.slice", "stablehlo.concatenate", "stablehlo.pad", "stablehlo.dynamic_slice",
          "stablehlo.dynamic_update_slice", "stablehlo.gather", "stablehlo.select")


def _part_view(op, k: int):
    """``op`` seen on part ``k`` (0 real, 1 imaginary) of its complex values."""
    return dataclasses.replace(
        op, operands=[v[k] if isinstance(v, Pair) else v for v in op.operands],
        operand_specs=[part_spec(s) for s in op.operand_specs],
        result_specs=[part_spec(s) for s in op.result_specs])


@converts_complex(*_MOVES)
def moves(cx, op):
    real = CONVERTERS[op.name]
    re, im = (real(cx, _part_view(op, k)) for k in (0, 1))
    return [Pair(r, i) for r, i in zip(re, im)]


@converts_complex("stablehlo.dot_general", "stablehlo.dot", "stablehlo.convolution")
def bilinear(cx, op):
    """A product of complex operands as four real products (a real operand: two). A real
    result (a preferred_element_type) is XLA's complex product converted to it: the real
    part, computed in the operands' part type, then converted."""
    real = CONVERTERS[op.name]
    lhs, rhs = op.operands[:2]
    out = op.result_specs[0]
    component = next(s.dtype.component for s in op.operand_specs[:2] if s.dtype.is_complex)
    product_spec = part_spec(out) if out.dtype.is_complex else dataclasses.replace(out, dtype=component)

    def product(x: ir.Value, y: ir.Value) -> ir.Value:
        view = dataclasses.replace(op, operands=[x, y, *op.operands[2:]],
                                   operand_specs=[part_spec(s) for s in op.operand_specs],
                                   result_specs=[product_spec])
        return real(cx, view)[0]
    if not isinstance(lhs, Pair):
        re = product(lhs, rhs.re)
    elif not isinstance(rhs, Pair):
        re = product(lhs.re, rhs)
    else:
        re = arith.subf(product(lhs.re, rhs.re), product(lhs.im, rhs.im))
    if not out.dtype.is_complex:
        return [convert_value(re, component, out.dtype)]
    if not isinstance(lhs, Pair):
        return [Pair(re, product(lhs, rhs.im))]
    if not isinstance(rhs, Pair):
        return [Pair(re, product(lhs.im, rhs))]
    return [Pair(re, arith.addf(product(lhs.re, rhs.im), product(lhs.im, rhs.re)))]
