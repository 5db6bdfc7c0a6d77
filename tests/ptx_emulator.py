"""A small emulator of the PTX instructions the kernels' inline assembly uses, written from the PTX ISA's
definitions (``prmt.b32`` in its default and sign-replicate modes, ``lop3.b32``, shifts, funnel shifts, logic,
``mov``, ``setp.ne`` and ``selp``): it runs
an ``inline_asm_elementwise`` string on the CPU, so that tests pin a bit-level scheme where no GPU is. The
compiled PTX itself is checked on a GPU by each kernel's GPU tests."""
from __future__ import annotations

MASK = 0xFFFFFFFF


def _prmt(a: int, b: int, selector: int) -> int:
    """``prmt.b32 d, a, b, c`` (default mode): byte i of d is byte c[4i+2:4i] of {b, a}, or with c[4i+3] set
    that byte's sign bit replicated."""
    source = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for i in range(4):
        nibble = (selector >> (4 * i)) & 0xF
        byte = source[nibble & 7]
        if nibble & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def _lop3(a: int, b: int, c: int, table: int) -> int:
    """``lop3.b32 d, a, b, c, immLut``: bit j of d is bit (a_j << 2 | b_j << 1 | c_j) of the table."""
    return sum(((table >> ((((a >> j) & 1) << 2) | (((b >> j) & 1) << 1) | ((c >> j) & 1))) & 1) << j
               for j in range(32))


OPS = {"mov.b32": lambda a: a, "setp.ne.b32": lambda a, b: int(a != b), "selp.b32": lambda a, b, p: a if p else b,
       "shf.r.clamp.b32": lambda low, high, n: ((high << 32 | low) >> min(n, 32)) & MASK,
       "shr.u32": lambda a, n: a >> n, "shr.b32": lambda a, n: a >> n,
       "shl.b32": lambda a, n: (a << n) & MASK, "and.b32": lambda a, b: a & b, "or.b32": lambda a, b: a | b,
       "xor.b32": lambda a, b: a ^ b, "prmt.b32": _prmt, "lop3.b32": _lop3}


def run_asm(asm: str, word: int, outputs: int = 4) -> list[int]:
    """The output registers ``$0..`` of ``asm`` for its one input register ``$<outputs> = word``; instructions
    one per line or separated by semicolons."""
    return run(asm, {f"${outputs}": word}, outputs)


def run(asm: str, inputs: dict[str, int], outputs: int) -> list[int]:
    """The output registers ``$0..$<outputs - 1>`` of ``asm`` for the input registers ``inputs`` (name -> value;
    predicates are registers holding 0 or 1)."""
    registers = dict(inputs)

    def value(operand: str) -> int:
        return int(operand, 0) if operand[0].isdigit() else registers[operand]

    for line in asm.replace(";", "\n").splitlines():
        line = line.strip().strip("{}").strip()
        if not line or line.startswith(".reg"):
            continue
        op, operands = line.split(None, 1)
        dest, *sources = (operand.strip() for operand in operands.split(","))
        registers[dest] = OPS[op](*(value(source) for source in sources))  # KeyError: an op the emulator lacks
    return [registers[f"${i}"] for i in range(outputs)]
