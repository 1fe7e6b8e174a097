"""bf16 on a host without bf16 arithmetic (cpu/bf16.py): programs that made LLVM call
``__truncsfbf2``, which the JIT cannot resolve, and the module's own definition of it.

LLVM promotes bf16 selects, and the sign ops its instcombine narrows back to bf16, to f32
and rounds with that routine: max/min reductions, softmax, abs or neg in a branch.

On a host with AVX-512 BF16, vectors of computed values round with VCVTNEPS2BF16
(cpu/avx512_bf16.py): the rewrite itself, and its results against XLA's bits.
"""
import ctypes
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from absl.testing import absltest, parameterized
from jax import lax
from mlir import execution_engine, ir

import polyblocks_jax as pb
import support
from polyblocks_jax import cpu
from polyblocks_jax.cpu.avx512_bf16 import round_computed_vectors
from polyblocks_jax.cpu.bf16 import bf16_vectors_as_bits, define_truncsfbf2, emulate_bf16_arithmetic

BF16 = ml_dtypes.bfloat16
SETTINGS = (pb.Options(), pb.Options(fusion=False, tiling=False, parallel=False, vectorize=False))


def _bf16(seed: int, shape, edge: bool = True) -> np.ndarray:
    return support.random_array(np.random.default_rng(seed), shape, BF16, edge)


def _rounded(module: ir.Module) -> bool:
    """The host's stages on bf16 vector arithmetic: in f32, then the rounding instruction."""
    emulate_bf16_arithmetic(module, pb.Options())
    return round_computed_vectors(module, pb.Options())


class ProgramsTest(parameterized.TestCase):
    @parameterized.named_parameters(
        # tests/fuzz/regressions/bf16-max-reduce-truncsfbf2.json and default-dda4a00ed6.json
        ("max_min_reductions", lambda x: (x.max(), x.min(0), x.max(1)), (16, 64)),
        # XLA CPU's max reduction drops NaN operands where we keep them: no edge values.
        ("softmax", lambda x: jax.nn.softmax(x, -1), (8, 64), False),
        # rows of whole vectors, tiled: its division by the row sum is a product (1 ulp at most)
        ("softmax_rows", lambda x: jax.nn.softmax(x, -1), (4, 16, 256), False),
        ("select_clamp_abs", lambda x: (jnp.where(x > 0, x, -x), jnp.clip(x, -0.5, 0.5), jnp.abs(x)), (4, 40)),
        # default-fcb0d78ab1.json: abs and neg in the branches of a bf16 condition
        ("cond_abs_neg", lambda x: lax.cond(x[0] > 0, jnp.abs, jnp.negative, x), (5,)),
        ("argmax_sort", lambda x: (jnp.argmax(x, -1), jnp.sort(x, -1)), (4, 16), False),
    )
    def test_against_xla(self, fn, shape, edge=True):
        x = _bf16(sum(shape), shape, edge)
        for options in SETTINGS:
            support.check_against_xla(self, fn, x, options=options)


