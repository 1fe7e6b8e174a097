"""Single kernels on XLA CPU and on polyblocks, side by side in one process.

f32 matmuls, a 3x3 and a 1x1 NHWC convolution, softmax attention and layernorm+GELU(erf):
median latency after warm-up, maximum relative error against XLA, and the ratio
XLA time / polyblocks time (> 1: polyblocks is faster). Prints a table and writes
ops-<machine>.json (bench/results_files.py says where; ``--save``: bench/results/).

    python bench/ops.py                    # the issue's sizes
    python bench/ops.py --quick            # small sizes, seconds
    python bench/ops.py --ops conv3x3,attention --repeat 20
    python bench/ops.py --save             # into bench/results/, the committed figures
    POLYBLOCKS_FLAGS=no-vectorize python bench/ops.py --tag no-vectorize
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import sys
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):  # run as a script: make `bench` importable from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from bench import chart, results_files, runner  # noqa: E402



@dataclasses.dataclass(frozen=True)
class Case:
    fn: Callable
    shapes: tuple[tuple[int, ...], ...]  # f32 arguments
    flops: float                         # useful floating-point operations, for GFLOP/s


def matmul(n: int) -> Case:
    return Case(lambda a, b: a @ b, ((n, n), (n, n)), 2.0 * n ** 3)


def conv(batch: int, size: int, cin: int, cout: int, window: int) -> Case:
    def fn(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))
    flops = 2.0 * batch * size * size * cin * cout * window * window
    return Case(fn, ((batch, size, size, cin), (window, window, cin, cout)), flops)


def attention(batch: int, heads: int, seq: int, dim: int) -> Case:
    def fn(q, k, v):
        scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(dim)
        return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)
    shape = (batch, heads, seq, dim)
    return Case(fn, (shape, shape, shape), 4.0 * batch * heads * seq * seq * dim)


def layernorm_gelu(batch: int, seq: int, dim: int) -> Case:
    def fn(x, scale, bias):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        y = (x - mean) * jax.lax.rsqrt(var + 1e-6) * scale + bias
        return jax.nn.gelu(y, approximate=False)
    return Case(fn, ((batch, seq, dim), (dim,), (dim,)), 20.0 * batch * seq * dim)


def cases(quick: bool) -> dict[str, Case]:
    if quick:
        return {"matmul128": matmul(128), "matmul256": matmul(256),
                "conv3x3": conv(2, 14, 32, 32, 3), "conv1x1": conv(2, 14, 32, 64, 1),
                "attention": attention(1, 2, 128, 64), "layernorm_gelu": layernorm_gelu(2, 64, 256)}
    return {"matmul512": matmul(512), "matmul1024": matmul(1024), "matmul2048": matmul(2048),
            "conv3x3": conv(8, 56, 64, 64, 3), "conv1x1": conv(8, 56, 64, 256, 1),
            "attention": attention(1, 8, 512, 64), "layernorm_gelu": layernorm_gelu(8, 512, 768)}


# The matmul sweep: every type pair the issue names, square from 16 up, rectangular, and
# skinny (decode-shaped: a few rows against a large weight).
SWEEP_TYPES = {  # name -> (operand dtype, result dtype)
    "f32": (jnp.float32, jnp.float32), "bf16": (jnp.bfloat16, jnp.bfloat16),
    "bf16_f32": (jnp.bfloat16, jnp.float32), "int8_i32": (jnp.int8, jnp.int32)}
SWEEP_SQUARE = (16, 64, 256, 1024, 2048, 4096, 8192)


def sweep_shapes(largest: int) -> list[tuple[int, int, int]]:
    """(M, K, N) of the sweep up to ``largest``."""
    square = [(n, n, n) for n in SWEEP_SQUARE if n <= largest]
    big = min(largest, 4096)
    rectangular = [(big // 4, big, big), (big, big // 4, big), (big, big, big // 4)]
    skinny = [(m, big, big) for m in (1, 4, 16)]
    return square + rectangular + skinny


def sweep_cases(largest: int) -> dict[str, tuple[Callable, list, float]]:
    """name -> (fn, arguments, flops) for every type pair and shape of the sweep."""
    rng = np.random.default_rng(0)
    out = {}
    for tname, (operand, result) in SWEEP_TYPES.items():
        for m, k, n in sweep_shapes(largest):
            if operand == jnp.int8:
                a, b = (rng.integers(-8, 8, s).astype(np.int8) for s in ((m, k), (k, n)))
            else:
                a, b = (rng.standard_normal(s).astype(operand) for s in ((m, k), (k, n)))
            fn = functools.partial(jnp.matmul, preferred_element_type=result)
            out[f"{tname}_{m}x{k}x{n}"] = (fn, [a, b], 2.0 * m * k * n)
    return out


def peak_rates(rows: list["Row"]) -> dict[str, float]:
    """The best GFLOP/s measured per type pair (either side): the machine's peak as this
    run saw it, which the table's fractions are of."""
    peaks: dict[str, float] = {}
    for r in rows:
        kind = r.op.rsplit("_", 1)[0]
        peaks[kind] = max(peaks.get(kind, 0.0), r.xla_gflops or 0.0, r.pb_gflops or 0.0)
    return peaks


