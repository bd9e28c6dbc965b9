"""Corpora from sacrebleu, mtdata and Hugging Face datasets, read offline from their caches.

Each source is read through its library's own code, from a cache laid out as that library lays
it out. Each library reads its cache location and offline switch when it is imported, so each one's
scenario runs once, in a child Python (this file run as a script) with its own environment, and
the tests check what it reported. Nothing is downloaded: a wrong layout would make the library
try to, and fail.
"""

from __future__ import annotations

import gzip
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from transformer_mt.data.external import (
    hf_identity,
    hf_pairs,
    mtdata_identity,
    mtdata_pairs,
    one_line,
    sacrebleu_identity,
    sacrebleu_pairs,
)
from transformer_mt.data.tasks import find_mtdata_id
from transformer_mt.errors import MTError

Report = dict[str, Any]

GERMAN = ["Gutach: Noch mehr Sicherheit für Fußgänger", "Sie stehen keine 100 Meter voneinander"]
ENGLISH = ["Gutach: Increased safety for pedestrians", "They are not even 100 metres apart"]
MTDATA_ID = "Statmt-news_commentary-16-deu-eng"
MTDATA_BROKEN_ID = "Statmt-news_commentary-16-deu-fra"


def _outcome(read: Callable[[], Iterable[tuple[str, str]]]) -> list[list[str]] | str:
    """The pairs that ``read()`` gives, or the message of its MTError."""
    try:
        return [list(pair) for pair in read()]
    except MTError as exc:
        return f"MTError: {exc}"


# --- the scenarios, run in a child process --------------------------------------------------------


def _sgm(segments: list[str]) -> str:
    """A WMT "SGML" file of one document, as the WMT test sets until 2020 were written."""
    segs = "".join(f'<seg id="{i}">{s}</seg>\n' for i, s in enumerate(segments, start=1))
    doc = '<doc docid="1" genre="news" origlang="de">'
    return f'<srcset setid="newstest2014">\n{doc}\n{segs}</doc>\n</srcset>\n'


def _sacrebleu_scenario(work: Path) -> Report:
    """Read wmt14/full from a sacrebleu cache as sacrebleu leaves it after its download.

    That is the tarball in ``raw/`` (named ``<set>.<URL's file name>``; sacrebleu fetches nothing
    while it is there) and its unpacked SGML files, which sacrebleu converts to text files on
    first use.
    """
    from sacrebleu.dataset import DATASETS
    from sacrebleu.utils import SACREBLEU_DIR

    dataset = DATASETS["wmt14/full"]
    raw = Path(SACREBLEU_DIR) / "wmt14" / "full" / "raw"
    text = {"de": GERMAN, "en": ENGLISH}
    for langpair in ("de-en", "en-de"):
        for file, lang in zip(dataset.langpairs[langpair], langpair.split("-"), strict=True):
            (raw / file).parent.mkdir(parents=True, exist_ok=True)
            (raw / file).write_text(_sgm(text[lang]), encoding="utf-8")
    with tarfile.open(raw / f"wmt14_full.{Path(dataset.data[0]).name}", "w:gz") as tar:
        tar.add(raw / "test-full", arcname="test-full")

    report: Report = {
        "de-en": _outcome(lambda: sacrebleu_pairs("wmt14/full", "de", "en")),
        "en-de": _outcome(lambda: sacrebleu_pairs("wmt14/full", "en", "de")),
        "unknown set": _outcome(lambda: sacrebleu_pairs("wmt14/ful", "de", "en")),
        "missing pair": _outcome(lambda: sacrebleu_pairs("wmt14/full", "de", "fr")),
        "identity": [
            sacrebleu_identity("wmt14/full", "de", "en"),
            sacrebleu_identity("wmt14/full", "en", "de"),
        ],
        "md5": dataset.md5[0],
        "converted": sorted(p.name for p in raw.parent.glob("wmt14_full.*")),
    }
    # A conversion cut short leaves a reference shorter than its source; sacrebleu reuses it.
    reference = Path(dataset.get_reference_files("de-en")[0])
    reference.write_text(ENGLISH[0] + "\n", encoding="utf-8")
    report["cut short"] = _outcome(lambda: sacrebleu_pairs("wmt14/full", "de", "en"))
    return report


