"""Several host devices (POLYBLOCKS_NUM_DEVICES) and programs for several devices (shard_map,
pmap) against XLA CPU with as many devices (jax_num_cpu_devices), at support's per-dtype
tolerances. Device counts are fixed when the backends start: each test runs a child process
that calls ``check(name, devices)`` of this module."""
from __future__ import annotations

import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import polyblocks_jax as pb
import support
from polyblocks_jax import compiler
from polyblocks_jax.cpu.memref import aligned_empty
from polyblocks_jax.runtime.collectives import run_instances

DTYPES = (np.float32, jnp.bfloat16, np.int32)


def _collectives(n: int):
    """Every collective of one device's (4, 8) block over the mesh axis "d" of ``n`` devices."""
    ring = [(i, (i + 1) % n) for i in range(n)]

    def fn(x):
        floats = jnp.issubdtype(x.dtype, jnp.floating)
        return {
            "psum": lax.psum(x, "d"), "pmax": lax.pmax(x, "d"), "pmin": lax.pmin(x, "d"),
            "pmean": lax.pmean(x, "d") if floats else x,
            "all_gather": lax.all_gather(x, "d"), "all_gather_tiled": lax.all_gather(x, "d", axis=1, tiled=True),
            "psum_scatter": lax.psum_scatter(x, "d", tiled=True),
            "psum_scatter_1": lax.psum_scatter(x, "d", scatter_dimension=1, tiled=True),
            "all_to_all": lax.all_to_all(x, "d", 0, 1, tiled=True),
            "ppermute": lax.ppermute(x, "d", ring), "ppermute_partial": lax.ppermute(x, "d", ring[:1]),
            "axis_index": x + lax.axis_index("d").astype(x.dtype),
            "psum_in_scan": lax.scan(lambda c, r: (c + lax.psum(r, "d"), c), jnp.zeros_like(x[0]), x),
        }
    return fn


def _mesh_2d(x):
    """A 2 x 2 mesh: collectives over one axis are groups of two devices."""
    return lax.psum(x, "x"), lax.all_gather(x, "y", tiled=True), lax.ppermute(x, "y", [(0, 1), (1, 0)]), \
        x * lax.axis_index("x").astype(x.dtype) + lax.axis_index("y").astype(x.dtype)


def _on(platform: str, fn, mesh_shape: tuple[int, ...], names: tuple[str, ...], in_specs, out_specs,
        order: list[int] | None = None):
    """``fn`` under jit and shard_map on a mesh of ``platform``'s first devices (in ``order``)."""
    devices = np.array(jax.devices(platform)[:int(np.prod(mesh_shape))])
    mesh = Mesh((devices if order is None else devices[order]).reshape(mesh_shape), names)
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs))


def _compare(got, want, what: str) -> None:
    got, want = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, f"{what} result {i}: {g.dtype}{g.shape} != {w.dtype}{w.shape}"
        rtol, atol = support.tolerance(w.dtype)
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol,
                                   err_msg=f"{what} result {i}")


def _check_collectives(n: int) -> None:
    rng = np.random.default_rng(n)
    for dtype in DTYPES:
        x = support.random_array(rng, (4 * n, 8), dtype, edge=False)
        specs = (P("d"),), P("d")
        want = _on("cpu", _collectives(n), (n,), ("d",), *specs)(x)
        got = _on("polyblocks", _collectives(n), (n,), ("d",), *specs)(x)
        _compare(got, want, f"collectives of {np.dtype(dtype).name} on {n} devices")
    x = support.random_array(rng, (4 * n, 8), np.complex64, edge=False)
    moved = lambda a: (lax.psum(a, "d"), lax.all_gather(a, "d"), lax.ppermute(a, "d", [(0, n - 1)]),  # noqa: E731
                       lax.psum_scatter(a, "d", tiled=True), lax.all_to_all(a, "d", 0, 1, tiled=True))
    specs = (P("d"),), P("d")
    _compare(_on("polyblocks", moved, (n,), ("d",), *specs)(x), _on("cpu", moved, (n,), ("d",), *specs)(x),
             f"collectives of complex64 on {n} devices")
    if n == 4:
        x = support.random_array(rng, (8, 6), np.float32, edge=False)
        specs = (P("x", "y"),), P("x", "y")
        _compare(_on("polyblocks", _mesh_2d, (2, 2), ("x", "y"), *specs)(x),
                 _on("cpu", _mesh_2d, (2, 2), ("x", "y"), *specs)(x), "a 2 x 2 mesh")
        # Devices in another order than their ids: the device assignment maps the mesh's.
        ring = functools.partial(lax.ppermute, axis_name="d", perm=[(i, (i + 1) % n) for i in range(n)])
        specs = (P("d"),), P("d")
        _compare(_on("polyblocks", ring, (n,), ("d",), *specs, order=[2, 0, 3, 1])(x),
                 _on("cpu", ring, (n,), ("d",), *specs, order=[2, 0, 3, 1])(x), "a mesh in another order")
        # A result split over "x" and replicated over "y"; an argument replicated over "x".
        summed = functools.partial(lax.psum, axis_name="y")
        specs = (P(None, "y"),), P("x")
        _compare(_on("polyblocks", summed, (2, 2), ("x", "y"), *specs)(x),
                 _on("cpu", summed, (2, 2), ("x", "y"), *specs)(x), "a result replicated over one axis")


