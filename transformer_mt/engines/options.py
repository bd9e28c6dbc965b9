"""Which model translates, and how: the options `mt translate`, `mt evaluate` and `mt serve` share.

Besides the model options, :class:`TranslateExtras`: what one translation may ask beyond lines,
decode settings and a target language (prefixes, alignments, pictures, splitting, glossaries,
protected spans).

Each is declared once here (default, help, choices, option name). The command line builds its
options from these declarations (:func:`declared`), and the server's settings reuse them
(:func:`model_setting`), so that `--engine`, `--device`, `--quantize`, `--precision` and
`--target-lang` say and accept the same everywhere. Torch-free: the command line's options are
read before any model loads.
"""

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformer_mt.config import DecodeConfig, check_settings, declared_settings, setting
from transformer_mt.errors import MTError

if TYPE_CHECKING:
    from transformer_mt.text.glossary import Glossary
    from transformer_mt.text.protect import Span


# The values the model options accept: the engines (engines.engine.load_engine loads each) and
# the precisions, decode.precision's own (a checkpoint's setting, or --precision in its place).
ENGINES = ("torch", "ct2")
PRECISIONS: tuple[str, ...] = declared_settings(DecodeConfig)["precision"].choices or ()


@dataclass(frozen=True)
class ModelOptions:
    """The model options of a translating command, checked as they are built.

    Each field's default is its class attribute (``ModelOptions.device``: "cpu"), which
    :func:`~transformer_mt.engines.engine.load_engine` and the command line take as theirs."""

    engine: str = setting(
        "torch",
        "the model's engine: torch reads a checkpoint written by `mt train`, ct2 a directory "
        "written by `mt export`",
        choices=ENGINES,
        option="--engine",
    )
    device: str = setting(
        "cpu", "the model's device (auto, cpu, cuda, cuda:1 or mps)", option="--device"
    )
    quantize: str | None = setting(
        None,
        "linear layers in int8, weights rounded per output row, activations per input row (a "
        "line's output does not depend on its batch, up to float rounding; CPU, torch engine)",
        choices=("int8",),
        option="--quantize",
    )
    precision: str | None = setting(
        None,
        "the products of the linear layers (torch engine), as decode.precision; default: the "
        "checkpoint's decode.precision",
        choices=PRECISIONS,
        option="--precision",
    )
    target_lang: str | None = setting(
        None,
        "the language to translate into: needed by a model trained into several (its error "
        "lists them); /v1/model lists a served model's pairs",
        option="--target-lang",
    )

    def __post_init__(self) -> None:
        check_settings("ModelOptions", self, option_names())  # the device: when it loads


def option_names() -> dict[str, str]:
    """Each field's option, by field name: ``{"engine": "--engine", ...}``."""
    return {f.name: f.metadata["option"] for f in dataclasses.fields(ModelOptions)}


def declared(name: str) -> dataclasses.Field:
    """The declaration of the field ``name`` of :class:`ModelOptions`."""
    return next(f for f in dataclasses.fields(ModelOptions) if f.name == name)


def model_setting(name: str) -> Any:
    """The field ``name`` of :class:`ModelOptions`, for another settings class (the server's).

    The same default, help, choices and option: one declaration."""
    original = declared(name)
    return dataclasses.field(default=original.default, metadata=original.metadata)


def option_text(name: str) -> str:
    """The help of the option that sets ``name``: its declared help and the values it accepts."""
    metadata = declared(name).metadata
    text, choices = metadata["help"], metadata["choices"]
    text += f" ({' or '.join(choices)})" if choices else ""
    return text[:1].upper() + text[1:] + "."


# ISO 639-1: every two-letter language code (a three-letter one, of ISO 639-2 or -3, is taken as
# written: there are some 8,000).
ISO_639_1 = frozenset(
    """aa ab ae af ak am an ar as av ay az ba be bg bh bi bm bn bo br bs ca ce ch co cr cs cu cv
    cy da de dv dz ee el en eo es et eu fa ff fi fj fo fr fy ga gd gl gn gu gv ha he hi ho hr ht
    hu hy hz ia id ie ig ii ik io is it iu ja jv ka kg ki kj kk kl km kn ko kr ks ku kv kw ky la
    lb lg li ln lo lt lu lv mg mh mi mk ml mn mr ms mt my na nb nd ne ng nl nn no nr nv ny oc oj
    om or os pa pi pl ps pt qu rm rn ro ru rw sa sc sd se sg si sk sl sm sn so sq sr ss st su sv
    sw ta te tg th ti tk tl tn to tr ts tt tw ty ug uk ur uz ve vi vo wa wo xh yi yo za zh
    zu""".split()
)
# A language code: its language (two or three letters), then any script, region or variant
# subtags after - or _ (zh-Hant, pt_BR, sr-Latn-RS).
_LANGUAGE_CODE = re.compile(r"([A-Za-z]{2,3})(?:[-_][A-Za-z0-9]{1,8})*")


def check_source_lang(code: str, option: str = "--source-lang") -> None:
    """Refuse a source language that is neither ``auto`` nor a language code.

    ``auto`` detects each line's language; a code chooses the splitting rules
    (:func:`transformer_mt.text.split.split_text`), where a code it does not know would quietly
    get the generic rule: so a two-letter language must be one of ISO 639-1's.

    Raises:
        MTError: one line naming ``option``, e.g. ``--source-lang 'xx': not a language code``.
    """
    if code == "auto":
        return
    spelled = _LANGUAGE_CODE.fullmatch(code)
    language = spelled.group(1).lower() if spelled else ""
    if not spelled or (len(language) == 2 and language not in ISO_639_1):
        raise MTError(
            f"{option} {code!r}: not a language code; give auto or an ISO 639 code, with any "
            "region or script after - or _ (en, de, zh-Hant, pt_BR, yue)"
        )


