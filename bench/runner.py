"""Compile one function on XLA CPU or on polyblocks, time it, compare the results.

``compile_polyblocks`` is the one place that decides how polyblocks runs: through
``jax.jit`` on platform "polyblocks" when the PJRT plugin is registered, else through
``polyblocks_jax.compile`` on the lowered program, called with numpy arrays.
"""
from __future__ import annotations

import dataclasses
import gc
import re
import statistics
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

import polyblocks_jax as pb
from polyblocks_jax import compiler

PLATFORM = "polyblocks"


@dataclasses.dataclass
class Compiled:
    call: Callable[[], list]  # runs once, waits for completion, returns the flat outputs
    compile_s: float
    via: str                  # "xla", "pjrt" or "compile" (polyblocks_jax.compile)


def polyblocks_device() -> jax.Device | None:
    try:
        return jax.devices(PLATFORM)[0]
    except RuntimeError:  # the plugin is not installed or failed to register
        return None


def compile_xla(fn: Callable, *args, compiles: int = 1) -> Compiled:
    """XLA's executable of ``fn``; its compile time the least of ``compiles`` compiles, each
    after jax's caches are emptied (it would return the same program's executable)."""
    placed = jax.device_put(args, jax.devices("cpu")[0])
    times = []
    for _ in range(compiles):
        jax.clear_caches()
        lowered = jax.jit(fn).lower(*placed)
        start = time.perf_counter()
        compiled = lowered.compile()
        times.append(time.perf_counter() - start)
    return Compiled(lambda: _wait(compiled(*placed)), min(times), "xla")


def lower_polyblocks(fn: Callable, args: Sequence) -> tuple[jax.stages.Lowered, Sequence, str]:
    """The program polyblocks compiles, the arguments to call it with, and how it runs."""
    device = polyblocks_device()
    if device is not None:
        placed = jax.device_put(args, device)
        return jax.jit(fn).lower(*placed), placed, "pjrt"
    # keep_unused: the executable's parameters must be exactly the flattened arguments
    lowered = jax.jit(fn, keep_unused=True).trace(*args).lower(lowering_platforms=("cpu",))
    return lowered, [np.ascontiguousarray(a) for a in jax.tree_util.tree_leaves(args)], "compile"


def compile_polyblocks(fn: Callable, *args, compiles: int = 1) -> Compiled:
    """Polyblocks' executable of ``fn``; its compile time the least of ``compiles`` compiles,
    each after jax's caches and polyblocks' own are emptied."""
    times = []
    for _ in range(compiles):
        jax.clear_caches()
        compiler.CACHE.clear()
        lowered, call_args, via = lower_polyblocks(fn, args)
        start = time.perf_counter()
        if via == "pjrt":
            compiled = lowered.compile()
            call = lambda: _wait(compiled(*call_args))
        else:
            exe = pb.compile(lowered)
            call = lambda: list(exe(*call_args))
        times.append(time.perf_counter() - start)
    return Compiled(call, min(times), via)


def _wait(outputs: Any) -> list:
    return jax.tree_util.tree_leaves(jax.block_until_ready(outputs))


# After a parallel region, the OpenMP runtime's threads spin for its block time (200 ms by
# default) before they sleep: measured within it, XLA would share the cores with them.
_SETTLE_S = 0.3
# The first calls of a new executable run slower, on either side, for some milliseconds
# (pages of new buffers faulted in, threads woken and placed): a 0.2 ms pooling timed after
# two calls read 0.36 ms, after 0.1 s of calls 0.17-0.23 ms.
_WARMUP_S = 0.1


def median_latency(compiled: Compiled, repeat: int, warmup: int = 2) -> float:
    """Median seconds per call after at least ``warmup`` calls and ``_WARMUP_S`` of them,
    once the other runtime's threads are idle and the garbage of compiling is collected."""
    # A compile leaves its IR objects to the cyclic collector: collected in the middle of
    # the timed calls, they made a 0.09 ms gather read 0.40-0.45 ms (median of 20).
    gc.collect()
    time.sleep(_SETTLE_S)
    calls, start = 0, time.perf_counter()
    while calls < warmup or time.perf_counter() - start < _WARMUP_S:
        compiled.call()
        calls += 1
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        compiled.call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# Rounds of each side's median, alternating: the best round is the one the machine's other
# tenants disturbed least (on these shared VMs one median moved by 10-40% between runs).
ROUNDS = 3


