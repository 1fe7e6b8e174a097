"""Bad input gets a clear polyblocks_jax exception naming the op and where it came from."""
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

import support

import polyblocks_jax as pb
from polyblocks_jax.stablehlo_import import reader

# An op JAX never emits (Flax computes batch norm in elementwise ops) and we do not convert.
BATCH_NORM = """
module @m {
  func.func public @main(%x: tensor<2x4xf32>, %p: tensor<4xf32>) -> tensor<2x4xf32> {
    %0 = "stablehlo.batch_norm_inference"(%x, %p, %p, %p, %p) {epsilon = 1.0e-5 : f32, feature_index = 1 : i64}
      : (tensor<2x4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<2x4xf32> loc(#loc1)
    return %0 : tensor<2x4xf32>
  }
}
#loc1 = loc("jit(f)/batch_norm"("model.py":12:7))
"""


class UnsupportedInputTest(absltest.TestCase):
    def test_op_without_converter_names_op_and_location(self):
        with self.assertRaises(pb.UnsupportedError) as cm:
            pb.compile(BATCH_NORM)
        self.assertEqual(cm.exception.op, "stablehlo.batch_norm_inference")
        self.assertIn("model.py:12:7", str(cm.exception))

    def test_unsupported_dtype_names_dtype(self):
        lowered = jax.jit(lambda x: x.astype(jnp.float6_e2m3fn).astype(jnp.float32)).trace(
            np.ones(8, np.float32)).lower(lowering_platforms=("cpu",))
        with self.assertRaises(pb.UnsupportedDtypeError) as cm:
            pb.compile(lowered)
        # XLA's and JAX's wording, which users match whatever the backend
        self.assertIn("Unsupported dtype f6E2M3FN in stablehlo.convert", str(cm.exception))
        self.assertIn("test_errors.py", cm.exception.location)

    def test_errors_share_one_root(self):
        for cls in (pb.UnsupportedError, pb.InvalidProgramError, pb.CompilationError,
                    pb.InvalidArgumentError):
            self.assertTrue(issubclass(cls, pb.PolyblocksError))


