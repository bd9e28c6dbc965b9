"""Several training sources in their own formats, mixed by weight: config to prepared data.

What is proved: each source is read and binarized into its own cache entry; a second
preparation reads no source again, and adding a source reads only that one; an epoch draws
exactly ``weight x size`` pairs of each source (a fresh subset each epoch for a fractional
weight, the same one for the same epoch in any process); a malformed source stops with one line
naming its file and line before any tokenizer is trained; the config refuses sources that are
not exactly one kind, weights that are not positive, and keys a kind does not read.
"""

from __future__ import annotations

import json
import logging
import lzma
import tarfile
from pathlib import Path

import numpy as np
import pytest
from test_prepare import Calls, _pairs

from transformer_mt.config import load_config
from transformer_mt.data import prepare as prep
from transformer_mt.data.mixing import MixedCorpus
from transformer_mt.errors import MTError


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    return Calls(monkeypatch)


def _lines(pairs: list[tuple[str, str]], side: int) -> str:
    return "".join(p[side] + "\n" for p in pairs)


@pytest.fixture
def three(tmp_path: Path) -> dict[str, str]:
    """Three training sources in three formats (300, 200 and 100 pairs) and a validation pair:
    a plain text pair, an xz-compressed TSV, and a JSON-lines file inside a .tgz."""
    a, b, c, valid = _pairs(300, 1), _pairs(200, 2), _pairs(100, 3), _pairs(30, 4)
    (tmp_path / "a.src").write_text(_lines(a, 0))
    (tmp_path / "a.trg").write_text(_lines(a, 1))
    with lzma.open(tmp_path / "b.tsv.xz", "wt", encoding="utf-8") as f:
        f.write("".join(f"{s}\t{t}\n" for s, t in b))
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("".join(json.dumps({"translation": {"xx": s, "yy": t}}) + "\n" for s, t in c))
    with tarfile.open(tmp_path / "c.tgz", "w:gz") as tar:
        tar.add(jsonl, arcname="corpus/c.jsonl")
    jsonl.unlink()
    (tmp_path / "v.src").write_text(_lines(valid, 0))
    (tmp_path / "v.trg").write_text(_lines(valid, 1))
    return {
        "a": f"{{src: {tmp_path}/a.src, trg: {tmp_path}/a.trg, weight: 2}}",
        "b": f"{{tsv: {tmp_path}/b.tsv.xz, weight: 0.5}}",
        "c": f"{{jsonl: corpus/c.jsonl, archive: {tmp_path}/c.tgz, weight: 1.25}}",
        "valid": f"{{src: {tmp_path}/v.src, trg: {tmp_path}/v.trg}}",
    }


def _config(tmp_path: Path, train: list[str], valid: str, *overrides: str):
    path = tmp_path / "mix.yaml"
    path.write_text(
        "name: mix\n"
        "data:\n  src_lang: xx\n  trg_lang: yy\n"
        f"  cache_dir: {tmp_path / 'cache'}\n"
        "  train:\n" + "".join(f"    - {s}\n" for s in train) + f"  valid: {valid}\n"
        "tokenizer:\n  vocab_size: 120\n"
    )
    return load_config(path, list(overrides))


def test_each_epoch_draws_weight_times_size_of_each_source(tmp_path, three):
    cfg = _config(tmp_path, [three["a"], three["b"], three["c"]], three["valid"])
    data = prep.prepare(cfg, progress=False)
    train = data.train
    assert isinstance(train, MixedCorpus) and data.sampler is train
    assert [len(p) for p in train.parts] == [300, 200, 100]
    targets = [2 * 300, 0.5 * 200, 1.25 * 100]
    seen = []
    for epoch in range(3):
        chosen = train.chosen(epoch)
        per_source = np.bincount(train.source_of(chosen), minlength=3)
        for got, want in zip(per_source, targets, strict=True):
            assert abs(got - want) <= 0.02 * want  # within 2 %: the counts are exact
        assert list(per_source) == [600, 100, 125]
        # weight 2: every pair of a exactly twice; 0.5: 100 distinct pairs of b
        a_ids = chosen[train.source_of(chosen) == 0]
        assert np.array_equal(np.bincount(a_ids), np.full(300, 2))
        b_ids = chosen[train.source_of(chosen) == 1]
        assert len(np.unique(b_ids)) == 100
        seen.append(set(b_ids.tolist()))
        epoch_view = train.epoch(epoch)
        k = int(np.flatnonzero(train.source_of(chosen) == 2)[0])  # the pairs are the sources'
        src, trg = epoch_view[k]
        part_src, part_trg = train.parts[2][int(chosen[k] - train.starts[2])]
        assert np.array_equal(src, part_src) and np.array_equal(trg, part_trg)
        assert len(epoch_view.src_lengths) == len(chosen) == 825
    assert seen[0] != seen[1], "a fractional weight draws a fresh subset each epoch"
    again = MixedCorpus(train.parts, train.weights, cfg.train.seed)
    assert np.array_equal(again.chosen(1), train.chosen(1)), "epoch e draws the same pairs"


