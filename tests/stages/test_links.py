"""A workdir's stage folders: its own, or the ones its links.json names (the table's variants read the main run's
sft/, mine/ and store that way, on local disk and on a bucket alike)."""
import json
import uuid

import pytest

from configs.common import base_config
from rmsweb_jax import storage
from rmsweb_jax.errors import UserError
from rmsweb_jax.stages import links, sft


def test_a_workdir_without_a_links_file_reads_its_own_folders(tmp_path):
    assert links.read_links(tmp_path) == {} and links.folder(tmp_path, "sft") == tmp_path / "sft"
    links.write_links(tmp_path, {})  # nothing to say: no file written
    assert not (tmp_path / links.LINKS_FILE).exists()


def test_a_linked_folder_resolves_to_the_named_one_and_the_others_stay_the_workdirs(tmp_path):
    main, variant = tmp_path / "main", tmp_path / "main" / "variants" / "v"
    variant.mkdir(parents=True)
    links.write_links(variant, {"sft": main / "sft", "store": main / "store"})
    assert json.loads((variant / links.LINKS_FILE).read_text()) == {"sft": str(main / "sft"),
                                                                    "store": str(main / "store")}
    assert links.folder(variant, "sft") == main / "sft" and links.folder(variant, "mine") == variant / "mine"
    assert sft.split_path(variant) == main / "sft" / "split.json"
    config = base_config()
    assert sft.data_settings(config, variant).store_dir == str(main / "store")  # store_dir "" -> the linked one
    config.data.store_dir = "/elsewhere/store"
    assert sft.data_settings(config, variant).store_dir == "/elsewhere/store"  # a named store wins
    stamp = (variant / links.LINKS_FILE).stat().st_mtime_ns
    links.write_links(variant, {"store": main / "store", "sft": main / "sft"})  # the same links: not rewritten
    assert (variant / links.LINKS_FILE).stat().st_mtime_ns == stamp
    links.write_links(variant, {"sft": main / "sft"})
    assert links.folder(variant, "store") == variant / "store"


@pytest.mark.parametrize("text, message", [("{not json", "not JSON"), ('["sft"]', "expected an object"),
                                           ('{"sft": 3}', "expected an object")])
def test_a_broken_links_file_is_refused_naming_it(tmp_path, text, message):
    (tmp_path / links.LINKS_FILE).write_text(text)
    with pytest.raises(UserError, match=message) as e:
        links.folder(tmp_path, "sft")
    assert str(tmp_path / links.LINKS_FILE) in str(e.value)


def test_links_on_a_bucket_name_bucket_folders(gcs_emulator):
    run = f"{gcs_emulator}/{uuid.uuid4().hex}/run"
    variant = f"{run}/variants/v"
    assert str(links.folder(variant, "sft")) == f"{variant}/sft"
    links.write_links(variant, {"sft": storage.as_path(f"{run}/sft")})
    assert storage.as_path(f"{variant}/{links.LINKS_FILE}").is_file()
    got = links.folder(variant, "sft")
    assert storage.is_remote(got) and str(got) == f"{run}/sft" and links.folder(variant, "mine") == \
        storage.as_path(f"{variant}/mine")
