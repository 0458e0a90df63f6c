"""config.prompt's observation (screenshot | elements | both) and system (qwen_tools | compact) options:
what each shows, element states, the old `include_elements` key, and that training rebuilds the
sampling prefix token for token in every mode (tiny BPE and byte-level tokenizers)."""
import dataclasses

import numpy as np
import pytest

from configs.common import base_config
from rmsweb_jax.agents.policy import PastStep, StepContext
from rmsweb_jax.agents.prompt import PromptBuilder, PromptConfig, compact_system_prompt, prompt_config_from
from rmsweb_jax.processing.byte_tokenizer import build_byte_tokenizer
from rmsweb_jax.processing.chat import encode_chat, encode_for_training
from rmsweb_jax.processing.image import ImageProcessorConfig
from rmsweb_jax.processing.prompt_tokens import load_tokenizer
from rmsweb_jax.processing.tiny_tokenizer import build_tiny_tokenizer
from rmsweb_jax.web.action_text import format_action
from rmsweb_jax.web.actions import RELATIVE, Action, CoordinateSpace
from rmsweb_jax.web.ax_tree import elements_from_cdp
from rmsweb_jax.web.elements import BBox, Element
from rmsweb_jax.web.observation import Observation
from tests.agents.screens import labelled_png as _png

PROMPT = prompt_config_from(base_config())
SMALL = ImageProcessorConfig(min_pixels=4096, max_pixels=16384)


def _observation() -> Observation:
    elements = (Element(1, "button", "Submit", BBox(10, 10, 80, 30)),
                Element(2, "textbox", "Email", BBox(100, 50, 80, 20), value="a@b.c"),
                Element(3, "checkbox", "Agree", BBox(20, 60, 10, 10), states=("checked",)),
                Element(4, "combobox", "Size", BBox(40, 80, 40, 10), states=("collapsed",)))
    return Observation(url="http://127.0.0.1:8000/form", title="Form", screenshot=_png("now"), viewport=(200, 100),
                       screenshot_size=(400, 200), elements=elements, focused_id=2, instruction="Sign up")


def _context(history: int = 2) -> StepContext:
    past = tuple(PastStep(screenshot=_png(f"s{i}"), url="http://127.0.0.1:8000/form", thought=f"thought {i}",
                          action_text=format_action(Action.click(100 * i, 200))) for i in range(1, history + 1))
    return StepContext(task_id="t", instruction="Sign up", observation=_observation(), history=past, step=history)


def _builder(**kw) -> PromptBuilder:
    return PromptBuilder(dataclasses.replace(PROMPT, **kw))


def _images(messages) -> int:
    return sum(p["type"] == "image_url" for p in messages[1]["content"])


def _text(messages) -> str:
    return "".join(p["text"] for p in messages[1]["content"] if p["type"] == "text")


def test_the_shipped_default_is_the_screenshot_with_qwens_tool_block():
    assert (PROMPT.observation, PROMPT.system) == ("screenshot", "qwen_tools")
    messages = PromptBuilder(PROMPT).messages(_context())
    assert _images(messages) == 1 + PROMPT.history_images and "Page elements" not in _text(messages)
    assert "# Tools" in messages[0]["content"] and "<tools>" in messages[0]["content"]


@pytest.mark.parametrize("observation, images, elements", [("screenshot", 2, False), ("elements", 1, True),
                                                           ("both", 2, True)])
def test_observation_modes_show_what_they_name(observation, images, elements):
    messages = _builder(observation=observation, history_steps=2, history_images=1).messages(_context())
    text = _text(messages)
    assert _images(messages) == images  # the history screenshot stays as history_images says
    assert ("Current screenshot:" in text) == (observation != "elements")
    assert ("Page elements" in text) == elements
    assert _images(_builder(observation="elements", history_images=0).messages(_context())) == 0


