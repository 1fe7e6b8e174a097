"""Shared test helpers: compile with polyblocks, run with XLA CPU, compare.

Tolerances are stated here per dtype, once, for every numeric test.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from typing import Callable, Sequence
from unittest import mock

# The reference rounds every value to its type, as StableHLO says: by default XLA CPU keeps
# bf16/f16 intermediates in f32 ("excess precision"), which no per-dtype tolerance can absorb.
# Set before any JAX backend starts.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_allow_excess_precision=false").strip()

import jax  # noqa: E402
import ml_dtypes
import numpy as np
from absl.testing import absltest
from mlir import ir

import polyblocks_jax as pb
from polyblocks_jax import cpu, passes
from polyblocks_jax.stablehlo_import import import_program

jax.config.update("jax_enable_x64", True)  # f64 and i64 programs must stay 64-bit

# (rtol, atol) per result dtype: exact for integers and bools; a few ulps for floats,
# since transcendental functions use different approximations than XLA's.
TOLERANCES: dict[np.dtype, tuple[float, float]] = {
    np.dtype(np.float64): (1e-12, 1e-14),
    np.dtype(np.float32): (2e-6, 1e-6),
    np.dtype(np.float16): (2e-3, 1e-3),
    np.dtype(ml_dtypes.bfloat16): (1.6e-2, 1e-2),
    # per part; complex formulas (division, abs, exp, ...) round a few times more than real ones
    np.dtype(np.complex128): (1e-11, 1e-13),
    np.dtype(np.complex64): (1e-5, 1e-6),
}


def tolerance(dtype) -> tuple[float, float]:
    return TOLERANCES.get(np.dtype(dtype), (0.0, 0.0))


def xla_cpu(fn: Callable, *args) -> list[np.ndarray]:
    """Results of ``jax.jit(fn)`` on XLA's CPU backend, as a flat list of numpy arrays."""
    cpu = jax.devices("cpu")[0]
    out = jax.jit(fn)(*[jax.device_put(a, cpu) for a in args])  # runs where the data is
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(out)]


def polyblocks(fn: Callable, *args, options: pb.Options | None = None) -> list[np.ndarray]:
    """Results of ``fn`` compiled by polyblocks_jax.compile from its lowering (the
    executable takes the arguments' leaves: ``args`` may be pytrees)."""
    lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cpu",))
    return list(pb.compile(lowered, options)(*[np.asarray(a) for a in jax.tree_util.tree_leaves(args)]))


def assert_close(test, actual: Sequence[np.ndarray], expected: Sequence[np.ndarray],
                 rtol: float | None = None, atol: float | None = None, msg: str = "") -> None:
    test.assertEqual(len(actual), len(expected), msg)
    for i, (a, e) in enumerate(zip(actual, expected)):
        test.assertEqual(a.dtype, e.dtype, f"{msg} result {i} dtype")
        test.assertEqual(a.shape, e.shape, f"{msg} result {i} shape")
        r, t = tolerance(e.dtype)
        r, t = (r if rtol is None else rtol), (t if atol is None else atol)
        if e.dtype.kind == "c":  # each part on its own, so that NaN parts compare equal
            a, e = np.stack([a.real, a.imag]), np.stack([e.real, e.imag])
        if e.dtype.kind == "f" or e.dtype == ml_dtypes.bfloat16:
            np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=r, atol=t,
                                       equal_nan=True, err_msg=f"{msg} result {i}")
        else:
            np.testing.assert_array_equal(a, e, err_msg=f"{msg} result {i}")


def check_against_xla(test, fn: Callable, *args, rtol: float | None = None,
                      atol: float | None = None, options: pb.Options | None = None) -> None:
    """Run ``fn`` on XLA CPU and through polyblocks on the same inputs; compare."""
    assert_close(test, polyblocks(fn, *args, options=options), xla_cpu(fn, *args),
                 rtol=rtol, atol=atol, msg=getattr(fn, "__name__", "fn"))


