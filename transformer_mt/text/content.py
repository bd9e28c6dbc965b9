"""Whether a line has anything to translate: a letter outside links.

Torch-free, so that documents, the server's request checks and the line contract of
:mod:`transformer_mt.decoding.text` share one rule.
"""

import unicodedata
from collections.abc import Sequence
from urllib.parse import urlsplit

LINK_SCHEMES = frozenset({"http", "https", "ftp", "ftps", "mailto", "file", "tel"})
_WRAPPING = "\"'()[]{}<>.,;:!?\u00ab\u00bb\u201c\u201d\u2018\u2019"  # around a link in prose


def has_text(line: str) -> bool:
    """True when ``line`` has a word a model should translate: a letter outside links.

    False for a line of emoji, punctuation, symbols or numbers alone (``"🙂"``, ``"--"``,
    ``"3.14"``), or of links alone (``https://example.com/a``, ``www.example.com``,
    ``someone@example.com``): such a line is its own translation. Letters are Unicode's
    (category L*), so every script counts.
    """
    for word in line.split():
        if any(unicodedata.category(ch).startswith("L") for ch in word) and not is_link(word):
            return True
    return False


def is_link(word: str) -> bool:
    """Whether ``word`` is a URL or an e-mail address.

    Whether ``word`` (no whitespace) is a URL or an e-mail address, possibly in brackets or
    followed by punctuation."""
    word = word.strip(_WRAPPING)
    if word.lower().startswith("www.") and "." in word[4:]:
        return True
    try:
        parts = urlsplit(word)
    except ValueError:  # e.g. an unbalanced "[" in what looked like a host
        return False
    if parts.scheme.lower() in LINK_SCHEMES and (parts.netloc or parts.path):
        return True
    user, at, host = word.partition("@")
    return bool(at and user and "." in host.strip(".") and "@" not in host)


def untranslatable(lines: Sequence[str]) -> dict[int, str]:
    """The lines with something in them but nothing to translate (not :func:`has_text`).

    Returns them by index, each mapped to its text without surrounding whitespace, which is its
    translation."""
    return {i: line.strip() for i, line in enumerate(lines) if line.strip() and not has_text(line)}
