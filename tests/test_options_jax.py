"""Options through JAX: ``jax.jit(f, compiler_options=...)`` and ``Lowered.compile(compiler_options)``
set a program's polyblocks options; unknown names and mistyped values fail as XLA's do."""
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from jax._src import config as jax_config  # EffortLevel: JAX's tests use it from here too

import support
from polyblocks_jax import compiler


def pb_device():
    return jax.devices("polyblocks")[0]


def _x():
    return jax.device_put(np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6), pb_device())


def _fingerprint(fn, **options) -> str:
    return jax.jit(fn).lower(_x()).compile(options or None).runtime_executable().fingerprint


def _outcome(fn, x, options) -> str:
    try:
        jax.jit(fn, compiler_options=options)(x).block_until_ready()
        return "ok"
    except jax.errors.JaxRuntimeError:
        return "error"


class KnownOptionsTest(absltest.TestCase):
    def setUp(self):
        support.without_flags(self)  # the defaults are compared with options that change them
        compiler.CACHE.clear()  # a cached executable would be returned without compiling (nor dumping)

    def test_an_option_changes_the_code(self):
        def stages(fusion: bool, d: str) -> dict:
            fn = lambda a: jnp.exp(a) * 3.0 + a  # noqa: E731
            out = jax.jit(fn, compiler_options={"fusion": fusion, "dump_dir": d})(_x())
            support.assert_close(self, [np.asarray(out)], support.xla_cpu(fn, np.asarray(_x())))
            (program,) = os.listdir(d)
            files = sorted(n for n in os.listdir(os.path.join(d, program)) if n.endswith(".mlir"))
            with open(os.path.join(d, program, files[-1])) as f:
                last = f.read()
            return {"stages": {n.split("-", 1)[1] for n in files}, "last": last}
        with tempfile.TemporaryDirectory() as on, tempfile.TemporaryDirectory() as off:
            fused, unfused = stages(True, on), stages(False, off)
        self.assertIn("fusion.mlir", fused["stages"])
        self.assertNotIn("fusion.mlir", unfused["stages"])
        self.assertNotEqual(fused["last"], unfused["last"])  # the module code is generated from

    def test_options_are_part_of_the_cache_key(self):
        fn = lambda a: a * 5.0 - 1.0  # noqa: E731
        default, unfused = _fingerprint(fn), _fingerprint(fn, fusion=False)
        self.assertNotEqual(default, unfused)
        self.assertEqual(_fingerprint(fn, fusion="true"), default)  # its text as POLYBLOCKS_FLAGS writes it
        self.assertEqual(len({default, unfused, _fingerprint(fn, opt_level=0)}), 3)

    def test_optimization_level_sets_opt_level(self):
        fn = lambda a: a * 7.0  # noqa: E731
        o0 = _fingerprint(fn, optimization_level=jax_config.EffortLevel.O0.value)
        self.assertEqual(o0, _fingerprint(fn, opt_level=0))
        self.assertNotEqual(o0, _fingerprint(fn))
        self.assertEqual(_fingerprint(fn, optimization_level=jax_config.EffortLevel.UNKNOWN.value), _fingerprint(fn))


class CheckedOptionsTest(absltest.TestCase):
    def assert_fails(self, options: dict, message: str):
        with self.assertRaisesRegex(jax.errors.JaxRuntimeError, message):
            jax.jit(lambda a: a + 2.0, compiler_options=options)(_x())

    def test_unknown_name_fails_naming_the_known_ones(self):
        self.assert_fails({"fuson": False}, r"INVALID_ARGUMENT.*No such compile option: 'fuson'.*"
                                            r"fusion.*opt_level.*exec_time_optimization_effort")

    def test_values_are_typed_and_checked(self):
        self.assert_fails({"fusion": 1}, "'fusion=1' takes true or false")
        self.assert_fails({"opt_level": True}, "takes an integer")
        self.assert_fails({"opt_level": 4}, "opt_level must be 0..3")
        self.assert_fails({"precision": "fp64"}, "precision must be one of")
        self.assert_fails({"matrix_unit": 2}, "takes a string")
        self.assert_fails({"xla_embed_ir_in_executable": "invalid_value"}, "is not a valid bool value")
        for ok in ({"fusion": False}, {"opt_level": "1"}, {"precision": "mixed_bf16_fp32", "parallel": "false"}):
            self.assertEqual(_outcome(lambda a: a + 2.0, _x(), ok), "ok", str(ok))

    def test_efforts_in_range(self):
        for name in ("exec_time_optimization_effort", "memory_fitting_effort"):
            for value in (-1.0, 0.0, 0.5, 1):
                self.assertEqual(_outcome(lambda a: a - 3.0, _x(), {name: value}), "ok", f"{name}={value}")
            self.assert_fails({name: 1.5}, rf"{name} must be in \[-1.0, 1.0\], got 1.5")
        self.assert_fails({"memory_fitting_level": 3}, "memory_fitting_level must be a jax.config.EffortLevel")
        self.assertEqual(_outcome(lambda a: a - 3.0, _x(), {"memory_fitting_level": 9}), "ok")

    def test_xla_names_checked_as_xla_checks_them(self):
        cases = [{"xla_embed_ir_in_executable": True}, {"xla_embed_ir_in_executable": "True"},
                 {"xla_embed_ir_in_executable": "true"}, {"xla_embed_ir_in_executable": 1},
                 {"xla_dump_max_hlo_modules": 200}, {"xla_dump_max_hlo_modules": "12"},
                 {"xla_dump_max_hlo_modules": 2.5}, {"xla_dump_max_hlo_modules": True},
                 {"xla_gpu_auto_spmd_partitioning_memory_budget_ratio": 0.5},
                 {"xla_gpu_auto_spmd_partitioning_memory_budget_ratio": "0.5"},
                 {"xla_gpu_auto_spmd_partitioning_memory_budget_ratio": 1},
                 {"xla_dump_to": 3}, {"xla_gpu_enable_command_buffer": ""}, {"exec_time_compilation_effort": 0.0}]
        fn = lambda a: a * 2.0  # noqa: E731
        cpu = jax.device_put(np.ones(3, np.float32), jax.devices("cpu")[0])
        for options in cases:
            self.assertEqual(_outcome(fn, _x(), options), _outcome(fn, cpu, options), str(options))


if __name__ == "__main__":
    absltest.main()
