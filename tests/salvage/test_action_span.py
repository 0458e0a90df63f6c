"""processing.chat.action_token_span: the tool-call span found by token ids equals the action_only loss
mask of encode_for_training (less its <|im_end|>) on every stored example; clear errors otherwise."""
import numpy as np
import pytest

from rmsweb_jax.agents.prompt import PromptBuilder
from rmsweb_jax.processing.chat import END_OF_TURN, action_token_span, encode_chat, encode_for_training
from tests.salvage.conftest import IMAGE_CONFIG, PROMPT


def test_span_equals_the_action_only_mask_on_stored_examples(view, tokenizer):
    builder = PromptBuilder(PROMPT)
    end_id = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    for i in range(len(view)):
        ex = view[i]
        enc = encode_for_training(tokenizer, builder.messages(ex.context()), ex.target_text, IMAGE_CONFIG,
                                  mask="action_only")
        lo, hi = action_token_span(enc.input_ids, enc.prompt_length, tokenizer)
        masked = set(np.flatnonzero(enc.loss_mask).tolist())
        end = [k for k in masked if enc.input_ids[k] == end_id]
        assert len(end) == 1
        assert masked - set(end) == set(range(lo, hi))
        assert tokenizer.decode(enc.input_ids[lo:hi]) == ex.target_action_text


def test_span_ignores_tool_call_tokens_in_the_prompt(tokenizer):
    messages = [{"role": "system", "content": "Answer with <tool_call>{...}</tool_call>."},
                {"role": "user", "content": "Click OK."}]
    target = 'Clicking.\n<tool_call>\n{"name": "computer_use", "arguments": {"action": "wait"}}\n</tool_call>'
    enc = encode_for_training(tokenizer, messages, target)
    prompt = encode_chat(tokenizer, messages)
    assert tokenizer.convert_tokens_to_ids("<tool_call>") in prompt.input_ids.tolist()
    lo, hi = action_token_span(enc.input_ids, enc.prompt_length, tokenizer)
    assert lo >= enc.prompt_length and tokenizer.decode(enc.input_ids[lo:hi]) == target[target.index("<tool_call>"):]
    # From position 0 the prompt's own markers are found instead: prompt_length matters.
    assert action_token_span(enc.input_ids, 0, tokenizer)[0] < enc.prompt_length


def test_missing_or_unclosed_tool_call_raises(tokenizer):
    messages = [{"role": "user", "content": "Hi."}]
    enc = encode_for_training(tokenizer, messages, "I only think.")
    with pytest.raises(ValueError, match="holds no tool call"):
        action_token_span(enc.input_ids, enc.prompt_length, tokenizer)
    enc = encode_for_training(tokenizer, messages, 'Act.\n<tool_call>\n{"name": "x"')
    with pytest.raises(ValueError, match="never closed"):
        action_token_span(enc.input_ids, enc.prompt_length, tokenizer)
    with pytest.raises(ValueError, match="prompt_length"):
        action_token_span(enc.input_ids, len(enc.input_ids) + 1, tokenizer)
