"""compare_actions: one case per action type and category (pure, on a hand-built page), then the
label and duplicate-link rules on a real Chromium page, live and from the stored observation."""
import itertools

import pytest

from rmsweb_jax.web.action_text import ParsedAction, ParseError, format_action, parse_action
from rmsweb_jax.web.actions import RELATIVE, Action
from rmsweb_jax.web.elements import BBox, Element, element_at
from rmsweb_jax.web.observation import Observation
from rmsweb_jax.web.semantics import CATEGORIES, Comparison, compare_actions, same_action

VIEW = (1000, 1000)  # so relative coordinates equal CSS pixels
OK = Element(1, "button", "OK", BBox(100, 100, 100, 40), focusable=True, z=3)
OK_TEXT = Element(2, "StaticText", "OK!", BBox(130, 110, 20, 15), z=3, owner=1)
CANCEL = Element(3, "button", "Cancel", BBox(200, 100, 100, 40), focusable=True, z=3)
OK_AGAIN = Element(4, "button", "OK", BBox(700, 100, 100, 40), focusable=True, z=3)  # same name, elsewhere
FIELD = Element(5, "textbox", "Name", BBox(100, 200, 200, 30), value="old", focusable=True, z=2)
EMAIL = Element(6, "textbox", "Email", BBox(100, 250, 200, 30), value="", focusable=True, z=2)
CHECK = Element(7, "checkbox", "Remember me", BBox(100, 300, 13, 13), focusable=True, z=2)
LABEL = Element(8, "LabelText", "Remember me", BBox(120, 298, 100, 17), z=2, owner=7)  # <label for=...>
CANVAS = Element(9, "Canvas", "", BBox(400, 400, 300, 300), z=1)
HOME_TOP = Element(10, "link", "Home", BBox(10, 800, 50, 17), focusable=True, url="http://x/home")
HOME_FOOT = Element(11, "link", "Home", BBox(10, 900, 50, 17), focusable=True, url="http://x/home/")
HOME_ELSEWHERE = Element(12, "link", "Home", BBox(100, 900, 50, 17), focusable=True, url="http://x/start")
DELETE_1 = Element(13, "link", "Delete", BBox(200, 800, 50, 17), focusable=True, url="http://x/#")
DELETE_2 = Element(14, "link", "Delete", BBox(200, 900, 50, 17), focusable=True, url="http://x/#")
TOP_1 = Element(15, "link", "Top", BBox(300, 800, 50, 17), focusable=True, url="http://x/")  # the page itself
TOP_2 = Element(16, "link", "Top", BBox(300, 900, 50, 17), focusable=True, url="http://x/")
ELEMENTS = (OK, OK_TEXT, CANCEL, OK_AGAIN, FIELD, EMAIL, CHECK, LABEL, CANVAS, HOME_TOP, HOME_FOOT, HOME_ELSEWHERE,
            DELETE_1, DELETE_2, TOP_1, TOP_2)


def obs(focused=None):
    return Observation(url="http://x/", title="t", screenshot=b"", viewport=VIEW, screenshot_size=VIEW,
                       elements=ELEMENTS, focused_id=focused, instruction="")


def on(element, dx=0.0, dy=0.0):
    """A click at the element's centre, moved by (dx, dy)."""
    x, y = element.bbox.center
    return Action.click(round(x + dx), round(y + dy))


def typing(text, element=None, **kw):
    return Action.type_text(text, coordinate=None if element is None else tuple(map(round, element.bbox.center)), **kw)


def key(*keys):
    return Action("key", keys=keys)


def scroll(direction):
    return Action("scroll", direction=direction, amount=300)


def navigate(url):
    return Action("navigate", url=url)


