"""Per-call time of tiny jitted programs: polyblocks vs XLA CPU, where dispatch is all there is.

Cases: one op and ten elementwise ops, taking 1 and 8 arguments (float32[4]; every argument
is a parameter of the program: keep_unused), and the sum of two arguments; donating cases
donate the first argument and pass each call's result as the next call's (a training
step's or a KV cache's loop). Same process,
inputs already on each device, each call waits for its result; XLA's and polyblocks' timed
batches alternate, and each figure is the median of ``--repeats`` batches of ``--calls``.
Usage: python bench/dispatch.py [--calls N] [--repeats R]
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import jax
import numpy as np


def elementwise(ops: int, arguments: int) -> Callable:
    """``ops`` elementwise ops: the first combine the arguments (as many as there are ops), the rest scale and shift."""
    def fn(*xs):
        y = xs[0]
        for k in range(ops):
            y = y + xs[k + 1] if k + 1 < arguments else (y * 1.5 if k % 2 else y + 1.0)
        return y
    return fn


CASES = {  # name: (program, arguments, whether it donates its first argument)
    "a + b": (lambda a, b: a + b, 2, False),
    "1 op, 1 argument": (elementwise(1, 1), 1, False),
    "1 op, 8 arguments": (elementwise(1, 8), 8, False),
    "10 ops, 1 argument": (elementwise(10, 1), 1, False),
    "10 ops, 8 arguments": (elementwise(10, 8), 8, False),
    "a + b, a donated": (lambda a, b: a + b, 2, True),
    "10 ops, 8 args, donated": (elementwise(10, 8), 8, True),
}


def batch_us(fn: Callable, args: list, calls: int, donated: bool) -> float:
    """Microseconds per call; a donating call's result is the next call's first argument."""
    start = time.perf_counter()
    for _ in range(calls):
        result = fn(*args).block_until_ready()
        if donated:
            args[0] = result
    return (time.perf_counter() - start) / calls * 1e6


def compare(fn: Callable, arguments: int, donated: bool, calls: int, repeats: int) -> tuple[float, float]:
    """Median microseconds per call on XLA CPU and on polyblocks, batches interleaved."""
    jitted = jax.jit(fn, keep_unused=True, donate_argnums=(0,) if donated else ())
    x = np.ones((4,), np.float32)
    placed = {p: [jax.device_put(x + i, jax.devices(p)[0]) for i in range(arguments)] for p in ("cpu", "polyblocks")}
    for args in placed.values():
        batch_us(jitted, args, 200, donated)  # warm-up: compile, caches, allocator
    samples = {p: [] for p in placed}
    for _ in range(repeats):
        for platform, args in placed.items():
            samples[platform].append(batch_us(jitted, args, calls, donated))
    return statistics.median(samples["cpu"]), statistics.median(samples["polyblocks"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"{'case':<22}{'XLA us':>9}{'polyblocks us':>15}{'ratio':>8}   (median of {args.repeats} x {args.calls})")
    for name, (fn, arguments, donated) in CASES.items():
        xla, polyblocks = compare(fn, arguments, donated, args.calls, args.repeats)
        print(f"{name:<22}{xla:9.1f}{polyblocks:15.1f}{polyblocks / xla:8.2f}")


if __name__ == "__main__":
    main()
