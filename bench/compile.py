"""Compile times, XLA CPU and polyblocks side by side: models cold and warm, small eager ops,
linear algebra.

Each model runs in a fresh process with an empty cache folder (``XDG_CACHE_HOME``): the
first batch size compiles cold, the next one warm (the object cache holds the kernels the
first compile made, as after a retrace for a new batch). The compile workers are started
before anything is timed (their start is reported on its own). The eager set: 40 distinct
jnp calls on 64x64 arrays, each the first call of its program on its device (tracing,
lowering, compiling and running, as a notebook cell meets them), then each program's
compile alone. The linear-algebra set: jnp.linalg and jax.scipy.linalg calls on small
matrices, each lowered for its platform (the decompositions lower differently there), each
compile cold and timed alone, in wall and in CPU seconds (this process's threads and the
linker it waits for: what a loaded machine does not inflate).
``python bench/compile.py [--quick] [--models resnet18,vit_tiny,unet]``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench` importable from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import results_files  # noqa: E402

MODELS = ("resnet18", "vit_tiny", "unet")

# One process per model: the cache folder, the workers and JAX's caches start empty.
_MODEL_PROCESS = """
import json, sys, time
import jax, jax.numpy as jnp, numpy as np
import polyblocks_jax as pb
from bench import flax_models, runner
name, small, batches = sys.argv[1], sys.argv[2] == "1", [int(b) for b in sys.argv[3].split(",")]
start = time.perf_counter()
pb.compile(jax.jit(lambda a: a + 1.0).trace(np.ones(4, np.float32)).lower(lowering_platforms=("cpu",)))
rows = [{"workers_s": time.perf_counter() - start}]
for batch in batches:
    case = flax_models.make(name, batch, small)
    xla = runner.compile_xla(case.apply, case.params, case.input).compile_s
    pbs = runner.compile_polyblocks(case.apply, case.params, case.input).compile_s
    rows.append({"batch": batch, "xla_s": xla, "pb_s": pbs})
print(json.dumps(rows))
"""

# The eager set: distinct programs, as a user's first session meets them.
EAGER_OPS = {
    "sin": "jnp.sin(x)", "cos": "jnp.cos(x)", "tan": "jnp.tan(x)", "exp": "jnp.exp(x)", "log": "jnp.log(jnp.abs(x))",
    "sqrt": "jnp.sqrt(jnp.abs(x))", "tanh": "jnp.tanh(x)", "abs": "jnp.abs(x)", "neg": "-x",
    "floor": "jnp.floor(x)", "round": "jnp.round(x)", "sign": "jnp.sign(x)", "square": "jnp.square(x)",
    "reciprocal": "1.0 / x", "sigmoid": "jax.nn.sigmoid(x)", "relu": "jax.nn.relu(x)", "gelu": "jax.nn.gelu(x)",
    "softplus": "jax.nn.softplus(x)", "erf": "jax.scipy.special.erf(x)", "add": "x + y", "sub": "x - y",
    "mul": "x * y", "div": "x / y", "maximum": "jnp.maximum(x, y)", "power": "jnp.abs(x) ** y",
    "arctan2": "jnp.arctan2(x, y)", "where": "jnp.where(x > y, x, y)", "sum": "jnp.sum(x, axis=0)",
    "max": "jnp.max(x, axis=1)", "mean": "jnp.mean(x)", "argmax": "jnp.argmax(x, axis=1)",
    "cumsum": "jnp.cumsum(x, axis=0)", "sort": "jnp.sort(x, axis=1)", "softmax": "jax.nn.softmax(x)",
    "logsumexp": "jax.nn.logsumexp(x, axis=1)", "transpose": "x.T + y", "concat": "jnp.concatenate([x, y])",
    "flip": "jnp.flip(x, 0)", "pad": "jnp.pad(x, 2)", "matmul": "x @ y",
}

_EAGER_PROCESS = """
import json, statistics, sys, time
import jax, jax.numpy as jnp, numpy as np
import polyblocks_jax as pb
from bench import compile as bench_compile
ops = bench_compile.EAGER_OPS
rng = np.random.default_rng(0)
x0, y0 = rng.standard_normal((64, 64), np.float32), rng.standard_normal((64, 64), np.float32)
pb.compile(jax.jit(lambda a: a + 1.0).trace(np.ones(4, np.float32)).lower(lowering_platforms=("cpu",)))
first = {"xla": 0.0, "polyblocks": 0.0}
for side in ("cpu", "polyblocks"):  # the first call of each op, on each device in turn
    device = jax.devices(side)[0]
    x, y = jax.device_put(x0, device), jax.device_put(y0, device)
    jax.block_until_ready(x + y)
    for expression in ops.values():
        start = time.perf_counter()
        jax.block_until_ready(eval(expression))
        first["xla" if side == "cpu" else side] += time.perf_counter() - start