class MalformedInputTest(absltest.TestCase):
    def test_malformed_text(self):
        with self.assertRaisesRegex(pb.InvalidProgramError, "malformed"):
            pb.compile("module { func.func @main( }")

    def test_truncated_artifact(self):
        text = jax.jit(lambda x: x + x).trace(np.ones(3, np.float32)).lower(
            lowering_platforms=("cpu",)).as_text()
        ctx = reader.new_context()
        with ctx:
            from jaxlib.mlir.dialects import stablehlo
            artifact = stablehlo.serialize_portable_artifact(
                reader.parse(text, ctx), stablehlo.get_current_version())
        with self.assertRaises(pb.InvalidProgramError):
            pb.compile(artifact[: len(artifact) // 2])

    def test_not_a_program(self):
        with self.assertRaises(pb.InvalidProgramError):
            pb.compile(12345)

    def test_missing_main(self):
        with self.assertRaisesRegex(pb.InvalidProgramError, "@main"):
            pb.compile("module { func.func @other() { return } }")


class ArgumentCheckTest(absltest.TestCase):
    def setUp(self):
        x = np.ones((2, 3), np.float32)
        self.exe = pb.compile(jax.jit(lambda a: a + a).trace(x).lower(lowering_platforms=("cpu",)))

    def test_wrong_shape(self):
        with self.assertRaisesRegex(pb.InvalidArgumentError, "argument 0"):
            self.exe(np.ones((3, 2), np.float32))

    def test_wrong_dtype(self):
        with self.assertRaises(pb.InvalidArgumentError):
            self.exe(np.ones((2, 3), np.int32))

    def test_wrong_count(self):
        with self.assertRaises(pb.InvalidArgumentError):
            self.exe()

    def test_still_works_after_errors(self):
        with self.assertRaises(pb.InvalidArgumentError):
            self.exe(np.ones((3, 2), np.float32))
        np.testing.assert_array_equal(self.exe(np.ones((2, 3), np.float32))[0], np.full((2, 3), 2.0))


class MissingToolTest(absltest.TestCase):
    def test_missing_linker_is_a_compilation_error_and_nothing_is_cached(self):
        from unittest import mock
        from polyblocks_jax.cpu import codegen
        f = lambda x: jnp.tanh(x) * 3.0
        x = np.linspace(-2, 2, 37, dtype=np.float32)
        lowered = jax.jit(f).lower(x)
        with mock.patch.object(codegen, "_LINKER", "/nonexistent/cc"), support.in_process():
            with self.assertRaisesRegex(pb.CompilationError, "cannot run /nonexistent/cc"):
                pb.compile(lowered)
        got = pb.compile(lowered)(x)[0]  # compiled afresh once the linker is back
        np.testing.assert_allclose(got, jax.jit(f)(x), rtol=2e-6, atol=1e-6)


class InvalidIrTest(absltest.TestCase):
    """Upstream pipelines run without the verifier after each pass; the IR our own stages
    build is verified before upstream code can trip over it: in this process as each stage
    ends, in a compile worker a run of our stages once."""

    @staticmethod
    def _stages(later, upstream):
        from mlir import ir
        from polyblocks_jax.passes import Stage

        def break_result_type(module, options):
            function = module.body.operations[0]
            function.attributes["function_type"] = ir.TypeAttr.get(
                ir.FunctionType.get([], [ir.IntegerType.get_signless(32)]))
        return [Stage("canonicalize", "canonicalize"), Stage("breaks-types", break_result_type),
                Stage("later", lambda m, o: later.append(True)),
                Stage("upstream-only", lambda m, o: upstream.append(True), verify=False)]

    @staticmethod
    def _module():
        from mlir import ir
        return ir.Module.parse("func.func @f() -> f32 {\n  %c = arith.constant 1.0 : f32\n  return %c : f32\n}")

    def _deferred(self):
        """As in a compile worker."""
        from unittest import mock
        from polyblocks_jax.passes import pipeline
        self.enter_context(mock.patch.object(pipeline, "_deferred", True))

    def test_stage_leaving_invalid_ir_is_a_compilation_error_naming_it(self):
        from mlir import ir
        from polyblocks_jax.options import Options
        from polyblocks_jax.passes import run_stages
        later, upstream = [], []
        with ir.Context(), ir.Location.unknown():
            with self.assertRaisesRegex(pb.CompilationError, "(?s)'breaks-types' failed: .*doesn't match") as raised:
                run_stages(self._module(), self._stages(later, upstream), Options())
        self.assertEqual(raised.exception.stage, "breaks-types")
        self.assertEqual((later, upstream), ([], []))

    def test_deferred_invalid_ir_is_a_compilation_error_before_upstream_passes_see_it(self):
        from mlir import ir
        from polyblocks_jax.options import Options
        from polyblocks_jax.passes import run_stages
        self._deferred()
        later, upstream = [], []
        with ir.Context(), ir.Location.unknown():
            with self.assertRaisesRegex(pb.CompilationError, "(?s)'later' failed: .*doesn't match.*"
                                        "changed by breaks-types, later since") as raised:
                run_stages(self._module(), self._stages(later, upstream), Options())
        self.assertEqual(raised.exception.stage, "later")
        self.assertEqual((later, upstream), ([True], []))

    def test_deferred_with_a_dump_the_stage_breaking_the_ir_is_named(self):
        import tempfile
        from mlir import ir
        from polyblocks_jax.dumps import Dump
        from polyblocks_jax.options import Options
        from polyblocks_jax.passes import run_stages
        self._deferred()
        later, upstream = [], []
        with tempfile.TemporaryDirectory() as folder, ir.Context(), ir.Location.unknown():
            with self.assertRaisesRegex(pb.CompilationError, "(?s)'breaks-types' failed: .*doesn't match") as raised:
                run_stages(self._module(), self._stages(later, upstream), Options(dump_dir=folder),
                           Dump(folder, "program"))
        self.assertEqual(raised.exception.stage, "breaks-types")
        self.assertEqual((later, upstream), ([], []))

    def test_a_run_of_python_stages_is_verified_once_in_a_worker(self):
        # Three stages of ours, an upstream one, one of ours: in a worker verified before the
        # upstream stage and at the end; in this process after each of ours.
        from unittest import mock
        from mlir import ir
        from polyblocks_jax.options import Options
        from polyblocks_jax.passes import Stage, pipeline, run_stages
        # (each returns None: it may have changed the module)
        ours = [Stage(f"ours{i}", lambda m, o: None) for i in range(3)]
        verify, verified = ir.Operation.verify, []

        def counted(op):
            verified.append(op)
            return verify(op)
        with ir.Context(), ir.Location.unknown():
            for deferred, count in ((False, 4), (True, 2)):
                del verified[:]
                with mock.patch.object(ir.Operation, "verify", counted), \
                        mock.patch.object(pipeline, "_deferred", deferred):
                    timings = run_stages(self._module(), [*ours, Stage("canonicalize", "canonicalize"), ours[0]],
                                         Options())
                self.assertEqual(len(verified), count, deferred)
                self.assertIn("verify", timings)

    def test_stage_reporting_no_change_is_not_verified_again(self):
        # The contract a stage signs by returning False: the module is as it was. (This one
        # lies, to show that nothing checks after it.)
        from mlir import ir
        from polyblocks_jax.options import Options
        from polyblocks_jax.passes import Stage, run_stages

        def break_result_type_quietly(module, options):
            function = module.body.operations[0]
            function.attributes["function_type"] = ir.TypeAttr.get(
                ir.FunctionType.get([], [ir.IntegerType.get_signless(32)]))
            return False
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse("func.func @f() -> f32 {\n  %c = arith.constant 1.0 : f32\n"
                                     "  return %c : f32\n}")
            timings = run_stages(module, [Stage("unverified", break_result_type_quietly)], Options())
            self.assertEqual(list(timings), ["unverified"])

    def test_stage_of_upstream_pipelines_only_is_not_verified(self):
        # Stage(verify=False) signs that only upstream pipelines change the module (to-llvm):
        # this one lies too, to show that nothing checks after it.
        from mlir import ir
        from polyblocks_jax.options import Options
        from polyblocks_jax.passes import Stage, run_stages

        def break_result_type(module, options):
            function = module.body.operations[0]
            function.attributes["function_type"] = ir.TypeAttr.get(
                ir.FunctionType.get([], [ir.IntegerType.get_signless(32)]))
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse("func.func @f() -> f32 {\n  %c = arith.constant 1.0 : f32\n"
                                     "  return %c : f32\n}")
            timings = run_stages(module, [Stage("upstream-only", break_result_type, verify=False)], Options())
            self.assertEqual(list(timings), ["upstream-only"])
            with self.assertRaises(ir.MLIRError):  # invalid indeed, and run_stages did not look
                module.operation.verify()

    def test_stages_finding_nothing_to_do_say_so_and_those_that_change_the_module_do_not(self):
        # Stages that return False leave the module's text as it was (checked here on two
        # programs); a boolean result widens its buffer, and that stage says so.
        from mlir import ir
        from polyblocks_jax import cpu, passes
        from polyblocks_jax.options import Options
        from polyblocks_jax.stablehlo_import import import_program
        x = np.linspace(-2, 2, 64, dtype=np.float32).reshape(8, 8)
        for fn, changing in ((lambda a: jnp.tanh(a) * 2.0, set()), (lambda a: a > 0.5, {"bool-buffers"})):
            lowered = jax.jit(fn).trace(x).lower(lowering_platforms=("cpu",))
            options = Options()
            stages = cpu.host_stages(options)
            returned = {}
            with ir.Context() as context, ir.Location.unknown():
                module = import_program(lowered, context).module
                for stage in stages:
                    before = str(module) if callable(stage.passes) else None
                    spied = stage
                    if callable(stage.passes):
                        def spy(m, o, run=stage.passes, name=stage.name):
                            returned[name] = run(m, o)
                            return returned[name]
                        spied = passes.Stage(stage.name, spy)
                    passes.run_stages(module, [spied], options)
                    if returned.get(stage.name) is False:
                        self.assertEqual(str(module), before, stage.name)
            unchanged = {name for name, r in returned.items() if r is False}
            self.assertTrue({"heap-limit", "vector-reads", "aliased-results", "unit-kernels"} <= unchanged, unchanged)
            self.assertFalse(changing & unchanged, unchanged)


if __name__ == "__main__":
    absltest.main()
