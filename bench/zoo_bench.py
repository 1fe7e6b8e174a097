"""The benchmark zoo: models and small programs on XLA CPU and on polyblocks, side by side.

Every workload of bench/zoo_workloads.py (models) and bench/zoo_programs.py (programs), random
weights, at each batch size: both sides' compile times, their latencies (bench/runner.py: the
best of alternating medians), the ratio XLA time / polyblocks time (above 1: polyblocks is
faster), the norm-wise relative error against XLA and a verdict against the workload's
tolerance. A workload that fails is a row with its error. Prints one table per batch size
with the geomeans over the models and over the programs, and writes zoo-<machine>.json with
a markdown table beside it (bench/results_files.py says where; ``--save``: bench/results/).

    python bench/zoo_bench.py                # every workload at batch 1 and 8, default sizes
    python bench/zoo_bench.py --full         # the issue's sizes (ResNet-50 at 224, BERT-768 of 12 layers, ...)
    python bench/zoo_bench.py --busy         # the same while a pinned spinning process keeps one core busy
    python bench/zoo_bench.py --only bert_h128_s128,sort_f32 --batch 1 --repeat 5
    python bench/zoo_bench.py --list
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

if __package__ in (None, ""):  # run as a script: make `bench` importable from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import results_files, runner, zoo_programs, zoo_workloads  # noqa: E402
from bench.zoo_workloads import Workload  # noqa: E402

WORKLOADS: list[Workload] = zoo_workloads.MODELS + zoo_programs.PROGRAMS
KINDS = ("model", "program")


@dataclasses.dataclass
class Row:
    name: str
    kind: str
    batch: int
    tolerance: float
    xla_ms: float | None = None
    pb_ms: float | None = None
    ratio: float | None = None  # XLA time / polyblocks time: above 1, polyblocks is faster
    ratio_spread: tuple[float, float] | None = None  # the lowest and highest ratio of one round
    max_rel_error: float | None = None
    correct: bool | None = None
    xla_compile_s: float | None = None
    pb_compile_s: float | None = None
    failed_op: str = ""
    error: str = ""


def compile_and_check(workload: Workload, batch: int, full: bool
                      ) -> tuple[Row, runner.Compiled | None, runner.Compiled | None]:
    """The row's compile times, error and verdict, with the executables that ran; a failure
    is the row's error, and the side that failed (polyblocks, unless the build or XLA did)
    is returned as None."""
    row = Row(workload.name, workload.kind, batch, workload.tolerance)
    xla = pbc = None
    try:
        fn, args = workload.build(batch, full)
        xla = runner.compile_xla(fn, *args)
        row.xla_compile_s = xla.compile_s
        expected = runner.flat_numpy(xla.call())
        pbc = runner.compile_polyblocks(fn, *args)
        row.pb_compile_s = pbc.compile_s
        row.correct, row.max_rel_error = runner.matches(runner.flat_numpy(pbc.call()), expected, workload.tolerance)
    except Exception as e:  # noqa: BLE001 (a failing workload is a row of the table, not a crash)
        row.failed_op, row.error = runner.failure(e)
        pbc = None
    return row, xla, pbc


# Timed calls per median: as many as fit in _MEDIAN_S, at least 3 and at most --repeat, so
# that a 0.3 s model costs seconds, not a minute, and a 0.1 ms program gets all --repeat.
_MEDIAN_S = 0.25


def _repeats(cap: int, *sides: runner.Compiled) -> int:
    slowest = 0.0
    for compiled in sides:
        start = time.perf_counter()
        compiled.call()
        slowest = max(slowest, time.perf_counter() - start)
    return max(3, min(cap, int(_MEDIAN_S / slowest)))


def time_row(row: Row, xla: runner.Compiled | None, pbc: runner.Compiled | None, repeat: int) -> None:
    """Both sides' latencies and the ratio; XLA's alone where polyblocks failed."""
    try:
        if pbc is None:
            if xla is not None:
                row.xla_ms = 1e3 * runner.median_latency(xla, _repeats(repeat, xla))
            return
        paired = runner.paired_latency(xla, pbc, _repeats(repeat, xla, pbc))
        row.xla_ms, row.pb_ms, row.ratio = 1e3 * paired.xla_s, 1e3 * paired.pb_s, paired.xla_s / paired.pb_s
        row.ratio_spread = paired.ratio_spread()
    except Exception as e:  # noqa: BLE001 (an XLA failure too is a row's error)
        row.failed_op, row.error = runner.failure(e)


def measure(workload: Workload, batch: int, full: bool, repeat: int) -> Row:
    row, xla, pbc = compile_and_check(workload, batch, full)
    if xla is not None:
        time_row(row, xla, pbc, repeat)
    del xla, pbc
    gc.collect()  # the executables' buffers, before the next workload's are allocated
    return row


# Spins on one core until killed, or until the process that started it has gone (then it
# is reparented), so that no spinner outlives a run however the run ends.
_SPINNER = """
import os
os.sched_setaffinity(0, {%d})
parent = os.getppid()
while os.getppid() == parent:
    for _ in range(1_000_000):
        pass
