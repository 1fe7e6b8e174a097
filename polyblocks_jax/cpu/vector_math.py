"""Polynomial math on f32 and f64 vectors, in arith ops: exp, tanh, log, and f32's pow.

LLVM lowers a vector ``math.exp``, ``tanh`` or ``log`` to one libm call per lane
(tanh: 23 times XLA's time on 2M elements); this build of MLIR has no
``math-polynomial-approximation`` pass. So vectorized code gets:

- exp, Cephes' expf reduction: x = n ln2 + r with |r| <= ln2/2, e^r = 1 + r + r^2 P(r) with
  P of degree 4 (a least-squares fit on Chebyshev nodes relative to e^r - 1, so that tanh's
  expm1 keeps its accuracy, reweighted towards minimax: 5.1e-9 in exact arithmetic, 0.81 ulp
  in f32, as Cephes' degree 5 with one FMA less), and 2^n built from its exponent bits in two halves so that n = 128 stays exact,
  or, where the target scales by a power of two in one instruction (AVX-512's VSCALEFPS,
  the ``x86vector.avx512.mask.scalef`` op, on 1-D vectors of whole 16-lane parts), by that:
  the same single rounding, one instruction per part instead of 11. NaN propagates through
  the clamp; x above the f32 range gives +inf (the clamp's upper end, 89, is past it: the
  scaling overflows, and no compare and select are needed); x whose exp is subnormal
  gives 0, as XLA's (which flushes subnormals): the clamp keeps every lane normal, since
  an instruction with a subnormal result takes a microcode assist of some 150 cycles (a
  causal mask's -1e9 made a masked softmax 3.5 times as slow as an unmasked one).
- tanh(|x|) = e / (e + 2) with e = e^(2|x|) - 1, from exp's reduction and polynomial without
  its 1 (so small |x| loses nothing) and 2^n (e^r - 1) + (2^n - 1) in one multiply-add; |x|
  clamped at 10, past which tanh rounds to 1; the sign copied from x (-0 stays -0, NaN
  propagates). 2.2 ulps at most (XLA's: 4.3). (A polynomial below 0.625 and 1 - 2 / (1 +
  e^(2|x|)) above, both computed and one selected, gains an ulp for nearly twice the time.)
- log: x = m 2^e with m in [sqrt(1/2), sqrt(2)) (subnormals scaled by 2^23 first), f = m - 1,
  log m = f - f^2/2 + f^3 P(f) with P a degree-7 least-squares fit (6e-9 in exact
  arithmetic), e ln2 added in two parts: 1.2 ulps; log(0) = -inf, log(+inf) = +inf, NaN
  below zero.

f64 takes the same steps with its own constants (``F64``): exp's polynomial Taylor's up to
r^13, log's f = m - 1 through 2 atanh(f / (2 + f)) (a series in s^2 <= 0.03), tanh clamped at
20; within 2 ulps, where XLA's f64 exp is vectorized too and its tanh is 0.07x ours was before
(libm per lane).

- pow on f32: e^(y log|x|) by f64's log and exp, C's special cases by selects (a libm call
  per lane was half an n-body step's time).

log1p and expm1 arrive as identities on log and exp (stablehlo_import/elementwise.py).
Scalar math (loops left scalar) keeps libm.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from mlir import ir
from mlir.dialects import arith, math, vector

from polyblocks_jax.passes.transform import walk
from polyblocks_jax.polynomials import polynomial

Const = Callable[[float], ir.Value]


def _log_of_mantissa_f32(f: ir.Value, const: Const) -> ir.Value:
    """log(1 + f) for f in [sqrt(1/2) - 1, sqrt(2) - 1): f - f^2/2 + f^3 P(f)."""
    f2 = arith.mulf(f, f)
    return arith.addf(arith.subf(f, arith.mulf(const(0.5), f2)), arith.mulf(arith.mulf(f2, f), polynomial(f, _LOG_P, const)))


def _log_of_mantissa_f64(f: ir.Value, const: Const) -> ir.Value:
    """log(1 + f) = 2 atanh(s), s = f / (2 + f), |s| < 0.172: f - f^2/2 + s (f^2/2 + R(s^2))
    (f - 2s = s f exactly in real numbers; R(z) = 2z/3 + 2z^2/5 + ..., Taylor's terms up to
    z^11, 1e-20 relative): the rounding of s touches only the small correction."""
    s = arith.divf(f, arith.addf(const(2.0), f))
    z = arith.mulf(s, s)
    half_f2 = arith.mulf(arith.mulf(f, f), const(0.5))
    r = arith.mulf(z, polynomial(z, [2.0 / (2 * k + 3) for k in range(11)], const))
    return arith.addf(arith.subf(f, half_f2), arith.mulf(s, arith.addf(half_f2, r)))


@dataclasses.dataclass(frozen=True)
class _Format:
    """What the expansions need to know of a float type."""
    width: int                    # bits, and those of the integer type for its bit tricks
    mantissa: int                 # stored mantissa bits
    ln2: tuple[float, float]      # hi (n hi exact for every n of the range) and lo, hi + lo = ln 2
    exp_poly: tuple[float, ...]   # e^r = 1 + r + r^2 P(r), lowest degree first
    exp_min: float                # e^exp_min: the smallest normal result, rounded up a little
    exp_overflows: float          # e^exp_overflows is past the largest finite value
    tanh_one: float               # tanh(x) rounds to 1 from below this on
    log_of_mantissa: Callable[[ir.Value, Const], ir.Value]

    @property
    def bias(self) -> int:
        return (1 << (self.width - self.mantissa - 2)) - 1

    @property
    def smallest_normal(self) -> float:
        return 2.0 ** (1 - self.bias)


# f32: P of degree 4, a least-squares fit on Chebyshev nodes relative to e^r - 1 (so that
# tanh's expm1 keeps its accuracy), reweighted towards minimax: 5.1e-9 in exact arithmetic,
# 0.81 ulp in f32, as Cephes' degree 5 with one FMA less. tanh rounds to 1 from 9.01 on.
F32 = _Format(32, 23, (0.693359375, -2.12194440e-4),
              (4.9999996772e-1, 1.6666542010e-1, 4.1667589830e-2, 8.3666716206e-3, 1.3858563821e-3),
              -87.3365, 89.0, 10.0, _log_of_mantissa_f32)
# f64: Taylor's 1/k! up to r^13 (4e-18 relative on |r| <= ln2/2); ln 2's hi keeps 21 bits;
# tanh rounds to 1 from 19.1 on.
F64 = _Format(64, 52, (0.6931467056274414, 4.7493250390316726e-07),
              tuple(1.0 / _f for _f in (2, 6, 24, 120, 720, 5040, 40320, 362880, 3628800, 39916800,
                                        479001600, 6227020800)),
              -708.39, 710.0, 20.0, _log_of_mantissa_f64)
_FORMATS = {ir.F32Type: F32, ir.F64Type: F64}
_LOG2E = 1.4426950408889634
_CURRENT_ROUNDING = 4  # _MM_FROUND_CUR_DIRECTION: the rounding mode in MXCSR


def expand_vector_math(module: ir.Module, scales_by_exponent: bool = False) -> None:
    """Replace every ``math.exp``, ``tanh`` and ``log`` on an f32 or f64 vector, and
    ``math.powf`` on an f32 one, with its polynomial (exp's 2^n by VSCALEFPS / VSCALEFPD
    where ``scales_by_exponent``)."""
    expansions = {"math.exp": _exp, "math.tanh": _tanh, "math.log": _log}
    for op in [o for o in walk(module.operation) if o.name in expansions or o.name == "math.powf"]:
        vtype = op.results[0].type
        if not isinstance(vtype, ir.VectorType):
            continue
        fmt = next((f for t, f in _FORMATS.items() if isinstance(vtype.element_type, t)), None)
        if op.name == "math.powf":  # f32 only: computed in f64 (f64's own stays libm's)
            fmt = fmt if fmt is F32 else None
        if fmt is not None:
            with ir.InsertionPoint(op), op.location:
                v = _Vectors(vtype, fmt)
                value = _pow(*op.operands, v) if op.name == "math.powf" else \
                    expansions[op.name](op.operands[0], v, scales_by_exponent)
            op.results[0].replace_all_uses_with(value)
            op.erase()


_LOG_P = (0.3333333153735033, -0.2500082115985208, 0.20001237094467894, -0.16623358069897712,
          0.1420157722221321, -0.13160027887372733, 0.12762585517105102, -0.07635993982619291)
_SQRT2 = 1.41421356237309505


@dataclasses.dataclass(frozen=True)
class _Vectors:
    """The vector type of an expansion, its integer twin and constants of both."""
    vtype: ir.VectorType
    fmt: _Format

    @property
    def itype(self) -> ir.VectorType:
        return ir.VectorType.get(self.vtype.shape, ir.IntegerType.get_signless(self.fmt.width))

    def const(self, v: float) -> ir.Value:
        return arith.constant(self.vtype, ir.DenseElementsAttr.get_splat(self.vtype, ir.FloatAttr.get(self.vtype.element_type, v)))

    def int(self, v: int) -> ir.Value:
        return arith.constant(self.itype, ir.DenseElementsAttr.get_splat(
            self.itype, ir.IntegerAttr.get(self.itype.element_type, v)))


def _tanh(x: ir.Value, v: _Vectors, _scales_by_exponent: bool = False) -> ir.Value:
    z = arith.minimumf(math.absf(x), v.const(v.fmt.tanh_one))
    e = _expm1_of_nonnegative(arith.addf(z, z), v)
    return math.copysign(arith.divf(e, arith.addf(e, v.const(2.0))), x)


def _expm1_of_nonnegative(y: ir.Value, v: _Vectors) -> ir.Value:
    """e^y - 1 for y in [0, 2 tanh_one]: 2^n (e^r - 1) + (2^n - 1), the polynomial's
    e^r - 1 without its 1 (no cancellation for small y), one rounding in the multiply-add."""
    n, er_minus_1 = _reduced(y, v)
    scale = _pow2(arith.fptosi(v.itype, n), v)
    return arith.addf(arith.mulf(scale, er_minus_1), arith.subf(scale, v.const(1.0)))


def _reduced(x: ir.Value, v: _Vectors) -> tuple[ir.Value, ir.Value]:
    """(n, e^r - 1) with x = n ln2 + r, |r| <= ln2/2 (x finite, in exp's range)."""
    hi, lo = v.fmt.ln2
    n = math.floor(arith.addf(arith.mulf(x, v.const(_LOG2E)), v.const(0.5)))
    r = arith.subf(arith.subf(x, arith.mulf(n, v.const(hi))), arith.mulf(n, v.const(lo)))
    return n, arith.addf(arith.mulf(polynomial(r, v.fmt.exp_poly, v.const), arith.mulf(r, r)), r)


def _log(x: ir.Value, v: _Vectors, _scales_by_exponent: bool = False) -> ir.Value:
    F, fmt, const = arith.CmpFPredicate, v.fmt, v.const
    subnormal = arith.cmpf(F.OLT, x, const(fmt.smallest_normal))
    scaled = arith.select(subnormal, arith.mulf(x, const(2.0 ** fmt.mantissa)), x)
    bits = arith.bitcast(v.itype, scaled)
    exponent = arith.subi(arith.shrui(bits, v.int(fmt.mantissa)), v.int(fmt.bias))
    one_bits = fmt.bias << fmt.mantissa
    m = arith.bitcast(v.vtype, arith.ori(arith.andi(bits, v.int((1 << fmt.mantissa) - 1)), v.int(one_bits)))
    big = arith.cmpf(F.OGT, m, const(_SQRT2))
    m = arith.select(big, arith.mulf(m, const(0.5)), m)
    e = arith.addf(arith.sitofp(v.vtype, exponent), arith.select(big, const(1.0), const(0.0)))
    e = arith.subf(e, arith.select(subnormal, const(float(fmt.mantissa)), const(0.0)))
    log_m = fmt.log_of_mantissa(arith.subf(m, const(1.0)), const)
    hi, lo = fmt.ln2
    y = arith.addf(arith.addf(arith.mulf(e, const(lo)), log_m), arith.mulf(e, const(hi)))
    y = arith.select(arith.cmpf(F.OEQ, x, const(float("inf"))), x, y)
    y = arith.select(arith.cmpf(F.OEQ, x, const(0.0)), const(float("-inf")), y)
    return arith.select(arith.cmpf(F.ULT, x, const(0.0)), const(float("nan")), y)


def _pow(x: ir.Value, y: ir.Value, v: _Vectors) -> ir.Value:
    """x^y on f32 vectors as e^(y log|x|) in f64 (f64's log and exp, each within 2 f64
    ulps: y log|x| keeps 2^-45 of relative error at |y log|x|| <= 104, the f32 range, so the
    f32 result is rounded from within a hair of the exact value), then C's special cases:
    x^0 = 1^y = 1 (NaN included), (-1)^(+-inf) = 1, a finite x < 0 to a non-integer y is NaN,
    to an odd integer y negative (x = -0 and x = -inf too)."""
    F, const = arith.CmpFPredicate, v.const
    wide = _Vectors(ir.VectorType.get(v.vtype.shape, ir.F64Type.get()), F64)
    r = _exp(arith.mulf(arith.extf(wide.vtype, y), _log(arith.extf(wide.vtype, math.absf(x)), wide)), wide, False)
    r = arith.truncf(v.vtype, r)
    integer = arith.cmpf(F.OEQ, math.floor(y), y)  # (infinities count: even)
    half = arith.mulf(y, const(0.5))
    odd = arith.andi(integer, arith.cmpf(F.ONE, math.floor(half), half))
    negative = arith.cmpi(arith.CmpIPredicate.slt, arith.bitcast(v.itype, x), v.int(0))  # -0 too
    r = arith.select(arith.andi(negative, odd), arith.negf(r), r)
    finite_negative = arith.andi(arith.cmpf(F.OLT, x, const(0.0)), arith.cmpf(F.ONE, x, const(float("-inf"))))
    r = arith.select(arith.andi(finite_negative, arith.xori(integer, _true(integer))), const(float("nan")), r)
    one = arith.ori(arith.cmpf(F.OEQ, y, const(0.0)), arith.cmpf(F.OEQ, x, const(1.0)))
    minus_one_to_inf = arith.andi(arith.cmpf(F.OEQ, x, const(-1.0)),
                                  arith.cmpf(F.OEQ, math.absf(y), const(float("inf"))))
    return arith.select(arith.ori(one, minus_one_to_inf), const(1.0), r)


def _true(like: ir.Value) -> ir.Value:
    """A vector of i1 ``true`` of ``like``'s type."""
    return arith.constant(like.type, ir.DenseElementsAttr.get_splat(like.type, ir.BoolAttr.get(True)))


def _exp(x: ir.Value, v: _Vectors, scales_by_exponent: bool) -> ir.Value:
    fmt, const = v.fmt, v.const
    n, er_minus_1 = _reduced(arith.minimumf(arith.maximumf(x, const(fmt.exp_min)), const(fmt.exp_overflows)), v)
    y = arith.addf(er_minus_1, const(1.0))
    lanes = _SCALEF_BITS // fmt.width
    if scales_by_exponent and v.vtype.rank == 1 and v.vtype.shape[0] % lanes == 0:
        y = _scalef(y, n, lanes)
    else:
        ni = arith.fptosi(v.itype, n)
        half = arith.shrsi(ni, v.int(1))
        y = arith.mulf(arith.mulf(y, _pow2(half, v)), _pow2(arith.subi(ni, half), v))
    return arith.select(arith.cmpf(arith.CmpFPredicate.OLT, x, const(fmt.exp_min)), const(0.0), y)


_SCALEF_BITS = 512  # the x86vector op's width: 16 f32 or 8 f64 lanes


def _scalef(y: ir.Value, n: ir.Value, lanes: int) -> ir.Value:
    """y * 2^n, rounded once, by VSCALEFPS / VSCALEFPD on each part of ``lanes``."""
    vtype = ir.VectorType(y.type)
    part = ir.VectorType.get([lanes], vtype.element_type)
    all_lanes = arith.constant(ir.IntegerType.get_signless(lanes), -1)
    rounding = arith.constant(ir.IntegerType.get_signless(32), _CURRENT_ROUNDING)
    result = y
    for offset in range(0, vtype.shape[0], lanes):
        y_part, n_part = (vector.extract_strided_slice(part, v, [offset], [lanes], [1]) for v in (y, n))
        scaled = ir.Operation.create("x86vector.avx512.mask.scalef", results=[part],
                                     operands=[y_part, n_part, y_part, all_lanes, rounding]).results[0]
        result = vector.insert_strided_slice(scaled, result, [offset], [1])
    return result


def _pow2(n: ir.Value, v: _Vectors) -> ir.Value:
    """2^n for n in the normal exponents' range, from the exponent bits."""
    bits = arith.shli(arith.addi(n, v.int(v.fmt.bias)), v.int(v.fmt.mantissa))
    return arith.bitcast(v.vtype, bits)