def test_element_list_is_in_the_actions_grid_with_value_and_state():
    text = _builder(observation="elements").element_list(_observation())
    assert '[1] button "Submit" at [250, 250]' in text  # the 0-1000 grid of the 200x100 viewport
    assert '[2] textbox "Email" value="a@b.c" focused at [700, 600]' in text
    assert '[3] checkbox "Agree" checked at [125, 650]' in text
    assert '[4] combobox "Size" collapsed at [300, 850]' in text


def test_ax_tree_states_reach_the_elements():
    nodes = [{"nodeId": "1", "role": {"value": "RootWebArea"}, "childIds": ["2", "3"], "backendDOMNodeId": 1},
             {"nodeId": "2", "role": {"value": "checkbox"}, "name": {"value": "Agree"}, "backendDOMNodeId": 2,
              "parentId": "1", "properties": [{"name": "checked", "value": {"type": "tristate", "value": "true"}},
                                              {"name": "focusable", "value": {"value": True}}]},
             {"nodeId": "3", "role": {"value": "tab"}, "name": {"value": "Two"}, "backendDOMNodeId": 3, "parentId": "1",
              "properties": [{"name": "selected", "value": {"value": True}},
                             {"name": "expanded", "value": {"value": False}}]}]
    snapshot = {"documents": [{"nodes": {"backendNodeId": [1, 2, 3]},
                               "layout": {"nodeIndex": [0, 1, 2], "bounds": [[0, 0, 100, 100], [1, 1, 5, 5],
                                                                             [10, 10, 20, 10]]}}]}
    elements, _ = elements_from_cdp(nodes, snapshot, (100, 100))
    assert {e.name: e.states for e in elements} == {"Agree": ("checked",), "Two": ("selected", "collapsed")}
    assert Element.from_dict(elements[0].to_dict()) == elements[0]
    assert "states" not in dataclasses.replace(elements[0], states=()).to_dict()  # old records stay as they were


def test_compact_system_prompt_names_every_action_in_a_few_hundred_characters():
    compact = compact_system_prompt(RELATIVE)
    assert len(compact) < 450 and "0-1000 grid" in compact and '"name": "computer_use"' in compact
    for name in ("left_click", "type(text)", "key(keys)", "scroll(direction,amount)", "answer(text)"):
        assert name in compact
    assert "pixels of the 400x200 screenshot" in compact_system_prompt(CoordinateSpace.pixels(400, 200))
    assert _builder(system="compact").messages(_context())[0]["content"] == compact


def test_config_keys_are_checked_and_the_old_include_elements_key_is_named():
    for kw, match in (({"observation": "text"}, "config.prompt.observation"), ({"system": "short"}, "system")):
        with pytest.raises(ValueError, match=match):
            dataclasses.replace(PROMPT, **kw)
    old = {k: v for k, v in base_config().prompt.to_dict().items() if k != "observation"} | {"include_elements": True}
    with pytest.raises(ValueError, match=r"include_elements .*replaced by config.prompt.observation.*'both'"):
        PromptConfig.from_config(old)


@pytest.fixture(scope="module", params=["tiny", "byte"])
def tokenizer(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    (build_tiny_tokenizer if request.param == "tiny" else build_byte_tokenizer)(folder)
    return load_tokenizer(folder)


@pytest.mark.parametrize("observation, system", [("screenshot", "qwen_tools"), ("elements", "compact"),
                                                 ("both", "compact")])
def test_training_rebuilds_the_sampling_prefix_token_for_token(tokenizer, observation, system):
    history_images = 0 if observation == "elements" else 1  # elements only: no image anywhere
    messages = _builder(observation=observation, system=system, history_steps=2,
                        history_images=history_images).messages(_context())
    target = PromptBuilder.target("I click Submit.", format_action(Action.click(250, 250)))
    sampled = encode_chat(tokenizer, messages, SMALL, add_generation_prompt=True)
    trained = encode_for_training(tokenizer, messages, target, SMALL)
    n = len(sampled.input_ids)
    np.testing.assert_array_equal(trained.input_ids[:n], sampled.input_ids)
    assert trained.loss_mask[:n].sum() == 0 and trained.loss_mask[n:].sum() > 0
    assert (sampled.num_images == 0) == (observation == "elements")
