"""Targets as plug-ins: the registry, and the one driver serving each target alike.

A target registered from outside the package (here, the host under another name, with one
stage of its own) compiles through ``polyblocks_jax.compile`` and runs, compared with XLA on
the CPU; the NVIDIA chips' programs (PTX, no GPU needed) take the driver's cache, and its
donation and callback rules.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

import polyblocks_jax as pb
import support
from polyblocks_jax import compiler, passes, targets
from polyblocks_jax.cpu import CpuBackend
from polyblocks_jax.nvptx import GpuExecutable

f32 = np.float32


def _lowered(fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cpu",))


class _CountingHost(CpuBackend):
    """The host under another name, with a stage of its own that counts the programs it sees."""
    name = "test-counting-host"

    def __init__(self) -> None:
        self.seen = 0

    def stages(self, options, tier):
        return [passes.Stage("count", self._count), *super().stages(options, tier)]

    def _count(self, module, options) -> None:
        self.seen += 1


class RegistryTest(absltest.TestCase):
    def test_the_builtin_targets(self):
        self.assertEqual(targets.names()[:4], ["cpu", "nvptx-sm_80", "nvptx-sm_90", "nvptx-sm_90a"])
        self.assertEqual(targets.host().description(), pb.cpu.host().description())
        self.assertEqual(targets.get("nvptx-sm_90a").hardware.chip, "sm_90a")

    def test_an_unknown_target_is_named_with_the_known_ones(self):
        with self.assertRaisesRegex(pb.PolyblocksError, "unknown polyblocks target 'tpu'.*nvptx-sm_80"):
            pb.compile(_lowered(lambda x: x + 1.0, np.ones(4, f32)), target="tpu")

    def test_a_registered_target_compiles_through_the_driver(self):
        counting = _CountingHost()
        targets.register(counting)
        fn = lambda x, y: jax.nn.softmax(x @ y, axis=-1)  # noqa: E731
        x, y = np.random.default_rng(0).standard_normal((2, 16, 32), f32)
        options = pb.Options(in_process=True)  # a worker would register no test target
        exe = pb.compile(_lowered(fn, x, y[0].T), options, target=_CountingHost.name)
        self.assertEqual(counting.seen, 1)
        self.assertTrue(exe.fingerprint.endswith(_CountingHost.name))
        support.assert_close(self, list(exe(x, y[0].T)), support.xla_cpu(fn, x, y[0].T))
        self.assertIs(pb.compile(_lowered(fn, x, y[0].T), options, target=_CountingHost.name), exe)  # cached
        self.assertEqual(counting.seen, 1)


class NvptxThroughTheDriverTest(absltest.TestCase):
    def test_programs_are_cached_by_target(self):
        lowered = _lowered(lambda x: jnp.exp(x) * 2.0, np.ones((8, 8), f32))
        exe = pb.compile(lowered, target="nvptx-sm_80")
        self.assertIsInstance(exe, GpuExecutable)
        self.assertIs(pb.compile(lowered, target="nvptx-sm_80"), exe)
        other = pb.compile(lowered, target="nvptx-sm_90a")
        self.assertEqual(other.chip, "sm_90a")
        self.assertNotEqual(other.fingerprint, exe.fingerprint)
        again = targets.get("nvptx-sm_80").deserialize(exe.serialize())
        self.assertEqual((again.ptx, again.fingerprint), (exe.ptx, exe.fingerprint))

    def test_the_key_says_which_host_choices_are_off(self):
        lowered = _lowered(lambda x: x * 3.0, np.ones(4, f32))
        with_tiling, without = pb.Options(tiling=True), pb.Options(tiling=False)
        self.assertEqual(compiler.fingerprint(lowered.as_text(), with_tiling, target="nvptx-sm_80"),
                         compiler.fingerprint(lowered.as_text(), without, target="nvptx-sm_80"))
        self.assertNotEqual(compiler.fingerprint(lowered.as_text(), with_tiling),
                            compiler.fingerprint(lowered.as_text(), without))

    def test_no_donation_on_a_target_that_reuses_no_buffer(self):
        lowered = jax.jit(lambda x: x * 2.0, donate_argnums=0).trace(np.ones(16, f32)).lower(
            lowering_platforms=("cpu",))
        self.assertEqual(pb.compile(lowered, target="nvptx-sm_80").donated, frozenset())
        self.assertEqual(pb.compile(lowered).donated, frozenset({0}))

    def test_a_callback_into_python_is_unsupported_on_the_gpu(self):
        def fn(x):
            return jax.pure_callback(lambda v: np.asarray(v) * 2, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        # Lowered for our platform: its callbacks call Python functions of this process.
        lowered = jax.jit(fn).trace(np.ones(4, f32)).lower(lowering_platforms=("polyblocks",))
        with self.assertRaisesRegex(pb.UnsupportedError, "calls back into Python from a nvptx-sm_80 program"):
            pb.compile(lowered, target="nvptx-sm_80")


if __name__ == "__main__":
    absltest.main()
