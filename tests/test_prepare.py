"""Data preparation end to end: local files -> clean -> sentencepiece -> binarized cache.

What is proved: a second preparation with nothing changed builds nothing; a change to a file's
contents or to a setting rebuilds exactly what depends on it; bad input stops with an error that
names the file and line and leaves no cache, model file or temporary directory behind; separate
vocabularies give two different tokenizers. The last test runs the real ``mt prepare`` on
Multi30k served from a loopback HTTP server (skipped where ../shared/data is absent).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import itertools
import logging
import random
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import run_together, shared_multi30k
from typer.testing import CliRunner

from transformer_mt.config import Config, load_config, save_config
from transformer_mt.data import prepare as prep
from transformer_mt.data import registry, sources
from transformer_mt.data.registry import Corpus, CorpusFile
from transformer_mt.data.tokenizer import EOS_ID, UNK_ID, Tokenizer
from transformer_mt.data.toy import toy_splits
from transformer_mt.errors import MTError

REPO = Path(__file__).resolve().parents[1]
M30K_CONFIG = REPO / "configs" / "multi30k_de_en.yaml"


# --- small corpora --------------------------------------------------------------------------------


def _words(rng: random.Random, letters: str, n: int) -> list[str]:
    return ["".join(rng.choice(letters) for _ in range(rng.randint(2, 6))) for _ in range(n)]


def _pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` sentence pairs over disjoint alphabets (a-m source, n-z target), so that a source
    vocabulary cannot spell a target sentence."""
    rng = random.Random(seed)
    src_words, trg_words = _words(rng, "abcdefghijklm", 60), _words(rng, "nopqrstuvwxyz", 60)
    pairs = []
    for _ in range(n):
        k = rng.randint(3, 9)
        idx = [rng.randrange(60) for _ in range(k)]
        pairs.append((" ".join(src_words[i] for i in idx), " ".join(trg_words[i] for i in idx)))
    return pairs


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture
def corpus(tmp_path: Path) -> dict[str, Path]:
    """train (400 pairs) and valid (40 pairs) source and target files."""
    files = {}
    for split, n, seed in (("train", 400, 1), ("valid", 40, 2)):
        pairs = _pairs(n, seed)
        files[f"{split}_src"] = _write(tmp_path / f"{split}.src", [s for s, _ in pairs])
        files[f"{split}_trg"] = _write(tmp_path / f"{split}.trg", [t for _, t in pairs])
    return files


def _config(tmp_path: Path, files: dict[str, Path], *overrides: str) -> Config:
    sets = [f"data.{key}={path}" for key, path in files.items()]
    return load_config(
        None,
        [
            "name=prep",
            "data.corpus=local",
            f"data.cache_dir={tmp_path / 'cache'}",
            "tokenizer.vocab_size=120",
            *sets,
            *overrides,
        ],
    )


