"""The action parser and formatter: never raises, and round-trips every valid action."""
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmsweb_jax.web.action_text import PARSE_ERROR_REASONS, ParsedAction, ParseError, format_action, parse_action
from rmsweb_jax.web.actions import ACTION_NAMES, RELATIVE, SCROLL_DIRECTIONS, Action, ActionError, CoordinateSpace
from rmsweb_jax.web.normalize import KEY_ALIASES

coordinates = st.tuples(st.integers(0, 1000), st.integers(0, 1000))
texts = st.text(max_size=40)
keys = st.lists(st.sampled_from(sorted(KEY_ALIASES) + list("abcxyz019+-/ ")), min_size=1, max_size=4).map(tuple)
urls = st.text(min_size=1, max_size=30).filter(lambda u: u.strip())

valid_actions = st.one_of(
    st.builds(lambda c: Action("left_click", coordinate=c), coordinates),
    st.builds(lambda c: Action("double_click", coordinate=c), coordinates),
    st.builds(lambda c: Action("hover", coordinate=c), coordinates),
    st.builds(lambda t, e, c, p: Action("type", text=t, press_enter=e, clear=c, coordinate=p),
              texts, st.booleans(), st.booleans(), st.none() | coordinates),
    st.builds(lambda k: Action("key", keys=k), keys),
    st.builds(lambda d, a, p: Action("scroll", direction=d, amount=a, coordinate=p),
              st.sampled_from(["up", "down", "left", "right"]), st.integers(1, 100_000), st.none() | coordinates),
    st.just(Action("go_back")),
    st.builds(lambda u: Action("navigate", url=u), urls),
    st.builds(lambda s: Action("wait", seconds=s), st.none() | st.floats(0, 60)),
    st.builds(lambda t: Action("answer", text=t), texts),
)
thoughts = st.text(max_size=60).filter(lambda t: "<tool_call>" not in t)

# Pieces that make strings look almost like tool calls.
fragments = st.sampled_from([
    "<tool_call>", "</tool_call>", "{", "}", "[", "]", ",", ":", '"', '"name"', '"computer_use"', '"arguments"',
    '"action"', '"coordinate"', '"text"', '"keys"', '"direction"', '"amount"', '"url"', '"time"', "null", "true",
    "NaN", "Infinity", "-1", "1e309", "1000", "1001", "\\u003c", "\n", " ", *[f'"{n}"' for n in ACTION_NAMES],
])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
argument_objects = st.dictionaries(
    st.sampled_from(["action", "coordinate", "text", "keys", "direction", "amount", "url", "time", "press_enter",
                     "clear", "extra"]),
    st.one_of(json_values, st.sampled_from(ACTION_NAMES), coordinates.map(list),
              st.lists(st.integers(-5, 2000), max_size=3)),
    max_size=5,
)


def call(arguments, name="computer_use") -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def check_result(result):
    assert isinstance(result, (ParsedAction, ParseError))
    if isinstance(result, ParseError):
        assert result.reason in PARSE_ERROR_REASONS and result.reason != "internal_error", result
        assert isinstance(result.message, str) and result.message
    else:
        assert result.action.name in ACTION_NAMES


@settings(max_examples=400, deadline=None)
@given(st.text())
def test_parse_never_raises_on_arbitrary_text(text):
    check_result(parse_action(text))


@settings(max_examples=400, deadline=None)
@given(st.lists(fragments, max_size=25).map("".join))
def test_parse_never_raises_on_tool_call_lookalikes(text):
    check_result(parse_action(text))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(thoughts, argument_objects, st.sampled_from(["computer_use", "computer", ""]), st.booleans())
def test_parse_never_raises_on_arbitrary_arguments(thought, arguments, name, closed):
    text = thought + call(arguments, name)
    if not closed:
        text = text[: -len("</tool_call>")]
    result = parse_action(text)
    check_result(result)
    if name != "computer_use":
        assert result.reason == "unknown_tool"


@pytest.mark.parametrize("text", [None, 42, b"<tool_call>", ["<tool_call>"], "[" * 100_000, "<tool_call>" + "[" * 100_000,
                                  "<tool_call>" + '{"a":' * 50_000, "\x00<tool_call>\x00", "<tool_call>\ud800</tool_call>"])
def test_parse_never_raises_on_adversarial_inputs(text):
    result = parse_action(text)
    assert isinstance(result, ParseError) and result.reason != "internal_error", result


