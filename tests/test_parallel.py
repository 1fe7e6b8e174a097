"""Parallel loops (OpenMP): the cost model's choices on IR, and results with parallel on and off."""
import os
import subprocess
import sys
import tempfile
import textwrap

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np
from absl.testing import absltest
from mlir import ir

import polyblocks_jax as pb
import support
from polyblocks_jax import in_process
from polyblocks_jax.contexts import pass_manager
from polyblocks_jax.cpu import parallel, parallel_if
from polyblocks_jax.cpu.executable import MIN_WORK_SYMBOL

_NESTS = """
func.func @f(%a: memref<512x512xf32>, %b: memref<8xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %c512 = arith.constant 512 : index
  %x = arith.constant 1.0 : f32
  scf.parallel (%i) = (%c0) to (%c512) step (%c1) {
    scf.parallel (%j) = (%c0) to (%c512) step (%c1) {
      memref.store %x, %a[%i, %j] : memref<512x512xf32>
    }
  }
  scf.parallel (%i) = (%c0) to (%c8) step (%c1) {
    memref.store %x, %b[%i] : memref<8xf32>
  }
  scf.for %i = %c0 to %c512 step %c1 {
    scf.parallel (%j) = (%c0) to (%c512) step (%c1) {
      memref.store %x, %a[%i, %j] : memref<512x512xf32>
    }
  }
  return
}
"""

_DYNAMIC_INNER = """
func.func @f(%a: memref<512x512xf32>, %n: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c512 = arith.constant 512 : index
  %x = arith.constant 1.0 : f32
  scf.parallel (%i, %j) = (%c0, %c0) to (%c512, %c512) step (%c1, %c1) {
    scf.for %k = %c0 to %n step %c1 {
      memref.store %x, %a[%i, %j] : memref<512x512xf32>
    }
  }
  return
}
"""

_RESIDUAL_ADD = """
func.func @f(%a: memref<197x192xf32>, %b: memref<197x192xf32>, %c: memref<192xf32>, %out: memref<197x192xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c64 = arith.constant 64 : index
  %c192 = arith.constant 192 : index
  %c197 = arith.constant 197 : index
  %zero = arith.constant 0.0 : f32
  scf.parallel (%i) = (%c0) to (%c197) step (%c1) {
    scf.for %j = %c0 to %c192 step %c64 {
      %x = vector.transfer_read %a[%i, %j], %zero {in_bounds = [true]} : memref<197x192xf32>, vector<64xf32>
      %y = vector.transfer_read %b[%i, %j], %zero {in_bounds = [true]} : memref<197x192xf32>, vector<64xf32>
      %z = vector.transfer_read %c[%j], %zero {in_bounds = [true]} : memref<192xf32>, vector<64xf32>
      %s = arith.addf %x, %z : vector<64xf32>
      %t = arith.addf %s, %y : vector<64xf32>
      vector.transfer_write %t, %out[%i, %j] {in_bounds = [true]} : vector<64xf32>, memref<197x192xf32>
    }
  }
  return
}
"""

_COPIES = """
func.func @f(%a: memref<8x1024x256xf32>, %b: memref<8x1024x256xf32>, %c: memref<16xf32>, %d: memref<16xf32>,
             %e: memref<1021x1021xf32>, %f: memref<1021x1021xf32>) {
  memref.copy %a, %b : memref<8x1024x256xf32> to memref<8x1024x256xf32>
  memref.copy %c, %d : memref<16xf32> to memref<16xf32>
  memref.copy %e, %f : memref<1021x1021xf32> to memref<1021x1021xf32>
  return
}
"""

_DIMS = """
func.func @f(%a: memref<8192x8192xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %c512 = arith.constant 512 : index
  %c8192 = arith.constant 8192 : index
  %x = arith.constant 1.0 : f32
  scf.parallel (%i, %j) = (%c0, %c0) to (%c512, %c512) step (%c1, %c1) {
    memref.store %x, %a[%i, %j] : memref<8192x8192xf32>
  }
  scf.parallel (%i, %j) = (%c0, %c0) to (%c4, %c8192) step (%c1, %c1) {
    memref.store %x, %a[%i, %j] : memref<8192x8192xf32>
    memref.store %x, %a[%j, %i] : memref<8192x8192xf32>
  }
  return
}
"""