class Calls:
    """Counts the expensive steps by wrapping them (they still run)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tokenizers = 0
        self.builds: list[str] = []
        train, build = Tokenizer.train.__func__, prep.build_binarized  # type: ignore[attr-defined]

        def counting_train(cls, texts, settings):
            self.tokenizers += 1
            return train(cls, texts, settings)

        def counting_build(out_dir, key, pairs, vocab_size):
            self.builds.append(Path(out_dir).name.rsplit("-", 1)[-1])
            return build(out_dir, key, pairs, vocab_size)

        monkeypatch.setattr(Tokenizer, "train", classmethod(counting_train))
        monkeypatch.setattr(prep, "build_binarized", counting_build)

    def reset(self) -> None:
        self.tokenizers, self.builds = 0, []


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    return Calls(monkeypatch)


def _mtimes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


def _messages(caplog: pytest.LogCaptureFixture) -> str:
    """What the package logged since the last ``caplog.clear()``, one message a line."""
    return "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("transformer_mt"))


# --- the cache ------------------------------------------------------------------------------------


def test_prepare_builds_then_reuses_everything(tmp_path, corpus, calls, caplog):
    caplog.set_level(logging.INFO, logger="transformer_mt")
    cfg = _config(tmp_path, corpus)
    first = prep.prepare(cfg, progress=False)
    assert calls.tokenizers == 1 and calls.builds == ["train", "valid"]
    assert len(first.train) == 400 and len(first.valid) == 40
    assert first.src_tok is first.trg_tok  # joint: one model for both sides
    assert (first.valid_src[0], first.valid_trg[0]) == _pairs(40, 2)[0]
    # Source ids end with EOS; target ids are stored bare and decode back to the text.
    src0, trg0 = first.train[0]
    assert src0[-1] == EOS_ID and EOS_ID not in trg0
    assert first.trg_tok.decode(trg0.astype(np.int64)) == _pairs(400, 1)[0][1]
    # The cleaning report of each split was logged.
    text = _messages(caplog)
    assert re.search(r"^train: .*\n  kept 400 of 400 pairs", text, re.M)
    assert re.search(r"^valid: .*\n  kept 40 of 40 pairs", text, re.M)

    cache = tmp_path / "cache"
    before = _mtimes(cache)
    calls.reset()
    caplog.clear()
    second = prep.prepare(cfg, progress=False)
    assert calls.tokenizers == 0 and calls.builds == []
    assert _mtimes(cache) == before  # not a file touched
    assert second.src_tok.model_proto == first.src_tok.model_proto
    assert np.array_equal(second.train.src_lengths, first.train.src_lengths)
    # Reuse says so, and repeats the report stored when the split was built.
    text = _messages(caplog)
    assert "train: reusing" in text and "valid: reusing" in text
    assert text.count("kept 400 of 400 pairs") == 1


def test_changed_training_file_rebuilds_tokenizer_and_both_splits(tmp_path, corpus, calls):
    cfg = _config(tmp_path, corpus)
    prep.prepare(cfg, progress=False)
    lines = corpus["train_trg"].read_text(encoding="utf-8").splitlines()
    lines[7] = "zzz yyy xxx"  # same line count, same size class: only the contents differ
    _write(corpus["train_trg"], lines)
    calls.reset()
    data = prep.prepare(cfg, progress=False)
    assert calls.tokenizers == 1 and calls.builds == ["train", "valid"]
    assert data.trg_tok.decode(data.train[7][1].astype(np.int64)) == "zzz yyy xxx"


def test_changed_validation_file_rebuilds_only_validation(tmp_path, corpus, calls):
    cfg = _config(tmp_path, corpus)
    prep.prepare(cfg, progress=False)
    pairs = _pairs(30, 3)
    _write(corpus["valid_src"], [s for s, _ in pairs])
    _write(corpus["valid_trg"], [t for _, t in pairs])
    calls.reset()
    data = prep.prepare(cfg, progress=False)
    assert calls.tokenizers == 0 and calls.builds == ["valid"]
    assert len(data.valid) == 30 and data.valid_src[0] == pairs[0][0]


@pytest.mark.parametrize(
    ("override", "tokenizers", "builds"),
    [
        ("tokenizer.vocab_size=100", 1, ["train", "valid"]),
        ("data.max_tokens_per_side=20", 0, ["train", "valid"]),
        ("data.max_words=8", 1, ["train", "valid"]),  # cleaning feeds the tokenizer too
    ],
)
def test_changed_setting_rebuilds_what_depends_on_it(
    tmp_path, corpus, calls, override, tokenizers, builds
):
    prep.prepare(_config(tmp_path, corpus), progress=False)
    calls.reset()
    data = prep.prepare(_config(tmp_path, corpus, override), progress=False)
    assert calls.tokenizers == tokenizers and calls.builds == builds
    if override.startswith("data.max_tokens_per_side"):
        # Every kept pair fits the new limit (source EOS and target BOS/EOS included).
        assert data.train.src_lengths.max() <= 20 and data.train.trg_lengths.max() + 1 <= 20
        assert 0 < len(data.train) < 400
        # Validation BLEU is scored on the pairs the validation loss is.
        assert 0 < len(data.valid) < 40
        assert len(data.valid_src) == len(data.valid_trg) == len(data.valid)


def test_separate_vocabularies_give_two_tokenizers(tmp_path, corpus):
    cfg = _config(tmp_path, corpus, "tokenizer.joint=false", "model.share_embeddings=false")
    data = prep.prepare(cfg, progress=False)
    models = sorted(p.name.rsplit("-", 1)[-1] for p in (tmp_path / "cache").glob("spm-*.model"))
    assert models == ["src.model", "trg.model"]
    assert data.src_tok.model_proto != data.trg_tok.model_proto
    # Each vocabulary knows only its own side's alphabet.
    src, trg = _pairs(1, 5)[0]
    assert UNK_ID not in data.src_tok.encode(src) and UNK_ID in data.src_tok.encode(trg)
    assert UNK_ID not in data.trg_tok.encode(trg) and UNK_ID in data.trg_tok.encode(src)
    assert data.trg_tok.decode(data.train[0][1].astype(np.int64)) == _pairs(400, 1)[0][1]
    # A joint run on the same files is a different cache entry with a single model.
    joint = prep.prepare(_config(tmp_path, corpus), progress=False)
    assert joint.src_tok is joint.trg_tok
    assert len(list((tmp_path / "cache").glob("spm-*-joint.model"))) == 1


def test_pairs_empty_after_tokenization_are_dropped_and_reported(tmp_path, corpus, caplog):
    """A side that cleaning keeps but sentencepiece normalizes away (a zero-width space, control
    characters: str.strip() keeps both) would train on an empty target or a source of EOS alone.
    Such a pair is dropped and counted in every split, in the sampled draws, and in the
    validation text that BLEU is computed on (sources and references alike)."""
    caplog.set_level(logging.INFO, logger="transformer_mt")
    bad = {3: ("abc de", "\u200b"), 5: ("\x01\x02", "nop qr")}  # short: the ratio check passes
    for split in ("train", "valid"):
        paths = corpus[f"{split}_src"], corpus[f"{split}_trg"]
        src, trg = (path.read_text(encoding="utf-8").splitlines() for path in paths)
        for i, (bad_src, bad_trg) in bad.items():
            src[i], trg[i] = bad_src, bad_trg
        _write(paths[0], src)
        _write(paths[1], trg)
    cfg = _config(tmp_path, corpus, "tokenizer.sample_alpha=0.1", "tokenizer.sample_draws=2")
    data = prep.prepare(cfg, progress=False)
    assert data.sampler is not None
    assert len(data.train) == 398 and data.sampler.n_pairs == 398 and len(data.valid) == 38
    for pairs in (data.train, data.valid, data.sampler.draws):
        assert pairs.src_lengths.min() >= 2 and pairs.trg_lengths.min() >= 1  # EOS + a piece
    valid = [pair for i, pair in enumerate(_pairs(40, 2)) if i not in bad]
    assert list(zip(data.valid_src, data.valid_trg, strict=True)) == valid
    text = _messages(caplog)
    assert re.search(r"^train: .*\n  kept 400 of 400 pairs", text, re.M)  # cleaning kept them
    assert text.count("dropped 2 pairs with a side empty after subword tokenization") == 3
    assert re.search(r"^train: .*(\n  .*)*\n  -> 398 pairs", text, re.M)


def test_two_processes_preparing_one_cache_at_once_build_it_once(tmp_path, corpus):
    """A seed sweep started in parallel on a fresh machine: every process prepares the same cache
    at the same moment. One of them trains the tokenizer and builds each split, under a lock
    beside it; the other waits for the lock, then reuses what was built."""
    config = tmp_path / "prep.yaml"
    save_config(_config(tmp_path, corpus), config)
    command = [sys.executable, "-c", _PREPARE_WHEN_TOLD, str(config)]
    results = run_together([command, command])
    assert [rc for rc, _ in results] == [0, 0], results
    text = "".join(out for _, out in results)
    assert text.count("tokenizer: training") == 1 and text.count("tokenizer: reusing") == 1
    for split in ("train", "valid"):
        assert len(re.findall(rf"^{split}: (?!reusing)", text, re.M)) == 1, text
        assert len(re.findall(rf"^{split}: reusing", text, re.M)) == 1, text
    assert len({line for line in text.splitlines() if line.startswith("done ")}) == 1
    left = _leftovers(tmp_path / "cache")
    assert [p for p in left if p.endswith(".lock") or ".tmp-" in p or ".old-" in p] == []


def test_lock_files_left_by_killed_runs_neither_block_nor_stay(tmp_path, corpus):
    """The kernel drops a killed holder's lock with its process; the file it leaves is locked
    again by the next build of the same output, and deleted when that build is done."""
    cache = tmp_path / "cache"
    cache.mkdir()
    for name in ("prep-train.lock", "prep-valid.lock"):
        (cache / name).write_text("")
    data = prep.prepare(_config(tmp_path, corpus), progress=False)
    assert len(data.train) == 400
    assert [p for p in _leftovers(cache) if p.endswith(".lock")] == []


_PREPARE_WHEN_TOLD = """
import logging, sys
from transformer_mt.config import load_config
from transformer_mt.data.prepare import prepare

logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
cfg = load_config(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
data = prepare(cfg, progress=False)
print(f"done {len(data.train)} {data.train.key} {data.valid.key}", flush=True)
"""


# --- bad input ------------------------------------------------------------------------------------


def _leftovers(cache: Path) -> list[str]:
    """Everything under the cache directory (a missing directory is an empty list)."""
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*")) if cache.exists() else []


def _drop_line(path: Path, lineno: int) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    del lines[lineno - 1]
    _write(path, lines)


def _break_utf8(path: Path, lineno: int) -> None:
    lines = path.read_bytes().split(b"\n")
    lines[lineno - 1] = b"caf\xe9 au lait"  # Latin-1, not UTF-8
    path.write_bytes(b"\n".join(lines))


@pytest.mark.parametrize("split", ["train", "valid"])
@pytest.mark.parametrize(
    ("damage", "side", "lineno", "message"),
    [
        (_drop_line, "trg", 3, "has no partner"),
        (_break_utf8, "src", 17, "invalid UTF-8"),
        (_break_utf8, "trg", 40, "invalid UTF-8"),  # the last line of valid
    ],
)
def test_bad_input_names_file_and_line_and_leaves_no_cache(
    tmp_path, corpus, split, damage, side, lineno, message
):
    damage(corpus[f"{split}_{side}"], lineno)
    cfg = _config(tmp_path, corpus)
    with pytest.raises(MTError, match=message) as err:
        prep.prepare(cfg, progress=False)
    n_lines = 400 if split == "train" else 40
    # A dropped line is noticed where the longer file has a line without a partner.
    where = f"{split}.src:{n_lines}" if damage is _drop_line else f"{split}.{side}:{lineno}"
    assert where in str(err.value)
    assert _leftovers(tmp_path / "cache") == []


def test_bad_input_keeps_the_previous_good_cache(tmp_path, corpus):
    cfg = _config(tmp_path, corpus)
    prep.prepare(cfg, progress=False)
    before = _mtimes(tmp_path / "cache")
    _break_utf8(corpus["valid_src"], 5)
    with pytest.raises(MTError, match=r"valid\.src:5: invalid UTF-8"):
        prep.prepare(cfg, progress=False)
    assert _mtimes(tmp_path / "cache") == before


def test_skip_bad_lines_counts_them_in_the_report(tmp_path, corpus, caplog):
    caplog.set_level(logging.INFO, logger="transformer_mt")
    _break_utf8(corpus["train_src"], 17)
    data = prep.prepare(_config(tmp_path, corpus, "data.skip_bad_lines=true"), progress=False)
    assert len(data.train) == 399
    assert "skipped 1 pairs with invalid UTF-8" in _messages(caplog)


def test_split_empty_after_limits_is_an_error_and_leaves_no_split_cache(tmp_path, corpus):
    cfg = _config(tmp_path, corpus, "data.max_tokens_per_side=2")
    with pytest.raises(MTError, match=r"train split .* no pairs left .*max_tokens_per_side"):
        prep.prepare(cfg, progress=False)
    # The tokenizer is a valid cache of good data; no split directory, no temporary directory.
    assert [p for p in _leftovers(tmp_path / "cache") if not p.startswith("spm-")] == []


def test_missing_local_file_is_named_before_any_work(tmp_path, corpus):
    cfg = _config(tmp_path, corpus, f"data.test_src={tmp_path / 'nope.src'}")
    cfg.data.test_trg = str(corpus["valid_trg"])
    with pytest.raises(MTError, match=r"data\.test_src: .*nope\.src is not a file"):
        prep.prepare(cfg, progress=False)
    assert _leftovers(tmp_path / "cache") == []


@pytest.mark.parametrize("name", ["iwslt2017-de-en", "wmt99", ""])
def test_unknown_corpus_is_one_line_naming_the_accepted_values_before_any_work(tmp_path, name):
    # The config loads (the config package knows no data sources); the data package refuses it first.
    cfg = load_config(None, [f"data.corpus={name}", f"data.cache_dir={tmp_path}"])
    expected = (
        rf"^data\.corpus='{name}': expected toy, local, multi30k, wmt14_en_de, wmt16_en_ro, "
        r"iwslt17_de_en, flores200 or opus:CORPUS/VERSION$"
    )
    with pytest.raises(MTError, match=expected):
        sources.check_source(cfg)
    with pytest.raises(MTError, match=expected):
        prep.prepare(cfg, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_local_corpus_without_its_files_is_a_config_error():
    cfg = load_config(None, ["data.corpus=local", "data.train_src=a", "data.train_trg=b"])
    with pytest.raises(
        MTError, match=r"data\.corpus=local needs data\.valid_src and data\.valid_trg"
    ):
        sources.check_source(cfg)


def test_unknown_multi30k_language_is_a_config_error(tmp_path):
    cfg = load_config(M30K_CONFIG, ["data.src_lang=xx", f"data.download_dir={tmp_path}"])
    with pytest.raises(MTError, match=r"data\.src_lang='xx'.*de, en"):
        prep.prepare(cfg, progress=False)
    assert list(tmp_path.iterdir()) == []  # nothing was downloaded


# --- the toy corpus's text files -----------------------------------------------------------------


def _toy_texts(cache: Path, src: str, trg: str) -> dict[str, tuple[str, str]]:
    """The toy corpus of one language pair, as its files hold it: split -> (source, target)."""
    sets = [f"data.src_lang={src}", f"data.trg_lang={trg}", f"data.cache_dir={cache}"]
    sets += ["data.toy_train_size=30", "data.toy_valid_size=5", "data.toy_test_size=5"]
    files = sources.corpus_files(load_config(None, ["data.corpus=toy", *sets]))
    return {
        split: (src_file.read_text(encoding="utf-8"), trg_file.read_text(encoding="utf-8"))
        for split, (src_file, trg_file) in files.items()
    }


def test_toy_files_of_one_language_pair_never_serve_another(tmp_path):
    """The toy files are named by language (``train.<lang>``), and the generator's English always
    goes to the source side: another pair's run, or the same codes swapped, must leave nothing
    that a later run reads as its own (en->xx once found English in train.xx after xx->yy)."""
    splits = toy_splits(30, 5, 5, seed=load_config(None, []).data.toy_seed)
    expected = {
        split: ("".join(s + "\n" for s, _ in pairs), "".join(t + "\n" for _, t in pairs))
        for split, pairs in splits.items()
    }
    cache = tmp_path / "cache"
    assert _toy_texts(cache, "en", "xx") == expected
    assert _toy_texts(cache, "xx", "yy") == expected
    assert _toy_texts(cache, "en", "xx") == expected
    assert _toy_texts(cache, "xx", "en") == expected  # swapped codes: English is the source still
    assert _toy_texts(cache, "en", "xx") == expected
    # A set with a file missing (deleted by hand, or a killed run) is written again, whole.
    (en_xx,) = [d for d in cache.iterdir() if d.name.endswith("-en-xx")]
    (en_xx / "valid.xx").unlink()
    (en_xx / "train.en").write_text("a file of an older version\n", encoding="utf-8")
    assert _toy_texts(cache, "en", "xx") == expected


# --- corpora downloaded from a loopback server ---------------------------------------------------


class _Handler(http.server.SimpleHTTPRequestHandler):
    requests: list[str]

    def log_message(self, format: str, *args: object) -> None:  # keep pytest output clean
        pass

    def do_GET(self) -> None:
        self.requests.append(self.path)
        super().do_GET()


@contextlib.contextmanager
def _serve(root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, list[str]]]:
    """Serve the files under ``root`` on 127.0.0.1: (URL, paths requested)."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)  # 127.0.0.1 must not go through a proxy
    requests: list[str] = []
    handler = type("Handler", (_Handler,), {"requests": requests})
    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(handler, directory=str(root))
    )
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/", requests
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def m30k_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, list[str]]]:
    """A loopback server with the original Multi30k files under data/task1/raw/: (URL, paths
    requested)."""
    shared = shared_multi30k()
    if shared is None:
        pytest.skip("original Multi30k files absent (../shared/data/multi30k; set MT_SHARED_DATA)")
    raw = tmp_path / "www" / "data" / "task1" / "raw"
    raw.mkdir(parents=True)
    for gz in shared.glob("*.gz"):
        (raw / gz.name).symlink_to(gz)
    with _serve(tmp_path / "www", monkeypatch) as served:
        yield served


