"""The intermediates' arena (cpu/arena.py): reuse by liveness, options, serialized form, limits;
the slots of parallel loops' packing buffers in it (cpu/iteration_buffers.py)."""
import contextlib
import json
import os
import struct
import tempfile

import jax
import jax.numpy as jnp
from jax._src.lax import linalg as lax_linalg
import numpy as np
from absl.testing import absltest, parameterized
from mlir import ir
from mlir.dialects import func

import polyblocks_jax as pb
import support
from bench import flax_models
from polyblocks_jax import cpu, passes
from polyblocks_jax.errors import InvalidProgramError
from polyblocks_jax.cpu.arena import buffer_bytes
from polyblocks_jax.passes import shared_layers
from polyblocks_jax.cpu.iteration_buffers import hoist_iteration_buffers
from polyblocks_jax.passes.transform import walk
from polyblocks_jax.runtime import executable as runtime
from polyblocks_jax.stablehlo_import import import_program, reader

MODEL_RTOL, MODEL_ATOL = 1e-4, 1e-4  # as tests/test_models.py: f32 sums of whole models


def chain(x, w):
    """Matmuls and sorts: each result a buffer of its own, dead two ops later."""
    for axis in (0, 1, 0, 1):
        x = jnp.sort(jnp.tanh(x @ w), axis=axis)
    return (x @ w).sum(axis=1)


