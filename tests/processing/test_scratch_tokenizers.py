"""Tokenizers for models trained from scratch (byte-level, agent BPE): exact copying, Qwen's added tokens
and chat template, and that they travel with the checkpoint (random preset -> export -> ChatModel.load)."""
import functools
import json
import pathlib
import random

import pytest

from rmsweb_jax.collect.store_provenance import tokenizer_hash
from rmsweb_jax.processing.agent_bpe import COORDINATE_VALUES, build_agent_bpe_tokenizer
from rmsweb_jax.processing.byte_tokenizer import build_byte_tokenizer
from rmsweb_jax.processing.prompt_tokens import load_tokenizer
from rmsweb_jax.processing.tiny_tokenizer import NON_SPECIAL_ADDED_TOKENS, SPECIAL_TOKENS

BUILDERS = {"byte": build_byte_tokenizer, "agent_bpe": build_agent_bpe_tokenizer,
            "agent_bpe_coords": functools.partial(build_agent_bpe_tokenizer, coordinate_tokens=True)}


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def built(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    ids = BUILDERS[request.param](folder)
    return request.param, ids, load_tokenizer(folder)


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_byte_tokenizer_is_one_token_per_byte():
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        ids = build_byte_tokenizer(d)
        tokenizer = load_tokenizer(d)
    text = 'Type "DKkQH" → naïve 😀\n\t[512, 33]'
    assert _ids(tokenizer, text) == list(text.encode("utf-8"))
    assert ids["vocab_size"] == 256 + len(SPECIAL_TOKENS) + len(NON_SPECIAL_ADDED_TOKENS) == 265


def test_round_trip_and_added_tokens_in_qwens_order(built):
    name, ids, tokenizer = built
    rng = random.Random(0)
    alphabet = "abcXYZ 0123456789\"'{}[]:,.\n\té€😀"
    for _ in range(50):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40)))
        assert tokenizer.decode(_ids(tokenizer, text)) == text, (name, text)
    # The coordinate tokens come after Qwen's; the digits 0-9 among them were regular tokens already.
    coordinates = COORDINATE_VALUES - 10 if name == "agent_bpe_coords" else 0
    first = ids["vocab_size"] - len(SPECIAL_TOKENS) - len(NON_SPECIAL_ADDED_TOKENS) - coordinates
    for i, token in enumerate(SPECIAL_TOKENS + NON_SPECIAL_ADDED_TOKENS):
        assert tokenizer.convert_tokens_to_ids(token) == first + i and _ids(tokenizer, token) == [first + i]
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                             add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("word", ["DKkQH", "Agustina", "xq", "okay"])
def test_a_word_is_the_same_tokens_in_the_instruction_and_in_the_action(built, word):
    _, _, tokenizer = built
    instruction = _ids(tokenizer, f'Enter "{word}" into the text field and press Submit.')
    action = _ids(tokenizer, f'{{"action": "type", "text": "{word}", "coordinate": [132, 265]}}')
    alone = _ids(tokenizer, word)
    sub = lambda seq: any(seq[i:i + len(alone)] == alone for i in range(len(seq)))  # noqa: E731
    assert sub(instruction) and sub(action)
    assert tokenizer.decode(alone) == word


def test_a_coordinate_is_its_digits_or_one_token_and_the_agent_bpe_compresses_the_prompt_text(built):
    name, _, tokenizer = built
    pieces = [tokenizer.decode([t]) for t in _ids(tokenizer, "[907, 15]")]
    if name == "agent_bpe_coords":
        assert pieces == ["[", "907", ",", " ", "15", "]"]
    else:
        assert pieces[1:4] == ["9", "0", "7"]
    call = '<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [48, 306]}}\n</tool_call>'
    n = len(_ids(tokenizer, call))
    assert n <= 40 if name.startswith("agent_bpe") else n == len(call.encode()) - len("<tool_call></tool_call>") + 2


def test_coordinate_tokens_match_whole_numbers_of_the_grid_only(tmp_path):
    ids = build_agent_bpe_tokenizer(tmp_path / "coords", coordinate_tokens=True)
    tokenizer = load_tokenizer(tmp_path / "coords")
    assert ids == {**build_agent_bpe_tokenizer(tmp_path / "plain"), "vocab_size": ids["vocab_size"]}
    assert ids["vocab_size"] == 755 + COORDINATE_VALUES - 10
    for n in (0, 7, 10, 214, 999, 1000):
        assert [tokenizer.decode([t]) for t in _ids(tokenizer, f"at [{n}, 3]")][2] == str(n)
    # Outside the grid, or inside a word, a number is still its digits: a seed, a port, a word to type.
    for text, digits in (("seed 100000", "100000"), ("DK340", "340"), ("localhost:8000", "8000")):
        pieces = [tokenizer.decode([t]) for t in _ids(tokenizer, text)]
        assert "".join(pieces) == text and all(len(p) == 1 for p in pieces if p.isdigit()), pieces
        assert digits in text


@pytest.mark.parametrize("preset, vocab", [("demo", 755), ("demo_bytes", 265), ("demo_coords", 1746)])
def test_the_tokenizer_travels_with_the_checkpoint(tmp_path, preset, vocab):
    from configs.common import base_config
    from rmsweb_jax.models import qwen3_vl
    from rmsweb_jax.sampling.chat_model import ChatModel
    from rmsweb_jax.model_init import load_model
    config = base_config()
    config.model.init = f"random:{preset}"
    config.mesh.shape = (1, 1, 1)
    model, checkpoint = load_model(config, tmp_path)
    tokenizer = load_tokenizer(checkpoint)
    assert len(tokenizer) == vocab <= model.config.text.vocab_size
    assert model.config.image_token_id == tokenizer.convert_tokens_to_ids("<|image_pad|>")
    exported = qwen3_vl.to_hf(model, tmp_path / "export")  # a trained checkpoint: the trainer exports this way
    assert json.loads((pathlib.Path(exported) / "config.json").read_text())["text_config"]["vocab_size"] == \
        model.config.text.vocab_size
    chat = ChatModel.load(f"hf:{exported}", tmp_path)
    try:
        assert tokenizer_hash(chat.tokenizer) == tokenizer_hash(tokenizer)
        assert chat.stop_token_ids == (tokenizer.convert_tokens_to_ids("<|im_end|>"),)
    finally:
        chat.close()
