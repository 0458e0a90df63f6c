"""An in-process model policy is named after its checkpoint's weights (not "flax:rmsweb" for all),
and a collection store refuses a second policy, naming both."""
import shutil

import pytest

from rmsweb_jax.agents.flax_policy import FlaxPolicy
from rmsweb_jax.agents.prompt import PromptBuilder, prompt_config_from
from rmsweb_jax.agents.teacher import ScriptedTeacher
from rmsweb_jax.collect.retries import RetryCollector
from rmsweb_jax.collect.store import StoreError
from rmsweb_jax.collect.store_fixture import retry_group
from rmsweb_jax.judges.programmatic import ProgrammaticJudge
from rmsweb_jax.sampling.chat_model import ChatModel, checkpoint_name
from rmsweb_jax.suites.miniwob import MiniWoBSuite
from tests.settings import collect_settings, store_writer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Returns (FlaxPolicy over ChatModel.load('random:tiny'), its checkpoint folder)."""
    from configs.common import base_config
    workdir = tmp_path_factory.mktemp("tiny")
    policy = FlaxPolicy(ChatModel.load("random:tiny", workdir, max_batch=1),
                        PromptBuilder(prompt_config_from(base_config())), owns_model=True)
    yield policy, workdir / "checkpoints" / "random_tiny"
    policy.close()


def test_a_flax_policy_is_named_after_its_checkpoint(tiny, tmp_path):
    policy, folder = tiny
    assert policy.name == f"flax:{checkpoint_name(folder)}" and policy.name != "flax:rmsweb"
    name, digest = checkpoint_name(folder).split("@")
    assert name == "random_tiny" and len(digest) == 10
    # The same weights elsewhere: the same digest. One changed value (the last byte of the last
    # tensor, as fine-tuning would change it) in an equally named folder: another name.
    same = shutil.copytree(folder, tmp_path / "a" / "random_tiny")
    assert checkpoint_name(same) == checkpoint_name(folder)
    tuned = shutil.copytree(folder, tmp_path / "b" / "random_tiny")
    weights = tuned / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    assert checkpoint_name(tuned) != checkpoint_name(folder)
    (tuned / "config.json").write_text((folder / "config.json").read_text().replace("}", ', "x": 1}', 1))
    assert checkpoint_name(tuned).split("@")[1] != digest
    with pytest.raises(FileNotFoundError, match="not an HF checkpoint folder"):
        checkpoint_name(tmp_path)


def test_a_store_refuses_a_second_policy_naming_both(tiny, tmp_path):
    policy, _ = tiny
    store_dir = tmp_path / "store"
    with store_writer(store_dir, policy=policy.name) as store:
        store.add_group([(t, s) for t, s in retry_group("a", 0, solved_at=1, policy=policy.name)])
    teacher = ScriptedTeacher()
    with pytest.raises(StoreError, match=rf"policy '{policy.name}'.*'{teacher.name}'"):
        store_writer(store_dir, policy=teacher.name)
    # A writer opened without a name still does not let the collector mix the teacher in.
    with MiniWoBSuite() as suite, store_writer(store_dir) as store:
        with pytest.raises(StoreError, match=rf"'{policy.name}'.*'{teacher.name}'"):
            RetryCollector(suite, teacher, ProgrammaticJudge(success="solved"), store, collect_settings(progress=False))
        RetryCollector(suite, policy, ProgrammaticJudge(success="solved"), store, collect_settings(progress=False))  # its own: fine
