"""The engine interface: what every engine gives, and the opening every translation shares.

:class:`Engine` is the base class of our torch engine (:mod:`~transformer_mt.engines.torch_engine`)
and the CTranslate2 one (:mod:`~transformer_mt.engines.ct2_engine`); a caller names it, and loads
one, through :mod:`transformer_mt.engines.engine`. It lives apart from that module so that the
engines can subclass it while ``load_engine`` there imports them without a circle.
"""

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from transformer_mt.config import DecodeConfig
from transformer_mt.data.languages import source_prefix
from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.decoding.continuous import ContinuousSearch
from transformer_mt.decoding.score import PairScore
from transformer_mt.engines.options import TranslateExtras
from transformer_mt.engines.paragraphs import translate_split
from transformer_mt.engines.results import LineResult, StopCheck
from transformer_mt.errors import MTError


@dataclass
class Engine(ABC):
    """What the server needs of a model.

    Its languages, tokenizers, decode defaults, a description, and :meth:`translate`, whose
    engine-specific part each engine implements in :meth:`_translate`
    (:class:`~transformer_mt.engines.torch_engine.TorchEngine`,
    :class:`~transformer_mt.engines.ct2_engine.CT2Engine`)."""

    name: str  # "torch" or "ct2"
    src_tok: Tokenizer
    trg_tok: Tokenizer
    decode: DecodeConfig  # the model's decode defaults (beam, length penalty, batch tokens)
    src_lang: str
    trg_lang: str
    info: dict[str, Any] = field(default_factory=dict)  # GET /v1/model, besides the above
    max_src_len: int = 0  # longest source in pieces, EOS included (the position table); 0: any
    pairs: list[tuple[str, str]] = field(default_factory=list)  # the pairs it translates
    lang_tags: dict[str, str] = field(default_factory=dict)  # a multilingual model's tags
    model_decode: DecodeConfig | None = None  # the run's own, where they differ from decode

    def __post_init__(self) -> None:
        if not self.pairs:  # a model that lists no pairs translates its one pair
            self.pairs = [(self.src_lang, self.trg_lang)]

    @property
    def run_decode(self) -> DecodeConfig:
        """The run's own decode settings: `mt translate`'s defaults.

        ``decode`` is the server's: the same with one best and no sampling."""
        return self.model_decode or self.decode

    @property
    def targets(self) -> list[str]:
        """The languages it translates into (several: a request names one)."""
        return list(dict.fromkeys(trg for _, trg in self.pairs))

    def source_prefix(self, target: str | None, name: str = "--target-lang") -> list[int]:
        """The ids that start each source asking for ``target`` (a multilingual model's tag).

        An MTError, calling the target ``name``, for a target it does not know, or for none
        where it has several.
        """
        return source_prefix(self.src_tok, self.lang_tags, self.pairs, target, name)

    def translate(
        self,
        lines: Sequence[str],
        decode: DecodeConfig,
        attention: bool = False,
        stop: StopCheck | None = None,
        target: str | None = None,
        extras: TranslateExtras | None = None,
    ) -> list[LineResult]:
        """Translate ``lines`` with ``decode``: one result per line, in order (empty in, empty out).

        Each :class:`LineResult` holds the best text and score and the ``decode.nbest`` list; a
        line with nothing to translate (emoji, numbers, a link alone) comes back unchanged,
        without decoding. With ``attention``, the best hypothesis' cross-attention over its
        source pieces. ``stop`` is asked after each decode batch; when it says True and lines
        are left, :class:`~transformer_mt.engines.results.DecodeStopped` names them.
        ``target``: the language a multilingual model translates into. ``extras``: what
        `mt translate` may ask besides (:class:`TranslateExtras`); an engine that cannot give
        one says so in a one-line MTError.

        The opening every engine shares is here (the extras checked against the engine; with
        ``extras.split``, lines cut into sentences and joined back by
        :func:`~transformer_mt.engines.paragraphs.translate_split`, which calls this method
        again; with ``extras.protect``, each line's protected spans made terms of the search:
        :meth:`TranslateExtras.constrained`); the rest is the engine's :meth:`_translate`.
        """
        extras = extras or TranslateExtras()
        extras.check_engine(self.name)
        if extras.splits(attention):
            return translate_split(self, lines, decode, stop, target, extras, attention)
        # Protected spans (per sentence: the split branch above re-enters here): the lines as the
        # model reads them, and their spans as terms of the constrained search.
        lines, extras = extras.constrained(lines)
        return self._translate(lines, decode, attention, stop, target, extras)

    @abstractmethod
    def _translate(
        self,
        lines: Sequence[str],
        decode: DecodeConfig,
        attention: bool,
        stop: StopCheck | None,
        target: str | None,
        extras: TranslateExtras,
    ) -> list[LineResult]:
        """The engine's own part of :meth:`translate`: ``lines`` as they are, extras checked."""

    def score(
        self,
        sources: Sequence[str],
        targets: Sequence[str],
        batch_tokens: int,
        progress: bool = False,
        target: str | None = None,
    ) -> list[PairScore | None]:
        """Forced decoding: each target's log-probability given its source (`mt score`).

        None for a pair with an empty side. Our torch engine computes it; others say they
        cannot."""
        raise MTError(f"forced decoding (mt score) needs --engine torch, not {self.name}")

    def continuous_search(self, decode: DecodeConfig) -> ContinuousSearch | None:
        """A search that requests with ``decode``'s beam can join between steps.

        Continuous batching, see :mod:`~transformer_mt.serve.batcher`); None where this engine
        has none (then requests decode in batches through :meth:`translate`)."""
        return None

    def too_long(self, lines: Sequence[str]) -> tuple[int, int] | None:
        """The first line longer than the model takes, and its pieces (EOS included), or None.

        ``mt translate`` cuts such a line with a warning; a server refuses it instead."""
        if not self.max_src_len:
            return None
        texts = [line.strip() for line in lines]
        for i, ids in enumerate(self.src_tok.encode_batch(texts)):
            if len(ids) + 1 > self.max_src_len:
                return i, len(ids) + 1
        return None

    def count_tokens(self, lines: Sequence[str]) -> int:
        """Source pieces of ``lines`` (EOS included): what a batch's token budget counts."""
        texts = [line.strip() for line in lines]
        return sum(len(ids) + 1 for ids in self.src_tok.encode_batch(texts) if ids)

    def describe(self) -> dict[str, Any]:
        """The body of GET /v1/model."""
        return {
            "engine": self.name,
            "languages": {"source": self.src_lang, "target": self.trg_lang},
            "pairs": [list(pair) for pair in self.pairs],
            "lang_tags": self.lang_tags,
            "vocabulary": {
                "source": self.src_tok.vocab_size,
                "target": self.trg_tok.vocab_size,
                "joint": self.src_tok is self.trg_tok,
            },
            "decode": {
                "beam_size": self.decode.beam_size,
                "nbest": self.decode.nbest,
                "len_penalty": self.decode.len_penalty,
                "max_len_a": self.decode.max_len_a,
                "max_len_b": self.decode.max_len_b,
                "batch_tokens": self.decode.batch_tokens,
            },
            **self.info,
        }
