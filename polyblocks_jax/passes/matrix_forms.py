"""The matrix-unit stage: contractions rewritten into the packed form a matrix unit computes.

Runs on tensors, before tiling. It takes the candidate units from ``Options.matrix_unit``
(auto: all the target's; ``fma``: none; a named unit the target lacks is an error, never an
illegal instruction later), asks the time model (``matrix_units.choose_unit_mapping``) about
every matmul, batch matmul and 2-D NHWC convolution which of them, if any, beats the FMA
path, and rewrites each mapped one into its packed form:

    lhs  -> [convert] -> pad to (M', K')  -> (M', K'/p, p)              rows of k
    rhs  -> [convert] -> pad to (K', N')  -> (N'/t, K'/p, t, p)         VNNI: p k's per column,
                                                                         panels of the tile's t columns
    init -> pad to (M', N')  -> (M', N'/t, t) -> call @polyblocks_matrix_unit_<i> -> (M', N') -> slice (M, N)

(a convolution first gathers its input into (images x pixels, taps x channels) rows, im2col,
and reads its kernel as (taps x channels, F)). A product that reads the rhs as stored
(``UnitOp.rhs_rows``) takes it as (K'/p, p, N'), a copy only where padded, and the
accumulator as (M', N'); the lhs in ``UnitOp.lhs_packed`` where the unit multiplies wider
values (AVX2's VPMADDWD: int16). The called function holds one
``linalg.contract`` marked ``polyblocks.matrix_unit`` with the unit, tile, blocking: the
elementwise fusion that runs after this stage would fold the reshapes around a contraction
in reach into it, making it a generic of other dims without the mark, so the contraction
waits in its function until ``inline_matrix_units`` puts it back, before bufferization.
Any target can run the marked contraction as loops; the host lowers it to AMX tiles or
VDPBF16PS (cpu/). The candidate units are written on the module and the chosen one on every
mapped op, so dumps show them.

With ``precision=mixed_bf16_fp32`` f32 contractions take bf16 operands: packed as bf16 when
mapped, otherwise rounded to bf16 values in f32 (the FMA path then computes the same
products: a bf16 x bf16 product is exact in f32).
"""
from __future__ import annotations

from typing import Sequence

from mlir import ir

from polyblocks_jax.errors import PolyblocksError
from polyblocks_jax.options import Options
from polyblocks_jax.passes import templates
from polyblocks_jax.passes.matrix_units import (Contraction, MatrixMapping, MatrixUnit, choose_unit_mapping,
                                                unit_operand_types)
from polyblocks_jax.contexts import pass_manager
from polyblocks_jax.passes.transform import callee, walk
from polyblocks_jax.passes.zero_start import zero_filled

MATRIX_UNIT_ATTR = "polyblocks.matrix_unit"
NO_UNIT = "fma"
_CONTRACTIONS = ("linalg.matmul", "linalg.batch_matmul", "linalg.conv_2d_nhwc_hwcf")
_CALLEE_PREFIX = "polyblocks_matrix_unit_"


def select_units(choice: str, units: Sequence[MatrixUnit]) -> tuple[MatrixUnit, ...]:
    """The units ``Options.matrix_unit`` lets the cost model choose from among the target's
    usable ``units``: all of them (auto), none (fma), or the one it names."""
    if choice == NO_UNIT:
        return ()
    if choice == "auto":
        return tuple(units)
    unit = next((u for u in units if u.name == choice), None)
    if unit is None:
        usable = ", ".join([u.name for u in units] + [NO_UNIT])
        raise PolyblocksError(f"matrix_unit={choice!r} was forced, but this target has no {choice} unit "
                              f"(usable here: {usable}); use matrix_unit=auto")
    return (unit,)


