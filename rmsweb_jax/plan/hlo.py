"""An HLO module's text read by its grammar: computations, whole instructions, and what their results deliver.

`read_module` splits a compiled program's text (`compiled.as_text()`) into computations and whole instructions, however
many lines a kernel's attributes take; `instructions`, `while_loop_closure` and `result_bytes` answer the questions the
tests and benchmarks ask of a program (which all-gathers a loop holds, how many bytes each delivers).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re

# A computation is `[ENTRY] %name (params) -> shape {` ... `}`; an instruction ends at a newline inside it, but an
# attribute (a Mosaic kernel's frontend_attributes, a backend_config) may hold newlines in braces or strings, and its
# continuation lines may start with `}`: only brace depth and string literals say where things end.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\n]')
_COMPUTATION_HEAD = re.compile(r"\s*(ENTRY\s+)?%?([\w.\-]+)\s*\(")
_INSTRUCTION_HEAD = re.compile(r"\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_PARENS = re.compile(r"[()]")
_WORD = re.compile(r"\S*")
_OPCODE = re.compile(r"\s*([\w\-]+)\(")


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One HLO instruction, continuation lines included in `text`."""
    name: str
    shape: str              # the result shape as printed, layouts included (a tuple in parentheses)
    opcode: str
    operands: tuple[str, ...]
    attributes: str         # the text after the operand list
    root: bool
    text: str


@dataclasses.dataclass(frozen=True)
class HloModuleText:
    """An HLO module's computations ({name: instructions in printed order}) and its ENTRY computation's name."""
    entry: str | None
    computations: dict[str, tuple[Instruction, ...]]


def _closing(text: str, start: int) -> int:
    """Returns the index of the parenthesis closing the one at `start`."""
    depth = 0
    for m in _PARENS.finditer(text, start):
        depth += 1 if m.group() == "(" else -1
        if depth == 0:
            return m.start()
    raise ValueError(f"unbalanced parentheses in HLO instruction {text[:160]!r}")


def parse_instruction(text: str) -> Instruction:
    """Returns the parts of one HLO instruction's text ('[ROOT] %name = shape opcode(operands), attributes')."""
    head = _INSTRUCTION_HEAD.match(text)
    if head is None:
        raise ValueError(f"not an HLO instruction (expected '%name = shape opcode(...)'): {text[:160]!r}")
    pos = head.end()
    shape_end = _closing(text, pos) + 1 if text.startswith("(", pos) else _WORD.match(text, pos).end()
    op = _OPCODE.match(text, shape_end)
    if op is None:
        raise ValueError(f"HLO instruction %{head.group(2)} has no opcode after its shape: {text[:160]!r}")
    end = _closing(text, op.end() - 1)
    operands = tuple(re.findall(r"%([\w.\-]+)", text[op.end():end]))
    return Instruction(head.group(2), text[pos:shape_end], op.group(1), operands, text[end + 1:],
                       bool(head.group(1)), text)


@functools.lru_cache(maxsize=8)
def read_module(hlo: str) -> HloModuleText:
    """Returns the computations of an HLO module's text (`compiled.as_text()`), each instruction whole."""
    texts: dict[str, list[str]] = {}
    entry = current = None
    depth = statement = start = 0  # brace depth; where the top-level statement and the instruction began
    for m in _TOKEN.finditer(hlo):
        token = m.group()
        if token == "{":
            if depth == 0:
                line_end = hlo.find("\n", m.end())
                head = _COMPUTATION_HEAD.match(hlo, statement, m.start())
                if head and not hlo[m.end():line_end if line_end >= 0 else len(hlo)].strip():
                    current, start = head.group(2), m.end()
                    texts[current] = []
                    entry = current if head.group(1) else entry
            depth += 1
        elif token == "}":
            depth -= 1
            if depth < 0:
                raise ValueError(f"HLO text: a '}}' at offset {m.start()} closes nothing")
            if depth == 0 and current is not None:
                texts[current].append(hlo[start:m.start()])
                current = None
        elif token == "\n":
            if depth == 0:
                statement = m.end()
            elif depth == 1 and current is not None:
                texts[current].append(hlo[start:m.start()])
                start = m.end()
    if depth or current is not None:
        raise ValueError(f"HLO text ends inside computation {current!r} with {depth} braces open: cut short, or a "
                         "string literal left unclosed")
    comps = {name: tuple(parse_instruction(t.strip()) for t in found if t.strip()) for name, found in texts.items()}
    return HloModuleText(entry, comps)


