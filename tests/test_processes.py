"""Several processes (``jax.distributed``): 2 on localhost, started by ``mpiexec`` as the README
says, with 2 host devices each, run a shard_map program of every collective and 3 data-parallel
training steps of a small Flax model over all 4 devices; XLA CPU in one process with 4 devices
(jax_num_cpu_devices) runs the same, and the results agree at support's per-dtype tolerances.
A pmap over the 4 devices too. Each process saves the shards it holds; the test assembles
them. A program over 2 of 3 processes runs while the third does nothing. Started without
mpiexec, the processes still agree on the devices, and a collective across them names what
is missing."""
from __future__ import annotations

import importlib.util
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import support
import test_devices

PROCESSES, DEVICES = 2, 2
STEPS = 3


def _mpiexec() -> str | None:
    """The launcher beside this interpreter (the ``mpich`` wheel puts it in the environment's
    bin) or on the PATH."""
    here = os.path.dirname(sys.executable)
    return shutil.which("mpiexec", path=os.pathsep.join([here, os.environ.get("PATH", "")]))


def _skip_reason() -> str | None:
    """Why the test cannot run here; it does not import mpi4py, which would start MPI in this process."""
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install '.[distributed]')"
    if _mpiexec() is None:
        return "no mpiexec beside the interpreter or on the PATH"
    return None


def _model():
    import flax.linen as nn

    class Mlp(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(4)(nn.tanh(nn.Dense(32)(x)))
    return Mlp()


def _train_step(params, x, y):
    """One SGD step on each device's batch, gradients averaged over "d"."""
    def loss(p):
        return jnp.mean((_model().apply(p, x) - y) ** 2)
    grads = lax.pmean(jax.grad(loss)(params), "d")
    return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)