# The AMX kernel of a 16-row matmul (16 x 1024 x 512 bf16): one row block, 16 column
# blocks, 32 k steps of three tile loads and two products.
_TILES = """
func.func @f(%a: memref<16x1024xbf16>, %b: memref<32x512x32xbf16>, %c: memref<16x512xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c16 = arith.constant 16 : index
  %c32 = arith.constant 32 : index
  %c512 = arith.constant 512 : index
  scf.parallel (%j) = (%c0) to (%c512) step (%c32) {
    %p0 = arith.divui %j, %c16 : index
    %p1 = arith.addi %p0, %c1 : index
    %z0 = amx.tile_zero : !amx.tile<16x16xf32>
    %z1 = amx.tile_zero : !amx.tile<16x16xf32>
    %s:2 = scf.for %k2 = %c0 to %c512 step %c16 iter_args(%x0 = %z0, %x1 = %z1)
        -> (!amx.tile<16x16xf32>, !amx.tile<16x16xf32>) {
      %k = arith.muli %k2, %c1 : index
      %ta = amx.tile_load %a[%c0, %k] : memref<16x1024xbf16> into !amx.tile<16x32xbf16>
      %tb0 = amx.tile_load %b[%p0, %k2, %c0] : memref<32x512x32xbf16> into !amx.tile<16x32xbf16>
      %tb1 = amx.tile_load %b[%p1, %k2, %c0] : memref<32x512x32xbf16> into !amx.tile<16x32xbf16>
      %d0 = amx.tile_mulf %ta, %tb0, %x0 : !amx.tile<16x32xbf16>, !amx.tile<16x32xbf16>, !amx.tile<16x16xf32>
      %d1 = amx.tile_mulf %ta, %tb1, %x1 : !amx.tile<16x32xbf16>, !amx.tile<16x32xbf16>, !amx.tile<16x16xf32>
      scf.yield %d0, %d1 : !amx.tile<16x16xf32>, !amx.tile<16x16xf32>
    }
    amx.tile_store %c[%c0, %j], %s#0 : memref<16x512xf32>, !amx.tile<16x16xf32>
    amx.tile_store %c[%c0, %j], %s#1 : memref<16x512xf32>, !amx.tile<16x16xf32>
    scf.reduce
  }
  return
}
"""


def _ops(module: ir.Module, name: str) -> list[ir.Operation]:
    found = []
    module.operation.walk(lambda op: (found.append(op) if op.name == name else None, ir.WalkResult.ADVANCE)[1],
                          ir.WalkOrder.PRE_ORDER)
    return found


