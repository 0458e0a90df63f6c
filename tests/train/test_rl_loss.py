"""The Salvage-DS loss (train/rl_loss.py) on a tiny model: finite differences, ratio 1 = advantage-weighted NLL,
clipping, the action-only anchor, and a (2,2,2) mesh equal to one device."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rmsweb_jax.models import sharding
from rmsweb_jax.models.qwen3_vl import create, tiny
from rmsweb_jax.train import batch as batch_lib
from rmsweb_jax.train.aux_metrics import Max, Mean, Min
from rmsweb_jax.train.logprobs import token_logprobs_of
from rmsweb_jax.train.loss import LossParts
from rmsweb_jax.train.rl_loss import RLLossSettings, make_salvage_loss, salvage_terms
from rmsweb_jax.train.step import ModelParts, TrainStep, init_train_state, param_shardings, train_state_shardings

CFG = tiny()
ADVANTAGE = np.array([1.0, -1.0, 0.5, 0.0, -0.5, 0.0], np.float32)
ANCHOR = np.array([0, 0, 0, 0, 0, 1], np.float32)


def _settings(**kw):
    base = dict(clip_low=0.2, clip_high=0.28, aggregation="token_mean", kl_beta=0.0, anchor_weight=0.1)
    return RLLossSettings(**{**base, **kw})


def _host(seed=0, rows=6, length=16):
    """Returns policy rows 0-4 (responses from token 8 on, row 2 shorter) and anchor row 5 (action tokens 12-14)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(7, CFG.text.vocab_size, (rows, length)).astype(np.int32)
    seg = np.ones((rows, length), np.int32)
    seg[2, 13:] = 0
    mask = np.zeros((rows, length), np.float32)
    mask[:, 8:] = 1
    mask[2, 13:] = 0
    mask[5] = 0
    mask[5, 12:15] = 1  # the anchor's <tool_call> span; tokens 8-11 stand for its thought (context only)
    return {"input_ids": ids, "segment_ids": seg, "loss_mask": mask, "advantage": ADVANTAGE[:rows],
            "anchor": ANCHOR[:rows]}


@pytest.fixture(scope="module")
def model():
    return create(CFG, seed=0)


def _with_logprobs(model, host, microbatches=1, old_shift=None, ref_shift=None):
    """Returns host with token_old_logprobs (= the model's own, + old_shift) and token_ref_logprobs."""
    tb = batch_lib.prepare_batch(host, CFG, microbatches)
    own = batch_lib.unshift_tokens(batch_lib.rows_of(token_logprobs_of(ModelParts.split(model), tb), microbatches))
    out = dict(host, token_old_logprobs=own + (0 if old_shift is None else old_shift))
    if ref_shift is not None:
        out["token_ref_logprobs"] = own + ref_shift
    return out


_JITTED = {}


def _loss_fn(settings, microbatches):
    """Returns jitted (params, parts, TrainBatch) -> loss of the whole batch: sums over microbatches / denominator."""
    key = (settings, microbatches)
    if key not in _JITTED:
        fn = make_salvage_loss(settings, "chunked")

        def total(params, graph, tb):
            m = ModelParts(graph.graphdef, None, graph.rest).merge(params)
            s = d = 0.0
            for i in range(microbatches):
                p, _ = fn(m, jax.tree.map(lambda x: x[i], tb))
                s, d = s + p.sum, d + p.denominator
            return s / d

        _JITTED[key] = (jax.jit(total, static_argnums=1), jax.jit(jax.value_and_grad(total), static_argnums=1))
    return _JITTED[key]


class _Graph:
    """The static half of ModelParts, hashable for jit's static arguments."""
    def __init__(self, parts):
        self.graphdef, self.rest = parts.graphdef, parts.rest

    def __hash__(self):
        return hash(self.graphdef)

    def __eq__(self, other):
        return self.graphdef == other.graphdef


def _loss_and_grads(model, host, settings, microbatches=1, params=None, grads=True):
    """Returns (loss value, grads pure dict) of the whole batch (value only with grads=False)."""
    parts = ModelParts.split(model)
    tb = jax.tree.map(jnp.asarray, batch_lib.prepare_batch(host, CFG, microbatches))
    value_fn, grad_fn = _loss_fn(settings, microbatches)
    params = parts.params if params is None else params
    if not grads:
        return value_fn(params, _Graph(parts), tb), None
    return grad_fn(params, _Graph(parts), tb)


def _dot(a, b) -> float:
    return float(sum(jnp.vdot(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))))


