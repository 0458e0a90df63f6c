"""Semantic targets and same_action: pure rules, then on a real page, live and offline."""
import pytest

from rmsweb_jax.web.actions import RELATIVE, Action
from rmsweb_jax.web.ax_tree import elements_from_cdp
from rmsweb_jax.web.elements import BBox, Element, element_at
from rmsweb_jax.web.normalize import normalize_answer, normalize_keys, normalize_text, normalize_url
from rmsweb_jax.web.observation import Observation
from rmsweb_jax.web.semantics import resolve_on, resolve_target, same_action

VIEW = (1000, 1000)  # so relative coordinates equal CSS pixels
OK = Element(1, "button", "OK", BBox(100, 100, 100, 40), focusable=True, z=3)
OK_LABEL = Element(2, "StaticText", "OK!", BBox(130, 110, 20, 15), z=3, owner=1)
CANCEL = Element(3, "button", "Cancel", BBox(200, 100, 100, 40), focusable=True, z=3)
FIELD = Element(4, "textbox", "Name", BBox(100, 200, 200, 30), focusable=True, z=2)
CANVAS = Element(5, "Canvas", "", BBox(400, 400, 300, 300), z=1, focusable=False)
DIALOG_OK = Element(6, "button", "OK", BBox(120, 90, 60, 60), focusable=True, z=9)
ELEMENTS = (OK, OK_LABEL, CANCEL, FIELD, CANVAS)


def obs(elements=ELEMENTS, focused=None):
    return Observation(url="http://x/", title="t", screenshot=b"", viewport=VIEW, screenshot_size=VIEW,
                       elements=tuple(elements), focused_id=focused, instruction="")


def test_element_at_prefers_the_control_over_its_label_and_the_top_layer():
    assert element_at(ELEMENTS, 140, 117) == OK          # on the label: the button
    assert element_at(ELEMENTS, 105, 105) == OK          # on the padding
    assert element_at(ELEMENTS, 250, 120) == CANCEL
    assert element_at(ELEMENTS, 50, 50) is None
    assert element_at((*ELEMENTS, DIALOG_OK), 150, 120) == DIALOG_OK  # a dialog on top wins
    text = Element(7, "StaticText", "hello", BBox(0, 0, 50, 10), z=1)
    assert element_at((text,), 10, 5) == text


def test_same_action_on_clicks():
    o = obs()
    assert same_action(Action.click(105, 105), Action.click(195, 135), o)      # two points, one button
    assert same_action(Action.click(140, 117), Action.click(110, 130), o)      # label vs padding
    assert not same_action(Action.click(195, 120), Action.click(205, 120), o)  # the neighbour
    assert not same_action(Action.click(150, 120), Action("double_click", coordinate=(150, 120)), o)
    assert same_action(Action.click(10, 10), Action.click(14, 14), o)          # nothing there, close
    assert not same_action(Action.click(10, 10), Action.click(60, 60), o)
    assert not same_action(Action.click(10, 10), Action.click(150, 120), o)
    assert same_action(Action.click(500, 500), Action.click(503, 502), o)      # canvas: the point matters
    assert not same_action(Action.click(500, 500), Action.click(600, 600), o)
    with pytest.raises(ValueError, match="needs resolved targets"):
        same_action(Action.click(1, 1), Action.click(1, 1))


