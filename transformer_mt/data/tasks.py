"""The standard tasks by name: each a list of sources per split, fetched through those sources.

``data.corpus: wmt14_en_de`` (or a source ``{corpus: wmt14_en_de}``) stands for the training,
validation and test sources that papers on the task use. A task's training archives are
registry files (:mod:`transformer_mt.data.registry`, downloaded by our resumable downloader and
read member by member, never unpacked whole: an ``archive`` value ``CORPUS/FILE`` names the
registry corpus and its file); its test sets come through sacrebleu (whose md5
sums check them), Hugging Face ``datasets`` or mtdata. ``mt download --list`` shows them.

A task knows its two languages; a config may train either direction (``data.src_lang`` and
``data.trg_lang`` are those two). In a source mapping ``{src}`` and ``{trg}`` stand for the
config's languages, ``{pair}`` for the task's pair as its files name it (``de-en``).

Besides the fixed tasks, ``opus:CORPUS/VERSION`` names an OPUS corpus through mtdata's index
(``opus:Tatoeba/v2023-04-12``, ``opus:Europarl/v8``), and ``flores200`` FLORES-200's dev
(validation) and devtest (test) sets for any two of its languages, also through mtdata.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from transformer_mt.config import SourceConfig
from transformer_mt.errors import MTError

_Src = Mapping[str, Any]


@dataclass(frozen=True)
class Task:
    """A standard task: its languages and, per split, the sources that make it."""

    name: str
    description: str
    langs: tuple[str, ...]  # the task's two languages, in the order its files name the pair;
    # () = any two that its mtdata datasets have
    splits: Mapping[str, tuple[_Src, ...]] = field(hash=False)
    mtdata: Mapping[str, str] = field(default_factory=dict, hash=False)  # split -> the prefix
    # of the mtdata IDs that hold it, found in mtdata's index for the two languages
    status: str = "archives unverified (no published SHA-256); test sets md5-checked by sacrebleu"

    def sources(self, split: str, src: str, trg: str) -> list[SourceConfig]:
        """The split's sources for the direction ``src`` -> ``trg`` (no files touched)."""
        if split in self.mtdata:
            ident = find_mtdata_id(self.mtdata[split], src, trg)
            return [
                SourceConfig(
                    mtdata=ident, name=f"{self.name.replace(':', '-').replace('/', '-')}-{split}"
                )
            ]
        if self.langs and {src, trg} != set(self.langs):
            raise MTError(
                f"task {self.name} is {'/'.join(self.langs)}; set data.src_lang and "
                f"data.trg_lang to these two (either direction), not {src}/{trg}"
            )
        pair = "-".join(self.langs)
        return [
            SourceConfig(**{k: _fill(v, src, trg, pair) for k, v in spec.items()})
            for spec in self.splits.get(split, ())
        ]

    def summary(self) -> str:
        """One line for ``mt download --list``."""
        splits = ", ".join(f"{s} {len(v)}" for s, v in self.splits.items())
        return f"{self.name}: {self.description} (task; sources: {splits}; {self.status})"


def _fill(value: Any, src: str, trg: str, pair: str) -> Any:
    return value.format(src=src, trg=trg, pair=pair) if isinstance(value, str) else value


def _member(archive: str, stem: str, name: str) -> dict[str, str]:
    """A text pair inside a registry archive: ``<stem>.{src}`` / ``<stem>.{trg}``."""
    return {"archive": archive, "src": f"{stem}.{{src}}", "trg": f"{stem}.{{trg}}", "name": name}


TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        # fairseq's examples/translation/prepare-wmt14en2de.sh (4.5M pairs): Europarl v7,
        # CommonCrawl, News Commentary v9; newstest2013 to validate, newstest2014 to test.
        Task(
            name="wmt14_en_de",
            description="WMT14 English-German news (Europarl v7, CommonCrawl, News Commentary "
            "v9; newstest2013 / newstest2014)",
            langs=("de", "en"),
            splits={
                "train": (
                    _member(
                        "wmt14_en_de_train/training-parallel-europarl-v7.tgz",
                        "training/europarl-v7.{pair}",
                        "europarl-v7",
                    ),
                    _member(
                        "wmt14_en_de_train/training-parallel-commoncrawl.tgz",
                        "commoncrawl.{pair}",
                        "commoncrawl",
                    ),
                    _member(
                        "wmt14_en_de_train/training-parallel-nc-v9.tgz",
                        "training/news-commentary-v9.{pair}",
                        "news-commentary-v9",
                    ),
                ),
                "valid": ({"sacrebleu": "wmt13"},),
                "test": ({"sacrebleu": "wmt14/full"},),
            },
        ),
        # The WMT16 English-Romanian setup of most papers: Europarl v8 and SETIMES2;
        # newsdev2016 to validate, newstest2016 to test.
        Task(
            name="wmt16_en_ro",
            description="WMT16 English-Romanian news (Europarl v8, SETIMES2; newsdev2016 / "
            "newstest2016)",
            langs=("ro", "en"),
            splits={
                "train": (
                    _member(
                        "wmt16_en_ro_train/training-parallel-ep-v8.tgz",
                        "training-parallel-ep-v8/europarl-v8.{pair}",
                        "europarl-v8",
                    ),
                    {
                        "archive": "setimes2_en_ro/en-ro.txt.zip",
                        "src": "SETIMES.en-ro.{src}",
                        "trg": "SETIMES.en-ro.{trg}",
                        "name": "setimes2",
                    },
                ),
                "valid": ({"sacrebleu": "wmt16/dev"},),
                "test": ({"sacrebleu": "wmt16"},),
            },
        ),
        # IWSLT 2017 German-English TED talks: the training talks through Hugging Face's
        # iwslt2017 dataset; dev2010 to validate, tst2017 to test (sacrebleu).
        Task(
            name="iwslt17_de_en",
            description="IWSLT 2017 German-English TED talks (~206k pairs; dev2010 / tst2017)",
            langs=("de", "en"),
            splits={
                "train": (
                    {
                        "hf": "IWSLT/iwslt2017",
                        "hf_config": "iwslt2017-de-en",
                        "name": "iwslt17-train",
                    },
                ),
                "valid": ({"sacrebleu": "iwslt17/dev2010"},),
                "test": ({"sacrebleu": "iwslt17"},),
            },
            status="train set through Hugging Face datasets (not fetched here: no network); "
            "test sets md5-checked by sacrebleu",
        ),
    )
}


def find_task(name: str) -> Task | None:
    """The task called ``name`` (a fixed one, ``opus:CORPUS/VERSION`` or ``flores200``)."""
    if name in TASKS:
        return TASKS[name]
    if name.startswith("opus:"):
        corpus, _, version = name.removeprefix("opus:").partition("/")
        if not corpus or not version or "/" in version:
            raise MTError(
                f"{name!r}: name an OPUS corpus as opus:CORPUS/VERSION, e.g. "
                "opus:Tatoeba/v2023-04-12"
            )
        prefix = f"OPUS-{corpus.lower()}-{version.replace('-', '')}"
        return Task(
            name=name,
            description=f"OPUS {corpus} {version}",
            langs=(),
            splits={"train": ()},
            mtdata={"train": prefix},
            status="through mtdata's index and cache",
        )
    if name == "flores200":
        return FLORES200
    return None


FLORES200 = Task(
    name="flores200",
    description="FLORES-200 dev (valid) and devtest (test) for any two of its 200 languages",
    langs=(),
    splits={"valid": (), "test": ()},
    mtdata={"valid": "Flores-flores200_dev-1", "test": "Flores-flores200_devtest-1"},
    status="through mtdata's index and cache",
)


def task_names() -> list[str]:
    """The fixed task names and the patterns, for messages and ``mt download --list``."""
    return [*TASKS, "flores200", "opus:CORPUS/VERSION"]


def all_tasks() -> list[Task]:
    """The fixed tasks and FLORES-200 (``opus:CORPUS/VERSION`` is a pattern, not a task)."""
    return [*TASKS.values(), FLORES200]


def find_mtdata_id(prefix: str, src: str, trg: str) -> str:
    """The mtdata dataset ID ``<prefix>-<lang>-<lang>`` that holds ``src`` and ``trg``.

    The languages may come in either order; mtdata names them by ISO 639-3 code, with a script
    where needed: ``ace_Arab``."""
    try:
        from mtdata.index import INDEX
        from mtdata.iso import iso3_code
    except ImportError:
        raise MTError(
            f"{prefix}: reading mtdata's index needs mtdata: pip install 'transformer-mt[mtdata]'"
        ) from None
    want = {iso3_code(src, fail_error=False) or src, iso3_code(trg, fail_error=False) or trg}
    for entry in INDEX.get_entries():
        did = str(entry.did)
        if did.startswith(prefix + "-"):
            langs = did[len(prefix) + 1 :].split("-")
            if len(langs) == 2 and {lang.split("_")[0] for lang in langs} == want:
                return did
    raise MTError(
        f"mtdata has no dataset {prefix}-* for {src} and {trg}; see `mtdata list -l {src}-{trg}`"
    )