@pytest.mark.slow
@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean_token_mean"])
def test_gradient_equals_finite_differences(model, aggregation):
    # Ratios inside the trust region (log r = +-0.05) and outside it (+-0.5), away from the clip kinks,
    # a KL term and an anchor row: every branch of the loss contributes.
    rng = np.random.default_rng(1)
    host = _host()
    shift = rng.choice([-0.5, -0.05, 0.05, 0.5], host["input_ids"].shape).astype(np.float32)
    host = _with_logprobs(model, host, old_shift=shift, ref_shift=rng.normal(0, 0.3, shift.shape).astype(np.float32))
    settings = _settings(aggregation=aggregation, kl_beta=0.3, anchor_weight=0.7)
    parts = ModelParts.split(model)
    value, grads = _loss_and_grads(model, host, settings)
    for seed in range(2):
        # A unit direction (random, plus the gradient's own so that the slope is far from 0).
        keys = jax.random.split(jax.random.PRNGKey(seed), len(jax.tree.leaves(parts.params)))
        leaves, tree = jax.tree.flatten(parts.params)
        direction = jax.tree.unflatten(tree, [jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])
        g_norm, d_norm = np.sqrt(_dot(grads, grads)), np.sqrt(_dot(direction, direction))
        direction = jax.tree.map(lambda v, g: v / d_norm + seed * g / g_norm, direction, grads)
        norm = np.sqrt(_dot(direction, direction))
        direction = jax.tree.map(lambda v: v / norm, direction)
        eps = 1e-2
        f = {}
        for sign in (1, -1):
            moved = jax.tree.map(lambda p, v: p + sign * eps * v, parts.params, direction)
            f[sign], _ = _loss_and_grads(model, host, settings, params=moved, grads=False)
        numeric = (float(f[1]) - float(f[-1])) / (2 * eps)
        analytic = _dot(grads, direction)
        assert abs(analytic) > 1e-3, analytic  # a real slope, not two zeros agreeing
        assert abs(numeric - analytic) <= 1e-2 * abs(analytic) + 1e-4, (numeric, analytic, g_norm)


def test_ratio_one_gradient_equals_advantage_weighted_nll(model):
    host = _with_logprobs(model, _host(seed=2))  # old = current: every ratio is 1
    settings = _settings(anchor_weight=0.4)
    value, grads = _loss_and_grads(model, host, settings, microbatches=2)
    parts = ModelParts.split(model)
    tb = batch_lib.prepare_batch(host, CFG, 1)
    w = np.asarray(tb.weights[0])
    token_weight = w * np.where(ANCHOR[:, None] != 0, 0.4, ADVANTAGE[:, None])  # A on policy, lambda on anchor

    def weighted_nll(params):
        m = parts.merge(params)
        hidden, _ = m.hidden_states(jax.tree.map(lambda x: jnp.asarray(x[0]), tb.inputs))
        logp = jax.nn.log_softmax(hidden @ m.text.lm_head_matrix(), axis=-1)
        logp = jnp.take_along_axis(logp, jnp.asarray(tb.targets[0])[..., None], axis=-1)[..., 0]
        return -jnp.sum(token_weight * logp) / w.sum()  # divided by the token count, never by sum(A)

    want = jax.grad(weighted_nll)(parts.params)  # the values differ (the surrogate's is -A r): gradients only
    flat = lambda g: np.concatenate([np.asarray(x).ravel() for x in jax.tree.leaves(g)])  # noqa: E731
    got, expected = flat(grads), flat(want)
    assert np.abs(expected).max() > 1e-3
    np.testing.assert_allclose(got, expected, atol=1e-6 * np.abs(expected).max() * 10, rtol=0)


def _dloss_dlogp(logp, w, extras, settings):
    """Returns d loss / d logp [b, L] through salvage_terms alone (the loss as a function of the log-probs)."""
    def f(lp):
        parts, _ = salvage_terms(lp, w, extras, settings)
        return parts.value()
    return np.asarray(jax.grad(f)(logp))


