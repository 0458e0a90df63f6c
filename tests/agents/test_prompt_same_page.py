"""The same page reads the same in every run: the element list numbers its elements 1, 2, ... (not Chromium's DOM
node ids, which grow with every page a browser loads) and a URL on this machine is shown without its port (a local
server's, MiniWoB++'s, changes each run) unless config.prompt.local_ports. Checked on real Chromium: one MiniWoB++
page in two browsers behind two servers, one of them after other pages, gives one prompt."""
import dataclasses

import pytest

from configs.common import base_config
from rmsweb_jax.agents.policy import StepContext
from rmsweb_jax.agents.prompt import PromptBuilder, prompt_config_from, shown_url
from rmsweb_jax.errors import UserError
from rmsweb_jax.web.elements import BBox, Element
from rmsweb_jax.web.observation import Observation

PROMPT = dataclasses.replace(prompt_config_from(base_config()), observation="elements", system="compact")


def _user_text(builder: PromptBuilder, obs: Observation) -> str:
    ctx = StepContext(task_id="t", instruction=obs.instruction, observation=obs, history=(), step=0)
    return "".join(p["text"] for p in builder.messages(ctx)[1]["content"] if p["type"] == "text")


@pytest.mark.parametrize("url, local_ports, shown", [
    ("http://127.0.0.1:38541/miniwob/click-button.html", False, "http://127.0.0.1/miniwob/click-button.html"),
    ("http://localhost:8000/a?b=1#c", False, "http://localhost/a?b=1#c"),
    ("http://user:pw@127.0.0.1:9/x", False, "http://user:pw@127.0.0.1/x"),
    ("http://[::1]:8080/x", False, "http://[::1]/x"),
    ("http://127.0.0.1:38541/miniwob/click-button.html", True, "http://127.0.0.1:38541/miniwob/click-button.html"),
    ("https://www.example.com:8443/x", False, "https://www.example.com:8443/x"),  # another machine's port stays
    ("http://127.0.0.1/x", False, "http://127.0.0.1/x"),
    ("about:blank", False, "about:blank"),
    ("", False, "")])
def test_a_local_urls_port_is_left_out_unless_asked_for(url, local_ports, shown):
    assert shown_url(url, dataclasses.replace(PROMPT, local_ports=local_ports)) == shown


def test_the_element_list_numbers_the_listed_elements_whatever_their_dom_ids():
    elements = (Element(3579, "button", "Submit", BBox(10, 10, 80, 30)),
                Element(12, "StaticText", "", BBox(0, 0, 1, 1)),  # not listed (no name, not interactive)
                Element(40211, "textbox", "Email", BBox(100, 50, 80, 20), value="a@b.c"))
    obs = Observation(url="http://127.0.0.1:8000/form", title="Form", screenshot=b"", viewport=(200, 100),
                      screenshot_size=(200, 100), elements=elements, focused_id=40211, instruction="Sign up")
    text = PromptBuilder(PROMPT).element_list(obs)
    assert text.splitlines()[1:] == ['[1] button "Submit" at [250, 250]',
                                     '[2] textbox "Email" value="a@b.c" focused at [700, 600]']
    assert "3579" not in text and "40211" not in text


def test_local_ports_must_be_a_bool():
    with pytest.raises(UserError, match="config.prompt.local_ports must be True or False, got 'yes'"):
        dataclasses.replace(PROMPT, local_ports="yes")


@pytest.mark.browser
def test_one_miniwob_page_in_two_browsers_behind_two_servers_gives_one_prompt(loop):
    from rmsweb_jax.suites.miniwob import MiniWoBSuite, load_miniwob_tasks
    from rmsweb_jax.web.worker import BrowserWorker
    tasks = {t.id: t for t in load_miniwob_tasks()}
    task = tasks["miniwob.click-button"]
    with MiniWoBSuite() as suite_a, MiniWoBSuite() as suite_b:
        worker_a, worker_b = BrowserWorker(suite_a), BrowserWorker(suite_b)
        loop.run(worker_a.start(), 120)
        loop.run(worker_b.start(), 120)
        try:
            for name in ("miniwob.focus-text", "miniwob.click-dialog", "miniwob.enter-text"):  # b's node ids grow
                loop.run(worker_b.reset(tasks[name], seed=1), 60)
            obs_a = loop.run(worker_a.reset(task, seed=7), 60)
            obs_b = loop.run(worker_b.reset(task, seed=7), 60)
        finally:
            loop.run(worker_a.close(), 60)
            loop.run(worker_b.close(), 60)
    # What differs between the two: the servers' ports and the elements' DOM node ids; not the page.
    assert obs_a.url != obs_b.url
    assert [e.id for e in obs_a.elements] != [e.id for e in obs_b.elements]
    assert [(e.role, e.name, e.bbox) for e in obs_a.elements] == [(e.role, e.name, e.bbox) for e in obs_b.elements]
    builder = PromptBuilder(PROMPT)
    text_a = _user_text(builder, obs_a)
    assert text_a == _user_text(builder, obs_b)
    assert "Current page: http://127.0.0.1/miniwob/click-button.html" in text_a and "\n[1] " in text_a
    with_ports = PromptBuilder(dataclasses.replace(PROMPT, local_ports=True))
    assert _user_text(with_ports, obs_a) != _user_text(with_ports, obs_b)
