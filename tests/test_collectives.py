"""Collectives of a shard_map or pmap over one device (stablehlo_import/collectives.py)
against XLA CPU at support's per-dtype tolerances, and the error for groups of several
devices in a program for one (test_devices.py runs programs for several)."""
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from jax import lax
from jax.sharding import Mesh, PartitionSpec as P

import polyblocks_jax as pb
import support

# Functions of one device's block of rows, over the mesh axis "i".
COLLECTIVES = {
    # lax_control_flow_test's testIssue804: a psum in a scan's body
    "psum_in_scan": lambda x: lax.scan(lambda c, r: (c + lax.psum(r, "i"), c), jnp.zeros_like(x[0]), x),
    "pmax_pmin_pmean": lambda x: (lax.pmax(x, "i"), lax.pmin(x, "i"), lax.pmean(x, "i")),
    "all_gather": lambda x: (lax.all_gather(x, "i"), lax.all_gather(x, "i", tiled=True)),
    "psum_scatter": lambda x: lax.psum_scatter(x, "i", tiled=True),
    "ppermute": lambda x: (lax.ppermute(x, "i", [(0, 0)]), lax.ppermute(x, "i", [])),
    "all_to_all": lambda x: lax.all_to_all(x, "i", 0, 0, tiled=True),
    "axis_index": lambda x: x + lax.axis_index("i").astype(x.dtype),
    "psum_complex": lambda x: lax.psum(x * (1 + 2j), "i"),
}


def _block(seed: int) -> np.ndarray:
    return support.random_array(np.random.default_rng(seed), (4, 3), np.float32)


class OneDeviceTest(parameterized.TestCase):
    @parameterized.named_parameters(*COLLECTIVES.items())
    def test_shard_map(self, fn):
        mesh = Mesh(np.array(jax.devices("cpu")[:1]), ("i",))
        mapped = jax.shard_map(fn, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
        support.check_against_xla(self, mapped, _block(1))

    @parameterized.named_parameters(*COLLECTIVES.items())
    def test_pmap_through_the_plugin(self, fn):
        x = _block(2)[None]
        got = jax.pmap(fn, axis_name="i", devices=jax.devices("polyblocks")[:1])(x)
        want = jax.pmap(fn, axis_name="i", devices=jax.devices("cpu")[:1])(x)
        support.assert_close(self, [np.asarray(a) for a in jax.tree_util.tree_leaves(got)],
                             [np.asarray(a) for a in jax.tree_util.tree_leaves(want)])


class GroupsTest(absltest.TestCase):
    def test_groups_of_several_devices_in_a_program_for_one(self):
        program = """
        module attributes {mhlo.num_replicas = 1 : i32, mhlo.num_partitions = 1 : i32} {
          func.func public @main(%arg0: tensor<4xf32>) -> tensor<8xf32> {
            %0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64,
                replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>}> : (tensor<4xf32>) -> tensor<8xf32>
            return %0 : tensor<8xf32>
          }
        }"""
        with self.assertRaises(pb.UnsupportedError) as cm:
            pb.compile(program)
        self.assertIn("stablehlo.all_gather", str(cm.exception))
        self.assertIn("groups of 2 devices", str(cm.exception))


if __name__ == "__main__":
    absltest.main()