def results(devices: list) -> list[jax.Array]:
    """The collectives programs' arrays, the trained parameters and a pmap's over ``devices``."""
    n = len(devices)
    mesh = Mesh(np.array(devices), ("d",))
    split, replicated = NamedSharding(mesh, P("d")), NamedSharding(mesh, P())

    def put(value, sharding):
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])
    rng = np.random.default_rng(7)
    x = support.random_array(rng, (4 * n, 8), np.float32, edge=False)
    collectives = jax.jit(jax.shard_map(test_devices._collectives(n), mesh=mesh, in_specs=P("d"), out_specs=P("d")))
    out = jax.tree_util.tree_leaves(collectives(put(x, split)))
    # On a 2 x 2 mesh, groups within a process (over "y") and across (over "x"); reductions that
    # MPI computes (f32 sums, int32 maximum) and those gathered first (bf16, f32 minimum).
    grid = Mesh(np.array(devices).reshape(2, n // 2), ("x", "y"))
    reduce = jax.shard_map(lambda a: (lax.psum(a, "y"), lax.psum(a, "x"), lax.pmax((a * 100).astype(jnp.int32), "y"),
                                      lax.psum(a.astype(jnp.bfloat16), "y"), lax.pmin(a, "x")),
                           mesh=grid, in_specs=P("x", "y"), out_specs=P("x", "y"))
    out += list(jax.jit(reduce)(put(x, NamedSharding(grid, P("x", "y")))))

    data, labels = rng.standard_normal((8 * n, 16), np.float32), rng.standard_normal((8 * n, 4), np.float32)
    params = jax.tree_util.tree_map(lambda a: put(np.asarray(a), replicated),
                                    _model().init(jax.random.key(0), np.zeros((1, 16), np.float32)))
    step = jax.jit(jax.shard_map(_train_step, mesh=mesh, in_specs=(P(), P("d"), P("d")), out_specs=P()))
    batch, targets = put(data, split), put(labels, split)
    for _ in range(STEPS):
        params = step(params, batch, targets)
    return out + jax.tree_util.tree_leaves(params) + _pmap(devices)


def _psum_and_gather(devices: list) -> list[jax.Array]:
    mesh = Mesh(np.array(devices), ("d",))
    x = support.random_array(np.random.default_rng(3), (2 * len(devices), 5), np.float32, edge=False)
    placed = jax.make_array_from_callback(x.shape, NamedSharding(mesh, P("d")), lambda index: x[index])
    fn = jax.shard_map(lambda a: (lax.psum(a, "d"), lax.all_gather(a, "d", tiled=True)), mesh=mesh,
                       in_specs=P("d"), out_specs=P("d"))
    return list(jax.jit(fn)(placed))


def _pmap(devices: list) -> list[jax.Array]:
    """pmap over every device: each process passes the rows of its own devices."""
    x = support.random_array(np.random.default_rng(5), (len(devices), 3, 5), np.float32, edge=False)
    rows = [i for i, d in enumerate(devices) if d.process_index == jax.process_index()]
    fn = jax.pmap(lambda a: (lax.psum(a, "i") * a + lax.axis_index("i"), lax.pmax(a.sum(), "i")), axis_name="i",
                  devices=devices)
    split = NamedSharding(Mesh(np.array(devices), ("i",)), P("i"))

    def whole(a):  # pmap's result holds this process's rows: the global array they are part of
        parts = [s.data for s in a.addressable_shards]
        return jax.make_array_from_single_device_arrays((len(devices), *a.shape[1:]), split, parts)
    return [whole(a) for a in fn(x[rows])]


PROGRAMS = {"results": results, "psum_and_gather": _psum_and_gather}


def in_process(port: int, folder: str, program: str, members: tuple[int, ...] | None = None) -> None:
    """Under mpiexec: join the others, run ``PROGRAMS[program]`` on the devices of the processes
    ``members`` (default all; the others run nothing), save this process's shards as (result,
    index, data)."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    jax.distributed.initialize(f"localhost:{port}", num_processes=world.Get_size(), process_id=world.Get_rank())
    members = tuple(range(jax.process_count())) if members is None else members
    shards = []
    if jax.process_index() in members:
        devices = [d for d in jax.devices() if d.process_index in members]
        shards = [(i, s.index, np.asarray(s.data)) for i, a in enumerate(PROGRAMS[program](devices))
                  for s in a.addressable_shards]
    with open(os.path.join(folder, f"{jax.process_index()}.pkl"), "wb") as f:
        pickle.dump(shards, f)


def without_mpiexec(process: int, port: int) -> None:
    """Joined by JAX alone: the global devices, then a cross-process psum's error."""
    jax.distributed.initialize(f"localhost:{port}", num_processes=PROCESSES, process_id=process)
    assert [d.process_index for d in jax.devices()] == [p for p in range(PROCESSES) for _ in range(DEVICES)]
    assert [d.id for d in jax.local_devices()] == [process * DEVICES + i for i in range(DEVICES)]
    mesh = Mesh(np.array(jax.devices()), ("d",))
    x = np.ones((PROCESSES * DEVICES, 3), np.float32)
    placed = jax.make_array_from_callback(x.shape, NamedSharding(mesh, P("d")), lambda index: x[index])
    psum = jax.jit(jax.shard_map(lambda a: lax.psum(a, "d"), mesh=mesh, in_specs=P("d"), out_specs=P("d")))
    try:
        jax.block_until_ready(psum(placed))
    except Exception as e:  # noqa: BLE001 (JaxRuntimeError carries our DistributedError)
        print("error:", e)


def reference(folder: str, program: str, devices: int) -> None:
    """XLA CPU in one process with as many devices."""
    jax.config.update("jax_num_cpu_devices", devices)
    with open(os.path.join(folder, "xla.pkl"), "wb") as f:
        pickle.dump([np.asarray(a) for a in PROGRAMS[program](jax.devices("cpu"))], f)


def _python(call: str) -> str:
    return textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        import test_processes
        test_processes.{call}
    """)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


class ProcessesTest(absltest.TestCase):
    def _against_xla(self, program: str, processes: int, devices: int, members: tuple[int, ...] | None = None):
        """``program`` on ``processes`` x ``devices`` under mpiexec (on the devices of ``members``)
        against XLA CPU in one process with as many devices."""
        used = devices * (processes if members is None else len(members))
        with tempfile.TemporaryDirectory() as folder:
            done = support.run_python(_python(f"reference({folder!r}, {program!r}, {used})"),
                                      env={"JAX_PLATFORMS": "cpu"}, timeout=300)
            self.assertEqual(done.returncode, 0, done.stderr[-4000:])
            env = dict(os.environ, JAX_PLATFORMS="polyblocks", POLYBLOCKS_NUM_DEVICES=str(devices))
            done = subprocess.run([_mpiexec(), "-n", str(processes), sys.executable, "-c",
                                   _python(f"in_process({_free_port()}, {folder!r}, {program!r}, {members!r})")],
                                  env=env, capture_output=True, text=True, errors="replace", timeout=600)
            self.assertEqual(done.returncode, 0, done.stdout[-2000:] + done.stderr[-4000:])
            with open(os.path.join(folder, "xla.pkl"), "rb") as f:
                want = pickle.load(f)
            got, held = [np.zeros_like(w) for w in want], [np.zeros(w.shape, bool) for w in want]
            for process in range(processes):
                with open(os.path.join(folder, f"{process}.pkl"), "rb") as f:
                    for i, index, data in pickle.load(f):
                        got[i][index], held[i][index] = data, True
        for i, (g, w) in enumerate(zip(got, want)):
            self.assertTrue(held[i].all(), f"{program} result {i}: elements no process holds")
            rtol, atol = support.tolerance(w.dtype)
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{program} result {i}")

    @absltest.skipIf(_skip_reason() is not None, _skip_reason() or "")
    def test_collectives_and_training_across_two_processes(self):
        self._against_xla("results", PROCESSES, DEVICES)

    @absltest.skipIf(_skip_reason() is not None, _skip_reason() or "")
    def test_program_over_some_of_the_processes(self):
        """Processes 0 and 2 of 3 (1 device each); process 1, outside the program, runs nothing."""
        self._against_xla("psum_and_gather", 3, 1, members=(0, 2))

    def test_without_mpiexec_the_error_names_it(self):
        port, env = _free_port(), dict(os.environ, JAX_PLATFORMS="polyblocks", POLYBLOCKS_NUM_DEVICES=str(DEVICES))
        started = [subprocess.Popen([sys.executable, "-c", _python(f"without_mpiexec({p}, {port})")], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
                   for p in range(PROCESSES)]
        for process in started:
            out, err = process.communicate(timeout=300)
            self.assertEqual(process.returncode, 0, err[-4000:])
            self.assertIn("error:", out, err[-4000:])
            self.assertIn("mpiexec", out)


if __name__ == "__main__":
    absltest.main()
