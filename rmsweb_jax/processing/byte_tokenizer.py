"""A byte-level Qwen-style tokenizer for models trained from scratch: one token per UTF-8 byte.

No merges: every string is its bytes, so a model that copies tokens copies text exactly (a random
"DKkQH" from the instruction into a `type` action, digits of a coordinate). The pipeline and
added tokens are the tiny tokenizer's (Qwen2's pre-tokenizer, byte-level decoder, `<|im_start|>`,
`<|im_end|>`, `<tool_call>`, `</tool_call>`, `<|vision_start|>`, `<|image_pad|>`, ... after the 256
byte symbols; Qwen3-VL-Instruct's chat template), saved as a `Qwen2Tokenizer` that
`AutoTokenizer.from_pretrained` loads back, and copied into every checkpoint trained with it.
"""
from __future__ import annotations

import pathlib

from rmsweb_jax.processing.tiny_tokenizer import save_qwen_style_tokenizer

BYTE_VOCAB_SIZE = 256


def byte_symbols() -> list[str]:
    """Returns the 256 byte-level symbols in byte order (GPT-2's printable mapping of bytes 0..255)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    symbols, extra = {}, 0
    for b in range(256):
        if b in printable:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def build_byte_tokenizer(out_dir: str | pathlib.Path) -> dict[str, int]:
    """Returns the special-token ids and total vocab size (265) of the byte-level tokenizer saved in
    out_dir; byte b is token id b. A model used with it needs `vocab_size >= result["vocab_size"]`."""
    vocab = {symbol: b for b, symbol in enumerate(byte_symbols())}
    return save_qwen_style_tokenizer(vocab, [], out_dir)
