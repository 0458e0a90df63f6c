"""A mined state set damaged after the mine stage completed: named when opened, and the mine stage reruns (its
manifest's fingerprint of mine/states.arrayrecord no longer holds) rather than a later stage crashing on it."""
import pytest

from configs.common import base_config
from rmsweb_jax.collect.sft_view import SFTView
from rmsweb_jax.collect.store_fixture import write_synthetic_store
from rmsweb_jax.mining.state_set import StateSet, StateSetError, write_state_set
from rmsweb_jax.stages import manifest, mine

from tests.mining.test_state_set import _state


@pytest.mark.parametrize("damage", ["truncated", "flipped"])
def test_a_damaged_state_set_is_named_on_open_and_the_mine_stage_reruns(damage, tmp_path):
    view = SFTView(write_synthetic_store(tmp_path / "store", tasks=2, seeds=1))
    config = base_config()
    decl = manifest.Declaration("mine", ("seed",), {}, dict(mine.OUTPUTS))  # mine's outputs; inputs left out
    begun = manifest.started(decl, config, tmp_path)
    path = write_state_set(tmp_path / "mine" / mine.STATES_FILE,
                           [_state(view[i], store_dir=view.store_dir) for i in range(len(view))])
    manifest.completed(decl, begun, config, tmp_path, 1.0)
    assert not manifest.decide(decl, config, tmp_path, forced=False).run
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        data = data[: len(data) * 2 // 3]
    else:
        data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    if damage == "truncated":  # a flipped byte inside a record's payload may still parse: the manifest catches it
        with pytest.raises(StateSetError, match=str(path)):
            StateSet(path)
    decision = manifest.decide(decl, config, tmp_path, forced=False)
    assert decision.run and decision.fresh
    assert decision.reason == f"its output mine/{mine.STATES_FILE} changed since it completed ({path})"