def test_any_trainable_registry_corpus_is_a_data_source(tmp_path, corpus, monkeypatch):
    """Nothing in the data sources is Multi30k's own: a corpus with other split names, file
    names and unpacking is downloaded and prepared through its registry entry alone."""
    www = tmp_path / "www"
    www.mkdir()
    ours = {"tr": "train", "dev": "valid", "tst": "valid"}  # the test split reuses valid's text
    for split, (lang, side) in itertools.product(ours, (("aa", "src"), ("bb", "trg"))):
        (www / f"{split}.{lang}").write_bytes(corpus[f"{ours[split]}_{side}"].read_bytes())
    (www / "tr.cc").write_text("only a training file\n")
    files = tuple(
        CorpusFile(f"{p.name}", hashlib.sha256(p.read_bytes()).hexdigest(), "none", p.name)
        for p in sorted(www.iterdir())
    )
    splits = {"train": "tr", "valid": "dev", "test": "tst"}
    tiny = Corpus("tiny", "a test corpus", "http://0.0.0.0/", files, splits, "{split}.{lang}")
    monkeypatch.setitem(registry._REGISTRY, "tiny", tiny)
    assert "tiny" in sources.source_names() and tiny.languages() == ["aa", "bb"]

    dest = tmp_path / "downloads"
    sets = ["data.corpus=tiny", "data.src_lang=aa", "data.trg_lang=bb", f"data.download_dir={dest}"]
    with _serve(www, monkeypatch) as (url, requests):
        data = prep.prepare(_config(tmp_path, {}, *sets, f"data.base_url={url}"), progress=False)
    assert sorted(requests) == sorted(f"/{s}.{lang}" for s in ours for lang in ("aa", "bb"))
    got = {split: (src.name, trg.name) for split, (src, trg) in data.files.items()}
    assert got == {
        "train": ("tr.aa", "tr.bb"),
        "valid": ("dev.aa", "dev.bb"),
        "test": ("tst.aa", "tst.bb"),
    }
    assert all(src.parent == (dest / "tiny").resolve() for src, _ in data.files.values())
    assert len(data.train) == 400 and len(data.valid) == 40

    with pytest.raises(MTError, match=r"^data\.trg_lang='cc': tiny has tr/dev/tst only in aa, bb"):
        sources.check_source(_config(tmp_path, {}, *sets, "data.trg_lang=cc"))


