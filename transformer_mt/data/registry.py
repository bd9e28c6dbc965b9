"""The registry of well-known corpora that ``mt download NAME`` can fetch and ``mt train`` can use.

Each corpus is a base URL plus a list of files given by their path relative to that base, so that
``--base-url`` can swap the base for a mirror (or a loopback server in tests) without touching the
paths. A file carries its SHA-256 when we have seen the original bytes; otherwise its checksum is
``None`` and the downloader says, loudly, that the file is unverified and logs the hash it got.

A corpus also says which of its files are the training, validation and test splits
(:attr:`Corpus.splits` and :attr:`Corpus.split_pattern`): that makes its name a valid
``data.corpus`` (see :mod:`transformer_mt.data.sources`). Add a corpus here only when its splits
are plain aligned text, one sentence per line; a corpus whose files need more work (XML-tagged
dev/test sets, say) needs that work written first.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Literal

from transformer_mt.errors import MTError

Unpack = Literal["gunzip", "tar", "zip", "none"]
"""How a downloaded file becomes usable: gunzip it beside itself, extract an archive, or keep it."""

UNPACK_KINDS: tuple[str, ...] = ("gunzip", "tar", "zip", "none")


@dataclass(frozen=True)
class CorpusFile:
    """One file of a corpus, as the server holds it and as it lands on disk."""

    path: str
    """Path relative to the corpus base URL, forward slashes (``data/task1/raw/train.de.gz``)."""
    sha256: str | None
    """Lower-case hex SHA-256 of the served bytes, or None when no trusted checksum is known."""
    unpack: Unpack
    """"gunzip" writes the file without ``.gz`` beside it; "tar" and "zip" extract into the
    destination; "none" keeps the file as downloaded."""
    local_name: str
    """File name in the destination directory (a plain name, no directories)."""

    def __post_init__(self) -> None:
        # Fail when the registry is built, not half-way through a download.
        if self.unpack not in UNPACK_KINDS:
            raise ValueError(f"{self.local_name}: unpack must be one of {UNPACK_KINDS}")
        name = PurePosixPath(self.local_name)
        if name.name != self.local_name or self.local_name in ("", ".", ".."):
            raise ValueError(f"local_name must be a plain file name, got {self.local_name!r}")
        if self.unpack == "gunzip" and not self.local_name.endswith(".gz"):
            raise ValueError(f"{self.local_name}: a gunzipped file must end with .gz")
        if self.sha256 is not None and (
            len(self.sha256) != 64 or any(c not in "0123456789abcdef" for c in self.sha256)
        ):
            raise ValueError(f"{self.local_name}: sha256 must be 64 lower-case hex digits")

    @property
    def verified(self) -> bool:
        """True when the registry knows the file's SHA-256."""
        return self.sha256 is not None

    def url(self, base_url: str) -> str:
        """The file's URL under ``base_url`` (a trailing slash on the base is optional)."""
        return base_url.rstrip("/") + "/" + self.path.lstrip("/")

    @property
    def unpacked_name(self) -> str | None:
        """The name of the one usable file it becomes ("x.gz" gunzips to "x"); None for archives."""
        if self.unpack == "gunzip":
            return self.local_name.removesuffix(".gz")
        return self.local_name if self.unpack == "none" else None


TRAINING_SPLITS = ("train", "valid", "test")
"""The splits a trainable corpus provides: what ``data.corpus`` turns into files."""


@dataclass(frozen=True)
class Corpus:
    """A named corpus: where it lives, which files make it up, and which of them train a model."""

    name: str
    description: str
    base_url: str
    files: tuple[CorpusFile, ...]
    splits: Mapping[str, str] = field(default_factory=dict, hash=False)
    """The corpus's own name of each training split ("valid" -> "val"); empty when the corpus
    can be downloaded but not trained on."""
    split_pattern: str = "{split}.{lang}.gz"
    """The local name of one split's file in one language, from the corpus's split name."""

    def __post_init__(self) -> None:
        if self.splits and set(self.splits) != set(TRAINING_SPLITS):
            raise ValueError(f"{self.name}: splits must name {TRAINING_SPLITS}")
        if self.splits and self.split_pattern.count("{lang}") != 1:
            raise ValueError(f"{self.name}: split_pattern must hold {{lang}} exactly once")
        for lang in self.languages():
            for split in TRAINING_SPLITS:
                if self.split_file(split, lang).unpacked_name is None:
                    raise ValueError(f"{self.name}: the {split} split cannot be an archive")

    @property
    def trainable(self) -> bool:
        """True when the registry knows the corpus's training splits (``data.corpus`` may name it)."""
        return bool(self.splits)

    def split_file(self, split: str, lang: str) -> CorpusFile:
        """The file of ``split`` ("train", "valid" or "test") in ``lang``, one of :meth:`languages`."""
        name = self.split_pattern.format(split=self.splits[split], lang=lang)
        for f in self.files:
            if f.local_name == name:
                return f
        raise KeyError(f"corpus {self.name} has no file {name}")

    def languages(self) -> list[str]:
        """The languages that have a file for every training split, sorted (none if untrainable)."""
        names = {f.local_name for f in self.files}
        per_split = []
        for split_name in self.splits.values():
            # "{split}.{lang}.gz" for "val" -> "val." and ".gz" around the language code.
            pattern = self.split_pattern.format(split=split_name, lang="{lang}")
            prefix, _, suffix = pattern.partition("{lang}")
            per_split.append(
                {
                    name[len(prefix) : len(name) - len(suffix)]
                    for name in names
                    if name.startswith(prefix) and name.endswith(suffix)
                }
            )
        return sorted(set.intersection(*per_split)) if per_split else []

    def select(self, only: Sequence[str] | None = None) -> tuple[CorpusFile, ...]:
        """The files whose local name matches any of the glob patterns in ``only`` (all if None).

        A pattern that matches nothing is a user's typo, so it fails rather than silently
        downloading less than was asked for.
        """
        if not only:
            return self.files
        names = [f.local_name for f in self.files]
        for pattern in only:
            if not fnmatch.filter(names, pattern):
                raise MTError(
                    f"--only {pattern!r} matches no file of corpus {self.name!r}; "
                    f"its files are: {', '.join(names)}"
                )
        return tuple(f for f in self.files if any(fnmatch.fnmatch(f.local_name, p) for p in only))

    def summary(self) -> str:
        """One line for ``mt download --list``."""
        n_verified = sum(f.verified for f in self.files)
        return (
            f"{self.name}: {self.description} "
            f"({len(self.files)} files, {n_verified} with a known SHA-256)"
        )


