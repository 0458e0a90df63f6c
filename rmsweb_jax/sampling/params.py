"""Decoding settings (no JAX here: the server's request parsing and flags read them before JAX loads)."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Decoding settings. temperature 0 means greedy; top_k 0 and top_p 1 disable truncation.
    suppress_token_ids are never drawn (transformers' `suppress_tokens`): the draw, greedy included, and its
    log-prob are over the other tokens; Salvage-DS and mining's replay suppress the vision placeholders
    (never_sampled)."""
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()
    suppress_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if any(int(t) < 0 for t in self.suppress_token_ids):
            raise ValueError(f"suppress_token_ids must be token ids >= 0, got {self.suppress_token_ids}")
