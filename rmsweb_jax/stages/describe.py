"""`--config.stages=help`: each stage with what it does, the stages it reads from, what it writes and the config
fields it reads, from the stage modules' own declarations (CONFIG_READS, INPUT_STAGES, OUTPUTS: the ones
rmsweb_jax/stages/manifest.py decides reruns from), so the description cannot drift from what runs."""
from __future__ import annotations

import textwrap

from rmsweb_jax.stages.pipeline import STAGES, stage_module

WIDTH = 110


def describe_stages(config) -> str:
    """Returns the text that --config.stages=help prints: the stages in pipeline order, then the value in `config`
    of every field they read."""
    lines = ["Stages (run with --config.stages=NAME[,NAME...]; each reruns only when what it reads changed):", ""]
    read_blocks: list[str] = []
    for name in STAGES:
        module = stage_module(name)
        reads = tuple(getattr(module, "CONFIG_READS", ()))
        read_blocks += [block for block in reads if block not in read_blocks]
        inputs = getattr(module, "INPUT_STAGES", {}) or {}
        outputs = getattr(module, "OUTPUTS", {}) or {}
        lines.append(f"{name}: {_summary(module)}")
        lines += _wrapped("inputs", [f"{stage} ({field})" if field else stage for stage, field in inputs.items()]
                          or ["none (it starts from the config alone)"])
        lines += _wrapped("outputs", [f"<workdir>/{path}" + (f" (or config.{field})" if field else "")
                                      for path, field in outputs.items()])
        lines += _wrapped("reads", [f"config.{block}" for block in reads])
        lines.append("")
    lines.append("Config fields the stages read (this config's values; override with --config.FIELD=VALUE):")
    for block in read_blocks:
        lines += [f"  {path} = {value!r}" for path, value in _leaves(_lookup(config, block), f"config.{block}")]
    return "\n".join(lines)


def _summary(module) -> str:
    paragraph = (module.__doc__ or "(no description)").strip().split("\n\n")[0]  # the docstring's first sentence(s)
    return " ".join(paragraph.split())


def _wrapped(label: str, items: list[str]) -> list[str]:
    return textwrap.wrap(", ".join(items), WIDTH, initial_indent=f"    {label}: ",
                         subsequent_indent=" " * (len(label) + 6))


def _lookup(config, dotted: str):
    node = config
    for part in dotted.split("."):
        node = node.get(part) if hasattr(node, "get") else None
    return node


def _leaves(node, prefix: str) -> list[tuple[str, object]]:
    if hasattr(node, "keys"):
        return [leaf for key in node.keys() for leaf in _leaves(node[key], f"{prefix}.{key}")]
    return [(prefix, node)]
