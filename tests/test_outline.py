"""Kernel outlining (cpu/outline.py): each top-level loop nest in a private, noinline
function that recomputes its constants and views; on IR, then programs against XLA with
parallel loops on and off.

The matmuls accumulate in another order than XLA: rtol/atol 1e-5, as in test_fusion.py.
"""
import dataclasses
import glob
import os
import re
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from mlir import ir

import polyblocks_jax as pb
import support
from polyblocks_jax import compiler
from polyblocks_jax.cpu import lowering, outline
from polyblocks_jax.passes import run_stages
from polyblocks_jax.passes.transform import walk

# Three kernels: a parallel loop on a view, a loop yielding a value (used after it), and a
# loop inside a while loop (its induction value comes from outside the kernel).
_KERNELS = """
func.func @main(%a: memref<64xf32>, %arena: memref<1024xi8>, %out: memref<f32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c16 = arith.constant 16 : index
  %one = arith.constant 1.0 : f32
  %zero = arith.constant 0.0 : f32
  %view = memref.view %arena[%c0][] : memref<1024xi8> to memref<16x16xf32>
  %row = memref.subview %a[16] [16] [1] : memref<64xf32> to memref<16xf32, strided<[1], offset: 16>>
  scf.parallel (%i) = (%c0) to (%c16) step (%c1) {
    %x = memref.load %row[%i] : memref<16xf32, strided<[1], offset: 16>>
    memref.store %x, %view[%i, %i] : memref<16x16xf32>
    scf.reduce
  }
  %sum = scf.for %i = %c0 to %c16 step %c1 iter_args(%s = %zero) -> f32 {
    %x = memref.load %view[%i, %i] : memref<16x16xf32>
    %t = arith.addf %s, %x : f32
    scf.yield %t : f32
  }
  memref.store %sum, %out[] : memref<f32>
  %n = scf.while (%k = %c0) : (index) -> index {
    %more = arith.cmpi ult, %k, %c16 : index
    scf.condition(%more) %k : index
  } do {
  ^bb0(%k: index):
    scf.for %j = %c0 to %c16 step %c1 {
      memref.store %one, %view[%k, %j] : memref<16x16xf32>
    }
    %next = arith.addi %k, %c1 : index
    scf.yield %next : index
  }
  return
}
"""

# The same loop on views at two offsets of the arena, then on a third view of another shape.
_REPEATED = """
func.func @main(%arena: memref<1024xi8>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c16 = arith.constant 16 : index
  %c64 = arith.constant 64 : index
  %one = arith.constant 1.0 : f32
  %first = memref.view %arena[%c0][] : memref<1024xi8> to memref<16xf32>
  %second = memref.view %arena[%c64][] : memref<1024xi8> to memref<16xf32>
  %third = memref.view %arena[%c64][] : memref<1024xi8> to memref<8xf32>
  scf.for %i = %c0 to %c16 step %c1 {
    memref.store %one, %first[%i] : memref<16xf32>
  }
  scf.for %i = %c0 to %c16 step %c1 {
    memref.store %one, %second[%i] : memref<16xf32>
  }
  scf.for %i = %c0 to %c16 step %c1 {
    memref.store %one, %third[%c0] : memref<8xf32>
  }
  return
}
"""

# Two loops alike but for the constant slice of %w they read (and the arena view they
# write), then one reading a slice of another shape.
_SLICES = """
func.func @main(%w: memref<4x16xf32>, %arena: memref<1024xi8>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %c16 = arith.constant 16 : index
  %c64 = arith.constant 64 : index
  %first = memref.view %arena[%c0][] : memref<1024xi8> to memref<16xf32>
  %second = memref.view %arena[%c64][] : memref<1024xi8> to memref<16xf32>
  %tap0 = memref.subview %w[1, 0] [1, 16] [1, 1] : memref<4x16xf32> to memref<16xf32, strided<[1], offset: 16>>
  %tap1 = memref.subview %w[3, 0] [1, 16] [1, 1] : memref<4x16xf32> to memref<16xf32, strided<[1], offset: 48>>
  %lone = memref.subview %w[2, 0] [1, 8] [1, 1] : memref<4x16xf32> to memref<8xf32, strided<[1], offset: 32>>
  scf.for %i = %c0 to %c16 step %c1 {
    %x = memref.load %tap0[%i] : memref<16xf32, strided<[1], offset: 16>>
    memref.store %x, %first[%i] : memref<16xf32>
  }
  scf.for %i = %c0 to %c16 step %c1 {
    %x = memref.load %tap1[%i] : memref<16xf32, strided<[1], offset: 48>>
    memref.store %x, %second[%i] : memref<16xf32>
  }
  scf.for %i = %c0 to %c8 step %c1 {
    %x = memref.load %lone[%i] : memref<8xf32, strided<[1], offset: 32>>
    memref.store %x, %first[%i] : memref<16xf32>
  }
  return
}
"""

