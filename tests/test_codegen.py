"""Code generation by LLVM (cpu/codegen.py): a module cut into parts, each optimized and
compiled by LLVM's tools or by libLLVM in this process, linked into one library; against XLA.

The matmuls accumulate in another order than XLA: rtol/atol 1e-5, as in test_fusion.py.
"""
import os
import shutil
import subprocess
import sys
import tempfile
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from mlir import ir

import polyblocks_jax as pb
import support
from polyblocks_jax import compiler, cpu
from polyblocks_jax.cpu import codegen, elf, ir_parts
from polyblocks_jax.dumps import Dump
from polyblocks_jax.errors import CompilationError
from polyblocks_jax.passes.transform import walk


def _layers(x, w1, w2, w3):
    h = jax.nn.relu(x @ w1)
    h = jnp.tanh(h @ w2) + h
    return jax.nn.softmax(h @ w3, axis=-1)


def _arguments():
    rng = np.random.default_rng(0)
    shapes = [(16, 64), (64, 64), (64, 64), (64, 32)]
    return [rng.standard_normal(s).astype(np.float32) / 8 for s in shapes]


def _lowered(args):
    return jax.jit(_layers).trace(*args).lower(lowering_platforms=("cpu",))


# Four equal layers (shared, their kernels outlined once) and a few kernels of their own:
# prints the digest of the serialized executable.
_SERIALIZE_REPEATED_LAYERS = """
import hashlib
import jax, jax.numpy as jnp, numpy as np
import polyblocks_jax as pb
def layers(x, *ws):
    for w in ws:
        x = jax.nn.gelu(x @ w) + x
    return jax.nn.softmax(x, axis=-1)
x, w = np.ones((64, 96), np.float32), np.full((96, 96), 0.01, np.float32)
print(hashlib.sha256(pb.compile(jax.jit(layers).lower(x, *[w] * 4)).serialize()).hexdigest())
"""