class OddRowsTest(parameterized.TestCase):
    """bf16 rows moved in vectors whose last is of 8k+1 lanes (25 = 16 + 9, 41 = 32 + 9):
    on a host with AVX-512 BF16, llc could not split such a bf16 vector's load or store
    (cpu/bf16.py's ``bf16_vectors_as_bits``). Moves: XLA's bits exactly."""

    @parameterized.named_parameters(
        ("broadcast", lambda x: jnp.broadcast_to(x, (3, *x.shape)), (4, 25)),
        ("broadcast_rows", lambda x: jnp.broadcast_to(x[:, None], (x.shape[0], 5, x.shape[1])), (3, 41)),
        ("tile", lambda x: jnp.tile(x, (2, 3)), (2, 25)),
        ("transpose", lambda x: (x.T, jnp.transpose(x.reshape(5, 5, 1, 9), (2, 1, 0, 3))), (25, 9)),
        ("patches", lambda x: lax.conv_general_dilated_patches(x, (5, 5), (1, 1), ((2, 2), (2, 2))), (1, 10, 10, 5)),
    )
    def test_against_xla(self, fn, shape):
        support.check_against_xla(self, fn, _bf16(len(shape), shape), rtol=0, atol=0)

    def test_moves_become_i16_moves(self):
        # Every move of a bf16 vector takes and gives i16 lanes; the casts between two moves
        # cancel, those to and from the bf16 scalars moved in and out stay.
        module_text = """
        llvm.func @f(%a: !llvm.ptr, %b: !llvm.ptr, %m: vector<9xi1>, %x: bf16) {
          %p = llvm.mlir.poison : vector<9xbf16>
          %v = llvm.load %a {alignment = 2 : i64} : !llvm.ptr -> vector<9xbf16>
          %s = llvm.select %m, %v, %p : vector<9xi1>, vector<9xbf16>
          %c = llvm.mlir.constant(3 : i32) : i32
          %i = llvm.insertelement %x, %s[%c : i32] : vector<9xbf16>
          %e = llvm.extractelement %i[%c : i32] : vector<9xbf16>
          llvm.store %e, %b : bf16, !llvm.ptr
          %r = llvm.shufflevector %i, %p [8, 7, 6, 5, 4, 3, 2, 1, 0] : vector<9xbf16>
          llvm.store %r, %b {alignment = 2 : i64} : vector<9xbf16>, !llvm.ptr
          llvm.intr.masked.store %i, %b, %m {alignment = 2 : i32} : vector<9xbf16>, vector<9xi1> into !llvm.ptr
          llvm.return
        }
        """
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(module_text)
            self.assertTrue(bf16_vectors_as_bits(module, pb.Options()))
            self.assertTrue(module.operation.verify())
            text = str(module)
        self.assertNotIn("xbf16>", text)
        self.assertEqual(text.count("llvm.bitcast"), 2)
        self.assertRegex(text, r"llvm\.load .* -> vector<9xi16>")


class TruncsfbfTest(absltest.TestCase):
    """The definition added to every module: round to nearest even, NaN kept, as compiler-rt."""

    KERNEL = """
    llvm.func @round_all(%src: !llvm.ptr, %dst: !llvm.ptr, %n: i64) {
      %zero = llvm.mlir.constant(0 : i64) : i64
      %one = llvm.mlir.constant(1 : i64) : i64
      llvm.br ^loop(%zero : i64)
    ^loop(%i: i64):
      %more = llvm.icmp "slt" %i, %n : i64
      llvm.cond_br %more, ^body, ^done
    ^body:
      %p = llvm.getelementptr %src[%i] : (!llvm.ptr, i64) -> !llvm.ptr, f32
      %x = llvm.load %p : !llvm.ptr -> f32
      %y = llvm.call @__truncsfbf2(%x) : (f32) -> bf16
      %q = llvm.getelementptr %dst[%i] : (!llvm.ptr, i64) -> !llvm.ptr, bf16
      llvm.store %y, %q : bf16, !llvm.ptr
      %next = llvm.add %i, %one : i64
      llvm.br ^loop(%next : i64)
    ^done:
      llvm.return
    }
    llvm.func @__truncsfbf2(f32) -> bf16
    """

    def test_matches_ml_dtypes_rounding(self):
        rng = np.random.default_rng(0)
        bits = np.concatenate([
            rng.integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32),
            (np.arange(2 ** 16, dtype=np.uint32) << 16) | 0x8000,  # every halfway case
            (np.arange(2 ** 16, dtype=np.uint32) << 16) | 0x7FFF,
            np.array([0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7F800001, 0xFFC00001,
                      0x00000001, 0x80008000, 0x00000000, 0x80000000], np.uint32)])
        x = bits.view(np.float32)
        got = self._round(x)
        with np.errstate(invalid="ignore"):  # NaN inputs
            want = x.astype(BF16)
        nan = np.isnan(want.astype(np.float32))
        np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
        np.testing.assert_array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])

    def _round(self, x: np.ndarray) -> np.ndarray:
        with ir.Context():
            module = ir.Module.parse(self.KERNEL)
            ir.SymbolTable(module.operation)["__truncsfbf2"].erase()  # the declaration, for parsing
            define_truncsfbf2(module, pb.Options())
            engine = execution_engine.ExecutionEngine(module, opt_level=2)
            out = np.empty(x.shape, BF16)
            args = [ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(out.ctypes.data), ctypes.c_int64(x.size)]
            packed = (ctypes.c_void_p * 3)(*[ctypes.addressof(a) for a in args])
            ctypes.CFUNCTYPE(None, ctypes.c_void_p)(engine.raw_lookup("round_all"))(packed)  # packed ABI
            return out