def test_same_action_on_typing_keys_scroll_navigation_answers():
    o = obs(focused=FIELD.id)
    assert same_action(Action.type_text("Ada  Lovelace "), Action.type_text(" Ada Lovelace"), o)
    assert same_action(Action.type_text("Ada", coordinate=(150, 210)), Action.type_text("Ada"), o)  # same field
    assert not same_action(Action.type_text("Ada"), Action.type_text("ada"), o)
    assert not same_action(Action.type_text("Ada"), Action.type_text("Ada", press_enter=True), o)
    assert not same_action(Action.type_text("Ada", coordinate=(150, 210)), Action.type_text("Ada", coordinate=(150, 120)), o)
    assert same_action(Action("key", keys=("ctrl", "A")), Action("key", keys=("control", "a")))
    assert same_action(Action("key", keys=("a", "ctrl")), Action("key", keys=("ctrl", "a")))
    assert not same_action(Action("key", keys=("Enter",)), Action("key", keys=("Tab",)))
    assert same_action(Action("scroll", direction="down", amount=100), Action("scroll", direction="down", amount=700))
    assert not same_action(Action("scroll", direction="down", amount=100), Action("scroll", direction="up", amount=100))
    assert same_action(Action("navigate", url="www.Example.com/a/?b=2&a=1#top"),
                       Action("navigate", url="https://example.com/a?a=1&b=2"))
    assert not same_action(Action("navigate", url="example.com/a"), Action("navigate", url="example.com/b"))
    assert same_action(Action.answer_with('"Paris."'), Action.answer_with("paris"))
    assert not same_action(Action.answer_with("Paris"), Action.answer_with("Lyon"))
    assert same_action(Action("go_back"), Action("go_back")) and same_action(Action("wait"), Action("wait", seconds=3))


def test_normalization():
    assert normalize_text("  a \n\t b ") == "a b" and normalize_text("ｆｕｌｌ") == "full"
    assert normalize_answer(" «The Answer»! ") == "the answer"
    assert normalize_url("HTTP://WWW.Example.com:80/x/") == "http://example.com/x"
    assert normalize_url("example.com") == "https://example.com"
    assert normalize_keys(["shift", "ctrl", "t"]) == "control+shift+t"


def test_targets_are_resolved_offline_from_a_stored_observation():
    stored = Observation.from_json(obs(focused=FIELD.id).to_json())
    click = resolve_on(Action.click(140, 117), stored)
    assert click.target.element == OK and click.target.point == (140, 117)
    typed = resolve_target(Action.type_text(" Hi "), stored.elements, viewport=VIEW, focused_id=stored.focused_id)
    assert typed.element == FIELD and typed.text == "Hi"


def test_elements_from_cdp_keeps_controls_and_named_text():
    ax = [
        {"nodeId": "1", "role": {"value": "RootWebArea"}, "name": {"value": "Page"}, "backendDOMNodeId": 1,
         "childIds": ["2", "5"], "properties": [{"name": "focused", "value": {"value": True}}]},
        {"nodeId": "2", "parentId": "1", "role": {"value": "button"}, "name": {"value": "Go"}, "backendDOMNodeId": 2,
         "childIds": ["3"], "properties": [{"name": "focusable", "value": {"value": True}}]},
        {"nodeId": "3", "parentId": "2", "role": {"value": "StaticText"}, "name": {"value": "Go"}, "backendDOMNodeId": 3},
        {"nodeId": "5", "parentId": "1", "role": {"value": "generic"}, "name": {"value": ""}, "backendDOMNodeId": 5,
         "childIds": ["6", "7"]},
        {"nodeId": "6", "parentId": "5", "role": {"value": "StaticText"}, "name": {"value": "below"},
         "backendDOMNodeId": 6},
        {"nodeId": "7", "parentId": "5", "ignored": True, "role": {"value": "none"}, "backendDOMNodeId": 7},
    ]
    snapshot = {"documents": [{"scrollOffsetX": 0, "scrollOffsetY": 100,
                               "nodes": {"backendNodeId": [1, 2, 3, 5, 6, 7]},
                               "layout": {"nodeIndex": [0, 1, 2, 3, 4, 5],
                                          "bounds": [[0, 0, 800, 2000], [10, 110, 50, 20], [15, 112, 20, 15],
                                                     [0, 500, 800, 100], [0, 900, 40, 10], [0, 0, 5, 5]],
                                          "paintOrders": [0, 2, 2, 1, 1, 1]}}]}
    elements, focused = elements_from_cdp(ax, snapshot, (800, 600))
    assert [(e.id, e.role, e.name) for e in elements] == [(2, "button", "Go")]  # label dropped, "below" off-screen
    assert elements[0].bbox == BBox(10, 10, 50, 20) and elements[0].z == 2 and focused is None