@dataclasses.dataclass
class Row:
    op: str
    xla_ms: float
    pb_ms: float | None = None
    xla_gflops: float | None = None  # None where the op's FLOPs are not counted
    pb_gflops: float | None = None
    pb_compile_s: float | None = None
    max_rel_error: float | None = None
    ratio: float | None = None   # XLA time / polyblocks time: > 1 means polyblocks is faster
    error: str = ""
    xla_ms_rounds: list[float] = dataclasses.field(default_factory=list)  # each round's median
    pb_ms_rounds: list[float] = dataclasses.field(default_factory=list)


def measure(name: str, case: Case, repeat: int) -> Row:
    rng = np.random.default_rng(0)
    return measure_call(name, case.fn, [rng.standard_normal(s, np.float32) for s in case.shapes],
                        repeat, case.flops)


def measure_call(name: str, fn: Callable, args: list, repeat: int, flops: float | None = None) -> Row:
    """XLA and polyblocks on ``fn(*args)``: latencies, the error, the ratio (GFLOP/s with ``flops``)."""
    xla = runner.compile_xla(fn, *args)
    expected = runner.flat_numpy(xla.call())
    row = Row(name, math.nan)
    try:
        pbc = runner.compile_polyblocks(fn, *args)
        row.pb_compile_s = pbc.compile_s
        row.max_rel_error = runner.max_relative_error(runner.flat_numpy(pbc.call()), expected)
        paired = runner.paired_latency(xla, pbc, repeat)
        row.xla_ms, row.pb_ms = 1e3 * paired.xla_s, 1e3 * paired.pb_s
        row.xla_ms_rounds, row.pb_ms_rounds = [1e3 * t for t in paired.xla_rounds], [1e3 * t for t in paired.pb_rounds]
        row.pb_gflops = flops and flops / row.pb_ms / 1e6
        row.ratio = row.xla_ms / row.pb_ms
    except Exception as e:  # noqa: BLE001 (a failing op is a row of the table, not a crash)
        row.error = " ".join(runner.failure(e))
        row.xla_ms = 1e3 * runner.median_latency(xla, repeat)
    row.xla_gflops = flops and flops / row.xla_ms / 1e6
    return row