def random_array(rng: np.random.Generator, shape: Sequence[int], dtype, edge: bool = True) -> np.ndarray:
    """Random values of ``dtype``; with ``edge`` some entries are NaN, +-inf, -0.0 or int limits."""
    dtype = np.dtype(dtype)
    shape = tuple(shape)
    if dtype.kind == "c":
        part = np.float32 if dtype == np.complex64 else np.float64
        out = np.empty(shape, dtype)  # parts assigned, not summed: 1j * inf would be NaN + inf j
        out.real, out.imag = random_array(rng, shape, part, edge), random_array(rng, shape, part, edge)
        return out
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        x = rng.integers(max(info.min, -100), min(info.max, 100), size=shape, endpoint=True).astype(dtype)
        specials = [info.min, info.max, 0, -1 if dtype.kind == "i" else 1]
    else:
        x = rng.standard_normal(shape).astype(np.float32).astype(dtype)
        specials = [np.nan, np.inf, -np.inf, -0.0, 0.0]
    if edge and x.size >= 8:
        flat = x.reshape(-1)
        idx = rng.choice(flat.size, size=len(specials), replace=False)
        flat[idx] = np.array(specials).astype(dtype)
    return x


def module_after(stage: str, fn: Callable, *args, hardware: passes.Hardware,
                 options: pb.Options | None = None) -> ir.Module:
    """``fn``'s module after the stages up to ``stage``, the shared ones for ``hardware``
    then the host's (the module keeps its context alive)."""
    options = options or pb.Options()
    lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cpu",))
    stages = cpu.buffer_stages(options, hardware) + cpu.cpu_stages(options)
    context = ir.Context()
    with context, ir.Location.unknown():
        module = import_program(lowered, context).module
        passes.run_stages(module, stages[:[s.name for s in stages].index(stage) + 1], options)
    return module


def in_process():
    """Compile in this process while the context lasts, as when no compile worker can start:
    for tests that patch the compiler's functions, which a worker would not see."""
    from polyblocks_jax import compile_workers
    return mock.patch.object(compile_workers, "compile", lambda job, text, follow=None, kind="host": None)


def without_flags(test: absltest.TestCase) -> None:
    """``POLYBLOCKS_FLAGS`` unset until ``test`` ends: for tests of what the default pipeline
    does through jax.jit (a donated buffer reused), which a run of the suite with an
    optimization switched off would change."""
    test.enter_context(mock.patch.dict(os.environ))
    os.environ.pop(pb.options.FLAGS_ENV, None)


_KERNEL_LOWERING = ("builtin.module(convert-vector-to-scf{full-unroll=true target-rank=1}, expand-strided-metadata, "
                    "finalize-memref-to-llvm, convert-scf-to-cf, convert-vector-to-llvm, convert-arith-to-llvm, "
                    "convert-func-to-llvm{use-bare-ptr-memref-call-conv=1}, convert-cf-to-llvm, "
                    "reconcile-unrealized-casts)")


def run_kernel(module: ir.Module, name: str, *arrays: np.ndarray) -> None:
    """Lower ``module`` (vectors and memrefs) and call its function ``name`` on the arrays'
    memory (bare pointers), by MLIR's ExecutionEngine: for kernels written by hand."""
    from mlir import execution_engine
    from polyblocks_jax.contexts import pass_manager
    pass_manager(_KERNEL_LOWERING, module.context).run(module.operation)
    engine = execution_engine.ExecutionEngine(module, opt_level=2)
    args = [ctypes.c_void_p(a.ctypes.data) for a in arrays]
    packed = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(engine.raw_lookup(name))(packed)


def run_python(code: str, env: dict[str, str] | None = None, timeout: int = 180,
               memory_limit: int | None = None) -> subprocess.CompletedProcess:
    """``code`` (dedented) in a fresh interpreter with ``env`` added to ours, its address space
    capped at ``memory_limit`` bytes if given; a crash prints its Python stack (faulthandler)."""
    preamble = ""
    if memory_limit is not None:
        preamble = f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({memory_limit}, {memory_limit}))\n"
    # errors="replace": MLIR echoes a damaged artifact's bytes (an op name) to stderr.
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", preamble + textwrap.dedent(code)],
                          env=dict(os.environ, **(env or {})), capture_output=True, text=True, errors="replace",
                          timeout=timeout)