def test_clipping_zeroes_the_gradient_outside_the_trust_region_on_the_pushed_side():
    # Four policy rows: A = +1, +1, -1, -1 with log-ratios per position covering both sides of both bounds.
    log_ratio = np.array([-0.5, -0.1, 0.1, 0.5], np.float32)  # r = 0.61, 0.90, 1.11, 1.65 vs [0.8, 1.28]
    logp = np.full((4, 4), -2.0, np.float32)
    extras = {"advantage": jnp.array([1.0, 1.0, -1.0, -1.0]), "anchor": jnp.zeros(4),
              "token_old_logprobs": jnp.asarray(logp - log_ratio[None])}
    w = jnp.ones((4, 4))
    settings = _settings()
    g = _dloss_dlogp(jnp.asarray(logp), w, extras, settings)
    ratio = np.exp(log_ratio)
    # A > 0: only r > 1 + clip_high is cut; A < 0: only r < 1 - clip_low. Elsewhere d/dlogp = -A r / N.
    for row, adv in enumerate([1.0, 1.0, -1.0, -1.0]):
        for t, r in enumerate(ratio):
            cut = (adv > 0 and r > 1.28) or (adv < 0 and r < 0.8)
            want = 0.0 if cut else -adv * r / 16
            assert g[row, t] == pytest.approx(want, abs=1e-7), (row, t, g[row, t], want)
    _, aux = salvage_terms(jnp.asarray(logp), w, extras, settings)
    assert float(aux["clip_fraction_high"].numerator) == 2 and float(aux["clip_fraction_low"].numerator) == 2
    assert float(aux["ratio_min"].value) == pytest.approx(ratio[0]) and float(aux["ratio_max"].value) == pytest.approx(
        ratio[-1])


def test_anchor_gradient_only_on_the_action_tokens_of_anchor_rows(model):
    host = _host(seed=3)
    host["advantage"] = np.zeros(6, np.float32)  # policy rows of rejected groups: advantage 0
    host = _with_logprobs(model, host, old_shift=np.float32(0.3))  # ratios away from 1: still no gradient at A = 0
    tb = batch_lib.prepare_batch(host, CFG, 1)
    mb = jax.tree.map(lambda x: jnp.asarray(x[0]), tb)
    logp = jnp.asarray(np.random.default_rng(0).normal(-3, 1, mb.targets.shape).astype(np.float32))
    g = _dloss_dlogp(logp, mb.weights, mb.extras, _settings(anchor_weight=0.5))
    nonzero = np.argwhere(g != 0)
    # Shifted: positions 11, 12, 13 of row 5 predict its action tokens 12, 13, 14.
    assert [tuple(x) for x in nonzero] == [(5, 11), (5, 12), (5, 13)], nonzero
    np.testing.assert_allclose(g[5, 11:14], -0.5 / float(np.asarray(mb.weights).sum()), rtol=1e-6)
    # Through the model: a token changed on a policy row (advantage 0) leaves the parameters' gradient
    # unchanged; a changed action target of the anchor row changes it.
    settings = _settings(anchor_weight=0.5)
    _, base = _loss_and_grads(model, host, settings)
    flat = lambda g: np.concatenate([np.asarray(x).ravel() for x in jax.tree.leaves(g)])  # noqa: E731
    for (row, col), changes in (((0, 12), False), ((3, 9), False), ((5, 13), True)):
        edited = dict(host, input_ids=host["input_ids"].copy())
        edited["input_ids"][row, col] = (edited["input_ids"][row, col] + 11) % CFG.text.vocab_size
        _, grads = _loss_and_grads(model, edited, settings)
        diff = np.abs(flat(grads) - flat(base)).max()
        assert (diff > 1e-4) if changes else (diff == 0.0), (row, col, diff)


def test_settings_are_validated_and_missing_extras_named():
    with pytest.raises(ValueError, match=r"config.salvage.loss.clip_low = -0.1: expected a finite number >= 0"):
        _settings(clip_low=-0.1)
    with pytest.raises(ValueError, match=r"config.salvage.loss.aggregation = 'mean': expected one of"):
        _settings(aggregation="mean")
    with pytest.raises(ValueError, match=r"config.salvage.loss.anchor_weight = nan"):
        _settings(anchor_weight=float("nan"))
    import ml_collections
    with pytest.raises(ValueError, match=r"config.salvage.loss lacks \['kl_beta'\]"):
        RLLossSettings.from_config(ml_collections.ConfigDict(dict(clip_low=0.2, clip_high=0.2,
                                                                  aggregation="token_mean", anchor_weight=0.1)))
    w = jnp.ones((1, 2))
    with pytest.raises(ValueError, match=r"missing \['token_old_logprobs'\]"):
        salvage_terms(jnp.zeros((1, 2)), w, {"advantage": jnp.ones(1), "anchor": jnp.zeros(1)}, _settings())
    extras = {"advantage": jnp.ones(1), "anchor": jnp.zeros(1), "token_old_logprobs": jnp.zeros((1, 2))}
    with pytest.raises(ValueError, match=r"kl_beta = 0.1 needs batch extra 'token_ref_logprobs'"):
        salvage_terms(jnp.zeros((1, 2)), w, extras, _settings(kl_beta=0.1))


