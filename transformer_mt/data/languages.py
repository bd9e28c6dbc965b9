"""The language pairs of a config, and the target-language tags of a multilingual model.

One model may translate several pairs (Johnson et al., 2017): its training sources name their
languages (``{src_lang: fr, trg_lang: en}``), and when they have more than one target language,
each source sentence starts with a tag naming the language to translate into (``<2en>``). The
tag is a user-defined symbol of the sentencepiece model: one piece, never split, and never
emitted by decoding. Its id is put before the source's ids (:func:`source_prefix`), never cut
from text: a source line that holds ``<2de>`` is translated as text (the
:class:`~transformer_mt.data.tokenizer.Tokenizer` cuts text without the tags). A model with one
target language (one pair, or many-to-one) has no tags: its sources are read exactly as a
bilingual model's.

Everything here is derived from the config alone, so a checkpoint (which stores its config)
knows its pairs and tags without any other record.
"""

from __future__ import annotations

from transformer_mt.config import DataConfig, SourceConfig
from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.errors import MTError

Pair = tuple[str, str]


def lang_tag(lang: str) -> str:
    """The tag that asks for a translation into ``lang``: ``<2en>``."""
    return f"<2{lang}>"


def source_pair(data: DataConfig, source: SourceConfig) -> Pair:
    """(source language, target language) of one listed source."""
    return source.src_lang or data.src_lang, source.trg_lang or data.trg_lang


def pair_name(pair: Pair) -> str:
    """``de-en``: how metrics, logs and caches name a pair."""
    return f"{pair[0]}-{pair[1]}"


def training_pairs(data: DataConfig) -> list[Pair]:
    """The pairs the training sources hold, in the order they are first listed."""
    if data.train is None:
        return [(data.src_lang, data.trg_lang)]
    pairs: list[Pair] = []
    for source in data.train:
        pair = source_pair(data, source)
        if pair not in pairs:
            pairs.append(pair)
    return pairs


def target_tags(data: DataConfig) -> dict[str, str]:
    """Target language -> its tag, for a model with several targets; empty for one target."""
    targets = sorted({trg for _, trg in training_pairs(data)})
    return {lang: lang_tag(lang) for lang in targets} if len(targets) > 1 else {}


def source_prefix(
    src_tok: Tokenizer,
    tags: dict[str, str],
    pairs: list[Pair],
    target: str | None,
    name: str = "--target-lang",
) -> list[int]:
    """The ids that start every source asking a model for ``target`` (``--target-lang``).

    The tag of a model that has tags; nothing for one that has none. Errors call the target
    ``name`` (the caller's option or field).

    Raises:
        MTError: ``target`` is not among the model's targets, or is missing where the model has
            several.
    """
    targets = list(tags) or sorted({trg for _, trg in pairs})
    if target is None:
        if len(targets) > 1:
            raise MTError(f"the model translates into {', '.join(targets)}: choose one with {name}")
        target = targets[0]
    if target not in targets:
        raise MTError(f"{name} {target}: the model translates into {', '.join(targets)} only")
    if not tags:
        return []
    tag_id = src_tok.piece_id(tags[target])
    if tag_id is None:
        raise MTError(f"the model's tokenizer has no piece {tags[target]}; a damaged checkpoint")
    return [tag_id]


def model_pairs(data: DataConfig, tags: dict[str, str]) -> list[Pair]:
    """The language pairs a trained model translates.

    The pairs a trained model translates: its config's, and, for a model with tags (one
    fine-tuned on fewer pairs keeps them all), each of its sources into every tagged target."""
    pairs = training_pairs(data)
    for src in dict.fromkeys(s for s, _ in training_pairs(data)):
        pairs += [(src, trg) for trg in tags if (src, trg) not in pairs and trg != src]
    return pairs


def tag_ids(trg_tok: Tokenizer, tags: dict[str, str]) -> tuple[int, ...]:
    """The target-vocabulary ids of the language tags: what search must never emit.

    Never emitting them keeps tags out of every translation. A separate target vocabulary has no
    tags, so it gives none."""
    ids = (trg_tok.piece_id(tag) for tag in tags.values())
    return tuple(sorted(i for i in ids if i is not None))
