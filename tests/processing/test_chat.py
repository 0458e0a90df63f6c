"""rmsweb_jax.processing.chat against the tiny tokenizer's chat template and transformers' processor."""
import base64
import io

import numpy as np
import pytest
from PIL import Image

from rmsweb_jax.processing.chat import (EncodedChat, decode_image_part, encode_chat, encode_for_training,
                                        image_url_part, png_data_url, render_chat)
from rmsweb_jax.processing.image import ImageProcessorConfig, preprocess_images
from rmsweb_jax.processing.prompt_tokens import encode_multimodal

from .hf_reference import ImageOnlyQwen3VLProcessor, hf_image_processor

SMALL = ImageProcessorConfig(min_pixels=4096, max_pixels=32768)
TARGET = ('The Submit button is below the form.\n<tool_call>\n{"name": "computer_use", "arguments": '
          '{"action": "left_click", "coordinate": [412, 530]}}\n</tool_call>')


def _png(size=(96, 64), color=(200, 30, 30), fmt="PNG") -> bytes:
    rng = np.random.default_rng(sum(size) + sum(color))
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    pixels[: size[1] // 2] = color
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, fmt)
    return buf.getvalue()


def _messages(images=((96, 64),)):
    user = [{"type": "text", "text": "Task: click the Submit button.\n"}]
    for i, size in enumerate(images):
        user += [{"type": "text", "text": f"Screenshot {i}:\n"}, image_url_part(_png(size, (10 * i, 90, 200)))]
    return [{"role": "system", "content": "You are a helpful assistant that completes tasks in a web browser."},
            {"role": "user", "content": user}]


def _hf_form(messages):
    """Returns messages with image parts as transformers' {"type": "image"} (what the template reads)."""
    out = []
    for m in messages:
        content = m["content"] if isinstance(m["content"], str) else [
            {"type": "image"} if p["type"] in ("image", "image_url") else p for p in m["content"]]
        out.append({"role": m["role"], "content": content})
    return out


# ---- image parts ----------------------------------------------------------------------------------
def test_decode_image_part_reads_data_urls_and_bytes():
    png, jpeg = _png(), _png(fmt="JPEG")
    from_url = decode_image_part(image_url_part(png))
    assert from_url.size == (96, 64)
    np.testing.assert_array_equal(np.asarray(from_url), np.asarray(Image.open(io.BytesIO(png))))
    assert decode_image_part({"type": "image", "image": png}).size == (96, 64)
    jpeg_url = "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()
    assert decode_image_part({"type": "image_url", "image_url": {"url": jpeg_url}}).format == "JPEG"
    # Some clients send image_url as the bare string.
    assert decode_image_part({"type": "image_url", "image_url": png_data_url(png)}).size == (96, 64)


@pytest.mark.parametrize("url, match", [
    ("https://example.com/a.png", "remote URL"),
    ("http://127.0.0.1/a.png", "remote URL"),
    ("file:///etc/passwd", "remote URL"),
    ("a.png", "not a data URL"),
    ("data:image/png;base64", "no ','"),
    ("data:text/plain;base64," + base64.b64encode(b"hello").decode(), "not an image type"),
    ("data:image/png," + "abc", "not base64-encoded"),
    ("data:image/png;base64,@@not base64@@", "invalid base64"),
    ("data:image/png;base64," + base64.b64encode(b"\x89PNG but not really").decode(), "not a decodable image"),
])
def test_decode_image_part_refuses_bad_urls_clearly(url, match):
    with pytest.raises(ValueError, match=match):
        decode_image_part({"type": "image_url", "image_url": {"url": url}})


def test_decode_image_part_refuses_non_image_parts():
    with pytest.raises(ValueError, match="not an image part"):
        decode_image_part({"type": "text", "text": "x"})
    with pytest.raises(ValueError, match="encoded image bytes"):
        decode_image_part({"type": "image", "image": "not bytes"})


# ---- rendering ------------------------------------------------------------------------------------
def test_render_chat_equals_the_template_with_images_in_order(hf_tokenizer):
    messages = _messages(images=((96, 64), (64, 128)))
    text, images = render_chat(hf_tokenizer, messages)
    assert text == hf_tokenizer.apply_chat_template(_hf_form(messages), tokenize=False, add_generation_prompt=True)
    assert [im.size for im in images] == [(96, 64), (64, 128)]
    assert text.count("<|image_pad|>") == 2 and text.endswith("<|im_start|>assistant\n")
    no_prompt, _ = render_chat(hf_tokenizer, messages, add_generation_prompt=False)
    assert no_prompt + "<|im_start|>assistant\n" == text