@dataclasses.dataclass(frozen=True)
class PairedLatency:
    """Each side's median per round in seconds, the sides taking turns round by round."""
    xla_rounds: list[float]
    pb_rounds: list[float]

    @property
    def xla_s(self) -> float:
        return min(self.xla_rounds)

    @property
    def pb_s(self) -> float:
        return min(self.pb_rounds)

    def ratio_spread(self) -> tuple[float, float]:
        """The lowest and highest XLA / polyblocks ratio of one round."""
        ratios = [x / p for x, p in zip(self.xla_rounds, self.pb_rounds)]
        return min(ratios), max(ratios)


def paired_latency(xla: Compiled, polyblocks: Compiled, repeat: int, rounds: int = ROUNDS) -> PairedLatency:
    """Both sides' medians over ``rounds`` rounds, alternating; each side's reported time is its
    lowest, and the rounds show the spread."""
    medians: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        for side, compiled in zip(medians, (xla, polyblocks)):
            side.append(median_latency(compiled, repeat))
    return PairedLatency(*medians)


def max_relative_error(actual: Sequence, expected: Sequence) -> float:
    """max |actual - expected| / max |expected| over each output (norm-wise, so entries
    near zero do not dominate); inf on a shape mismatch or a differing NaN/inf."""
    worst = 0.0
    for a, e in zip(actual, expected, strict=True):
        a, e = (np.asarray(v) for v in (a, e))
        if np.iscomplexobj(a) or np.iscomplexobj(e):  # both parts, as pairs
            a, e = (np.stack([v.real, v.imag], -1) for v in (a, e))
        a, e = a.astype(np.float64), e.astype(np.float64)
        if a.shape != e.shape:
            return float("inf")
        finite = np.isfinite(e)
        if not (np.array_equal(a[~finite], e[~finite], equal_nan=True) and np.isfinite(a[finite]).all()):
            return float("inf")
        scale = max(float(np.max(np.abs(e[finite]), initial=0.0)), np.finfo(np.float32).tiny)
        worst = max(worst, float(np.max(np.abs(a[finite] - e[finite]), initial=0.0)) / scale)
    return worst


def matches(actual: Sequence, expected: Sequence, tolerance: float) -> tuple[bool, float]:
    """(verdict, max relative error): integer and bool outputs must be equal and float ones
    within ``tolerance`` norm-wise (``max_relative_error``), each of the expected dtype."""
    if len(actual) != len(expected):
        return False, float("inf")
    ok, worst = True, 0.0
    for a, e in zip(actual, expected):
        a, e = np.asarray(a), np.asarray(e)
        err = max_relative_error([a], [e])
        worst = max(worst, err)
        exact = e.dtype.kind in "biu"
        ok &= a.dtype == e.dtype and (np.array_equal(a, e) if exact else err <= tolerance)
    return bool(ok), worst


_UNSUPPORTED = re.compile(r"unsupported (\S+?): (.*?)(?: \(at .*\))?$", re.M)
# A pipeline failure locates its op by name: error: "stablehlo.compare eq": <message>
_LOCATED = re.compile(r'error: "((?:stablehlo|chlo|func)\.\w+)[^"]*": (.*)$', re.M)


def failure(error: BaseException) -> tuple[str, str]:
    """(op, message) of a compile or run failure; op is "" when no op is named.

    Through PJRT our errors arrive as a JaxRuntimeError whose text carries ours,
    so the op is read back from the message.
    """
    if isinstance(error, pb.UnsupportedError):
        return error.op, error.reason
    text = str(error).strip()
    first = text.splitlines()[0] if text else ""
    for pattern in (_UNSUPPORTED, _LOCATED):
        match = pattern.search(text)
        if match:
            detail = match.group(2) if pattern is _UNSUPPORTED else f"{first} {match.group(2)}"
            return match.group(1), detail[:300]
    return "", f"{type(error).__name__}: {first}"[:300]


def flat_numpy(outputs: Any) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(outputs)]