# Two constant slices of one row taken at a runtime offset (a loop's counter): the slices'
# offsets from the buffer's base are not constants, so the kernels may not take them as ones.
_SLICES_OF_A_RUNTIME_ROW = """
func.func @main(%w: memref<4x2x16xf32>, %row: index, %arena: memref<1024xi8>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c16 = arith.constant 16 : index
  %c64 = arith.constant 64 : index
  %first = memref.view %arena[%c0][] : memref<1024xi8> to memref<16xf32>
  %second = memref.view %arena[%c64][] : memref<1024xi8> to memref<16xf32>
  %rows = memref.subview %w[%row, 0, 0] [1, 2, 16] [1, 1, 1] : memref<4x2x16xf32> to memref<2x16xf32, strided<[16, 1], offset: ?>>
  %tap0 = memref.subview %rows[0, 0] [1, 16] [1, 1] : memref<2x16xf32, strided<[16, 1], offset: ?>> to memref<16xf32, strided<[1], offset: ?>>
  %tap1 = memref.subview %rows[1, 0] [1, 16] [1, 1] : memref<2x16xf32, strided<[16, 1], offset: ?>> to memref<16xf32, strided<[1], offset: ?>>
  scf.for %i = %c0 to %c16 step %c1 {
    %x = memref.load %tap0[%i] : memref<16xf32, strided<[1], offset: ?>>
    memref.store %x, %first[%i] : memref<16xf32>
  }
  scf.for %i = %c0 to %c16 step %c1 {
    %x = memref.load %tap1[%i] : memref<16xf32, strided<[1], offset: ?>>
    memref.store %x, %second[%i] : memref<16xf32>
  }
  return
}
"""

# A k loop carrying AMX accumulator tiles (a matmul of one block of tiles): tiles live in
# tile registers and cannot be a function's arguments or results.
_TILE_LOOP = """
func.func @main(%a: memref<16x64xbf16>, %b: memref<32x32xbf16>, %c: memref<16x16xf32>) {
  %c0 = arith.constant 0 : index
  %c2 = arith.constant 2 : index
  %c1 = arith.constant 1 : index
  %zero = amx.tile_zero : !amx.tile<16x16xf32>
  %sum = scf.for %k = %c0 to %c2 step %c1 iter_args(%acc = %zero) -> (!amx.tile<16x16xf32>) {
    %x = amx.tile_load %a[%c0, %c0] : memref<16x64xbf16> into !amx.tile<16x32xbf16>
    %y = amx.tile_load %b[%c0, %c0] : memref<32x32xbf16> into !amx.tile<16x32xbf16>
    %next = amx.tile_mulf %x, %y, %acc : !amx.tile<16x32xbf16>, !amx.tile<16x32xbf16>, !amx.tile<16x16xf32>
    scf.yield %next : !amx.tile<16x16xf32>
  }
  amx.tile_store %c[%c0, %c0], %sum : memref<16x16xf32>, !amx.tile<16x16xf32>
  return
}
"""


def _functions(module: ir.Module) -> dict[str, ir.Operation]:
    return {ir.StringAttr(op.attributes["sym_name"]).value: op.operation for op in module.body.operations
            if op.operation.name == "func.func"}


