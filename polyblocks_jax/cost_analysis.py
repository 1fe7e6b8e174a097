"""Our cost model of a whole program: flops, transcendentals and bytes accessed, read off the
StableHLO that JAX hands over (what ``compiled.cost_analysis()`` returns on the platform).

Flops follow XLA's HloCostAnalysis where the op is the same:
- an elementwise op is one flop per element, or one transcendental for exp, log, tanh, ...
  (chlo's special functions, which XLA expands before counting, are one transcendental here);
- ``dot_general`` is 2 x output elements x contracted size, ``convolution`` 2 x output elements
  x kernel window x input features (windows over padding included);
- ``reduce`` is its reducer's flops per element combined (inputs - outputs), ``reduce_window``
  per window element beyond the first, ``scatter`` per update element;
- ``while``, ``if`` and ``case`` count each region once (trip counts are not known), a call its
  function; other ops (data movement, gather, sort, custom calls) count no flops.

Bytes accessed follow our fusion, not XLA's: an elementwise op, broadcast, reshape, transpose,
slice, constant or iota is computed inside its users when they all are such ops or reductions
(never inside a contraction); every other op is a loop nest that reads its inputs (through
the ops computed inside it) and writes its results, once each.
"""
from __future__ import annotations

import dataclasses
import math

from jaxlib.mlir import ir as jir
from jaxlib.mlir.dialects import stablehlo

from polyblocks_jax import dtypes
from polyblocks_jax.stablehlo_import import reader

TRANSCENDENTAL = frozenset({f"stablehlo.{n}" for n in (
    "exponential", "exponential_minus_one", "log", "log_plus_one", "logistic", "power", "sqrt", "rsqrt",
    "cbrt", "tanh", "tan", "sine", "cosine", "atan2")} | {f"chlo.{n}" for n in (
        "acos", "acosh", "asin", "asinh", "atan", "atanh", "bessel_i1e", "cosh", "sinh", "digamma", "erf",
        "erf_inv", "erfc", "lgamma", "polygamma", "zeta", "tan")})
ELEMENTWISE = frozenset({f"stablehlo.{n}" for n in (
    "add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "negate", "abs", "sign",
    "floor", "ceil", "round_nearest_afz", "round_nearest_even", "compare", "select", "clamp", "and", "or",
    "xor", "not", "shift_left", "shift_right_arithmetic", "shift_right_logical", "popcnt",
    "count_leading_zeros", "is_finite", "convert", "reduce_precision", "real", "imag", "complex")} | {
        f"chlo.{n}" for n in ("is_inf", "is_neg_inf", "is_pos_inf", "square", "next_after")})
# Computed inside their users when these all are such ops or reductions.
FUSIBLE = TRANSCENDENTAL | ELEMENTWISE | {f"stablehlo.{n}" for n in (
    "broadcast_in_dim", "reshape", "transpose", "slice", "constant", "iota")}
VIEWS = frozenset({"stablehlo.slice", "stablehlo.reshape"})
# Ops that move no data of their own: their regions or callee do, or they only name values.
_NO_TRAFFIC = frozenset({"func.return", "stablehlo.return", "func.call", "stablehlo.while", "stablehlo.if",
                         "stablehlo.case", "stablehlo.optimization_barrier", "stablehlo.tuple",
                         "stablehlo.get_tuple_element", "stablehlo.after_all", "stablehlo.create_token",
                         "stablehlo.constant"})
_REGIONS_ONCE = frozenset({"stablehlo.while", "stablehlo.if", "stablehlo.case"})


@dataclasses.dataclass
class Cost:
    flops: float = 0.0
    transcendentals: float = 0.0
    bytes_accessed: float = 0.0

    def __iadd__(self, other: "Cost") -> "Cost":
        self.flops += other.flops
        self.transcendentals += other.transcendentals
        self.bytes_accessed += other.bytes_accessed
        return self

    def computation(self, times: int) -> "Cost":
        """This cost's flops ``times`` over, without its bytes (a reducer's body, per element)."""
        return Cost(self.flops * times, self.transcendentals * times)

    def as_dict(self) -> dict[str, float]:
        """Named as XLA names them."""
        return {"flops": self.flops, "transcendentals": self.transcendentals, "bytes accessed": self.bytes_accessed}


def cost_analysis(program) -> dict[str, float]:
    """``{"flops", "transcendentals", "bytes accessed"}`` of ``program`` (StableHLO text, VHLO
    bytes or a ``jax.stages.Lowered``), per call of its ``main``."""
    context = reader.new_context()
    module = reader.parse(reader.program_source(program), context)
    with context:
        functions = {jir.StringAttr(op.attributes["sym_name"]).value: op for op in module.body.operations
                     if op.operation.name == "func.func"}
        return _Model(functions).block(functions["main"].regions[0].blocks[0]).as_dict()


class _Node:
    """An op of a block, calls inlined: ``kind`` its name (a composite's own), ``inputs`` and
    ``outputs`` value keys (the number of the inlined call, the value)."""
    __slots__ = ("op", "kind", "inputs", "outputs")

    def __init__(self, op: jir.OpView, kind: str, inputs: list, outputs: list) -> None:
        self.op, self.kind, self.inputs, self.outputs = op, kind, inputs, outputs


