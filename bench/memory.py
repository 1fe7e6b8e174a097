"""Peak memory of one model run on XLA CPU and on polyblocks, each in a child process.

The child builds the model, compiles it, then resets its resident-set high-water mark
(``/proc/self/clear_refs``) and runs it once: the peak over the run is the process's peak
resident memory during that call (with the libraries, parameters and input it holds), the
growth is that peak less the resident memory just before the call. Alongside: the
intermediates' memory each compiler planned (XLA's temporary buffers, polyblocks' arena).
A polyblocks program is compiled by a first child into a temporary JAX persistent cache
and loaded from it by the measured one, as a deployed program would be: the compiler
(MLIR, LLVM) never enters the measured process, as XLA's own compiler does not count
beyond the jaxlib both load. Prints a table and writes
memory-<machine>[-quick].json (bench/results_files.py says where; ``--save``: bench/results/).

    python bench/memory.py                   # the small (--quick) configs, batch 2
    python bench/memory.py --models unet --batch 1 8
    python bench/memory.py --full --batch 8 --backends cpu polyblocks --save
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("cpu", "polyblocks", "polyblocks-no-arena")

_CHILD = textwrap.dedent("""
    import gc, json, resource, sys
    import jax, numpy as np
    from bench import flax_models
    backend, model, batch, small, cache, measure = json.loads(sys.argv[1])
    if cache:  # polyblocks: compiled once into the cache, then loaded without the compiler
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

    def status(field):  # kB from /proc/self/status; ru_maxrss where there is none
        try:
            with open("/proc/self/status") as f:
                return next(int(l.split()[1]) for l in f if l.startswith(field + ":"))
        except (OSError, StopIteration):
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    case = flax_models.make(model, batch, small)
    device = jax.devices("cpu" if backend == "cpu" else "polyblocks")[0]
    args = jax.device_put((case.params, case.input), device)
    compiled = jax.jit(case.apply).lower(*args).compile()
    if not measure:  # the compiling child: the arena size, then done
        import polyblocks_jax as pb
        lowered = jax.jit(case.apply).trace(case.params, case.input).lower(lowering_platforms=("cpu",))
        print(json.dumps({"planned": pb.compile(lowered).arena_bytes}))
        sys.exit(0)
    planned = compiled.memory_analysis().temp_size_in_bytes if backend == "cpu" else None
    gc.collect()
    try:  # the high-water mark from now on: the run's, not the compiler's
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        reset = True
    except OSError:
        reset = False
    before = status("VmRSS")
    jax.block_until_ready(compiled(*args))
    peak = status("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_kb": peak, "before_kb": before, "planned": planned,
                      "compiler_loaded": "mlir" in sys.modules}))
""")


@dataclasses.dataclass
class Peak:
    backend: str
    peak_mib: float     # process peak resident memory over one run
    growth_mib: float   # that peak less the resident memory before the run
    planned_mib: float  # intermediates as planned: XLA's temporary buffers, polyblocks' arena


def peak_memory(backend: str, model: str, batch: int, small: bool) -> Peak:
    """Measure one run of ``model`` on ``backend`` ("cpu": XLA, "polyblocks", or
    "polyblocks-no-arena") in a fresh child process."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if backend == "polyblocks-no-arena":
        env["POLYBLOCKS_FLAGS"] = (env.get("POLYBLOCKS_FLAGS", "") + ",no-arena").strip(",")
    if backend == "cpu":
        result = _child(env, [backend, model, batch, small, None, True])
    else:
        with tempfile.TemporaryDirectory(prefix="polyblocks-memory-") as cache:
            planned = _child(env, [backend, model, batch, small, cache, False])["planned"]
            result = _child(env, [backend, model, batch, small, cache, True])
        if result["compiler_loaded"]:
            raise RuntimeError(f"{backend} {model}: the measured run compiled (no persistent cache hit)")
        result["planned"] = planned
    mib = 1 / 1024
    return Peak(backend, result["peak_kb"] * mib, (result["peak_kb"] - result["before_kb"]) * mib,
                result["planned"] * mib * mib)


def _child(env: dict[str, str], args: list) -> dict:
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(args)],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{args[:2]}: child failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    from bench import flax_models, results_files
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(flax_models.MODEL_NAMES))
    parser.add_argument("--batch", nargs="+", type=int, default=[2])
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--full", action="store_true", help="the full configurations (default: small)")
    results_files.add_save_argument(parser)
    args = parser.parse_args(argv)
    print(f"{'model':<10} {'batch':>5}  {'backend':<20} {'peak MiB':>9} {'run growth MiB':>15} {'planned MiB':>12}")
    rows = []
    for name in args.models:
        for batch in args.batch:
            for backend in args.backends:
                p = peak_memory(backend, name, batch, not args.full)
                rows.append(dict(model=name, batch=batch, **dataclasses.asdict(p)))
                print(f"{name:<10} {batch:>5}  {backend:<20} {p.peak_mib:>9.1f} {p.growth_mib:>15.2f} "
                      f"{p.planned_mib:>12.3f}", flush=True)
    print(f"wrote {_save(rows, args.full, args.save)}")


def _save(rows: list[dict], full: bool, save: bool) -> Path:
    from bench import results_files
    path = results_files.folder(save) / f"memory-{results_files.machine_slug()}{'' if full else '-quick'}.json"
    path.write_text(json.dumps({
        **results_files.provenance(), "full_size": full,
        "units": "MiB: process peak over one run, its growth over the run, planned intermediates",
        "rows": rows}, indent=1) + "\n")
    return path


if __name__ == "__main__":
    if __package__ in (None, ""):  # run as a script: make `bench` importable from the repo root
        sys.path.insert(0, str(ROOT))
    main()