def _outlined_dump(fn, *args, options: pb.Options) -> str:
    """The module right after the outline stage, from a compile with dumps on."""
    with tempfile.TemporaryDirectory() as tmp:
        lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cpu",))
        compiler.CACHE.clear()  # a cached executable would write no dumps
        pb.compile(lowered, dataclasses.replace(options, dump_dir=tmp))
        (path,) = glob.glob(os.path.join(tmp, "*", "*-outline.mlir"))
        with open(path) as f:
            return f.read()


def _mlp(x, w1, w2):
    h = jax.nn.relu(x @ w1)
    return jax.nn.softmax(h @ w2, axis=-1), h.sum(axis=0)


def _mlp_args():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((64, 96), np.float32), rng.standard_normal((96, 128), np.float32) * 0.1,
            rng.standard_normal((128, 32), np.float32) * 0.1)


class OutlineIrTest(absltest.TestCase):
    def test_each_top_level_loop_becomes_a_private_noinline_function(self):
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(_KERNELS)
            outline.outline_kernels(module, pb.Options())
            module.operation.verify()
            functions = _functions(module)
            kernels = [f for name, f in functions.items() if name != "main"]
            self.assertLen(kernels, 3)
            for kernel in kernels:
                self.assertEqual(ir.StringAttr(kernel.attributes["sym_visibility"]).value, "private")
                self.assertIn("noinline", str(kernel.attributes["passthrough"]))
                self.assertIn("internal", str(kernel.attributes["llvm.linkage"]))
            main_ops = [op.name for op in walk(functions["main"])]
            self.assertNotIn("scf.parallel", main_ops)
            self.assertNotIn("scf.for", main_ops)
            self.assertNotIn("scf.execute_region", main_ops)  # the loop with a result is a plain call
            self.assertEqual(main_ops.count("func.call"), 3)

    def test_calls_pass_buffers_not_constants_or_views(self):
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(_KERNELS)
            outline.outline_kernels(module, pb.Options())
            for op in walk(_functions(module)["main"]):
                if op.name == "func.call":
                    for operand in op.operands:
                        owner = operand.owner
                        producer = owner.operation.name if isinstance(owner, ir.OpView) else "argument"
                        self.assertNotIn(producer, ("memref.view", "memref.subview"))
                        if producer == "arith.constant":  # only where in the arena a view lies
                            self.assertIsInstance(operand.type, ir.IndexType)
            # The kernels' loop bounds are constants again (trip counts known to LLVM).
            kernel = next(f for name, f in _functions(module).items() if name != "main")
            self.assertIn("arith.constant", [op.name for op in walk(kernel)])

    def test_outlined_module_lowers_to_llvm(self):
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(_KERNELS)
            stages = [s for s in lowering.cpu_stages(pb.Options()) if s.name in ("outline", "to-llvm")]
            run_stages(module, stages, pb.Options())
            functions = [op for op in module.body.operations if op.operation.name == "llvm.func"]
            self.assertGreaterEqual(len(functions), 4)
            # Static contiguous buffers: main and the kernels take bare pointers, and no C
            # wrapper of descriptors is made (cpu/executable.py calls main).
            main = next(f for f in functions if f.attributes["sym_name"].value == "main")
            self.assertEqual([str(a.type) for a in main.regions[0].blocks[0].arguments], ["!llvm.ptr"] * 3)
            self.assertNotIn("_mlir_ciface_main", [f.attributes["sym_name"].value for f in functions])

    def test_kernels_differing_only_in_arena_offsets_share_a_function(self):
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(_REPEATED)
            outline.outline_kernels(module, pb.Options())
            module.operation.verify()
            self.assertLen(_functions(module), 3)  # main, the shared kernel, the other one
            calls = [op for op in walk(_functions(module)["main"]) if op.name == "func.call"]
            self.assertLen({ir.FlatSymbolRefAttr(c.attributes["callee"]).value for c in calls[:2]}, 1)
            self.assertNotEqual(calls[1].attributes["callee"], calls[2].attributes["callee"])

    def test_kernels_differing_only_in_locations_share_a_function(self):
        # Repeated layers' kernels, inlined from one function, carry their call sites.
        located = _REPEATED.replace("memref<16xf32>\n  }", 'memref<16xf32> loc("layer_a")\n  }', 1)
        located = located.replace("%second[%i] : memref<16xf32>", '%second[%i] : memref<16xf32> loc("layer_b")')
        self.assertEqual(located.count("loc("), 2)
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(located)
            outline.outline_kernels(module, pb.Options())
            module.operation.verify()
            self.assertLen(_functions(module), 3)  # main, the shared kernel, the other one

    def test_kernels_differing_only_in_use_order_share_a_function(self):
        # A pass may make a value's uses in another order (iterating a map keyed by pointers):
        # bytecode with use-list orders kept such kernels apart, a different set from run to
        # run (UNet: 186 to 192 functions).
        twice = _REPEATED
        for buffer in ("%first", "%second"):
            store = f"memref.store %one, {buffer}[%i] : memref<16xf32>\n"
            twice = twice.replace(store, store + "    " + store)
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(twice)
            second_loop = [op for op in walk(_functions(module)["main"]) if op.name == "scf.for"][1]
            body = second_loop.regions[0].blocks[0]
            body.operations[0].operation.operands[2] = body.arguments[0]  # its use of %i moves first
            outline.outline_kernels(module, pb.Options())
            module.operation.verify()
            self.assertLen(_functions(module), 3)  # main, the shared kernel, the other one

    def test_kernels_differing_only_in_constant_slices_share_a_function(self):
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(_SLICES)
            outline.outline_kernels(module, pb.Options())
            module.operation.verify()
            functions = _functions(module)
            self.assertLen(functions, 3)  # main, the shared kernel, the other one
            calls = [op for op in walk(functions["main"]) if op.name == "func.call"]
            self.assertEqual(calls[0].attributes["callee"], calls[1].attributes["callee"])
            shared = functions[ir.FlatSymbolRefAttr(calls[0].attributes["callee"]).value]
            self.assertIn("memref.reinterpret_cast", [op.name for op in walk(shared)])  # a slice at an offset passed
            lone = functions[ir.FlatSymbolRefAttr(calls[2].attributes["callee"]).value]
            self.assertIn("offset: 32>", str(lone))  # no other kernel like it: its constant slice stays

    def test_slices_of_a_row_at_a_runtime_offset_keep_their_offsets(self):
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(_SLICES_OF_A_RUNTIME_ROW)
            outline.outline_kernels(module, pb.Options())
            module.operation.verify()
            self.assertNotIn("memref.reinterpret_cast", str(module))
            self.assertNotIn(str(ir.ShapedType.get_dynamic_stride_or_offset()), str(module))

    def test_loops_carrying_amx_tiles_stay_in_their_function(self):
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(_TILE_LOOP)
            outline.outline_kernels(module, pb.Options())
            module.operation.verify()
            self.assertEqual(list(_functions(module)), ["main"])

    def test_function_without_loops_is_unchanged(self):
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse("func.func @main(%a: memref<4xf32>) { return }")
            outline.outline_kernels(module, pb.Options())
            self.assertEqual(list(_functions(module)), ["main"])


