"""Run one program spec on XLA CPU and through polyblocks under every option setting; compare."""
from __future__ import annotations

import math
import unittest

import jax
import jax.extend.core
import numpy as np

import polyblocks_jax as pb
import support
from . import interpret


def _setting(off: list[str]) -> tuple[str, pb.Options]:
    name = ",".join(f"no-{s}" for s in off) or "default"
    return name, pb.Options(**{s: False for s in off})


# The CI slice: the default, fusion off, tiling off, every optimization off.
SETTINGS: dict[str, pb.Options] = dict(_setting(off) for off in ([], ["fusion"], ["tiling"], pb.Options.switches()))
# The long mode adds each remaining optimization off on its own.
ALL_SETTINGS: dict[str, pb.Options] = dict(_setting(off) for off in ([], *[[s] for s in pb.Options.switches()],
                                                                      pb.Options.switches()))

# A float result may differ from XLA's by the rounding of its sums, which add their terms in
# another order (tiles, vector lanes, threads): the error of a sum of n terms grows with n
# (at most n ulps of its largest partial sum). Tolerances widen by n / EXACT_TERMS beyond it.
EXACT_TERMS = 32

_ASSERT = unittest.TestCase()  # support.assert_close reports through a TestCase


class Mismatch(AssertionError):
    """polyblocks disagreed with XLA, or failed on a program XLA ran; names the setting."""

    def __init__(self, setting: str, error: BaseException) -> None:
        self.setting, self.error = setting, error
        super().__init__(f"[{setting}] {type(error).__name__}: {error}")


def summed_terms(jaxpr: jax.extend.core.Jaxpr) -> int:
    """The most terms any one sum or product of ``jaxpr`` (and of the jaxprs inside it) adds up."""
    most = 1
    for eqn in jaxpr.eqns:
        name, shape = eqn.primitive.name, eqn.invars[0].aval.shape if eqn.invars else ()
        if name == "dot_general":
            most = max(most, math.prod(shape[d] for d in eqn.params["dimension_numbers"][0][0]))
        elif name == "conv_general_dilated":  # the kernel's input features times its window
            rhs = eqn.params["dimension_numbers"].rhs_spec
            kernel = eqn.invars[1].aval.shape
            most = max(most, kernel[rhs[1]] * math.prod(kernel[d] for d in rhs[2:]))
        elif name in ("reduce_sum", "reduce_prod"):
            most = max(most, math.prod(shape[d] for d in eqn.params["axes"]))
        elif name in ("cumsum", "cumprod"):
            most = max(most, shape[eqn.params["axis"]])
        elif name == "reduce_window_sum":
            most = max(most, math.prod(eqn.params["window_dimensions"]))
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            most = max(most, summed_terms(sub))
    return most


def least_precise_float(jaxpr: jax.extend.core.Jaxpr) -> np.dtype | None:
    """Of the floating (or complex) values ``jaxpr`` computes, inside it too, the dtype of the
    loosest tolerance: a float64 result computed through float32 values carries their rounding
    (a float32 sum fed to a float64 output differed from XLA's by one float32 ulp)."""
    loosest = None
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            dtype = np.dtype(getattr(var.aval, "dtype", np.int32))
            if np.issubdtype(dtype, np.inexact) and (
                    loosest is None or support.tolerance(dtype) > support.tolerance(loosest)):
                loosest = dtype
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            inner = least_precise_float(sub)
            if inner is not None and (loosest is None or support.tolerance(inner) > support.tolerance(loosest)):
                loosest = inner
    return loosest


def check(spec: dict, settings: dict[str, pb.Options] = SETTINGS) -> None:
    """Raise Mismatch unless every setting's results equal XLA's within support's tolerances
    (a float result's those of the least precise float it is computed through), widened for
    long sums (``summed_terms``)."""
    fn, args = interpret.build(spec), interpret.make_inputs(spec)
    expected = support.xla_cpu(fn, *args)
    # keep_unused: the executable takes every argument the spec declares, used or not.
    traced = jax.jit(fn, keep_unused=True).trace(*args)
    lowered = traced.lower(lowering_platforms=("cpu",))
    widen = max(1.0, summed_terms(traced.jaxpr.jaxpr) / EXACT_TERMS)
    loosest = least_precise_float(traced.jaxpr.jaxpr)
    for name, options in settings.items():
        try:
            actual = pb.compile(lowered, options)(*args)
            _ASSERT.assertEqual(len(actual), len(expected), name)
            for i, (a, e) in enumerate(zip(actual, expected)):
                rtol, atol = support.tolerance(e.dtype)
                if np.issubdtype(e.dtype, np.inexact) and loosest is not None:
                    rtol, atol = max((rtol, atol), support.tolerance(loosest))
                support.assert_close(_ASSERT, [a], [e], rtol=rtol * widen, atol=atol * widen, msg=f"{name} output {i}")
        except Exception as e:  # noqa: BLE001 (a compile error is a finding too; report it)
            raise Mismatch(name, e) from e
