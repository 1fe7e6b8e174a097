"""Run one program spec on XLA CPU and through polyblocks under every option setting; compare."""
from __future__ import annotations

import math
import unittest

import jax
import jax.extend.core
import jax.numpy as jnp
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
# (at most n ulps of its largest partial sum). Tolerances widen by n / EXACT_TERMS beyond it,
# and the absolute one scales with the result's largest magnitude, the partial sums' scale
# (an element summing to 0.03 through partial sums of magnitude 10 is off by their ulps).
EXACT_TERMS = 32
# A sum rounded to a 16-bit float at every step (a reduction, scan or pooling of bf16 or f16; their
# contractions accumulate in f32 on both sides) rounds at the partial sums' magnitude, which grows
# with the terms: adding them in another order (XLA's is not ours) moves the result by about as
# many roundings as terms, whatever the result's own magnitude (33 bf16 terms of magnitude 1
# summing to -0.6: -0.5625 in order, -0.516 by XLA). Float results of a program with such a sum
# of n terms are compared within n times that dtype's tolerance.
_ROUNDED_SUMS = ("reduce_sum", "reduce_prod", "cumsum", "cumprod", "reduce_window_sum")

_ASSERT = unittest.TestCase()  # support.assert_close reports through a TestCase


class Mismatch(AssertionError):
    """polyblocks disagreed with XLA, or failed on a program XLA ran; names the setting."""

    def __init__(self, setting: str, error: BaseException) -> None:
        self.setting, self.error = setting, error
        super().__init__(f"[{setting}] {type(error).__name__}: {error}")


def summed_terms(jaxpr: jax.extend.core.Jaxpr, rounded_to: np.dtype | None = None) -> int:
    """The most terms any one sum or product of ``jaxpr`` (and of the jaxprs inside it) adds up;
    with ``rounded_to``, of the sums in that dtype only (``_ROUNDED_SUMS``)."""
    most = 1
    for eqn in jaxpr.eqns:
        name, shape = eqn.primitive.name, eqn.invars[0].aval.shape if eqn.invars else ()
        terms = 1
        if name == "dot_general":
            terms = math.prod(shape[d] for d in eqn.params["dimension_numbers"][0][0])
        elif name == "conv_general_dilated":  # the kernel's input features times its window
            rhs = eqn.params["dimension_numbers"].rhs_spec
            kernel = eqn.invars[1].aval.shape
            terms = kernel[rhs[1]] * math.prod(kernel[d] for d in rhs[2:])
        elif name in ("reduce_sum", "reduce_prod"):
            terms = math.prod(shape[d] for d in eqn.params["axes"])
        elif name in ("cumsum", "cumprod"):
            terms = shape[eqn.params["axis"]]
        elif name == "reduce_window_sum":
            terms = math.prod(eqn.params["window_dimensions"])
        if rounded_to is None or (name in _ROUNDED_SUMS and eqn.outvars[0].aval.dtype == rounded_to):
            most = max(most, terms)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            most = max(most, summed_terms(sub, rounded_to))
    return most


def _partial_sum_scale(result: np.ndarray) -> float:
    """The largest finite magnitude of a float result, at least 1 (1 for other types)."""
    result = np.asarray(result)
    if not np.issubdtype(result.dtype, np.inexact):
        return 1.0
    finite = np.abs(result[np.isfinite(result)]).astype(np.float64)
    return max(1.0, float(finite.max(initial=0.0)))


def least_precise_float(jaxpr: jax.extend.core.Jaxpr) -> np.dtype | None:
    """Of the floating (or complex) values ``jaxpr`` computes, inside it too, the dtype of the
    loosest tolerance: a float64 result computed through float32 values carries their rounding
    (a float32 sum fed to a float64 output differed from XLA's by one float32 ulp)."""
    loosest = None
    for eqn in jaxpr.eqns:
        found = [np.dtype(getattr(var.aval, "dtype", np.int32)) for var in eqn.outvars]
        found += [least_precise_float(sub) for sub in jax.extend.core.jaxprs_in_params(eqn.params)]
        for dtype in found:
            if dtype is not None and np.issubdtype(dtype, np.inexact) and (
                    loosest is None or support.tolerance(dtype) > support.tolerance(loosest)):
                loosest = dtype
    return loosest


def tolerances(jaxpr: jax.extend.core.Jaxpr, dtype: np.dtype) -> tuple[float, float]:
    """(rtol, atol) for a result of ``dtype``: support's (for a float result, those of the least
    precise float ``jaxpr`` computes through), widened for long sums (EXACT_TERMS), and at least
    n times a 16-bit float's where ``jaxpr`` sums n terms in it."""
    rtol, atol = support.tolerance(dtype)
    if not rtol:
        return rtol, atol  # exact types stay exact
    loosest = least_precise_float(jaxpr)
    if loosest is not None:
        rtol, atol = max((rtol, atol), support.tolerance(loosest))
    widen = max(1.0, summed_terms(jaxpr) / EXACT_TERMS)
    rtol, atol = rtol * widen, atol * widen
    for narrow in (np.dtype(jnp.bfloat16), np.dtype(np.float16)):
        n = summed_terms(jaxpr, narrow)
        if n > 1:
            rtol, atol = max(rtol, n * support.tolerance(narrow)[0]), max(atol, n * support.tolerance(narrow)[1])
    return rtol, atol


def check(spec: dict, settings: dict[str, pb.Options] = SETTINGS) -> None:
    """Raise Mismatch unless every setting's results equal XLA's within ``tolerances``."""
    fn, args = interpret.build(spec), interpret.make_inputs(spec)
    expected = support.xla_cpu(fn, *args)
    # keep_unused: the executable takes every argument the spec declares, used or not.
    traced = jax.jit(fn, keep_unused=True).trace(*args)
    lowered = traced.lower(lowering_platforms=("cpu",))
    for name, options in settings.items():
        try:
            actual = pb.compile(lowered, options)(*args)
            _ASSERT.assertEqual(len(actual), len(expected), name)
            for i, (a, e) in enumerate(zip(actual, expected)):
                rtol, atol = tolerances(traced.jaxpr.jaxpr, e.dtype)
                if summed_terms(traced.jaxpr.jaxpr) > 1:
                    atol *= _partial_sum_scale(e)
                support.assert_close(_ASSERT, [a], [e], rtol=rtol, atol=atol, msg=f"{name} output {i}")
        except Exception as e:  # noqa: BLE001 (a compile error is a finding too; report it)
            raise Mismatch(name, e) from e
