"""Buffer donation: which arguments a program gives up, and which result reuses each buffer.

JAX marks a donated argument of ``main`` with ``tf.aliasing_output = k`` (result ``k``
should live in its buffer) or ``jax.buffer_donor`` (donated; the compiler picks).
``polyblocks_jax.compile(..., donate_argnums=...)`` replaces the program's marks. A donor
reuses its marked result when the types match, else the first result of exactly its type
(shape and dtype) that no other donor holds; a donor without one is still given up (JAX
deletes it after the call) but its memory is not reused.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from polyblocks_jax.dtypes import TensorSpec
from polyblocks_jax.errors import InvalidArgumentError

ALIASING_OUTPUT = "tf.aliasing_output"
BUFFER_DONOR = "jax.buffer_donor"


@dataclasses.dataclass(frozen=True)
class Donation:
    donated: frozenset[int] = frozenset()   # arguments the caller gives up
    aliases: dict[int, int] = dataclasses.field(default_factory=dict)  # argument -> result in its buffer


def program_marks(main) -> dict[int, int | None]:
    """Donated arguments of a jaxlib ``func.func @main``: index -> marked result, or None (a donor)."""
    if "arg_attrs" not in main.attributes:
        return {}
    marks: dict[int, int | None] = {}
    for i, attrs in enumerate(main.attributes["arg_attrs"]):
        if ALIASING_OUTPUT in attrs:
            marks[i] = int(attrs[ALIASING_OUTPUT].value)
        elif BUFFER_DONOR in attrs and bool(attrs[BUFFER_DONOR].value):
            marks[i] = None
    return marks


def requested_marks(marks: dict[int, int | None], donate_argnums: Sequence[int] | None,
                    num_inputs: int) -> dict[int, int | None]:
    """The program's marks, or ``donate_argnums`` (keeping a program mark on an argument it names)."""
    if donate_argnums is None:
        return marks
    requested = {}
    for i in donate_argnums:
        if not isinstance(i, int) or not 0 <= i < num_inputs:
            raise InvalidArgumentError(f"donate_argnums: {i!r} is not an argument index (0..{num_inputs - 1})")
        requested[i] = marks.get(i)
    return requested


def plan(marks: dict[int, int | None], inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> Donation:
    """Pair each donated argument with a result of its exact type, marked results first."""
    aliases: dict[int, int] = {}
    for i, k in sorted(marks.items()):
        if k is not None and 0 <= k < len(outputs) and outputs[k] == inputs[i] and k not in aliases.values():
            aliases[i] = k
    for i, k in sorted(marks.items()):
        if i not in aliases:
            free = [j for j, spec in enumerate(outputs) if spec == inputs[i] and j not in aliases.values()]
            if free:
                aliases[i] = free[0]
    return Donation(frozenset(marks), aliases)