def _mtdata_scenario(work: Path) -> Report:
    """Read news-commentary v16 de-en (and a broken de-fr) from mtdata's cache.

    Each TSV is where mtdata's ``Cache`` puts a download, with the ``._valid`` flag file that
    marks a finished one.
    """
    from mtdata import cache_dir
    from mtdata.cache import Cache
    from mtdata.entry import DatasetId
    from mtdata.index import INDEX

    cache = Cache(cache_dir)
    lines = {
        MTDATA_ID: [
            f"{GERMAN[0]}\t{ENGLISH[0]}",
            f"{GERMAN[1]}\u2028zwei\t{ENGLISH[1]}\x0btwo ",  # line separators inside
            f"\t{ENGLISH[0]}",  # an empty side: kept, so that the order stays
        ],
        MTDATA_BROKEN_ID: [f"{GERMAN[0]}\t{ENGLISH[0]}", "a line without its tab"],
    }
    for dataset_id, text in lines.items():
        entry = INDEX[DatasetId.parse(dataset_id)]
        local = cache.get_local_path(entry.url, filename=entry.filename, fix_missing=False)
        local.parent.mkdir(parents=True)
        with gzip.open(local, "wt", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in text))
        cache.get_flag_file(local).touch()

    root = logging.getLogger()  # mtdata's own calls above configured it; start afresh
    root.handlers.clear()
    root.setLevel(logging.WARNING)
    flipped = "Statmt-news_commentary-16-eng-deu"
    report: Report = {
        "de-en": _outcome(lambda: mtdata_pairs(MTDATA_ID, "de", "en")),
        "en-de": _outcome(lambda: mtdata_pairs(MTDATA_ID, "en", "de")),
        "ISO 639-3": _outcome(lambda: mtdata_pairs(MTDATA_ID, "deu", "eng")),
        "flipped ID": _outcome(lambda: mtdata_pairs(flipped, "de", "en")),
        "unknown ID": _outcome(
            lambda: mtdata_pairs("Statmt-news_comentary-16-deu-eng", "de", "en")
        ),
        "malformed ID": _outcome(lambda: mtdata_pairs("news_commentary", "de", "en")),
        "other pair": _outcome(lambda: mtdata_pairs(MTDATA_ID, "de", "fr")),
        "one language": _outcome(lambda: mtdata_pairs(MTDATA_ID, "de", "deu")),
        "broken record": _outcome(lambda: mtdata_pairs(MTDATA_BROKEN_ID, "de", "fr")),
        "task IDs": [  # data/tasks.py finds FLORES-200 and OPUS datasets in mtdata's index
            find_mtdata_id("Flores-flores200_dev-1", "de", "en"),
            find_mtdata_id("Flores-flores200_devtest-1", "en", "fr"),
            find_mtdata_id("OPUS-tatoeba-v2", "de", "en"),
            _outcome(lambda: [(find_mtdata_id("Flores-flores200_dev-1", "de", "xx"), "")]),
        ],
        "identity": [
            mtdata_identity(MTDATA_ID, "de", "en"),
            mtdata_identity(MTDATA_ID, "en", "de"),
        ],
    }
    report["root logger"] = [[type(h).__name__ for h in root.handlers], root.level]
    return report


def _hub_cache(datasets: Any, work: Path, parquet: Path) -> None:
    """Put ``someone/wmt_tiny`` (config de-en) in the datasets cache as a Hub download would.

    A download leaves ``someone___wmt_tiny/de-en/0.0.0/<hash>/wmt_tiny-train.arrow``. datasets
    writes those files for a local copy of the repository named ``wmt_tiny`` under ``wmt_tiny/``;
    they are moved to the namespaced directory.
    """
    repo = work / "repo" / "wmt_tiny"
    (repo / "de-en").mkdir(parents=True)
    shutil.copy(parquet, repo / "de-en" / "train.parquet")
    (repo / "README.md").write_text(
        "---\nconfigs:\n- config_name: de-en\n  data_files:\n"
        "  - split: train\n    path: de-en/train.parquet\n---\n"
    )
    datasets.load_dataset(str(repo), "de-en", split="train")
    cache = Path(datasets.config.HF_DATASETS_CACHE)
    (cache / "wmt_tiny").rename(cache / "someone___wmt_tiny")


