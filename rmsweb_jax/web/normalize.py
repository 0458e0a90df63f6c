"""Text, answer, URL and key normalization shared by actions, semantic targets and same_action."""
from __future__ import annotations

import re
import unicodedata
import urllib.parse

_SPACE = re.compile(r"\s+")
# Quotes and sentence punctuation that wrap answers without changing their meaning.
_ANSWER_EDGES = " \t\n\r\"'`.,;:!?“”‘’«»()[]{}"

# Model-facing key names (lower case) -> Playwright key names. Qwen-style models write
# "ctrl", "enter", "pagedown"; Playwright wants "Control", "Enter", "PageDown".
KEY_ALIASES: dict[str, str] = {
    "ctrl": "Control", "control": "Control", "alt": "Alt", "option": "Alt", "shift": "Shift",
    "meta": "Meta", "cmd": "Meta", "command": "Meta", "super": "Meta", "win": "Meta",
    "enter": "Enter", "return": "Enter", "tab": "Tab", "esc": "Escape", "escape": "Escape",
    "backspace": "Backspace", "delete": "Delete", "del": "Delete", "insert": "Insert",
    "space": "Space", "spacebar": "Space", "home": "Home", "end": "End",
    "pageup": "PageUp", "page_up": "PageUp", "pagedown": "PageDown", "page_down": "PageDown",
    "up": "ArrowUp", "arrowup": "ArrowUp", "down": "ArrowDown", "arrowdown": "ArrowDown",
    "left": "ArrowLeft", "arrowleft": "ArrowLeft", "right": "ArrowRight", "arrowright": "ArrowRight",
    "capslock": "CapsLock", "contextmenu": "ContextMenu",
    **{f"f{i}": f"F{i}" for i in range(1, 13)},
}
_MODIFIERS = ("Control", "Alt", "Shift", "Meta")


def normalize_text(text: str) -> str:
    """Returns `text` in NFKC with runs of whitespace collapsed to one space and the ends trimmed."""
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", text)).strip()


def normalize_answer(text: str) -> str:
    """Returns `text` normalized for answer comparison: NFKC, case-folded, whitespace collapsed,
    wrapping quotes and trailing punctuation removed."""
    return normalize_text(text).casefold().strip(_ANSWER_EDGES)


def normalize_url(url: str) -> str:
    """Returns a canonical form of `url`: https:// added when the scheme is missing, scheme and
    host lower-cased, `www.` and default ports dropped, fragment dropped, query sorted, and a
    trailing slash removed from the path."""
    url = url.strip()
    if "://" not in url and not url.startswith(("about:", "data:", "javascript:")):
        url = "https://" + url
    try:
        parts = urllib.parse.urlsplit(url)
        host = (parts.hostname or "").lower()
        port = parts.port
    except ValueError:  # e.g. a port that is not a number: compare the raw text instead
        return url
    if host.startswith("www."):
        host = host[4:]
    scheme = parts.scheme.lower()
    netloc = host if port is None or (scheme, port) in (("http", 80), ("https", 443)) else f"{host}:{port}"
    path = parts.path.rstrip("/")
    query = urllib.parse.urlencode(sorted(urllib.parse.parse_qsl(parts.query, keep_blank_values=True)))
    return urllib.parse.urlunsplit((scheme, netloc, path, query, ""))


def playwright_key(name: str) -> str | None:
    """Returns the Playwright name for one model-written key (`"ctrl"` -> `"Control"`), or None
    when the name is not a key Playwright can press."""
    if len(name) == 1 and name.isprintable():
        return name
    alias = KEY_ALIASES.get(name.strip().lower().replace(" ", ""))
    return alias


def key_combo(keys: tuple[str, ...] | list[str]) -> str:
    """Returns the Playwright chord for `keys` (`["ctrl", "a"]` -> `"Control+a"`), modifiers first.

    Raises ValueError naming the first key that is not a known key.
    """
    names = []
    for key in keys:
        mapped = playwright_key(key)
        if mapped is None:
            raise ValueError(f"unknown key {key!r}; expected one character or one of {sorted(KEY_ALIASES)}")
        names.append(mapped)
    modifiers = [k for k in _MODIFIERS if k in names]
    others = [k for k in names if k not in _MODIFIERS]
    return "+".join(modifiers + others)


def normalize_keys(keys: tuple[str, ...] | list[str]) -> str:
    """Returns a canonical, case-insensitive chord for comparing key actions (`"control+a"`)."""
    return key_combo(keys).lower()
