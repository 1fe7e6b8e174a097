"""Polynomials as arith ops, in second-order Horner: p(x) = E(x^2) + x O(x^2), the even and
odd coefficients each a Horner chain in x^2.

Vectorized math (erf, erfc, exp, log) is a chain of polynomials, and its kernels are bound
by the FMA units. Horner's one chain per vector left AVX2's units latency-bound; Estrin's
tree (pairs combined by x^2, x^4, x^8) waits on the fewest operations in a row but spends a
multiply on each power (three for erfc's degree 9). On the Zen 4, whose 512-bit FMAs issue
once a cycle, GELU(erf) on 8 x 512 x 768 took 1.15 ms with Estrin, 1.08 ms with this (and
with one chain). Two chains per vector, four vectors per elementwise step (vectorize.py),
are the eight in flight that two FMA units of latency four need, for one extra multiply."""
from __future__ import annotations

from typing import Callable, Sequence

from mlir import ir
from mlir.dialects import arith


def polynomial(x: ir.Value, coefficients: Sequence[float], const: Callable[[float], ir.Value]) -> ir.Value:
    """sum(c_i x^i) over ``coefficients`` (lowest degree first); ``const(v)``: v shaped like x."""
    if len(coefficients) < 4:
        return _horner(x, coefficients, const)
    x2 = arith.mulf(x, x)
    even, odd = _horner(x2, coefficients[0::2], const), _horner(x2, coefficients[1::2], const)
    return arith.addf(arith.mulf(odd, x), even)


def _horner(x: ir.Value, coefficients: Sequence[float], const: Callable[[float], ir.Value]) -> ir.Value:
    value = const(coefficients[-1])
    for c in reversed(coefficients[:-1]):
        value = arith.addf(arith.mulf(value, x), const(c))
    return value