class _Model:
    def __init__(self, functions: dict[str, jir.OpView]) -> None:
        self.functions = functions
        self.calls = 0  # inlined calls so far

    def block(self, block: jir.Block) -> Cost:
        """The cost of ``block`` with the functions it calls inlined, as the importer inlines them."""
        nodes: list[_Node] = []
        self._inline(block, {}, 0, nodes, [])
        users: dict[object, list[str]] = {}
        for node in nodes:
            for key in node.inputs:
                users.setdefault(key, []).append(node.kind)
        inside = {key for node in nodes if node.kind in FUSIBLE
                  and all(user in FUSIBLE or user == "stablehlo.reduce"
                          for key in node.outputs for user in users.get(key, ()))
                  for key in node.outputs}
        # A slice or reshape of data in memory is a view: its readers read its elements there.
        views = {node.outputs[0] for node in nodes if node.kind in VIEWS and node.inputs[0] not in inside}
        producers = {key: node for node in nodes for key in node.outputs}
        cost = Cost()
        for node in nodes:
            cost += self.op(node)
            if node.kind not in _NO_TRAFFIC and not (node.outputs and node.outputs[0] in inside | views):
                reads = _reads(node, inside, views, producers)
                cost.bytes_accessed += sum(_nbytes(v) for _, v in reads) + sum(map(_nbytes, node.op.results))
        return cost

    def _inline(self, block: jir.Block, keys: dict, call: int, nodes: list[_Node], stack: list[str]) -> list:
        """Append ``block``'s ops to ``nodes`` (``keys``: its values' keys so far); returns the keys
        its terminator returns when ``block`` is a called function's."""
        def key(value):
            return keys.get(value, (call, value))
        for op in block.operations:
            kind = _kind(op)
            inputs = [key(v) for v in op.operands]
            callee = _callee(op, kind)
            if callee in self.functions and callee not in stack:
                self.calls += 1
                body = self.functions[callee].regions[0].blocks[0]
                returned = self._inline(body, dict(zip(body.arguments, inputs)), self.calls, nodes, [*stack, callee])
                keys.update(zip(op.results, returned))
            elif kind == "func.return" and stack:
                return inputs
            else:
                nodes.append(_Node(op, kind, inputs, [key(r) for r in op.results]))
        return []

    def op(self, node: _Node) -> Cost:
        """The node's flops and transcendentals (and its regions' bytes)."""
        op, kind = node.op, node.kind
        if kind in ELEMENTWISE:
            return Cost(flops=_elements(op.results[0]))
        if kind in TRANSCENDENTAL:
            return Cost(transcendentals=_elements(op.results[0]))
        if kind in ("stablehlo.dot_general", "stablehlo.dot"):
            return Cost(flops=2 * _elements(op.results[0]) * _contracted(op))
        if kind == "stablehlo.convolution":
            dims = stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
            kernel = _shape(op.operands[1])
            per_output = math.prod(kernel) // kernel[dims.kernel_output_feature_dimension]
            return Cost(flops=2 * _elements(op.results[0]) * per_output)
        if kind == "stablehlo.reduce":
            return self.body(op).computation(_elements(op.operands[0]) - _elements(op.results[0]))
        if kind == "stablehlo.reduce_window":
            window = math.prod(reader.i64_list(op.attributes["window_dimensions"]))
            return self.body(op).computation(_elements(op.results[0]) * (window - 1))
        if kind == "stablehlo.scatter":
            updates = op.operands[len(op.results) + 1]
            return self.body(op).computation(_elements(updates))
        if kind in _REGIONS_ONCE:
            cost = Cost()
            for region in op.regions:
                cost += self.block(region.blocks[0])
            return cost
        return Cost()

    def body(self, op: jir.OpView) -> Cost:
        return self.block(op.regions[0].blocks[0])


def _kind(op: jir.OpView) -> str:
    if op.operation.name == "stablehlo.composite":
        return jir.StringAttr(op.attributes["name"]).value
    return op.operation.name


def _callee(op: jir.OpView, kind: str) -> str | None:
    """The function computing ``op`` that is counted in its place: a call's, or the
    decomposition of a composite that is not one elementwise op (erf's is)."""
    if op.operation.name == "func.call":
        return jir.FlatSymbolRefAttr(op.attributes["callee"]).value
    if op.operation.name == "stablehlo.composite" and kind not in FUSIBLE:
        return jir.FlatSymbolRefAttr(op.attributes["decomposition"]).value
    return None


def _reads(node: _Node, inside: set, views: set, producers: dict) -> set:
    """The values ``node``'s loop nest reads from memory: its inputs, through the nodes computed inside it."""
    found, seen, pending = set(), set(), list(node.inputs)
    while pending:
        key = pending.pop()
        if key in seen:
            continue
        seen.add(key)
        if key in inside and key not in views:
            pending.extend(producers[key].inputs)
        else:
            found.add(key)
    return found


def _contracted(op: jir.OpView) -> int:
    lhs = _shape(op.operands[0])
    if op.operation.name == "stablehlo.dot":
        return lhs[-1] if lhs else 1
    dims = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    return math.prod(lhs[d] for d in dims.lhs_contracting_dimensions)


def _shape(value: jir.Value) -> list[int]:
    return list(jir.RankedTensorType(value.type).shape)


def _elements(value: jir.Value) -> int:
    return math.prod(_shape(value)) if isinstance(value.type, jir.RankedTensorType) else 0


def _nbytes(value: jir.Value) -> int:
    if not isinstance(value.type, jir.RankedTensorType):
        return 0  # a token
    dtype = dtypes.dtype(str(jir.RankedTensorType(value.type).element_type))
    return _elements(value) * dtype.itemsize if dtype is not None else 0
