"""The object cache (cpu/object_cache.py): a hit links the object without running LLVM and
gives the same library; entries on disk serve another process; a damaged entry is compiled
again, never trusted; the folder stays within its bound."""
import os
import tempfile
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

import polyblocks_jax as pb
import support
from polyblocks_jax import compiler, logs
from polyblocks_jax.cpu import codegen, object_cache


def _fn(a, b):
    return jnp.tanh(a @ b) + a


def _arguments():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((32, 32)).astype(np.float32) for _ in range(2)]


class ObjectCacheTest(absltest.TestCase):
    def setUp(self):
        self.folder = self.enter_context(tempfile.TemporaryDirectory())
        self.cache = object_cache.ObjectCache(self.folder)
        self.enter_context(mock.patch.object(codegen, "OBJECTS", self.cache))
        self.enter_context(support.in_process())  # where the patched cache is the one used

    def _compile(self, options=None):
        compiler.CACHE.clear()
        args = _arguments()
        return pb.compile(jax.jit(_fn).trace(*args).lower(lowering_platforms=("cpu",)), options)

    def _entries(self):
        return [os.path.join(root, name) for root, _, names in os.walk(self.folder) for name in names]

    def test_a_hit_skips_llvm_and_links_the_same_library(self):
        first = self._compile()
        self.assertIn("llc part0", first.timings)
        self.assertEqual((self.cache.hits, self.cache.misses), (0, 1))
        second = self._compile()
        self.assertIn("cached part0", second.timings)
        self.assertNotIn("opt part0", second.timings)
        self.assertNotIn("llc part0", second.timings)
        self.assertEqual(logs.cached_parts(second.timings), (1, 1))
        self.assertEqual((self.cache.hits, self.cache.misses), (1, 1))
        self.assertEqual(first._exe.library, second._exe.library)
        args = _arguments()
        support.assert_close(self, list(second(*args)), support.xla_cpu(_fn, *args), rtol=1e-5, atol=1e-5)

    def test_the_disk_serves_another_process(self):
        self._compile()
        self.cache.clear_memory()  # as a fresh process would start
        self.assertIn("cached part0", self._compile().timings)

    def test_a_damaged_entry_is_compiled_again(self):
        self._compile()
        (entry,) = self._entries()
        for damage in (b"", b"not an object", None):
            with open(entry, "r+b") as f:
                data = f.read()
                f.seek(0)
                f.truncate()
                f.write(data[:-7] + b"garbage" if damage is None else damage)  # a flipped tail
            self.cache.clear_memory()
            exe = self._compile()
            self.assertIn("llc part0", exe.timings)  # not trusted: compiled, and written again
            args = _arguments()
            support.assert_close(self, list(exe(*args)), support.xla_cpu(_fn, *args), rtol=1e-5, atol=1e-5)
            (entry,) = self._entries()

    def test_no_object_cache(self):
        self._compile(pb.Options(object_cache=False))
        self.assertEqual(self._entries(), [])
        self.assertIn("llc part0", self._compile(pb.Options(object_cache=False)).timings)
        self.assertEqual(self.cache.hits + self.cache.misses, 0)

    def test_a_shard_stays_within_its_share_of_the_bound_least_recently_used_first(self):
        small = object_cache.ObjectCache(self.folder, disk_bytes=4000 * object_cache._SHARDS, memory_bytes=0)
        names = [f"ab{i:02d}" + "0" * 60 for i in range(8)]  # one shard
        for i, name in enumerate(names):
            small.put(name, bytes(1000))
            os.utime(small._path(name), (i, i))  # ages in order of writing
        self.assertLessEqual(sum(os.path.getsize(p) for p in self._entries()), 4000)
        self.assertIsNotNone(small.get(names[-1]))  # the newest stays
        self.assertIsNone(small.get(names[0]))

    def test_a_write_measures_its_shard_not_the_folder(self):
        # a walk of a full folder (some 60000 entries) took a second of a compile
        small = object_cache.ObjectCache(self.folder, memory_bytes=0)
        for i in range(4):
            small.put(f"{i:02d}" + "0" * 62, bytes(10))
        listed = []
        real = os.scandir

        def scandir(path):
            listed.append(os.path.relpath(path, self.folder))
            return real(path)
        with mock.patch.object(os, "walk", side_effect=AssertionError("walked the folder")), \
                mock.patch.object(os, "scandir", scandir):
            small.put("cd" + "0" * 62, bytes(10))
        self.assertEqual(listed, ["cd"])

    def test_the_key_holds_the_ir_and_its_context(self):
        self.assertNotEqual(object_cache.key("ir", "a", "2"), object_cache.key("ir", "a", "3"))
        self.assertNotEqual(object_cache.key("ir", "a2", ""), object_cache.key("ir", "a", "2"))
        self.assertNotEqual(object_cache.key("ir1", "a"), object_cache.key("ir2", "a"))


if __name__ == "__main__":
    absltest.main()
