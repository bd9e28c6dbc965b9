"""Where the text comes from: ``data.corpus`` -> the (source, target) files of each split.

Three kinds of source, one function each:

- ``toy``: the built-in generator (:mod:`transformer_mt.data.toy`), written once to text files;
- ``local``: the files that ``data.{train,valid,test}_{src,trg}`` name;
- a trainable registry corpus (:mod:`transformer_mt.data.registry`): its split files for
  ``data.src_lang`` / ``data.trg_lang``, downloaded once (only those six) into
  ``<data.download_dir>/<name>``.

To add a downloadable corpus, add it to the registry with its ``splits``; nothing here changes.
:func:`check_source` checks a config's source without touching the disk or the network, so that a
trainer or command can fail before any work; :func:`corpus_files` runs it first too.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from transformer_mt.config import LOCAL_FILE_KEYS, SPLITS, Config, SourceConfig
from transformer_mt.data.extract import SplitSource, resolve_source, source_label
from transformer_mt.data.languages import pair_name, source_pair
from transformer_mt.data.registry import (
    TRAINING_SPLITS,
    Corpus,
    CorpusFile,
    get_corpus,
    list_corpora,
)
from transformer_mt.data.sides import Side, check_sides, check_source_sides, language_sides
from transformer_mt.data.tasks import Task, find_task, task_names
from transformer_mt.data.toy import TOY_TARGETS, TOY_VERSION, toy_splits
from transformer_mt.errors import MTError
from transformer_mt.fileio import write_text_atomic

BUILT_IN = ("toy", "local")
"""The sources that are not registry corpora."""

SplitFiles = dict[str, tuple[Path, Path]]
"""Split name -> (source file, target file)."""


def source_names() -> list[str]:
    """Every value that ``data.corpus`` accepts.

    Every value ``data.corpus`` accepts: the built-in sources, the trainable corpora, then
    the standard tasks (:mod:`transformer_mt.data.tasks`)."""
    return [*BUILT_IN, *(c.name for c in list_corpora() if c.trainable), *task_names()]


def check_source(cfg: Config) -> None:
    """Check ``data.corpus`` and the settings it needs, without reading or downloading anything.

    Raises:
        MTError: one line naming the key: an unknown corpus (with the accepted values), a local
            corpus without a split's two files, a local file set for another corpus (which would
            ignore it), a language the corpus does not have, or a source whose two sides read
            the same input (:mod:`transformer_mt.data.sides`: one file, column, field or
            language for both).
    """
    name = cfg.data.corpus
    accepted = source_names()
    if cfg.data.train is None and find_task(name) is not None:
        check_source_sides(cfg.data, SourceConfig(corpus=name), "data")
        _check_source_languages(cfg, SourceConfig(corpus=name))
        return
    if cfg.data.train is not None:
        for split in SPLITS:  # a registry corpus among the sources: known, with both languages
            for i, source in enumerate(getattr(cfg.data, split) or []):
                check_source_sides(cfg.data, source, f"data.{split}[{i}]")
                _check_source_languages(cfg, source)
        return
    if name not in accepted:
        expected = ", ".join(accepted[:-1]) + " or " + accepted[-1]
        raise MTError(f"data.corpus={name!r}: expected {expected}")
    if name != "local":  # the files would be ignored: a forgotten `corpus: local`, most likely
        for key in LOCAL_FILE_KEYS:
            if getattr(cfg.data, key) is not None:
                raise MTError(
                    f"data.{key} is set but data.corpus is {name!r}, which does not read it; "
                    f"set data.corpus: local to train on your files, or remove data.{key}"
                )
    if name == "local":
        _local_split_paths(cfg)
    elif name == "toy":  # one file would hold both sides
        check_sides(
            *language_sides(cfg.data, SourceConfig(), "data", "toy"),
            "the toy corpus keeps each side in a file named by its language: give two codes",
        )
    else:
        _check_languages(cfg, get_corpus(name))


def split_sources(cfg: Config, progress: bool = True) -> dict[str, list[SplitSource]]:
    """Each split's sources as text file pairs.

    ``data.train`` / ``valid`` / ``test`` when the
    config lists sources (extracted or downloaded as needed), else ``data.corpus``'s one pair a
    split, labelled by the corpus's name. A split without sources (a local corpus's test) is
    left out."""
    check_source(cfg)
    if cfg.data.train is None and find_task(cfg.data.corpus) is None:
        return {
            split: [SplitSource(cfg.data.corpus, pair, 1.0, (cfg.data.src_lang, cfg.data.trg_lang))]
            for split, pair in corpus_files(cfg, progress).items()
        }
    out: dict[str, list[SplitSource]] = {}
    for split in SPLITS:
        listed = _expand_tasks(cfg, split, progress)
        pairs = [source_pair(cfg.data, s) for s in listed]
        bases = [source_label(s) for s in listed]
        # A label that two sources of different pairs share names its pair (toy.src-trg,
        # toy.src-trg2); others stay as they are, so that adding a source renames none.
        clash = {
            b for b in bases if len({p for b2, p in zip(bases, pairs, strict=True) if b2 == b}) > 1
        }
        labels = _unique(
            [
                base + (f".{pair_name(p)}" if base in clash and not s.name else "")
                for s, base, p in zip(listed, bases, pairs, strict=True)
            ]
        )
        for source, label in zip(listed, labels, strict=True):
            pair = source_pair(cfg.data, source)
            pair_cfg = for_pair(cfg, pair)
            if source.corpus == "toy":
                resolved = SplitSource(label, _toy_files(pair_cfg)[split], source.weight)
            elif source.corpus is not None:
                files = registry_split_files(
                    pair_cfg, source.corpus, source.split or split, progress
                )
                resolved = SplitSource(label, files, source.weight)
            else:
                resolved = resolve_source(pair_cfg, source, split, label)
            out.setdefault(split, []).append(dataclasses.replace(resolved, pair=pair))
    for split in ("train", "valid"):
        if split not in out:
            raise MTError(f"the config's sources have no {split} split; list data.{split}")
    return out


def _expand_tasks(cfg: Config, split: str, progress: bool) -> list[SourceConfig]:
    """The split's sources with each task replaced by its own sources, archives downloaded.

    A task is ``data.corpus: TASK`` or a source ``{corpus: TASK}``."""
    data = cfg.data
    listed = getattr(data, split) if data.train is not None else [SourceConfig(corpus=data.corpus)]
    out = []
    for source in listed or []:
        task = find_task(source.corpus) if source.corpus is not None else None
        if task is None:
            out.append(source)
            continue
        src, trg = source_pair(data, source)
        for part in task.sources(source.split or split, src, trg):
            if part.archive is not None:
                part.archive = str(_task_archive(cfg, part.archive, progress))
            part.weight, part.src_lang, part.trg_lang = source.weight, src, trg
            out.append(part)
    return out


def for_pair(cfg: Config, pair: tuple[str, str]) -> Config:
    """``cfg`` with ``data.src_lang`` / ``trg_lang`` set to ``pair`` (one source's languages)."""
    if pair == (cfg.data.src_lang, cfg.data.trg_lang):
        return cfg
    data = dataclasses.replace(cfg.data, src_lang=pair[0], trg_lang=pair[1])
    return dataclasses.replace(cfg, data=data)


def _task_archive(cfg: Config, archive: str, progress: bool) -> Path:
    """``CORPUS/FILE`` of a task's source: the registry file, downloaded once."""
    from transformer_mt.data.download import CONFIG_NAMES, download_corpus

    corpus_name, _, file_name = archive.partition("/")
    dest = Path(cfg.data.download_dir) / corpus_name
    only = [file_name]
    (path,) = download_corpus(
        corpus_name, dest, cfg.data.base_url, only=only, progress=progress, names=CONFIG_NAMES
    )
    return path


def _unique(labels: list[str]) -> list[str]:
    """The labels, a repeated one numbered (europarl, europarl.2): each names a cache entry."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label}.{seen[label]}")
    return out


def _check_source_languages(cfg: Config, source: SourceConfig) -> None:
    """A registry corpus or task source must have both languages (checked before any download)."""
    if source.corpus is None:
        return
    cfg = for_pair(cfg, source_pair(cfg.data, source))
    if source.corpus == "toy":
        return
    task = find_task(source.corpus)
    if task is not None:
        if task.langs and {cfg.data.src_lang, cfg.data.trg_lang} != set(task.langs):
            task.sources("train", cfg.data.src_lang, cfg.data.trg_lang)  # its error
        return
    if source.corpus not in source_names():
        expected = ", ".join(source_names()[len(BUILT_IN) :])
        raise MTError(f"corpus {source.corpus!r}: expected one of {expected}")
    _check_languages(cfg, get_corpus(source.corpus))


def registry_split_files(
    cfg: Config, name: str, split: str, progress: bool = True
) -> tuple[Path, Path]:
    """One split's (source, target) files of the registry corpus ``name``, downloaded once."""
    corpus = get_corpus(name)
    if split not in corpus.splits:
        raise MTError(f"corpus {name!r} has the splits {', '.join(corpus.splits)}, not {split!r}")
    return _registry_files(cfg, corpus, progress, (split,))[split]


def corpus_files(cfg: Config, progress: bool = True) -> SplitFiles:
    """The (source, target) file pair of each split, generating or downloading what is missing.

    A local corpus may leave out the test split; the other sources always have all three.
    """
    check_source(cfg)
    if cfg.data.corpus == "toy":
        return _toy_files(cfg)
    if cfg.data.corpus == "local":
        return _local_files(cfg)
    return _registry_files(cfg, get_corpus(cfg.data.corpus), progress)


# --- toy ------------------------------------------------------------------------------------------


def _toy_files(cfg: Config) -> SplitFiles:
    """Write the built-in corpus as plain text files (so users can read what the model learns).

    The files are named by language (``train.<lang>``) and the generator's English always goes
    to the source side, so each language pair has a directory of its own: a shared one would let
    one pair read another's files (``train.xx`` the target of en->xx but the source of xx->yy).
    A set with a file missing is written again whole; its contents never depend on which other
    sets exist.
    """
    data = cfg.data
    sizes = (data.toy_train_size, data.toy_valid_size, data.toy_test_size)
    out = Path(data.cache_dir) / (
        f"toy-v{TOY_VERSION}-seed{data.toy_seed}-{'-'.join(map(str, sizes))}-"
        f"{data.src_lang}-{data.trg_lang}"
    )
    files = {
        s: (out / f"{s}.{data.src_lang}", out / f"{s}.{data.trg_lang}") for s in TRAINING_SPLITS
    }
    if all(p.is_file() for pair in files.values() for p in pair):
        return files
    out.mkdir(parents=True, exist_ok=True)
    # The generator's second invented language for the code trg2, its first for any other.
    target = data.trg_lang if data.trg_lang in TOY_TARGETS else TOY_TARGETS[0]
    for split, pairs in toy_splits(*sizes, seed=data.toy_seed, target=target).items():
        for side, path in enumerate(files[split]):
            # Atomic: a killed run never leaves a half-written corpus file to be reused.
            write_text_atomic(path, "".join(p[side] + "\n" for p in pairs))
    return files


# --- local ----------------------------------------------------------------------------------------


def _local_split_paths(cfg: Config) -> SplitFiles:
    """The file pair each split names in the config; train and valid are required, test optional."""
    files: SplitFiles = {}
    for split in TRAINING_SPLITS:
        src, trg = getattr(cfg.data, f"{split}_src"), getattr(cfg.data, f"{split}_trg")
        if (src is None) != (trg is None) or (src is None and split != "test"):
            raise MTError(f"data.corpus=local needs data.{split}_src and data.{split}_trg")
        if src is not None:
            check_sides(Side(f"data.{split}_src", src, src), Side(f"data.{split}_trg", trg, trg))
            files[split] = (Path(src), Path(trg))
    return files


def _local_files(cfg: Config) -> SplitFiles:
    """The files a local corpus names, each checked now.

    Checking them all now makes a typo in ``test_src`` fail before the training split is
    tokenized rather than later in ``mt evaluate``."""
    files = _local_split_paths(cfg)
    for split, pair in files.items():
        for side, path in zip(("src", "trg"), pair, strict=True):
            if not path.is_file():
                raise MTError(f"data.{split}_{side}: {path} is not a file; check the path")
    return files


# --- registry corpora -----------------------------------------------------------------------------


def _check_languages(cfg: Config, corpus: Corpus) -> None:
    """Check that both languages have every split of the corpus, and differ.

    Both languages must have every split (checked here: the downloader's own message would
    talk about --only patterns), and they must differ."""
    langs = corpus.languages()
    for key, lang in (("src_lang", cfg.data.src_lang), ("trg_lang", cfg.data.trg_lang)):
        if lang not in langs:
            raise MTError(
                f"data.{key}={lang!r}: {corpus.name} has {'/'.join(corpus.splits.values())} only "
                f"in {', '.join(langs)}; choose one of them"
            )
    check_sides(*language_sides(cfg.data, SourceConfig(), "data", corpus.name), "pick two")


def _registry_files(
    cfg: Config, corpus: Corpus, progress: bool, splits: tuple[str, ...] = TRAINING_SPLITS
) -> SplitFiles:
    """Download (once) only the files the language pair needs, and return the unpacked ones."""
    # Imported here: urllib and tqdm are only needed when a corpus is downloaded.
    from transformer_mt.data.download import CONFIG_NAMES, download_corpus

    langs = (cfg.data.src_lang, cfg.data.trg_lang)
    split_files = {s: [corpus.split_file(s, lang) for lang in langs] for s in splits}
    names = [f.local_name for pair in split_files.values() for f in pair]
    dest = Path(cfg.data.download_dir) / corpus.name
    outputs = download_corpus(
        corpus, dest, cfg.data.base_url, only=names, progress=progress, names=CONFIG_NAMES
    )
    by_name = {p.name: p for p in outputs}  # e.g. "train.de", gunzipped beside "train.de.gz"
    return {
        split: (by_name[_unpacked(src)], by_name[_unpacked(trg)])
        for split, (src, trg) in split_files.items()
    }


def _unpacked(file: CorpusFile) -> str:
    """The name of the text file that a split's ``file`` unpacks to."""
    if file.unpacked_name is None:  # the registry refuses archives as split files
        raise MTError(f"{file.local_name}: an archive, where a split needs one text file")
    return file.unpacked_name


def fetch_task(task: Task, dest: Path, base_url: str | None) -> dict[str, list[SplitSource]]:
    """Fetch and read every split's sources of a task (`mt download TASK`).

    ``mt download TASK``: every split's sources fetched and read (archives into
    ``dest/<corpus>``, the text into ``dest/cache``), in the task's own direction."""
    if len(task.langs) != 2:
        raise MTError(
            f"{task.name} serves any two of its languages: name them in a config "
            f"(data.src_lang, data.trg_lang, data.corpus: {task.name}) and run mt prepare"
        )
    cfg = Config()
    cfg.data.corpus, (cfg.data.src_lang, cfg.data.trg_lang) = task.name, task.langs
    cfg.data.download_dir, cfg.data.cache_dir = str(dest), str(dest / "cache")
    cfg.data.base_url = base_url
    return split_sources(cfg)