def map_matrix_units(module: ir.Module, options: Options, units: Sequence[MatrixUnit],
                     fma_macs_per_cycle: int) -> None:
    """Rewrite every contraction the cost model maps onto one of ``units`` into its packed
    form; the others stay on the vector FMA path (``fma_macs_per_cycle`` per core)."""
    module.operation.attributes[MATRIX_UNIT_ATTR] = ir.StringAttr.get(",".join(u.name for u in units) or NO_UNIT)
    mapped = 0
    for op in [op for op in walk(module.operation) if op.name in _CONTRACTIONS]:
        c = contraction_of(op)
        if c is None:
            continue
        mapping = choose_unit_mapping(c, units, fma_macs_per_cycle, options.precision)
        if mapping is not None:
            form, function = _packed_form(op, c, mapping, f"{_CALLEE_PREFIX}{mapped}")
            parsed = ir.Module.parse(f"{form}\n{function}", module.context)  # owns the template until spliced
            template, contraction = parsed.body.operations
            module.body.append(contraction.detach_from_parent())
            result = templates.splice_body(template.operation, op, list(op.operands))[0]
            op.results[0].replace_all_uses_with(result)
            op.erase()
            mapped += 1
        elif unit_operand_types(c, options.precision) != (c.lhs, c.rhs):
            _round_operands(op, "bf16")
        elif options.tiling and c.lhs == c.rhs != c.accumulate and _is_float(c.lhs) and c.accumulate in ("f32", "f64"):
            _widen_operands(op, c)  # for the host's tiling; a GPU's own matcher reads the narrow types
    if mapped:  # drops the replaced accumulators' fills, folds the template's constants
        pass_manager("builtin.module(canonicalize, cse)", module.context).run(module.operation)


def inline_matrix_units(module: ir.Module, options: Options) -> bool:
    """Put each packed contraction back in place of its call (after fusion, before
    bufferization); whether there was one."""
    callees = {ir.StringAttr(f.attributes["sym_name"]).value: f for f in module.body.operations
               if f.operation.name == "func.func"}
    calls = [op for op in walk(module.operation) if op.name == "func.call" and callee(op).startswith(_CALLEE_PREFIX)]
    for call in calls:
        templates.inline_call(call, callees[callee(call)].operation)
    return bool(calls)


def contraction_of(op: ir.Operation) -> Contraction | None:
    """The matmul form of a static matmul, batch matmul or NHWC convolution; None for others
    (dynamic shapes, transposed or unsigned matmul variants)."""
    cast = op.attributes["cast"] if "cast" in op.attributes else None
    if "indexing_maps" in op.attributes or "unsigned" in str(cast):
        return None
    types = [ir.RankedTensorType(v.type) if isinstance(v.type, ir.RankedTensorType) else None for v in op.operands]
    if None in types or any(d < 0 for t in types for d in t.shape):
        return None
    lhs, rhs, acc = (str(t.element_type) for t in types)
    if op.name == "linalg.conv_2d_nhwc_hwcf":
        n, oh, ow, f = types[2].shape
        kh, kw, ci, _ = types[1].shape
        return Contraction(n * oh * ow, f, kh * kw * ci, lhs, rhs, acc)
    *batch, m, k = types[0].shape
    return Contraction(m, types[1].shape[-1], k, lhs, rhs, acc, batch[0] if batch else 1)


