"""Each default is written once (STYLE.md): configs/common.py holds the run's, SERVE_DEFAULTS the server's.

The settings classes built from them take no defaults of their own, and no constructor gives a default to
a parameter its config block also sets: a default added back in either place fails here.
"""
import dataclasses
import inspect

import pytest
from absl import flags

from configs.common import base_config
from rmsweb_jax.agents.prompt import PromptConfig
from rmsweb_jax.collect.retries import CollectSettings, RetryCollector
from rmsweb_jax.collect.store import StoreWriter
from rmsweb_jax.data.sft import EncodeSFTExample, SFTBatches, SFTDataConfig, encode_example, split_by_task
from rmsweb_jax.sampling.serve import SERVE_DEFAULTS, ChatServer, ServeSettings, define_flags
from rmsweb_jax.stages.train_overrides import with_train_overrides
from rmsweb_jax.stages.train_overrides import TRAIN_OVERRIDES
from rmsweb_jax.train.rl_loss import RLLossSettings

# settings class -> the block it is read from (None: not a config block; SERVE_DEFAULTS holds its values)
SETTINGS = {SFTDataConfig: "data", CollectSettings: "collect", PromptConfig: "prompt",
            RLLossSettings: "salvage.loss", ServeSettings: None}
# callable -> the config block whose keys its parameters must not default (the block holds those defaults);
# split_by_task's seed is data.split_seed
CONSTRUCTORS = {StoreWriter.__init__: "collect", RetryCollector.__init__: "collect", SFTBatches.__init__: "data",
                EncodeSFTExample.__init__: "data", encode_example: "data", split_by_task: "data"}
# parameters that share a key's name but not its meaning: StoreWriter's policy is the collecting policy's name
# (None: not recorded), collect.policy the spec a policy is built from
OTHER_MEANING = {(StoreWriter.__init__, "policy")}


def _block(path):
    node = base_config()
    for key in path.split("."):
        node = node[key]
    return node


def defaulted_fields(cls) -> list[str]:
    """Returns the fields of dataclass `cls` that carry a default or a default factory."""
    return [f.name for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING]


@pytest.mark.parametrize("cls", list(SETTINGS), ids=lambda c: c.__name__)
def test_settings_classes_take_no_defaults(cls):
    assert defaulted_fields(cls) == [], f"{cls.__name__}: its defaults belong in configs/common.py (or SERVE_DEFAULTS)"


@pytest.mark.parametrize("cls,block", [(c, b) for c, b in SETTINGS.items() if b], ids=lambda x: getattr(x, "__name__", x))
def test_settings_read_every_field_from_their_block(cls, block):
    keys = set(_block(block).keys())
    # store_dir: "" = the workdir's store; progress_label: which stage plays (from_config sets collect's);
    # replay: the recordings eval.replay plays from (from_config: none); cdp_endpoints: config.web's
    assert {f.name for f in dataclasses.fields(cls)} - {"store_dir", "progress_label", "replay", "cdp_endpoints"} <= keys
    cls.from_config(_block(block), **({"workdir": "/w"} if cls is SFTDataConfig else {}))  # the defaults are valid


@pytest.mark.parametrize("fn,block", list(CONSTRUCTORS.items()), ids=lambda x: getattr(x, "__qualname__", x))
def test_no_parameter_defaults_what_its_config_block_sets(fn, block):
    keys = set(_block(block).keys()) | ({"seed"} if fn is split_by_task else set())
    defaulted = [name for name, p in inspect.signature(fn).parameters.items()
                 if p.default is not inspect.Parameter.empty and name in keys and (fn, name) not in OTHER_MEANING]
    assert defaulted == [], f"{fn.__qualname__} defaults {defaulted}, which config.{block} already sets"


def test_the_long_constructors_take_settings_objects():
    assert list(inspect.signature(ChatServer.__init__).parameters) == ["self", "chat_model", "settings"]
    assert list(inspect.signature(RetryCollector.__init__).parameters)[-1] == "settings"
    sft = inspect.signature(SFTBatches.__init__).parameters  # the encoder carries tokenizer, images, prompt, mask
    assert "encoder" in sft and not {"tokenizer_dir", "image_config", "prompt_config"} & set(sft)


def test_the_serve_flags_take_their_defaults_from_serve_defaults():
    values = flags.FlagValues()
    define_flags(values)
    values(["serve", "--checkpoint=random:tiny"])
    assert ServeSettings.from_flags(values) == SERVE_DEFAULTS


def test_salvage_train_has_one_keep_sentinel():
    config = base_config()
    assert set(config.salvage.train.keys()) == set(TRAIN_OVERRIDES)
    assert all(config.salvage.train[k] is None for k in TRAIN_OVERRIDES)  # None keeps config.train's value
    assert with_train_overrides(config, "salvage").train.to_dict() == config.train.to_dict()
