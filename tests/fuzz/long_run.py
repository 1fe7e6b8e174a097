"""Long fuzzing: random programs until the time is up; failures become replayable regressions.

    python -m tests.fuzz.long_run --minutes 30 --out tests/fuzz/regressions/ [--family loops]

A supervisor runs workers in child processes so that a crash (a signal, not an
exception) is also a finding: the program a worker was running when it died is kept.
Workers run hypothesis in batches of fresh seeds; hypothesis minimizes each failing
program (re-checking only the failing setting, to shrink fast) and the minimal spec
is written as ``<out>/<signature>.json`` with status "open", which
tests/fuzz/test_regressions.py replays. One file per distinct failure signature.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import time

from hypothesis import HealthCheck, given, seed, settings

from . import differential, edge_ops, loop_programs, programs

INFLIGHT = ".inflight.json"  # the program a worker is running right now


def signature(spec: dict, setting: str, error: str) -> str:
    """A stable name for a failure: setting, the minimal program's op kinds, the error's gist."""
    lines = [line for line in error.splitlines() if line.strip()]
    gist = re.sub(r"[0-9]+", "N", " ".join(lines[:2]) if lines else "")
    kinds = sorted({op["op"] for op in spec["ops"]})
    digest = hashlib.sha256(f"{setting}|{kinds}|{gist}".encode()).hexdigest()[:10]
    return f"{re.sub(r'[^a-z]+', '-', setting.lower()).strip('-')}-{digest}"


def save(out: str, spec: dict, setting: str, error: str) -> bool:
    """Write a regression file unless this failure signature is already kept; True if new."""
    path = os.path.join(out, signature(spec, setting, error) + ".json")
    if os.path.exists(path):
        return False
    case = {"status": "open", "found": "tests/fuzz/long_run.py", "setting": setting,
            "error": error[:2000], "spec": spec}
    with open(path + ".tmp", "w") as f:
        json.dump(case, f, indent=1)
    os.replace(path + ".tmp", path)
    return True


# The programs a run draws: any; each built around a loop (scan, fori_loop, while_loop); of
# large and odd shapes, maybe contractions of narrow types; mostly of edge_ops' kinds; under
# vmap, jvp or grad as a whole.
EDGE_KINDS = tuple(edge_ops.GENERATORS) + ("binary", "cast", "reduce", "dot", "conv", "window", "scatter",
                                           "dynamic_slice")
MASK_KINDS = ("iota", "unary", "binary", "compare", "cast")
PAIR_KINDS = ("pairwise", "unary", "binary", "cast")
# 16-bit sums of terms that cancel differ from XLA's past any tolerance of their length alone;
# XLA's fused 8-bit max of differences along rows is wrong (x - y wider than 8 bits: 197 of
# 200 uint8 maxima of a (200, 24) difference differ from numpy's, which polyblocks gives)
PAIR_DTYPES = ("float32", "float64", "int32")
MATRIX_KINDS = ("dot", "conv", "unary", "binary", "cast", "reduce", "transpose")
# no reductions: XLA's fused max of a large matrix drops NaN (programs._gen_pairwise)
BLOCK_KINDS = ("dot", "unary", "binary", "transpose")
FAMILIES = {"all": lambda: programs.programs(max_ops=8), "loops": loop_programs.loop_programs,
            "large": lambda: programs.programs(max_ops=5, shapes=programs.LARGE),
            # large contractions of narrow types: the matrix units' (AMX, VDPBF16PS) kernels
            "matrix": lambda: programs.programs(max_ops=4, shapes=programs.LARGE, kinds=MATRIX_KINDS,
                                                dtypes=("bfloat16", "float16", "int8", "uint8", "float32")),
            # contractions large enough for the cache tiles: blocks of rows, k tiles, B panels
            "blocks": lambda: programs.programs(max_ops=3, shapes=programs.BLOCKS, kinds=BLOCK_KINDS, first="dot",
                                                dtypes=("float32", "float64", "bfloat16", "int8")),
            "edge": lambda: programs.programs(kinds=EDGE_KINDS),
            # masks of positions on matrices split into a parallel loop over rows
            "masks": lambda: programs.programs(max_ops=3, shapes=programs.ROWS, kinds=MASK_KINDS, first="iota"),
            # every row of one matrix against every row of another, reduced along the rows
            "pairwise": lambda: programs.programs(max_ops=3, shapes=programs.PAIRS, kinds=PAIR_KINDS, first="pairwise",
                                                    dtypes=PAIR_DTYPES),
            "transformed": lambda: programs.programs(transforms=True, dtypes=edge_ops.TRANSFORMED_DTYPES)}


def _batch(out: str, batch_seed: int, examples: int, family: str) -> tuple[int, int]:
    """One hypothesis run of up to ``examples`` programs; returns (programs, new failures)."""
    count, failure, focus = [0], {}, {}

    @seed(batch_seed)
    @settings(max_examples=examples, deadline=None, database=None, report_multiple_bugs=False,
              suppress_health_check=list(HealthCheck))
    @given(FAMILIES[family]())
    def run(spec):
        count[0] += 1
        with open(os.path.join(out, INFLIGHT), "w") as f:
            json.dump(spec, f)
        try:
            differential.check(spec, focus or differential.ALL_SETTINGS)
        except differential.Mismatch as e:
            focus.setdefault(e.setting, differential.ALL_SETTINGS[e.setting])  # shrink on it only
            failure.update(spec=spec, setting=e.setting, error=f"{type(e.error).__name__}: {e.error}")
            raise
    try:
        run()
    except differential.Mismatch:
        pass  # hypothesis replayed the minimal failing program last: it is in ``failure``
    new = bool(failure) and save(out, failure["spec"], failure["setting"], failure["error"])
    return count[0], int(new)


def worker(out: str, deadline: float, first_seed: int, examples: int, family: str) -> None:
    batch_seed = first_seed
    while time.time() < deadline:
        ran, new = _batch(out, batch_seed, examples, family)
        print(json.dumps({"programs": ran, "new_failures": new, "seed": batch_seed}), flush=True)
        batch_seed += 1


def supervise(out: str, minutes: float, examples: int, family: str) -> dict:
    """Run workers until the deadline; a worker that dies leaves its program as a crash case,
    unless XLA alone dies on it too (counted apart: the reference cannot judge it)."""
    deadline = time.time() + 60 * minutes
    totals = {"programs": 0, "mismatches": 0, "crashes": 0, "xla_crashes": 0}
    next_seed = random.SystemRandom().randrange(2**31)
    while time.time() < deadline:
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.fuzz.long_run", "--worker", "--out", out, "--deadline",
             str(deadline), "--seed", str(next_seed), "--examples", str(examples), "--family", family],
            stdout=subprocess.PIPE, text=True)
        for line in child.stdout:
            if not line.startswith("{"):
                continue  # hypothesis's own report of a failing example; the JSON lines are ours
            report = json.loads(line)
            totals["programs"] += report["programs"]
            totals["mismatches"] += report["new_failures"]
            next_seed = report["seed"] + 1
            print(f"[{time.strftime('%H:%M:%S')}] {json.dumps(totals)}", flush=True)
        if child.wait() != 0:
            if _xla_dies(out):
                totals["xla_crashes"] += 1  # XLA's own abort on the program: not ours to keep
            else:
                totals["crashes"] += _keep_crash(out, child.returncode)
            next_seed += 1  # do not rerun the batch that killed the worker
    return totals


_XLA_ONLY = """
import json, sys
from tests import support
from tests.fuzz import interpret
spec = json.load(open(sys.argv[1]))
support.xla_cpu(interpret.build(spec), *interpret.make_inputs(spec))
"""


def _xla_dies(out: str) -> bool:
    """Whether XLA CPU alone dies on the program a worker was running when it died."""
    path = os.path.join(out, INFLIGHT)
    if not os.path.exists(path):
        return False
    try:
        done = subprocess.run([sys.executable, "-c", _XLA_ONLY, path], capture_output=True, timeout=600)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode < 0


def _keep_crash(out: str, returncode: int) -> int:
    try:
        with open(os.path.join(out, INFLIGHT)) as f:
            spec = json.load(f)
    except (OSError, ValueError):
        return 0
    return int(save(out, spec, "process", f"worker died with exit status {returncode}"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "regressions"))
    parser.add_argument("--examples", type=int, default=50, help="programs per hypothesis batch")
    parser.add_argument("--family", choices=tuple(FAMILIES), default="all", help="which programs to draw")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.worker:
        return worker(args.out, args.deadline, args.seed, args.examples, args.family)
    start = time.time()
    totals = supervise(args.out, args.minutes, args.examples, args.family)
    print(f"long run: {totals['programs']} programs (shrinking included) in {(time.time() - start) / 60:.1f} min, "
          f"{totals['mismatches']} distinct mismatches, {totals['crashes']} crashes "
          f"({totals['xla_crashes']} more of XLA's own); "
          f"regressions in {args.out}", flush=True)


if __name__ == "__main__":
    main()