@settings(max_examples=500, deadline=None)
@given(valid_actions, thoughts)
def test_format_then_parse_round_trips(action, thought):
    text = format_action(action, thought)
    parsed = parse_action(text)
    assert isinstance(parsed, ParsedAction), (text, parsed)
    assert parsed.action == action and parsed.thought == thought.strip()
    assert format_action(parsed.action, parsed.thought) == text


@settings(max_examples=200, deadline=None)
@given(valid_actions)
def test_action_dict_round_trips(action):
    assert Action.from_dict(json.loads(json.dumps(action.to_dict()))) == action


def test_format_is_the_qwen_tool_call_form():
    text = format_action(Action.click(412, 530), "I need to press OK.")
    assert text == ('I need to press OK.\n<tool_call>\n{"name": "computer_use", "arguments": '
                    '{"action": "left_click", "coordinate": [412, 530]}}\n</tool_call>')
    # Tags inside typed text cannot end or duplicate the call.
    tricky = Action.type_text("</tool_call><tool_call>")
    assert parse_action(format_action(tricky)).action == tricky
    with pytest.raises(ValueError, match="thought must not contain"):
        format_action(Action("go_back"), "see <tool_call>")


@pytest.mark.parametrize("text, reason, fragment", [
    ("I will click.", "no_tool_call", "no <tool_call>"),
    (call({"action": "go_back"}) + call({"action": "go_back"}), "multiple_tool_calls", "2 tool calls"),
    ("<tool_call>{'name': 'computer_use'}</tool_call>", "invalid_json", "not JSON"),
    ("<tool_call>[1, 2]</tool_call>", "invalid_json", "JSON object"),
    (call({"action": "go_back"}, name="browser"), "unknown_tool", "'browser'"),
    (call({"action": "right_click", "coordinate": [1, 2]}), "unknown_action", "'right_click'"),
    (call({"coordinate": [1, 2]}), "unknown_action", "None"),
    (call({"action": "left_click"}), "missing_argument", "'coordinate'"),
    (call({"action": "type"}), "missing_argument", "'text'"),
    (call({"action": "scroll", "direction": "down"}), "missing_argument", "'amount'"),
    (call({"action": "left_click", "coordinate": [1001, 5]}), "coordinate_out_of_range", "[1001, 5]"),
    (call({"action": "left_click", "coordinate": [-1, 5]}), "coordinate_out_of_range", "0..1000"),
    (call({"action": "left_click", "coordinate": [5]}), "invalid_argument", "[x, y]"),
    (call({"action": "left_click", "coordinate": [True, 5]}), "invalid_argument", "finite number"),
    (call({"action": "key", "keys": ["ctrl", "hyper"]}), "invalid_argument", "'hyper'"),
    (call({"action": "scroll", "direction": "sideways", "amount": 3}), "invalid_argument", "direction"),
    (call({"action": "wait", "time": 3600}), "invalid_argument", "time"),
    (call({"action": "go_back", "url": "x"}), "invalid_argument", "'url'"),
    (call({"action": "type", "text": "a", "press_enter": "yes"}), "invalid_argument", "press_enter"),
    ('<tool_call>{"name": "computer_use"}</tool_call>', "missing_argument", "'arguments'"),
])
def test_parse_errors_say_why(text, reason, fragment):
    result = parse_action(text)
    assert isinstance(result, ParseError) and result.reason == reason and fragment in result.message, result


def test_parse_accepts_common_model_variants():
    # Missing closing tag (cut by a stop sequence), keys as "ctrl+a", float coordinates.
    result = parse_action('Thinking...\n<tool_call>\n{"name": "computer_use", "arguments": '
                          '{"action": "key", "keys": "ctrl+a"}}')
    assert result.action == Action("key", keys=("ctrl", "a")) and result.thought == "Thinking..."
    result = parse_action(call({"action": "left_click", "coordinate": [10.4, 20.6]}))
    assert result.action.coordinate == (10, 21)
    double = '<tool_call>{"name": "computer_use", "arguments": "{\\"action\\": \\"go_back\\"}"}</tool_call>'
    assert parse_action(double).action == Action("go_back")


def test_pixel_coordinate_space():
    space = CoordinateSpace.pixels(640, 480)
    assert parse_action(call({"action": "left_click", "coordinate": [639, 479]}), space).ok
    result = parse_action(call({"action": "left_click", "coordinate": [700, 10]}), space)
    assert result.reason == "coordinate_out_of_range" and "0..640" in result.message
    assert space.to_css((320, 240), (640, 480)) == (320, 240)
    assert RELATIVE.to_css((500, 500), (640, 480)) == (320, 240)
    assert RELATIVE.to_css((1000, 1000), (640, 480)) == (639, 479)  # clamped inside the viewport
    with pytest.raises(ValueError, match="relative CoordinateSpace is 1000 x 1000"):
        CoordinateSpace("relative", 640, 480)


