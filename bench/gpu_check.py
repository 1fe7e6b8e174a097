"""GPU check: polyblocks' PTX against XLA GPU, correctness and speed, from executables built elsewhere.

Two steps, on two machines:

  build (no GPU needed; needs MLIR, ptxas optional):
      python bench/gpu_check.py build --out bench/results/gpu_artifacts [--small] [--flags precision=tf32]
  run (a CUDA GPU, jax with its CUDA plugin, cuda-python; no MLIR):
      python bench/gpu_check.py run --artifacts bench/results/gpu_artifacts --results bench/results/gpu.json

``build`` compiles every case for sm_80, sm_90 and sm_90a (Hopper's arch-specific PTX, with
wgmma) and writes each GpuExecutable (PTX + launch plan + signature, JSON) beside a manifest
of the input shapes. ``run`` loads the executable for the device's chip, the arch-specific one
first (sm_90a on an H100; sm_80 PTX is JIT-compiled by the driver on newer chips), makes
seeded random inputs, runs XLA GPU on the same inputs in the same
process, compares the results (the "GPU tests") and times both (median of repeats,
device-resident buffers, transfers excluded), then writes one results JSON.

Cases: small correctness programs (elementwise, reductions, softmax, matmul, conv),
and the benchmarks: bf16 matmul 4096, a 3x3 convolution (8x56x56x64 -> 64), attention
(1, 16, 2048, 64), ResNet-18, ViT-Tiny and UNet (bench/flax_models.py) at batch 8.

What is not verified, stated plainly:
- This script and polyblocks_jax/nvptx/runtime.py were written without a GPU; only the
  build step has run. The first GPU run may find bugs in the runtime.
- XLA's side is the same jax function rebuilt on the GPU machine, so the Flax models need
  flax there; without it their XLA baseline is skipped and said so in the results. (A
  jax.export artifact would avoid that, but serializing one needs the flatbuffers
  package, which the build environment lacks.)
- Matmuls and NHWC convolutions of bf16/f16 operands (and f32 ones under the precision=tf32 flag,
  the default here: XLA GPU's default precision for f32 dots and convolutions is TF32 on
  sm_80 and newer) run as mma.sync kernels (wgmma warpgroups for bf16/f16 on sm_90a) with a
  cp.async shared-memory pipeline, and the elementwise op right after one (bias, activation,
  residual, conversion) is computed on its accumulators; every other op maps one thread to
  one output element, reductions inside the thread, except reductions with few outputs,
  split over many threads first (a partial and a combining kernel). The kernels were checked by ptxas
  and by an emulator of their instructions (tests/test_nvptx.py), never timed: whether
  the speed goals (70% of cuBLAS on the matmul, 1.0x XLA on the models) are met is what
  the first run will tell.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

CHIPS = ("sm_80", "sm_90", "sm_90a")
TOLERANCE = {"float32": (1e-4, 1e-4), "bfloat16": (5e-2, 5e-2)}  # GPU math and summation order differ
TF32_TOLERANCE = (2e-2, 2e-2)  # f32 products with 10-bit mantissas, on both sides, in different orders
DEFAULT_FLAGS = "precision=tf32"     # the precision XLA GPU uses for f32 dots and convolutions by default


MODELS = ("resnet18", "vit_tiny", "unet")


@functools.cache
def case(name: str, small: bool) -> tuple:
    """(function of flat arguments, argument specs [(shape, dtype name)], kind) of case ``name``."""
    if name in MODELS:
        return _model_case(name, small)
    return _program_cases(small)[name]


def case_names() -> list[str]:
    return list(_program_cases(True)) + list(MODELS)


@functools.cache
def _program_cases(small: bool) -> dict:
    import jax
    import jax.numpy as jnp

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def attention(q, k, v):
        scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
        return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)

    n, hw, seq = (256, 16, 256) if small else (4096, 56, 2048)
    table = {
        "test_elementwise": (lambda x, y: jnp.tanh(x * y + 1.0) - jnp.exp(-x), [((7, 300), "float32")] * 2, "test"),
        "test_row_sum": (lambda x: jnp.sum(x, axis=1), [((64, 500), "float32")], "test"),
        "test_softmax": (lambda x: jax.nn.softmax(x, axis=-1), [((32, 1000), "float32")], "test"),
        # reductions with few outputs: split over many threads (nvptx/reductions.py)
        "test_full_sum": (lambda x: jnp.sum(x * x), [((1 << 20,), "float32")], "test"),
        "test_long_softmax": (lambda x: jax.nn.softmax(x, axis=-1), [((4, 8192), "float32")], "test"),
        "test_layernorm": (lambda x: (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5),
                           [((16, 4096), "float32")], "test"),
        "test_conv": (conv, [((2, 9, 9, 5), "float32"), ((3, 3, 5, 7), "float32")], "test"),
        "matmul_bf16": (lambda a, b: a @ b, [((n, n), "bfloat16")] * 2, "bench"),
        "conv3x3": (conv, [((8, hw, hw, 64), "float32"), ((3, 3, 64, 64), "float32")], "bench"),
        "attention": (attention, [((1, 16, seq, 64), "float32")] * 3, "bench"),
    }
    return table


def _model_case(name: str, small: bool):
    import jax
    from bench import flax_models

    case = flax_models.make(name, batch=8, small=small)
    leaves, tree = jax.tree_util.tree_flatten((case.params, case.input))
    specs = [(tuple(leaf.shape), str(np.asarray(leaf).dtype)) for leaf in leaves]
    return (lambda *flat: case.apply(*jax.tree_util.tree_unflatten(tree, flat))), specs, "model"


def random_inputs(specs, seed: int = 0) -> list[np.ndarray]:
    import ml_dtypes

    rng = np.random.default_rng(seed)
    dtypes = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
    # Scaled so that long sums stay in range: the check is the code, not overflow behaviour.
    return [(rng.standard_normal(shape) / math.sqrt(max(shape[-1], 1) if shape else 1)).astype(dtypes[dtype])
            for shape, dtype in specs]


def build(out: str, small: bool, only: list[str], flags: str) -> None:
    import jax
    import polyblocks_jax as pb
    from polyblocks_jax.nvptx import target_name
    from polyblocks_jax.options import Options

    options = Options.from_flags(flags)

    os.makedirs(out, exist_ok=True)
    manifest = {}
    for name in only or case_names():
        fn, specs, kind = case(name, small)
        args = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in specs]
        lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cpu",))
        for chip in CHIPS:
            start = time.perf_counter()
            exe = pb.compile(lowered, options, target=target_name(chip))
            with open(os.path.join(out, f"{name}.{chip}.json"), "wb") as f:
                f.write(exe.serialize())
            print(f"{name} {chip}: {len(exe.plan.launches)} launches, {time.perf_counter() - start:.1f} s; "
                  f"{roofline(exe.plan)}", flush=True)
        manifest[name] = {"specs": specs, "kind": kind, "small": small, "flags": flags}
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


# HBM bandwidth of the parts the chips name (NVIDIA's data sheets): a lower bound on a
# memory-bound program's time.
HBM_BYTES_PER_S = {"H100 SXM": 3.35e12, "H200": 4.8e12}


def roofline(plan) -> str:
    """What a plan moves: each launch's named buffers (an upper bound on its traffic, each
    read or written once), the widest launch's threads, and the time those bytes take at
    each part's HBM bandwidth."""
    moved = 0
    for launch in plan.launches:
        named = {arg.buffer for arg in launch.args if hasattr(arg, "buffer")}
        moved += sum(plan.buffers[b].nbytes for b in named)
    widest = max((math.prod(launch.grid) * math.prod(launch.block) for launch in plan.launches), default=0)
    bounds = ", ".join(f"{part} >= {moved / rate * 1e6:.1f} us" for part, rate in HBM_BYTES_PER_S.items())
    return f"widest launch {widest} threads, buffers named {moved / 1e6:.2f} MB ({bounds})"