@pytest.mark.slow
def test_mesh_2x2x2_equals_one_device(model):
    assert len(jax.devices()) == 8
    host = _host(seed=4, rows=8)
    host["advantage"] = np.array([1.0, -1.0, 0.5, 0.0, -0.5, 0.0, 1.0, -1.0], np.float32)
    host["anchor"] = np.array([0, 0, 0, 0, 0, 1, 0, 1], np.float32)
    host["loss_mask"][7] = 0
    host["loss_mask"][7, 10:14] = 1
    rng = np.random.default_rng(5)
    host = _with_logprobs(model, host, old_shift=rng.choice([-0.4, 0.0, 0.4], host["input_ids"].shape).astype(
        np.float32), ref_shift=np.float32(0.1))
    settings = _settings(kl_beta=0.2, anchor_weight=0.5, aggregation="sequence_mean_token_mean")
    tx = optax.sgd(0.5)

    def run(mesh):
        m = create(CFG, mesh=mesh, seed=0)
        parts = ModelParts.split(m)
        p_sh = param_shardings(m, mesh)
        s_sh = train_state_shardings(parts.params, tx, mesh, p_sh)
        step = TrainStep(parts, make_salvage_loss(settings, "chunked"), tx, mesh=mesh, p_shardings=p_sh,
                         shardings=s_sh, donate=False)
        state = init_train_state(parts.params, tx, 0, s_sh)
        tb = batch_lib.prepare_batch(host, CFG, 2)
        placed = batch_lib.to_global(tb, batch_lib.batch_shardings(tb, mesh))
        state, metrics = step(state, placed)
        flat = np.concatenate([np.asarray(x).ravel() for x in jax.tree.leaves(state.params)])
        return jax.device_get(metrics), flat

    want, want_params = run(None)
    got, got_params = run(sharding.make_mesh((2, 2, 2)))
    assert abs(float(got["loss"]) - float(want["loss"])) <= 1e-5
    assert float(want["aux"]["clip_fraction_high"].numerator) + float(want["aux"]["clip_fraction_low"].numerator) > 0
    for name, term in want["aux"].items():
        np.testing.assert_allclose(np.asarray(jax.tree.leaves(got["aux"][name])),
                                   np.asarray(jax.tree.leaves(term)), atol=1e-5, err_msg=name)
    assert isinstance(got["aux"]["ratio_min"], Min) and isinstance(got["aux"]["ratio_max"], Max)
    assert isinstance(got["aux"]["kl"], Mean)
    np.testing.assert_allclose(got_params, want_params, atol=1e-5, rtol=0)
    assert float(want["grad_norm"]) > 1e-3


def test_loss_parts_denominator_is_the_loss_own():
    # Signed advantages summing to 0 must not be a denominator: token_mean divides by the token count.
    extras = {"advantage": jnp.array([1.0, -1.0]), "anchor": jnp.zeros(2), "token_old_logprobs": jnp.zeros((2, 3))}
    parts = salvage_terms(jnp.full((2, 3), -1.0), jnp.ones((2, 3)), extras, _settings())[0]
    assert isinstance(parts, LossParts) and float(parts.denominator) == 6.0
    parts = salvage_terms(jnp.full((2, 3), -1.0), jnp.ones((2, 3)), extras,
                          _settings(aggregation="sequence_mean_token_mean"))[0]
    assert float(parts.denominator) == 2.0


def test_a_wildly_stale_token_gives_a_finite_loss_and_gradient():
    # log r = +-200 would make exp() inf (and inf x 0 a NaN at advantage 0): the log-ratio is clamped.
    extras = {"advantage": jnp.array([0.0, -1.0]), "anchor": jnp.zeros(2),
              "token_old_logprobs": jnp.array([[-201.0, -1.0], [-201.0, 199.0]])}
    logp = jnp.full((2, 2), -1.0)
    value = salvage_terms(logp, jnp.ones((2, 2)), extras, _settings())[0].value()
    grad = _dloss_dlogp(logp, jnp.ones((2, 2)), extras, _settings())
    assert np.isfinite(float(value)) and np.all(np.isfinite(grad)), (value, grad)