def computations(hlo: str) -> dict[str, list[str]]:
    """Returns {computation name: its instructions' texts} of an HLO module's text (continuation lines included)."""
    return {name: [i.text for i in insts] for name, insts in read_module(hlo).computations.items()}


_CALLS = re.compile(r"(?:calls|body|condition|to_apply|true_computation|false_computation)=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")


def called_computations(inst: Instruction) -> list[str]:
    """Returns the names of the computations `inst` calls (fusions, loops, branches, reducers)."""
    names = _CALLS.findall(inst.attributes)
    for group in _BRANCHES.findall(inst.attributes):
        names.extend(n.strip().lstrip("%") for n in group.split(","))
    return names


def _closure(comps: dict[str, tuple[Instruction, ...]], roots: list[str]) -> dict[str, tuple[Instruction, ...]]:
    seen, todo = {}, list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name not in comps:
            continue
        seen[name] = comps[name]
        for inst in comps[name]:
            todo.extend(called_computations(inst))
    return seen


def loop_bodies(hlo: str, scope: str) -> list[str]:
    """Returns the bodies of the `while` instructions traced under `scope` (jax.named_scope)."""
    return [re.search(r"body=%([\w.\-]+)", i.attributes).group(1)
            for insts in read_module(hlo).computations.values() for i in insts
            if i.opcode == "while" and f"/{scope}/" in i.attributes]


def while_loop_closure(hlo: str, scope: str) -> dict[str, list[str]]:
    """Returns the computations a `while` named under `scope` (jax.named_scope) runs: its body and everything
    the body calls, nested loops and fusions included ({} when no such while is found)."""
    comps = _closure(read_module(hlo).computations, loop_bodies(hlo, scope))
    return {name: [i.text for i in insts] for name, insts in comps.items()}


def instructions(hlo: str, op: str, *, scope: str | None = None) -> list[str]:
    """Returns the HLO instructions of opcode `op` (async '-start' forms included, not their '-done'); with `scope`,
    only those inside the while loop named so (while_loop_closure)."""
    comps = read_module(hlo).computations
    if scope is not None:
        comps = _closure(comps, loop_bodies(hlo, scope))
    return [i.text for insts in comps.values() for i in insts if i.opcode in (op, f"{op}-start")]


_DTYPE_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "bf16": 2, "f16": 2,
                "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b([a-z]\w*)\[([^\]]*)\]")


def arrays(shape: str) -> list[tuple[str, tuple[int, ...]]]:
    """Returns [(dtype, dims)] of the arrays in a printed HLO shape, e.g. '(bf16[4,8]{1,0}, u32[])'."""
    return [(m.group(1), tuple(int(d.lstrip("<=")) for d in m.group(2).split(",") if d))
            for m in _ARRAY.finditer(shape) if m.group(1) in _DTYPE_BYTES]


def tuple_elements(shape: str) -> list[str]:
    """Returns the top-level elements of a printed tuple shape (the shape itself when it is not a tuple)."""
    shape = re.sub(r"/\*.*?\*/", "", shape).strip()
    if not shape.startswith("("):
        return [shape]
    out, depth, start = [], 0, 1
    for i, ch in enumerate(shape[1:-1], 1):
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(shape[start:i].strip())
            start = i + 1
    return out + [shape[start:-1].strip()] if shape[start:-1].strip() else out


# Async starts whose tuple result holds (operands, delivered result, context...): the delivered part is element 1.
_DELIVERED_AT_1 = ("all-gather-start", "collective-permute-start", "async-start")


def delivered_bytes(inst: Instruction) -> float:
    """Returns the bytes an instruction's result delivers: every array of it, but for an async start (all-gather,
    collective-permute, async-start) only the result it starts computing, not the operands its tuple carries."""
    shape = inst.shape
    if inst.opcode in _DELIVERED_AT_1 and shape.startswith("("):
        parts = tuple_elements(shape)
        shape = parts[1] if len(parts) > 1 else shape
    return sum(_DTYPE_BYTES[dtype] * math.prod(dims) for dtype, dims in arrays(shape))


def result_bytes(line: str) -> int:
    """Returns the bytes an HLO instruction's result delivers per device (delivered_bytes), e.g. 'bf16[4096,512]' ->
    4 MiB; for an all-gather started asynchronously, the gathered array, not the shard it starts from."""
    return int(delivered_bytes(parse_instruction(line)))