def _check_pmap(n: int) -> None:
    x = support.random_array(np.random.default_rng(0), (n, 3, 5), np.float32, edge=False)

    def fn(a):
        return lax.psum(a, "i") * a + lax.axis_index("i"), lax.pmax(a.sum(), "i")
    _compare(jax.pmap(fn, axis_name="i", devices=jax.devices("polyblocks")[:n])(x),
             jax.pmap(fn, axis_name="i", devices=jax.devices("cpu")[:n])(x), f"pmap on {n} devices")


def _mlp_step(params, x, y):
    """One data-parallel SGD step of a two-layer MLP: gradients averaged over "d"."""
    def loss(p):
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)
    value, grads = jax.value_and_grad(loss)(params)
    grads = lax.pmean(grads, "d")
    return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads), lax.pmean(value, "d")


def _check_mlp(n: int) -> None:
    rng = np.random.default_rng(1)
    params = {"w1": rng.standard_normal((16, 32), np.float32) * 0.3, "b1": np.zeros(32, np.float32),
              "w2": rng.standard_normal((32, 4), np.float32) * 0.3, "b2": np.zeros(4, np.float32)}
    x, y = rng.standard_normal((8 * n, 16), np.float32), rng.standard_normal((8 * n, 4), np.float32)
    specs = (P(), P("d"), P("d")), (P(), P())
    _compare(_on("polyblocks", _mlp_step, (n,), ("d",), *specs)(params, x, y),
             _on("cpu", _mlp_step, (n,), ("d",), *specs)(params, x, y), f"an MLP step on {n} devices")


def _check_devices(n: int) -> None:
    devices = jax.devices("polyblocks")
    assert [d.id for d in devices] == list(range(n)), devices
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    placed = [jax.device_put(x, d) for d in devices]
    doubled = [jax.jit(lambda a: a * 2 + 1)(a) for a in placed]  # runs where its argument is
    for d, a in zip(devices, doubled):
        assert a.devices() == {d}, (a.devices(), d)
        np.testing.assert_array_equal(np.asarray(a), x * 2 + 1)
    moved = jax.device_put(doubled[0], devices[-1])  # PJRT_Buffer_CopyToDevice
    assert moved.devices() == {devices[-1]}
    np.testing.assert_array_equal(np.asarray(moved), x * 2 + 1)


def _check_automatic_sharding(n: int) -> None:
    mesh = Mesh(np.array(jax.devices("polyblocks")), ("d",))
    x = jax.device_put(np.ones((4 * n, 2), np.float32), NamedSharding(mesh, P("d")))
    try:
        jax.jit(lambda a: a * 2)(x)
    except Exception as e:  # noqa: BLE001 (JaxRuntimeError carries our UnsupportedError's message)
        assert "shard_map" in str(e), e
    else:
        raise AssertionError("a program to partition compiled")


def _check_replicated(n: int) -> None:
    """A program of whole arrays on every device needs no partitioning: each device runs it."""
    def on(platform):
        replicated = NamedSharding(Mesh(np.array(jax.devices(platform)), ("d",)), P())
        x = jax.device_put(np.linspace(-1, 1, 6, dtype=np.float32), replicated)
        return jax.jit(lambda a: jnp.sin(a) * 2, out_shardings=replicated)(x)
    _compare(on("polyblocks"), on("cpu"), f"a replicated program on {n} devices")


def _check_donation(n: int) -> None:
    x = np.arange(8 * n, dtype=np.float32).reshape(4 * n, 2)
    specs = (P("d"),), P("d")
    step = lambda a: lax.psum(a, "d") + a  # noqa: E731
    want = _on("cpu", step, (n,), ("d",), *specs)(x)
    mesh = Mesh(np.array(jax.devices("polyblocks")), ("d",))
    placed = jax.device_put(x, NamedSharding(mesh, P("d")))
    got = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=specs[0], out_specs=specs[1]), donate_argnums=0)(placed)
    _compare(got, want, "a donating program")
    assert placed.is_deleted()


