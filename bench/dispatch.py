"""Per-call overhead of a tiny jitted function: polyblocks (PJRT in Python) vs XLA CPU.

Same process, same function, inputs already on each device; median of repeated timed
batches after warm-up. Usage: python bench/dispatch.py [--calls N] [--repeats R]
"""
from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np


def per_call_us(fn, x, calls: int, repeats: int) -> float:
    for _ in range(200):  # warm-up: compile, caches, allocator
        fn(x, x).block_until_ready()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn(x, x).block_until_ready()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    fn = jax.jit(lambda a, b: a + b)
    x = np.ones((4,), np.float32)
    results = {}
    for platform in ("cpu", "polyblocks"):
        device = jax.devices(platform)[0]
        results[platform] = per_call_us(fn, jax.device_put(x, device), args.calls, args.repeats)
        print(f"{platform:>10}: {results[platform]:7.1f} us per call (median of {args.repeats} x {args.calls})")
    print(f"     ratio: {results['polyblocks'] / results['cpu']:.1f}x (polyblocks / XLA CPU)")


if __name__ == "__main__":
    main()
