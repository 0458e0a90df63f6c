"""Raw HTTP requests to a ChatServer under test, and the chat bodies the server tests send."""
import base64
import http.client
import io
import json

from PIL import Image

KEY = "test-key"  # test_serve.py's server key; other servers' tests pass their own


def png_url(size=(64, 48), color=(200, 30, 30)) -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def request(server, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
            key: str | None = KEY) -> tuple[int, dict]:
    """Returns (status, decoded JSON body) of one raw HTTP request."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        h = {"Content-Type": "application/json", **(headers or {})}
        if key is not None:
            h["Authorization"] = f"Bearer {key}"
        conn.request(method, path, body=body, headers=h)
        response = conn.getresponse()
        assert response.getheader("Content-Type") == "application/json"
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def chat_body(chat_model, **overrides) -> dict:
    body = {"model": chat_model.name, "max_tokens": 6, "temperature": 0, "messages": [
        {"role": "system", "content": "You are a web agent."},
        {"role": "user", "content": [{"type": "text", "text": "Click the button."},
                                     {"type": "image_url", "image_url": {"url": png_url()}}]}]}
    body.update(overrides)
    return body


def post_chat(server, body, **kw) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return request(server, "POST", "/v1/chat/completions", data, **kw)