def test_each_source_has_its_own_cache_entry_and_adding_one_reads_only_it(tmp_path, three, caplog):
    caplog.set_level(logging.INFO, logger="transformer_mt")
    cfg = _config(tmp_path, [three["a"], three["b"]], three["valid"])
    prep.prepare(cfg, progress=False)
    cache = tmp_path / "cache"
    assert (cache / "mix-train.a").is_dir() and (cache / "mix-train.b").is_dir()
    extracted = {str(p): p.stat().st_mtime_ns for p in (cache / "sources").rglob("*.yy")}
    assert len(extracted) == 1, "the TSV is read into the cache; the text pair is read in place"

    caplog.clear()
    prep.prepare(cfg, progress=False)
    assert "reading" not in caplog.text and "training sentencepiece" not in caplog.text

    caplog.clear()
    cfg = _config(tmp_path, [three["a"], three["b"], three["c"]], three["valid"])
    prep.prepare(cfg, progress=False)
    assert caplog.text.count("reading") == 1 and "c.jsonl" in caplog.text
    after = {str(p): p.stat().st_mtime_ns for p in (cache / "sources").rglob("*.yy")}
    assert {k: after[k] for k in extracted} == extracted, "the TSV was not read again"
    assert (cache / "mix-train.c").is_dir()


def test_a_malformed_source_stops_before_the_tokenizer_with_file_and_line(tmp_path, three):
    bad = tmp_path / "bad.tsv"
    bad.write_text("one\tuno\ntwo without a tab\n")
    cfg = _config(tmp_path, [three["a"], f"{{tsv: {bad}}}"], three["valid"])
    with pytest.raises(MTError, match=rf"{bad}:2\b"):
        prep.prepare(cfg, progress=False)
    assert not list((tmp_path / "cache").glob("spm-*")), "no tokenizer was trained"
    assert not list((tmp_path / "cache").rglob("*.yy")), "nothing half-extracted is kept"


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("{tsv: a.tsv, src: a.de}", r"data.train\[0\] has src and tsv; a source is exactly one"),
        ("{weight: 2}", r"data.train\[0\] has none"),
        ("{tsv: a.tsv, weight: 0}", r"data.train\[0\].weight is 0; it must be finite"),
        ("{tsv: a.tsv, hf_config: de-en}", r"hf_config is not read by a tsv source"),
        # (the same column twice: data/sides.py's rule, tests/test_data_bounds.py)
        ("{tsv: a.tsv, columns: [1, -1]}", r"columns=\[1, -1\]: give two columns from 0 up"),
        ("{src: a.de}", r"data.train\[0\].src needs data.train\[0\].trg"),
        ("{tsv: a.tsv, nmae: x}", r"unknown config key 'data.train\[0\].nmae'"),
        ("{tsv: a.tsv, name: ../x}", r"data.train\[0\].name='../x': it names files"),
    ],
)
def test_the_config_refuses_a_malformed_source(tmp_path, source, message):
    with pytest.raises(MTError, match=message):
        _config(tmp_path, [source], "{tsv: v.tsv}")


def test_sources_replace_the_corpus_key_and_need_a_validation_source(tmp_path):
    with pytest.raises(MTError, match=r"data.train and data.valid need one source"):
        load_config(None, ["data.train=[{tsv: a.tsv}]"])
    with pytest.raises(MTError, match=r"data.corpus and the data.\*_src / \*_trg files are not"):
        load_config(None, ["data.corpus=multi30k", "data.train=[{tsv: a}]", "data.valid={tsv: b}"])
    with pytest.raises(MTError, match=r"data.valid is set without data.train"):
        load_config(None, ["data.valid=[{tsv: a.tsv}]"])


@pytest.mark.parametrize("code", ["en/../../../x", "..", "", "de en", "de\\x"])
def test_a_language_code_that_is_not_a_plain_name_is_refused_before_any_file(
    tmp_path, monkeypatch, code
):
    from typer.testing import CliRunner

    from transformer_mt.cli import app

    work = tmp_path / "a" / "b" / "c"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    result = CliRunner().invoke(app, ["prepare", "--set", f"data.src_lang='{code}'"])
    assert result.exit_code == 1
    assert "data.src_lang=" in result.output and "a language code names files" in result.output
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == [], "nothing written anywhere"


def test_with_the_tokenizer_sources_named_adding_a_source_prepares_only_it(tmp_path, three, calls):
    pin = "tokenizer.train_on=[a, b]"
    prep.prepare(_config(tmp_path, [three["a"], three["b"]], three["valid"], pin), progress=False)
    assert calls.tokenizers == 1 and sorted(calls.builds) == ["train.a", "train.b", "valid"]
    calls.reset()
    cfg = _config(tmp_path, [three["a"], three["b"], three["c"]], three["valid"], pin)
    data = prep.prepare(cfg, progress=False)
    assert calls.tokenizers == 0 and calls.builds == ["train.c"]
    assert [len(p) for p in data.train.parts] == [300, 200, 100]
    with pytest.raises(MTError, match=r"tokenizer.train_on names \['d'\]; the training sources"):
        prep.prepare(_config(tmp_path, [three["a"]], three["valid"], "tokenizer.train_on=[d]"))


def test_from_one_source_to_three_the_first_keeps_its_tokenizer_and_cache(tmp_path, three, calls):
    pin = "tokenizer.train_on=[a]"
    prep.prepare(_config(tmp_path, [three["a"]], three["valid"], pin), progress=False)
    assert calls.tokenizers == 1 and sorted(calls.builds) == ["train.a", "valid"]
    calls.reset()
    # another pair's source too (its own source language): no label changes, nothing rebuilt
    other = three["b"].replace("}", ", src_lang: ww}")
    cfg = _config(tmp_path, [three["a"], other, three["c"]], three["valid"], pin)
    prep.prepare(cfg, progress=False)
    assert calls.tokenizers == 0 and sorted(calls.builds) == ["train.b", "train.c"]
