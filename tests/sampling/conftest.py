"""The tiny random ChatModel every server test speaks to (one per test process: tests/sampling/tiny_chat.py)."""
import pytest

from tests.sampling.tiny_chat import tiny_chat_model


@pytest.fixture(scope="module")
def model():
    return tiny_chat_model()
