"""stablehlo.rng_bit_generator, bit for bit as XLA CPU expands it.

XLA CPU turns DEFAULT into PHILOX (Philox4x32-10). The state is ``[key, counter...]``:
with u64[2] the 128-bit counter is (low = state[1], high = state[0]) and only its low
word is written back; with u64[3] it is (state[1], state[2]). Output element ``L``
(row-major) takes 32-bit lane ``L % 4`` of the Philox block at counter + ``L // 4``
(64-bit outputs pair lanes 0,1 and 2,3; 8- and 16-bit outputs truncate the 32-bit
stream). Each output element recomputes its block: simple, parallel, 4x redundant.

THREE_FRY (Threefry2x32-20) takes a u64[2] state ``[key, counter]``. A 64-bit output
element ``L`` is the block at counter + ``L`` (its two words joined); narrower outputs split
the shape along its first even dim (else its largest) into two halves: element ``i`` along it
takes word ``i % 2`` of the block at counter + the row-major position of the element with
``i // 2`` in its place. The counter advances by the number of blocks.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, linalg, tensor

from polyblocks_jax.stablehlo_import import reader
from polyblocks_jax.tensor_ir import builders
from polyblocks_jax.stablehlo_import.registry import converts

_M0, _M1 = 0xD2511F53, 0xCD9E8D57    # Philox multipliers
_W0, _W1 = 0x9E3779B9, 0xBB67AE85    # Philox key increments (Weyl sequence)
_ROUNDS = 10


def _i32() -> ir.Type:
    return ir.IntegerType.get_signless(32)


def _i64() -> ir.Type:
    return ir.IntegerType.get_signless(64)


@converts("stablehlo.rng_bit_generator")
def rng_bit_generator(cx, op):
    algorithm = reader.enum_name(op.attr("rng_algorithm"))
    state_spec, (_, out) = op.operand_specs[0], op.result_specs
    if algorithm == "THREE_FRY":
        return _threefry_generator(op)
    if algorithm not in ("DEFAULT", "PHILOX"):
        raise op.unsupported(f"rng_algorithm {algorithm}")
    if state_spec.shape not in ((2,), (3,)) or out.dtype.name not in ("ui8", "ui16", "ui32", "ui64"):
        raise op.unsupported(f"state {state_spec} with output {out}")
    state = op.operands[0]
    words = [tensor.ExtractOp(state, [builders.index_constant(i)]).result for i in range(state_spec.shape[0])]
    key, low, high = words[0], words[1], (words[2] if len(words) == 3 else words[0])
    lanes_per_block = 2 if out.dtype.bits == 64 else 4
    blocks = -(-out.size // lanes_per_block)

    def element(_out):
        linear = _linear_index(out.shape)
        lane = arith.remui(linear, _c64(lanes_per_block))
        x = _philox(_counter(low, high, arith.divui(linear, _c64(lanes_per_block))), key)
        return _pick_lane(x, lane, out.dtype.bits)

    bits = builders.parallel_generic([], builders.empty(out), [], element)
    new_low = arith.addi(low, _c64(blocks))
    carried = arith.select(arith.cmpi(arith.CmpIPredicate.ult, new_low, low), arith.addi(high, _c64(1)), high)
    new_words = [key, new_low] + ([carried] if len(words) == 3 else [])
    return [tensor.FromElementsOp(op.operands[0].type, new_words).result, bits]


_ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)
_PARITY = 0x1BD11BDA


def _threefry_generator(op) -> list[ir.Value]:
    state_spec, (_, out) = op.operand_specs[0], op.result_specs
    if state_spec.shape != (2,) or out.dtype.name not in ("ui8", "ui16", "ui32", "ui64"):
        raise op.unsupported(f"THREE_FRY with state {state_spec} and output {out} (XLA takes a u64[2] state)")
    state = op.operands[0]
    key, counter = (tensor.ExtractOp(state, [builders.index_constant(i)]).result for i in range(2))
    shape = list(out.shape)
    wide = out.dtype.bits == 64
    split = None if wide else _split_dim(shape)  # None for a scalar too: one block, word 0
    half = [-(-n // 2) if d == split else n for d, n in enumerate(shape)]

    def element(_out):
        position = [arith.index_cast(_i64(), linalg.IndexOp(d).result) for d in range(len(shape))]
        word = None
        if split is not None:
            word = arith.remui(position[split], _c64(2))
            position[split] = arith.divui(position[split], _c64(2))
        linear = _c64(0)
        for size, iv in zip(half, position):
            linear = arith.addi(arith.muli(linear, _c64(size)), iv)
        x = _threefry(_split(arith.addi(counter, linear)), key)
        if wide:
            return _join(x[0], x[1])
        chosen = x[0] if word is None else arith.select(arith.cmpi(arith.CmpIPredicate.eq, word, _c64(0)), x[0], x[1])
        return chosen if out.dtype.bits == 32 else arith.trunci(ir.IntegerType.get_signless(out.dtype.bits), chosen)

    bits = builders.parallel_generic([], builders.empty(out), [], element)
    blocks = 1
    for n in half:
        blocks *= n
    new_state = tensor.FromElementsOp(state.type, [key, arith.addi(counter, _c64(blocks))]).result
    return [new_state, bits]


def _split_dim(shape: list[int]) -> int | None:
    """The dim XLA splits into the two words of each block: the first even one, else the
    (first) largest; None for a scalar."""
    if not shape:
        return None
    even = [d for d, n in enumerate(shape) if n % 2 == 0]
    return even[0] if even else max(range(len(shape)), key=lambda d: (shape[d], -d))


def _threefry(x: list[ir.Value], key: ir.Value) -> list[ir.Value]:
    """Threefry2x32 with 20 rounds: five groups of four, the key schedule injected after each."""
    ks = _split(key)
    ks.append(arith.xori(arith.xori(ks[0], ks[1]), _c32(_PARITY)))
    x = [arith.addi(x[0], ks[0]), arith.addi(x[1], ks[1])]
    for group in range(5):
        for rotation in _ROTATIONS[4 * (group % 2):4 * (group % 2) + 4]:
            x0 = arith.addi(x[0], x[1])
            rotated = arith.ori(arith.shli(x[1], _c32(rotation)), arith.shrui(x[1], _c32(32 - rotation)))
            x = [x0, arith.xori(x0, rotated)]
        x = [arith.addi(x[0], ks[(group + 1) % 3]), arith.addi(arith.addi(x[1], ks[(group + 2) % 3]), _c32(group + 1))]
    return x


def _c64(value: int) -> ir.Value:
    return builders.splat(value, _i64())


def _c32(value: int) -> ir.Value:
    return builders.splat(value, _i32())


def _linear_index(shape) -> ir.Value:
    """Row-major position of the current linalg.generic element, as i64."""
    linear = _c64(0)
    for d, size in enumerate(shape):
        iv = arith.index_cast(_i64(), linalg.IndexOp(d).result)
        linear = arith.addi(arith.muli(linear, _c64(size)), iv)
    return linear


def _split(word: ir.Value) -> list[ir.Value]:
    """A u64 as its low and high u32."""
    return [arith.trunci(_i32(), word), arith.trunci(_i32(), arith.shrui(word, _c64(32)))]


def _counter(low: ir.Value, high: ir.Value, offset: ir.Value) -> list[ir.Value]:
    """The 128-bit counter (low, high) + offset as four u32, least significant first."""
    new_low = arith.addi(low, offset)
    carry = arith.cmpi(arith.CmpIPredicate.ult, new_low, low)
    new_high = arith.select(carry, arith.addi(high, _c64(1)), high)
    return _split(new_low) + _split(new_high)


def _philox(x: list[ir.Value], key: ir.Value) -> list[ir.Value]:
    k0, k1 = _split(key)
    for _ in range(_ROUNDS):
        lo0, hi0 = _mul_lo_hi(x[0], _M0)
        lo1, hi1 = _mul_lo_hi(x[2], _M1)
        x = [arith.xori(arith.xori(hi1, x[1]), k0), lo1, arith.xori(arith.xori(hi0, x[3]), k1), lo0]
        k0, k1 = arith.addi(k0, _c32(_W0)), arith.addi(k1, _c32(_W1))
    return x


def _mul_lo_hi(x: ir.Value, multiplier: int) -> tuple[ir.Value, ir.Value]:
    """The 64-bit product's low and high words, by a multiplication in i64: the LLVM
    lowering of arith.mului_extended takes scalars and 1-D vectors only, and a generic
    of rank 2 or more is vectorized to n-D vectors."""
    return _split(arith.muli(arith.extui(_i64(), x), _c64(multiplier)))


def _pick_lane(x: list[ir.Value], lane: ir.Value, bits: int) -> ir.Value:
    """Lane ``lane`` of the block, as an integer of ``bits`` bits."""
    if bits == 64:
        words = [_join(x[0], x[1]), _join(x[2], x[3])]
    else:
        words = [x[0], x[1], x[2], x[3]]
    chosen = words[-1]
    for i in reversed(range(len(words) - 1)):
        chosen = arith.select(arith.cmpi(arith.CmpIPredicate.eq, lane, _c64(i)), words[i], chosen)
    return chosen if bits in (32, 64) else arith.trunci(ir.IntegerType.get_signless(bits), chosen)


def _join(low: ir.Value, high: ir.Value) -> ir.Value:
    return arith.ori(arith.extui(_i64(), low), arith.shli(arith.extui(_i64(), high), _c64(32)))
