"""A config mistake is a UserError (main prints it as one line, exit 2), never a bare ValueError (a traceback,
exit 1): no `raise ValueError("config...")` is left in rmsweb_jax, and the checks of several blocks raise UserError."""
import ast
import pathlib

import pytest

from configs.common import base_config
from rmsweb_jax.agents.prompt import PromptConfig, prompt_config_from
from rmsweb_jax.errors import UserError
from rmsweb_jax.salvage.gates import GateSettings
from rmsweb_jax.train.optimizer import OptimizerConfig

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "rmsweb_jax"


def _message_start(node: ast.expr) -> str:
    """Returns the literal start of an exception's message argument ("" when it does not start with one)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return str(node.values[0].value)
    return ""


def test_no_config_mistake_is_raised_as_a_bare_value_error():
    bare = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
                    and getattr(node.exc.func, "id", None) == "ValueError" and node.exc.args
                    and _message_start(node.exc.args[0]).startswith(("config", "the config"))):
                bare.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert not bare, f"config mistakes raised as ValueError (use rmsweb_jax.errors.UserError): {bare}"


def _with(block, **changes):
    out = block.copy_and_resolve_references()
    for key, value in changes.items():
        out[key] = value
    return out


@pytest.mark.parametrize("make", [
    lambda c: PromptConfig.from_config(_with(c.prompt, observation="bogus")),
    lambda c: prompt_config_from({}),
    lambda c: GateSettings.from_config(_with(c.salvage, gates="bogus")),
    lambda c: OptimizerConfig.from_config(_with(c.train.optimizer, lr=-1.0)),
], ids=["prompt.observation", "no prompt block", "salvage.gates", "train.optimizer.lr"])
def test_a_bad_config_value_is_a_user_error_naming_it(make):
    with pytest.raises(UserError, match="config"):
        make(base_config())