def _check_instance_error(n: int) -> None:
    """A callback raising on one device ends the call with its error on every device (no instance
    waits for ever at a collective), and the next call runs."""
    def fail_on_one(i):
        if int(i) == n - 1:
            raise ValueError("device failed")

    def step(a):
        jax.debug.callback(fail_on_one, lax.axis_index("d"))
        return lax.psum(a, "d")
    mapped = _on("polyblocks", step, (n,), ("d",), (P("d"),), P("d"))
    x = np.ones((n, 3), np.float32)
    try:
        jax.block_until_ready(mapped(x))
    except Exception as e:  # noqa: BLE001 (JaxRuntimeError carries the CallbackError)
        assert "device failed" in str(e), e
    else:
        raise AssertionError("the callback's error was lost")
    works = _on("polyblocks", lambda a: lax.psum(a, "d"), (n,), ("d",), (P("d"),), P("d"))
    np.testing.assert_array_equal(np.asarray(works(x)), np.full((n, 3), n, np.float32))


CHECKS = {"collectives": _check_collectives, "pmap": _check_pmap, "mlp": _check_mlp, "devices": _check_devices,
          "automatic_sharding": _check_automatic_sharding, "replicated": _check_replicated,
          "donation": _check_donation, "instance_error": _check_instance_error}


def check(name: str, devices: int) -> None:
    """In a fresh process: XLA CPU and polyblocks with ``devices`` devices each, then ``name``'s check."""
    jax.config.update("jax_num_cpu_devices", devices)
    CHECKS[name](devices)


class DevicesTest(parameterized.TestCase):
    def _run(self, name: str, devices: int) -> None:
        code = f"""
            import sys
            sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
            import test_devices
            test_devices.check({name!r}, {devices})
            print("checked")
        """
        done = support.run_python(code, env={"POLYBLOCKS_NUM_DEVICES": str(devices),
                                             "JAX_PLATFORMS": "cpu,polyblocks"}, timeout=600)
        self.assertEqual(done.returncode, 0, done.stderr[-4000:])
        self.assertIn("checked", done.stdout)

    @parameterized.parameters(1, 2, 4)
    def test_collectives(self, devices):
        self._run("collectives", devices)

    @parameterized.parameters(2, 4)
    def test_pmap(self, devices):
        self._run("pmap", devices)

    def test_mlp_gradient_step(self):
        self._run("mlp", 4)

    def test_devices_and_copies(self):
        self._run("devices", 4)

    def test_automatic_sharding_names_shard_map(self):
        self._run("automatic_sharding", 2)

    def test_replicated_program(self):
        self._run("replicated", 2)

    def test_donation(self):
        self._run("donation", 2)

    def test_error_on_one_device(self):
        self._run("instance_error", 2)

    def test_device_assignment_round_trip(self):
        """The DeviceAssignmentProto we hand jaxlib is the one XLA writes for the same grid."""
        from jaxlib import xla_client
        from polyblocks_jax.pjrt import device_assignment
        grid = [[4, 1, 2], [0, 3, 5]]  # [replica][partition]
        xla = xla_client.DeviceAssignment.create(np.array(grid)).serialize()
        self.assertEqual(device_assignment.decode_grid(xla), grid)
        self.assertEqual(device_assignment.decode_grid(device_assignment.encode_grid(grid)), grid)

    def test_replicas_program_compiles_with_its_collectives(self):
        """A program for two replicas (no Shardy: main is each replica's) describes its collectives."""
        exe = pb.compile(SWAP)
        self.assertEqual((exe.replicas, exe.partitions), (2, 1))
        self.assertEqual([c.peers for c in exe.collectives], [((1,), (0,))])
        with self.assertRaisesRegex(pb.InvalidArgumentError, "one instance per device"):
            exe(np.ones(4, np.float32))  # alone, its collectives would have no one to meet

    def test_serialized_program_runs_its_collectives(self):
        """The collectives' description travels with the executable, and the library loaded in
        a process finds that process's runtime."""
        loaded = compiler.deserialize(pb.compile(SWAP).serialize())
        arguments = [[np.full(4, p + 1, np.float32)] for p in range(2)]
        for p, (out,) in enumerate(_run_devices(loaded, arguments)):
            np.testing.assert_array_equal(out, np.full(4, 2 - p, np.float32))


