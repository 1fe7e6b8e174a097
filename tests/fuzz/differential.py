"""Run one program spec on XLA CPU and through polyblocks under every option setting; compare."""
from __future__ import annotations

import unittest

import jax

import polyblocks_jax as pb
import support
from . import interpret


def _setting(off: list[str]) -> tuple[str, pb.Options]:
    name = ",".join(f"no-{s}" for s in off) or "default"
    return name, pb.Options(**{s: False for s in off})


# The CI slice: the default, fusion off, tiling off, every optimization off.
SETTINGS: dict[str, pb.Options] = dict(_setting(off) for off in ([], ["fusion"], ["tiling"], pb.Options.switches()))
# The long mode adds each remaining optimization off on its own.
ALL_SETTINGS: dict[str, pb.Options] = dict(_setting(off) for off in ([], *[[s] for s in pb.Options.switches()],
                                                                      pb.Options.switches()))

_ASSERT = unittest.TestCase()  # support.assert_close reports through a TestCase


class Mismatch(AssertionError):
    """polyblocks disagreed with XLA, or failed on a program XLA ran; names the setting."""

    def __init__(self, setting: str, error: BaseException) -> None:
        self.setting, self.error = setting, error
        super().__init__(f"[{setting}] {type(error).__name__}: {error}")


def check(spec: dict, settings: dict[str, pb.Options] = SETTINGS) -> None:
    """Raise Mismatch unless every setting's results equal XLA's within support's tolerances."""
    fn, args = interpret.build(spec), interpret.make_inputs(spec)
    expected = support.xla_cpu(fn, *args)
    # keep_unused: the executable takes every argument the spec declares, used or not.
    lowered = jax.jit(fn, keep_unused=True).trace(*args).lower(lowering_platforms=("cpu",))
    for name, options in settings.items():
        try:
            actual = pb.compile(lowered, options)(*args)
            support.assert_close(_ASSERT, actual, expected, msg=name)
        except Exception as e:  # noqa: BLE001 (a compile error is a finding too; report it)
            raise Mismatch(name, e) from e