class OutlineProgramTest(absltest.TestCase):
    def test_several_kernels_compile_into_several_functions(self):
        text = _outlined_dump(_mlp, *_mlp_args(), options=pb.Options())
        self.assertGreaterEqual(text.count("func.func private @kernel"), 3)

    def test_repeated_layers_compile_their_kernels_once(self):
        def layers(x, *ws):
            for w in ws:
                x = jnp.tanh(x @ w) + x
            return x
        x, w, _ = _mlp_args()
        w = w[:, :96]
        # the first layer reads an argument, the last writes the result: those in between
        # are the same kernels, at other places in the arena
        texts = [_outlined_dump(layers, x, *[w] * n, options=pb.Options()) for n in (3, 5)]
        self.assertEqual(*[t.count("func.func private @kernel") for t in texts])
        support.check_against_xla(self, layers, x, w, w * 0.5, w * 2, rtol=1e-5, atol=1e-5)

    def test_transposed_convolution_taps_share_their_kernels(self):
        # Stride 2, a 2 x 2 kernel: each tap is a matmul of its slice of the weights into every
        # other pixel of the output, and a copy of it: four calls of each kernel (two, or four
        # where the register tile leaves a remainder of rows), not a kernel per tap (then the
        # bias, a kernel of its own).
        def upsample(x, w, b):
            return jax.lax.conv_transpose(x, w, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")) + b
        rng = np.random.default_rng(3)
        args = (rng.standard_normal((2, 8, 8, 32), np.float32), rng.standard_normal((2, 2, 32, 16), np.float32),
                rng.standard_normal(16, np.float32))
        text = _outlined_dump(upsample, *args, options=pb.Options())
        kernels = re.findall(r"func.func private @(\w+)\(", text)
        self.assertIn(sorted(text.count(f"call @{k}(") for k in kernels), ([1, 4, 4], [1, 4, 4, 4, 4]))
        support.check_against_xla(self, upsample, *args, rtol=1e-5, atol=1e-5)

    def test_matches_xla(self):
        support.check_against_xla(self, _mlp, *_mlp_args(), rtol=1e-5, atol=1e-5)

    def test_matches_xla_without_parallel_loops(self):
        support.check_against_xla(self, _mlp, *_mlp_args(), rtol=1e-5, atol=1e-5,
                                  options=pb.Options(parallel=False))

    def test_branch_result_reaches_a_kernel_as_a_rebuilt_view(self):
        # A branch yields a buffer of a strided type: the kernel reading it gets the buffer,
        # its offset and strides, and remakes the view (bare pointers only cross calls).
        def branch(x, p):
            return jnp.tanh(jax.lax.cond(p, jnp.negative, jnp.exp, x)) * 2
        x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
        for p in (0, 1):
            support.check_against_xla(self, branch, x, np.int32(p), rtol=1e-6, atol=1e-6)

    def test_a_mask_of_columns_reaches_a_kernel_whole(self):
        # The row's remainder mask (8 of 200 columns), computed once before the parallel
        # loop, is a kernel's argument: passed as a vector of i1 only its lane 0 arrived
        # (columns 193-199 of every row zeroed; JAX's svd of 200 x 200 went NaN).
        def masked(x, y):
            columns = jax.lax.broadcasted_iota(np.int32, x.shape, 1)
            return jnp.where(columns < 200, x, y), jnp.where(columns >= 5, y, x)
        rng = np.random.default_rng(3)
        args = [rng.standard_normal((200, 200)).astype(np.float32) for _ in range(2)]
        support.check_against_xla(self, masked, *args)

    def test_buffers_of_no_elements_keep_descriptors(self):
        # MLIR passes a memref of no elements as a descriptor: every function does then, and
        # the library's entry is the C wrapper.
        def product(a, b):
            return a @ b + 1
        args = np.ones((2, 0), np.float32), np.ones((0, 3), np.float32)
        support.check_against_xla(self, product, *args)
        self.assertTrue(pb.compile(jax.jit(product).lower(*args))._exe.descriptors)
        # (static non-empty buffers, the usual case: bare pointers)
        self.assertFalse(pb.compile(jax.jit(product).lower(np.ones((2, 4), np.float32),
                                                            np.ones((4, 3), np.float32)))._exe.descriptors)

    def test_partially_unrolled_scan_matches_xla(self):
        # scan(unroll=2) reads two rows of each step's slice of xs, at the loop counter's
        # offset: kernels alike but for those rows once shared one function at a wrong offset.
        d = np.random.RandomState(0).randn(2).astype(np.float32)

        def step(c, a):
            b = jnp.cos(jnp.sum(jnp.sin(a)) + jnp.sum(jnp.cos(c)) + jnp.sum(d))
            return jnp.sin(c * b), b

        rng = np.random.default_rng(1)
        c, xs = rng.standard_normal(4, np.float32), rng.standard_normal((5, 3), np.float32)
        for unroll in (2, 3):
            support.check_against_xla(self, lambda c, xs: jax.lax.scan(step, c, xs, unroll=unroll), c, xs)

    def test_loop_program_matches_xla(self):
        def scan(x):
            return jax.lax.fori_loop(0, 5, lambda i, y: jnp.tanh(y * 1.5 + i), x)
        x = np.random.default_rng(1).standard_normal((32, 64)).astype(np.float32)
        support.check_against_xla(self, scan, x)


if __name__ == "__main__":
    absltest.main()