def format_table(rows: list[Row]) -> str:
    width = max([15, *(len(r.op) for r in rows)])
    head = (f"{'op':<{width}} {'xla ms':>9} {'GFLOP/s':>8} {'pb ms':>9} {'GFLOP/s':>8} "
            f"{'compile s':>9} {'max rel err':>11} {'xla/pb':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        left = f"{r.op:<{width}} {r.xla_ms:>9.3f} {_gflops(r.xla_gflops)} "
        if r.pb_ms is None:
            lines.append(left + f"FAILED: {r.error}")
        else:
            lines.append(left + f"{r.pb_ms:>9.3f} {_gflops(r.pb_gflops)} {r.pb_compile_s:>9.2f} "
                         f"{r.max_rel_error:>11.2e} {r.ratio:>6.2f}x")
    return "\n".join(lines)


def _gflops(value: float | None) -> str:
    return f"{value:>8.1f}" if value else f"{'-':>8}"


def write_results(rows: list[Row], args: argparse.Namespace, stem: str = "ops",
                  plot: Callable[[dict, Path], None] = chart.plot) -> Path:
    """<stem>-<machine>[-quick][-tag].json and its chart drawn by ``plot``, where
    results_files puts them."""
    suffix = ("-quick" if args.quick else "") + (f"-{args.tag}" if args.tag else "")
    report = {
        **results_files.provenance(), "quick": args.quick, "repeat": args.repeat,
        "rows": [dataclasses.asdict(r) for r in rows],
    }
    path = results_files.folder(args.save) / f"{stem}-{results_files.machine_slug()}{suffix}.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    plot(report, path.with_suffix(".png"))
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes")
    parser.add_argument("--ops", default="", help="comma-separated subset of the ops (default: all)")
    parser.add_argument("--repeat", type=int, default=None, help="timed calls (default 10, 5 with --quick)")
    parser.add_argument("--tag", default="", help="suffix of the results file, e.g. no-vectorize")
    parser.add_argument("--sweep", type=int, nargs="?", const=4096, default=0, metavar="LARGEST",
                        help="the matmul sweep instead (f32, bf16, bf16->f32, int8->int32; square from 16 to "
                             "LARGEST, default 4096 (8192 takes minutes a row), rectangular and skinny)")
    results_files.add_save_argument(parser)
    args = parser.parse_args(argv)
    args.repeat = args.repeat or (5 if args.quick else 10)
    if args.sweep:
        args.ops = [o for o in args.ops.split(",") if o]
        return args
    known = cases(args.quick)
    args.ops = [o for o in args.ops.split(",") if o] or list(known)
    unknown = set(args.ops) - set(known)
    if unknown:
        parser.error(f"unknown ops: {', '.join(sorted(unknown))}; known: {', '.join(known)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.sweep:
        return sweep(args)
    known = cases(args.quick)
    rows = []
    for name in args.ops:
        rows.append(measure(name, known[name], args.repeat))
        print(format_table(rows[-1:]).splitlines()[-1], flush=True)
    print(f"\n{results_files.machine_slug()} ({results_files.cpu_name()}, {results_files.cores()} cores), "
          f"best of {runner.ROUNDS} medians of {args.repeat}, flags {os.environ.get('POLYBLOCKS_FLAGS', '') or '(default)'}")
    print(format_table(rows))
    print(f"wrote {write_results(rows, args)}")


def sweep(args: argparse.Namespace) -> None:
    rows = []
    for name, (fn, operands, flops) in sweep_cases(args.sweep).items():
        if args.ops and not any(name.startswith(o) for o in args.ops):
            continue
        repeat = max(2, min(args.repeat, int(2e10 / flops)))  # large sizes: fewer calls
        rows.append(measure_call(name, fn, operands, repeat, flops))
        print(format_table(rows[-1:]).splitlines()[-1], flush=True)
    peaks = peak_rates(rows)
    print(f"\n{results_files.machine_slug()} ({results_files.cpu_name()}, {results_files.cores()} cores), "
          f"best of {runner.ROUNDS} medians; fraction of the best GFLOP/s measured per type pair "
          f"({', '.join(f'{k} {v:.0f}' for k, v in peaks.items())}):")
    for r in rows:
        peak = peaks[r.op.rsplit("_", 1)[0]]
        share = f"{r.pb_gflops / peak:6.0%}" if r.pb_gflops and peak else "     -"
        print(f"  {r.op:<28} {share} of peak, {'%.2fx' % r.ratio if r.ratio else 'FAILED'} XLA")
    args.quick = False
    print(f"wrote {write_results(rows, args, stem='matmul-sweep')}")


if __name__ == "__main__":
    main()
