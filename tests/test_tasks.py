"""A standard task by name, end to end: `mt prepare` on ``data.corpus: wmt14_en_de``.

Its three training archives are served by a loopback HTTP server (the real downloader, and the
archive members read in place); newstest2013 and newstest2014 come through sacrebleu from a cache
laid out as sacrebleu leaves it after a download (the tarball in ``raw/`` and its unpacked SGML
files), so nothing reaches the network. sacrebleu reads $SACREBLEU when imported, so the command
runs in a child process.
"""

from __future__ import annotations

import functools
import http.server
import os
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_prepare import _pairs

from transformer_mt.data.tasks import TASKS, find_task
from transformer_mt.errors import MTError

# The archive members of fairseq's prepare-wmt14en2de.sh, by the URL path they are served at.
ARCHIVES = {
    "wmt13/training-parallel-europarl-v7.tgz": "training/europarl-v7.de-en",
    "wmt13/training-parallel-commoncrawl.tgz": "commoncrawl.de-en",
    "wmt14/training-parallel-nc-v9.tgz": "training/news-commentary-v9.de-en",
}


def _tgz(path: Path, stem: str, pairs: list[tuple[str, str]], work: Path) -> None:
    """A .tgz holding ``<stem>.de`` and ``<stem>.en`` (and a README, as the real ones do)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for side, lang in enumerate(("en", "de")):  # the generator's sides: source, target
            member = work / f"m.{lang}"
            member.write_text("".join(p[side] + "\n" for p in pairs), encoding="utf-8")
            tar.add(member, arcname=f"{stem}.{lang}")
        tar.add(member, arcname="README")


def _sgm(lines: list[str]) -> str:
    segs = "".join(f'<seg id="{i}">{s}</seg>\n' for i, s in enumerate(lines, start=1))
    return f'<srcset setid="x">\n<doc docid="1" origlang="en">\n{segs}</doc>\n</srcset>\n'


def _sacrebleu_cache(root: Path, name: str, pairs: list[tuple[str, str]]) -> None:
    """``name``'s en-de files, as sacrebleu leaves them after its download and unpacking."""
    from sacrebleu.dataset import DATASETS

    dataset = DATASETS[name]
    raw = root / name / "raw"
    for file, side in zip(dataset.langpairs["en-de"], (0, 1), strict=True):
        (raw / file).parent.mkdir(parents=True, exist_ok=True)
        (raw / file).write_text(_sgm([p[side] for p in pairs]), encoding="utf-8")
    top = dataset.langpairs["en-de"][0].split("/")[0]
    with tarfile.open(raw / f"{name.replace('/', '_')}.{Path(dataset.data[0]).name}", "w:gz") as t:
        t.add(raw / top, arcname=top)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    www = tmp_path / "www"
    for i, (url_path, stem) in enumerate(ARCHIVES.items()):
        _tgz(www / url_path, stem, _pairs(100 * (i + 1), i), tmp_path)
    handler = functools.partial(_Quiet, directory=str(www))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


def test_wmt14_en_de_by_name_reads_its_archives_and_sacrebleu_test_sets(tmp_path, server):
    _sacrebleu_cache(tmp_path / "sacrebleu", "wmt13", _pairs(20, 7))
    _sacrebleu_cache(tmp_path / "sacrebleu", "wmt14/full", _pairs(25, 8))
    config = tmp_path / "wmt.yaml"
    config.write_text(
        "name: wmt\n"
        "data:\n  corpus: wmt14_en_de\n  src_lang: en\n  trg_lang: de\n"
        f"  base_url: {server}\n  download_dir: {tmp_path / 'dl'}\n"
        f"  cache_dir: {tmp_path / 'cache'}\n"
        "tokenizer:\n  vocab_size: 120\n"
    )
    env = {**os.environ, "SACREBLEU": str(tmp_path / "sacrebleu")}
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        env.pop(var, None)
    proc = subprocess.run(
        [sys.executable, "-m", "transformer_mt", "prepare", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    log = proc.stderr
    for label, n in (("europarl-v7", 100), ("commoncrawl", 200), ("news-commentary-v9", 300)):
        assert f"train.{label}: " in log and f"kept {n} of {n} pairs" in log
    assert "ready: 600 training pairs in 3 sources (600 an epoch) and 20 validation pairs" in log
    downloaded = (tmp_path / "dl" / "wmt14_en_de_train").glob("*.tgz")
    assert sorted(p.name for p in downloaded) == sorted(Path(u).name for u in ARCHIVES), (
        "the archives are kept whole, not unpacked"
    )
    test_src = next((tmp_path / "cache" / "sources").glob("wmt14_full-*/test.en"))
    assert test_src.read_text().splitlines() == [s for s, _ in _pairs(25, 8)]


def test_a_task_names_its_languages_and_the_patterns_parse():
    with pytest.raises(MTError, match=r"task wmt14_en_de is de/en; set data.src_lang"):
        TASKS["wmt14_en_de"].sources("train", "en", "fr")
    sources = TASKS["wmt14_en_de"].sources("train", "en", "de")
    assert sources[0].src == "training/europarl-v7.de-en.en"
    assert sources[2].trg == "training/news-commentary-v9.de-en.de"
    task = find_task("opus:Tatoeba/v2023-04-12")
    assert task is not None and task.mtdata == {"train": "OPUS-tatoeba-v20230412"}
    with pytest.raises(MTError, match="opus:CORPUS/VERSION"):
        find_task("opus:Tatoeba")
    assert find_task("wmt99") is None
