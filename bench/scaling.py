"""Data-parallel scaling: one SGD step of an MLP (gradients psum'ed over the mesh) per call.

In one process with 1, 2 and 4 devices: polyblocks (POLYBLOCKS_NUM_DEVICES) against XLA CPU with
as many devices (jax_num_cpu_devices), timed batches interleaved, each process a fresh child.
Across processes (``--processes P``, 1 device each, started by the environment's mpiexec):
the same step on polyblocks, and a psum of ``--megabytes`` MB to measure the collectives'
bandwidth against MPI's own Allgatherv and Allreduce of as many bytes, in the same processes.
Medians of ``--repeats`` batches of ``--calls`` calls. Writes scaling-<machine>.json
(bench/results_files.py says where; ``--save``: bench/results/).
Usage: python bench/scaling.py [--devices 1 2 4] [--processes 2] [--calls N] [--repeats R] [--save]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WIDTH, BATCH = 256, 64  # features and rows per device


def _step(params, x, y):
    import jax
    import jax.numpy as jnp

    def loss(p):
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)
    grads = jax.lax.pmean(jax.grad(loss)(params), "d")
    return jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads)


def _program(devices: list) -> tuple[Callable, tuple]:
    """The jitted step over ``devices`` and its arguments, placed (global arrays)."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(devices), ("d",))
    rng = np.random.default_rng(0)
    params = {"w1": rng.standard_normal((WIDTH, 2 * WIDTH), np.float32) * 0.05,
              "b1": np.zeros(2 * WIDTH, np.float32),
              "w2": rng.standard_normal((2 * WIDTH, WIDTH), np.float32) * 0.05, "b2": np.zeros(WIDTH, np.float32)}
    rows = BATCH * len(devices)
    x, y = rng.standard_normal((rows, WIDTH), np.float32), rng.standard_normal((rows, WIDTH), np.float32)

    def put(value, spec):
        return jax.make_array_from_callback(value.shape, NamedSharding(mesh, spec), lambda i: value[i])
    step = jax.jit(jax.shard_map(_step, mesh=mesh, in_specs=(P(), P("d"), P("d")), out_specs=P()))
    return step, (jax.tree_util.tree_map(lambda a: put(a, P()), params), put(x, P("d")), put(y, P("d")))