def run(artifacts: str, results: str, budget_s: float) -> None:
    import jax
    from polyblocks_jax.nvptx import GpuExecutable, runtime

    device = runtime.device()
    with open(os.path.join(artifacts, "manifest.json")) as f:
        manifest = json.load(f)
    chip = next((c for c in (device.chip + "a", device.chip)
                 if os.path.exists(os.path.join(artifacts, f"{next(iter(manifest))}.{c}.json"))), "sm_80")
    report = {"device": jax.devices()[0].device_kind, "chip": device.chip, "ptx_for": chip, "cases": {}}
    deadline = time.perf_counter() + budget_s
    for name, entry in manifest.items():
        entry_report = report["cases"][name] = {"kind": entry["kind"]}
        try:
            with open(os.path.join(artifacts, f"{name}.{chip}.json"), "rb") as f:
                exe = GpuExecutable.deserialize(f.read())
            _check_and_time(name, exe, entry, entry_report, deadline, runtime)
        except Exception as e:  # one broken case must not hide the others' figures
            entry_report["error"] = f"{type(e).__name__}: {e}"
        print(name, json.dumps(entry_report), flush=True)
    with open(results, "w") as f:
        json.dump(report, f, indent=1)


def _check_and_time(name, exe, entry, out: dict, deadline: float, runtime) -> None:
    import jax

    inputs = random_inputs([(tuple(s), d) for s, d in entry["specs"]])
    ours = exe(*inputs)
    try:
        fn = case(name, entry["small"])[0]
    except ImportError as e:  # flax missing on this machine
        out["xla"] = f"skipped: {e}"
        fn = None
    if fn is not None:
        xla = jax.jit(fn)
        on_device = [jax.device_put(a) for a in inputs]
        expected = [np.asarray(x) for x in jax.tree_util.tree_leaves(xla(*on_device))]
        out["matches_xla"], out["max_abs_error"] = _compare(ours, expected, "precision=tf32" in entry.get("flags", ""))
        out["xla_ms"] = _median_ms(lambda: jax.block_until_ready(xla(*on_device)), deadline)
    loaded = runtime.load(exe)
    pointers = loaded.allocate()
    try:
        for pointer, buffer in zip(pointers, exe.plan.buffers):
            if buffer.kind == "input":
                loaded.device.upload(pointer, inputs[buffer.index])
        out["polyblocks_ms"] = _median_ms(lambda: (loaded.launch(pointers), loaded.device.synchronize()), deadline)
    finally:
        loaded.release(pointers)
    if "xla_ms" in out:
        out["speedup_vs_xla"] = out["xla_ms"] / out["polyblocks_ms"]


