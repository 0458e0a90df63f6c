"""ChatModel and FlaxPolicy on the tiny random Qwen3-VL: batching, images, stop tokens, threads, accounting.

One model per module, and few distinct (batch, length bucket, images) shapes: each new shape is a
jit compile, which is what these tests pay for.
"""
import dataclasses
import json
import threading

import numpy as np
import pytest

from configs.common import base_config
from rmsweb_jax.sampling.chat_model import (ChatModel, Completion, default_stop_token_ids,
                                          image_config_from_checkpoint)
from rmsweb_jax.agents.flax_policy import FlaxPolicy
from rmsweb_jax.agents.policy import PastStep, ReflectionRequest, StepContext
from rmsweb_jax.agents.prompt import PromptBuilder, prompt_config_from
from rmsweb_jax.processing.chat import image_url_part
from rmsweb_jax.processing.image import ImageProcessorConfig
from rmsweb_jax.sampling.sampler import SamplingParams
from rmsweb_jax.web.action_text import PARSE_ERROR_REASONS, format_action, parse_action
from rmsweb_jax.web.actions import Action
from rmsweb_jax.web.elements import BBox, Element
from rmsweb_jax.web.observation import Observation
from tests.agents.screens import labelled_png as _png

SMALL = ImageProcessorConfig(min_pixels=1024, max_pixels=4096)
PROMPT = prompt_config_from(base_config())  # the shipped prompt settings
GREEDY = SamplingParams(max_new_tokens=6)  # one max_new_tokens for every test: it is a static jit argument


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    model = ChatModel.load("random:tiny", tmp_path_factory.mktemp("chat_model"), image_config=SMALL,
                           patch_bucket=64, max_batch=2, length_buckets=(64, 2560))
    yield model
    model.close()


def _observation(label: str) -> Observation:
    return Observation(url="http://127.0.0.1:8000/form", title="Form", screenshot=_png(label), viewport=(200, 100),
                       screenshot_size=(200, 100), elements=(Element(1, "button", "Submit", BBox(10, 10, 80, 30)),),
                       focused_id=None, instruction="Click Submit")


CONVERSATIONS = [
    [{"role": "user", "content": "Click Submit."}],
    [{"role": "user", "content": [image_url_part(_png("Submit")), {"type": "text", "text": "What is this?"}]}],
    [{"role": "system", "content": "You are a web agent."},
     {"role": "user", "content": "hello world, the answer is 42"}],
]


# ---- ChatModel ------------------------------------------------------------------------------------
def test_greedy_batch_equals_each_conversation_alone(chat_model):
    batch = chat_model.complete(CONVERSATIONS, GREEDY)  # max_batch=2: two batches, one with an image
    alone = [chat_model.complete([c], GREEDY)[0] for c in CONVERSATIONS]
    assert len(batch) == 3
    for got, want, conversation in zip(batch, alone, CONVERSATIONS):
        assert isinstance(got, Completion)
        assert got.token_ids == want.token_ids and got.text == want.text and got.finish_reason == want.finish_reason
        np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-4)
        assert got.prompt_tokens == len(chat_model.encode(conversation).input_ids)
        assert got.completion_tokens == len(got.token_ids) == len(got.logprobs) <= GREEDY.max_new_tokens
        assert all(lp <= 0 for lp in got.logprobs)
        ids = got.token_ids[:-1] if got.finish_reason == "stop" else got.token_ids
        assert got.text == chat_model.tokenizer.decode(list(ids), skip_special_tokens=True)
    assert json.loads(json.dumps(batch[0].to_dict()))["token_ids"] == list(batch[0].token_ids)


def test_stop_tokens_end_the_completion(chat_model):
    conversation = CONVERSATIONS[0]
    free = chat_model.complete([conversation], GREEDY)[0]
    stop = free.token_ids[2]
    first = free.token_ids.index(stop)
    stopped = chat_model.complete([conversation], SamplingParams(max_new_tokens=6, stop_token_ids=(stop,)))[0]
    assert stopped.finish_reason == "stop" and stopped.completion_tokens == first + 1
    assert stopped.token_ids == free.token_ids[:first + 1]
    assert stopped.text == chat_model.tokenizer.decode(list(free.token_ids[:first]), skip_special_tokens=True)
    im_end = chat_model.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in chat_model.stop_token_ids


