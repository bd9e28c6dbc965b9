"""Language codes as LibreTranslate names them: English names from langcodes, the toy corpus's own."""

import langcodes

from transformer_mt.data.toy import TOY_LANGUAGE_NAMES


def is_toy(pairs: list[tuple[str, str]]) -> bool:
    """Whether every language of ``pairs`` is one of the built-in toy corpus's."""
    return all(lang in TOY_LANGUAGE_NAMES for pair in pairs for lang in pair)


def language_name(code: str, toy: bool = False) -> str:
    """A language code's English name ("de" -> "German"), or the code where langcodes knows none.

    ``toy``: the model speaks the built-in toy corpus's languages, named as the toy names them."""
    if toy and code in TOY_LANGUAGE_NAMES:
        return TOY_LANGUAGE_NAMES[code]
    try:
        language = langcodes.Language.get(code)
    except (langcodes.LanguageTagError, ValueError):
        return code
    return language.display_name() if language.is_valid() else code
