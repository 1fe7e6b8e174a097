"""The NVIDIA target without a GPU: PTX that ptxas accepts, launch plans within limits,
the GPU mapping checked by running it on the host; and, on a GPU, results against XLA.
"""
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from absl.testing import absltest, parameterized

import support
from polyblocks_jax import cpu, passes
from polyblocks_jax.errors import InvalidProgramError, PolyblocksError
from polyblocks_jax.nvptx import SM80, SM90, GpuExecutable, compile as gpu_compile, lowering, ptx, runtime
from polyblocks_jax.options import Options

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench import flax_models  # noqa: E402

CHIPS = ("sm_80", "sm_90")
TARGETS = {"sm_80": SM80, "sm_90": SM90}
f32, bf16 = np.float32, ml_dtypes.bfloat16


def _conv(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


# name -> (function, argument shapes and dtypes): one program per op family.
PROGRAMS = {
    "elementwise": (lambda x, y: jnp.tanh(x * y + 1.0) - jnp.exp(-x), [((5, 37), f32), ((5, 37), f32)]),
    "integer": (lambda a, b: (a // b, a % b, a << 3), [((64,), np.int32), ((64,), np.int32)]),
    "compare": (lambda x: jnp.where(x > 0, x, 0.5 * x), [((300,), f32)]),
    "row_sum": (lambda x: jnp.sum(x, axis=1), [((6, 50), f32)]),
    "full_sum": (lambda x: jnp.sum(x * x), [((100,), f32)]),
    "matmul": (lambda a, b: a @ b, [((33, 64), f32), ((64, 17), f32)]),
    "matmul_bf16": (lambda a, b: jax.nn.relu(a @ b), [((32, 64), bf16), ((64, 16), bf16)]),
    "conv3x3": (_conv, [((1, 8, 8, 3), f32), ((3, 3, 3, 4), f32)]),
    "softmax": (lambda x: jax.nn.softmax(x, axis=-1), [((4, 40), f32)]),
    "views": (lambda x: jnp.concatenate([jnp.pad(x, 1), jnp.zeros((6, 6), f32)]).T[::2], [((4, 4), f32)]),
    "constant": (lambda x: x + jnp.asarray(np.linspace(-1, 1, 8, dtype=f32)), [((8,), f32)]),
}


# Sums run in another order than XLA's (one thread walks the reduction): as the CPU tests state.
LONG_SUMS = {"row_sum", "full_sum", "matmul", "conv3x3", "softmax"}


def _tolerance(name: str) -> dict:
    return dict(rtol=1e-5, atol=1e-5) if name in LONG_SUMS else {}


def _args(name: str, edge: bool = True) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    args = [support.random_array(rng, shape, dtype, edge=edge) for shape, dtype in PROGRAMS[name][1]]
    if name == "integer":  # shift counts and divisors in range: the test is the mapping, not the semantics
        args = [args[0], np.where(args[1] == 0, 7, args[1]).astype(np.int32)]
    return args


def _lowered(fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cpu",))


def check_executable(test, exe: GpuExecutable) -> None:
    """Launches within the chip's limits; the plan and the PTX name the same kernels; ptxas accepts the PTX."""
    target = TARGETS[exe.chip]
    entries = {(module, entry) for module, text in exe.ptx.items()
               for entry in re.findall(r"\.entry\s+(\w+)\s*\(", text)}
    launched = {(launch.module, launch.kernel) for launch in exe.plan.launches}
    test.assertEqual(entries, launched, "every PTX kernel is launched and every launch has a kernel")
    for launch in exe.plan.launches:
        test.assertLessEqual(np.prod(launch.block), target.max_threads_per_block)
        test.assertTrue(all(1 <= g <= m for g, m in zip(launch.grid, target.max_grid_dims)), launch.grid)
        test.assertLessEqual(launch.shared_bytes, target.shared_bytes_per_block_optin)
        for arg in launch.args:
            if hasattr(arg, "buffer"):
                test.assertLess(arg.buffer, len(exe.plan.buffers))
    for text in exe.ptx.values():
        test.assertIn(f".target {exe.chip}", text)
    test.assertEqual(GpuExecutable.deserialize(exe.serialize()).plan, exe.plan)
    if ptx.find_ptxas() is None:
        test.skipTest("no ptxas found (PATH, /usr/local/cuda, nvidia-cuda-nvcc wheel): PTX not assembled")
    for text in exe.ptx.values():
        ptx.assemble(text, exe.chip)


class PtxTest(parameterized.TestCase):
    @parameterized.product(name=sorted(PROGRAMS), chip=CHIPS)
    def test_program(self, name, chip):
        exe = gpu_compile.compile_gpu(_lowered(PROGRAMS[name][0], *_args(name)), chip)
        self.assertNotEmpty(exe.plan.launches)
        check_executable(self, exe)

    @parameterized.parameters("resnet18", "vit_tiny", "unet")
    def test_small_model(self, name):
        case = flax_models.make(name, small=True)
        lowered = _lowered(case.apply, case.params, case.input)
        for chip in CHIPS:
            check_executable(self, gpu_compile.compile_gpu(lowered, chip))


class MappingOnHostTest(parameterized.TestCase):
    """The GPU mapping's rewrites (kernels for host work, flattening into blocks, bound checks)
    produce plain parallel loops; the host target runs them against XLA."""

    @parameterized.parameters(*sorted(PROGRAMS))
    def test_program(self, name):
        fn, args = PROGRAMS[name][0], _args(name)
        support.assert_close(self, _run_mapped_on_host(fn, args), support.xla_cpu(fn, *args), msg=name,
                             **_tolerance(name))


def _run_mapped_on_host(fn, args) -> list[np.ndarray]:
    from mlir import ir
    from polyblocks_jax.stablehlo_import import import_program

    options = gpu_compile._without_host_choices(Options())
    with ir.Context() as context, ir.Location.unknown():
        imported = import_program(_lowered(fn, *args), context)
        stages = passes.shared_stages(options, SM90.hardware()) + lowering.mapping_stages(options) + \
            cpu.cpu_stages(options)
        passes.run_stages(imported.module, stages, options)
        exe = cpu.build(imported.module, imported.inputs, imported.outputs, options)
    return list(exe(*args))


class PlanAndTargetTest(absltest.TestCase):
    def test_launch_limits_are_checked(self):
        with self.assertRaisesRegex(PolyblocksError, "threads"):
            SM80.check_launch((1, 1, 1), (2048, 1, 1), 0)
        with self.assertRaisesRegex(PolyblocksError, "shared memory"):
            SM80.check_launch((1, 1, 1), (32, 1, 1), 200 << 10)
        SM90.check_launch((1, 1, 1), (32, 1, 1), 200 << 10)  # sm_90 has 227 KiB per block (opt-in)

    def test_corrupted_executable_is_rejected(self):
        exe = gpu_compile.compile_gpu(_lowered(lambda x: x * 2.0, np.ones(4, f32)), "sm_80")
        data = exe.serialize().replace(b".target sm_80", b".target sm_99")
        with self.assertRaisesRegex(InvalidProgramError, "checksum"):
            GpuExecutable.deserialize(data)
        with self.assertRaises(InvalidProgramError):
            GpuExecutable.deserialize(b"{}")

    def test_loading_needs_no_mlir(self):
        code = ("import sys, polyblocks_jax.nvptx, polyblocks_jax.nvptx.runtime; "
                "assert 'mlir' not in sys.modules, 'MLIR loaded'")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        self.assertEqual(done.returncode, 0, done.stderr)

    def test_control_flow_around_kernels_is_unsupported(self):
        lowered = _lowered(lambda x: jax.lax.fori_loop(0, 3, lambda i, v: v * 2 + 1, x), np.ones(8, f32))
        with self.assertRaisesRegex(PolyblocksError, "scf.while"):
            gpu_compile.compile_gpu(lowered, "sm_90")


@absltest.skipUnless(runtime.available(), "needs cuda-python and a CUDA GPU")
class GpuExecutionTest(parameterized.TestCase):
    """On a GPU: results of the PTX equal XLA's on the host."""

    @parameterized.parameters(*sorted(PROGRAMS))
    def test_program(self, name):
        fn, args = PROGRAMS[name][0], _args(name)
        exe = gpu_compile.compile_gpu(_lowered(fn, *args), runtime.device().chip)
        support.assert_close(self, list(exe(*args)), support.xla_cpu(fn, *args), msg=name, **_tolerance(name))


if __name__ == "__main__":
    absltest.main()
