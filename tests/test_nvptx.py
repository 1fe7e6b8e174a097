"""The NVIDIA target without a GPU: PTX that ptxas accepts, launch plans within limits,
the GPU mapping checked by running it on the host, the tensor-core kernels (mma.sync) read
in the PTX and run in a numpy emulator of their instructions, the tile cost model on its
own; and, on a GPU, results against XLA.
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

import nvptx_emulator
import polyblocks_jax as pb
import support
from polyblocks_jax import cpu, passes
from polyblocks_jax.errors import InvalidProgramError, PolyblocksError
from polyblocks_jax.nvptx import SM80, SM90, SM90A, GpuExecutable, lowering, ptx, runtime, target_name
from polyblocks_jax.nvptx.backend import without_host_choices
from polyblocks_jax.nvptx.mma_kernel import ConvWindow, MmaProblem, kernel_function
from polyblocks_jax.nvptx.mma_tiles import MmaTiles, WgmmaTiles, choose_mma_tiles, choose_wgmma_tiles
from polyblocks_jax.nvptx.wgmma_kernel import wgmma_kernel_function
from polyblocks_jax.options import Options

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench import flax_models  # noqa: E402

CHIPS = ("sm_80", "sm_90")
# Explicit defaults where a test checks what the default pipeline makes (fused kernels, a
# rejected loop): a run of the suite with an optimization off (POLYBLOCKS_FLAGS) changes it.
DEFAULT = Options()
TARGETS = {"sm_80": SM80, "sm_90": SM90, "sm_90a": SM90A}
f32, f16, bf16 = np.float32, np.float16, ml_dtypes.bfloat16


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
    # reductions with few outputs, split over many threads (nvptx/reductions.py)
    "long_row_sum": (lambda x: jnp.sum(x, axis=1), [((4, 4096), f32)]),
    "long_full_max": (lambda x: jnp.max(jnp.abs(x)), [((1 << 16,), f32)]),
    "long_full_sum": (lambda x: jnp.sum(x * x), [((1 << 16,), f32)]),
    "long_softmax": (lambda x: jax.nn.softmax(x, axis=-1), [((2, 2048), f32)]),
    "long_column_sum": (lambda x: jnp.sum(x, axis=0), [((2048, 8), np.int32)]),
    "long_argmax": (lambda x: jnp.argmax(x, axis=1), [((4, 4096), f32)]),
    "long_row_mean_1000": (lambda x: jnp.mean(x, axis=1), [((4, 1000), f32)]),  # split by 50
    # jnp.var guards its count by a select on a 0-d bool computed on the device
    "layernorm_var": (lambda x: (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5),
                      [((8, 1024), f32)]),
}


# Sums run in another order than XLA's (one thread walks the reduction): as the CPU tests state.
LONG_SUMS = {"row_sum", "full_sum", "matmul", "conv3x3", "softmax", "long_row_sum", "long_softmax", "long_full_sum",
             "layernorm_var", "long_row_mean_1000"}


def _tolerance(name: str) -> dict:
    return dict(rtol=1e-5, atol=1e-5) if name in LONG_SUMS else {}


def _args(name: str, edge: bool = True) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    args = [support.random_array(rng, shape, dtype, edge=edge) for shape, dtype in PROGRAMS[name][1]]
    if name == "integer":  # shift counts and divisors in range: the test is the mapping, not the semantics
        args = [args[0], np.where(args[1] == 0, 7, args[1]).astype(np.int32)]
    if name == "long_full_max":  # XLA CPU's max of these drops the NaN (inf; numpy's and ours: NaN)
        args = [np.nan_to_num(args[0], nan=0.0, posinf=np.inf, neginf=-np.inf)]
    return args


def _lowered(fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cpu",))


def _compile(program, chip: str, options: Options | None = None) -> GpuExecutable:
    """``program``'s PTX and launch plan for ``chip``, from the driver."""
    return pb.compile(program, options, target=target_name(chip))


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
        exe = _compile(_lowered(PROGRAMS[name][0], *_args(name)), chip, DEFAULT)
        self.assertNotEmpty(exe.plan.launches)
        check_executable(self, exe)

    @parameterized.parameters("resnet18", "vit_tiny", "unet")
    def test_small_model(self, name):
        case = flax_models.make(name, small=True)
        lowered = _lowered(case.apply, case.params, case.input)
        for chip in CHIPS:
            check_executable(self, _compile(lowered, chip, DEFAULT))

    def test_small_model_on_tensor_cores(self):
        """With tf32, ResNet's convolutions run as mma.sync kernels. (Under this suite's x64 mode the
        ViT computes in f64, which no tensor core takes.)"""
        case = flax_models.make("resnet18", small=True)
        lowered = _lowered(case.apply, case.params, case.input)
        exe = _compile(lowered, "sm_80", Options(precision="tf32"))
        check_executable(self, exe)
        self.assertGreater(instruction_counts("".join(exe.ptx.values()))["mma"], 0)


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

    options = without_host_choices(Options())
    with ir.Context() as context, ir.Location.unknown():
        imported = import_program(_lowered(fn, *args), context)
        stages = passes.shared_stages(options, SM90.hardware(), tile_stages=lowering.tensor_stages(options, SM90)) + \
            lowering.mapping_stages(options) + cpu.cpu_stages(options)
        passes.run_stages(imported.module, stages, options)
        exe = cpu.build(imported.module, imported.inputs, imported.outputs, options)
    return list(exe(*args))


