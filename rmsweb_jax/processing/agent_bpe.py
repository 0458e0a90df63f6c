"""A small byte-level BPE for models trained from scratch, trained on the agent's own prompt and action text.

The byte-level tokenizer (processing/byte_tokenizer.py) spends one token per byte, and a prompt of
the demo is ~1.1k bytes: on a 2-core CPU the attention over such rows dominates a training step.
This tokenizer keeps every byte a token (any string encodes) and adds merges learnt from the text
the prompt builder and the action formatter write again and again — the compact system prompt,
the element-list lines, `{"name": "computer_use", "arguments": {"action": "left_click", ...`, the
scripted teacher's thought phrases — so a demo prompt is ~2.5x shorter.

Copying stays exact: Qwen's pre-tokenizer splits text into words, single digits and punctuation
runs before the merges apply, and a word is merged the same way wherever it appears, so a
coordinate is its digits and "DKkQH" in the instruction is the same tokens as in the `type` call.
The pipeline, added tokens and chat template are the tiny tokenizer's (saved as a Qwen2Tokenizer).
The corpus below is a frozen sample of that text: it decides only how well prompts compress,
never what they say, so the prompt builder may change without it.
"""
from __future__ import annotations

import pathlib
import random

import tokenizers
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, trainers
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

from rmsweb_jax.processing.tiny_tokenizer import merges_of, save_qwen_style_tokenizer

REGULAR_VOCAB_SIZE = 1024

_SYSTEM = (
    "Web agent: a short thought, then one computer_use call per turn; answer when done.\n<tool_call>\n"
    '{"name": "computer_use", "arguments": {"action": ...}}\n</tool_call>\n'
    "Actions: left_click(coordinate) double_click(coordinate) hover(coordinate) type(text) key(keys) "
    "scroll(direction,amount) go_back() navigate(url) wait() answer(text)\n"
    "coordinate: [x, y], 0-1000 grid over the page, [0,0] top-left.")
_USER = (
    "Task: Click on the \"Submit\" button.\nPrevious steps:\nStep 1: thought: First, I click the text box.\n"
    "  action: {\"action\": \"left_click\", \"coordinate\": [120, 340]}\n"
    "Current page: http://127.0.0.1:8000/miniwob/click-button.html (Click Button Task)\n"
    "Page elements (id, role, name, value, state, centre coordinate):\n"
    "What is the next action? Write a short thought, then one tool call.")
_ROLES = ("StaticText", "button", "textbox", "link", "checkbox", "radio", "tab", "option", "combobox", "listbox",
          "heading", "paragraph", "LabelText", "generic", "menuitem", "dialog", "img", "list", "listitem")
_STATES = ("focused", "checked", "selected", "expanded", "collapsed", "disabled")
_THOUGHTS = ("The task: {t} First, I click the \"{w}\" button.", "The task: {t} So I click the \"{w}\" link.",
             "Next, I type \"{w}\" into the text field.", "Finally, I click the \"Submit\" button.",
             "So I click the text box.", "First, I close the dialog.", "I have done everything the task asks.")
_TASKS = ("Click on the \"{w}\" button.", "Click on the link \"{w}\".", "Focus into the textbox.",
          "Enter \"{w}\" into the text field and press Submit.", "Close the dialog box by clicking the \"x\".",
          "Click the button in the dialog box labeled \"{w}\".", "Select {w} and click Submit.",
          "Switch between the tabs to find and click on the link \"{w}\".")
_WORDS = ("okay", "submit", "next", "previous", "cancel", "yes", "no", "ok", "Submit", "Cancel", "Ok", "Yes",
          "lorem", "ipsum", "dolor", "amet", "sed", "nunc", "enim", "donec", "tempus", "mauris", "justo", "felis")


def corpus(lines: int = 3000, seed: int = 0) -> list[str]:
    """Returns the training text: the constant prompt pieces, then sampled element lines, tool calls and thoughts."""
    rng = random.Random(seed)
    out = [_SYSTEM, _USER] * 20
    for _ in range(lines):
        w = rng.choice(_WORDS)
        x, y = rng.randrange(1000), rng.randrange(1000)
        state = f" {rng.choice(_STATES)}" if rng.random() < 0.2 else ""
        out.append(f"[{rng.randrange(100000)}] {rng.choice(_ROLES)} \"{w}\"{state} at [{x}, {y}]")
        action = rng.choice(("left_click", "left_click", "type", "key", "scroll", "answer"))
        args = {"left_click": f'"coordinate": [{x}, {y}]', "type": f'"text": "{w}", "coordinate": [{x}, {y}]',
                "key": '"keys": ["Enter"]', "scroll": '"direction": "down", "amount": 300',
                "answer": '"text": "done"'}[action]
        out.append(f'<tool_call>\n{{"name": "computer_use", "arguments": {{"action": "{action}", {args}}}}}\n'
                   "</tool_call>")
        task = rng.choice(_TASKS).format(w=w)
        out.append(f"Task: {task}\n" + rng.choice(_THOUGHTS).format(t=task, w=w))
    return out


def _trained_bpe() -> tokenizers.Tokenizer:
    """Returns a byte-level BPE (Qwen2's pipeline) of REGULAR_VOCAB_SIZE tokens trained on corpus()."""
    bpe = tokenizers.Tokenizer(models.BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="",
                                          fuse_unk=False))
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=REGULAR_VOCAB_SIZE, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    bpe.train_from_iterator(corpus(), trainer=trainer)
    return bpe


# Qwen's relative page grid runs 0..1000 (web/actions.py; the agent prompt says so, agents/prompt.py).
COORDINATE_VALUES = 1001


def build_agent_bpe_tokenizer(out_dir: str | pathlib.Path, *, coordinate_tokens: bool = False) -> dict[str, int]:
    """Returns the special-token ids and total vocab size of the agent BPE saved in out_dir (at most
    REGULAR_VOCAB_SIZE + 9 ids, and COORDINATE_VALUES - 10 more with coordinate_tokens; a model used with it
    needs `vocab_size >= result["vocab_size"]`).

    coordinate_tokens adds one token per coordinate value: every whole number 0..1000 becomes an added
    token that matches only as a word of its own (`single_word`), so "[214, 352]" is 2 number tokens
    where the plain agent BPE spends 6 digits, while "100000" (a seed) or "DK340" (a word to type) still
    split into digits and bytes. They come after Qwen's added tokens, so the special-token ids stay the
    plain agent BPE's; the digits 0..9 keep their regular ids."""
    bpe = _trained_bpe()
    numbers = tuple(AddedToken(str(n), special=False, normalized=False, single_word=True)
                    for n in range(COORDINATE_VALUES)) if coordinate_tokens else ()
    return save_qwen_style_tokenizer(bpe.get_vocab(), merges_of(bpe), out_dir, extra_tokens=numbers)
