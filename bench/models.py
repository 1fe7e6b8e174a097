"""ResNet-18, ViT-Tiny and UNet on XLA CPU and on polyblocks, side by side in one process.

For each model and batch size: compile time (each side's fastest of ``--compiles``, caches
emptied before each), median latency after warm-up, maximum
relative error against XLA, and speed ratio (XLA time / polyblocks time). Prints a
table, writes <machine>.json and a PNG chart beside it (bench/results_files.py says where;
``--save``: into bench/results/). ``--train`` times a
training step instead of inference: the loss's gradients and an SGD update of the
parameters (``flax_models.train_step``), written to <machine>-train.json.

    python bench/models.py                  # full sizes, batch 1 and 8
    python bench/models.py --quick          # small configurations, under a minute
    python bench/models.py --models vit_tiny --batch 8 --repeat 50
    python bench/models.py --train --batch 8
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):  # run as a script: make `bench` importable from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax.numpy as jnp  # noqa: E402

from bench import chart, flax_models, results_files, runner  # noqa: E402

@dataclasses.dataclass
class Row:
    model: str
    batch: int
    xla_compile_s: float
    xla_ms: float
    pb_compile_s: float | None = None
    pb_ms: float | None = None
    max_rel_error: float | None = None
    speedup: float | None = None   # XLA time / polyblocks time: > 1 means polyblocks is faster
    via: str = ""                  # how polyblocks ran: "pjrt" (jax.jit) or "compile"
    failed_op: str = ""
    error: str = ""
    xla_ms_rounds: list[float] = dataclasses.field(default_factory=list)  # each round's median
    pb_ms_rounds: list[float] = dataclasses.field(default_factory=list)


def measure(name: str, batch: int, small: bool, repeat: int, compiles: int = 1, dtype: str = "float32",
            train: bool = False) -> Row:
    """One row; each side's compile time is the least of ``compiles`` compiles."""
    case = flax_models.make(name, batch, small, dtype=jnp.dtype(dtype))
    fn, args = _program(case, train)
    xla = runner.compile_xla(fn, *args, compiles=compiles)
    expected = runner.flat_numpy(xla.call())
    row = Row(name, batch, xla.compile_s, math.nan)
    try:
        pbc = runner.compile_polyblocks(fn, *args, compiles=compiles)
        row.via, row.pb_compile_s = pbc.via, pbc.compile_s
        row.max_rel_error = runner.max_relative_error(runner.flat_numpy(pbc.call()), expected)
        paired = runner.paired_latency(xla, pbc, repeat)
        row.xla_ms, row.pb_ms = 1e3 * paired.xla_s, 1e3 * paired.pb_s
        row.xla_ms_rounds, row.pb_ms_rounds = [1e3 * t for t in paired.xla_rounds], [1e3 * t for t in paired.pb_rounds]
    except Exception as e:  # noqa: BLE001 (a failing model is a row of the table, not a crash)
        row.failed_op, row.error = runner.failure(e)
        row.xla_ms = 1e3 * runner.median_latency(xla, repeat)
    if row.pb_ms:
        row.speedup = row.xla_ms / row.pb_ms
    return row


def _program(case: flax_models.ModelCase, train: bool) -> tuple[Callable, tuple]:
    """What a row times: the model's inference, or one training step on a random target."""
    if train:
        return flax_models.train_step(case), (case.params, case.input, flax_models.training_target(case))
    return case.apply, (case.params, case.input)


# Largest norm-wise relative error (max |pb - xla| / max |xla|) a correct result shows: f32
# results differ from XLA's by the order of summation; bf16 ones by a rounding of 2^-8.
TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2}


def table_head() -> list[str]:
    head = (f"{'model':<10} {'batch':>5} {'xla compile s':>13} {'xla ms':>9} {'pb compile s':>12} "
            f"{'pb ms':>9} {'max rel err':>11} {'correct':>7} {'speedup':>8}")
    return [head, "-" * len(head)]


