"""rmsweb_jax.processing.prompt_tokens against transformers' Qwen3VLProcessor and tokenizer padding."""
import json

import numpy as np
import pytest
from PIL import Image

from rmsweb_jax.processing.image import preprocess_images
from rmsweb_jax.processing.prompt_tokens import batch_left_pad, encode_multimodal, load_tokenizer


def _images(sizes):
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]


def _chat(tokenizer, n_images, add_generation_prompt=True):
    content = [{"type": "text", "text": "Step 1: click the Submit button."}]
    for i in range(n_images):
        content.insert(i, {"type": "image"})
    messages = [
        {"role": "system", "content": "You are a helpful assistant that completes tasks in a web browser."},
        {"role": "user", "content": content},
    ]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


@pytest.mark.parametrize("sizes", [[], [(40, 60)], [(720, 1280), (300, 90)], [(37, 53), (33, 3000), (256, 256)]])
def test_encode_multimodal_equals_transformers_processor(hf_tokenizer, hf_processor, sizes):
    images = _images(sizes)
    text = _chat(hf_tokenizer, len(images))
    reference = hf_processor(images=images or None, text=[text], return_tensors="np")
    _, grid = preprocess_images(images) if images else (None, np.zeros((0, 3), np.int64))

    input_ids, token_types = encode_multimodal(hf_tokenizer, text, grid, merge_size=2)

    assert input_ids.dtype == np.int32 and token_types.dtype == np.int32
    np.testing.assert_array_equal(input_ids, reference["input_ids"][0])
    np.testing.assert_array_equal(token_types, reference["mm_token_type_ids"][0])
    if images:
        np.testing.assert_array_equal(grid, reference["image_grid_thw"])


def test_placeholders_expand_in_order_to_each_images_token_count(tiny_tokenizer, hf_tokenizer):
    ids = tiny_tokenizer[1]
    text = "<|vision_start|><|image_pad|><|vision_end|>a<|vision_start|><|image_pad|><|vision_end|>"
    grid = np.array([[1, 2, 4], [1, 6, 2]])
    input_ids, token_types = encode_multimodal(hf_tokenizer, text, grid, image_token_id=ids["image_token_id"])
    starts = np.flatnonzero(input_ids == ids["vision_start_token_id"])
    ends = np.flatnonzero(input_ids == ids["vision_end_token_id"])
    assert list(ends - starts - 1) == [1 * 2 * 4 // 4, 1 * 6 * 2 // 4]
    np.testing.assert_array_equal(token_types, input_ids == ids["image_token_id"])


def test_placeholder_count_mismatch_is_refused_as_transformers_does(hf_tokenizer, hf_processor):
    images = _images([(40, 60), (50, 50)])
    text = _chat(hf_tokenizer, 1)
    with pytest.raises(ValueError, match="number of <|image_pad|>"):
        hf_processor(images=images, text=[text])
    _, grid = preprocess_images(images)
    with pytest.raises(ValueError, match=r"1 <\|image_pad\|> placeholder\(s\) but image_grid_thw has 2 image\(s\)"):
        encode_multimodal(hf_tokenizer, text, grid)
    with pytest.raises(ValueError, match="1 <.image_pad.> placeholder.s. but image_grid_thw has 0"):
        encode_multimodal(hf_tokenizer, text, None)


def test_bad_grids_and_videos_are_refused(hf_tokenizer):
    text = _chat(hf_tokenizer, 1)
    with pytest.raises(ValueError, match=r"\[num_images, 3\]"):
        encode_multimodal(hf_tokenizer, text, [1, 4, 4])
    with pytest.raises(ValueError, match="multiples of merge_size=2"):
        encode_multimodal(hf_tokenizer, text, [[1, 3, 4]])
    with pytest.raises(ValueError, match="videos are not supported"):
        encode_multimodal(hf_tokenizer, "<|vision_start|><|video_pad|><|vision_end|>", None)


def test_load_tokenizer_loads_the_saved_folder(tiny_tokenizer, hf_tokenizer):
    tok = load_tokenizer(tiny_tokenizer[0])  # Qwen2Tokenizer, named by the folder: loaded without AutoTokenizer
    text = _chat(hf_tokenizer, 2)
    assert type(tok) is type(hf_tokenizer)
    assert tok(text)["input_ids"] == hf_tokenizer(text)["input_ids"]
    assert tok.chat_template == hf_tokenizer.chat_template
    assert (len(tok), tok.eos_token_id, tok.pad_token_id, tok.all_special_tokens) == \
        (len(hf_tokenizer), hf_tokenizer.eos_token_id, hf_tokenizer.pad_token_id, hf_tokenizer.all_special_tokens)


def test_load_tokenizer_leaves_other_classes_to_auto_tokenizer(tmp_path, tiny_tokenizer):
    import shutil

    from transformers import AutoTokenizer
    folder = tmp_path / "other"
    shutil.copytree(tiny_tokenizer[0], folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load_tokenizer(folder)
    assert type(tok) is type(AutoTokenizer.from_pretrained(str(folder))) and type(tok).__name__ != "Qwen2Tokenizer"
    assert tok("Click the button")["input_ids"] == load_tokenizer(tiny_tokenizer[0])("Click the button")["input_ids"]


def test_load_tokenizer_names_a_damaged_tokenizer_config(tmp_path, tiny_tokenizer):
    import shutil
    folder = tmp_path / "damaged"
    shutil.copytree(tiny_tokenizer[0], folder)
    (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "Qwen2Tok')
    with pytest.raises(ValueError, match="damaged/tokenizer_config.json: not a JSON object"):
        load_tokenizer(folder)


def test_load_tokenizer_names_a_missing_or_empty_folder(tmp_path):
    missing = tmp_path / "no_such_checkpoint"
    with pytest.raises(FileNotFoundError, match="no_such_checkpoint.*does not exist"):
        load_tokenizer(missing)
    with pytest.raises(FileNotFoundError, match=f"{tmp_path.name}.*not a saved tokenizer"):
        load_tokenizer(tmp_path)


def test_batch_left_pad_equals_tokenizer_left_padding(hf_tokenizer, tiny_tokenizer):
    pad_id = tiny_tokenizer[1]["pad_token_id"]
    texts = ["Click", "Search for flights from Boston", "", "The page shows a list of items."]
    sequences = [hf_tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    reference = hf_tokenizer.pad({"input_ids": sequences}, padding=True, padding_side="left", return_tensors="np")

    ids, mask = batch_left_pad([np.asarray(s, np.int32) for s in sequences], pad_id)

    assert ids.dtype == np.int32 and mask.dtype == np.int32
    np.testing.assert_array_equal(ids, reference["input_ids"])
    np.testing.assert_array_equal(mask, reference["attention_mask"])


def test_batch_left_pad_to_a_fixed_length():
    ids, mask = batch_left_pad([[5, 6], [7]], pad_id=0, length=4)
    longest, _ = batch_left_pad([[5, 6], [7]], pad_id=0)
    np.testing.assert_array_equal(ids[:, -longest.shape[1]:], longest)
    assert not ids[:, :2].any() and not mask[:, :2].any()
    with pytest.raises(ValueError, match="length=1 is shorter than the longest sequence"):
        batch_left_pad([[5, 6], [7]], pad_id=0, length=1)
    with pytest.raises(ValueError, match="at least one sequence"):
        batch_left_pad([], pad_id=0)
