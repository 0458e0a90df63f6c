"""The grouped decode step that bench/decode_split.py splits into parts and bench/decode_profile.py profiles op by
op: G = 8 rows of one prompt over random caches of its shape (the prompt's cache copied to the rows; the rows' own
slots; one shared prefix in `decode.prefix_cache`'s layout), steps run as one jitted `fori_loop` over the sampler's
own functions. Imported by those scripts after their arguments are read (it imports jax)."""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from group_sampling import GROUP

from rmsweb_jax.models.qwen3_vl import decode
from rmsweb_jax.models.qwen3_vl.text import KVCache
from rmsweb_jax.sampling.sampler import row_keys, sample_token

STEPS = 24


class GroupedStep:
    """A model's text decoder, the three caches of a grouped step of `prompt_len` prompt tokens and `new` slots
    (`copied`, `own`, `prefix`), the rows and their positions, and the loops over them. `rng`, after the caches are
    drawn from it, is left for the caller's own random inputs."""

    def __init__(self, model, prompt_len: int, new: int, seed: int = 0):
        self.graphdef, self.state = nnx.split(model.text)
        self.cfg = model.text.cfg
        self.rng = np.random.default_rng(seed)
        self.copied = self.cache(GROUP, prompt_len + new, prompt_len)
        self.own = self.cache(GROUP, new, 0)
        self.prefix = self.cache(1, prompt_len, prompt_len, decode.prefix_cache)
        self.rows = jnp.arange(GROUP, dtype=jnp.int32)
        self.positions = jnp.full((3, GROUP, 1), prompt_len, jnp.int32)

    def cache(self, rows: int, slots: int, written: int, layout=decode.step_cache) -> decode.StepCache:
        """Returns a random cache of `rows` rows and `slots` slots, the first `written` of them filled."""
        cfg = self.cfg
        shape = (cfg.num_hidden_layers, rows, slots, cfg.num_key_value_heads, cfg.head_dim)
        k = jnp.asarray(self.rng.standard_normal(shape), jnp.float32)
        segments = jnp.asarray(np.arange(slots)[None].repeat(rows, 0) < written, jnp.int32)
        return layout(KVCache(k, -k, segments, jnp.int32(written)))

    def weights(self, fused_rows: bool | None = None) -> decode.StepWeights:
        """Returns the decode-step weights in a product's layout (None: this host's, decode.fused_rows_default)."""
        return jax.jit(lambda s: decode.step_weights(nnx.merge(self.graphdef, s), fused_rows))(self.state)

    def loop(self, body):
        """Returns STEPS steps of body(text, weights, i, carry) as one jitted fori_loop of (state, weights, carry)."""
        graphdef = self.graphdef
        return jax.jit(lambda state, weights, carry: jax.lax.fori_loop(
            0, STEPS, lambda i, c: body(nnx.merge(graphdef, state), weights, i, c), carry))

    def sample(self, logits, i):
        """The sampler's draw at temperature 1, no top-k / top-p, one key per row: (token [G], log-prob [G])."""
        keys = row_keys(jax.random.fold_in(jax.random.key(0), i), self.rows)
        return sample_token(logits, keys, jnp.float32(1.0), jnp.float32(1.0), jnp.int32(0),
                            mode=(False, False, False))

    def whole_step(self, shared):
        """Returns the body of a whole step (hidden, head, draw), its token the next step's input; carry (cache,
        tokens). `shared`: the prefix under cascade, None over the copied cache."""
        def body(text, weights, i, carry):
            step_cache, tokens = carry
            x, step_cache = decode.step_hidden(text, weights, in_slots(step_cache), tokens, self.positions + i,
                                               shared)
            return step_cache, self.sample(decode.step_logits(weights, x), i)[0]
        return body


def in_slots(step_cache: decode.StepCache) -> decode.StepCache:
    """Returns the cache with its next slot kept inside it: a loop past the end writes the last slot again, at the
    same cost."""
    return step_cache._replace(index=jnp.minimum(step_cache.index, step_cache.segment_ids.shape[1] - 1))


def per_step_ms(run, args: tuple, repeats: int) -> float:
    """Returns the median ms per step of `run(*args)` (a loop of STEPS steps) over `repeats` calls after one
    untimed call (its compile, for a jitted loop)."""
    jax.block_until_ready(run(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(run(*args))
        times.append(time.perf_counter() - start)
    return 1000 * float(np.median(times)) / STEPS
