"""What compiling in a compile worker costs, against compiling in process.

First compile: a fresh process (jax imported) compiles a tiny program, once in a worker
(which starts then), once in process. Per compile: in one warm process, the same programs
compiled again and again (the cache cleared), alternating worker and in-process runs;
medians. ``python -m bench.compile_workers [--reps N]``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import jax
import numpy as np

import polyblocks_jax as pb
from bench import flax_models
from polyblocks_jax import compiler

_FIRST = """
import time, numpy as np, jax, polyblocks_jax as pb
low = jax.jit(lambda a: a * 3.0 + 1.0).trace(np.ones(4, np.float32)).lower(lowering_platforms=("cpu",))
start = time.perf_counter()
pb.compile(low)
print(time.perf_counter() - start)
"""


def first_compile_s(in_process: bool) -> float:
    env = dict(os.environ, POLYBLOCKS_FLAGS="in-process" if in_process else "")
    done = subprocess.run([sys.executable, "-c", _FIRST], env=env, capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def per_compile_s(lowered, reps: int) -> dict[str, float]:
    times: dict[str, list[float]] = {"worker": [], "in-process": []}
    for _ in range(reps):
        for mode, options in (("worker", pb.Options()), ("in-process", pb.Options(in_process=True))):
            compiler.CACHE.clear()
            start = time.perf_counter()
            pb.compile(lowered, options)
            times[mode].append(time.perf_counter() - start)
    return {mode: statistics.median(t) for mode, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    for in_process in (False, True):
        runs = sorted(first_compile_s(in_process) for _ in range(3))
        print(f"first compile, {'in process' if in_process else 'worker'}: median {runs[1]:.2f} s ({runs})")
    tiny = jax.jit(lambda a: a * 3.0 + 1.0).trace(np.ones(4, np.float32)).lower(lowering_platforms=("cpu",))
    case = flax_models.make("resnet18")
    resnet = jax.jit(case.apply).trace(case.params, case.input).lower(lowering_platforms=("cpu",))
    pb.compile(tiny)  # a warm worker and a warm compiler here
    pb.compile(tiny, pb.Options(in_process=True))
    for name, lowered in (("tiny", tiny), ("resnet18", resnet)):
        t = per_compile_s(lowered, args.reps)
        print(f"per compile, {name}: worker {t['worker'] * 1e3:.0f} ms, in process {t['in-process'] * 1e3:.0f} ms, "
              f"overhead {(t['worker'] - t['in-process']) * 1e3:+.0f} ms")


if __name__ == "__main__":
    main()