compiles = {"xla": [], "polyblocks": []}
for expression in ops.values():
    fn = eval(f"lambda x, y: {expression}")
    lowered = jax.jit(fn).trace(x0, y0).lower(lowering_platforms=("cpu",))
    start = time.perf_counter()
    jax.jit(fn).lower(x0, y0).compile()
    compiles["xla"].append(time.perf_counter() - start)
    start = time.perf_counter()
    pb.compile(lowered, pb.Options.from_env().replace(object_cache=False))  # cold: no kernel seen before
    compiles["polyblocks"].append(time.perf_counter() - start)
print(json.dumps({"first_calls_s": first, "compile_median_s": {k: statistics.median(v) for k, v in compiles.items()},
                  "ops": len(ops)}))
"""

# The linear-algebra set: one call each, on matrices of the sizes JAX's linalg_test draws.
LINALG_OPS = {
    "cholesky 50x50 f64": ("jnp.linalg.cholesky", "spd(50, np.float64)"),
    "qr 8x8 c64": ("jnp.linalg.qr", "(normal(8, 8) + 1j * normal(8, 8)).astype(np.complex64)"),
    "eigh 8x8 f32": ("jnp.linalg.eigh", "spd(8, np.float32)"),
    "svd 5x7 f32": ("jnp.linalg.svd", "normal(5, 7)"),
    "lu 8x8 f32": ("jax.scipy.linalg.lu", "normal(8, 8)"),
    "lu 3x16x16 f64": ("jax.lax.linalg.lu", "normal(3, 16, 16).astype(np.float64)"),
    "inv 8x8 f64": ("jnp.linalg.inv", "normal(8, 8).astype(np.float64)"),
    "det 5x5 f32": ("jnp.linalg.det", "normal(5, 5)"),
    "lu jvp 10x10 f32": ("lambda a: jax.jvp(jax.scipy.linalg.lu, (a,), (a,))", "normal(10, 10)"),
}

_LINALG_PROCESS = """
import json, os, sys, time
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
import polyblocks_jax as pb
from bench import compile as bench_compile
rng = np.random.default_rng(0)
def normal(*shape):
    return rng.standard_normal(shape).astype(np.float32)
def spd(n, dtype):
    a = rng.standard_normal((n, n))
    return (a @ a.T + n * np.eye(n)).astype(dtype)
def cpu_s():
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system
def timed(compile_):
    wall, cpu = time.perf_counter(), cpu_s()
    compile_()
    return time.perf_counter() - wall, cpu_s() - cpu
options = pb.Options.from_env().replace(object_cache=False, in_process=True)  # cold; CPU time of this process
pb.compile(jax.jit(lambda a: a + 1.0).trace(np.ones(4, np.float32)).lower(lowering_platforms=("polyblocks",)), options)
rows = {}
for name, (fn, operand) in bench_compile.LINALG_OPS.items():
    fn, a = eval(fn), eval(operand)
    xla = timed(jax.jit(fn).trace(a).lower(lowering_platforms=("cpu",)).compile)
    lowered = jax.jit(fn).trace(a).lower(lowering_platforms=("polyblocks",))
    rows[name] = {"xla": xla, "polyblocks": timed(lambda: pb.compile(lowered, options))}