# (why, sampled, reference, focused id, expected category)
CASES = [
    ("no tool call", parse_action("I will click OK."), on(OK), None, "unparseable"),
    ("bad argument", parse_action('<tool_call>{"name": "computer_use", "arguments": {"action": "left_click"}}'),
     on(OK), None, "unparseable"),
    ("a parsed turn", parse_action(format_action(on(OK, 30, 5), "OK it is.")), on(OK), None, "same"),
    ("click vs double click", Action("double_click", coordinate=(150, 120)), on(OK), None, "wrong_action_type"),
    ("type vs click", typing("OK"), on(OK), None, "wrong_action_type"),
    ("answer too early", Action.answer_with("done"), on(OK), None, "premature_answer"),
    ("answer instead of typing", Action.answer_with("Ada"), typing("Ada", FIELD), None, "premature_answer"),
    ("two points on one button", on(OK, -45, -15), on(OK, 45, 15), None, "same"),
    ("the button's text vs its padding", on(OK_TEXT), Action.click(105, 105), None, "same"),
    ("a label vs its checkbox", on(LABEL, 40), on(CHECK), None, "same"),
    ("a checkbox vs its label", on(CHECK), on(LABEL, -40), None, "same"),
    ("the neighbour", on(CANCEL), on(OK), None, "wrong_element_same_role"),
    ("a button of the same name elsewhere", on(OK_AGAIN), on(OK), None, "wrong_element_same_role"),
    ("a field vs a button", on(FIELD), on(OK), None, "wrong_element_other_role"),
    ("the label vs a button", on(LABEL), on(OK), None, "wrong_element_other_role"),
    ("nothing vs a button", Action.click(10, 10), on(OK), None, "no_element"),
    ("a button vs nothing", on(OK), Action.click(10, 10), None, "no_element"),
    ("nothing, close points", Action.click(10, 10), Action.click(14, 14), None, "same"),
    ("nothing, far points", Action.click(10, 10), Action.click(60, 60), None, "wrong_point"),
    ("canvas, close points", Action.click(500, 500), Action.click(503, 502), None, "same"),
    ("canvas, far points", Action.click(500, 500), Action.click(600, 600), None, "wrong_point"),
    ("hover on one button", Action("hover", coordinate=(110, 110)), Action("hover", coordinate=(190, 130)), None, "same"),
    ("hover elsewhere", Action("hover", coordinate=(250, 120)), Action("hover", coordinate=(150, 120)), None,
     "wrong_element_same_role"),
    ("double click on one button", Action("double_click", coordinate=(110, 110)),
     Action("double_click", coordinate=(190, 130)), None, "same"),
    ("header and footer links to one URL", on(HOME_TOP), on(HOME_FOOT), None, "same"),
    ("same name, another URL", on(HOME_ELSEWHERE), on(HOME_TOP), None, "wrong_element_same_role"),
    ("script links of one name", on(DELETE_1), on(DELETE_2), None, "wrong_element_same_role"),
    ("links to the page itself", on(TOP_1), on(TOP_2), None, "wrong_element_same_role"),
    ("typing: point vs focus", typing("Ada", FIELD), typing("Ada"), FIELD.id, "same"),
    ("typing: nothing focused vs a field", typing("Ada"), typing("Ada", FIELD), None, "no_element"),
    ("typing: a field vs nothing focused", typing("Ada", FIELD), typing("Ada"), None, "no_element"),
    ("typing: both into nothing", typing("Ada"), typing("Ada "), None, "same"),
    ("typing: point vs no point, nothing under either", Action.type_text("Ada", coordinate=(10, 10)),
     typing("Ada"), None, "wrong_point"),
    ("typing: another field", typing("Ada", EMAIL), typing("Ada", FIELD), None, "wrong_element_same_role"),
    ("typing: a button", typing("Ada", OK), typing("Ada", FIELD), None, "wrong_element_other_role"),
    ("typing: whitespace", typing(" Ada  Lovelace"), typing("Ada Lovelace"), FIELD.id, "same"),
    ("typing: case", typing("ada"), typing("Ada"), FIELD.id, "wrong_text"),
    ("typing: Enter", typing("Ada"), typing("Ada", press_enter=True), FIELD.id, "wrong_enter"),
    ("typing: keeps text the reference clears", typing("Ada"), typing("Ada", clear=True), FIELD.id, "wrong_clear"),
    ("typing: keeps an empty field's text the reference clears", typing("Ada"), typing("Ada", clear=True), EMAIL.id,
     "wrong_clear"),
    ("typing: clears text the reference keeps", typing("Ada", clear=True), typing("Ada"), FIELD.id, "wrong_clear"),
    ("typing: clears an empty field", typing("Ada", clear=True), typing("Ada"), EMAIL.id, "same"),
    ("typing: both clear", typing("Ada", clear=True), typing("Ada", clear=True), FIELD.id, "same"),
    ("key chord", key("ctrl", "A"), key("control", "a"), None, "same"),
    ("another key", key("Tab"), key("Enter"), None, "wrong_key"),
    ("scroll amount", Action("scroll", direction="down", amount=100), scroll("down"), None, "same"),
    ("scroll direction", scroll("up"), scroll("down"), None, "wrong_scroll"),
    ("url spelling", navigate("www.Example.com/a/?b=2&a=1"), navigate("https://example.com/a?a=1&b=2"), None, "same"),
    ("another url", navigate("example.com/b"), navigate("example.com/a"), None, "wrong_url"),
    ("answer punctuation", Action.answer_with('"Paris."'), Action.answer_with("paris"), None, "same"),
    ("another answer", Action.answer_with("Lyon"), Action.answer_with("Paris"), None, "wrong_answer"),
    ("go back", Action("go_back"), Action("go_back"), None, "same"),
    ("wait time", Action("wait", seconds=3), Action("wait"), None, "same"),
]