def _compare(actual, expected, tf32: bool) -> tuple[bool, float]:
    ok, worst = len(actual) == len(expected), 0.0
    for a, e in zip(actual, expected):
        rtol, atol = TF32_TOLERANCE if tf32 and e.dtype == np.float32 else TOLERANCE.get(str(e.dtype), (0.0, 0.0))
        a64, e64 = a.astype(np.float64), e.astype(np.float64)
        ok = ok and a.shape == e.shape and bool(np.allclose(a64, e64, rtol=rtol, atol=atol, equal_nan=True))
        worst = max(worst, float(np.nanmax(np.abs(a64 - e64))) if a.size else 0.0)
    return ok, worst


def _median_ms(call, deadline: float, repeats: int = 20) -> float:
    call()  # warm-up: module JIT, allocations
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
        if time.perf_counter() > deadline and len(times) >= 3:
            break
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", default="bench/results/gpu_artifacts")
    b.add_argument("--small", action="store_true", help="reduced sizes (quick build and run)")
    b.add_argument("--only", nargs="*", default=[])
    b.add_argument("--flags", default=DEFAULT_FLAGS, help="compiler options, as POLYBLOCKS_FLAGS ('' for exact f32)")
    r = sub.add_parser("run")
    r.add_argument("--artifacts", default="bench/results/gpu_artifacts")
    r.add_argument("--results", default="bench/results/gpu.json")
    r.add_argument("--budget-s", type=float, default=420.0)
    args = parser.parse_args()
    if args.command == "build":
        build(args.out, args.small, args.only, args.flags)
    else:
        run(args.artifacts, args.results, args.budget_s)


if __name__ == "__main__":
    main()