def _batch_ms(call: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls * 1e3


def one_process(devices: int, calls: int, repeats: int) -> dict:
    """In a child with ``devices`` devices on each platform: ms per step, medians."""
    import jax
    jax.config.update("jax_num_cpu_devices", devices)
    runs = {}
    for platform in ("cpu", "polyblocks"):
        step, args = _program(jax.devices(platform)[:devices])
        runs[platform] = lambda step=step, args=args: jax.block_until_ready(step(*args))
        _batch_ms(runs[platform], 3)  # compile, warm caches
    samples = {p: [] for p in runs}
    for _ in range(repeats):
        for platform, call in runs.items():
            samples[platform].append(_batch_ms(call, calls))
    return {p: statistics.median(s) for p, s in samples.items()}


def across_processes(port: int, calls: int, repeats: int, megabytes: float) -> dict | None:
    """Under mpiexec: ms per step and the psum's bandwidth, with MPI's own; rank 0 answers."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    jax.distributed.initialize(f"localhost:{port}", num_processes=world.Get_size(), process_id=world.Get_rank())
    step, args = _program(jax.devices())
    run = lambda: jax.block_until_ready(step(*args))  # noqa: E731
    _batch_ms(run, 3)
    step_ms = statistics.median(_batch_ms(run, calls) for _ in range(repeats))

    n = jax.device_count()
    elements = int(megabytes * 2**20) // 4
    mesh = Mesh(np.array(jax.devices()), ("d",))
    block = np.ones((1, elements), np.float32)
    data = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), block, (n, elements))
    psum = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "d"), mesh=mesh, in_specs=P("d"), out_specs=P("d")))
    reduce = lambda: jax.block_until_ready(psum(data))  # noqa: E731
    _batch_ms(reduce, 2)
    psum_ms = statistics.median(_batch_ms(reduce, max(calls // 4, 1)) for _ in range(repeats))
    gathered, summed = np.empty(n * elements, np.float32), np.empty(elements, np.float32)
    mpi = {"Allgatherv": lambda: world.Allgatherv(block.reshape(-1), [gathered, [elements] * n]),
           "Allreduce": lambda: world.Allreduce(block.reshape(-1), summed)}
    mpi_ms = {}
    for name, call in mpi.items():
        call()
        mpi_ms[name] = statistics.median(_batch_ms(call, max(calls // 4, 1)) for _ in range(repeats))
    if world.Get_rank() != 0:
        return None
    return {"step_ms": step_ms, "psum_ms": psum_ms, "mpi_ms": mpi_ms, "bytes": elements * 4}


def _child(call: str, env: dict[str, str], launcher: list[str] | None = None) -> dict:
    code = f"import sys, json; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); " \
           f"import scaling; r = scaling.{call}; r is None or print('RESULT', json.dumps(r))"
    done = subprocess.run([*(launcher or []), sys.executable, "-c", code], env=dict(os.environ, **env),
                          capture_output=True, text=True, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"{call} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[0].removeprefix("RESULT "))


def main() -> None:
    from bench import results_files
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--devices", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--processes", type=int, nargs="*", default=[2])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--megabytes", type=float, default=4.0)
    results_files.add_save_argument(parser)
    args = parser.parse_args()
    rows: list[dict] = []
    print(f"MLP {WIDTH}-{2 * WIDTH}-{WIDTH}, {BATCH} rows per device; ms per step (median of "
          f"{args.repeats} x {args.calls})")
    print(f"{'devices':>8}{'XLA CPU':>10}{'polyblocks':>12}{'ratio':>8}")
    for n in args.devices:
        r = _child(f"one_process({n}, {args.calls}, {args.repeats})",
                   {"POLYBLOCKS_NUM_DEVICES": str(n), "JAX_PLATFORMS": "cpu,polyblocks"})
        rows.append({"devices": n, "processes": 1, "xla_ms": r["cpu"], "polyblocks_ms": r["polyblocks"]})
        print(f"{n:>8}{r['cpu']:10.2f}{r['polyblocks']:12.2f}{r['polyblocks'] / r['cpu']:8.2f}")
    mpiexec = shutil.which("mpiexec", path=os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]]))
    for p in args.processes if mpiexec else []:
        with socket.socket() as s:
            s.bind(("localhost", 0))
            port = s.getsockname()[1]
        r = _child(f"across_processes({port}, {args.calls}, {args.repeats}, {args.megabytes})",
                   {"POLYBLOCKS_NUM_DEVICES": "1", "JAX_PLATFORMS": "polyblocks"}, [mpiexec, "-n", str(p)])
        rows.append({"devices": p, "processes": p, "polyblocks_ms": r["step_ms"], "psum_ms": r["psum_ms"],
                     "mpi_ms": r["mpi_ms"], "psum_bytes": r["bytes"]})
        mb = r["bytes"] / 2**20
        print(f"{p} processes x 1 device: {r['step_ms']:.2f} ms per step; psum of {mb:.0f} MB "
              f"{r['psum_ms']:.2f} ms ({mb / r['psum_ms'] * 1e3:.0f} MB/s); MPI's own: "
              + ", ".join(f"{k} {v:.2f} ms ({mb / v * 1e3:.0f} MB/s)" for k, v in r["mpi_ms"].items()))
    if not mpiexec:
        print("no mpiexec: pip install -e '.[distributed]' to measure across processes")
    path = results_files.folder(args.save) / f"scaling-{results_files.machine_slug()}.json"
    path.write_text(json.dumps({**results_files.provenance(), "load_average": results_files.load_average(),
                                "model": f"MLP {WIDTH}-{2 * WIDTH}-{WIDTH}, {BATCH} rows per device",
                                "units": "ms per call, medians", "rows": rows}, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    if __package__ in (None, ""):  # run as a script: make `bench` importable from the repo root
        sys.path.insert(0, str(ROOT))
    main()
