"""Which characters make up words in scripts that separate words by spaces.

Chinese, Japanese, Korean, Thai, Lao, Khmer and Burmese write words without spaces between
them, so a word boundary cannot be told from the characters around a term; everywhere else a
letter or a digit next to a term means the term is part of a longer word.
"""

import unicodedata

_NO_SPACE_SCRIPTS = (
    (0x0E00, 0x0EFF),  # Thai, Lao
    (0x1000, 0x109F),  # Myanmar
    (0x1780, 0x17FF),  # Khmer
    (0x2E80, 0x9FFF),  # CJK radicals, punctuation, kana, CJK ideographs
    (0xAC00, 0xD7AF),  # Hangul syllables
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0xFE30, 0xFE4F),  # CJK compatibility forms (vertical punctuation)
    (0xFF00, 0xFFEF),  # full-width forms, half-width katakana
    (0x20000, 0x3FFFF),  # CJK extensions
)
NO_SPACE_CLASS = "".join(f"{chr(lo)}-{chr(hi)}" for lo, hi in _NO_SPACE_SCRIPTS)
"""The characters of those scripts (letters and punctuation), as the inside of a regex class."""


def is_word_char(ch: str) -> bool:
    """Whether ``ch`` is a letter or digit of a script that separates words by spaces."""
    if not ch.isalnum():
        return False
    code = ord(ch)
    return not any(lo <= code <= hi for lo, hi in _NO_SPACE_SCRIPTS)


def continues_word(ch: str) -> bool:
    """Whether ``ch`` after a word character belongs to the same word (a letter, digit or mark)."""
    return is_word_char(ch) or unicodedata.category(ch) in ("Mn", "Mc")