@dataclass(frozen=True)
class TranslateExtras:
    """What a translation may ask besides lines, decode settings and a target language.

    Each is off by default. Our torch engine gives them all (pictures and alignments from one
    checkpoint, not an ensemble); the CTranslate2 engine refuses prefixes, alignments and
    pictures in one line."""

    prefixes: Sequence[str] | None = None  # one target prefix per line ("" for none)
    alignments: bool = False  # each LineResult gets its word alignments
    alignment_layer: int | None = None  # decoder layer for them (None: the mean of all)
    alignment_units: str = "pieces"  # "pieces" or "words" (engines.alignment)
    attention_dir: Path | None = None  # one cross-attention heatmap PNG per line, here
    attention_layer: int | None = None  # decoder layer for the pictures (None: the mean)
    progress: bool = False  # a progress bar (sentences) on stderr
    first_line: int = 1  # the number of the first line, in pictures and warnings
    # Cut each line into sentences, translate them, join them back (engines.paragraphs, their
    # attention joined too); lines with prefixes, alignments, pictures or terms are not cut.
    split: bool = False
    source_lang: str | None = None  # the splitting rules' language; "auto": detected a line
    glossary: "Glossary | None" = None  # terms whose targets each translation must hold (torch)
    terms: Sequence[Sequence[str]] | None = None  # or, per line, the target terms themselves
    # Carry URLs, e-mail addresses, numbers, `code` and <keep>marked</keep> spans through
    # unchanged (text.protect), as constraints of the search (torch, beam >= 2).
    protect: bool = False

    def line_terms(self, lines: Sequence[str]) -> list[list[str]] | None:
        """Per line, the target terms its translation must hold (None: no constraints)."""
        if self.terms is not None:
            if len(self.terms) != len(lines):
                raise ValueError(f"{len(self.terms)} term lists for {len(lines)} lines")
            return [list(terms) for terms in self.terms]
        if self.glossary is not None:
            return [self.glossary.targets(line) for line in lines]
        return None

    def constrained(self, lines: Sequence[str]) -> tuple[list[str], "TranslateExtras"]:
        """The lines as the model reads them, and extras with their protected spans as terms.

        With :attr:`protect`, each line loses the user's ``<keep>`` marks (the text between
        them stays; :func:`text.protect.as_constraints`), and its terms are its glossary's
        target terms (those whose source terms lie outside the protected spans: a term the user
        keeps is not translated) and its protected spans' texts, each once. Without, ``lines``
        and these extras come back unchanged."""
        if not self.protect:
            return list(lines), self
        from transformer_mt.text.protect import as_constraints

        model_lines = [as_constraints(line) for line in lines]
        given = None if self.terms is None else self.line_terms(lines)
        terms = []
        for i, (model_line, spans) in enumerate(model_lines):
            glossary = self._terms_outside(model_line, spans) if given is None else given[i]
            terms.append(list(dict.fromkeys([*glossary, *(span.text for span in spans)])))
        unmarked = [model_line for model_line, _ in model_lines]
        return unmarked, dataclasses.replace(self, protect=False, glossary=None, terms=terms)

    def _terms_outside(self, line: str, spans: Sequence["Span"]) -> list[str]:
        """The glossary's target terms of ``line`` whose source terms lie outside ``spans``."""
        if self.glossary is None:
            return []
        kept = [range(span.start, span.end) for span in spans]
        found = self.glossary.find(line)
        free = [m for m in found if not any(m.start < r.stop and r.start < m.end for r in kept)]
        return list(dict.fromkeys(m.target for m in free))

    def torch_only(self) -> str | None:
        """The first option given that only our torch engine gives, as the CLI names it."""
        for option, given in (
            ("--attention-dir", self.attention_dir is not None),
            ("--prefix-file", self.prefixes is not None),
            ("--alignments", self.alignments),
            ("--glossary", self.glossary is not None or self.terms is not None),
            ("--protect", self.protect),
        ):
            if given:
                return option
        return None

    def check_engine(self, kind: str) -> None:
        """A one-line MTError where the engine ``kind`` cannot give what these extras ask."""
        option = self.torch_only() if kind != "torch" else None
        if option in ("--glossary", "--protect"):  # CTranslate2 forces a prefix, not terms
            raise MTError(
                f"{option} needs --engine torch: CTranslate2 has no constrained search (only a "
                "target prefix); translate with the checkpoint the export came from"
            )
        if option is not None:
            raise MTError(f"{option} needs --engine torch (checkpoints, not an export)")

    def splits(self, attention: bool) -> bool:
        """Whether lines are cut into sentences (not where a per-line extra is asked).

        ``attention`` does not stop it: a line's sentences' matrices are joined into one
        (:func:`~transformer_mt.engines.paragraphs.join_attention`), given
        ``translate_split(..., attention=attention)``."""
        per_line = self.prefixes is not None or self.alignments or self.attention_dir is not None
        per_line = per_line or self.terms is not None
        return self.split and not per_line