class RoundingInstructionTest(absltest.TestCase):
    """f32 -> bf16 roundings of computed vectors by VCVTNEPS2BF16, of converted ones exactly."""

    MODULE = """
    func.func @f(%a: vector<32xf32>, %b: vector<32xf32>, %h: vector<32xbf16>, %g: vector<32xbf16>)
        -> (vector<32xbf16>, vector<32xbf16>, vector<32xbf16>, vector<32xbf16>, vector<32xf32>, vector<32xbf16>) {
      %sum = arith.addf %a, %b : vector<32xf32>
      %computed = arith.truncf %sum : vector<32xf32> to vector<32xbf16>
      %converted = arith.truncf %a : vector<32xf32> to vector<32xbf16>
      %wide_h = arith.extf %h : vector<32xbf16> to vector<32xf32>
      %wide_g = arith.extf %g : vector<32xbf16> to vector<32xf32>
      %max = arith.maximumf %wide_h, %wide_g : vector<32xf32>
      %extremum = arith.truncf %max : vector<32xf32> to vector<32xbf16>
      %product = arith.mulf %h, %g : vector<32xbf16>
      %difference = arith.subf %a, %b : vector<32xf32>
      %rounded = arith.truncf %difference : vector<32xf32> to vector<32xbf16>
      %widened = arith.extf %rounded : vector<32xbf16> to vector<32xf32>
      %third = arith.constant dense<0.3> : vector<32xf32>
      %capped = arith.maximumf %wide_h, %third : vector<32xf32>
      %capped_bf16 = arith.truncf %capped : vector<32xf32> to vector<32xbf16>
      return %computed, %converted, %extremum, %product, %widened, %capped_bf16
          : vector<32xbf16>, vector<32xbf16>, vector<32xbf16>, vector<32xbf16>, vector<32xf32>, vector<32xbf16>
    }
    """

    def test_rewrite(self):
        # A sum: two 16-lane instructions; an input converted: left to the exact rounding; an
        # extremum of bf16 values: its high halves; bf16 arithmetic: computed in f32 first; a
        # rounding widened again: left to the integer ops, which LLVM folds with the widening
        # into one mask (the instruction and the widening took 1.3-1.5x as long: GELU); the
        # max of a bf16 value and 0.3 (no bf16 value): rounded.
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(self.MODULE)
            self.assertTrue(_rounded(module))
            text = str(module)
        self.assertEqual(text.count("x86vector.avx512.cvt.packed.f32_to_bf16"), 6)
        self.assertEqual(text.count("arith.truncf"), 2)
        self.assertRegex(text, r"arith\.truncf %arg0 : vector<32xf32> to vector<32xbf16>")
        self.assertRegex(text, r"arith\.truncf %\d+ : vector<32xf32> to vector<32xbf16>\n.*arith\.extf")
        self.assertEqual(len(re.findall(r"arith\.shrui .* : vector<32xi32>", text)), 1)
        self.assertNotRegex(text, r"arith\.mulf .* : vector<32xbf16>")

    def test_assembled_parts_round_with_the_instruction(self):
        # exp's result: its 16-lane VSCALEFPS parts inserted into the polynomial's vector, a
        # computed value too; inserted into an argument, not.
        module_text = """
        func.func @f(%a: vector<16xf32>, %b: vector<16xf32>, %n: vector<16xf32>, %c: vector<32xf32>)
            -> vector<32xbf16> {
          %m = arith.constant -1 : i16
          %r = arith.constant 4 : i32
          %sum = arith.addf %c, %c : vector<32xf32>
          %sa = x86vector.avx512.mask.scalef %a, %n, %a, %m, %r : vector<16xf32>
          %sb = x86vector.avx512.mask.scalef %b, %n, %b, %m, %r : vector<16xf32>
          %low = vector.insert_strided_slice %sa, DEST {offsets = [0], strides = [1]} : vector<16xf32> into vector<32xf32>
          %both = vector.insert_strided_slice %sb, %low {offsets = [16], strides = [1]} : vector<16xf32> into vector<32xf32>
          %rounded = arith.truncf %both : vector<32xf32> to vector<32xbf16>
          return %rounded : vector<32xbf16>
        }
        """
        for dest, instructions in (("%sum", 2), ("%c", 0)):
            with ir.Context(), ir.Location.unknown():
                module = ir.Module.parse(module_text.replace("DEST", dest))
                _rounded(module)
                self.assertEqual(str(module).count("x86vector.avx512.cvt.packed.f32_to_bf16"), instructions, dest)

    def test_division_by_a_loop_invariant_is_a_product(self):
        # A softmax's division by its row sum: the reciprocal once, before the loop; a
        # division by a value of the loop, or one whose f32 quotient is used, stays.
        module_text = """
        func.func @f(%m: memref<64xbf16>, %o: memref<64xbf16>, %w: memref<64xf32>, %s: f32) {
          %c0 = arith.constant 0 : index
          %c1 = arith.constant 1 : index
          %c4 = arith.constant 4 : index
          %sum = vector.broadcast %s : f32 to vector<16xf32>
          %den = arith.truncf %sum : vector<16xf32> to vector<16xbf16>
          scf.for %i = %c0 to %c4 step %c1 {
            %x = vector.load %m[%c0] : memref<64xbf16>, vector<16xbf16>
            %q = arith.divf %x, %den : vector<16xbf16>
            vector.store %q, %o[%c0] : memref<64xbf16>, vector<16xbf16>
            %y = arith.divf %den, %x : vector<16xbf16>
            vector.store %y, %o[%c1] : memref<64xbf16>, vector<16xbf16>
            %wx = arith.extf %x : vector<16xbf16> to vector<16xf32>
            %f = arith.divf %wx, %sum : vector<16xf32>
            vector.store %f, %w[%c0] : memref<64xf32>, vector<16xf32>
          }
          return
        }
        """
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(module_text)
            _rounded(module)
            text = str(module)
        before_loop, loop = text.split("scf.for")
        self.assertEqual(before_loop.count("arith.divf"), 1)
        self.assertEqual(loop.count("arith.divf"), 2)
        self.assertEqual(loop.count("arith.mulf"), 1)

    def test_bits_as_xla(self):
        # Halfway cases, values rounding to the largest finite and past it, computed subnormals
        # (0, as XLA's with subnormals flushed) and f32 subnormals converted (kept, as XLA's).
        # (No subnormal inputs to arithmetic: XLA reads them as 0, we do not.)
        if not cpu.host().has_avx512_bf16:
            self.skipTest("the host has no AVX-512 BF16: the instruction is not used")
        # The default pipeline: with no-fusion, t * 1e-9 reaches memory as an f32 subnormal
        # (we compute with subnormals, XLA flushes them), and its conversion keeps it exactly.
        support.without_flags(self)
        rng = np.random.default_rng(3)
        x = _bf16(5, (16, 128), edge=False)
        y = _bf16(6, (16, 128), edge=False)
        y[0, :8] = np.float32([1.0 + 2 ** -8, 3e38, 1e-30, -1e-30, 2.0, 1e-20, np.nan, np.inf]).astype(BF16)
        x[0, :8] = np.float32([1.0, 1e38, 1e-9, 1e-9, 2 ** -9, 1e-20, 1.0, -np.inf]).astype(BF16)
        small = rng.standard_normal((16, 128)).astype(np.float32) * np.float32(1e-30)
        subnormal = small * np.float32(1e-9)

        def fn(a, b, t, s):
            return a + b, a * b, jnp.exp(a) - b, a / b, (t * 1e-9).astype(jnp.bfloat16), s.astype(jnp.bfloat16)
        actual, expected = (run(fn, x, y, small, subnormal) for run in (support.polyblocks, support.xla_cpu))
        for got, want in zip(actual, expected):
            nan = np.isnan(want.astype(np.float32))
            np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
            np.testing.assert_array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])


if __name__ == "__main__":
    absltest.main()
