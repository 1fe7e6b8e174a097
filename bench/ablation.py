"""Ablation: each optimization switched off in turn, per model, against all of them on.

Rows: the Flax models of bench/models.py; columns: all on, then no-<name> for every
optimization ``polyblocks_jax.Options`` can switch off; cells: median latency and the
slowdown against all on (the style of the PolyBlocks paper's Table 3). Each configuration
runs in a fresh process with ``POLYBLOCKS_FLAGS`` set (JAX caches compiled programs by
their text, so a flag changed in-process would not recompile), measured by
``bench.models.measure``, XLA beside it. Writes ablation-<machine>[-quick].json
and a markdown table beside it.

    python bench/ablation.py                 # small model configurations (default)
    python bench/ablation.py --full          # the README's sizes: minutes per configuration
    python bench/ablation.py --models resnet18 --configs no-fusion,no-vectorize
    python bench/ablation.py --full --configs all-on,no-prefetch --tag prefetch   # a file of its own
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench` importable from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import polyblocks_jax as pb  # noqa: E402
from bench import flax_models, models, results_files  # noqa: E402

ALL_ON = "all-on"


def configurations() -> list[str]:
    return [ALL_ON] + [f"no-{name}" for name in pb.Options.switches()]


def run_configuration(config: str, args: argparse.Namespace) -> list[dict]:
    """models.measure for every model in a fresh process with the configuration's flags."""
    env = dict(os.environ, POLYBLOCKS_FLAGS="" if config == ALL_ON else config)
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--models", ",".join(args.models),
               "--batch", str(args.batch), "--repeat", str(args.repeat)] + (["--full"] if args.full else [])
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{config}: worker failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def worker(args: argparse.Namespace) -> None:
    rows = [models.measure(name, args.batch, not args.full, args.repeat) for name in args.models]
    print(json.dumps([dataclasses.asdict(r) for r in rows]))


def format_table(results: dict[str, list[dict]], model_names: list[str]) -> str:
    """Markdown: one row per model, one column per configuration."""
    configs = list(results)
    lines = ["| model | " + " | ".join(configs) + " |", "| --- |" + " --- |" * len(configs)]
    for i, name in enumerate(model_names):
        base = results[ALL_ON][i]["pb_ms"] if ALL_ON in results else None
        cells = []
        for config in configs:
            row = results[config][i]
            if row["pb_ms"] is None:
                cells.append(f"failed ({row['failed_op'] or row['error'][:40]})")
            elif base and config != ALL_ON:
                cells.append(f"{row['pb_ms']:.1f} ms ({row['pb_ms'] / base:.2f}x)")
            else:
                cells.append(f"{row['pb_ms']:.1f} ms")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    xla = [f"{results[configs[0]][i]['xla_ms']:.1f}" for i in range(len(model_names))]
    lines.append("")
    lines.append("XLA CPU ms (same runs as all on): " + ", ".join(f"{n} {x}" for n, x in zip(model_names, xla)))
    return "\n".join(lines)


def write_results(results: dict[str, list[dict]], table: str, args: argparse.Namespace) -> Path:
    stem = f"ablation-{results_files.machine_slug()}" + ("" if args.full else "-quick") + (f"-{args.tag}" if args.tag else "")
    report = {
        **results_files.provenance(), "quick": not args.full,
        "batch": args.batch, "repeat": args.repeat, "results": results,
    }
    path = results_files.folder(args.save) / f"{stem}.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    path.with_suffix(".md").write_text(
        f"Ablation on {report['machine']} ({report['cpu']}, {report['cores']} cores), batch "
        f"{args.batch}, {'full' if args.full else 'small'} configs, median of {args.repeat}; "
        f"slowdown against all on in parentheses.\n\n{table}\n")
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the README's model sizes (slow)")
    parser.add_argument("--models", default=",".join(flax_models.MODEL_NAMES))
    parser.add_argument("--configs", default=",".join(configurations()),
                        help="comma-separated subset of " + ", ".join(configurations()))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=None, help="timed calls (default 20, 5 small)")
    parser.add_argument("--tag", default="", help="suffix of the results file (a run of some configurations)")
    results_files.add_save_argument(parser)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.configs = [c for c in args.configs.split(",") if c]
    unknown = (set(args.models) - set(flax_models.MODEL_NAMES)) | (set(args.configs) - set(configurations()))
    if unknown:
        parser.error(f"unknown models or configurations: {', '.join(sorted(unknown))}")
    args.repeat = args.repeat or (20 if args.full else 5)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    results = {}
    for config in args.configs:
        results[config] = run_configuration(config, args)
        print(f"{config}: " + ", ".join(f"{r['model']} {r['pb_ms'] or float('nan'):.1f} ms"
                                        for r in results[config]), flush=True)
    table = format_table(results, args.models)
    print(f"\n{results_files.machine_slug()} ({results_files.cpu_name()}, {results_files.cores()} cores), batch {args.batch}\n{table}")
    print(f"wrote {write_results(results, table, args)}")


if __name__ == "__main__":
    main()