@pytest.mark.parametrize("messages, match", [
    ([], "empty"),
    ([{"role": "tool", "content": "x"}], r"messages\[0\].role is 'tool'"),
    ([{"role": "user", "content": 3}], "string or a list of parts"),
    ([{"role": "user", "content": [{"type": "audio"}]}], r"messages\[0\].content\[0\] has type 'audio'"),
    ([{"role": "user", "content": [{"type": "text", "text": None}]}], "'text' is NoneType"),
    ([{"role": "assistant", "content": [{"type": "image", "image": b"x"}]}], "only in user turns"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}],
     r"messages\[0\].content\[0\]: image_url .* remote URL"),
])
def test_render_chat_names_the_bad_message(hf_tokenizer, messages, match):
    with pytest.raises(ValueError, match=match):
        render_chat(hf_tokenizer, messages)


# ---- encoding -------------------------------------------------------------------------------------
def test_encode_chat_equals_transformers_processor(hf_tokenizer):
    messages = _messages(images=((96, 64), (300, 90)))
    encoded = encode_chat(hf_tokenizer, messages, SMALL)
    text = hf_tokenizer.apply_chat_template(_hf_form(messages), tokenize=False, add_generation_prompt=True)
    processor = ImageOnlyQwen3VLProcessor(image_processor=hf_image_processor(SMALL.min_pixels, SMALL.max_pixels),
                                          tokenizer=hf_tokenizer)
    images = [Image.open(io.BytesIO(_png(s, (10 * i, 90, 200)))) for i, s in enumerate(((96, 64), (300, 90)))]
    reference = processor(images=images, text=[text], return_tensors="np")
    assert isinstance(encoded, EncodedChat) and encoded.num_images == 2 and encoded.loss_mask is None
    assert encoded.input_ids.dtype == np.int32 and encoded.prompt_length == len(encoded.input_ids)
    np.testing.assert_array_equal(encoded.input_ids, reference["input_ids"][0])
    np.testing.assert_array_equal(encoded.token_types, reference["mm_token_type_ids"][0])
    np.testing.assert_array_equal(encoded.image_grid_thw, reference["image_grid_thw"])
    np.testing.assert_array_equal(encoded.pixel_values, reference["pixel_values"])


def test_encode_chat_without_images(hf_tokenizer):
    encoded = encode_chat(hf_tokenizer, [{"role": "user", "content": "hello world"}], SMALL)
    assert encoded.pixel_values is None and encoded.image_grid_thw is None and encoded.num_images == 0
    text = hf_tokenizer.apply_chat_template([{"role": "user", "content": "hello world"}], tokenize=False,
                                            add_generation_prompt=True)
    assert encoded.input_ids.tolist() == hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert not encoded.token_types.any()


@pytest.mark.parametrize("mask", ["thought_and_action", "action_only"])
def test_training_ids_are_the_templates_and_share_the_sampling_prefix(hf_tokenizer, mask):
    messages = _messages(images=((96, 64),))
    train = encode_for_training(hf_tokenizer, messages, TARGET, SMALL, mask=mask)
    prompt = encode_chat(hf_tokenizer, messages, SMALL)

    # Same prefix as sampling sees it.
    n = train.prompt_length
    assert n == len(prompt.input_ids)
    np.testing.assert_array_equal(train.input_ids[:n], prompt.input_ids)
    np.testing.assert_array_equal(train.token_types[:n], prompt.token_types)
    np.testing.assert_array_equal(train.pixel_values, prompt.pixel_values)

    # The whole sequence is the template's rendering of the conversation with the assistant turn.
    full = hf_tokenizer.apply_chat_template(_hf_form(messages) + [{"role": "assistant", "content": TARGET}],
                                            tokenize=False, add_generation_prompt=False)
    ids, types = encode_multimodal(hf_tokenizer, full, prompt.image_grid_thw)
    np.testing.assert_array_equal(train.input_ids, ids)
    np.testing.assert_array_equal(train.token_types, types)

    # The mask covers the target (or its tool call) and the closing <|im_end|>, nothing else.
    assert train.loss_mask.dtype == np.int32 and not train.loss_mask[:n].any()
    learned = hf_tokenizer.decode(train.input_ids[train.loss_mask == 1])
    want = TARGET if mask == "thought_and_action" else TARGET[TARGET.index("<tool_call>"):]
    assert learned == want + "<|im_end|>"
    masked = np.flatnonzero(train.loss_mask)
    assert (np.diff(masked) == 1).all(), "the learned tokens form one contiguous span"
    assert hf_tokenizer.decode(train.input_ids[masked[-1] + 1:]) == "\n"  # template's newline after the turn


