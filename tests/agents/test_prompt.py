"""The shared prompt builder: tool description, user turn (reflections, history, elements), target, reflection."""
import dataclasses
import io
import json

import numpy as np
import pytest
from PIL import Image

from configs.common import base_config
from rmsweb_jax.agents.policy import PastStep, ReflectionRequest, StepContext
from rmsweb_jax.agents.prompt import (ACTION_DOCS, ARGUMENT_TYPES, REFLECTION_HEADER, PromptBuilder, PromptConfig,
                                      prompt_config_from, system_prompt, tool_schema)
from rmsweb_jax.processing.chat import decode_image_part, encode_chat, encode_for_training, render_chat
from rmsweb_jax.processing.image import ImageProcessorConfig
from rmsweb_jax.processing.prompt_tokens import load_tokenizer
from rmsweb_jax.processing.tiny_tokenizer import build_tiny_tokenizer
from rmsweb_jax.web.action_text import format_action, parse_action
from rmsweb_jax.web.actions import ACTION_NAMES, RELATIVE, Action, ActionError, CoordinateSpace
from rmsweb_jax.web.elements import BBox, Element
from rmsweb_jax.web.observation import Observation
from tests.agents.screens import labelled_png as _png

PROMPT = prompt_config_from(base_config())  # the shipped prompt settings

SMALL = ImageProcessorConfig(min_pixels=4096, max_pixels=16384)
EXAMPLE_ARGS = {"coordinate": [10, 20], "text": "hello", "press_enter": True, "clear": True, "keys": ["Enter"],
                "direction": "down", "amount": 300, "url": "http://127.0.0.1/a", "time": 1.5}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_tokenizer")
    build_tiny_tokenizer(folder)
    return load_tokenizer(folder)


def _observation(label="now", coordinates="relative", elements=None, **kw) -> Observation:
    if elements is None:
        elements = (Element(1, "button", "Submit", BBox(10, 10, 80, 30)),
                    Element(2, "textbox", "Email", BBox(100, 50, 80, 20), value="a@b.c"),
                    Element(3, "generic", "", BBox(0, 0, 200, 100)))
    return Observation(url="http://127.0.0.1:8000/form", title="Form", screenshot=_png(label), viewport=(200, 100),
                       screenshot_size=(400, 200), elements=tuple(elements), focused_id=None,
                       instruction="Sign up with a@b.c", coordinates=coordinates, **kw)


def _history(n: int) -> tuple[PastStep, ...]:
    return tuple(PastStep(screenshot=_png(f"s{i}"), url=f"http://127.0.0.1:8000/p{i}", thought=f"thought number {i}",
                          action_text=format_action(Action.click(10 * i, 20)))
                 for i in range(1, n + 1))


def _context(history=6, reflections=(), **obs_kw) -> StepContext:
    return StepContext(task_id="t", instruction="Sign up with a@b.c", observation=_observation(**obs_kw),
                       history=_history(history), reflections=tuple(reflections), attempt=len(reflections) + 1,
                       step=history)


def _texts(parts) -> list[str]:
    return [p["text"] for p in parts if p["type"] == "text"]


def _prompt(**overrides) -> PromptConfig:
    return dataclasses.replace(PROMPT, **overrides)


def _images(parts) -> list[dict]:
    return [p for p in parts if p["type"] == "image_url"]