# --- Multi30k, task 1 -------------------------------------------------------------------------
# File list of data/task1/raw/ in github.com/multi30k/dataset (branch master): de, en and fr for
# every split up to test_2017_mscoco, cs for train/val/test_2016_flickr, and all four languages
# for test_2018_flickr.
_M30K_SPLITS_LANGS: dict[str, tuple[str, ...]] = {
    "train": ("de", "en", "fr", "cs"),
    "val": ("de", "en", "fr", "cs"),
    "test_2016_flickr": ("de", "en", "fr", "cs"),
    "test_2017_flickr": ("de", "en", "fr"),
    "test_2017_mscoco": ("de", "en", "fr"),
    "test_2018_flickr": ("de", "en", "fr", "cs"),
}

# Checksums of the files as github.com/multi30k/dataset serves them, taken from byte-for-byte
# copies (the SHA256SUMS of shared/data/multi30k and shared/data/multi30k-fr-cs). Every other
# Multi30k file is unverified.
_M30K_SHA256: dict[str, str] = {
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
}


def _multi30k_files() -> tuple[CorpusFile, ...]:
    files = []
    for split, langs in _M30K_SPLITS_LANGS.items():
        for lang in langs:
            name = f"{split}.{lang}.gz"
            files.append(
                CorpusFile(
                    path=f"data/task1/raw/{name}",
                    sha256=_M30K_SHA256.get(name),
                    unpack="gunzip",
                    local_name=name,
                )
            )
    return tuple(files)


MULTI30K = Corpus(
    name="multi30k",
    description="Multi30k task 1 image captions, de/en/fr/cs, 29k training pairs",
    base_url="https://github.com/multi30k/dataset/raw/master/",
    files=_multi30k_files(),
    # The usual Multi30k benchmark: test_2016_flickr is the test set most papers report on.
    splits={"train": "train", "valid": "val", "test": "test_2016_flickr"},
    split_pattern="{split}.{lang}.gz",
)

# --- archives of the standard tasks (data/tasks.py reads them member by member) -----------------
# No checksum is published for them: they are fetched unverified, with the hash logged.


def _archives(*urls: str) -> tuple[CorpusFile, ...]:
    return tuple(
        CorpusFile(path=url, sha256=None, unpack="none", local_name=url.rsplit("/", 1)[-1])
        for url in urls
    )


WMT14_EN_DE = Corpus(
    name="wmt14_en_de_train",
    description="WMT14 English-German training archives (Europarl v7, CommonCrawl, News "
    "Commentary v9; 4.5M pairs); the task wmt14_en_de trains on them",
    base_url="http://statmt.org/",
    files=_archives(
        "wmt13/training-parallel-europarl-v7.tgz",
        "wmt13/training-parallel-commoncrawl.tgz",
        "wmt14/training-parallel-nc-v9.tgz",
    ),
)

WMT16_EN_RO = Corpus(
    name="wmt16_en_ro_train",
    description="WMT16 English-Romanian training archive (Europarl v8); the task wmt16_en_ro "
    "trains on it and on setimes2_en_ro",
    base_url="http://data.statmt.org/",
    files=_archives("wmt16/translation-task/training-parallel-ep-v8.tgz"),
)

SETIMES2_EN_RO = Corpus(
    name="setimes2_en_ro",
    description="SETIMES2 English-Romanian from OPUS (Moses text files in a zip)",
    base_url="https://object.pouta.csc.fi/",
    files=_archives("OPUS-SETIMES/v2/moses/en-ro.txt.zip"),
)

_REGISTRY: dict[str, Corpus] = {
    c.name: c for c in (MULTI30K, WMT14_EN_DE, WMT16_EN_RO, SETIMES2_EN_RO)
}


def list_corpora() -> list[Corpus]:
    """All known corpora, sorted by name."""
    return [_REGISTRY[name] for name in sorted(_REGISTRY)]


def get_corpus(name: str) -> Corpus:
    """The corpus called ``name``; an unknown name raises :class:`MTError` naming the known ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise MTError(
            f"unknown corpus {name!r}; known corpora: {known} (see `mt download --list`)"
        ) from None
