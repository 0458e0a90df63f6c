"""config.salvage.train: Salvage-DS's own batch size, length and learning rate over config.train."""

import pytest

from configs.common import base_config
from rmsweb_jax.errors import UserError
from rmsweb_jax.stages.train_overrides import with_train_overrides


def test_the_defaults_keep_config_train():
    c = base_config()
    assert with_train_overrides(c, "salvage").train.to_dict() == c.train.to_dict()


def test_set_fields_replace_config_train_and_the_rest_is_kept():
    c = base_config()
    c.train.batch_size, c.train.optimizer.lr, c.train.optimizer.total_steps = 8, 3e-3, 1300
    c.salvage.train.batch_size, c.salvage.train.lr, c.salvage.train.total_steps = 24, 1e-4, 30
    c.salvage.train.warmup_steps, c.salvage.train.end_lr_fraction = 0, 1.0
    out = with_train_overrides(c, "salvage").train
    assert (out.batch_size, out.optimizer.lr, out.optimizer.total_steps) == (24, 1e-4, 30)
    assert (out.optimizer.warmup_steps, out.optimizer.end_lr_fraction) == (0, 1.0)
    assert out.optimizer.weight_decay == c.train.optimizer.weight_decay and out.checkpoint == c.train.checkpoint
    assert c.train.batch_size == 8 and c.train.optimizer.total_steps == 1300  # the config itself is untouched


@pytest.mark.parametrize("field,value", [("batch_size", -2), ("total_steps", -1), ("lr", -1e-4),
                                         ("warmup_steps", -3), ("end_lr_fraction", 1.5)])
def test_out_of_range_values_are_refused_naming_the_key(field, value):
    c = base_config()
    c.salvage.train[field] = value
    with pytest.raises(UserError, match=rf"config\.salvage\.train\.{field} = "):
        with_train_overrides(c, "salvage")


def test_an_unknown_field_is_refused():
    c = base_config()
    c.salvage.train.unlock()
    c.salvage.train.momentum = 0.9
    with pytest.raises(UserError, match=r"unknown field\(s\) \['momentum'\]"):
        with_train_overrides(c, "salvage")
