"""Small labelled PNG screenshots for the agent tests (real PNG bytes, drawn with PIL)."""
from __future__ import annotations

import io

from PIL import Image, ImageDraw


def labelled_png(label: str, size=(200, 100)) -> bytes:
    """Returns a PNG with a green button-like box carrying `label`."""
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    draw.rectangle([10, 10, 90, 40], fill=(30, 140, 60))
    draw.text((14, 18), label, fill="white")
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()
