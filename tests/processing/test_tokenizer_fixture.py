"""The tiny tokenizer fixture loads offline through AutoTokenizer and behaves like Qwen's tokenizer."""
import hashlib

import hypothesis
import hypothesis.strategies as st
from transformers import AutoTokenizer

from rmsweb_jax.processing.tiny_tokenizer import NON_SPECIAL_ADDED_TOKENS, REGULAR_VOCAB_SIZE, SPECIAL_TOKENS, build_tiny_tokenizer


def test_ids_returned_are_the_loaded_tokenizers(tiny_tokenizer):
    folder, ids = tiny_tokenizer
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    assert type(tok).__name__ == "Qwen2Tokenizer"
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert ids["eos_token_id"] == tok.eos_token_id and ids["pad_token_id"] == tok.pad_token_id
    for key, token in [
        ("image_token_id", "<|image_pad|>"),
        ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"),
        ("vision_end_token_id", "<|vision_end|>"),
    ]:
        assert tok.convert_ids_to_tokens(ids[key]) == token
    assert ids["vocab_size"] == len(tok) == REGULAR_VOCAB_SIZE + len(SPECIAL_TOKENS) + len(NON_SPECIAL_ADDED_TOKENS)
    assert REGULAR_VOCAB_SIZE <= 512
    # Like Qwen's: every added token sits after the regular vocabulary, none inside it.
    assert min(tok.convert_tokens_to_ids(list(SPECIAL_TOKENS + NON_SPECIAL_ADDED_TOKENS))) == REGULAR_VOCAB_SIZE


def test_build_is_deterministic(tiny_tokenizer, tmp_path):
    folder, ids = tiny_tokenizer
    assert build_tiny_tokenizer(tmp_path) == ids
    digest = lambda p: hashlib.sha256((p / "tokenizer.json").read_bytes()).hexdigest()  # noqa: E731
    assert digest(tmp_path) == digest(folder)


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(text=st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x2FFF), max_size=80))
def test_any_text_round_trips_byte_level(hf_tokenizer, text):
    """Byte-level BPE: every string encodes to regular tokens and decodes back to its normalized form."""
    # Added tokens written in the text are parsed as such, as in Qwen's tokenizer.
    hypothesis.assume(not any(t in text for t in SPECIAL_TOKENS + NON_SPECIAL_ADDED_TOKENS))
    ids = hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert all(i < REGULAR_VOCAB_SIZE for i in ids)
    # The tokenizer's own NFC (Rust, its Unicode tables) is the reference: Python's unicodedata may
    # order combining marks of newer code points differently (seen: U+0316 U+0898).
    assert hf_tokenizer.decode(ids) == hf_tokenizer.backend_tokenizer.normalizer.normalize_str(text)


def test_special_tokens_are_single_tokens_and_corpus_words_merge(hf_tokenizer):
    for token in SPECIAL_TOKENS + NON_SPECIAL_ADDED_TOKENS:
        ids = hf_tokenizer(f"a{token}b", add_special_tokens=False)["input_ids"]
        assert len(ids) == 3 and hf_tokenizer.convert_ids_to_tokens(ids[1]) == token
    # trained merges make common words shorter than their bytes
    assert len(hf_tokenizer("Click the button", add_special_tokens=False)["input_ids"]) < len("Click the button")


def test_chat_template_renders_qwen3_vl_turns(hf_tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [
            {"type": "image"}, {"type": "text", "text": "What changed?"}, {"type": "image", "image": "b.png"},
        ]},
        {"role": "assistant", "content": "Nothing."},
        {"role": "user", "content": [{"type": "text", "text": "Sure?"}]},
    ]
    vision_block = "<|vision_start|><|image_pad|><|vision_end|>"
    text = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.count(vision_block) == 2 and text.count("<|image_pad|>") == 2
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert text.count("<|im_start|>") == 5 and text.count("<|im_end|>") == 4
    assert text.endswith("<|im_start|>assistant\n")
    assert f"<|im_start|>user\n{vision_block}What changed?{vision_block}<|im_end|>\n" in text
    without = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert without + "<|im_start|>assistant\n" == text