def _packed_form(op: ir.Operation, c: Contraction, mapping: MatrixMapping, callee: str) -> tuple[str, str]:
    """The template computing ``op`` on the unit's packed operands, and the function ``callee``
    holding its contraction."""
    types = [str(v.type) for v in op.operands]
    body = _Body()
    lhs, rhs, acc = "%lhs", "%rhs", "%init"
    conv = op.name == "linalg.conv_2d_nhwc_hwcf"
    lead = [c.batch] if op.name == "linalg.batch_matmul" else []
    operand, lhs_operand = mapping.operand, mapping.lhs_operand
    if conv:
        lhs = body.im2col(op, c.lhs, lhs_operand)
        rhs = body.reshape("collapse", rhs, types[1], [[0, 1, 2], [3]], [c.k, c.n], c.rhs)
        acc = body.reshape("collapse", acc, types[2], [[0, 1, 2], [3]], [c.m, c.n], c.accumulate)
    else:
        lhs = body.convert(lhs, lead + [c.m, c.k], c.lhs, lhs_operand)
    rhs = body.convert(rhs, lead + [c.k, c.n], c.rhs, operand)
    pm, pn, pk = mapping.padded
    p, r = mapping.op.pack, len(lead)
    lhs = body.pad(lhs, lead + [c.m, c.k], lead + [pm, pk], lhs_operand)
    lhs = body.reshape("expand", lhs, _tensor(lead + [pm, pk], lhs_operand),
                       [[d] for d in range(r + 1)] + [[r + 1, r + 2]], lead + [pm, pk // p, p], lhs_operand)
    rhs = body.pad(rhs, lead + [c.k, c.n], lead + [pk, pn], operand)
    zero_init = zero_filled(op.operands[2])
    acc = (body.zeros(lead + [pm, pn], c.accumulate) if zero_init
           else body.pad(acc, lead + [c.m, c.n], lead + [pm, pn], c.accumulate))
    if mapping.op.rhs_rows:  # rows of the rhs as stored, p rows of k at a time
        rhs = body.reshape("expand", rhs, _tensor(lead + [pk, pn], operand),
                           [[d] for d in range(r)] + [[r, r + 1], [r + 2]], lead + [pk // p, p, pn], operand)
        out = body.contract_rows(lhs, rhs, acc, lead + [pm, pn, pk // p, p], (lhs_operand, operand),
                                 c.accumulate, _unit_attr(mapping, zero_init), callee)
    else:
        out = body.contract_panels(lhs, rhs, acc, lead, mapping, operand, c.accumulate,
                                   _unit_attr(mapping, zero_init), callee)
    out = body.slice(out, lead + [pm, pn], lead + [c.m, c.n], c.accumulate)
    if conv:
        out = body.reshape("expand", out, _tensor([c.m, c.n], c.accumulate), [[0, 1, 2], [3]],
                           list(ir.RankedTensorType(op.operands[2].type).shape), c.accumulate)
    return templates.function([f"%lhs: {types[0]}", f"%rhs: {types[1]}", f"%init: {types[2]}"],
                              [str(op.results[0].type)], body.lines + [f"return {out} : {op.results[0].type}"]), \
        body.callee


def _unit_attr(mapping: MatrixMapping, zero_init: bool) -> str:
    (t, pack), (mb, nb) = (mapping.op.tile, mapping.op.pack), mapping.blocking
    return (f'{{unit = "{mapping.unit}", tile = array<i64: {t.m}, {t.n}, {t.k}>, pack = {pack} : i64, '
            f"blocking = array<i64: {mb}, {nb}>, zero_init = {str(zero_init).lower()}, "
            f"rhs_rows = {str(mapping.op.rhs_rows).lower()}}}")


def _round_operands(op: ir.Operation, to: str) -> None:
    """Round the f32 inputs of ``op`` to ``to`` values, kept in f32."""
    for index in range(2):
        value = op.operands[index]
        shape = list(ir.RankedTensorType(value.type).shape)
        body = _Body()
        rounded = body.elementwise("%x", shape, "f32", "f32",
                                   [f"%t = arith.truncf %in : f32 to {to}", f"%r = arith.extf %t : {to} to f32"])
        text = templates.function([f"%x: {value.type}"], [str(value.type)],
                                  body.lines + [f"return {rounded} : {value.type}"])
        op.operands[index] = templates.splice(text, op, [value])[0]


def _widen_operands(op: ir.Operation, c: Contraction) -> None:
    """Compute ``op`` from its narrow float operands (f16; bf16 where no unit takes it)
    converted to its accumulator type, exactly: the tiling takes contractions of one type,
    and a mixed one left to the loop lowering runs a scalar loop."""
    types = [str(v.type) for v in op.operands]
    shapes = [list(ir.RankedTensorType(v.type).shape) for v in op.operands[:2]]
    body = _Body()
    lhs = body.convert("%lhs", shapes[0], c.lhs, c.accumulate)
    rhs = body.convert("%rhs", shapes[1], c.rhs, c.accumulate)
    attributes = {name: str(op.attributes[name]) for name in ("strides", "dilations") if name in op.attributes}
    listed = ("{" + ", ".join(f"{k} = {v}" for k, v in attributes.items()) + "} ") if attributes else ""
    wide = [_tensor(s, c.accumulate) for s in shapes]
    body.lines.append(f"%out = {op.name} {listed}ins({lhs}, {rhs} : {wide[0]}, {wide[1]}) "
                      f"outs(%init : {types[2]}) -> {types[2]}")
    text = templates.function([f"%lhs: {types[0]}", f"%rhs: {types[1]}", f"%init: {types[2]}"],
                              [types[2]], body.lines + [f"return %out : {types[2]}"])
    op.results[0].replace_all_uses_with(templates.splice(text, op, list(op.operands))[0])
    op.erase()


def _tensor(shape: Sequence[int], element: str) -> str:
    return templates.shape_type("tensor", shape, element)


def _is_float(element: str) -> bool:
    return element.startswith(("f", "bf"))


def _maps(rank: int, *results: Sequence[str]) -> str:
    dims = ", ".join(f"d{i}" for i in range(rank))
    return "[" + ", ".join(f"affine_map<({dims}) -> ({', '.join(r)})>" for r in results) + "]"


def _iterators(kinds: Sequence[str]) -> str:
    return "[" + ", ".join(f'"{k}"' for k in kinds) + "]"


class _Body:
    """Lines of a template's body; each method emits ops and returns the SSA name of its result."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.callee = ""
        self._count = 0

    def _name(self) -> str:
        self._count += 1
        return f"%v{self._count}"

    def elementwise(self, value: str, shape: Sequence[int], source: str, target: str,
                    ops: Sequence[str], maps: str | None = None, out_shape: Sequence[int] | None = None,
                    result: str = "%r") -> str:
        """A linalg.generic yielding ``result``, computed by ``ops`` from each element ``%in``."""
        out_shape = list(out_shape or shape)
        empty, out = self._name(), self._name()
        ident = [f"d{i}" for i in range(len(out_shape))]
        self.lines += [
            f"{empty} = tensor.empty() : {_tensor(out_shape, target)}",
            f"{out} = linalg.generic {{indexing_maps = {maps or _maps(len(shape), ident, ident)}, "
            f"iterator_types = {_iterators(['parallel'] * len(out_shape))}}} "
            f"ins({value} : {_tensor(shape, source)}) outs({empty} : {_tensor(out_shape, target)}) {{",
            f"^bb0(%in: {source}, %out: {target}):",
            *[f"  {line}" for line in ops],
            f"  linalg.yield {result} : {target}",
            f"}} -> {_tensor(out_shape, target)}"]
        return out

    def convert(self, value: str, shape: Sequence[int], source: str, target: str) -> str:
        if source == target:
            return value
        return self.elementwise(value, shape, source, target, [_cast("%in", source, target, "%r")])

    def im2col(self, conv: ir.Operation, source: str, target: str) -> str:
        """The (N*OH*OW, KH*KW*C) rows of a convolution's input, converted to ``target``."""
        n, _, _, ci = ir.RankedTensorType(conv.operands[0].type).shape
        kh, kw, _, _ = ir.RankedTensorType(conv.operands[1].type).shape
        _, oh, ow, _ = ir.RankedTensorType(conv.operands[2].type).shape
        sh, sw = _ints(conv, "strides")
        dh, dw = _ints(conv, "dilations")
        window = ["d0", f"d1 * {sh} + d3 * {dh}", f"d2 * {sw} + d4 * {dw}", "d5"]
        maps = _maps(6, window, [f"d{i}" for i in range(6)])
        ops, result = ([_cast("%in", source, target, "%r")], "%r") if source != target else ([], "%in")
        shape = list(ir.RankedTensorType(conv.operands[0].type).shape)
        col = self.elementwise("%lhs", shape, source, target, ops, maps, [n, oh, ow, kh, kw, ci], result)
        return self.reshape("collapse", col, _tensor([n, oh, ow, kh, kw, ci], target),
                            [[0, 1, 2], [3, 4, 5]], [n * oh * ow, kh * kw * ci], target)

    def reshape(self, kind: str, value: str, source_type: str, groups: list[list[int]],
                shape: Sequence[int], element: str) -> str:
        out = self._name()
        output_shape = f" output_shape [{', '.join(map(str, shape))}]" if kind == "expand" else ""
        self.lines.append(f"{out} = tensor.{kind}_shape {value} {groups}{output_shape} : "
                          f"{source_type} into {_tensor(shape, element)}")
        return out

    def pad(self, value: str, shape: Sequence[int], padded: Sequence[int], element: str) -> str:
        if list(shape) == list(padded):
            return value
        zero, out = self._name(), self._name()
        high = [p - s for s, p in zip(shape, padded)]
        indices = ", ".join(f"%i{d}: index" for d in range(len(shape)))
        self.lines += [
            f"{zero} = arith.constant {'0.0' if _is_float(element) else '0'} : {element}",
            f"{out} = tensor.pad {value} low[{', '.join(['0'] * len(shape))}] high[{', '.join(map(str, high))}] {{",
            f"^bb0({indices}):",
            f"  tensor.yield {zero} : {element}",
            f"}} : {_tensor(shape, element)} to {_tensor(padded, element)}"]
        return out

    def zeros(self, shape: Sequence[int], element: str) -> str:
        zero, empty, out = self._name(), self._name(), self._name()
        self.lines += [
            f"{zero} = arith.constant {'0.0' if _is_float(element) else '0'} : {element}",
            f"{empty} = tensor.empty() : {_tensor(shape, element)}",
            f"{out} = linalg.fill ins({zero} : {element}) outs({empty} : {_tensor(shape, element)}) "
            f"-> {_tensor(shape, element)}"]
        return out

    def transpose(self, value: str, shape: Sequence[int], perm: Sequence[int], element: str) -> str:
        empty, out = self._name(), self._name()
        permuted = [shape[p] for p in perm]
        self.lines += [
            f"{empty} = tensor.empty() : {_tensor(permuted, element)}",
            f"{out} = linalg.transpose ins({value} : {_tensor(shape, element)}) "
            f"outs({empty} : {_tensor(permuted, element)}) permutation = [{', '.join(map(str, perm))}]"]
        return out

    def contract_panels(self, lhs: str, rhs: str, acc: str, lead: list[int], mapping: MatrixMapping,
                        operand: str, accumulate: str, unit_attr: str, callee: str) -> str:
        """The contraction on the rhs in VNNI panels: (.., K', N') -> (.., N'/t, K'/p, t, p),
        the accumulator as (.., M', N'/t, t)."""
        pm, pn, pk = mapping.padded
        p, tn, r = mapping.op.pack, mapping.op.tile.n, len(lead)
        rhs = self.reshape("expand", rhs, _tensor(lead + [pk, pn], operand),
                           [[d] for d in range(r)] + [[r, r + 1], [r + 2, r + 3]], lead + [pk // p, p, pn // tn, tn],
                           operand)
        rhs = self.transpose(rhs, lead + [pk // p, p, pn // tn, tn], list(range(r)) + [r + 2, r, r + 3, r + 1],
                             operand)
        columns = [[d] for d in range(r + 1)] + [[r + 1, r + 2]]  # (.., m, n) as (.., m, n / tn, tn)
        acc = self.reshape("expand", acc, _tensor(lead + [pm, pn], accumulate), columns, lead + [pm, pn // tn, tn],
                           accumulate)
        out = self.contract(lhs, rhs, acc, lead + [pm, pn // tn, tn, pk // p, p], operand, accumulate,
                            unit_attr, callee)
        return self.reshape("collapse", out, _tensor(lead + [pm, pn // tn, tn], accumulate), columns,
                            lead + [pm, pn], accumulate)

    def contract(self, lhs: str, rhs: str, acc: str, loops: Sequence[int], operand: str, accumulate: str,
                 unit_attr: str, callee: str) -> str:
        """acc[.., m, n1, n2] += lhs[.., m, k, q] * rhs[.., n1, k, n2, q] over the loops (.., m, n1,
        n2, k, q): the rhs in panels of n2 columns, each contiguous over k (a unit's tile of it
        is one block of memory: rows of a whole matrix lie a page apart), operands widened to
        the accumulator (extf / extsi: linalg.contract's signed cast), as a call of the function
        ``callee`` (``self.callee``) that holds the linalg.contract."""
        r = len(loops) - 5
        lead = [f"d{i}" for i in range(r)]
        m, n1, n2, k, q = (f"d{r + i}" for i in range(5))
        maps = _maps(len(loops), lead + [m, k, q], lead + [n1, k, n2, q], lead + [m, n1, n2])
        lead_sizes, (pm, panels, tn, k2, p) = list(loops[:r]), loops[r:]
        types = [_tensor(lead_sizes + [pm, k2, p], operand), _tensor(lead_sizes + [panels, k2, tn, p], operand),
                 _tensor(lead_sizes + [pm, panels, tn], accumulate)]
        return self._call_contraction(maps, types, unit_attr, callee, lhs, rhs, acc)

    def _call_contraction(self, maps: str, types: list[str], unit_attr: str, callee: str,
                          lhs: str, rhs: str, acc: str) -> str:
        """The function ``callee`` (``self.callee``) holding the marked linalg.contract, and its call."""
        self.callee = templates.function(
            [f"%a: {types[0]}", f"%b: {types[1]}", f"%c: {types[2]}"], [types[2]],
            [f"%r = linalg.contract indexing_maps = {maps} {{{MATRIX_UNIT_ATTR} = {unit_attr}}} "
             f"ins(%a, %b : {types[0]}, {types[1]}) outs(%c : {types[2]}) -> {types[2]}",
             f"return %r : {types[2]}"], name=callee, private=True)
        out = self._name()
        self.lines.append(f"{out} = func.call @{callee}({lhs}, {rhs}, {acc}) : ({', '.join(types)}) -> {types[2]}")
        return out

    def contract_rows(self, lhs: str, rhs: str, acc: str, loops: Sequence[int], operands: tuple[str, str],
                      accumulate: str, unit_attr: str, callee: str) -> str:
        """acc[.., m, n] += lhs[.., m, k, q] * rhs[.., k, q, n] over the loops (.., m, n, k, q):
        the rhs as stored, as a call of ``callee`` holding the linalg.contract (see ``contract``);
        ``operands``: the element types of lhs and rhs."""
        r = len(loops) - 4
        lead = [f"d{i}" for i in range(r)]
        m, n, k, q = (f"d{r + i}" for i in range(4))
        maps = _maps(len(loops), lead + [m, k, q], lead + [k, q, n], lead + [m, n])
        lead_sizes, (pm, pn, k2, p) = list(loops[:r]), loops[r:]
        types = [_tensor(lead_sizes + [pm, k2, p], operands[0]), _tensor(lead_sizes + [k2, p, pn], operands[1]),
                 _tensor(lead_sizes + [pm, pn], accumulate)]
        return self._call_contraction(maps, types, unit_attr, callee, lhs, rhs, acc)

    def slice(self, value: str, shape: Sequence[int], sizes: Sequence[int], element: str) -> str:
        if list(shape) == list(sizes):
            return value
        out = self._name()
        self.lines.append(
            f"{out} = tensor.extract_slice {value}[{', '.join(['0'] * len(shape))}] [{', '.join(map(str, sizes))}] "
            f"[{', '.join(['1'] * len(shape))}] : {_tensor(shape, element)} to {_tensor(sizes, element)}")
        return out


def _cast(value: str, source: str, target: str, result: str) -> str:
    """The line ``result = <cast> value`` between two different element types."""
    if _is_float(source) and _is_float(target):
        widen = _width(target) > _width(source)
        return f"{result} = arith.{'extf' if widen else 'truncf'} {value} : {source} to {target}"
    if not _is_float(source) and not _is_float(target) and _width(target) > _width(source):
        return f"{result} = arith.extsi {value} : {source} to {target}"
    raise PolyblocksError(f"no matrix-unit conversion from {source} to {target}")


def _width(element: str) -> int:
    return int("".join(ch for ch in element if ch.isdigit()))


def _ints(op: ir.Operation, name: str) -> list[int]:
    if name not in op.attributes:
        return [1, 1]
    return [int(v) for v in ir.DenseIntElementsAttr(op.attributes[name])]