def test_training_on_a_multi_turn_conversation(hf_tokenizer):
    messages = _messages() + [{"role": "assistant", "content": "First I scroll."},
                              {"role": "user", "content": "Now the button is visible."}]
    train = encode_for_training(hf_tokenizer, messages, TARGET, SMALL)
    prompt = encode_chat(hf_tokenizer, messages, SMALL)
    np.testing.assert_array_equal(train.input_ids[:train.prompt_length], prompt.input_ids)
    # The earlier assistant turn is context, not target.
    assert hf_tokenizer.decode(train.input_ids[train.loss_mask == 1]) == TARGET + "<|im_end|>"


@pytest.mark.parametrize("mask", ["thought_and_action", "action_only"])
def test_more_turns_train_every_target_of_the_conversation(hf_tokenizer, mask):
    """Several (question, answer) turns after one prompt: the ids are the template's rendering of the whole
    conversation, the sampling prefix is the first prompt's, and each target (or its tool call) + <|im_end|> is
    learned, its own span, nothing else (neither the follow-up questions nor the template's turn markers)."""
    messages = _messages(images=((96, 64),))
    second = 'And the other one.\n<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", ' \
        '"coordinate": [7, 8]}}\n</tool_call>'
    turns = [("Task: click the other button.", second), ("Task: once more.", TARGET)]
    train = encode_for_training(hf_tokenizer, messages, TARGET, SMALL, mask=mask, more_turns=turns)
    prompt = encode_chat(hf_tokenizer, messages, SMALL)
    assert train.prompt_length == len(prompt.input_ids)
    np.testing.assert_array_equal(train.input_ids[:train.prompt_length], prompt.input_ids)
    np.testing.assert_array_equal(train.pixel_values, prompt.pixel_values)

    conversation = _hf_form(messages) + [{"role": "assistant", "content": TARGET}]
    for question, answer in turns:
        conversation += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    full = hf_tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=False)
    ids, types = encode_multimodal(hf_tokenizer, full, prompt.image_grid_thw)
    np.testing.assert_array_equal(train.input_ids, ids)
    np.testing.assert_array_equal(train.token_types, types)

    masked = np.flatnonzero(train.loss_mask)
    spans = np.split(masked, np.flatnonzero(np.diff(masked) > 1) + 1)
    cut = (lambda t: t) if mask == "thought_and_action" else (lambda t: t[t.index("<tool_call>"):])
    assert [hf_tokenizer.decode(train.input_ids[s]) for s in spans] == \
        [cut(t) + "<|im_end|>" for t in (TARGET, second, TARGET)]


def test_more_turns_refuse_a_bad_target_naming_the_turn(hf_tokenizer):
    with pytest.raises(ValueError, match=r"more_turns\[1\]: the target must be a non-empty string"):
        encode_for_training(hf_tokenizer, _messages(), TARGET, SMALL, more_turns=[("q", TARGET), ("q2", " ")])


@pytest.mark.parametrize("target, kw, match", [
    ("I think so.", {"mask": "action_only"}, "needs a <tool_call>...</tool_call> span"),
    (TARGET, {"mask": "everything"}, "mask='everything'"),
    ("", {}, "non-empty"),
    (TARGET + "<|im_end|>", {}, "closes the turn itself"),
])
def test_training_refuses_bad_targets(hf_tokenizer, target, kw, match):
    with pytest.raises(ValueError, match=match):
        encode_for_training(hf_tokenizer, _messages(), target, SMALL, **kw)


def test_training_refuses_a_prompt_that_ends_with_the_answer(hf_tokenizer):
    messages = _messages() + [{"role": "assistant", "content": TARGET}]
    with pytest.raises(ValueError, match="end with an assistant turn"):
        encode_for_training(hf_tokenizer, messages, TARGET, SMALL)


def test_image_patches_are_the_image_processors(hf_tokenizer):
    png = _png((128, 72))
    encoded = encode_chat(hf_tokenizer, [{"role": "user", "content": [{"type": "image", "image": png}]}], SMALL)
    pixels, grid = preprocess_images([png], SMALL)
    np.testing.assert_array_equal(encoded.pixel_values, pixels)
    np.testing.assert_array_equal(encoded.image_grid_thw, grid)
    assert int(encoded.token_types.sum()) == int(np.prod(grid)) // 4