class SplitReductionTest(parameterized.TestCase):
    """A reduction with few outputs runs on many threads: S threads per output element."""

    @parameterized.parameters(("long_row_sum", 4 * 256), ("long_full_sum", 1 << 12), ("long_softmax", 2 * 128),
                              ("long_full_max", 1 << 12))
    def test_the_widest_launch_covers_the_split(self, name, threads):
        exe = _compile(_lowered(PROGRAMS[name][0], *_args(name)), "sm_90", DEFAULT)
        widest = max(np.prod(launch.grid) * np.prod(launch.block) for launch in exe.plan.launches)
        self.assertGreaterEqual(widest, threads)

    def test_an_exact_max_and_min_keep_the_sign_of_zero(self):
        # -0.0 and +0.0 in every row: the max is +0.0, the min -0.0, split or not. Against
        # that rule, not XLA CPU: its vectorized max of such a row may give -0.0.
        x = support.random_array(np.random.default_rng(1), (4, 4096), f32) * 0.0
        zeros = np.nan_to_num(x, nan=0.0)
        for fn, negative in ((lambda x: jnp.max(x, axis=1), np.all), (lambda x: jnp.min(x, axis=1), np.any)):
            (got,) = _run_mapped_on_host(fn, [zeros])
            np.testing.assert_array_equal(got, np.zeros(4, f32))
            np.testing.assert_array_equal(np.signbit(got), negative(np.signbit(zeros), axis=1))

    def test_factor(self):
        from mlir import ir
        from polyblocks_jax.nvptx.reductions import split_factor
        from polyblocks_jax.passes.transform import reduction_loops, walk
        from polyblocks_jax.stablehlo_import import import_program

        def factors(fn, *shapes):  # of the reductions as the split stage meets them
            with ir.Context() as context, ir.Location.unknown():
                imported = import_program(_lowered(fn, *[np.ones(s, f32) for s in shapes]), context)
                options = without_host_choices(Options())
                stages = passes.shared_stages(options, SM90.hardware())
                passes.run_stages(imported.module, stages[:[s.name for s in stages].index("results")], options)
                return [split_factor(op, SM90.resident_threads) for op in walk(imported.module.operation)
                        if op.name == "linalg.generic" and reduction_loops(op)]
        self.assertEqual(factors(lambda x: jnp.sum(x, 1), (4, 4096)), [256])  # 4096 / 16 elements a thread
        self.assertEqual(factors(lambda x: jnp.sum(x, 1), (4096, 4096)), [64])  # 4096 rows x 64 fill the GPU
        self.assertEqual(factors(lambda x: jnp.sum(x, 1), (1 << 18, 64)), [0])  # rows enough
        self.assertEqual(factors(lambda x: jnp.sum(x, 1), (4, 40)), [0])  # too short to pay
        self.assertEqual(factors(lambda x: jnp.sum(x, 1), (4, 1000)), [50])  # the largest divisor up to 62
        self.assertEqual(factors(lambda x: jnp.sum(x, 1), (4, 4099)), [0])  # a prime


class PlanAndTargetTest(absltest.TestCase):
    def test_launch_limits_are_checked(self):
        with self.assertRaisesRegex(PolyblocksError, "threads"):
            SM80.check_launch((1, 1, 1), (2048, 1, 1), 0)
        with self.assertRaisesRegex(PolyblocksError, "shared memory"):
            SM80.check_launch((1, 1, 1), (32, 1, 1), 200 << 10)
        SM90.check_launch((1, 1, 1), (32, 1, 1), 200 << 10)  # sm_90 has 227 KiB per block (opt-in)

    def test_corrupted_executable_is_rejected(self):
        exe = _compile(_lowered(lambda x: x * 2.0, np.ones(4, f32)), "sm_80")
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
            _compile(lowered, "sm_90", DEFAULT)