class CostModelTest(absltest.TestCase):
    def test_only_large_outermost_nest_stays_parallel(self):
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(_NESTS)
            # one store per iteration, an access weighted as the few cycles it takes
            self.assertEqual(parallel.work(_ops(module, "scf.parallel")[0]), parallel._MEMORY_COST * 512 * 512)
            parallel.parallelize_loops(module, pb.Options(), threads=2)
            loops = _ops(module, "scf.parallel")
            self.assertEqual(len(loops), 1)  # nested, small and per-row nests were serialized
            self.assertIn(parallel.PARALLEL_ATTR, loops[0].attributes)
            self.assertEqual(len(_ops(module, "scf.for")), 4)  # 3 serialized + the row loop

    def _assert_shared_out(self, text: str) -> None:
        """The one loop nest of ``text`` becomes a parallel loop shared out to the threads."""
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(text)
            parallel.parallelize_loops(module, pb.Options(), threads=2)
            (loop,) = _ops(module, "scf.parallel")
            self.assertIn(parallel.PARALLEL_ATTR, loop.attributes)

    def test_memory_bound_residual_add_is_shared_out(self):
        # ViT-Tiny b1's bias and residual add: 197 x 192 of three operands, few operations
        # but three reads and a write a vector; counted as operations alone it stayed serial.
        self._assert_shared_out(_RESIDUAL_ADD)

    def test_matrix_unit_tiles_count_their_elements(self):
        # Each tile op counted as one operation: 16 column blocks of 32 k steps looked too
        # small to share out, and the kernel ran on one core.
        self._assert_shared_out(_TILES)

    def test_shares_out_only_the_outer_dims_needed(self):
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(_DIMS)
            parallel.parallelize_loops(module, pb.Options(), threads=2)
            loops = _ops(module, "scf.parallel")
            # (512, 512): the rows give every thread enough chunks; (4, 512): 4 rows do not.
            self.assertEqual([len(op.opview.lowerBound) for op in loops], [1, 2])
            self.assertEqual(len(_ops(module, "scf.for")), 1)

    def test_a_large_copy_is_shared_out_in_contiguous_parts(self):
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(_COPIES)
            parallel.parallelize_loops(module, pb.Options(), threads=2)
            loops = _ops(module, "scf.parallel")
            self.assertLen(loops, 1)  # the 8 MiB copy; 64 bytes stay one memcpy, and so do 1021^2
            self.assertEqual(parallel.dim_trips(loops[0]), [parallel.CHUNKS_PER_THREAD * 2])
            self.assertIn(parallel.PARALLEL_ATTR, loops[0].attributes)  # elements (a prime squared): no parts
            copies = _ops(module, "memref.copy")
            self.assertEqual([ir.MemRefType(c.operands[0].type).shape for c in copies],
                             [[1, 8 * 1024 * 256 // 8], [16], [1021, 1021]])

    def test_switched_off_or_one_core_serializes_everything(self):
        for options, threads in ((pb.Options(parallel=False), 2), (pb.Options(), 1)):
            with ir.Context(), ir.Location.unknown():
                module = ir.Module.parse(_NESTS)
                parallel.parallelize_loops(module, options, threads=threads)
                self.assertEqual(_ops(module, "scf.parallel"), [])


def _compile(fn, *args, options: pb.Options) -> tuple[pb.Executable, bool]:
    """The executable, and whether its LLVM module forks threads."""
    lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cpu",))
    with tempfile.TemporaryDirectory() as d:
        exe = in_process.compile_in_process(lowered.as_text(), options.replace(dump_dir=d), "k", {}, None)
        (program,) = os.listdir(d)
        (last,) = [f for f in os.listdir(os.path.join(d, program)) if f.endswith("to-llvm.mlir")]
        with open(os.path.join(d, program, last)) as f:
            return exe, "omp.parallel" in f.read()


class ParallelIfTest(absltest.TestCase):
    def test_each_region_compares_its_work_with_the_policys(self):
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(_NESTS)
            parallel.parallelize_loops(module, pb.Options(), threads=2)
            (loop,) = _ops(module, "scf.parallel")
            work = parallel.work(loop)
            self.assertEqual(parallel_if.region_works(module), [work])
            pass_manager("builtin.module(convert-scf-to-openmp)", module.context).run(module.operation)
            parallel_if.guard_parallel_regions(module, [work])
            (region,) = _ops(module, "omp.parallel")
            self.assertEqual(list(ir.DenseI32ArrayAttr(region.attributes["operandSegmentSizes"])), [0, 0, 1, 0, 0, 0])
            self.assertEqual(len(_ops(module, "omp.wsloop")), 1)  # the body moved into the guarded region
            text = str(module)
            self.assertIn(f"llvm.mlir.global external @{MIN_WORK_SYMBOL}(0 : i64)", text)
            self.assertIn(f"arith.constant {work} : i64", text)

    def test_a_region_of_unknown_trip_counts_always_pays(self):
        # its estimate counts the inner loop once: a floor, which the run-time check must not trust
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(_DYNAMIC_INNER)
            parallel.parallelize_loops(module, pb.Options(), threads=2)
            self.assertEqual(parallel_if.region_works(module), [parallel.UNBOUNDED])

    # A region whose work is below the busy machine's minimum runs on the calling thread:
    # libomp then never starts a worker thread. teams.c reads a load file that says busy.
    SERIAL = textwrap.dedent("""
        import ctypes, os, sys
        import jax, jax.numpy as jnp, numpy as np
        from polyblocks_jax.cpu import executable
        executable.openmp_runtime()
        teams = ctypes.CDLL(executable.native_build.shared_library(
            os.path.join(os.path.dirname(executable.__file__), "teams.c"), "teams"))
        teams.pb_teams_init.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_char_p]
        with open(sys.argv[0] + ".loadavg", "w") as f:
            f.write("1.00 1.00 1.00 5/300 4242\\n")
        teams.pb_teams_init(2, 200, int(sys.argv[1]), (sys.argv[0] + ".loadavg").encode())
        x = jax.device_put(np.arange(512 * 512, dtype=np.float32).reshape(512, 512) / 1000,
                           jax.devices("polyblocks")[0])
        f = jax.jit(lambda a: jnp.sin(a) + a).lower(x).compile()
        threads = len(os.listdir("/proc/self/task"))
        out = np.asarray(f(x))
        np.testing.assert_allclose(out, np.sin(np.asarray(x)) + np.asarray(x), rtol=1e-6)
        print(len(os.listdir("/proc/self/task")) - threads)
    """)

    def _new_threads(self, min_work: int) -> int:
        base = {k: v for k, v in os.environ.items() if k not in ("OMP_DYNAMIC", "KMP_DYNAMIC_MODE", "KMP_BLOCKTIME",
                                                                 "OMP_NUM_THREADS")}
        with tempfile.TemporaryDirectory() as folder:
            script = os.path.join(folder, "serial.py")
            with open(script, "w") as f:
                f.write(self.SERIAL)
            done = subprocess.run([sys.executable, script, str(min_work)], env={**base, "OMP_NUM_THREADS": "2"},
                                  capture_output=True, text=True, timeout=300)
        self.assertEqual(done.returncode, 0, done.stderr[-2000:])
        return int(done.stdout.split()[-1])

    def test_a_busy_machine_runs_small_regions_on_the_calling_thread(self):
        self.assertEqual(self._new_threads(min_work=1 << 40), 0)

    def test_a_busy_machine_runs_large_regions_in_parallel(self):
        self.assertGreater(self._new_threads(min_work=1), 0)


class ParallelResultsTest(absltest.TestCase):
    def _check(self, fn, *args, rtol=None, atol=None):
        """Parallel code forks, serial code does not; both equal each other and XLA."""
        on, forks = _compile(fn, *args, options=pb.Options())
        off, serial_forks = _compile(fn, *args, options=pb.Options(parallel=False))
        self.assertTrue(forks, "expected a parallel loop")
        self.assertFalse(serial_forks, "no-parallel still forks")
        got = on(*args)
        for a, b in zip(got, off(*args)):
            np.testing.assert_array_equal(a, b)
        support.assert_close(self, list(got), support.xla_cpu(fn, *args), rtol=rtol, atol=atol)

    def test_matmul_and_batch_matmul(self):
        rng = np.random.default_rng(0)
        x, y = rng.standard_normal((64, 96), np.float32), rng.standard_normal((96, 256), np.float32)
        b = rng.standard_normal((2, 32, 96), np.float32)
        # Summation order differs from XLA's library kernel (as in test_tiling).
        self._check(lambda p, q, r: (p @ q, jnp.einsum("bmk,kn->bmn", r, q)), x, y, b, rtol=1e-5, atol=1e-5)

    def test_elementwise_and_reductions(self):
        rng = np.random.default_rng(1)
        x = support.random_array(rng, (256, 384), np.float32)
        i = support.random_array(rng, (256, 384), np.int32)
        # No NaN in what max reduces: XLA CPU's max reduction drops NaN (ours propagates it).
        r = support.random_array(rng, (256, 384), np.float32, edge=False)

        def fn(a, k, c):
            return (jnp.tanh(a) * 2 + a, k * 3 - (k >> 2), c.sum(axis=1), c.max(axis=0),
                    jnp.argmax(c, axis=1), k.sum())
        self._check(fn, x, i, r, rtol=1e-5, atol=1e-5)  # f32 sums in another order than XLA's

    def test_update_of_a_large_array(self):
        # the operand's copy into the result is shared out, then the update written
        rng = np.random.default_rng(3)
        x, u = rng.standard_normal((4, 512, 256), np.float32), rng.standard_normal((4, 64, 256), np.float32)
        self._check(lambda a, b, i: lax.dynamic_update_slice(a, b, (0 * i, i, 0 * i)), x, u, np.int32(200))

    def test_small_model(self):
        rng = np.random.default_rng(2)
        x = rng.standard_normal((64, 128), np.float32)
        w1, w2 = rng.standard_normal((128, 256), np.float32) * 0.1, rng.standard_normal((256, 128), np.float32) * 0.1

        def mlp(a, p, q):
            h = jax.nn.relu(a @ p)
            z = h @ q
            return jax.nn.softmax(z, axis=-1), jnp.cumsum(z, axis=0)  # cumsum: a carried loop
        self._check(mlp, x, w1, w2, rtol=1e-4, atol=1e-5)


class ParallelSerializationTest(absltest.TestCase):
    def test_deserialized_openmp_code_runs_in_another_process(self):
        x = np.arange(256 * 512, dtype=np.float32).reshape(256, 512) / 1000
        exe, forks = _compile(lambda a: jnp.sin(a) + a, x, options=pb.Options())
        self.assertTrue(forks)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "exe.bin")
            with open(path, "wb") as f:
                f.write(exe.serialize())
            code = f"""
                import numpy as np
                from polyblocks_jax import compiler
                with open({path!r}, "rb") as f:
                    exe = compiler.deserialize(f.read())
                x = np.arange(256 * 512, dtype=np.float32).reshape(256, 512) / 1000
                np.save({os.path.join(d, 'out.npy')!r}, exe(x)[0])
            """
            done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                                  text=True, timeout=120)
            self.assertEqual(done.returncode, 0, done.stderr)
            np.testing.assert_array_equal(np.load(os.path.join(d, "out.npy")), exe(x)[0])



class DynamicTeamsTest(absltest.TestCase):
    """Teams sized by libomp's load balance (the cores idle when a region starts), unless the
    user set OpenMP's dynamic adjustment themselves."""

    SCRIPT = textwrap.dedent("""
        import ctypes
        from polyblocks_jax.cpu.executable import openmp_runtime
        print(ctypes.CDLL(openmp_runtime()).omp_get_dynamic())
    """)

    def _dynamic(self, **env) -> str:
        base = {k: v for k, v in os.environ.items() if k not in ("OMP_DYNAMIC", "KMP_DYNAMIC_MODE")}
        done = subprocess.run([sys.executable, "-c", self.SCRIPT], env={**base, **env}, capture_output=True,
                              text=True, timeout=300)
        self.assertEqual(done.returncode, 0, done.stderr[-2000:])
        return done.stdout.split()[-1]

    def test_on_by_default(self):
        self.assertEqual(self._dynamic(), "1")

    def test_the_users_setting_wins(self):
        self.assertEqual(self._dynamic(OMP_DYNAMIC="false"), "0")

    # teams.c under a machine's load as /proc/loadavg gives it: runnable tasks / all tasks.
    POLICY = textwrap.dedent("""
        import ctypes, os, sys, time
        from polyblocks_jax.cpu import executable
        omp = ctypes.CDLL(executable.openmp_runtime())
        print(executable.choose_teams is not executable._no_policy)
        teams = ctypes.CDLL(executable.native_build.shared_library(
            os.path.join(os.path.dirname(executable.__file__), "teams.c"), "teams"))
        for runnable in sys.argv[1:]:
            with open(sys.argv[0] + ".loadavg", "w") as f:
                f.write(f"1.00 1.00 1.00 {runnable}/300 4242\\n")
            teams.pb_teams_init.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_char_p]
            teams.pb_teams_init(2, 200, 1000, (sys.argv[0] + ".loadavg").encode())
            time.sleep(0.11)  # the load is read at most every 100 ms
            teams.pb_teams_choose()
            print(runnable, omp.omp_get_dynamic(), omp.kmp_get_blocktime(),
                  ctypes.c_longlong.in_dll(teams, "pb_min_parallel_work").value)
            omp.omp_set_dynamic(1)  # as if another thread, whose settings are its own
    """)

    def _policy(self, *runnable: int, **env) -> list[str]:
        base = {k: v for k, v in os.environ.items() if k not in ("OMP_DYNAMIC", "KMP_DYNAMIC_MODE", "KMP_BLOCKTIME")}
        with tempfile.TemporaryDirectory() as folder:
            script = os.path.join(folder, "policy.py")
            with open(script, "w") as f:
                f.write(self.POLICY)
            done = subprocess.run([sys.executable, script, *map(str, runnable)], env={**base, **env},
                                  capture_output=True, text=True, timeout=300)
        self.assertEqual(done.returncode, 0, done.stderr[-2000:])
        return done.stdout.splitlines()

    def test_a_busy_machine_gets_full_teams_whose_workers_sleep(self):
        # Quiet (no more runnable tasks than the 2 cores): load-balance teams, spinning
        # workers, every region parallel; busy: static teams, workers asleep at once after
        # each region, which runs in parallel only from the given work on.
        self.assertEqual(self._policy(2, 5), ["True", "2 1 200 0", "5 0 0 1000"])

    def test_no_policy_where_the_user_set_the_blocktime(self):
        self.assertEqual(self._policy(KMP_BLOCKTIME="50")[0], "False")

if __name__ == "__main__":
    absltest.main()
