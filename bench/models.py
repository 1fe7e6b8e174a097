"""ResNet-18, ViT-Tiny and UNet on XLA CPU and on polyblocks, side by side in one process.

For each model and batch size: compile time (each side's fastest of ``--compiles``, caches
emptied before each), median latency after warm-up, maximum
relative error against XLA, and speed ratio (XLA time / polyblocks time). Prints a
table, writes bench/results/<machine>.json and a PNG chart beside it. ``--train`` times a
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
import datetime
import json
import math
import os
import platform
import re
import sys
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):  # run as a script: make `bench` importable from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from bench import chart, flax_models, runner  # noqa: E402
from polyblocks_jax.cpu import target  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


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
        xla_s, pb_s = runner.paired_latency(xla, pbc, repeat)
        row.xla_ms, row.pb_ms = 1e3 * xla_s, 1e3 * pb_s
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


def format_table(rows: list[Row]) -> str:
    head = (f"{'model':<10} {'batch':>5} {'xla compile s':>13} {'xla ms':>9} {'pb compile s':>12} "
            f"{'pb ms':>9} {'max rel err':>11} {'speedup':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        left = f"{r.model:<10} {r.batch:>5} {r.xla_compile_s:>13.2f} {r.xla_ms:>9.2f} "
        if r.pb_ms is None:
            stage = f"(compiled in {r.pb_compile_s:.2f} s) " if r.pb_compile_s is not None else ""
            lines.append(left + f"FAILED {stage}{r.failed_op or ''}: {r.error}")
        else:
            lines.append(left + f"{r.pb_compile_s:>12.2f} {r.pb_ms:>9.2f} {r.max_rel_error:>11.2e} "
                         f"{r.speedup:>7.2f}x")
    return "\n".join(lines)


def _cpuinfo(field: str) -> str | None:
    """The first value of ``field`` in /proc/cpuinfo, or None."""
    try:
        with open("/proc/cpuinfo") as f:
            match = re.search(rf"^{field}\s*:\s*(.+)$", f.read(), re.M)
    except OSError:
        return None
    return match.group(1).strip() if match else None


def cpu_name() -> str:
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def machine_slug() -> str:
    """A short name for the host: first two words of the CPU model, its family, the core
    count and the vector width (a virtual machine's "AMD EPYC" covers Zen 3, 4 and 5: Zen 5
    is family 26 and issues twice Zen 4's AVX-512 FMAs)."""
    words = re.sub(r"\((R|TM|tm)\)", "", cpu_name()).lower().split()
    words = [re.sub(r"[^a-z0-9]+", "", w) for w in words]
    family = _cpuinfo("cpu family")
    return "-".join([w for w in words if w][:2] + ([f"fam{family}"] if family else [])
                    + [f"{cores()}c", target.host().vector_isa])


def write_results(rows: list[Row], args: argparse.Namespace) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = machine_slug() + ("-quick" if args.quick else "") + ("" if args.dtype == "float32" else f"-{args.dtype}") \
        + ("-train" if args.train else "")
    report = {
        "machine": machine_slug(), "cpu": cpu_name(), "cores": cores(),
        "jax": jax.__version__, "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "quick": args.quick, "dtype": args.dtype, "train": args.train, "repeat": args.repeat, "compiles": args.compiles,
        "configs": {name: dataclasses.asdict(flax_models.CONFIGS[name][2 if args.quick else 1])
                    for name in args.models},
        "rows": [dataclasses.asdict(r) for r in rows],
    }
    path = RESULTS / f"{stem}.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    chart.plot(report, RESULTS / f"{stem}.png")
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
    rows = []
    for name in args.models:
        for batch in args.batch:
            rows.append(measure(name, batch, args.quick, args.repeat, args.compiles, args.dtype, args.train))
            print(format_table(rows[-1:]).splitlines()[-1], flush=True)
    print(f"\n{machine_slug()} ({cpu_name()}, {cores()} cores), "
          f"{'small' if args.quick else 'full'} {args.dtype} configs{', training steps' if args.train else ''}, best of {runner.ROUNDS} medians of {args.repeat}, "
          f"compile times the best of {args.compiles}")
    print(format_table(rows))
    print(f"wrote {write_results(rows, args)}")


if __name__ == "__main__":
    main()