def test_mt_prepare_download_errors_advise_the_config_key(tmp_path, monkeypatch):
    """`mt prepare` has no --base-url option: its download errors name data.base_url."""
    from transformer_mt.cli import app

    www = tmp_path / "www"
    www.mkdir()  # serves nothing: every file is a 404
    names = [f"{s}.{lang}" for s in ("tr", "dev", "tst") for lang in ("aa", "bb")]
    files = tuple(CorpusFile(name, None, "none", name) for name in names)
    splits = {"train": "tr", "valid": "dev", "test": "tst"}
    tiny = Corpus("tiny", "a test corpus", "http://0.0.0.0/", files, splits, "{split}.{lang}")
    monkeypatch.setitem(registry._REGISTRY, "tiny", tiny)
    sets = ["data.corpus=tiny", "data.src_lang=aa", "data.trg_lang=bb"]
    sets += [f"data.download_dir={tmp_path / 'dl'}", f"data.cache_dir={tmp_path / 'cache'}"]
    with _serve(www, monkeypatch) as (url, _):
        args = [
            "prepare",
            *itertools.chain(*(["--set", s] for s in [*sets, f"data.base_url={url}"])),
        ]
        result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    assert "HTTP 404" in result.output and "set data.base_url to a mirror" in result.output
    assert "--base-url" not in result.output