print(json.dumps(rows))
"""


def _run(script: str, args: list[str], cache: str) -> object:
    """The JSON a fresh process running ``script`` prints, with its own empty cache folder."""
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, XDG_CACHE_HOME=cache, JAX_PLATFORMS="cpu,polyblocks",
               PYTHONPATH=os.pathsep.join(p for p in (str(repo), os.environ.get("PYTHONPATH", "")) if p))
    done = subprocess.run([sys.executable, "-c", script, *args], cwd=repo, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"compile benchmark process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_model(name: str, small: bool, batches: list[int]) -> dict:
    with tempfile.TemporaryDirectory(prefix="polyblocks-compile-bench-") as cache:
        workers, *rows = _run(_MODEL_PROCESS, [name, "1" if small else "0", ",".join(map(str, batches))], cache)
    for i, row in enumerate(rows):
        row["cache"] = "cold" if i == 0 else "warm"
        row["ratio"] = row["pb_s"] / row["xla_s"]
    return {"model": name, **workers, "rows": rows}


def measure_eager() -> dict:
    with tempfile.TemporaryDirectory(prefix="polyblocks-compile-bench-") as cache:
        return _run(_EAGER_PROCESS, [], cache)


def measure_linalg() -> dict:
    with tempfile.TemporaryDirectory(prefix="polyblocks-compile-bench-") as cache:
        return _run(_LINALG_PROCESS, [], cache)


def markdown(report: dict) -> str:
    lines = [f"# Compile times: XLA CPU and polyblocks ({report['date']})", "",
             f"{report['machine']} ({report['cpu']}, {report['cores']} cores), commit {report['commit']}, "
             f"{'small' if report['quick'] else 'full'} model configs; flags `{report['flags'] or '(default)'}`. "
             "Ratio = polyblocks s / XLA s (below 1: polyblocks compiles faster). Generated by "
             "`python bench/compile.py`.", "",
             "| model | batch | object cache | XLA s | polyblocks s | ratio |", "|---|---:|---|---:|---:|---:|"]
    for model in report["models"]:
        for row in model["rows"]:
            lines.append(f"| {model['model']} | {row['batch']} | {row['cache']} | {row['xla_s']:.2f} | "
                         f"{row['pb_s']:.2f} | {row['ratio']:.2f} |")
    starts = ", ".join(f"{m['model']} {m['workers_s']:.2f} s" for m in report["models"])
    eager = report["eager"]
    first, median = eager["first_calls_s"], eager["compile_median_s"]
    lines += ["", f"Compile workers' start (the first compile of a process, not in the table): {starts}.", "",
              f"Eager: {eager['ops']} distinct jnp calls on 64x64 arrays, first calls {first['xla']:.2f} s on XLA, "
              f"{first['polyblocks']:.2f} s on polyblocks ({first['polyblocks'] / first['xla']:.2f}x); "
              f"a program's compile alone, median: XLA {1e3 * median['xla']:.0f} ms, polyblocks "
              f"{1e3 * median['polyblocks']:.0f} ms.", ""]
    if report.get("linalg"):
        lines += ["Linear algebra, each program's cold compile alone: CPU s (wall s).", "",
                  "| program | XLA | polyblocks | ratio (CPU) |", "|---|---:|---:|---:|"]
        for name, row in report["linalg"].items():
            (xla_wall, xla_cpu), (pb_wall, pb_cpu) = row["xla"], row["polyblocks"]
            lines.append(f"| {name} | {xla_cpu:.3f} ({xla_wall:.2f}) | {pb_cpu:.3f} ({pb_wall:.2f}) | "
                         f"{pb_cpu / xla_cpu:.1f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small model configurations")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of " + ", ".join(MODELS))
    parser.add_argument("--batch", default="1,8", help="batch sizes: the first cold, the others warm")
    parser.add_argument("--no-linalg", action="store_true", help="skip the linear-algebra set")
    results_files.add_save_argument(parser)
    args = parser.parse_args(argv)
    report = {**results_files.provenance(), "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "quick": args.quick,
              "models": [], "eager": None, "linalg": None}
    for name in [m for m in args.models.split(",") if m]:
        report["models"].append(measure_model(name, args.quick, [int(b) for b in args.batch.split(",")]))
        for row in report["models"][-1]["rows"]:
            print(f"{name:<10} batch {row['batch']:>2} {row['cache']}: XLA {row['xla_s']:.2f} s, "
                  f"polyblocks {row['pb_s']:.2f} s ({row['ratio']:.2f}x)", flush=True)
    report["eager"] = measure_eager()
    if not args.no_linalg:
        report["linalg"] = measure_linalg()
    ratios = [row["ratio"] for m in report["models"] for row in m["rows"] if row["cache"] == "cold"]
    report["geomean_cold_ratio"] = math.exp(statistics.fmean(map(math.log, ratios))) if ratios else None
    path = results_files.folder(args.save) / f"compile-{results_files.machine_slug()}{'-quick' if args.quick else ''}.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    path.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