@pytest.mark.parametrize("why,sampled,reference,focused,category", CASES, ids=[c[0] for c in CASES])
def test_compare_actions_category(why, sampled, reference, focused, category):
    result = compare_actions(sampled, reference, obs(focused))
    assert (result.category, result.same) == (category, category == "same"), result.detail
    assert result.detail and len(result.detail) < 120
    # Stored and read back, the observation gives the same verdict.
    assert compare_actions(sampled, reference, Observation.from_json(obs(focused).to_json())) == result


def test_every_category_has_a_case():
    assert {c[-1] for c in CASES} == set(CATEGORIES)


def test_same_action_is_compare_actions_same():
    actions = [c[1].action if isinstance(c[1], ParsedAction) else c[1] for c in CASES if not isinstance(c[1], ParseError)]
    actions += [c[2] for c in CASES]
    for focused in (None, FIELD.id):
        o = obs(focused)
        for a, b in itertools.product(actions[::3], repeat=2):
            assert same_action(a, b, o) == compare_actions(a, b, o).same


def test_comparison_rejects_contradictions_and_pointer_actions_need_a_page():
    with pytest.raises(ValueError, match="contradicts"):
        Comparison(True, "wrong_key", "")
    with pytest.raises(ValueError, match="one of"):
        Comparison(False, "wrong_everything", "")
    with pytest.raises(ValueError, match="needs resolved targets"):
        compare_actions(Action.click(1, 1), Action.click(1, 1))
    with pytest.raises(TypeError, match="takes Actions"):
        compare_actions("left_click", Action.click(1, 1))
    assert compare_actions(typing("Ada"), typing("Ada", clear=True)).category == "wrong_clear"  # no page needed


def test_a_label_click_resolves_to_its_control_wherever_it_is():
    assert element_at(ELEMENTS, 200, 305) == CHECK  # on the label, right of the checkbox's box
    stored = Element.from_dict(LABEL.to_dict())
    assert stored == LABEL and Element.from_dict(HOME_TOP.to_dict()).url == "http://x/home"
    assert element_at((LABEL,), 200, 305) == LABEL  # the control not on screen: the label itself


@pytest.mark.browser
def test_labels_and_duplicate_links_on_a_real_page(loop, live_worker, page_task):
    task = page_task("labels.html")
    first = loop.run(live_worker.reset(task))

    def find(role, name):
        return next(e for e in first.elements if e.role == role and e.name.strip() == name)

    def at(element, dx=0.0):
        x, y = element.bbox.center
        return Action.click(*RELATIVE.from_css((x + dx, y), first.viewport))

    remember, remember_label = find("checkbox", "Remember me"), find("LabelText", "Remember me")
    large, large_text = find("radio", "Large size"), find("StaticText", "Large")
    news, news_text = find("checkbox", "Newsletter"), find("StaticText", "Newsletter")
    email, email_label = find("textbox", "Email"), find("LabelText", "Email")
    assert remember_label.owner == remember.id and large_text.owner == large.id and news_text.owner is None

    def step(action):
        loop.run(live_worker.reset(task))
        after, _, _ = loop.run(live_worker.step(action))
        return after

    # The browser forwards a click on a native label to its control; aria-labelledby text does not.
    on_label, on_box = step(at(remember_label, 30)), step(at(remember))
    assert on_label.title == on_box.title == "remember:true"
    # (Node ids change with every reload: compare what the elements are.)
    assert (on_label.last_action.target.element.role, on_label.last_action.target.element.name) == ("checkbox", "Remember me")
    assert same_action(on_label.last_action, on_box.last_action)
    assert step(at(large_text)).title == "size:large"
    assert step(at(news_text)).title == "Labels"
    focused = step(at(email_label)).focused
    assert (focused.role, focused.name) == ("textbox", "Email")
    # Two "Delete" script links do different things; two links to one URL go to one place.
    delete_1, delete_2 = (e for e in first.elements if e.name == "Delete")
    assert (step(at(delete_1)).title, step(at(delete_2)).title) == ("delete:1", "delete:2")
    other_1, other_query, other_2 = (e for e in first.elements if e.name == "Other page")
    assert other_1.url == other_2.url != other_query.url

    stored = Observation.from_json(first.to_json())
    verdicts = {(a, b): compare_actions(at(a), at(b), stored).category
                for a, b in ((remember_label, remember), (large_text, large), (news_text, news),
                             (email_label, email), (delete_1, delete_2), (other_1, other_2), (other_query, other_1))}
    assert list(verdicts.values()) == ["same", "same", "wrong_element_other_role", "same",
                                       "wrong_element_same_role", "same", "wrong_element_same_role"]