def _hf_scenario(work: Path) -> Report:
    """Read data files, a ``save_to_disk`` dataset and a cached Hub dataset, offline.

    The data files are parquet, jsonl and arrow; HF_HUB_OFFLINE=1 is set.
    """
    import datasets

    rows = [
        {"translation": {"de": g, "en": e}, "meta": {"src": e, "trg": g}, "id": i}
        for i, (g, e) in enumerate(zip(GERMAN, ENGLISH, strict=True))
    ]
    rows[1]["translation"]["de"] += "\nzwei"  # a line break inside: one line still
    rows[1]["meta"]["trg"] = None
    table = datasets.Dataset.from_list(rows)
    parquet, jsonl, saved = work / "corpus.parquet", work / "corpus.jsonl", work / "saved"
    table.to_parquet(str(parquet))
    table.to_json(str(jsonl))
    datasets.DatasetDict({"train": table, "test": table.select([1])}).save_to_disk(str(saved))
    arrow = next((saved / "train").glob("*.arrow"))
    broken = work / "broken.jsonl"
    broken.write_text(jsonl.read_text(encoding="utf-8") + '{"translation": \n', encoding="utf-8")
    _hub_cache(datasets, work, parquet)

    stream = hf_pairs(str(parquet), None, "train", "de", "en")
    report: Report = {
        "iterator": iter(stream) is stream,
        "parquet": _outcome(lambda: stream),
        "en-de": _outcome(lambda: hf_pairs(str(parquet), None, "train", "en", "de")),
        "jsonl": _outcome(lambda: hf_pairs(str(jsonl), None, "validation", "de", "en")),
        "arrow": _outcome(lambda: hf_pairs(str(arrow), None, "train", "de", "en")),
        "fields": _outcome(
            lambda: hf_pairs(str(jsonl), None, "train", "x", "y", ("meta.src", "meta.trg"))
        ),
        "saved": _outcome(lambda: hf_pairs(str(saved), None, "test", "de", "en")),
        "hub": _outcome(lambda: hf_pairs("someone/wmt_tiny", "de-en", "train", "de", "en")),
        "missing language": _outcome(lambda: hf_pairs(str(parquet), None, "train", "de", "fr")),
        "missing field": _outcome(
            lambda: hf_pairs(str(jsonl), None, "train", "x", "y", ("meta.src", "meta.ref"))
        ),
        "missing saved split": _outcome(lambda: hf_pairs(str(saved), None, "valid", "de", "en")),
        "missing hub split": _outcome(
            lambda: hf_pairs("someone/wmt_tiny", "de-en", "test", "de", "en")
        ),
        "missing hub config": _outcome(
            lambda: hf_pairs("someone/wmt_tiny", "fr-en", "train", "fr", "en")
        ),
        "not cached": _outcome(lambda: hf_pairs("someone/absent", None, "train", "de", "en")),
        "not text": _outcome(
            lambda: hf_pairs(str(jsonl), None, "train", "x", "y", ("id", "meta.src"))
        ),
        "bad file": _outcome(lambda: hf_pairs(str(broken), None, "train", "de", "en")),
        "hub identity": hf_identity("someone/wmt_tiny", "de-en", "train", "de", "en"),
    }
    before = hf_identity(str(parquet), None, "train", "de", "en")
    again = hf_identity(str(parquet), None, "train", "de", "en")
    os.utime(parquet, ns=(1_000_000_000, 1_000_000_000))  # as if written again
    report["file identity"] = [before, again, hf_identity(str(parquet), None, "train", "de", "en")]
    return report


SCENARIOS: dict[str, Callable[[Path], Report]] = {
    "sacrebleu": _sacrebleu_scenario,
    "mtdata": _mtdata_scenario,
    "hf": _hf_scenario,
}


# --- running them ---------------------------------------------------------------------------------