@pytest.mark.browser
def test_same_action_on_a_real_page(loop, live_worker, page_task):
    first = loop.run(live_worker.reset(page_task("controls.html")))
    alpha = next(e for e in first.elements if e.name == "Alpha one")
    beta = next(e for e in first.elements if e.name == "Beta")

    def at(x, y):
        return Action.click(*RELATIVE.from_css((x, y), first.viewport))

    # Alpha spans x 20..120 and has a bold child; Beta starts at x 120.
    a_left, a_bold, a_right = at(25, 25), at(95, 40), at(117, 55)
    neighbour = at(125, 40)
    targets = []
    for action in (a_left, a_bold, a_right, neighbour):
        loop.run(live_worker.reset(page_task("controls.html")))
        obs, _, info = loop.run(live_worker.step(action))
        targets.append(obs.last_action)
    assert [t.target.element.name for t in targets] == ["Alpha one"] * 3 + ["Beta"]
    assert same_action(targets[0], targets[1]) and same_action(targets[1], targets[2])
    assert not same_action(targets[2], targets[3])
    # Offline, from the stored first observation: the same verdicts.
    stored = Observation.from_json(first.to_json())
    assert same_action(a_left, a_right, stored) and not same_action(a_right, neighbour, stored)
    assert resolve_on(a_bold, stored).target.element.id == alpha.id
    assert resolve_on(neighbour, stored).target.element.id == beta.id


def test_elements_from_cdp_keeps_native_labels_owned_by_their_control():
    # Chromium ignores a <label for> whose text became the checkbox's name; aria-labelledby text is no label.
    def label_source(kind, label_id, text):
        return {"value": text, "sources": [{"type": "relatedElement", "nativeSource": kind, "nativeSourceValue": {
            "type": "nodeList", "relatedNodes": [{"backendDOMNodeId": label_id, "text": text}]}}]}
    ax = [
        {"nodeId": "1", "role": {"value": "RootWebArea"}, "name": {"value": ""}, "backendDOMNodeId": 1,
         "childIds": ["2", "3", "4", "6", "8"]},
        {"nodeId": "2", "parentId": "1", "role": {"value": "checkbox"}, "name": label_source("labelfor", 3, "Remember"),
         "backendDOMNodeId": 2, "properties": [{"name": "focusable", "value": {"value": True}}]},
        {"nodeId": "3", "parentId": "1", "ignored": True, "role": {"value": "none"}, "backendDOMNodeId": 3},
        {"nodeId": "4", "parentId": "1", "role": {"value": "LabelText"}, "name": {"value": ""}, "backendDOMNodeId": 4,
         "childIds": ["5", "9"]},
        {"nodeId": "5", "parentId": "4", "role": {"value": "radio"}, "name": label_source("labelwrapped", 4, " Large"),
         "backendDOMNodeId": 5},
        {"nodeId": "9", "parentId": "4", "role": {"value": "StaticText"}, "name": {"value": " Large"}, "backendDOMNodeId": 9},
        {"nodeId": "6", "parentId": "1", "role": {"value": "StaticText"}, "name": {"value": "News"}, "backendDOMNodeId": 6},
        {"nodeId": "8", "parentId": "1", "role": {"value": "link"}, "name": {"value": "Home"}, "backendDOMNodeId": 8,
         "properties": [{"name": "url", "value": {"value": "http://x/home"}}]},
    ]
    ids = [1, 2, 3, 4, 5, 9, 6, 8]
    bounds = [[0, 0, 800, 600], [0, 0, 13, 13], [20, 0, 60, 17], [0, 30, 90, 17], [2, 32, 13, 13], [20, 30, 70, 17],
              [0, 60, 40, 17], [0, 90, 40, 17]]
    snapshot = {"documents": [{"nodes": {"backendNodeId": ids},
                               "layout": {"nodeIndex": list(range(len(ids))), "bounds": bounds}}]}
    elements, _ = elements_from_cdp(ax, snapshot, (800, 600))
    got = {e.id: (e.role, e.name, e.owner, e.url) for e in elements}
    assert got == {2: ("checkbox", "Remember", None, ""), 3: ("LabelText", "Remember", 2, ""),
                   4: ("LabelText", "Large", 5, ""), 5: ("radio", " Large", None, ""),
                   6: ("StaticText", "News", None, ""), 8: ("link", "Home", None, "http://x/home")}
    assert element_at(elements, 50, 8).id == 2 and element_at(elements, 60, 38).id == 5