# ---- config and tool description ------------------------------------------------------------------
@pytest.mark.parametrize("kw, match", [
    ({"history_steps": -1}, "history_steps"), ({"history_images": True}, "history_images"),
    ({"history_steps": 1, "history_images": 2}, "must not exceed history_steps"),
    ({"observation": "text"}, "observation"), ({"system": "short"}, "system"), ({"max_element_name": 3}, "max_element_name"),
])
def test_prompt_config_is_validated(kw, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(PROMPT, **kw)


def test_prompt_config_comes_whole_from_the_config_block():
    assert dataclasses.asdict(PROMPT) == base_config().prompt.to_dict()  # every field, nothing else
    config = base_config()
    config.prompt.history_steps, config.prompt.history_images = 2, 0
    assert prompt_config_from(config) == dataclasses.replace(PROMPT, history_steps=2, history_images=0)
    with pytest.raises(ValueError, match=r"config.prompt: unknown key\(s\) \['history'\]"):
        PromptConfig.from_config({**base_config().prompt.to_dict(), "history": 2})
    with pytest.raises(ValueError,
                       match=r"config.prompt: missing key\(s\) \['history_images', 'local_ports', 'max_element_name'"):
        PromptConfig.from_config({"history_steps": 2})
    config.prompt.history_images = 3  # overrides are validated like the defaults
    with pytest.raises(ValueError, match=r"config.prompt.history_images \(3\) must not exceed history_steps \(2\)"):
        prompt_config_from(config)
    del config["prompt"]
    with pytest.raises(ValueError, match="no `prompt` block"):
        prompt_config_from(config)


def test_tool_schema_documents_exactly_what_actions_accept():
    schema = tool_schema(RELATIVE)["function"]
    assert schema["name"] == "computer_use"
    assert schema["parameters"]["properties"]["action"]["enum"] == list(ACTION_NAMES)
    assert set(ACTION_DOCS) == set(ACTION_NAMES)
    for name, (_, required, optional) in ACTION_DOCS.items():
        args = {"action": name, **{a: EXAMPLE_ARGS[a] for a in required + optional}}
        Action.from_arguments(args)  # every documented argument is accepted
        for arg in required:
            with pytest.raises(ActionError) as err:
                Action.from_arguments({k: v for k, v in args.items() if k != arg})
            assert err.value.reason == "missing_argument"
        for arg in set(ARGUMENT_TYPES) - set(required) - set(optional):
            with pytest.raises(ActionError) as err:
                Action.from_arguments({**args, arg: EXAMPLE_ARGS[arg]})
            assert err.value.reason == "invalid_argument", (name, arg)


def test_system_prompt_states_the_coordinate_space():
    relative, pixel = system_prompt(RELATIVE), system_prompt(CoordinateSpace.pixels(400, 200))
    assert "0-1000 grid" in relative and "400x200 screenshot" not in relative
    assert "400x200 screenshot" in pixel and "0-1000" not in pixel
    tools = relative.split("<tools>\n")[1].split("\n</tools>")[0]
    assert json.loads(tools) == tool_schema(RELATIVE)
    # The pixel observation's system prompt follows the observation.
    messages = PromptBuilder(PROMPT).messages(_context(coordinates="pixel"))
    assert messages[0]["content"] == pixel


# ---- the user turn ------------------------------------------------------------------------------
@pytest.mark.parametrize("n, m", [(4, 1), (2, 2), (0, 0), (10, 3)])
def test_history_shows_the_last_n_steps_and_m_screenshots(n, m):
    ctx = _context(history=6)
    parts = PromptBuilder(_prompt(history_steps=n, history_images=m)).user_content(ctx)
    text = "".join(_texts(parts))
    shown = list(range(max(1, 7 - n), 7)) if n else []
    for i in range(1, 7):
        assert (f"thought number {i}" in text) == (i in shown)
    images = _images(parts)
    assert len(images) == min(m, 6) + 1
    # The screenshots are the last m steps' and then the current one, in order.
    expected = [s.screenshot for s in ctx.history[6 - min(m, 6):]] + [ctx.observation.screenshot]
    decoded = [np.asarray(decode_image_part(p)) for p in images]
    for got, want in zip(decoded, expected):
        np.testing.assert_array_equal(got, np.asarray(Image.open(io.BytesIO(want))))
    assert ("omitted" in text) == (0 < n < 6)
    if shown:
        assert json.dumps(Action.click(10 * shown[-1], 20).to_arguments()) in text  # tool call shown as JSON
        assert "<tool_call>" not in text


def test_reflections_appear_only_when_given_and_change_only_their_block():
    builder = PromptBuilder(PROMPT)
    without = builder.messages(_context())
    with_ = builder.messages(_context(reflections=("Step 2 clicked Cancel; click Submit.", "Type the email first.")))
    assert REFLECTION_HEADER not in json.dumps(without)
    reflection_parts = [p for p in with_[1]["content"] if p["type"] == "text" and REFLECTION_HEADER in p["text"]]
    assert len(reflection_parts) == 1
    block = reflection_parts[0]["text"]
    assert "Reflection 1: Step 2 clicked Cancel; click Submit." in block
    assert "Reflection 2: Type the email first." in block
    assert with_[0] == without[0]
    assert [p for p in with_[1]["content"] if p is not reflection_parts[0]] == without[1]["content"]


def test_element_list_toggles_and_is_capped():
    ctx = _context(history=0)
    assert "Page elements" not in "".join(_texts(PromptBuilder(PROMPT).user_content(ctx)))
    text = "".join(_texts(PromptBuilder(_prompt(observation="both")).user_content(ctx)))
    # Centres in the 0-1000 space of the 200x100 viewport; the unnamed generic element is left out.
    assert '[1] button "Submit" at [250, 250]' in text
    assert '[2] textbox "Email" value="a@b.c" at [700, 600]' in text
    assert "[3]" not in text
    many = [Element(i, "link", f"Link {i}", BBox(1, 1, 10, 10)) for i in range(10)]
    builder = PromptBuilder(_prompt(observation="both", max_elements=4))
    capped = builder.element_list(_observation(elements=many))
    assert capped.count("link") == 4 and "(6 more elements not listed)" in capped
    pixel = PromptBuilder(_prompt(observation="both")).element_list(_observation(coordinates="pixel"))
    assert '"Submit" at [100, 50]' in pixel  # 400x200 screenshot pixels, twice the CSS viewport


def test_observation_events_are_reported():
    ctx = _context(history=0, last_error="element not found", dialogs=("Are you sure?",))
    text = "".join(_texts(PromptBuilder(PROMPT).user_content(ctx)))
    assert "The last action failed: element not found" in text and "Are you sure?" in text


def test_rendered_chat_contains_every_piece(tokenizer):
    ctx = _context(history=3, reflections=("Click Submit, not Cancel.",))
    messages = PromptBuilder(_prompt(history_steps=2, history_images=1, observation="both")).messages(ctx)
    text, images = render_chat(tokenizer, messages)
    assert text.startswith("<|im_start|>system\nYou are a web agent.") and text.endswith("<|im_start|>assistant\n")
    for piece in ("# Tools", '"name": "computer_use"', "Task: Sign up with a@b.c",
                  "Reflection 1: Click Submit, not Cancel.",
                  "Previous steps (steps 1-1 omitted):", "thought number 2", "thought number 3",
                  "Current page: http://127.0.0.1/form (Form)", '[1] button "Submit"'):
        assert piece in text, piece
    assert "thought number 1" not in text
    assert text.count("<|vision_start|><|image_pad|><|vision_end|>") == len(images) == 2
    encoded = encode_chat(tokenizer, messages, SMALL)
    assert encoded.num_images == 2 and int(encoded.token_types.sum()) > 0


# ---- assistant target -----------------------------------------------------------------------------
@pytest.mark.parametrize("action", [Action.click(412, 530), Action.type_text("a@b.c", press_enter=True),
                                    Action.answer_with("done"), Action("scroll", direction="down", amount=300)])
@pytest.mark.parametrize("thought", ["The Submit button is at the bottom.", ""])
def test_target_is_what_parse_action_reads_back(action, thought):
    target = PromptBuilder.target(thought, format_action(action))
    assert target == format_action(action, thought)
    parsed = parse_action(target)
    assert parsed.ok and parsed.action == action and parsed.thought == thought


def test_target_refuses_malformed_parts():
    call = format_action(Action.click(1, 2))
    with pytest.raises(ValueError, match="exactly one"):
        PromptBuilder.target("x", "left_click(1, 2)")
    with pytest.raises(ValueError, match="exactly one"):
        PromptBuilder.target("x", call + call)
    with pytest.raises(ValueError, match="tool-call tag"):
        PromptBuilder.target("I will <tool_call>", call)


def test_training_example_from_the_builder(tokenizer):
    builder = PromptBuilder(PROMPT)
    ctx = _context(history=2)
    target = builder.target("Click Submit.", format_action(Action.click(250, 250)))
    train = encode_for_training(tokenizer, builder.messages(ctx), target, SMALL, mask="action_only")
    learned = tokenizer.decode(train.input_ids[train.loss_mask == 1])
    assert learned.startswith("<tool_call>") and learned.endswith("</tool_call><|im_end|>")
    assert parse_action(learned.replace("<|im_end|>", "")).action == Action.click(250, 250)


# ---- reflection prompt ----------------------------------------------------------------------------
@pytest.mark.parametrize("reflection_images", [0, 1, 3])
def test_reflection_prompt_holds_task_steps_and_verdict(tokenizer, reflection_images):
    steps = _history(2)
    req = ReflectionRequest(task_id="t", instruction="Sign up with a@b.c", attempt=2, steps=steps,
                            verdict="NOT SUCCESS", verdict_reason="the form was never submitted",
                            earlier_reflections=("Use the Email field.",))
    messages = PromptBuilder(_prompt(reflection_images=reflection_images)).reflection_messages(req)
    assert messages[0]["role"] == "system" and "what the agent should do instead" in messages[0]["content"]
    text = "".join(_texts(messages[1]["content"]))
    for piece in ("Task: Sign up with a@b.c", "Attempt: 2", "Reflection 1: Use the Email field.", "thought number 1",
                  "thought number 2", "url: http://127.0.0.1/p2", "Judge's verdict: NOT SUCCESS",
                  "Reason: the form was never submitted", "which step went wrong"):
        assert piece in text, piece
    assert len(_images(messages[1]["content"])) == min(reflection_images, 2)
    rendered, images = render_chat(tokenizer, messages)
    assert len(images) == min(reflection_images, 2) and "NOT SUCCESS" in rendered


def test_reflection_prompt_for_an_attempt_without_steps():
    req = ReflectionRequest(task_id="t", instruction="Do it", attempt=1, steps=(), verdict="NOT SUCCESS",
                            verdict_reason="no action")
    messages = PromptBuilder(PROMPT).reflection_messages(req)
    assert "before its first action" in "".join(_texts(messages[1]["content"]))
    assert not _images(messages[1]["content"])