def test_invalid_actions_cannot_be_built():
    with pytest.raises(ActionError, match="needs argument 'coordinate'"):
        Action("left_click")
    with pytest.raises(ActionError, match="not one of"):
        Action("teleport")


HUGE = 10 ** 400  # beyond float range: math.isfinite(HUGE) raises OverflowError


@pytest.mark.parametrize("arguments, reason, fragment", [
    ({"action": "left_click", "coordinate": [HUGE, 5]}, "coordinate_out_of_range", "far outside"),
    ({"action": "left_click", "coordinate": [5, -HUGE]}, "coordinate_out_of_range", "far outside"),
    ({"action": "hover", "coordinate": [HUGE, HUGE]}, "coordinate_out_of_range", "far outside"),
    ({"action": "type", "text": "a", "coordinate": [HUGE, 1]}, "coordinate_out_of_range", "far outside"),
    ({"action": "scroll", "direction": "down", "amount": HUGE}, "invalid_argument", "amount"),
    ({"action": "scroll", "direction": "down", "amount": -HUGE}, "invalid_argument", "amount"),
    ({"action": "scroll", "direction": "up", "amount": 3, "coordinate": [HUGE, 0]}, "coordinate_out_of_range", "far outside"),
    ({"action": "wait", "time": HUGE}, "invalid_argument", "time"),
    ({"action": "wait", "time": -HUGE}, "invalid_argument", "time"),
])
def test_integers_beyond_float_range_get_the_documented_reason(arguments, reason, fragment):
    result = parse_action(call(arguments))
    assert isinstance(result, ParseError) and result.reason == reason and fragment in result.message, result
    with pytest.raises(ActionError, match=fragment) as err:
        Action.from_arguments(arguments)
    assert err.value.reason == reason
    with pytest.raises(ActionError, match=fragment):  # the stored form too
        Action.from_dict({"arguments": arguments, "target": None})


@pytest.mark.parametrize("build", [
    lambda: Action("left_click", coordinate=(HUGE, 1)),
    lambda: Action.click(1, -HUGE),
    lambda: Action("scroll", direction="down", amount=HUGE),
    lambda: Action("wait", seconds=HUGE),
    lambda: Action.type_text("x", coordinate=(HUGE, HUGE)),
])
def test_actions_with_huge_integers_raise_the_documented_value_error(build):
    with pytest.raises(ActionError) as err:  # an ActionError is the documented ValueError
        build()
    assert isinstance(err.value, ValueError) and err.value.reason in ("invalid_argument", "coordinate_out_of_range")


huge_ints = st.integers(min_value=-HUGE, max_value=HUGE) | st.sampled_from([HUGE, -HUGE, 2 ** 1024, -(2 ** 1024)])
odd_numbers = huge_ints | st.floats(allow_nan=True, allow_infinity=True) | st.integers(-5, 2000) | st.booleans()
odd_values = st.one_of(odd_numbers, st.none(), st.text(max_size=6), st.lists(odd_numbers, max_size=3),
                       st.tuples(odd_numbers, odd_numbers).map(list), st.sampled_from(SCROLL_DIRECTIONS))
# The arguments each action takes, so most examples get past the key check to the values.
TAKES = {"left_click": ["coordinate"], "double_click": ["coordinate"], "hover": ["coordinate"],
         "type": ["text", "coordinate", "press_enter", "clear"], "key": ["keys"],
         "scroll": ["direction", "amount", "coordinate"], "go_back": [], "navigate": ["url"], "wait": ["time"],
         "answer": ["text"]}


@st.composite
def odd_arguments(draw):
    name = draw(st.sampled_from(ACTION_NAMES))
    keys = draw(st.lists(st.sampled_from(TAKES[name]), unique=True)) if TAKES[name] else []
    return {"action": name, **{k: draw(odd_values) for k in keys}}


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(odd_arguments())
def test_parse_never_reports_internal_error_on_odd_numbers(arguments):
    check_result(parse_action(call(arguments)))
    try:
        Action.from_dict({"arguments": arguments, "target": None})
    except ActionError:
        pass  # the documented refusal; anything else (OverflowError, TypeError) fails the test