class CodegenTest(parameterized.TestCase):
    def setUp(self):
        compiler.CACHE.clear()

    @parameterized.parameters(1, 2, 3)  # (3: more parts than cores)
    def test_parts_link_into_one_library(self, parts):
        pieces = []

        def forced(text, _parts):
            pieces.extend(ir_parts.balanced_parts(text, parts))
            return pieces
        args = _arguments()
        with mock.patch.object(codegen, "balanced_parts", forced), support.in_process():
            got = support.polyblocks(_layers, *args)
        self.assertLen(pieces, parts)
        support.assert_close(self, got, support.xla_cpu(_layers, *args), rtol=1e-5, atol=1e-5)

    def test_no_vectorize_leaves_no_stack_temporaries(self):
        # The matmul tiling's register tiles are vectors with or without the vectorize stage:
        # lowered generically, each n-D transfer got a stack buffer in its loop (no-vectorize's
        # ResNet-18 overflowed an OpenMP worker's stack once LLVM stopped unrolling them away).
        options = pb.Options.from_flags("no-vectorize")
        x = np.ones((256, 256), np.float32)
        module = support.module_after("vector-transfers", jnp.matmul, x, x, hardware=cpu.host().hardware(),
                                      options=options)
        with module.context:
            ranks = [ir.VectorType(op.results[0].type if op.name == "vector.transfer_read" else op.operands[0].type).rank
                     for op in walk(module.operation)
                     if op.name in ("vector.transfer_read", "vector.transfer_write")]
        self.assertNotEmpty(ranks)
        self.assertEqual(max(ranks), 1)  # each lowers to one vector load or store
        args = [x / 16, x]
        support.assert_close(self, support.polyblocks(jnp.matmul, *args, options=options),
                             support.xla_cpu(jnp.matmul, *args), rtol=1e-5, atol=1e-5)

    def test_lowering_to_llvm_receives_only_one_dimensional_transfers(self):
        # to-llvm runs no transfer lowering of its own: the vector-transfers stage leaves none
        # of rank > 1, with the vectorize stage's register tiles (a convolution, a transpose,
        # softmax rows) or without them.
        def program(image, kernel, w):
            y = jax.lax.conv_general_dilated(image, kernel, (1, 1), "SAME",
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"))
            return jax.nn.softmax(y.reshape(64, 32) @ w, axis=-1).T + 1.0

        rng = np.random.default_rng(1)
        args = [rng.standard_normal(s).astype(np.float32) / 4 for s in ((1, 8, 8, 16), (3, 3, 16, 32), (32, 48))]
        for flags in ("", "no-vectorize"):
            options = pb.Options.from_flags(flags)
            module = support.module_after("flush-denormals", program, *args, hardware=cpu.host().hardware(),
                                          options=options)
            with module.context:
                ranks = [ir.VectorType(op.results[0].type if op.name == "vector.transfer_read"
                                       else op.operands[0].type).rank
                         for op in walk(module.operation) if op.name in ("vector.transfer_read", "vector.transfer_write")]
            self.assertNotEmpty(ranks, flags)
            self.assertEqual(max(ranks), 1, flags)
            support.assert_close(self, support.polyblocks(program, *args, options=options),
                                 support.xla_cpu(program, *args), rtol=1e-5, atol=1e-5)

    def test_main_passes_kernels_pointers_without_descriptors(self):
        # The lowering builds a memref descriptor for each view main hands a kernel and takes
        # one pointer out of it; folded before LLVM (ViT-Tiny: most of the module's text).
        args = _arguments()
        module = support.module_after("to-llvm", _layers, *args, hardware=cpu.host().hardware())
        with module.context:
            (main,) = [op for op in module.body.operations
                       if op.operation.name == "llvm.func" and op.attributes["sym_name"].value == "main"]
            names = [op.name for op in walk(main.operation)]
        self.assertGreater(names.count("llvm.call"), 3)  # kernels called
        self.assertNotIn("llvm.insertvalue", names)
        support.assert_close(self, support.polyblocks(_layers, *args), support.xla_cpu(_layers, *args),
                             rtol=1e-5, atol=1e-5)

    def test_a_tool_that_fails_names_its_stage(self):
        with mock.patch.object(codegen, "_OPTIMIZER_OPTIONS", ("-no-such-option",)), support.in_process():
            with self.assertRaises(CompilationError) as raised:  # (a cached object would run no tool)
                pb.compile(_lowered(_arguments()), pb.Options(object_cache=False))
        self.assertEqual(raised.exception.stage, "optimize")
        self.assertIn("opt failed", str(raised.exception))

    @parameterized.parameters(1, 2)
    def test_llvm_in_this_process_gives_xlas_results(self, parts):
        # What a compile worker runs (codegen.load_llvm): libLLVM's C API, the parts on threads.
        args = _arguments()
        split = ir_parts.balanced_parts
        with tempfile.TemporaryDirectory() as dump, support.in_process(), \
                mock.patch.object(codegen, "_library", codegen.in_process_llvm()), \
                mock.patch.object(codegen, "balanced_parts", lambda text, _parts: split(text, parts)):
            exe = pb.compile(_lowered(args), pb.Options(dump_dir=dump))
            (folder,) = os.listdir(dump)
            written = os.listdir(os.path.join(dump, folder, "llvm"))
        for part in range(parts):
            self.assertIn(f"opt part{part}", exe.timings)
            self.assertIn(f"llc part{part}", exe.timings)
            self.assertIn(f"part{part}.optimized.ll", written)
            self.assertIn(f"part{part}.s", written)
        support.assert_close(self, list(exe(*args)), support.xla_cpu(_layers, *args), rtol=1e-5, atol=1e-5)

    def test_llvm_in_this_process_gives_the_objects_of_opt_and_llc(self):
        # Byte for byte: the same code, at the same speed.
        x = np.random.default_rng(0).standard_normal((64, 32, 128)).astype(np.float32)
        with tempfile.TemporaryDirectory() as dump, support.in_process():
            pb.compile(jax.jit(lambda a: jnp.cumsum(a, axis=-1)).trace(x).lower(lowering_platforms=("cpu",)),
                       pb.Options(dump_dir=dump, object_cache=False))
            (folder,) = os.listdir(dump)
            with open(os.path.join(dump, folder, "llvm", "translated.ll")) as f:
                text = f.read()
        passes = codegen._OPTIMIZER_PASSES
        in_process = codegen.in_process_llvm().object_code(text, 2, passes, {}, "part0")
        by_tools = codegen._object_code_by_tools(text, "part0", passes, 2, {}, Dump(None, ""))
        self.assertEqual(in_process, by_tools)

    def test_an_llvm_error_in_this_process_is_a_compilation_error(self):
        library = codegen.in_process_llvm()
        with self.assertRaisesRegex(CompilationError, "LLVM cannot parse part0") as raised:
            library.object_code("define void @f( {", 2, "function(sroa)", {}, "part0")
        self.assertEqual(raised.exception.stage, "optimize")
        with self.assertRaisesRegex(CompilationError, "optimizer failed on part0") as raised:
            library.object_code("define void @f() {\n  ret void\n}\n", 2, "no-such-pass", {}, "part0")
        self.assertEqual(raised.exception.stage, "optimize")
        # and the library goes on compiling
        self.assertTrue(library.object_code("define void @f() {\n  ret void\n}\n", 2, "function(sroa)", {}, "f"))

    @absltest.skipIf(shutil.which("readelf") is None, "needs binutils' readelf")
    def test_the_linker_run_directly_links_libm_by_version(self):
        # codegen._linker spares the C compiler driver: libm must still be linked, its
        # symbols versioned (an unversioned cbrtf would bind to the oldest version).
        x = np.linspace(-8, 8, 64, dtype=np.float32)
        exe = pb.compile(jax.jit(jnp.cbrt).trace(x).lower(lowering_platforms=("cpu",)))
        with tempfile.NamedTemporaryFile(suffix=".so") as library:
            library.write(exe._exe.library)
            library.flush()
            versions = subprocess.run(["readelf", "-V", library.name], capture_output=True, text=True).stdout
        self.assertIn("File: libm.so.6", versions)
        support.assert_close(self, list(exe(x)), support.xla_cpu(jnp.cbrt, x))

    @absltest.skipIf(shutil.which("readelf") is None, "needs binutils' readelf")
    def test_code_calling_nothing_outside_links_no_library(self):
        x = np.ones((8, 8), np.float32)
        exe = pb.compile(jax.jit(lambda a: a * 2.0 + 1.0).trace(x).lower(lowering_platforms=("cpu",)))
        with tempfile.NamedTemporaryFile(suffix=".so") as library:
            library.write(exe._exe.library)
            library.flush()
            dynamic = subprocess.run(["readelf", "-d", library.name], capture_output=True, text=True).stdout
        self.assertNotIn("NEEDED", dynamic)
        support.assert_close(self, list(exe(x)), [x * 2.0 + 1.0])

    def test_a_link_names_only_the_libraries_defining_what_the_code_calls(self):
        from polyblocks_jax.cpu.executable import openmp_runtime
        libm, libc = codegen._system_libraries(codegen._LINKER)
        self.assertEqual(codegen._libraries(set(), openmp_runtime()), ())
        self.assertEqual(codegen._libraries({"sinf"}, openmp_runtime()), (libm,))
        self.assertEqual(codegen._libraries({"memcpy", "expf"}, openmp_runtime()), (libm, libc))
        with_openmp = codegen._libraries({"__kmpc_fork_call", "memset"}, openmp_runtime())
        self.assertIn("-lomp", with_openmp)
        self.assertNotIn(libm, with_openmp)
        # a builtin none of them defines: every library, libgcc's builtins among them
        self.assertEqual(codegen._libraries({"__udivti3", "memcpy"}, openmp_runtime())[-3:],
                         codegen._linker(codegen._LINKER)[1][-3:])

    def test_undefined_symbols_of_objects(self):
        library = codegen.in_process_llvm()
        caller = library.object_code("declare float @expf(float)\ndeclare void @g()\n"
                                     "define float @f(float %x) {\n  call void @g()\n"
                                     "  %y = call float @expf(float %x)\n  ret float %y\n}\n", 2, "function(sroa)", {}, "a")
        callee = library.object_code("define void @g() {\n  ret void\n}\n", 2, "function(sroa)", {}, "b")
        self.assertEqual(elf.undefined_symbols([caller]), {"expf", "g"})
        self.assertEqual(elf.undefined_symbols([caller, callee]), {"expf"})
        self.assertEqual(elf.undefined_symbols([callee]), set())

    def test_each_process_compiles_the_same_executable(self):
        # Nothing may depend on Python's string hashing or on where MLIR put its objects
        # (kernels compared with use-list orders once kept a different set each run).
        serialized = []
        for seed in ("1", "2"):
            done = subprocess.run([sys.executable, "-c", _SERIALIZE_REPEATED_LAYERS], capture_output=True,
                                  text=True, env={**os.environ, "PYTHONHASHSEED": seed}, timeout=300)
            self.assertEqual(done.returncode, 0, done.stderr[-2000:])
            serialized.append(done.stdout.split()[-1])
        self.assertEqual(*serialized)

    def test_the_library_is_what_serializes(self):
        args = _arguments()
        exe = pb.compile(_lowered(args))
        self.assertTrue(exe.serialize().endswith(exe._exe.library))
        loaded = pb.deserialize(exe.serialize())
        support.assert_close(self, list(loaded(*args)), support.xla_cpu(_layers, *args), rtol=1e-5, atol=1e-5)


# Kernels written by hand, run by MLIR's ExecutionEngine (support.run_kernel).
class StridedGatherTest(absltest.TestCase):
    # A gather from a column view (what bufferization left in JAX's QDWH eigensolver):
    # LLVM's gather lowering takes unit-stride sources only.
    KERNEL = """
    func.func @gather_column(%m: memref<8x8xf32>, %out: memref<4xf32>) {
      %c1 = arith.constant 1 : index
      %c0 = arith.constant 0 : index
      %column = memref.subview %m[0, 3] [8, 1] [1, 1] : memref<8x8xf32> to memref<8xf32, strided<[8], offset: 3>>
      %idx = arith.constant dense<[0, 2, 5, 6]> : vector<4xindex>
      %mask = arith.constant dense<true> : vector<4xi1>
      %pass = arith.constant dense<0.0> : vector<4xf32>
      %g = vector.gather %column[%c1] [%idx], %mask, %pass
        : memref<8xf32, strided<[8], offset: 3>>, vector<4xindex>, vector<4xi1>, vector<4xf32> into vector<4xf32>
      vector.store %g, %out[%c0] : memref<4xf32>, vector<4xf32>
      return
    }"""

    def test_reads_the_columns_elements(self):
        from polyblocks_jax.cpu.vector_reads import lower_vector_reads
        m = np.arange(64, dtype=np.float32).reshape(8, 8) / 7
        out = np.zeros(4, np.float32)
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(self.KERNEL)
            lower_vector_reads(module, pb.Options())
            sources = [op.operands[0].type for op in walk(module.operation) if op.name == "vector.gather"]
            self.assertEqual([str(t) for t in sources], ["memref<57xf32, strided<[1], offset: ?>>"])
            support.run_kernel(module, "gather_column", m, out)
        support.assert_close(self, [out], support.xla_cpu(lambda m: m[1 + np.array([0, 2, 5, 6]), 3], m))


class StridedColumnReadTest(absltest.TestCase):
    # A column of narrow rows read as a vector ((N, 4) boxes' x0): one contiguous load of the
    # span and a shuffle (the transfer lowering loaded and inserted lane by lane); a column
    # of wide rows (stride 16) keeps the transfer.
    KERNEL = """
    func.func @columns(%m: memref<32x4xf32>, %w: memref<4x16xf32>, %out: memref<16xf32>, %wide: memref<4xf32>) {
      %c0 = arith.constant 0 : index
      %c16 = arith.constant 16 : index
      %pad = arith.constant 0.0 : f32
      %column = memref.subview %m[0, 2] [32, 1] [1, 1] : memref<32x4xf32> to memref<32xf32, strided<[4], offset: 2>>
      %x = vector.transfer_read %column[%c16], %pad {in_bounds = [true]} : memref<32xf32, strided<[4], offset: 2>>, vector<16xf32>
      vector.transfer_write %x, %out[%c0] {in_bounds = [true]} : vector<16xf32>, memref<16xf32>
      %wcol = memref.subview %w[0, 5] [4, 1] [1, 1] : memref<4x16xf32> to memref<4xf32, strided<[16], offset: 5>>
      %y = vector.transfer_read %wcol[%c0], %pad {in_bounds = [true]} : memref<4xf32, strided<[16], offset: 5>>, vector<4xf32>
      vector.transfer_write %y, %wide[%c0] {in_bounds = [true]} : vector<4xf32>, memref<4xf32>
      return
    }"""

    def test_one_load_and_a_shuffle(self):
        from polyblocks_jax.cpu.vector_reads import lower_vector_reads
        rng = np.random.default_rng(1)
        m, w = rng.standard_normal((32, 4)).astype(np.float32), rng.standard_normal((4, 16)).astype(np.float32)
        out, wide = np.zeros(16, np.float32), np.zeros(4, np.float32)
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(self.KERNEL)
            lower_vector_reads(module, pb.Options())
            text = str(module)
            self.assertRegex(text, r"vector\.load .* vector<61xf32>")  # rows 16..31: 15 * 4 + 1 elements
            self.assertEqual(text.count("vector.shuffle"), 1)
            self.assertEqual(text.count("vector.transfer_read"), 1)  # the stride-16 column's
            support.run_kernel(module, "columns", m, w, out, wide)
        support.assert_close(self, [out, wide], support.xla_cpu(lambda m, w: (m[16:, 2], w[:, 5]), m, w))


class BroadcastReadTest(absltest.TestCase):
    # What the vectorizer makes of a Householder step's v[k] * x[k, :]: a read of one
    # element broadcast along the row (the transfer lowering loaded it once per lane).
    KERNEL = """
    func.func @scaled_row(%v: memref<8x1xf32>, %x: memref<8x16xf32>, %out: memref<16xf32>) {
      %c0 = arith.constant 0 : index
      %c5 = arith.constant 5 : index
      %pad = arith.constant 0.0 : f32
      %element = memref.subview %v[%c5, 0] [1, 1] [1, 1] : memref<8x1xf32> to memref<1x1xf32, strided<[1, 1], offset: ?>>
      %b = vector.transfer_read %element[%c0, %c0], %pad {in_bounds = [true, true],
        permutation_map = affine_map<(d0, d1) -> (d0, 0)>} : memref<1x1xf32, strided<[1, 1], offset: ?>>, vector<1x16xf32>
      %row = vector.transfer_read %x[%c5, %c0], %pad {in_bounds = [true, true]} : memref<8x16xf32>, vector<1x16xf32>
      %p = arith.mulf %b, %row : vector<1x16xf32>
      %flat = vector.shape_cast %p : vector<1x16xf32> to vector<16xf32>
      vector.transfer_write %flat, %out[%c0] {in_bounds = [true]} : vector<16xf32>, memref<16xf32>
      return
    }"""

    def test_one_load_broadcast(self):
        from polyblocks_jax.cpu.vector_reads import lower_vector_reads
        rng = np.random.default_rng(0)
        v, x = rng.standard_normal((8, 1)).astype(np.float32), rng.standard_normal((8, 16)).astype(np.float32)
        out = np.zeros(16, np.float32)
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(self.KERNEL)
            lower_vector_reads(module, pb.Options())
            names = [op.name for op in walk(module.operation)]
            # The row's read (a minor identity) stays; the element's is a load and a broadcast.
            self.assertEqual((names.count("vector.transfer_read"), names.count("memref.load"),
                              names.count("vector.broadcast")), (1, 1, 1))
            support.run_kernel(module, "scaled_row", v, x, out)
        support.assert_close(self, [out], support.xla_cpu(lambda v, x: v[5, 0] * x[5], v, x))


class LargeConstantTest(absltest.TestCase):
    """Constants beyond constants.INLINE_BYTES reach the library as bytes beside the IR."""

    def setUp(self):
        compiler.CACHE.clear()

    @staticmethod
    def _closed_over():
        rng = np.random.default_rng(4)
        w = rng.standard_normal((256, 96)).astype(np.float32) / 16       # 96 KiB
        steps = np.arange(9000, dtype=np.float16) / 64                  # 18000 bytes of f16
        levels = (np.arange(20000) % 7).astype(np.int8)                 # 20000 bytes of i8
        small = np.linspace(-1, 1, 96).astype(np.float32)               # stays in the IR

        def fn(x):
            return (jax.nn.relu(x @ w + small), x[:, :1].astype(jnp.float16) * steps,
                    x[:, :1].astype(jnp.int8) + levels)
        return fn, rng.standard_normal((8, 256)).astype(np.float32)

    def test_large_globals_become_declarations(self):
        fn, x = self._closed_over()
        detached = []
        detach = cpu.constants.detach_large_constants

        def recorded(module):
            blobs = detach(module)
            detached.extend(blobs)
            text = str(module)
            for blob in blobs:  # declared, not defined, in the IR
                self.assertRegex(text, rf"llvm.mlir.global external constant @{blob.symbol}\(\)")
            return blobs
        with mock.patch.object(cpu.constants, "detach_large_constants", recorded), support.in_process():
            got = support.polyblocks(fn, x)
        self.assertEqual(sorted(len(b.data) for b in detached), [18000, 20000, 98304])
        support.assert_close(self, got, support.xla_cpu(fn, x), rtol=1e-5, atol=1e-5)

    def test_constants_travel_with_the_serialized_library(self):
        fn, x = self._closed_over()
        exe = pb.compile(jax.jit(fn).trace(x).lower(lowering_platforms=("cpu",)))
        loaded = pb.deserialize(exe.serialize())
        support.assert_close(self, list(loaded(x)), support.xla_cpu(fn, x), rtol=1e-5, atol=1e-5)


if __name__ == "__main__":
    absltest.main()