# name -> (function, argument shapes and dtypes, option flags, mma operand type): products that
# take the tensor-core path; shapes off the tile grid on purpose (edges read zeros, stores are guarded).
MMA_PROGRAMS = {
    "matmul_bf16": (lambda a, b: a @ b, [((100, 72), bf16), ((72, 40), bf16)], "", "bf16"),
    "matmul_f16_relu": (lambda a, b: jax.nn.relu(a @ b), [((64, 128), f16), ((128, 64), f16)], "", "f16"),
    "batch_matmul_bf16": (lambda a, b: jnp.einsum("bmk,bkn->bmn", a, b), [((3, 48, 64), bf16), ((3, 64, 32), bf16)],
                          "", "bf16"),
    "attention_scores_bf16": (lambda q, k: jnp.einsum("bhqd,bhkd->bhqk", q, k), [((1, 2, 64, 32), bf16)] * 2,
                              "", "bf16"),
    "matmul_tf32": (lambda a, b: a @ b, [((64, 96), f32), ((96, 48), f32)], "precision=tf32", "tf32"),
    "conv3x3_bf16": (_conv, [((2, 8, 8, 16), bf16), ((3, 3, 16, 32), bf16)], "", "bf16"),
    "conv_stride2_f16": (lambda x, w: jax.lax.conv_general_dilated(
        x, w, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")), [((1, 9, 9, 8), f16), ((3, 3, 8, 16), f16)],
        "", "f16"),
    "conv3x3_tf32": (_conv, [((1, 8, 8, 4), f32), ((3, 3, 4, 8), f32)], "precision=tf32", "tf32"),
}
_MMA_INSTRUCTION = {"bf16": "m16n8k16.row.col.f32.bf16.bf16.f32", "f16": "m16n8k16.row.col.f32.f16.f16.f32",
                    "tf32": "m16n8k8.row.col.f32.tf32.tf32.f32"}


def instruction_counts(text: str) -> dict[str, int]:
    return {name: len(re.findall(pattern, text)) for name, pattern in (
        ("mma", r"\bmma\.sync\.aligned\.(m16n8k\d+\.row\.col\.f32\.\w+\.\w+\.f32)"),
        ("ldmatrix", r"\bldmatrix\.sync\.aligned\.m8n8\.x4"), ("cp_async", r"\bcp\.async\.cg\.shared\.global"),
        ("wait_group", r"\bcp\.async\.wait_group"), ("wgmma", r"\bwgmma\.mma_async\.sync"))}


class TensorCoreTest(parameterized.TestCase):
    """bf16/f16 (and tf32) products become mma.sync kernels: read in the PTX, assembled by ptxas."""

    @parameterized.product(name=sorted(MMA_PROGRAMS), chip=CHIPS)
    def test_mma_kernel_in_ptx(self, name, chip):
        fn, specs, flags, operand = MMA_PROGRAMS[name]
        args = [np.ones(shape, dtype) for shape, dtype in specs]
        exe = _compile(_lowered(fn, *args), chip, Options.from_flags(flags))
        check_executable(self, exe)
        text = "\n".join(exe.ptx.values())
        counts = instruction_counts(text)
        self.assertEqual(set(re.findall(r"mma\.sync\.aligned\.(\S+)", text)), {_MMA_INSTRUCTION[operand]})
        self.assertGreater(counts["cp_async"], 0)
        self.assertGreater(counts["ldmatrix"], 0)
        self.assertGreater(counts["wait_group"], 0)
        mma_launches = [launch for launch in exe.plan.launches if launch.shared_bytes > 0]
        self.assertLen(mma_launches, 1)  # the product's kernel, with its shared-memory pipeline
        self.assert_no_spills(exe)

    @parameterized.parameters(*CHIPS)
    def test_benchmark_matmul_4096(self, chip):
        """bench/gpu_check.py's bf16 matmul: 64x64 warp tiles, a pipeline of at least 3 stages, no spills."""
        a = jax.ShapeDtypeStruct((4096, 4096), bf16)
        exe = _compile(_lowered(lambda a, b: a @ b, a, a), chip)
        check_executable(self, exe)
        (launch,) = [launch for launch in exe.plan.launches if launch.shared_bytes > 0]
        tiles = choose_mma_tiles(4096, 4096, 4096, 1, 2, (16, 8, 16), 32, TARGETS[chip])
        self.assertEqual(launch.block, (tiles.threads, 1, 1))
        self.assertEqual(launch.grid, (4096 // tiles.block[1], 4096 // tiles.block[0], 1))
        self.assertEqual(launch.shared_bytes, tiles.shared_bytes(2))
        counts = instruction_counts(exe.ptx[launch.module])
        # The k loop's body is unrolled: (64 / 16) x (64 / 8) fragments per k step of 16.
        self.assertEqual(counts["mma"], (tiles.block[2] // 16) * (tiles.warp[0] // 16) * (tiles.warp[1] // 8))
        self.assert_no_spills(exe)

    def test_f32_matmul_needs_tf32_for_tensor_cores(self):
        lowered = _lowered(lambda a, b: a @ b, np.ones((64, 64), f32), np.ones((64, 64), f32))
        self.assertEqual(instruction_counts(_compile(lowered, "sm_80").ptx["main_kernel"])["mma"], 0)

    def test_unaligned_rows_stay_off_tensor_cores(self):
        """k = 36 is not a whole number of 16-byte copies: the generic kernels compute it."""
        lowered = _lowered(lambda a, b: a @ b, np.ones((32, 36), bf16), np.ones((36, 16), bf16))
        exe = _compile(lowered, "sm_80")
        check_executable(self, exe)
        self.assertEqual(instruction_counts("".join(exe.ptx.values()))["mma"], 0)

    def assert_no_spills(self, exe: GpuExecutable) -> None:
        if ptx.find_ptxas() is None:
            return  # check_executable has said so
        for text in exe.ptx.values():
            for kernel, used in ptx.usage(text, exe.chip).items():
                self.assertEqual(used.spill_bytes, 0, kernel)
                self.assertLessEqual(used.registers, TARGETS[exe.chip].registers_per_thread, kernel)


class WgmmaTest(parameterized.TestCase):
    """sm_90a: bf16/f16 products and convolutions become wgmma kernels (warpgroups of 128 threads,
    shared memory within 227 KiB), read in the PTX and assembled by ptxas without spills."""

    @parameterized.parameters(*sorted(name for name, case in MMA_PROGRAMS.items() if case[3] != "tf32"))
    def test_wgmma_kernel_in_ptx(self, name):
        fn, specs, flags, operand = MMA_PROGRAMS[name]
        exe = _compile(_lowered(fn, *[np.ones(shape, dtype) for shape, dtype in specs]), "sm_90a",
                                      Options.from_flags(flags))
        check_executable(self, exe)
        text = "\n".join(exe.ptx.values())
        self.assertEqual(instruction_counts(text)["mma"], 0)
        shapes = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16\.f32\.(\w+)\.(\w+)", text))
        self.assertNotEmpty(shapes)
        for n, a, b in shapes:
            self.assertEqual((a, b), (operand, operand))
            self.assertIn(int(n), (64, 128, 192, 256))
        (launch,) = [launch for launch in exe.plan.launches if launch.shared_bytes > 0]
        self.assertIn(launch.block, [(128, 1, 1), (256, 1, 1)])  # one or two warpgroups
        self.assertLessEqual(launch.shared_bytes, 227 << 10)
        TensorCoreTest.assert_no_spills(self, exe)

    def test_tf32_stays_on_mma_sync(self):
        fn, specs, flags, _ = MMA_PROGRAMS["matmul_tf32"]
        exe = _compile(_lowered(fn, *[np.ones(shape, dtype) for shape, dtype in specs]), "sm_90a",
                                      Options.from_flags(flags))
        text = "\n".join(exe.ptx.values())
        self.assertGreater(instruction_counts(text)["mma"], 0)
        self.assertNotIn("wgmma", text)

    def test_benchmark_matmul_4096(self):
        """The cost model's tile for bench/gpu_check.py's bf16 matmul, launched as chosen; per k tile, the k
        loop issues bk / 16 wgmma between one fence, commit and wait; no spills."""
        a = jax.ShapeDtypeStruct((4096, 4096), bf16)
        exe = _compile(_lowered(lambda a, b: a @ b, a, a), "sm_90a")
        check_executable(self, exe)
        (launch,) = exe.plan.launches
        tiles = choose_wgmma_tiles(4096, 4096, 4096, 1, 2, SM90A)
        self.assertGreaterEqual(tiles.block[0] * tiles.block[1], 128 * 128)
        self.assertGreaterEqual(tiles.stages, 3)
        self.assertEqual(launch.block, (tiles.threads, 1, 1))
        self.assertEqual(launch.grid, (4096 // tiles.block[1], 4096 // tiles.block[0], 1))
        self.assertEqual(launch.shared_bytes, tiles.shared_bytes(2))
        text = exe.ptx[launch.module]
        self.assertLen(re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n{tiles.block[1]}k16\.f32\.bf16", text),
                       tiles.block[2] // 16)
        for pattern in (r"wgmma\.fence\.sync\.aligned", r"wgmma\.commit_group", r"wgmma\.wait_group\.sync\.aligned",
                        r"fence\.proxy\.async\.shared::cta"):
            self.assertLen(re.findall(pattern, text), 1, pattern)
        TensorCoreTest.assert_no_spills(self, exe)


class TensorCoreMatchingTest(absltest.TestCase):
    """Which products on buffers become kernels: the accumulator must hold a known constant."""

    PROGRAM = """
    func.func @main(%a: memref<32x64xbf16>, %b: memref<64x32xbf16>, %bt: memref<32x64xbf16>,
                    %c1: memref<32x32xf32>, %c2: memref<32x32xf32>, %c3: memref<32x32xf32>, %c4: memref<32x32xf32>) {
      %zero = arith.constant 0.0 : f32
      %shared = memref.alloc() : memref<32x32xf32>
      linalg.fill ins(%zero : f32) outs(%shared : memref<32x32xf32>)
      memref.copy %shared, %c1 : memref<32x32xf32> to memref<32x32xf32>
      linalg.matmul {name = "copied_zeros"} ins(%a, %b : memref<32x64xbf16>, memref<64x32xbf16>) outs(%c1 : memref<32x32xf32>)
      linalg.fill ins(%zero : f32) outs(%c2 : memref<32x32xf32>)
      linalg.matmul {name = "accumulates_twice"} ins(%a, %b : memref<32x64xbf16>, memref<64x32xbf16>) outs(%c2 : memref<32x32xf32>)
      linalg.matmul {name = "second"} ins(%a, %b : memref<32x64xbf16>, memref<64x32xbf16>) outs(%c2 : memref<32x32xf32>)
      linalg.matmul {name = "into_shared"} ins(%a, %b : memref<32x64xbf16>, memref<64x32xbf16>) outs(%shared : memref<32x32xf32>)
      memref.copy %shared, %c3 : memref<32x32xf32> to memref<32x32xf32>
      linalg.matmul {name = "copied_after_write"} ins(%a, %b : memref<32x64xbf16>, memref<64x32xbf16>) outs(%c3 : memref<32x32xf32>)
      linalg.fill ins(%zero : f32) outs(%c4 : memref<32x32xf32>)
      linalg.matmul indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d1, d2)>,
                                     affine_map<(d0, d1, d2) -> (d0, d1)>]
        ins(%a, %bt : memref<32x64xbf16>, memref<32x64xbf16>) outs(%c4 : memref<32x32xf32>) {name = "transposed"}
      return
    }"""

    def test_only_products_from_a_known_constant_become_kernels(self):
        from mlir import ir
        from polyblocks_jax.nvptx.tensor_cores import use_tensor_cores
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(self.PROGRAM)
            use_tensor_cores(module, Options(), SM80)
            left = [ir.StringAttr(op.attributes["name"]).value for op in module.body.operations[0].regions[0].blocks[0]
                    .operations if op.operation.name == "linalg.matmul"]
            launches = [op for op in module.body.operations[0].regions[0].blocks[0].operations
                        if op.operation.name == "gpu.launch"]
        # The first product of c2 starts from its fill, the second adds to it (not a constant). Once the
        # copy into c1 is absorbed, the shared buffer's fill only initializes the product into it; that
        # product overwrites the zeros, so the copy into c3 is not a constant. B transposed: not row-major.
        self.assertEqual(left, ["second", "copied_after_write", "transposed"])
        self.assertLen(launches, 3)


class EpilogueMatchingTest(absltest.TestCase):
    """Which consumers of a product the kernel computes: elementwise ones, reached without a write to
    the product's operands on the way."""

    PROGRAM = """
    #id = affine_map<(d0, d1) -> (d0, d1)>
    #col = affine_map<(d0, d1) -> (d1)>
    #row = affine_map<(d0, d1) -> (d0)>
    func.func @main(%a: memref<32x64xbf16>, %b: memref<64x32xbf16>, %bias: memref<32xf32>,
                    %o1: memref<32x32xbf16>, %o2: memref<32x32xf32>, %o3: memref<32xf32>, %other: memref<32xf32>) {
      %zero = arith.constant 0.0 : f32
      %c1 = memref.alloc() : memref<32x32xf32>
      linalg.fill ins(%zero : f32) outs(%c1 : memref<32x32xf32>)
      linalg.matmul ins(%a, %b : memref<32x64xbf16>, memref<64x32xbf16>) outs(%c1 : memref<32x32xf32>)
      linalg.fill ins(%zero : f32) outs(%other : memref<32xf32>)
      linalg.generic {indexing_maps = [#id, #col, #id], iterator_types = ["parallel", "parallel"], name = "bias_relu"}
          ins(%c1, %bias : memref<32x32xf32>, memref<32xf32>) outs(%o1 : memref<32x32xbf16>) {
      ^bb0(%x: f32, %y: f32, %out: bf16):
        %s = arith.addf %x, %y : f32
        %r = arith.maximumf %s, %zero : f32
        %t = arith.truncf %r : f32 to bf16
        linalg.yield %t : bf16
      }
      %c2 = memref.alloc() : memref<32x32xf32>
      linalg.fill ins(%zero : f32) outs(%c2 : memref<32x32xf32>)
      linalg.matmul ins(%a, %b : memref<32x64xbf16>, memref<64x32xbf16>) outs(%c2 : memref<32x32xf32>)
      %bf = arith.constant 1.0 : bf16
      linalg.fill ins(%bf : bf16) outs(%a : memref<32x64xbf16>)
      linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"], name = "after_a_written"}
          ins(%c2 : memref<32x32xf32>) outs(%o2 : memref<32x32xf32>) {
      ^bb0(%x: f32, %out: f32):
        %r = arith.maximumf %x, %zero : f32
        linalg.yield %r : f32
      }
      %c3 = memref.alloc() : memref<32x32xf32>
      linalg.fill ins(%zero : f32) outs(%c3 : memref<32x32xf32>)
      linalg.matmul ins(%a, %b : memref<32x64xbf16>, memref<64x32xbf16>) outs(%c3 : memref<32x32xf32>)
      linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"], name = "row_sum"}
          ins(%c3 : memref<32x32xf32>) outs(%o3 : memref<32xf32>) {
      ^bb0(%x: f32, %out: f32):
        %r = arith.addf %x, %out : f32
        linalg.yield %r : f32
      }
      return
    }"""

    def test_elementwise_consumers_reached_without_writes_to_the_operands_are_fused(self):
        from mlir import ir
        from polyblocks_jax.nvptx.tensor_cores import use_tensor_cores
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(self.PROGRAM)
            use_tensor_cores(module, Options(), SM80)
            ops = [op.operation for op in module.body.operations[0].regions[0].blocks[0].operations]
            left = [ir.StringAttr(op.attributes["name"]).value for op in ops if op.name == "linalg.generic"]
            names = [op.name for op in ops]
        self.assertEqual(left, ["after_a_written", "row_sum"])
        self.assertEqual(names.count("gpu.launch"), 3)
        # The first kernel moved past the fill of an unrelated buffer, to its consumer's place.
        self.assertLess(names.index("linalg.fill"), names.index("gpu.launch"))


class MmaTilesTest(absltest.TestCase):
    """The cost model on its own: choices within the chip's budgets, and the expected ones."""

    def test_choices_fit_the_budgets(self):
        for target in (SM80, SM90):
            for m, n, k, batch in [(4096, 4096, 4096, 1), (100, 40, 72, 1), (16, 16, 16, 1), (2048, 64, 64, 16),
                                   (6272, 128, 1152, 1), (1576, 192, 192, 1), (64, 50000, 64, 1)]:
                for operand_bytes, instruction in ((2, (16, 8, 16)), (4, (16, 8, 8))):
                    tiles = choose_mma_tiles(m, n, k, batch, operand_bytes, instruction, 32, target)
                    with self.subTest(target=target.chip, shape=(m, n, k, batch), bytes=operand_bytes):
                        self.assertLessEqual(tiles.threads, target.max_threads_per_block)
                        self.assertLessEqual(tiles.shared_bytes(operand_bytes), target.shared_bytes_per_block_optin)
                        self.assertLessEqual(tiles.registers(instruction, operand_bytes), target.registers_per_thread)
                        self.assertTrue(tiles.copies_divide(operand_bytes))
                        self.assertEqual([w % 16 for w in tiles.warp], [0, 0])
                        self.assertEqual(tiles.block[2] % instruction[2], 0)
                        self.assertLessEqual((tiles.warp[0] // 16) * (tiles.warp[1] // 8), 32)
                        self.assertGreaterEqual(tiles.stages, 2)

    def test_large_product_gets_large_tiles_and_a_deep_pipeline(self):
        for target in (SM80, SM90):
            tiles = choose_mma_tiles(4096, 4096, 4096, 1, 2, (16, 8, 16), 32, target)
            self.assertEqual(tiles.warp, (64, 64))  # the most reuse of each fragment
            self.assertGreaterEqual(tiles.block[0] * tiles.block[1], 128 * 128)
            self.assertGreaterEqual(tiles.stages, 3)

    def test_small_product_is_not_padded_to_large_tiles(self):
        tiles = choose_mma_tiles(16, 16, 16, 1, 2, (16, 8, 16), 32, SM80)
        self.assertEqual(tiles.block[:2], (16, 16))
        self.assertEqual(tiles.threads, 32)
        self.assertEqual(tiles.stages, 2)  # one k tile: nothing to prefetch

    def test_few_tiles_spread_over_the_sms(self):
        """512 x 512: 128 x 128 blocks would leave most of the 108 SMs idle; smaller ones fill them."""
        tiles = choose_mma_tiles(512, 512, 4096, 1, 2, (16, 8, 16), 32, SM80)
        self.assertGreaterEqual((512 // tiles.block[0]) * (512 // tiles.block[1]), 32)

    def test_wgmma_choices_fit_the_budgets(self):
        for m, n, k, batch in [(4096, 4096, 4096, 1), (100, 40, 72, 1), (64, 64, 16, 1), (2048, 64, 64, 16),
                               (6272, 128, 1152, 1), (64, 50000, 64, 1)]:
            tiles = choose_wgmma_tiles(m, n, k, batch, 2, SM90A)
            with self.subTest(shape=(m, n, k, batch)):
                self.assertIn(tiles.threads, (128, 256))
                self.assertEqual(tiles.block[2], 64)  # one 128-byte swizzled row
                self.assertIn(tiles.block[1], (64, 128, 192, 256))
                self.assertLessEqual(tiles.shared_bytes(2), SM90A.shared_bytes_per_block_optin)
                self.assertLessEqual(tiles.registers((64, tiles.block[1], 16), 2), SM90A.registers_per_thread)
                self.assertTrue(tiles.copies_divide(2))

    def test_shared_memory_budget_bounds_the_pipeline(self):
        """sm_90 has more shared memory a block than sm_80: the same product gets at least as deep a pipeline."""
        a80, a90 = (choose_mma_tiles(8192, 8192, 8192, 1, 2, (16, 8, 16), 32, t) for t in (SM80, SM90))
        self.assertGreaterEqual(a90.stages * a90.block[2], a80.stages * a80.block[2])
        self.assertLessEqual(a80.shared_bytes(2), SM80.shared_bytes_per_block_optin)


# (m, n, k, batch dims, operand, tiles, initial accumulator): tiles chosen to cover 1 to 8 warps, 2 to 4
# stages, every k tile, edges in m, n and k, batches, and a non-zero fill.
EMULATED = [
    (40, 48, 72, (), "bf16", MmaTiles((32, 32, 32), (16, 16), 2), 0.0),
    (64, 64, 64, (), "f16", MmaTiles((64, 64, 16), (32, 32), 3), 0.0),
    (70, 40, 200, (), "bf16", MmaTiles((64, 32, 32), (32, 16), 4), 0.0),
    (17, 24, 40, (3,), "bf16", MmaTiles((16, 16, 16), (16, 16), 3), 0.0),
    (24, 32, 32, (2, 3), "f16", MmaTiles((32, 32, 32), (16, 16), 2), 0.0),
    (128, 128, 64, (), "bf16", MmaTiles((128, 128, 32), (64, 64), 2), 0.0),
    (48, 96, 160, (), "f16", MmaTiles((32, 64, 64), (16, 32), 3), 0.0),
    (64, 256, 96, (), "bf16", MmaTiles((64, 256, 32), (32, 64), 2), 0.0),
    (16, 16, 8, (), "bf16", MmaTiles((16, 16, 16), (16, 16), 4), 0.0),
    (20, 16, 48, (), "bf16", MmaTiles((16, 16, 16), (16, 16), 2), 1.5),
    (33, 40, 24, (2,), "tf32", MmaTiles((32, 32, 16), (16, 16), 3), 0.0),
    (64, 64, 96, (), "tf32", MmaTiles((64, 64, 32), (32, 32), 2), 0.0),
    # wgmma (sm_90a): 1 or 2 warpgroups, n of 64 to 256 (several 64-column panels of B), edges in m, n, k.
    (64, 64, 64, (), "bf16", WgmmaTiles((64, 64, 64), (16, 64), 2), 0.0),
    (100, 72, 200, (), "f16", WgmmaTiles((64, 128, 64), (16, 128), 3), 0.0),
    (130, 256, 96, (), "bf16", WgmmaTiles((128, 256, 64), (16, 256), 2), 0.5),
    (40, 192, 136, (2,), "bf16", WgmmaTiles((64, 192, 64), (16, 192), 4), 0.0),
]


# (image (n, h, w, c), kernel (kh, kw, f), stride, dilation, operand, tiles): implicit-GEMM convolutions
# with m = n oh ow and k = kh kw c off the tile grid.
EMULATED_CONVS = [
    ((2, 7, 7, 16), (3, 3, 24), 1, 1, "bf16", MmaTiles((32, 16, 32), (16, 16), 3)),
    ((1, 9, 11, 8), (3, 2, 16), 2, 1, "f16", MmaTiles((16, 16, 16), (16, 16), 2)),
    ((2, 8, 8, 8), (2, 2, 32), 1, 2, "bf16", MmaTiles((32, 32, 32), (16, 16), 4)),
    ((1, 6, 6, 4), (3, 3, 16), 1, 1, "tf32", MmaTiles((32, 16, 16), (16, 16), 3)),
    ((2, 7, 7, 16), (3, 3, 24), 1, 1, "bf16", WgmmaTiles((64, 64, 64), (16, 64), 3)),
]


class MmaKernelEmulationTest(parameterized.TestCase):
    """The kernel's text run by tests/nvptx_emulator.py (ldmatrix, mma.sync, wgmma through its
    descriptors and swizzle, cp.async groups as the PTX ISA defines them) against XLA's product or
    convolution of the same operands."""

    @parameterized.parameters(*range(len(EMULATED)))
    def test_product(self, case):
        m, n, k, batch, operand, tiles, init = EMULATED[case]
        rng = np.random.default_rng(case)
        a, b = (_random_operand(rng, batch + s, operand) for s in ((m, k), (k, n)))
        problem = MmaProblem(m, n, k, batch, operand, _instruction(operand), _types(a, b, batch + (m, n)), init)
        c = _emulate(problem, tiles, a, b, batch + (m, n))
        a, b = _tf32(a, operand), _tf32(b, operand)
        expected = support.xla_cpu(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32) + init, a, b)
        support.assert_close(self, [c], expected, msg=str(EMULATED[case]), **_tolerance("matmul"))

    @parameterized.parameters(*range(len(EMULATED_CONVS)))
    def test_convolution(self, case):
        (n, h, w, c), (kh, kw, f), stride, dilation, operand, tiles = EMULATED_CONVS[case]
        rng = np.random.default_rng(case)
        image, kernel = _random_operand(rng, (n, h, w, c), operand), _random_operand(rng, (kh, kw, c, f), operand)
        oh, ow = ((size - (k - 1) * dilation - 1) // stride + 1 for size, k in ((h, kh), (w, kw)))
        window = ConvWindow((oh, ow), (kh, kw), c, (stride, stride), (dilation, dilation))
        matrix = kernel.reshape(kh * kw * c, f)
        problem = MmaProblem(n * oh * ow, f, kh * kw * c, (), operand, _instruction(operand),
                             _types(image, matrix, (n * oh * ow, f)), 0.0, window)
        result = _emulate(problem, tiles, image, matrix, (n * oh * ow, f)).reshape(n, oh, ow, f)
        image, kernel = _tf32(image, operand), _tf32(kernel, operand)
        expected = support.xla_cpu(lambda x, k: jax.lax.conv_general_dilated(
            x, k, (stride, stride), "VALID", rhs_dilation=(dilation, dilation), preferred_element_type=jnp.float32,
            dimension_numbers=("NHWC", "HWIO", "NHWC")), image, kernel)
        support.assert_close(self, [result], expected, msg=str(EMULATED_CONVS[case]), **_tolerance("conv3x3"))


def _random_operand(rng, shape, operand: str) -> np.ndarray:
    return rng.standard_normal(shape).astype({"bf16": bf16, "f16": f16, "tf32": f32}[operand])


def _instruction(operand: str) -> tuple[int, int, int]:
    return (16, 8, 8) if operand == "tf32" else (16, 8, 16)


def _types(a: np.ndarray, b: np.ndarray, c_shape) -> tuple[str, str, str]:
    names = {np.dtype(bf16): "bf16", np.dtype(f16): "f16", np.dtype(f32): "f32"}
    return tuple(f"memref<{'x'.join(map(str, shape))}x{names[np.dtype(dtype)]}>"
                 for shape, dtype in ((a.shape, a.dtype), (b.shape, b.dtype), (c_shape, f32)))


def _emulate(problem: MmaProblem, tiles: MmaTiles, a: np.ndarray, b: np.ndarray, c_shape) -> np.ndarray:
    """C computed by the emulated kernel; it starts as NaN, so every element must be written."""
    from mlir import ir
    c = np.full(c_shape, np.nan, f32)
    with ir.Context():
        text = (wgmma_kernel_function if isinstance(tiles, WgmmaTiles) else kernel_function)("kernel", problem, tiles)
        module = ir.Module.parse(text)
        body = module.body.operations[0].regions[0].blocks[0]
        (launch,) = [op.operation for op in body.operations if op.operation.name == "gpu.launch"]
        nvptx_emulator.run_launch(launch, dict(zip(body.arguments, (a, b, c))))
    return c


def _tf32(x: np.ndarray, operand: str) -> np.ndarray:
    """What the tensor core reads of an f32 operand: its top 19 bits; other operands as they are."""
    return (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(f32) if operand == "tf32" else x


# name -> (function, argument shapes and dtypes): products and convolutions with elementwise consumers
# (bias, activations, scale and shift, residual, conversion) that the kernel computes on its accumulators.
FUSED_PROGRAMS = {
    "matmul_bias_relu_bf16": (lambda a, b, bias: jax.nn.relu(a @ b + bias),
                              [((100, 72), bf16), ((72, 40), bf16), ((40,), bf16)]),
    "matmul_gelu_tanh_to_bf16": (lambda a, b: jax.nn.gelu(jnp.matmul(a, b, preferred_element_type=f32),
                                                          approximate=True).astype(bf16),
                                 [((64, 128), f16), ((128, 48), f16)]),
    "batch_matmul_scale_shift_residual": (
        lambda a, b, scale, shift, residual: jnp.einsum("bmk,bkn->bmn", a, b, preferred_element_type=f32)
        * scale + shift + residual, [((2, 40, 32), bf16), ((2, 32, 24), bf16), ((24,), f32), ((24,), f32),
                                     ((2, 40, 24), f32)]),
    "dense_tokens_bias_bf16": (lambda x, w, bias: x @ w + bias, [((2, 24, 64), bf16), ((64, 32), bf16), ((32,), bf16)]),
    "conv_bias_relu_bf16": (lambda x, w, bias: jax.nn.relu(jax.lax.conv_general_dilated(
        x, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")) + bias),
                            [((2, 6, 6, 16), bf16), ((3, 3, 16, 32), bf16), ((32,), bf16)]),
    "row_scale_transposed_residual": (lambda a, b, scale, residual:
                                      jnp.matmul(a, b, preferred_element_type=f32) * scale[:, None] + residual.T,
        [((48, 64), bf16), ((64, 40), bf16), ((48,), f32), ((40, 48), f32)]),
    "product_and_its_relu": (lambda a, b: (lambda c: (c, jax.nn.relu(c) * 0.5))(
        jnp.matmul(a, b, preferred_element_type=f32)), [((48, 64), bf16), ((64, 40), bf16)]),
}


# Kernels besides the fused one: the residual's transpose, which the consumer reads (the product moves
# past it to its consumer).
OTHER_KERNELS = {"row_scale_transposed_residual": 1}


def _fused_args(name: str) -> list[np.ndarray]:
    rng = np.random.default_rng(len(name))
    return [rng.standard_normal(shape).astype(dtype) for shape, dtype in FUSED_PROGRAMS[name][1]]


class EpilogueFusionTest(parameterized.TestCase):
    """A product's elementwise consumers run in its mma kernel: one kernel in the PTX, and the
    kernel's text, run by the emulator from the host function on, equals XLA."""

    @parameterized.product(name=sorted(FUSED_PROGRAMS), chip=CHIPS + ("sm_90a",))
    def test_one_kernel_in_ptx(self, name, chip):
        exe = _compile(_lowered(FUSED_PROGRAMS[name][0], *_fused_args(name)), chip, DEFAULT)
        check_executable(self, exe)
        # no separate kernel reads the product back
        self.assertLen(exe.plan.launches, 1 + OTHER_KERNELS.get(name, 0))
        counts = instruction_counts("".join(exe.ptx.values()))
        self.assertGreater(counts["wgmma" if chip == "sm_90a" else "mma"], 0)
        TensorCoreTest.assert_no_spills(self, exe)

    @parameterized.product(name=sorted(FUSED_PROGRAMS), chip=("sm_80", "sm_90a"))
    def test_emulated_against_xla(self, name, chip):
        from mlir import ir
        from polyblocks_jax.stablehlo_import import import_program

        fn, args = FUSED_PROGRAMS[name][0], _fused_args(name)
        options = without_host_choices(Options())
        with ir.Context() as context, ir.Location.unknown():
            imported = import_program(_lowered(fn, *args), context)
            target = TARGETS[chip]
            gpu_stages = lowering.nvptx_stages(options, target, None)
            through_tensor_cores = gpu_stages[:[stage.name for stage in gpu_stages].index("tensor-cores") + 1]
            stages = passes.shared_stages(options, target.hardware()) + through_tensor_cores
            passes.run_stages(imported.module, stages, options)
            main = next(op.operation for op in imported.module.body.operations if op.operation.name == "func.func")
            results = nvptx_emulator.run_function(main, args)
        expected = support.xla_cpu(fn, *args)
        support.assert_close(self, results, expected, msg=name,
                             **({} if all(r.dtype != f32 for r in results) else _tolerance("matmul")))


@absltest.skipUnless(runtime.available(), "needs cuda-python and a CUDA GPU")
class GpuExecutionTest(parameterized.TestCase):
    """On a GPU: results of the PTX equal XLA's on the host."""

    @parameterized.parameters(*sorted(PROGRAMS))
    def test_program(self, name):
        fn, args = PROGRAMS[name][0], _args(name)
        exe = _compile(_lowered(fn, *args), runtime.device().chip)
        support.assert_close(self, list(exe(*args)), support.xla_cpu(fn, *args), msg=name, **_tolerance(name))


if __name__ == "__main__":
    absltest.main()
