"""Polynomials as arith ops, in Estrin's scheme: pairs of coefficients combined by powers
x^2, x^4, ... in a tree, so a degree-n polynomial waits on about log2(n) multiply-adds in a
row rather than n (Horner's). Vectorized math (erf, erfc, exp) is a chain of polynomials;
with Horner's, one chain per vector kept the FMA units a quarter busy (AVX2 has registers
for two or three chains), the LayerNorm+GELU kernel latency-bound."""
from __future__ import annotations

from typing import Callable, Sequence

from mlir import ir
from mlir.dialects import arith


def estrin(x: ir.Value, coefficients: Sequence[float], const: Callable[[float], ir.Value]) -> ir.Value:
    """sum(c_i x^i) over ``coefficients`` (lowest degree first); ``const(v)``: v shaped like x."""
    terms = [const(c) for c in coefficients]
    power = x
    while len(terms) > 1:
        pairs = [arith.addf(terms[i], arith.mulf(terms[i + 1], power)) for i in range(0, len(terms) - 1, 2)]
        terms = pairs + terms[len(terms) - len(terms) % 2:]
        if len(terms) > 1:
            power = arith.mulf(power, power)
    return terms[0]