def test_concurrent_calls_from_threads_equal_sequential_ones(chat_model):
    want = [chat_model.complete([c], GREEDY)[0].token_ids for c in (CONVERSATIONS[0], CONVERSATIONS[2])]
    got, errors = [None, None], []

    def call(i, conversation):
        try:
            got[i] = chat_model.complete([conversation], GREEDY)[0].token_ids
        except Exception as err:  # noqa: BLE001 — reported by the assertion below
            errors.append(err)

    threads = [threading.Thread(target=call, args=(i, c)) for i, c in enumerate((CONVERSATIONS[0], CONVERSATIONS[2]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors and got == want


def test_bad_conversations_are_named(chat_model):
    remote = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]
    with pytest.raises(ValueError, match=r"conversation 1: messages\[0\].content\[0\]: .*remote URL"):
        chat_model.complete([CONVERSATIONS[0], remote], GREEDY)
    too_long = [{"role": "user", "content": "click the button " * 2000}]
    with pytest.raises(ValueError, match=r"conversation 0: prompt of \d+ tokens exceeds the largest length bucket"):
        chat_model.complete([too_long], GREEDY)


def test_construction_checks_model_tokenizer_and_image_config(chat_model):
    with pytest.raises(ValueError, match="patch/merge/temporal"):
        ChatModel(chat_model.model, chat_model.tokenizer, image_config=ImageProcessorConfig(patch_size=14))
    with pytest.raises(ValueError, match="max_batch"):
        ChatModel(chat_model.model, chat_model.tokenizer, max_batch=0)
    other = ChatModel(chat_model.model, chat_model.tokenizer, name="other")
    other.close()
    with pytest.raises(RuntimeError, match="closed"):
        other.complete(CONVERSATIONS[:1], GREEDY)


def test_checkpoint_files_set_image_config_and_stop_tokens(chat_model, tmp_path):
    assert image_config_from_checkpoint(tmp_path) == ImageProcessorConfig()
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({
        "patch_size": 16, "merge_size": 2, "temporal_patch_size": 2, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
        "size": {"shortest_edge": 4096, "longest_edge": 65536}}))
    assert image_config_from_checkpoint(tmp_path) == ImageProcessorConfig(min_pixels=4096, max_pixels=65536)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"min_pixels": 9, "max_pixels": 3}))
    with pytest.raises(ValueError, match="preprocessor_config.json: .*min_pixels"):
        image_config_from_checkpoint(tmp_path)
    tokenizer = chat_model.tokenizer
    im_end, eot = (tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>"))
    assert default_stop_token_ids(tokenizer) == (im_end,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [im_end, eot]}))
    assert default_stop_token_ids(tokenizer, tmp_path) == tuple(sorted((im_end, eot)))


# ---- FlaxPolicy -----------------------------------------------------------------------------------
def _contexts() -> list[StepContext]:
    past = (PastStep(_png("before"), "http://127.0.0.1:8000/start", "Open the form.",
                     format_action(Action.click(100, 200))),)
    return [StepContext("a", "Click Submit", _observation("Submit"), key="a/0"),
            StepContext("b", "Click Submit", _observation("Again"), history=past,
                        reflections=("Step 1 clicked the wrong link; click Submit.",), attempt=2, step=1, key="b/1")]


def test_act_returns_one_parsed_output_per_context_with_accounting(chat_model):
    builder = PromptBuilder(dataclasses.replace(PROMPT, observation="both"))
    policy = FlaxPolicy(chat_model, builder, GREEDY, name="tiny")
    contexts = _contexts()
    outputs = policy.act(contexts)
    assert policy.name == "tiny" and len(outputs) == len(contexts)
    messages = [builder.messages(ctx) for ctx in contexts]
    direct = chat_model.complete(messages, GREEDY, seed=0)  # the policy's first call uses seed 0
    for out, completion, ctx, conv in zip(outputs, direct, contexts, messages):
        assert out.text == completion.text and out.logprobs == completion.logprobs
        assert out.prompt_tokens == len(chat_model.encode(conv).input_ids) == completion.prompt_tokens
        assert out.completion_tokens == completion.completion_tokens == len(out.logprobs)
        parsed = parse_action(out.text, ctx.observation.coordinate_space)
        if parsed.ok:  # a random model almost never writes a valid call; both paths are checked
            assert out.action == parsed.action and out.error is None
        else:
            assert out.action is None and out.error.split(":")[0] == parsed.reason in PARSE_ERROR_REASONS
    stats = policy.stats()
    assert stats["calls"] == 1 and stats["steps"] == 2 and stats["reflections"] == 0
    assert stats["prompt_tokens"] == sum(o.prompt_tokens for o in outputs)
    assert stats["completion_tokens"] == sum(o.completion_tokens for o in outputs)
    assert stats["parse_errors"] == sum(o.action is None for o in outputs)
    assert stats["truncated"] == sum(c.finish_reason == "length" for c in direct)
    assert policy.act([]) == [] and policy.stats() == stats


def test_reflect_uses_the_reflection_prompt_and_counts(chat_model):
    builder = PromptBuilder(PROMPT)
    policy = FlaxPolicy(chat_model, builder, GREEDY)
    request = ReflectionRequest(task_id="b", instruction="Click Submit", attempt=1, steps=_contexts()[1].history,
                                verdict="NOT SUCCESS", verdict_reason="Submit was never clicked")
    text = policy.reflect(request)
    completion = chat_model.complete([builder.reflection_messages(request)], GREEDY, seed=0)[0]
    assert text == completion.text.strip()
    stats = policy.stats()
    assert stats["reflections"] == 1 and stats["calls"] == 0
    assert stats["prompt_tokens"] == completion.prompt_tokens
    assert stats["completion_tokens"] == completion.completion_tokens


def test_close_stops_the_policy_and_only_an_owned_model(chat_model):
    shared = FlaxPolicy(chat_model, PromptBuilder(PROMPT), GREEDY)
    shared.close()
    with pytest.raises(RuntimeError, match="closed"):
        shared.act(_contexts())
    assert chat_model.complete(CONVERSATIONS[:1], GREEDY)[0].completion_tokens > 0  # still serving
    own = ChatModel(chat_model.model, chat_model.tokenizer, image_config=SMALL)
    FlaxPolicy(own, PromptBuilder(PROMPT), GREEDY, owns_model=True).close()
    with pytest.raises(RuntimeError, match="closed"):
        own.complete(CONVERSATIONS[:1], GREEDY)
