"""The three benchmark models at small sizes, through jax.jit on platform "polyblocks", vs XLA."""
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

import polyblocks_jax as pb
import support
from bench import flax_models

# Whole models sum thousands of products per output (convolutions, matmuls, norms) in
# an order other than XLA's, over tens of layers: f32 rounding differences accumulate
# well past the per-op tolerance of support.TOLERANCES, but stay far below 1e-4.
MODEL_RTOL, MODEL_ATOL = 1e-4, 1e-4
# In bf16 throughout, each layer rounds to 8 mantissa bits (2^-7 = 0.8%), in its own order
# on each side: a few bf16 ulps of the output's scale (the small models differ by 1-2%).
BF16_MODEL_TOLERANCE = 0.03


def on_polyblocks(fn, *args) -> list:
    """Results of ``jax.jit(fn)`` with ``args`` placed on the polyblocks device."""
    device = jax.devices("polyblocks")[0]  # no plugin is a failure, not a skip
    out = jax.jit(fn)(*jax.device_put(args, device))
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(out)]


class ModelsTest(parameterized.TestCase):
    @parameterized.parameters(*flax_models.MODEL_NAMES)
    def test_small_model_matches_xla(self, name):
        case = flax_models.make(name, batch=2, small=True)
        expected = support.xla_cpu(case.apply, case.params, case.input)
        actual = on_polyblocks(case.apply, case.params, case.input)
        support.assert_close(self, actual, expected, rtol=MODEL_RTOL, atol=MODEL_ATOL, msg=name)


class Bf16ModelsTest(parameterized.TestCase):
    @parameterized.parameters(*flax_models.MODEL_NAMES)
    def test_small_bf16_model_matches_xla(self, name):
        case = flax_models.make(name, batch=2, small=True, dtype=jnp.bfloat16)
        expected = support.xla_cpu(case.apply, case.params, case.input)
        actual = on_polyblocks(case.apply, case.params, case.input)
        scale = max(float(np.abs(e.astype(np.float32)).max()) for e in expected)
        support.assert_close(self, actual, expected, rtol=BF16_MODEL_TOLERANCE,
                             atol=BF16_MODEL_TOLERANCE * scale, msg=name)


class TrainingTest(parameterized.TestCase):
    """A training step: the loss's gradients through every layer (transposed and strided
    convolutions, pooling's and normalization's gradients, reductions over the batch)."""

    @parameterized.parameters(*flax_models.MODEL_NAMES)
    def test_small_model_gradients_match_xla(self, name):
        case = flax_models.make(name, batch=2, small=True)
        args = (case.params, case.input, flax_models.training_target(case))
        expected = support.xla_cpu(flax_models.loss_and_grads(case), *args)
        actual = on_polyblocks(flax_models.loss_and_grads(case), *args)
        # Against the largest gradient: some are 0 up to rounding (a bias a normalization
        # follows), a few ulps of noise on either side.
        scale = max(float(np.abs(g).max()) for g in expected[1:])
        support.assert_close(self, actual, expected, rtol=MODEL_RTOL, atol=MODEL_ATOL * scale, msg=name)

    def test_train_step_updates_parameters_as_xla(self):
        case = flax_models.make("resnet18", batch=2, small=True)
        args = (case.params, case.input, flax_models.training_target(case))
        step = flax_models.train_step(case)
        support.assert_close(self, on_polyblocks(step, *args), support.xla_cpu(step, *args),
                             rtol=MODEL_RTOL, atol=MODEL_ATOL)


class SwitchedOffTest(parameterized.TestCase):
    """Each model with each optimization off in turn: the same results, so that any one of
    them can be measured on its own (bench/ablation.py) without changing what is computed."""

    @parameterized.named_parameters((f"{name}_no_{switch}", name, switch)
                                    for name in flax_models.MODEL_NAMES for switch in pb.Options.switches())
    def test_model_without(self, name, switch):
        case = flax_models.make(name, batch=2, small=True)
        leaves, tree = jax.tree_util.tree_flatten((case.params, case.input))
        support.check_against_xla(self, lambda *flat: case.apply(*jax.tree_util.tree_unflatten(tree, flat)),
                                  *leaves, rtol=MODEL_RTOL, atol=MODEL_ATOL, options=pb.Options(**{switch: False}))


if __name__ == "__main__":
    absltest.main()