"""


@contextlib.contextmanager
def busy_core() -> Iterator[tuple[int, int]]:
    """One core (the last this process may run on) kept busy by a single-threaded spinning
    process pinned to it, for the duration of the block; yields (the core, the spinner's pid)."""
    core = max(os.sched_getaffinity(0))
    spinner = subprocess.Popen([sys.executable, "-c", _SPINNER % core])
    try:
        yield core, spinner.pid
    finally:
        spinner.kill()
        spinner.wait()


def geomean(rows: list[Row], kind: str) -> float | None:
    ratios = [r.ratio for r in rows if r.kind == kind and r.ratio]
    return math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None


def summary(rows: list[Row]) -> str:
    parts = []
    for kind in KINDS:
        ran = [r for r in rows if r.kind == kind and r.ratio]
        if ran:
            parts.append(f"{kind}s: geomean {geomean(rows, kind):.2f}x over {len(ran)}, "
                         f"{sum(r.ratio < 1 for r in ran)} below 1")
    parts.append(f"correct {sum(bool(r.correct) for r in rows)}/{len(rows)}")
    for label, names in (("wrong", [r.name for r in rows if r.correct is False]),
                         ("failed", [r.name for r in rows if r.error])):
        if names:
            parts.append(f"{label}: {', '.join(names)}")
    return "; ".join(parts)


TABLE_HEAD = ("| workload | kind | XLA ms | polyblocks ms | ratio | rounds' ratios | max rel err | tolerance | correct "
              "| XLA compile s | pb compile s | error |\n|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|")


def table_row(r: Row) -> str:
    def number(value: float | None, spec: str) -> str:
        return "" if value is None else format(value, spec)
    correct = "" if r.correct is None else "yes" if r.correct else "NO"
    spread = "" if r.ratio_spread is None else f"{r.ratio_spread[0]:.2f}-{r.ratio_spread[1]:.2f}"
    error = f"{r.failed_op and f'`{r.failed_op}` '}{r.error}".replace("|", "\\|").replace("\n", " ")
    return (f"| {r.name} | {r.kind} | {number(r.xla_ms, '.3f')} | {number(r.pb_ms, '.3f')} | "
            f"{number(r.ratio, '.2f')} | {spread} | {number(r.max_rel_error, '.1e')} | {r.tolerance:g} | {correct} | "
            f"{number(r.xla_compile_s, '.2f')} | {number(r.pb_compile_s, '.2f')} | {error} |")


def markdown(report: dict, tables: dict[int, list[Row]]) -> str:
    sizes = "the issue's sizes (--full)" if report["full"] else "default sizes"
    busy = f", core {report['busy_core']} kept busy by a pinned spinning process" if report["busy"] else ""
    lines = [f"# Benchmark zoo: XLA CPU and polyblocks ({report['date']})", "",
             f"{report['machine']} ({report['cpu']}, {report['cores']} cores), commit {report['commit']}, "
             f"{sizes}{busy}; flags `{report['flags'] or '(default)'}`. Load average (1, 5, 15 min) "
             f"{report['load_average_start']} at the start, {report['load_average']} at the end; "
             f"{report['elapsed_s'] / 60:.1f} minutes.", "",
             f"Latency: each side's best of {report['rounds']} medians of up to {report['repeat']} calls; "
             "ratio = XLA ms / polyblocks ms (above 1: polyblocks is faster); rounds' ratios: the lowest "
             "and highest ratio of one round (the sides take turns). Max rel err: "
             "max |polyblocks - XLA| / max |XLA| per output; integer outputs must be equal. "
             "Generated by `python bench/zoo_bench.py`.", ""]
    for batch, rows in tables.items():
        lines += [f"## Batch {batch}", "", summary(rows), "", TABLE_HEAD, *map(table_row, rows), ""]
    return "\n".join(lines)


def write_results(report: dict, tables: dict[int, list[Row]], save: bool, stem: str) -> Path:
    path = results_files.folder(save) / f"{stem}.json"
    report = {**report, "batches": {str(b): {"geomean_models": geomean(rows, "model"),
                                             "geomean_programs": geomean(rows, "program"),
                                             "summary": summary(rows),
                                             "rows": [dataclasses.asdict(r) for r in rows]}
                                    for b, rows in tables.items()}}
    path.write_text(json.dumps(report, indent=1) + "\n")
    path.with_suffix(".md").write_text(markdown(report, tables))
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", default="1,8", help="comma-separated batch sizes")
    parser.add_argument("--full", action="store_true", help="the issue's sizes where they differ from the defaults")
    parser.add_argument("--busy", action="store_true",
                        help="keep the last core busy with a pinned single-threaded spinning process")
    parser.add_argument("--only", default="", help="comma-separated workloads (default: all)")
    parser.add_argument("--kind", choices=KINDS, help="only models or only programs")
    parser.add_argument("--repeat", type=int, default=20, help="most timed calls per median")
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    results_files.add_save_argument(parser)
    args = parser.parse_args(argv)
    known = {w.name: w for w in WORKLOADS}
    unknown = {n for n in args.only.split(",") if n} - set(known)
    if unknown:
        parser.error(f"unknown workloads: {', '.join(sorted(unknown))}")
    wanted = {n for n in args.only.split(",") if n}
    args.workloads = [w for w in WORKLOADS if (not wanted or w.name in wanted) and args.kind in (None, w.kind)]
    args.batch = [int(b) for b in args.batch.split(",") if b]
    # A subset is written under its own name, so that it never replaces a whole run's file.
    args.stem = "-".join(["zoo", results_files.machine_slug()] + ["full"] * args.full + ["busy"] * args.busy
                         + ["partial"] * (len(args.workloads) < len(WORKLOADS) or args.batch != [1, 8]))
    return args


def run(args: argparse.Namespace, busy_core_number: int | None) -> tuple[dict, dict[int, list[Row]]]:
    report = {**results_files.provenance(), "full": args.full, "busy": args.busy, "busy_core": busy_core_number,
              "repeat": args.repeat, "rounds": runner.ROUNDS, "load_average_start": results_files.load_average()}
    start, tables = time.perf_counter(), {}
    for batch in args.batch:
        print(f"\nbatch {batch}\n{TABLE_HEAD}", flush=True)
        tables[batch] = []
        for workload in args.workloads:
            tables[batch].append(measure(workload, batch, args.full, args.repeat))
            print(table_row(tables[batch][-1]), flush=True)
        print(summary(tables[batch]), flush=True)
    report["elapsed_s"] = time.perf_counter() - start
    report["load_average"] = results_files.load_average()
    return report, tables


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.list:
        for w in args.workloads:
            print(f"{w.name:<24} {w.kind:<8} tolerance {w.tolerance:g}  {w.note}")
        return
    print(f"{results_files.machine_slug()} ({results_files.cpu_name()}, {results_files.cores()} cores), "
          f"{len(args.workloads)} workloads, batch {args.batch}, {'--full' if args.full else 'default'} sizes"
          f"{', one core busy' if args.busy else ''}; load average {results_files.load_average()}")
    with busy_core() if args.busy else contextlib.nullcontext((None, None)) as (core, _):
        report, tables = run(args, core)
    print(f"\nwrote {write_results(report, tables, args.save, args.stem)} and its .md")


if __name__ == "__main__":
    main()