def format_row(r: Row, tolerance: float) -> str:
    left = f"{r.model:<10} {r.batch:>5} {r.xla_compile_s:>13.2f} {r.xla_ms:>9.2f} "
    if r.pb_ms is None:
        stage = f"(compiled in {r.pb_compile_s:.2f} s) " if r.pb_compile_s is not None else ""
        return left + f"FAILED {stage}{r.failed_op or ''}: {r.error}"
    verdict = "yes" if r.max_rel_error <= tolerance else "NO"
    return left + f"{r.pb_compile_s:>12.2f} {r.pb_ms:>9.2f} {r.max_rel_error:>11.2e} {verdict:>7} {r.speedup:>7.2f}x"


def summary(rows: list[Row], tolerance: float) -> str:
    """What the table says: correctness against the tolerance, the speedups' meaning and geomean."""
    ran = [r for r in rows if r.pb_ms is not None]
    correct = sum(r.max_rel_error <= tolerance for r in ran)
    lines = [f"correct: {correct} of {len(rows)} rows within a relative error of {tolerance:g} of XLA's results"
             + (f" ({len(rows) - len(ran)} failed to run)" if len(ran) < len(rows) else "")]
    if ran:
        geomean = math.exp(sum(math.log(r.speedup) for r in ran) / len(ran))
        lines.append(f"speedup = XLA time / polyblocks time (above 1: polyblocks is faster); geomean {geomean:.2f}x")
    return "\n".join(lines)


def write_results(rows: list[Row], args: argparse.Namespace) -> Path:
    stem = results_files.machine_slug() + ("-quick" if args.quick else "") + ("" if args.dtype == "float32" else f"-{args.dtype}") \
        + ("-train" if args.train else "")
    report = {
        **results_files.provenance(), "quick": args.quick, "dtype": args.dtype, "train": args.train, "repeat": args.repeat, "compiles": args.compiles,
        "configs": {name: dataclasses.asdict(flax_models.CONFIGS[name][2 if args.quick else 1])
                    for name in args.models},
        "rows": [dataclasses.asdict(r) for r in rows],
    }
    path = results_files.folder(args.save) / f"{stem}.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    chart.plot(report, path.with_suffix(".png"))
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small configurations (tests' sizes)")
    parser.add_argument("--models", default=",".join(flax_models.MODEL_NAMES),
                        help="comma-separated subset of " + ", ".join(flax_models.MODEL_NAMES))
    parser.add_argument("--batch", default="1,8", help="comma-separated batch sizes")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="weights and input (bfloat16: the models in bf16 throughout)")
    parser.add_argument("--train", action="store_true",
                        help="time a training step (gradients and an SGD update), not inference")
    parser.add_argument("--repeat", type=int, default=None,
                        help="timed calls per measurement (default 20, 5 with --quick)")
    parser.add_argument("--compiles", type=int, default=None,
                        help="compiles per side, the fastest reported (default 3, 1 with --quick; "
                             "one compile's time varies by 10-30%%)")
    results_files.add_save_argument(parser)
    args = parser.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    unknown = set(args.models) - set(flax_models.MODEL_NAMES)
    if unknown:
        parser.error(f"unknown models: {', '.join(sorted(unknown))}")
    args.batch = [int(b) for b in args.batch.split(",") if b]
    args.repeat = args.repeat or (5 if args.quick else 20)
    args.compiles = args.compiles or (1 if args.quick else 3)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    tolerance = TOLERANCE[args.dtype] * (10 if args.train else 1)  # gradients: a longer chain of roundings
    print(f"{results_files.machine_slug()} ({results_files.cpu_name()}, {results_files.cores()} cores), "
          f"{'small' if args.quick else 'full'} {args.dtype} configs{', training steps' if args.train else ''}, "
          f"best of {runner.ROUNDS} medians of {args.repeat}, compile times the best of {args.compiles}\n")
    print("\n".join(table_head()), flush=True)
    rows = []
    for name in args.models:
        for batch in args.batch:
            rows.append(measure(name, batch, args.quick, args.repeat, args.compiles, args.dtype, args.train))
            print(format_row(rows[-1], tolerance), flush=True)
    print(f"\n{summary(rows, tolerance)}")
    print(f"wrote {write_results(rows, args)}")


if __name__ == "__main__":
    main()
