"""What an engine returns, torch-free: a line's translation, its n-best and its attention.

Documents and the server read these without importing torch (or the engine that made them).
"""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from transformer_mt.engines.alignment import Alignment
from transformer_mt.text.content import has_text

StopCheck = Callable[[], bool]
"""Asked between decode batches: True to decode no further (see :class:`DecodeStopped`)."""


class DecodeStopped(Exception):
    """``translate`` gave up between two decode batches because its ``stop`` check said so."""

    def __init__(self, left: list[int], lines: int) -> None:
        super().__init__(f"stopped with {len(left)} of {lines} lines left undecoded")
        self.left = left  # indices of the input lines not decoded (lines with text in them)


def check_stop(stop: StopCheck | None, lines: Sequence[str], done: set[int]) -> None:
    """Raise :class:`DecodeStopped` if ``stop`` says so and a line with text is not in ``done``."""
    if stop is None or not stop():
        return
    left = [i for i, line in enumerate(lines) if has_text(line) and i not in done]
    if left:  # after the last batch there is nothing left to spare
        raise DecodeStopped(left, len(lines))


@dataclass
class Attention:
    """Cross-attention of one translation.

    ``weights[t][s]`` is how much target piece t looked at source piece s (rows sum to 1)."""

    source: list[str]  # source pieces, EOS included
    target: list[str]  # target pieces, EOS included when the hypothesis ended with it
    weights: list[list[float]]  # (len(target), len(source))
    prefix: int = 0  # source pieces before the text (a multilingual model's target-language tag)


@dataclass
class LineResult:
    """One input line, translated."""

    text: str  # the best translation ("" for an empty line)
    score: float  # its score (length-normalized log-probability)
    nbest: list[tuple[str, float]]  # ``decode.nbest`` (text, score) pairs, best first
    attention: Attention | None = None  # of the best hypothesis, only when asked
    # word alignments, one per n-best hypothesis (TranslateExtras.alignments), only when asked
    alignments: list[Alignment] | None = None
    # per n-best hypothesis, its log-probability and the pieces it sums over (EOS included):
    # where the engine reads them (both engines do; None for a line not decoded)
    logprobs: list[tuple[float, int]] | None = None

    def confidences(self) -> list[float] | None:
        """Per n-best hypothesis, the model's mean probability of a piece, in percent.

        ``100 * exp(log-probability / pieces)``: the geometric mean of the probabilities the
        model gave each piece it wrote (EOS included); None where the engine gives none."""
        if self.logprobs is None:
            return None
        return [round(100 * math.exp(logp / max(n, 1)), 2) for logp, n in self.logprobs]


def empty_result(nbest: int, attention: bool, line: str = "") -> LineResult:
    """The result of a line that is not decoded.

    "" for an empty line, the line itself (without surrounding whitespace) for one with nothing to
    translate; score 0.0, empty attention."""
    text = "" if has_text(line) else line.strip()
    return LineResult(
        text, 0.0, [(text, 0.0)] * nbest, Attention([], [], []) if attention else None
    )


def to_line_result(nbest: list[tuple[str, float]], attn: Attention | None) -> LineResult:
    return LineResult(nbest[0][0], float(nbest[0][1]), [(t, float(s)) for t, s in nbest], attn)