def lowered(fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cpu",))


@contextlib.contextmanager
def main_before_arena(fn, *args, options: pb.Options | None = None):
    """``main`` of ``fn``'s program just before the arena stage (valid inside the block)."""
    options = options or pb.Options()
    with ir.Context() as context, ir.Location.unknown():
        imported = import_program(reader.program_source(lowered(fn, *args)), context)
        stages = cpu.host_stages(options)
        passes.run_stages(imported.module, stages[:[s.name for s in stages].index("arena")], options)
        yield next(op for op in imported.module.body.operations
                   if isinstance(op, func.FuncOp) and op.name.value == "main")


def top_level_before_arena(fn, *args) -> list[tuple[str, int]]:
    """The ops of ``main`` just before the arena stage, each with the bytes it allocates."""
    with main_before_arena(fn, *args) as main:
        return [(op.operation.name, buffer_bytes(ir.MemRefType(op.result.type)) or 0
                 if op.operation.name == "memref.alloc" else 0) for op in main.entry_block.operations]


def allocs_before_arena(fn, *args, options: pb.Options | None = None) -> list[tuple[bool, int]]:
    """Each memref.alloc of ``main`` just before the arena stage: (inside a parallel loop, bytes)."""
    found = []
    with main_before_arena(fn, *args, options=options) as main:
        for top in main.entry_block.operations:
            for op in [top.operation, *walk(top.operation)]:
                if op.name == "memref.alloc":
                    found.append((op is not top.operation and top.operation.name == "scf.parallel",
                                  buffer_bytes(ir.MemRefType(op.result.type)) or 0))
    return found


def intermediate_bytes(fn, *args) -> int:
    """Bytes of the top-level intermediates of ``main`` just before the arena stage: what
    compiled code allocated, all alive until the end, without an arena."""
    return sum(size for _, size in top_level_before_arena(fn, *args))


_CHILD_MEMORY_LIMIT = 8 << 30  # the children's address space: less than the arenas asked

# A parallel loop of 2 x 3 iterations whose body allocates 64 KiB.
_SIX_ITERATIONS = """
func.func @main(%out: memref<2x3xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c3 = arith.constant 3 : index
  %f = arith.constant 1.0 : f32
  scf.parallel (%i, %j) = (%c0, %c0) to (%c2, %c3) step (%c1, %c1) {
    %buf = memref.alloc() : memref<128x128xf32>
    memref.store %f, %buf[%i, %j] : memref<128x128xf32>
    %x = memref.load %buf[%i, %j] : memref<128x128xf32>
    memref.store %x, %out[%i, %j] : memref<2x3xf32>
    memref.dealloc %buf : memref<128x128xf32>
    scf.reduce
  }
  return
}"""


def _slots_given(text: str, threads: int) -> bool:
    """Whether hoist_iteration_buffers gives ``text``'s buffer slots (6 of 64 KiB)."""
    with ir.Context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        hoist_iteration_buffers(module, pb.Options(), threads)
        module.operation.verify()
        asm = str(module)
    assert ("memref<393216xi8>" in asm) == ("memref.view" in asm), asm
    return "memref<393216xi8>" in asm


class ArenaTest(absltest.TestCase):
    def setUp(self):
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((64, 64)).astype(np.float32)
        self.w = (rng.standard_normal((64, 64)) / 8).astype(np.float32)

    def test_chain_reuses_arena_space(self):
        support.check_against_xla(self, chain, self.x, self.w)
        exe = pb.compile(lowered(chain, self.x, self.w), pb.Options())  # the arena on, whatever the flags
        self.assertGreater(exe.arena_bytes, 0)
        self.assertLess(exe.arena_bytes, intermediate_bytes(chain, self.x, self.w) / 2)

    def test_no_arena_option(self):
        options = pb.Options.from_flags("no-arena")
        self.assertFalse(options.arena)
        self.assertEqual(pb.compile(lowered(chain, self.x, self.w), options).arena_bytes, 0)
        support.check_against_xla(self, chain, self.x, self.w, options=options)

    def test_serialized_round_trip_keeps_the_arena(self):
        exe = pb.compile(lowered(chain, self.x, self.w))
        loaded = runtime.deserialize(exe.serialize())
        self.assertEqual(loaded.arena_bytes, exe.arena_bytes)
        support.assert_close(self, list(loaded(self.x, self.w)), support.xla_cpu(chain, self.x, self.w))

    def test_format_2_loads_without_arena_and_bad_size_is_rejected(self):
        data = pb.compile(lowered(lambda a: a * 2 + 1, self.x), pb.Options(arena=False)).serialize()
        magic, _, size = struct.unpack_from("<8sII", data)
        header = json.loads(data[16:16 + size])
        library = data[16 + size:]

        def with_header(version: int, header: dict) -> bytes:
            text = json.dumps(header).encode()
            return struct.pack("<8sII", magic, version, len(text)) + text + library
        old = {k: v for k, v in header.items() if k != "arena_bytes"}
        loaded = runtime.deserialize(with_header(2, old))
        self.assertEqual(loaded.arena_bytes, 0)
        np.testing.assert_array_equal(loaded(self.x)[0], self.x * 2 + 1)
        with self.assertRaisesRegex(InvalidProgramError, "bad arena size"):
            runtime.deserialize(with_header(3, {**header, "arena_bytes": -1}))
        with self.assertRaisesRegex(InvalidProgramError, "format 2 or 3"):
            runtime.deserialize(with_header(1, header))

    def test_concurrent_calls_do_not_share_the_arena(self):
        import concurrent.futures
        exe = pb.compile(lowered(chain, self.x, self.w))
        inputs = [(self.x * (i + 1), self.w) for i in range(4)]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda args: exe(*args)[0], inputs * 4))
        for args, got in zip(inputs * 4, results):
            np.testing.assert_array_equal(got, exe(*args)[0])

    def test_matmuls_sharing_zeros_get_buffers_of_their_own(self):
        # ViT's query, key and value projections: one zero fill after CSE, 197 rows each (a
        # main part and an edge part, each updating its rows of the fill in place). Shared,
        # bufferization copied the zeros for two of them (with their uses, 8 ms of ViT-Tiny).
        x = self.x[:, :48].repeat(5, axis=0)[:197]

        def projections(x, a, b, c):
            return x @ a, x @ b, x @ c
        ops = [name for name, _ in top_level_before_arena(projections, x, *[self.w[:48]] * 3)]
        self.assertNotIn("memref.copy", ops)

    def test_layers_leave_no_buffer_alive_for_the_next(self):
        # A transformer's MLP layer by layer: CSE shares GELU's constants, the matmuls' zero
        # fills and the slices of them between layers. Shared, each became a buffer alive
        # from the first layer to the last (ViT-Tiny's arena: 32 MB -> 10 MB).
        rng = np.random.default_rng(3)
        x = rng.standard_normal((197, 64), np.float32)
        up = rng.standard_normal((64, 256), np.float32) / 8
        down = rng.standard_normal((256, 64), np.float32) / 16

        def mlp(layers):
            def fn(x, up, down):
                for _ in range(layers):
                    x = x + jax.nn.gelu(x @ up, approximate=False) @ down
                return x
            return fn
        # (with layers shared, from 4 on, or not: each shares one function's out-parameters)
        for options, depths in ((pb.Options(share_layers=False), (2, 4)), (pb.Options(), (4, 8))):
            shallow, deep = (pb.compile(lowered(mlp(n), x, up, down), options) for n in depths)
            self.assertEqual(deep.arena_bytes, shallow.arena_bytes)  # (was 1.01 MB -> 1.16 MB)
        support.assert_close(self, list(deep(x, up, down)), support.xla_cpu(mlp(8), x, up, down),
                             rtol=1e-4, atol=1e-4)

    def test_gelu_overwrites_its_matmuls_result(self):
        # The hidden activation dies at GELU: one buffer of 64 x 256 serves both.
        x, up = self.x[:, :32], np.ones((32, 256), np.float32) / 32
        allocs = [size for name, size in top_level_before_arena(
            lambda a, b: jax.nn.gelu(a @ b) @ b.T, x, up) if name == "memref.alloc"]
        self.assertEqual(allocs.count(64 * 256 * 4), 1, allocs)

    def test_padded_input_is_its_producers_destination(self):
        # ReLU computes into the interior of the 3x3 convolution's zero-padded input: no
        # buffer holds the unpadded activation.
        rng = np.random.default_rng(4)
        x = rng.standard_normal((2, 16, 16, 8), np.float32)
        w = rng.standard_normal((3, 3, 8, 8), np.float32) / 8

        def fn(x, w):
            return jax.lax.conv_general_dilated(jax.nn.relu(x * 2.0), w, (1, 1), "SAME",
                                                dimension_numbers=("NHWC", "HWIO", "NHWC"))
        allocs = [size for name, size in top_level_before_arena(fn, x, w) if name == "memref.alloc"]
        self.assertNotIn(x.nbytes, allocs)
        self.assertIn(2 * 18 * 18 * 8 * 4, allocs)
        support.check_against_xla(self, fn, x, w, rtol=1e-5, atol=1e-5)

    def test_rgb_normalization_is_its_padded_inputs_producer(self):
        # Three channels: the normalization stays one op over NHWC (vectorize would run it
        # over merged dims), computed into the interior of the stem convolution's input.
        rng = np.random.default_rng(6)
        x = rng.standard_normal((2, 16, 16, 3), np.float32)
        w = rng.standard_normal((7, 7, 3, 16), np.float32) / 8
        mean, std = np.float32([0.5, 0.4, 0.3]), np.float32([0.2, 0.3, 0.1])

        def fn(x, w):
            return jax.lax.conv_general_dilated((x - mean) / std, w, (2, 2), ((3, 3), (3, 3)),
                                                dimension_numbers=("NHWC", "HWIO", "NHWC"))
        allocs = [size for name, size in top_level_before_arena(fn, x, w) if name == "memref.alloc"]
        self.assertNotIn(x.nbytes, allocs)
        self.assertIn(2 * 22 * 22 * 3 * 4, allocs)
        support.check_against_xla(self, fn, x, w, rtol=1e-5, atol=1e-5)

    def test_concatenation_is_built_in_the_padded_input(self):
        # A UNet's decoder: the upsampled half and the skip are written into the interior of
        # the 3x3 convolution's padded input; no buffer holds the concatenation.
        rng = np.random.default_rng(5)
        x, skip = (rng.standard_normal((2, 16, 16, 8), np.float32) for _ in range(2))
        w = rng.standard_normal((3, 3, 16, 8), np.float32) / 8

        def fn(x, skip, w):
            both = jnp.concatenate([jax.nn.relu(x * 2.0), skip], axis=-1)
            return jax.lax.conv_general_dilated(both, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        allocs = [size for name, size in top_level_before_arena(fn, x, skip, w) if name == "memref.alloc"]
        self.assertNotIn(2 * x.nbytes, allocs)
        self.assertNotIn(x.nbytes, allocs)
        support.check_against_xla(self, fn, x, skip, w, rtol=1e-5, atol=1e-5)

    def test_concatenated_parts_are_computed_into_their_slices(self):
        # Each part computed into its slice of the result (upstream's empty-tensor elimination):
        # no buffer holds 2x or sin(y); one loop nest writes each part.
        rng = np.random.default_rng(6)
        x, y = (rng.standard_normal((4, 8, 64), np.float32) for _ in range(2))

        def fn(x, y):
            return jnp.concatenate([x, x * 2.0, jnp.sin(y)], axis=-1)
        names = [name for name, _ in top_level_before_arena(fn, x, y)]
        self.assertNotIn("memref.alloc", names)
        self.assertEqual(names.count("scf.for") + names.count("scf.parallel"), 3, names)
        support.check_against_xla(self, fn, x, y)

    def test_conditionals_write_over_no_value_from_outside_their_branch(self):
        # A Cholesky rank-1 update: a conditional per row (a Givens rotation, or none where
        # the vector's entry is 0) reading the matrix's diagonal entry. Computed into that
        # entry inside the branch, it made every conditional's result alias the matrix, which
        # one-shot bufferization followed through both branches of each: 24 rows bufferized
        # in 55 s, 32 not in 10 minutes (JAX's cholesky_update_test, 128 rows, hung).
        rng = np.random.default_rng(7)
        a = rng.standard_normal((8, 8)).astype(np.float32)
        r, w = np.linalg.cholesky(a.T @ a + 8 * np.eye(8, dtype=np.float32)).T.copy(), np.ones(8, np.float32)
        module = support.module_after("in-place", lax_linalg.cholesky_update, r, w, hardware=cpu.host().hardware())
        ifs = [op for op in walk(module.operation) if op.name == "scf.if"]
        self.assertTrue(ifs)
        for branch in (block for op in ifs for region in op.regions for block in region.blocks):
            for op in branch.operations:
                if op.operation.name == "linalg.generic":
                    out = op.operation.operands[len(op.operation.operands) - 1]
                    self.assertEqual(out.owner if isinstance(out.owner, ir.Block) else out.owner.operation.block,
                                     branch, op)
        a = rng.standard_normal((32, 32)).astype(np.float32)
        r = np.linalg.cholesky(a.T @ a + 32 * np.eye(32, dtype=np.float32)).T.copy()
        support.check_against_xla(self, lax_linalg.cholesky_update, r, np.ones(32, np.float32), rtol=1e-5, atol=1e-5)

    def test_reflection_padding_is_built_in_its_result(self):
        # Each side's edges read from the input, not from the value padded so far: the
        # nested concatenations are one, written into the result; only the reversed edges
        # (3 rows or columns) get buffers.
        x = np.random.default_rng(7).standard_normal((2, 32, 32, 8), np.float32)

        def fn(x):
            return jnp.pad(x, ((0, 0), (3, 3), (3, 3), (0, 0)), mode="reflect")
        allocs = [size for _, size in allocs_before_arena(fn, x)]
        self.assertEmpty([size for size in allocs if size >= x.nbytes // 4], allocs)
        support.check_against_xla(self, fn, x)

    def test_elementwise_op_of_a_roll_is_built_in_its_result(self):
        # jnp.roll concatenates two slices: the add computes each part from its slices of x
        # (the flip's too) into the result; the concatenation was a buffer, copied whole, and
        # a part computed in place copied its slice of the argument first.
        x = np.random.default_rng(8).standard_normal((16, 24, 32), np.float32)

        def fn(x):
            return jnp.roll(x, 5, axis=1) + jnp.flip(x, 2)
        self.assertEmpty(allocs_before_arena(fn, x))
        support.check_against_xla(self, fn, x)

    def test_elementwise_ops_of_concatenations(self):
        # Rolls along each axis, two rolls apart (slices across parts), a broadcast operand,
        # a concatenation read twice (left built), a flip and a transpose beside a roll.
        rng = np.random.default_rng(9)
        x, y = rng.standard_normal((6, 10, 16), np.float32), rng.standard_normal((16,), np.float32)
        support.check_against_xla(self, lambda x, y: (
            jnp.roll(x, 2, 0) * x, jnp.roll(x, -3, 1) - y, jnp.roll(x, 7, 2) + 1, jnp.roll(x, 1, 1) + jnp.roll(x, 4, 1),
            jnp.concatenate([x, x * 2], 1) + jnp.flip(jnp.concatenate([x, x], 1), (1, 2)),
            jnp.sin(jnp.concatenate([x[:3], -x[3:]])) * jnp.concatenate([x[:3], -x[3:]]).sum(),
            jnp.roll(x, 3, 1) * jnp.swapaxes(x.reshape(6, 16, 10), 1, 2)), x, y)

    def test_packing_buffers_are_slots_allocated_before_their_parallel_loop(self):
        # The cores each pack B panels and A blocks (rows 4 KiB apart) of hundreds of KiB.
        x, y = np.ones((512, 1024), np.float32), np.ones((1024, 512), np.float32)
        allocs = allocs_before_arena(jnp.matmul, x, y)
        self.assertEmpty([a for a in allocs if a[0] and a[1] >= 64 << 10])
        # B panels and A blocks (with a vector width that leaves a remainder of rows, A's
        # remainder block too); a matmul has no other intermediates
        self.assertBetween(len([a for a in allocs if not a[0]]), 2, 3)
        self.assertEmpty([a for a in allocs_before_arena(jnp.matmul, x, y, options=pb.Options(packing=False))
                          if not a[0]])
        without = allocs_before_arena(jnp.matmul, x, y, options=pb.Options(arena=False))
        self.assertNotEmpty([a for a in without if a[0] and a[1] >= 64 << 10])

    def test_only_loops_of_one_iteration_per_thread_get_slots(self):
        for threads, hoisted in ((6, True), (5, False)):
            self.assertEqual(_slots_given(_SIX_ITERATIONS, threads), hoisted)

    def test_shared_layers_get_slots_as_main_does(self):
        # A layer's loop nests become kernels in its own function (cpu/outline.py), before
        # the arena sees its body in main: its buffers get their slots there first. A kernel
        # (its loops those of a top-level nest of main) gets none.
        layer = _SIX_ITERATIONS.replace("@main", f"@{shared_layers.PREFIX}0")
        self.assertTrue(_slots_given(layer, 6))
        self.assertFalse(_slots_given(_SIX_ITERATIONS.replace("@main", "@kernel"), 6))

    def test_loop_iterations_allocate_their_buffers_before_the_loop(self):
        # A while loop's steps: the matmul's result and the cores' packing panels (256 rows
        # of B 256 x 256, 128 KiB a core) were malloced and freed at every step.
        def steps(x, w):
            return jax.lax.fori_loop(0, 3, lambda i, h: jnp.tanh(h @ w) * 0.5 + h, x)
        x, w = (np.random.default_rng(1).standard_normal((256, 256)).astype(np.float32) / 16 for _ in range(2))
        with main_before_arena(steps, x, w) as main:
            (loop,) = [op for op in walk(main.operation) if op.name == "scf.while"]
            body = [op for top in loop.regions[1].blocks[0].operations for op in [top.operation, *walk(top.operation)]]
            self.assertEmpty([op for op in body if op.name == "memref.alloc"])
        support.check_against_xla(self, steps, x, w, rtol=1e-5, atol=1e-5)

    def test_matmuls_in_packing_slots_match_xla(self):
        rng = np.random.default_rng(3)
        for m, n, k in ((512, 512, 512), (520, 264, 1024)):
            a = rng.standard_normal((m, k), np.float32) / np.sqrt(k)
            b = rng.standard_normal((k, n), np.float32)
            support.check_against_xla(self, lambda a, b: jax.nn.relu(a @ b), a, b, rtol=1e-5, atol=1e-5)

    def test_later_calls_reuse_an_idle_arena(self):
        from unittest import mock
        from polyblocks_jax.cpu import executable as cpu_executable
        exe = pb.compile(lowered(chain, self.x, self.w))
        exe(self.x, self.w)
        with mock.patch.object(cpu_executable, "_allocate_arena", wraps=cpu_executable._allocate_arena) as allocate:
            for scale in (2, 3):  # each call on the memory the one before left behind
                support.assert_close(self, list(exe(self.x * scale, self.w)),
                                     support.xla_cpu(chain, self.x * scale, self.w), rtol=1e-5, atol=1e-5)
        self.assertEqual(allocate.call_count, 0)

    def test_small_model_matches_xla(self):
        case = flax_models.make("vit_tiny", batch=2, small=True)
        exe = pb.compile(lowered(case.apply, case.params, case.input))
        # Equal layers: without split_empty_tensors their buffers (a matmul's zeros, its
        # packed panels) would be shared from the first layer to the last (about half).
        self.assertLess(exe.arena_bytes, intermediate_bytes(case.apply, case.params, case.input) / 3)
        leaves = [np.asarray(a) for a in jax.tree_util.tree_leaves((case.params, case.input))]
        support.assert_close(self, list(exe(*leaves)), support.xla_cpu(case.apply, case.params, case.input),
                             rtol=MODEL_RTOL, atol=MODEL_ATOL)


class ArenaMemoryTest(absltest.TestCase):
    # Each buffer (4 GiB) fits in the child's 8 GiB, the ones alive at once (8 GiB) do not.
    PROGRAM = "lambda a: jnp.sort(jnp.outer(a, a).reshape(-1))[:4]"

    def test_arena_larger_than_memory_rejected_when_compiling(self):
        done = support.run_python(f"""
            import numpy as np, jax, jax.numpy as jnp, polyblocks_jax as pb
            from polyblocks_jax.errors import ResourceExhaustedError
            x = np.ones((1 << 15,), np.float32)
            try:
                pb.compile(jax.jit({self.PROGRAM}).trace(x).lower(lowering_platforms=("cpu",)))
                print("no error")
            except ResourceExhaustedError as e:
                print("raised", str(e)[:60])
        """, memory_limit=_CHILD_MEMORY_LIMIT)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertIn("raised the intermediate buffers alive at once need", done.stdout)

    def test_arena_larger_than_memory_rejected_before_running(self):
        # Compiled here (no limit), run in the child: the runtime's allocation of the arena fails.
        x = np.ones((1 << 15,), np.float32)
        exe = pb.compile(lowered(eval(self.PROGRAM, {"jnp": jnp}), x), pb.Options())  # the arena on
        self.assertGreater(exe.arena_bytes, 6 << 30)
        with tempfile.NamedTemporaryFile(suffix=".pbx", delete=False) as f:
            f.write(exe.serialize())
        try:
            done = support.run_python(f"""
                import numpy as np
                from polyblocks_jax.errors import ResourceExhaustedError
                from polyblocks_jax.runtime.executable import deserialize
                exe = deserialize(open({f.name!r}, "rb").read())
                try:
                    exe(np.ones((1 << 15,), np.float32))
                    print("no error")
                except ResourceExhaustedError as e:
                    print("raised", isinstance(e, MemoryError), str(e)[:40])
                print("alive")
            """, memory_limit=_CHILD_MEMORY_LIMIT)
        finally:
            os.unlink(f.name)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertIn("raised True the intermediates of this program need", done.stdout)
        self.assertIn("alive", done.stdout)


class ReshapedResultTest(parameterized.TestCase):
    """A result that is a reshape of a computed buffer is computed in its out-parameter
    (passes/results.py ``reshaped_results_in_place``), not in a buffer then copied."""

    def test_gathered_rows_are_written_into_the_result(self):
        table, rows = np.zeros((64, 32), np.float32), np.zeros((4, 8), np.int32)
        module = support.module_after("reshaped-results", lambda t, i: jnp.take(t, i, axis=0), table, rows,
                                      hardware=cpu.host().hardware())
        text = str(module)
        self.assertNotIn("memref.copy", text)
        self.assertRegex(text, r"memref\.expand_shape %arg2 \[\[0\], \[1, 2\], \[3\]\]")

    @parameterized.named_parameters(
        ("gather", lambda t, i: jnp.take(t, i, axis=0) + 0 * i[0, 0]),
        ("flattened", lambda t, i: (t * 2.0 + i[0, 0]).reshape(-1)),
        ("reshaped_twice", lambda t, i: (t * 2.0 + i[0, 0])[None].reshape(8, 8, 32)),
        ("two_reshapes_of_one_buffer", lambda t, i: ((t * 2.0).reshape(-1), (t * 2.0).reshape(32, 64), i)),
        ("also_reduced", lambda t, i: ((y := t * 2.0).reshape(-1), y.sum(0), i)),
        ("argument_reshaped", lambda t, i: (t.reshape(-1), i + 1)))
    def test_results(self, fn):
        table = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
        rows = np.random.default_rng(1).integers(0, 64, (4, 8)).astype(np.int32)
        support.check_against_xla(self, fn, table, rows, rtol=1e-6, atol=1e-5)  # (a sum's order)


class SplitEmptyTensorsTest(absltest.TestCase):
    PROGRAM = """
    func.func @main(%x: tensor<8x64xf32>) -> (tensor<8x64xf32>, tensor<8x64xf32>) {
      %zero = arith.constant 0.0 : f32
      %empty = tensor.empty() : tensor<8x64xf32>
      %fill = linalg.fill ins(%zero : f32) outs(%empty : tensor<8x64xf32>) -> tensor<8x64xf32>
      %r:2 = scf.forall (%i) in (8) shared_outs(%a = %fill, %b = %fill) -> (tensor<8x64xf32>, tensor<8x64xf32>) {
        %row = tensor.extract_slice %fill[%i, 0] [1, 64] [1, 1] : tensor<8x64xf32> to tensor<1x64xf32>
        %in = tensor.extract_slice %x[%i, 0] [1, 64] [1, 1] : tensor<8x64xf32> to tensor<1x64xf32>
        %s = linalg.add ins(%in, %row : tensor<1x64xf32>, tensor<1x64xf32>) outs(%row : tensor<1x64xf32>) -> tensor<1x64xf32>
        scf.forall.in_parallel {
          tensor.parallel_insert_slice %s into %a[%i, 0] [1, 64] [1, 1] : tensor<1x64xf32> into tensor<8x64xf32>
          tensor.parallel_insert_slice %row into %b[%i, 0] [1, 64] [1, 1] : tensor<1x64xf32> into tensor<8x64xf32>
        }
      }
      return %r#0, %r#1 : tensor<8x64xf32>, tensor<8x64xf32>
    }"""

    def test_copies_of_a_fill_sliced_in_a_loop_stay_outside_it(self):
        # Each user gets its own fill, made once before the loop: a copy at the slice would
        # fill the whole tensor in every iteration.
        from polyblocks_jax.cpu.arena import split_empty_tensors
        from polyblocks_jax.passes.transform import walk
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(self.PROGRAM)
            split_empty_tensors(module, pb.Options())
            fills = [op for op in walk(module.operation) if op.name == "linalg.fill"]
            self.assertGreater(len(fills), 1)
            self.assertTrue(all(op.parent.name == "func.func" for op in fills), [op.parent.name for op in fills])
            module.operation.verify()



class PaddedProducerTest(absltest.TestCase):
    # A loop body inserts an elementwise result into a zero fill made before the loop (as in
    # the QDWH eigensolver): the fill cannot move into the body (its constant has other uses).
    PROGRAM = """
    func.func @main(%x: tensor<32x16xf32>) -> (tensor<32x16xf32>, f32) {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c3 = arith.constant 3 : index
      %zero = arith.constant 0.0 : f32
      %empty = tensor.empty() : tensor<32x16xf32>
      %fill = linalg.fill ins(%zero : f32) outs(%empty : tensor<32x16xf32>) -> tensor<32x16xf32>
      %r = scf.for %i = %c0 to %c3 step %c1 iter_args(%c = %x) -> (tensor<32x16xf32>) {
        %row = tensor.extract_slice %c[0, 0] [1, 16] [1, 1] : tensor<32x16xf32> to tensor<16xf32>
        %out = tensor.empty() : tensor<16x16xf32>
        %twice = linalg.generic {indexing_maps = [affine_map<(i, j) -> (j)>, affine_map<(i, j) -> (i, j)>],
                                 iterator_types = ["parallel", "parallel"]}
            ins(%row : tensor<16xf32>) outs(%out : tensor<16x16xf32>) {
          ^bb0(%a: f32, %b: f32):
            %t = arith.addf %a, %a : f32
            linalg.yield %t : f32
        } -> tensor<16x16xf32>
        %padded = tensor.insert_slice %twice into %fill[0, 0] [16, 16] [1, 1] : tensor<16x16xf32> into tensor<32x16xf32>
        scf.yield %padded : tensor<32x16xf32>
      }
      return %r, %zero : tensor<32x16xf32>, f32
    }"""

    def test_fill_before_a_loop_stays(self):
        # (compute_in_place once moved the fill's ops before the generic in the loop body:
        # MLIR aborted the process comparing positions of ops in different blocks.)
        from polyblocks_jax.passes.in_place import compute_in_place
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(self.PROGRAM)
            compute_in_place(module, pb.Options())
            self.assertTrue(module.operation.verify())
            fills = [op for op in walk(module.operation) if op.name == "linalg.fill"]
            self.assertEqual([op.parent.name for op in fills], ["func.func"])


if __name__ == "__main__":
    absltest.main()
