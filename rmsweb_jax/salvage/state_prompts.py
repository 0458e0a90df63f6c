"""The state set as the learner samples it: each state's prompt, tokens and reference encoding (`StatePrompts`).

Encoded on demand and cached per instance, so a state drawn again in a later update is not tokenized
(images included) again. The caches live on the instance (functools.lru_cache wrapped around bound
methods in __init__), not on the class: a class-level lru_cache on a method would hold every instance
it saw (self is part of its key) for as long as the process lives."""
from __future__ import annotations

import functools

from rmsweb_jax.agents.prompt import PromptBuilder
from rmsweb_jax.mining.state_set import StateSet
from rmsweb_jax.processing.chat import encode_chat, encode_for_training
from rmsweb_jax.salvage.batches import PromptTokens

CACHED_STATES = 256  # states whose encodings each cache keeps


class StatePrompts:
    """The state set's prompts, reference encodings and observations, encoded on demand and cached."""

    def __init__(self, states: StateSet, tokenizer, image_config, prompt_config):
        self.states, self.tokenizer, self.image_config = states, tokenizer, image_config
        self.builder = PromptBuilder(prompt_config)
        self.context = functools.lru_cache(maxsize=CACHED_STATES)(self._context)
        self.prompt = functools.lru_cache(maxsize=CACHED_STATES)(self._prompt)
        self.reference = functools.lru_cache(maxsize=CACHED_STATES)(self._reference)

    def __len__(self) -> int:
        return len(self.states)

    def name(self, index: int) -> str:
        """Returns state `index`'s id."""
        return self.states[index].state_id

    def reference_action(self, index: int):
        """Returns state `index`'s reference Action (what the samples are scored against)."""
        return self.states[index].reference_action

    def _context(self, index: int):
        """Returns (messages, observation) of state `index`: the policy's exact prompt, no reflections."""
        example = self.states.example(index)
        return self.builder.messages(example.context()), example.step.observation()

    def _prompt(self, index: int) -> PromptTokens:
        """Returns state `index`'s prompt tokens, as the sampler saw them."""
        enc = encode_chat(self.tokenizer, self.context(index)[0], self.image_config)
        return PromptTokens.from_encoded(enc, self.name(index), self.image_config.patch_dim)

    def _reference(self, index: int):
        """Returns the EncodedChat of state `index`'s prompt + reference turn (the anchor row's source)."""
        try:
            return encode_for_training(self.tokenizer, self.context(index)[0], self.states[index].reference_text,
                                       self.image_config)
        except ValueError as err:
            raise ValueError(f"state {self.name(index)} of {self.states.path}: {err}") from err
