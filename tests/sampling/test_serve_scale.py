"""Serving at scale: max_tokens buckets (few compiled programs, same text), n > 1 choices from one
prefill, the model id, the dtype, and parameters sharded over an 8-device mesh (a real subprocess)."""
import os
import re
import subprocess
import sys
import threading
import types

import jax
import jax.numpy as jnp
import pytest

from flax import nnx

from rmsweb_jax.errors import UserError
from rmsweb_jax.sampling import sampler as sampler_module
from rmsweb_jax.sampling.chat_model import ChatModel
from rmsweb_jax.sampling.sampler import SamplingParams
from rmsweb_jax.sampling.serve import ChatServer, default_max_tokens_buckets, serving_config
from tests.sampling.server_http import chat_body, png_url, post_chat, request
from tests.sampling.tiny_chat import tiny_checkpoint_dir
from tests.settings import serve_settings


@pytest.fixture(scope="module")
def server(model):
    with ChatServer(model, serve_settings(max_tokens_limit=64)) as server:  # buckets 16, 32, 64
        yield server


def _text_chat(text):
    return [{"role": "system", "content": "You are a web agent."}, {"role": "user", "content": text}]


def test_default_buckets_are_powers_of_two_then_the_limit():
    assert default_max_tokens_buckets(64) == (16, 32, 64)
    assert default_max_tokens_buckets(4096) == (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
    assert default_max_tokens_buckets(100) == (16, 32, 64, 100)
    assert default_max_tokens_buckets(10) == (10,)


def test_buckets_that_cannot_hold_the_limit_are_refused(model):
    with pytest.raises(ValueError, match=r"max_tokens_buckets \[16, 32\] .* max_tokens_limit 64"):
        ChatServer(model, serve_settings(max_tokens_limit=64, max_tokens_buckets=[32, 16]))


def test_max_tokens_in_one_bucket_reuse_one_program_and_give_the_unbucketed_text(server, model):
    messages = chat_body(model)["messages"]
    status, first = post_chat(server, chat_body(model, max_tokens=16, messages=messages))
    assert status == 200, first
    compiled = sampler_module._generate._cache_size()
    replies = {16: first}
    for max_tokens in (3, 11):  # the same 16-token bucket (the old server compiled a program for each)
        status, replies[max_tokens] = post_chat(server, chat_body(model, max_tokens=max_tokens, messages=messages))
        assert status == 200, replies[max_tokens]
    assert sampler_module._generate._cache_size() == compiled, "a max_tokens in the same bucket compiled again"
    # The oracle: the model asked for exactly max_tokens (a program of its own each).
    for max_tokens, reply in replies.items():
        [want] = model.complete([messages], SamplingParams(max_new_tokens=max_tokens))
        [choice] = reply["choices"]
        assert (choice["message"]["content"], choice["finish_reason"]) == (want.text, want.finish_reason), max_tokens
        assert reply["usage"]["completion_tokens"] == want.completion_tokens <= max_tokens
    # The random model runs to the limit: the cut is exercised, not only the stop path.
    assert replies[3]["choices"][0]["finish_reason"] == "length" and replies[3]["usage"]["completion_tokens"] == 3


def test_requests_whose_max_tokens_share_a_bucket_share_a_generation(model):
    conversations = [_text_chat("Click the button."), _text_chat("Scroll down and open the second link.")]
    with ChatServer(model, serve_settings(max_tokens_limit=64, batch_window_s=0.5)) as server:
        replies, barrier = [None, None], threading.Barrier(2)

        def call(i, max_tokens):
            barrier.wait()
            replies[i] = post_chat(server, chat_body(model, messages=conversations[i], max_tokens=max_tokens))

        threads = [threading.Thread(target=call, args=a) for a in ((0, 4), (1, 11))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = server.stats()
    assert [r[0] for r in replies] == [200, 200], replies
    assert stats["complete_calls"] == 1 and stats["max_batch_seen"] == 2, stats
    assert [r[1]["usage"]["completion_tokens"] <= m for r, m in zip(replies, (4, 11))] == [True, True]


def test_n_choices_come_from_one_group_sample(server, model):
    messages = chat_body(model)["messages"]
    before = server.stats()
    status, reply = post_chat(server, chat_body(model, n=3, max_tokens=16, temperature=1.0, seed=5,
                                                messages=messages))
    assert status == 200, reply
    assert server.stats()["complete_calls"] == before["complete_calls"] + 1  # one generation for all n
    choices = reply["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    [want] = model.sample_groups([messages], 3, SamplingParams(max_new_tokens=16, temperature=1.0), seed=5)
    assert [(c["message"]["content"], c["finish_reason"]) for c in choices] == [(w.text, w.finish_reason)
                                                                               for w in want]
    assert len({c["message"]["content"] for c in choices}) > 1  # sampled, not one answer copied
    usage = reply["usage"]
    assert usage["prompt_tokens"] == len(model.encode(messages).input_ids)  # the prompt once
    assert usage["completion_tokens"] == sum(w.completion_tokens for w in want)  # every returned token
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_n_choices_are_cut_at_max_tokens(server, model):
    messages = _text_chat("Type hello into the box.")
    status, reply = post_chat(server, chat_body(model, n=2, max_tokens=5, temperature=1.0, seed=9, messages=messages))
    assert status == 200, reply
    # The unbucketed oracle: 2 samples of exactly 5 tokens, same seed (one program, the same key splits).
    [want] = model.sample_groups([messages], 2, SamplingParams(max_new_tokens=5, temperature=1.0), seed=9)
    assert [c["message"]["content"] for c in reply["choices"]] == [w.text for w in want]
    assert reply["usage"]["completion_tokens"] == sum(w.completion_tokens for w in want) <= 10


def test_model_name_is_listed_carried_and_checked(model):
    with ChatServer(model, serve_settings(model_name="agent-v2")) as server:
        assert request(server, "GET", "/v1/models", key=None)[1]["data"][0]["id"] == "agent-v2"
        status, reply = post_chat(server, chat_body(model, model="agent-v2"), key=None)
        assert status == 200 and reply["model"] == "agent-v2", reply
        status, reply = post_chat(server, chat_body(model), key=None)  # the checkpoint's own name
        assert status == 404 and reply["error"]["code"] == "model_not_found", reply
        assert "'agent-v2'" in reply["error"]["message"]


def test_bad_dtype_and_mesh_flags_are_named():
    with pytest.raises(UserError, match=r"--dtype='float16': expected one of float32, bfloat16"):
        serving_config("random:tiny", None, "float16", "")
    with pytest.raises(UserError, match=r"--mesh_shape='1,3': expected three sizes"):
        serving_config("random:tiny", None, "", "1,3")
    with pytest.raises(UserError, match=rf"--mesh_shape=1,16,1: .*needs 16 devices, {jax.device_count()} available"):
        serving_config("random:tiny", None, "", "1,16,1")


def test_mesh_shape_shards_the_parameters(tmp_path):
    config = serving_config("random:tiny", None, "", "1,4,2")  # the test process has 8 devices (conftest)
    model = ChatModel.load(f"hf:{tiny_checkpoint_dir()}", tmp_path, config=config)
    try:
        params = jax.tree.leaves(nnx.state(model.model, nnx.Param))
        assert {len(p.sharding.device_set) for p in params} == {8}
        # Split, not copied: the embedding is cut over fsdp x tensor (4 x 2) by the sharding rules.
        embedding = model.model.text.embed[...]
        assert embedding.addressable_shards[0].data.size * 8 == embedding.size, embedding.sharding
    finally:
        model.close()


def test_bfloat16_loads_bfloat16_weights_and_serves(tmp_path):
    config = serving_config("random:tiny", None, "bfloat16", "")
    model = ChatModel.load(f"hf:{tiny_checkpoint_dir()}", tmp_path, config=config, max_batch=1)
    try:
        assert {leaf.dtype for leaf in jax.tree.leaves(nnx.state(model.model, nnx.Param))} == {jnp.dtype(jnp.bfloat16)}
        with ChatServer(model, serve_settings(max_tokens_limit=16)) as server:
            status, reply = post_chat(server, chat_body(model, max_tokens=4), key=None)
        assert status == 200 and reply["usage"]["completion_tokens"] >= 1, reply
    finally:
        model.close()


@pytest.mark.slow
def test_a_mesh_of_8_devices_serves_the_one_device_text(model, tmp_path):
    conversations = [_text_chat("Click the submit button."),
                     [{"role": "user", "content": [{"type": "text", "text": "What is on the page?"},
                                                   {"type": "image_url", "image_url": {"url": png_url()}}]}]]
    want = model.complete(conversations, SamplingParams(max_new_tokens=12))  # one device, float32
    log = open(tmp_path / "serve.log", "w+")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    proc = subprocess.Popen([sys.executable, "-m", "rmsweb_jax.sampling.serve",
                             f"--checkpoint=hf:{tiny_checkpoint_dir()}", "--port=0", f"--workdir={tmp_path}",
                             "--model_name=tiny-mesh", "--mesh_shape=1,4,2", "--dtype=float32",
                             "--max_tokens_limit=32"],
                            stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    try:
        lines = []
        reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout=300)
        line = lines[0] if lines else ""
        match = re.match(r"serving tiny-mesh at http://127\.0\.0\.1:(\d+)/v1 .*mesh \(1, 4, 2\)", line)
        assert match, (line, log.seek(0) or log.read()[-3000:])
        remote = types.SimpleNamespace(port=int(match.group(1)))  # what server_http's helpers read
        assert request(remote, "GET", "/v1/models", key=None)[1]["data"][0]["id"] == "tiny-mesh"
        for conversation, expected in zip(conversations, want):
            status, reply = post_chat(remote, {"model": "tiny-mesh", "messages": conversation, "max_tokens": 12,
                                               "temperature": 0},
                                      key=None)
            assert status == 200, reply
            assert reply["choices"][0]["message"]["content"] == expected.text
            assert reply["usage"]["completion_tokens"] == expected.completion_tokens
        status, reply = post_chat(remote, {"model": "other", "messages": conversations[0]}, key=None)
        assert status == 404 and reply["error"]["param"] == "model", reply
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_cli_refuses_a_bad_flag_before_loading(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "rmsweb_jax.sampling.serve", "--checkpoint=hf:/nowhere",
                           "--port=0", f"--workdir={tmp_path}", "--dtype=float16"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == ("serve: error: --dtype='float16': expected one of float32, "
                                                    "bfloat16"), proc.stderr[-2000:]
