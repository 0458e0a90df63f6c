"""Where a grouped decode step's time goes, op by op (issue 28): `jax.profiler`'s trace of the whole step of
`bench/decode_split.py` (the model-issue bench config, fp32 CPU, this host's product; G = 8 rows of one prompt, 64
new-token slots; the step's text layers, LM head and draw at temperature 1 in a 24-step `fori_loop`, its token the
next step's input), under cascade group decoding and over the copied prompt cache.

Each XLA op's time is summed over the trace and put in a part of the step by its HLO: `prompt attention` reads an
array with the prompt's slot count in its shape (the shared prefix, or the copied cache); `LM head` writes the
[rows, vocabulary] product; `text layers` are the other products (`dot_general` in the op's name); `draw: random`
is `jax.random`'s bits and noise; the rest is `other` (under cascade it holds the rows' attention over their own
slots and the merge of the two softmaxes, which no shape tells apart from the rest). The parts are thread time
(XLA:CPU runs an op on one of its threads), measured under the profiler: their sum differs a little from the step's
time unprofiled, printed beside it.
decode_split.py times the same parts alone; this one finds what it does not split (what the profile of 2026-12-07
showed: bench/README.md, "The shared prefix's keys stored key-minor").
The JSON line: ours = cascade's step ms (unprofiled), anchor = copy's. `--quick`: a 1,280-token prompt, 1 profiled
call of each path (under a minute).
    python bench/decode_profile.py [--quick] [--prompt N]
"""
from __future__ import annotations

import argparse
import collections
import glob
import re
import tempfile

import common
from group_sampling import GROUP, NEW, cpu_model

PARTS = ("prompt attention", "LM head", "text layers", "draw: random", "other")
_NESTING = ("while", "conditional", "call")  # their events span the ops of their bodies, counted on their own


def hlo_instructions(hlo_text: str) -> dict[str, tuple[str, str, list[str], str]]:
    """Returns {instruction name: (shape, opcode, operand names, op_name metadata)} of a compiled module's text."""
    from rmsweb_jax.plan.hlo import read_module
    found = {}
    for insts in read_module(hlo_text).computations.values():
        for inst in insts:
            op_name = re.search(r'op_name="([^"]*)"', inst.attributes)
            found[inst.name] = (inst.shape, inst.opcode, list(inst.operands), op_name.group(1) if op_name else "")
    return found


def dims(shape: str) -> tuple[int, ...]:
    """Returns the dimensions of an HLO shape such as f32[8,32000] (() for a tuple or a scalar)."""
    match = re.match(r"\w+\[([\d,]*)\]", shape)
    return tuple(int(d) for d in match.group(1).split(",") if d) if match else ()


def part_of(name: str, instructions, prompt_slots: set[int], rows: int, vocab: int) -> str | None:
    """Returns the part of the step an op belongs to (PARTS); None for a name that is no instruction of the module
    and for a loop or call, whose time is its body's ops'."""
    if name not in instructions or instructions[name][1] in _NESTING:
        return None
    shape, _, operands, op_name = instructions[name]
    operand_dims = [dims(instructions[o][0]) for o in operands if o in instructions]
    if any(prompt_slots & set(d) for d in [dims(shape), *operand_dims]):
        return "prompt attention"
    random_bits = shape.startswith("u32") and dims(shape) == (rows, vocab)  # threefry's loop state, copied a round
    if random_bits or any(word in op_name for word in ("random", "_gumbel", "_uniform", "threefry")):
        return "draw: random"
    if "dot_general" in op_name:
        return "LM head" if dims(shape) == (rows, vocab) else "text layers"
    return "other"


def op_times(trace_dir: str) -> collections.Counter:
    """Returns {event name: total ns} over every thread of the trace written to `trace_dir`."""
    import jax
    data = jax.profiler.ProfileData.from_file(glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)[0])
    totals = collections.Counter()
    for plane in data.planes:
        for line in plane.lines:
            for event in line.events:
                totals[event.name] += event.duration_ns
    return totals


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a 1,280-token prompt, one profiled call a path")
    parser.add_argument("--prompt", type=int, default=None, help="prompt tokens (default 2,304; --quick 1,280)")
    args = parser.parse_args()
    prompt_len = args.prompt or (1280 if args.quick else 2304)
    calls, repeats = (1, 3) if args.quick else (3, 7)

    import jax
    from grouped_step import STEPS, GroupedStep, per_step_ms
    from rmsweb_jax.models.qwen3_vl import Qwen3VLConfig, create

    model = create(Qwen3VLConfig.from_hf_dict(common.hf_bench_config().to_dict()))
    cfg = model.text.cfg
    if prompt_len in (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, NEW, cfg.head_dim):
        raise SystemExit(f"--prompt {prompt_len}: equals one of the model's widths, so the prompt's ops could not be "
                         "told apart by their shapes; take another length")
    grouped = GroupedStep(model, prompt_len, NEW)
    weights = grouped.weights()
    paths = {"cascade": (grouped.own, grouped.prefix), "copy": (grouped.copied, None)}

    print(f"cpu: {cpu_model()}; product: {'fused' if weights.fused_rows else 'dot'} (decode.fused_rows_default)")
    print(f"model: the bench config; step: G={GROUP} rows of one {prompt_len}-token prompt, {NEW} new-token slots, "
          f"{STEPS} steps a loop; {calls} profiled call(s) a path, time unprofiled: median of {repeats}")
    found = {}
    for path, (step_cache, prefix) in paths.items():
        args = (grouped.state, weights, (step_cache, grouped.rows))
        run = grouped.loop(grouped.whole_step(prefix)).lower(*args).compile()  # timed, profiled and read: one program
        step_ms = per_step_ms(run, args, repeats)
        with tempfile.TemporaryDirectory() as trace_dir:
            with jax.profiler.trace(trace_dir):
                for _ in range(calls):
                    jax.block_until_ready(run(*args))
            totals = op_times(trace_dir)
        instructions = hlo_instructions(run.as_text())
        slots = {prompt_len, prompt_len + NEW}
        parts = collections.Counter()
        for name, ns in totals.items():
            part = part_of(name, instructions, slots, GROUP, cfg.vocab_size)
            if part is not None:
                parts[part] += ns / 1e6 / (calls * STEPS)
        found[path] = (step_ms, parts)
        traced = sum(parts.values())
        print(f"{path:>8}: {step_ms:6.2f} ms/step unprofiled; ops under the profiler {traced:6.2f} ms/step: "
              + ", ".join(f"{part} {parts[part]:.2f} ({parts[part] / traced:.0%})" for part in PARTS))
    cascade, copy = found["cascade"][0], found["copy"][0]
    attention = {path: parts["prompt attention"] for path, (_, parts) in found.items()}
    print(f"cascade / copy: {copy / cascade:.2f}x a step; the prompt's attention {attention['copy']:.2f} -> "
          f"{attention['cascade']:.2f} ms; the other parts, copy / cascade: "
          + ", ".join(f"{part} {found['copy'][1][part]:.2f} / {found['cascade'][1][part]:.2f}" for part in PARTS[1:]))
    common.emit("decode_profile", cascade, copy, "ms/step", 0.5, anchor_is="copy", prompt_tokens=prompt_len,
                **{f"{path}_{part.replace(': ', '_').replace(' ', '_')}_ms": round(parts[part], 3)
                   for path, (_, parts) in found.items() for part in PARTS})


if __name__ == "__main__":
    main()
