"""The ChatServer as the official `openai` SDK sees it: streaming, log-probs, tools, refused fields, /metrics,
the request log and --warmup, against the real server over the tiny random model on 127.0.0.1."""
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import jax
import numpy as np
import openai
import pytest
from absl import flags
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk
from prometheus_client.parser import text_string_to_metric_families

from rmsweb_jax.sampling.chat_model import Completion
from rmsweb_jax.sampling.chat_reply import TokenText, choice_reply, chunk_objects, completion_object
from rmsweb_jax.sampling.chat_request import parse_chat_request
from rmsweb_jax.sampling.serve import SERVE_DEFAULTS, WARMUP_MODES, ChatServer, ServeSettings, define_flags
from rmsweb_jax.sampling.tool_calls import parse_tool_calls, renders_like_template
from tests.sampling.tiny_chat import tiny_checkpoint_dir
from tests.settings import serve_settings

KEY = "sdk-key"
LIMIT = 16  # one max_tokens bucket: every request here shares its programs
# Prompts of at most 32 tokens (the smallest length bucket, as --warmup's), so the tests share compiled programs.
MESSAGES = [{"role": "user", "content": "Click the button."}]
TOOLS = [{"type": "function", "function": {"name": "click", "description": "Clicks an element by id.", "parameters": {
    "type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}}}]
ROUND_TRIP = MESSAGES + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "click", "arguments": '{"id": 7}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "The button was clicked; a dialog opened."}]


@pytest.fixture(scope="module")
def server(model):
    with ChatServer(model, serve_settings(api_key=KEY, max_tokens_limit=LIMIT, max_batch=2)) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=120)


def create(client, model, **kw):
    """Returns the SDK's reply; greedy unless `kw` says otherwise (the server's default temperature is 1)."""
    return client.chat.completions.create(model=model.name, **{"messages": MESSAGES, "max_tokens": 8,
                                                               "temperature": 0, **kw})


def metrics(server) -> dict:
    """Returns {(sample name, labels): value} of the server's GET /metrics, parsed by prometheus_client."""
    return _scrape(server.url)


def _scrape(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


# --- streaming ----------------------------------------------------------------------------------
def test_stream_adds_up_to_the_plain_reply(client, model):
    plain = create(client, model)
    chunks = list(create(client, model, stream=True, stream_options={"include_usage": True}))
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks) and len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    # One chunk per token of the content, then the finish reason, then the usage alone.
    text_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content is not None][1:]
    assert len(text_chunks) == plain.usage.completion_tokens - (plain.choices[0].finish_reason == "stop")
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == plain.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        plain.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage == plain.usage
    assert all(c.usage is None for c in chunks[:-1])


def test_a_sampled_stream_without_usage(client, model):
    plain = create(client, model, temperature=1.0, seed=3)
    chunks = list(create(client, model, stream=True, temperature=1.0, seed=3))
    assert all(c.usage is None for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == plain.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason


# --- log-probs ----------------------------------------------------------------------------------
def test_logprobs_cover_the_content_and_top_logprobs_rank_the_drawn_token(client, model):
    reply = create(client, model, logprobs=True, top_logprobs=3)
    [choice] = reply.choices
    entries = choice.logprobs.content
    assert len(entries) == reply.usage.completion_tokens - (choice.finish_reason == "stop")
    assert bytes(b for e in entries for b in e.bytes).decode("utf-8", "replace") == choice.message.content
    for e in entries:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        top = [t.logprob for t in e.top_logprobs]
        assert top == sorted(top, reverse=True)
        # Greedy: the drawn token is the most likely one, and the scoring pass agrees with the sampler's log-prob.
        assert e.top_logprobs[0].bytes == e.bytes
        np.testing.assert_allclose(e.top_logprobs[0].logprob, e.logprob, atol=1e-3)
    plain = create(client, model, logprobs=True)
    assert [e.top_logprobs for e in plain.choices[0].logprobs.content] == [[]] * len(entries)
    assert create(client, model).choices[0].logprobs is None


def test_sampled_logprobs_are_the_temperature_scaled_ones(client, model):
    # The first token's distribution is the prompt's alone: at temperature T its log-probs are logits / T
    # renormalized, so the top tokens keep their order and their gaps grow by 1 / T.
    t = 0.7
    greedy = create(client, model, logprobs=True, top_logprobs=5).choices[0].logprobs.content[0].top_logprobs
    hot = create(client, model, logprobs=True, top_logprobs=5, temperature=t, seed=11).choices[0].logprobs.content[0]
    assert [x.bytes for x in hot.top_logprobs] == [x.bytes for x in greedy]
    gaps = np.diff([x.logprob for x in greedy])
    np.testing.assert_allclose(np.diff([x.logprob for x in hot.top_logprobs]), gaps / t, atol=1e-3)
    assert hot.logprob <= hot.top_logprobs[0].logprob + 1e-5


# --- tools --------------------------------------------------------------------------------------
def test_a_tool_result_fed_back_is_rendered_by_the_chat_template(client, model):
    reply = create(client, model, messages=ROUND_TRIP, tools=TOOLS)
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # The model read what its own template writes for tools, the call and the result.
    text = model.tokenizer.apply_chat_template(ROUND_TRIP, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert "<tool_response>\nThe button was clicked" in text and '"name": "click"' in text
    assert reply.usage.prompt_tokens == len(model.tokenizer(text, add_special_tokens=False)["input_ids"])


def test_tool_choice_none_lists_no_tools_but_keeps_the_call_and_its_result(model):
    body = {"model": model.name, "messages": ROUND_TRIP, "tools": TOOLS, "tool_choice": "none"}
    request = parse_chat_request(body, model_name=model.name, max_tokens_limit=LIMIT, default_max_tokens=LIMIT,
                                 max_image_pixels=1 << 20, max_prompt_bytes=1 << 20, max_n=1)
    assert not request.parse_tool_calls
    text = model.tokenizer.apply_chat_template(ROUND_TRIP, tokenize=False, add_generation_prompt=True)
    assert "<tools>" not in text and "<tool_response>" in text
    assert model.encode(request.messages).input_ids.tolist() == model.tokenizer(text, add_special_tokens=False)[
        "input_ids"]


def test_plain_messages_render_as_the_template_does(model):
    assert renders_like_template(model.tokenizer) is None


def test_a_template_without_qwen_tool_turns_is_told_apart(model):
    class OtherTemplate:  # the tokenizer itself, with a template that writes tool results another way
        def apply_chat_template(self, messages, **kw):
            text = model.tokenizer.apply_chat_template(messages, **kw)
            return text.replace("<tool_response>", "<result>") if kw.get("tools") else text
    assert "tool_response" in renders_like_template(OtherTemplate())


HERMES = '<tool_call>\n{"name": "click", "arguments": {"id": 7}}\n</tool_call>'


@pytest.mark.parametrize("text, content, calls", [
    ("no call here", "no call here", []),
    (HERMES, None, [("click", {"id": 7})]),
    ("I will click.\n" + HERMES + "\n" + HERMES.replace("7", "8"), "I will click.\n",
     [("click", {"id": 7}), ("click", {"id": 8})]),
    ('<tool_call>\n{"name": "type", "arguments": {"text": "héllo"}}', None,  # unclosed: the last call
     [("type", {"text": "héllo"})]),
    ("<tool_call>\nnot json\n</tool_call>", "<tool_call>\nnot json\n</tool_call>", []),
    ('<tool_call>\n{"arguments": {}}\n</tool_call>', '<tool_call>\n{"arguments": {}}\n</tool_call>', []),
])
def test_hermes_tool_calls_are_parsed_as_vllm_does(text, content, calls):
    got_content, got = parse_tool_calls(text)
    assert got_content == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == calls
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in got)


def test_a_tool_call_reply_streams_to_what_the_sdk_accumulates(model):
    text = "Let me click.\n" + HERMES
    ids = tuple(model.tokenizer(text, add_special_tokens=False)["input_ids"]) + (model.stop_token_ids[0],)
    completion = Completion(text=text, prompt_tokens=5, completion_tokens=len(ids), finish_reason="stop",
                            token_ids=ids, logprobs=tuple(-0.5 for _ in ids))
    token_text = TokenText(model.tokenizer)
    choice = choice_reply(0, completion, (), parse_tools=True, logprobs=True, top_logprobs=None,
                          token_text=token_text)
    assert choice.finish_reason == "tool_calls" and choice.content == "Let me click.\n"
    assert len(choice.logprobs) == len(ids) - 1  # the tool call's tokens too, not the stop token
    usage = {"prompt_tokens": 5, "completion_tokens": len(ids), "total_tokens": 5 + len(ids)}
    plain = openai.types.chat.ChatCompletion.model_validate(completion_object("chatcmpl-1", 0, "m", [choice], usage))
    state = ChatCompletionStreamState()
    for chunk in chunk_objects("chatcmpl-1", 0, "m", [choice], usage, include_usage=True):
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    streamed = state.get_final_completion()
    assert streamed.choices[0].message.content == plain.choices[0].message.content == "Let me click.\n"
    assert streamed.choices[0].finish_reason == "tool_calls"
    got = [(c.function.name, c.function.arguments) for c in streamed.choices[0].message.tool_calls]
    assert got == [(c.function.name, c.function.arguments) for c in plain.choices[0].message.tool_calls] == [
        ("click", '{"id": 7}')]


# --- refused fields -----------------------------------------------------------------------------
REFUSED = {
    "frequency_penalty": {"frequency_penalty": 0.5},
    "presence_penalty": {"presence_penalty": -1.0},
    "response_format": {"response_format": {"type": "json_object"}},
    "tool_choice": {"tools": TOOLS, "tool_choice": "required"},
    "logit_bias": {"logit_bias": {"17": 5}},
    "repetition_penalty": {"extra_body": {"repetition_penalty": 1.2}},
    "min_p": {"extra_body": {"min_p": 0.1}},
    "metadata": {"metadata": ["not", "an", "object"]},
    "top_logprobs": {"top_logprobs": 2},  # without logprobs
    "max_token": {"extra_body": {"max_token": 5}},  # a misspelt field is not silently ignored
    "tools[0].function.strict": {"tools": [{"type": "function", "function": {**TOOLS[0]["function"], "strict": True}}]},
    "messages[0].name": {"messages": [{**MESSAGES[0], "name": 7}]},
    "messages[1].tool_call_id": {"messages": MESSAGES + [{"role": "tool", "content": "ok"}]},
    "stream_options": {"stream_options": {"include_usage": True}},  # without stream
}


@pytest.mark.parametrize("field", list(REFUSED))
def test_a_field_the_server_does_not_implement_is_a_400_naming_it(client, model, field):
    with pytest.raises(openai.BadRequestError) as refused:
        create(client, model, **REFUSED[field])
    assert refused.value.status_code == 400
    assert refused.value.body["message"].startswith(f"{field}:"), refused.value.body
    assert refused.value.body["param"] == field


def test_the_no_op_values_and_the_sdk_nulls_are_accepted(client, model):
    reply = create(client, model, frequency_penalty=0, presence_penalty=0, response_format={"type": "text"},
                   parallel_tool_calls=True, tools=TOOLS, tool_choice="auto", logit_bias={}, user="u-1",
                   extra_body={"top_k": None, "stop": None, "repetition_penalty": 1, "min_p": 0})
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_a_request_without_temperature_samples_at_1_as_openai_and_vllm_do(client, model):
    default = create(client, model, temperature=openai.NOT_GIVEN, n=3, seed=5, max_tokens=12)
    hot = create(client, model, temperature=1.0, n=3, seed=5, max_tokens=12)
    assert [c.message.content for c in default.choices] == [c.message.content for c in hot.choices]
    assert len({c.message.content for c in default.choices}) > 1  # three samples, not one greedy answer thrice


def test_developer_messages_and_names_are_read_as_the_template_reads_system_ones(client, model):
    system = create(client, model, messages=[{"role": "system", "content": "Be brief."}, *MESSAGES], temperature=0)
    developer = create(client, model, temperature=0, messages=[
        {"role": "developer", "content": "Be brief.", "name": "harness"}, {**MESSAGES[0], "name": "alice"}])
    assert developer.choices[0].message.content == system.choices[0].message.content
    assert developer.usage.prompt_tokens == system.usage.prompt_tokens


def test_bookkeeping_fields_are_accepted_and_named_in_a_header(client, model):
    raw = client.chat.completions.with_raw_response.create(model=model.name, messages=MESSAGES, max_tokens=4,
                                                           metadata={"run": "7"}, store=True)
    assert raw.headers["x-rmsweb-ignored-fields"] == "metadata, store"
    assert raw.parse().choices[0].finish_reason in ("stop", "length")
    plain = client.chat.completions.with_raw_response.create(model=model.name, messages=MESSAGES, max_tokens=4)
    assert "x-rmsweb-ignored-fields" not in plain.headers


def test_parallel_tool_calls_false_returns_the_first_call_only(model):
    text = "Clicking both.\n" + HERMES + "\n" + HERMES.replace("7", "8")
    ids = tuple(model.tokenizer(text, add_special_tokens=False)["input_ids"]) + (model.stop_token_ids[0],)
    completion = Completion(text=text, prompt_tokens=5, completion_tokens=len(ids), finish_reason="stop",
                            token_ids=ids, logprobs=tuple(-0.5 for _ in ids))
    both, first = (choice_reply(0, completion, (), parse_tools=True, logprobs=False, top_logprobs=None,
                                token_text=None, parallel_tool_calls=parallel) for parallel in (True, False))
    assert [json.loads(c["function"]["arguments"]) for c in both.tool_calls] == [{"id": 7}, {"id": 8}]
    assert [json.loads(c["function"]["arguments"]) for c in first.tool_calls] == [{"id": 7}]
    assert first.finish_reason == "tool_calls"


def test_version_and_one_model_are_served(client, server, model):
    with urllib.request.urlopen(f"{server.url}/version", timeout=30) as reply:
        assert json.loads(reply.read())["version"]
    got = client.models.retrieve(model.name)
    assert got.id == model.name and got.owned_by == "rmsweb_jax"
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4o")
    assert "gpt-4o" in missing.value.body["message"] and model.name in missing.value.body["message"]


def _post(server, path, body):
    request = urllib.request.Request(f"{server.url}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_tokenize_counts_what_a_request_reads_and_detokenize_inverts_it(client, server, model):
    status, text = _post(server, "/tokenize", {"prompt": "Click the button."})
    assert status == 200 and text["tokens"] == model.tokenizer.encode("Click the button.", add_special_tokens=False)
    assert text["count"] == len(text["tokens"]) and text["max_model_len"] > 0
    assert _post(server, "/detokenize", {"tokens": text["tokens"]}) == (200, {"prompt": "Click the button."})
    status, chat = _post(server, "/tokenize", {"model": model.name, "messages": MESSAGES})
    assert status == 200 and chat["count"] == create(client, model, max_tokens=1).usage.prompt_tokens
    for path, body, param in (("/tokenize", {"prompt": "a", "messages": MESSAGES}, None),
                              ("/tokenize", {"prompt": 5}, "prompt"),
                              ("/detokenize", {"tokens": [-1]}, "tokens"),
                              ("/tokenize", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role")):
        status, error = _post(server, path, body)
        assert status == 400 and error["error"]["param"] == param, (path, body, error)


# --- operations ---------------------------------------------------------------------------------
def test_metrics_count_requests_tokens_and_latency(server, client, model):
    before = metrics(server)
    reply = create(client, model)
    with pytest.raises(openai.BadRequestError):
        create(client, model, frequency_penalty=1.0)
    after = metrics(server)

    def delta(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0.0)
    assert delta("rmsweb_serve_requests_total", status="200") == 1
    assert delta("rmsweb_serve_requests_total", status="400") == 1
    assert delta("rmsweb_serve_prompt_tokens_total") == reply.usage.prompt_tokens
    assert delta("rmsweb_serve_completion_tokens_total") == reply.usage.completion_tokens
    assert delta("rmsweb_serve_request_latency_seconds_count") == 2
    assert delta("rmsweb_serve_generations_total") == 1
    assert after[("rmsweb_serve_queue_depth", ())] == 0
    assert after[("rmsweb_serve_requests_in_progress", ())] == 0
    compiled = after[("rmsweb_serve_xla_compiles_total", ())]
    jax.jit(lambda x: x * 3 + 1)(np.float32(2))  # a program never compiled before
    assert metrics(server)[("rmsweb_serve_xla_compiles_total", ())] == compiled + 1


def test_each_request_writes_one_log_line(client, model, caplog):
    caplog.set_level(logging.INFO, logger="absl")
    reply = create(client, model, user="agent-3")
    # the handler logs after the reply is written (latency includes the write): the client can read it first
    deadline, lines = time.monotonic() + 10, []
    while not lines and time.monotonic() < deadline:
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("request ")]
        time.sleep(0.01)
    assert lines, "the server logged no 'request ...' line within 10 s of its reply"
    assert lines == [f"request {reply.id} status=200 tokens_in={reply.usage.prompt_tokens} "
                     f"tokens_out={reply.usage.completion_tokens} latency_s={lines[0].split('latency_s=')[1]}"]
    assert lines[0].endswith(" user=agent-3") and float(lines[0].split("latency_s=")[1].split()[0]) > 0


def test_a_refused_requests_log_line_says_why(client, model, caplog):
    caplog.set_level(logging.INFO, logger="absl")
    with pytest.raises(openai.BadRequestError) as refused:
        create(client, model, frequency_penalty=1.0)
    deadline, lines = time.monotonic() + 10, []
    while not lines and time.monotonic() < deadline:
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("request ")
                 and "status=400" in r.getMessage()]
        time.sleep(0.01)
    assert lines and lines[0].endswith(f" refused=unsupported_parameter: {refused.value.body['message']}"), lines


@pytest.mark.slow  # three compilations when run alone (~30 s on 2 cores); one after this module's other tests
def test_warmup_compiles_what_requests_then_use(model):
    with ChatServer(model, serve_settings(max_tokens_limit=LIMIT, max_batch=1)) as warm:
        report = warm.warmup()
        assert report.generations == len(WARMUP_MODES)  # one max_tokens bucket, one batch size, each mode
        assert report.seconds > 0
        compiled = metrics(warm)[("rmsweb_serve_xla_compiles_total", ())]
        sdk = openai.OpenAI(base_url=warm.base_url, api_key="none", max_retries=0)
        for kw in ({}, {"temperature": 0.8, "seed": 1}, {"temperature": 0.8, "top_p": 0.5, "max_tokens": LIMIT}):
            create(sdk, model, **kw)
        assert metrics(warm)[("rmsweb_serve_xla_compiles_total", ())] == compiled  # nothing left to compile


def test_the_warmup_flag_reaches_the_settings():
    values = flags.FlagValues()
    define_flags(values)
    values(["serve", "--checkpoint=random:tiny", "--warmup"])
    assert ServeSettings.from_flags(values).warmup is True
    assert SERVE_DEFAULTS.warmup is False


@pytest.mark.slow  # a fresh process loads the model and compiles the three warm-up programs (~30 s on 2 cores)
def test_the_cli_warms_up_prints_how_long_and_serves_without_compiling(tmp_path):
    log = open(tmp_path / "serve.log", "w+")
    checkpoint = tiny_checkpoint_dir()
    proc = subprocess.Popen([sys.executable, "-m", "rmsweb_jax.sampling.serve", f"--checkpoint=hf:{checkpoint}",
                             "--port=0", f"--workdir={tmp_path}", "--max_tokens_limit=16", "--max_batch=1",
                             "--served_model_name=warm", "--warmup"],
                            stdout=subprocess.PIPE, stderr=log, text=True,
                            # it counts compilations: a hit in the test run's compilation cache is not one
                            env={**os.environ, "JAX_PLATFORMS": "cpu", "JAX_ENABLE_COMPILATION_CACHE": "false"})
    try:
        lines: list[str] = []

        def read_until_serving():
            for line in proc.stdout:
                lines.append(line)
                if line.startswith("serving "):
                    return
        reader = threading.Thread(target=read_until_serving, daemon=True)
        reader.start()
        reader.join(timeout=300)  # loading, then the warm-up; the URL line comes when it serves
        assert lines and lines[-1].startswith("serving "), (lines, log.seek(0) or log.read()[-3000:])
        done = re.fullmatch(r"warm-up done: (\d+) generations, (\d+) XLA compilations, ([\d.]+) s\n", lines[-2])
        assert done and int(done[1]) == len(WARMUP_MODES) and int(done[2]) >= len(WARMUP_MODES), lines
        base_url = re.match(r"serving \S+ at (\S+) ", lines[-1])[1]
        server_url = base_url.removesuffix("/v1")
        before = _scrape(server_url)
        sdk = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
        for kw in ({}, {"temperature": 0.8, "seed": 1}, {"temperature": 0.8, "top_p": 0.5}):
            sdk.chat.completions.create(model="warm", messages=[{"role": "user", "content": "hi"}], max_tokens=4, **kw)
        after = _scrape(server_url)
        assert after[("rmsweb_serve_xla_compiles_total", ())] == before[("rmsweb_serve_xla_compiles_total", ())]
        assert after[("rmsweb_serve_requests_total", (("status", "200"),))] == 3
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