# Two replicas exchange their values.
SWAP = """
module attributes {mhlo.num_replicas = 2 : i32, mhlo.num_partitions = 1 : i32} {
  func.func public @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
    %0 = "stablehlo.collective_permute"(%arg0) <{source_target_pairs = dense<[[0, 1], [1, 0]]>
        : tensor<2x2xi64>}> : (tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}"""


def _run_devices(exe, arguments: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    """Run ``exe`` (a program for several devices) with ``arguments[p]`` on process ``p``."""
    outputs = [[aligned_empty(s.shape, s.dtype.numpy) for s in exe.outputs] for _ in arguments]
    run_instances([lambda p=p: exe.run(arguments[p], outputs[p]) for p in range(len(arguments))], exe.collectives)
    return outputs


# Every reduction of an all_reduce's body, JAX's psum, pmax and pmin and those they do not
# reach; exact on integers and booleans (add: or, multiply: and), so numpy is the reference.
REDUCTIONS = {"multiply": np.multiply, "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
              "add": np.add, "maximum": np.maximum, "minimum": np.minimum}


class ReductionsTest(parameterized.TestCase):
    @parameterized.product(op=sorted(REDUCTIONS), dtype=("i32", "ui8", "i1"), devices=(2, 4),
                           mode=("replicas", "partitions"))
    def test_all_reduce(self, op, dtype, devices, mode):
        numpy_dtype = {"i32": np.int32, "ui8": np.uint8, "i1": np.bool_}[dtype]
        counts = (devices, 1) if mode == "replicas" else (1, devices)
        # Partitions: the ids of every device (flattened); replicas: groups of replica ids.
        extra = "channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids, " \
            if mode == "partitions" else ""
        groups = f"replica_groups = dense<[[{', '.join(map(str, range(devices)))}]]> : tensor<1x{devices}xi64>"
        exe = pb.compile(f"""
        module attributes {{mhlo.num_replicas = {counts[0]} : i32, mhlo.num_partitions = {counts[1]} : i32}} {{
          func.func public @main(%arg0: tensor<3x5x{dtype}>) -> tensor<3x5x{dtype}> {{
            %0 = "stablehlo.all_reduce"(%arg0) <{{{extra}{groups}}}> ({{
            ^bb0(%a: tensor<{dtype}>, %b: tensor<{dtype}>):
              %s = stablehlo.{op} %a, %b : tensor<{dtype}>
              stablehlo.return %s : tensor<{dtype}>
            }}) : (tensor<3x5x{dtype}>) -> tensor<3x5x{dtype}>
            return %0 : tensor<3x5x{dtype}>
          }}
        }}""")
        rng = np.random.default_rng(devices)
        arguments = [[support.random_array(rng, (3, 5), numpy_dtype, edge=False)] for _ in range(devices)]
        want = functools.reduce(REDUCTIONS[op], [a[0] for a in arguments])
        for p, (out,) in enumerate(_run_devices(exe, arguments)):
            np.testing.assert_array_equal(out, want, err_msg=f"device {p}")

    def test_collective_broadcast_and_groups_of_two(self):
        """Four replicas in groups {0, 2} and {3, 1}: each receives its group's first member's value."""
        exe = pb.compile("""
        module attributes {mhlo.num_replicas = 4 : i32, mhlo.num_partitions = 1 : i32} {
          func.func public @main(%arg0: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>) {
            %0 = "stablehlo.collective_broadcast"(%arg0) <{replica_groups = dense<[[0, 2], [3, 1]]>
                : tensor<2x2xi64>}> : (tensor<2xf32>) -> tensor<2xf32>
            %1 = "stablehlo.all_reduce"(%arg0) <{replica_groups = dense<[[0, 2], [3, 1]]> : tensor<2x2xi64>}> ({
            ^bb0(%a: tensor<f32>, %b: tensor<f32>):
              %s = stablehlo.add %a, %b : tensor<f32>
              stablehlo.return %s : tensor<f32>
            }) : (tensor<2xf32>) -> tensor<2xf32>
            return %0, %1 : tensor<2xf32>, tensor<2xf32>
          }
        }""")
        arguments = [[np.full(2, p + 1, np.float32)] for p in range(4)]
        first = {0: 1, 2: 1, 3: 4, 1: 4}
        total = {0: 4, 2: 4, 3: 6, 1: 6}
        for p, (broadcast, summed) in enumerate(_run_devices(exe, arguments)):
            np.testing.assert_array_equal(broadcast, np.full(2, first[p], np.float32))
            np.testing.assert_array_equal(summed, np.full(2, total[p], np.float32))


if __name__ == "__main__":
    absltest.main()