def _skip_without(module: str, extra: str) -> None:
    """Skip when ``module`` is not installed.

    The module is looked for, not imported: importing mtdata configures logging, and datasets
    takes a second.
    """
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed: pip install 'transformer-mt[{extra}]'")


def _run(scenario: str, work: Path, env: dict[str, str]) -> Report:
    """Run a scenario in a child Python whose only caches are under ``work``, offline."""
    own = ("HF_", "SACREBLEU", "MTDATA")
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(own)}
    child_env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", **env)
    done = subprocess.run(
        [sys.executable, __file__, scenario, str(work)],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def sacrebleu_report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    """What the sacrebleu scenario reports (sacrebleu is a dependency: never skipped)."""
    work = tmp_path_factory.mktemp("sacrebleu")
    return _run("sacrebleu", work, {"SACREBLEU": str(work / "cache")})


@pytest.fixture(scope="module")
def mtdata_report(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Report:
    """What the mtdata scenario reports, its cache in a temporary folder.

    mtdata indexes its datasets into its cache on first use (15-25 s here); that index is kept
    in pytest's cache between runs and linked into each fresh mtdata cache.
    """
    _skip_without("mtdata", "mtdata")
    work = tmp_path_factory.mktemp("mtdata")
    cache = work / "cache"
    cache.mkdir()
    index = cache / f"mtdata.index.{importlib.metadata.version('mtdata')}.pkl"
    pytest_cache = getattr(request.config, "cache", None)
    kept = pytest_cache.mkdir("mtdata-index") / index.name if pytest_cache else None
    if kept is not None and kept.is_file():
        index.symlink_to(kept)
    report = _run("mtdata", work, {"MTDATA": str(cache)})
    if kept is not None and not kept.is_file() and index.is_file():
        shutil.copyfile(index, kept.with_suffix(".tmp"))
        os.replace(kept.with_suffix(".tmp"), kept)
    return report


@pytest.fixture(scope="module")
def hf_report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    """What the Hugging Face scenario reports, its caches under HF_HOME in a temporary folder."""
    _skip_without("datasets", "hf")
    work = tmp_path_factory.mktemp("hf")
    return _run("hf", work, {"HF_HOME": str(work / "hf-home")})


# --- the tests ------------------------------------------------------------------------------------


def test_one_line_makes_each_side_a_single_line():
    assert one_line("  a\r\nb\tc\u2028d\u2029e\x85f\x0bg\x0ch  ") == "a b c d e f g h"
    assert one_line("two  spaces stay") == "two  spaces stay"


@pytest.mark.parametrize(
    ("module", "read"),
    [
        ("mtdata", lambda: mtdata_pairs(MTDATA_ID, "de", "en")),
        ("datasets", lambda: hf_pairs("someone/wmt_tiny", None, "train", "de", "en")),
    ],
)
def test_a_missing_library_names_the_extra_to_install(monkeypatch, module, read):
    monkeypatch.setitem(sys.modules, module, None)  # what `import` finds when it is not installed
    extra = {"mtdata": "mtdata", "datasets": "hf"}[module]
    with pytest.raises(MTError, match=rf"pip install 'transformer-mt\[{extra}\]'"):
        read()


def test_sacrebleu_reads_its_converted_test_set(sacrebleu_report):
    # sacrebleu converted the unpacked SGML files to the text files that later runs reuse
    assert {"wmt14_full.de-en.src", "wmt14_full.de-en.ref"} <= set(sacrebleu_report["converted"])
    assert sacrebleu_report["de-en"] == [list(p) for p in zip(GERMAN, ENGLISH, strict=True)]
    assert sacrebleu_report["en-de"] == [list(p) for p in zip(ENGLISH, GERMAN, strict=True)]


def test_sacrebleu_unknown_set_or_pair_lists_what_exists(sacrebleu_report):
    assert "no test set 'wmt14/ful'" in sacrebleu_report["unknown set"]
    assert "wmt14/full" in sacrebleu_report["unknown set"]
    missing = sacrebleu_report["missing pair"]
    assert "has no de-fr" in missing and "de-en" in missing and "en-fr" in missing


def test_sacrebleu_files_of_different_lengths_are_an_error(sacrebleu_report):
    assert "has more lines than" in sacrebleu_report["cut short"]
    assert "wmt14_full.de-en.src" in sacrebleu_report["cut short"]


def test_sacrebleu_identity_names_the_download_and_direction(sacrebleu_report):
    de_en, en_de = sacrebleu_report["identity"]
    assert sacrebleu_report["md5"] in de_en and de_en != en_de


def test_mtdata_reads_its_cached_dataset(mtdata_report):
    expected = [
        [GERMAN[0], ENGLISH[0]],
        [f"{GERMAN[1]} zwei", f"{ENGLISH[1]} two"],
        ["", ENGLISH[0]],
    ]
    assert mtdata_report["de-en"] == expected
    assert mtdata_report["ISO 639-3"] == expected
    assert mtdata_report["flipped ID"] == expected
    assert mtdata_report["en-de"] == [pair[::-1] for pair in expected]


def test_mtdata_unknown_id_or_language_is_an_error_naming_what_exists(mtdata_report):
    assert MTDATA_ID in mtdata_report["unknown ID"]  # among the similar IDs
    assert "mtdata list" in mtdata_report["unknown ID"]
    assert "Dataset ID expected in format" in mtdata_report["malformed ID"]
    assert "is deu-eng, not de-fr" in mtdata_report["other pair"]
    assert (
        "cannot read record 2 of Statmt-news_commentary-16-deu-fra"
        in (mtdata_report["broken record"])
    )
    assert "both deu" in mtdata_report["one language"]


def test_the_tasks_find_flores_and_opus_datasets_in_mtdatas_index(mtdata_report):
    flores_dev, flores_devtest, opus, unknown = mtdata_report["task IDs"]
    assert flores_dev == "Flores-flores200_dev-1-deu-eng"
    assert flores_devtest == "Flores-flores200_devtest-1-eng-fra"
    assert opus == "OPUS-tatoeba-v2-deu-eng"
    assert "mtdata has no dataset Flores-flores200_dev-1-* for de and xx" in unknown


def test_mtdata_identity_and_root_logger(mtdata_report):
    de_en, en_de = mtdata_report["identity"]
    assert MTDATA_ID in de_en and de_en != en_de
    # mtdata's import and its logging calls would each give the root logger a handler
    assert mtdata_report["root logger"] == [[], logging.WARNING]


def test_hf_reads_local_files_saved_datasets_and_the_hub_cache(hf_report):
    pairs = [[GERMAN[0], ENGLISH[0]], [f"{GERMAN[1]} zwei", ENGLISH[1]]]
    assert hf_report["iterator"]
    for source in ("parquet", "jsonl", "arrow", "hub"):
        assert hf_report[source] == pairs, source
    assert hf_report["en-de"] == [pair[::-1] for pair in pairs]
    assert hf_report["saved"] == [pairs[1]]
    assert hf_report["fields"] == [[ENGLISH[0], GERMAN[0]], [ENGLISH[1], ""]]


def test_hf_missing_language_field_split_or_dataset_names_what_exists(hf_report):
    assert "'translation' has no 'fr'; it has de, en" in hf_report["missing language"]
    assert "'meta' has no 'ref'; it has src, trg" in hf_report["missing field"]
    assert "no split 'valid'; it has train, test" in hf_report["missing saved split"]
    assert "test" in hf_report["missing hub split"] and "train" in hf_report["missing hub split"]
    assert (
        "'fr-en'" in hf_report["missing hub config"] and "de-en" in hf_report["missing hub config"]
    )
    assert "HF_HUB_OFFLINE" in hf_report["not cached"]
    assert "row 1: id is of type int, not text" in hf_report["not text"]
    assert "broken.jsonl split train: reading stopped" in hf_report["bad file"]


def test_hf_identity_follows_the_content(hf_report):
    before, again, rewritten = hf_report["file identity"]
    assert before == again != rewritten
    assert "someone/wmt_tiny" in hf_report["hub identity"]


if __name__ == "__main__":
    print(json.dumps(SCENARIOS[sys.argv[1]](Path(sys.argv[2]))))
