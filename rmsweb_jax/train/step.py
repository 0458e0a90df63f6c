"""One jitted train step: microbatch scan of forward + grads, exact token-weighted mean, AdamW update.

The train state is a plain pytree (TrainState of arrays: parameters as a nested dict, optax state,
step, RNG key) placed on the mesh with explicit shardings: parameters by their logical axes
(models/sharding.py rules), optimizer moments like their parameters, scalars replicated. The
step's input and output shardings are those same trees, and the batch's are `batch.batch_shardings`.

Gradient accumulation: the loss function returns (sum, denominator) per microbatch; the scan sums
gradients of the sums and the denominators, and divides once. One step over a batch of B rows and
M microbatches of B/M rows therefore take the same update, whatever the token count of each.
Dtypes and remat come with the model (RuntimeOptions: float32 master parameters, compute dtype
casts inside the layers, remat policy on the layer scan); gradients arrive in the parameter dtype.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from rmsweb_jax.models import sharding
from rmsweb_jax.models.qwen3_vl.model import Qwen3VL, state_shardings
from rmsweb_jax.train import aux_metrics
from rmsweb_jax.train.batch import TrainBatch, batch_shardings
from rmsweb_jax.train.loss import LossFn

METRIC_NAMES = ("loss", "grad_norm", "param_norm", "target_weight")


class TrainState(NamedTuple):
    """Everything a step changes; saved whole in every checkpoint."""
    step: Any        # [] int32: steps taken
    params: Any      # nested dict of parameter arrays (nnx.to_pure_dict layout)
    opt_state: Any   # optax state
    rng: Any         # [2] uint32 raw PRNG key, split once per step (for losses or samplers that need one)


class ModelParts(NamedTuple):
    """A model taken apart: the static graph, its parameters (pure dict), and any non-parameter state."""
    graphdef: Any
    params: Any
    rest: Any

    @classmethod
    def split(cls, model: Qwen3VL) -> "ModelParts":
        """Returns the parts of `model` (parameters as a nested dict of arrays)."""
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        return cls(graphdef, nnx.to_pure_dict(params), rest)

    def merge(self, params=None) -> Qwen3VL:
        """Returns the model with `params` (default: the parts' own)."""
        return nnx.merge(self.graphdef, nnx.State(self.params if params is None else params), self.rest)


def param_shardings(model: Qwen3VL, mesh, rules=sharding.DEFAULT_RULES):
    """Returns the parameters' NamedShardings (nested dict like the params), or None without a mesh."""
    if mesh is None:
        return None
    return nnx.to_pure_dict(state_shardings(nnx.state(model, nnx.Param), mesh, rules))


def train_state_shardings(params, tx: optax.GradientTransformation, mesh, p_shardings) -> TrainState | None:
    """Returns the TrainState of shardings: moments like their parameters, counts and scalars replicated."""
    if mesh is None:
        return None
    replicated = NamedSharding(mesh, PartitionSpec())
    abstract_opt = jax.eval_shape(tx.init, params)
    opt = optax.tree_map_params(tx, lambda _, s: s, abstract_opt, p_shardings,
                                transform_non_params=lambda _: replicated)
    return TrainState(replicated, p_shardings, opt, replicated)


def init_train_state(params, tx: optax.GradientTransformation, seed: int, shardings: TrainState | None) -> TrainState:
    """Returns step 0: the given parameters, fresh optimizer state, the PRNG key of `seed`, all placed."""
    if shardings is None:
        # Committed to one device like the step's outputs: an uncommitted input would make the second
        # step compile the program again (jit keys its cache on committed-ness as well).
        state = TrainState(jnp.zeros((), jnp.int32), params, jax.jit(tx.init)(params), jax.random.PRNGKey(seed))
        return jax.device_put(state, jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    params = jax.device_put(params, shardings.params)
    opt_state = jax.jit(tx.init, out_shardings=shardings.opt_state)(params)
    return TrainState(jax.device_put(jnp.zeros((), jnp.int32), shardings.step), params, opt_state,
                      jax.device_put(jax.random.PRNGKey(seed), shardings.rng))


def abstract_train_state(state: TrainState) -> TrainState:
    """Returns ShapeDtypeStructs (with shardings) of a state: the restore target of a checkpoint."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


def train_step_fn(parts: ModelParts, loss_fn: LossFn, tx: optax.GradientTransformation,
                  p_shardings=None, schedule: optax.Schedule | None = None
                  ) -> Callable[[TrainState, TrainBatch], tuple[TrainState, dict]]:
    """Returns the un-jitted step(state, batch) -> (state, metrics); batch leaves lead with [M, ...].

    metrics: loss (token-weighted mean over the whole batch), grad_norm (before clipping),
    param_norm (after the update), target_weight (the denominator), learning_rate (this step's, when
    `schedule` is given), and "aux": the loss's aux reduced over microbatches (train/aux_metrics.py:
    Mean terms summed as (numerator, denominator), Min / Max as min / max, plain scalars summed).
    """
    graphdef, rest = parts.graphdef, parts.rest

    def microbatch_loss(params, mb):
        model = nnx.merge(graphdef, nnx.State(params), rest)
        loss_parts, aux = loss_fn(model, mb)
        return loss_parts.sum, (loss_parts.denominator, aux)

    grad_fn = jax.value_and_grad(microbatch_loss, has_aux=True)

    def constrain(tree):
        return tree if p_shardings is None else jax.lax.with_sharding_constraint(tree, p_shardings)

    def step(state: TrainState, batch: TrainBatch):
        def body(carry, mb):
            g_acc, s_acc, d_acc = carry
            (s, (d, aux)), g = grad_fn(state.params, mb)
            g_acc = constrain(jax.tree.map(lambda a, b: a + b.astype(a.dtype), g_acc, g))
            return (g_acc, s_acc + s, d_acc + d), aux

        zeros = constrain(jax.tree.map(lambda p: jnp.zeros(p.shape, p.dtype), state.params))
        init = (zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))
        (g_sum, loss_sum, denom), aux = jax.lax.scan(body, init, batch)
        scale = 1.0 / jnp.maximum(denom, 1.0)
        grads = jax.tree.map(lambda g: g * scale.astype(g.dtype), g_sum)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        rng, _ = jax.random.split(state.rng)
        metrics = {"loss": loss_sum * scale, "grad_norm": optax.global_norm(grads),
                   "param_norm": optax.global_norm(params), "target_weight": denom,
                   "aux": aux_metrics.reduce_microbatches(aux)}
        if schedule is not None:
            metrics["learning_rate"] = jnp.asarray(schedule(state.step), jnp.float32)
        return TrainState(state.step + 1, params, opt_state, rng), metrics

    return step


class TrainStep:
    """The jitted step with explicit in/out shardings, one compiled program per batch layout.

    A batch with images and one without have different input trees, hence different programs;
    jit's own cache then keys each by shapes.
    """

    def __init__(self, parts: ModelParts, loss_fn: LossFn, tx: optax.GradientTransformation, *, mesh=None,
                 rules=sharding.DEFAULT_RULES, p_shardings=None, shardings: TrainState | None = None,
                 schedule: optax.Schedule | None = None, donate: bool = True):
        self.mesh, self.rules, self.donate = mesh, rules, donate
        self.state_shardings = shardings
        self._fn = train_step_fn(parts, loss_fn, tx, p_shardings, schedule)
        self._jitted: dict[Any, Callable] = {}

    def __call__(self, state: TrainState, batch: TrainBatch) -> tuple[TrainState, dict]:
        """Returns (new state, metrics as device scalars); `state` is donated (invalid afterwards) by default."""
        return self.jitted(batch)(state, batch)

    def jitted(self, batch: TrainBatch) -> Callable:
        """Returns the jitted step for the layout of `batch` (compiled on first call)."""
        key = jax.tree.structure(batch)
        if key not in self._jitted:
            donate = (0,) if self.donate else ()
            if self.mesh is None:
                self._jitted[key] = jax.jit(self._fn, donate_argnums=donate)
            else:
                replicated = NamedSharding(self.mesh, PartitionSpec())
                self._jitted[key] = jax.jit(
                    self._fn, donate_argnums=donate,
                    in_shardings=(self.state_shardings, batch_shardings(batch, self.mesh, self.rules)),
                    out_shardings=(self.state_shardings, replicated))
        return self._jitted[key]