def test_mt_prepare_multi30k_from_loopback(tmp_path, m30k_url):
    from transformer_mt.cli import app

    url, requests = m30k_url
    args = [
        "prepare",
        "--config",
        str(M30K_CONFIG),
        "--set",
        f"data.base_url={url}",
        "--set",
        f"data.download_dir={tmp_path / 'data'}",
        "--set",
        f"data.cache_dir={tmp_path / 'cache'}",
        "--set",
        "tokenizer.vocab_size=1000",
    ]
    runner = CliRunner()
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    # Only the six files of de-en train/val/test_2016_flickr were fetched.
    names = sorted(r.rsplit("/", 1)[-1] for r in requests)
    splits = ("test_2016_flickr", "train", "val")
    assert names == sorted(f"{s}.{lang}.gz" for s in splits for lang in ("de", "en"))
    assert re.search(
        r"train: .*train\.de / .*train\.en\n  kept 28,998 of 29,000 pairs", result.output
    )
    assert re.search(r"valid: .*val\.de / .*val\.en\n  kept 1,014 of 1,014 pairs", result.output)
    # Two misaligned pairs (length ratio over 3) are the only ones cleaning drops.
    assert re.search(r"ready: 28,998 training and 1,014 validation pairs", result.output)

    requests.clear()
    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    assert requests == []  # downloaded once
    assert "tokenizer: reusing" in again.output and "train: reusing" in again.output
