"""Every input has a bound on what it may cost, checked while it is read, and one rule decides
when a source's two sides read the same input.

Each test builds its adversarial input itself, small on disk (a gzip of one long line compresses
to almost nothing), and checks the one-line error (the file, the line, the bound, the setting that
raises it) or the correct output: long lines in text, TSV, JSONL and sacrebleu's cache; archives
that decompress to too much or hold too many members; JSON and XML nested too deep, and a JSON
number too long for int(); a source weight no epoch can draw; a WMT .sgm line that once took
quadratic time; a damaged sacrebleu cache or save_to_disk dataset; a Hugging Face directory
with a loading script; the same file, column, field or language for both sides in every kind of
source.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
import time
import tracemalloc
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from test_prepare import _pairs

from transformer_mt.config import load_config
from transformer_mt.data import prepare as prep
from transformer_mt.data.corpus import CleanConfig, iter_clean_pairs
from transformer_mt.data.limits import DEFAULT_LIMITS, ReadLimits, bounded_lines
from transformer_mt.data.readers import (
    Location,
    iter_jsonl_pairs,
    iter_sgm_pairs,
    iter_text_pairs,
    iter_tmx_pairs,
    iter_tsv_pairs,
)
from transformer_mt.data.sources import check_source
from transformer_mt.errors import MTError

MIB = 1 << 20


def _limits(**changes: int) -> ReadLimits:
    return dataclasses.replace(DEFAULT_LIMITS, **changes)


def _gzip_line(path: Path, nbytes: int, then: bytes = b"") -> Path:
    """A gzip file whose first line is ``nbytes`` of "a" (written in pieces: tiny on disk)."""
    with gzip.open(path, "wb") as f:
        for _ in range(nbytes // MIB):
            f.write(b"a" * MIB)
        f.write(b"a" * (nbytes % MIB) + b"\n" + then)
    return path


def _one_line(exc: pytest.ExceptionInfo[MTError]) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def _peak(read: Callable[[], object]) -> int:
    """The most memory Python held while ``read()`` ran."""
    tracemalloc.start()
    try:
        read()
    except MTError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


# --- lines ---------------------------------------------------------------------------------------


def test_bounded_lines_takes_a_line_of_the_limit_and_refuses_one_byte_more() -> None:
    data = b"12345\n123456\n"
    lines = bounded_lines(io.BytesIO(data), 5, "f")
    assert next(lines) == b"12345\n"
    with pytest.raises(
        MTError, match=r"^f:2: the line is longer than 5 bytes \(data.max_line_bytes\)"
    ):
        next(lines)
    assert list(bounded_lines(io.BytesIO(b"12345"), 5, "f")) == [b"12345"]  # no final newline


def test_one_long_line_in_a_gzip_stops_at_the_limit_not_at_the_end_of_the_line(
    tmp_path: Path,
) -> None:
    # 64 MiB of one line in 65 KB on disk; read whole, it would take 64 MiB and more.
    src = _gzip_line(tmp_path / "train.de.gz", 64 * MIB)
    trg = tmp_path / "train.en"
    trg.write_text("one\n")
    assert src.stat().st_size < 100_000

    def read() -> None:
        list(iter_clean_pairs(src, trg))

    with pytest.raises(MTError) as exc:
        read()
    assert _one_line(exc) == (
        f"{src}:1: the line is longer than 1,048,576 bytes (data.max_line_bytes); a corpus holds "
        "one sentence a line: check the file, or raise data.max_line_bytes"
    )
    assert _peak(read) < 8 * MIB
    # Raised, the bound lets the line through.
    raised = CleanConfig(max_words=None, max_ratio=None, max_line_bytes=4 * MIB)
    src = _gzip_line(tmp_path / "short.de.gz", 2 * MIB)
    pairs = list(iter_clean_pairs(src, trg, raised))
    assert len(pairs) == 1 and len(pairs[0][0]) == 2 * MIB


def test_one_long_line_in_a_zip_member_is_an_error_naming_the_member(tmp_path: Path) -> None:
    archive = tmp_path / "corpus.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("c/train.de", b"b" * (8 * MIB) + b"\n")
        zf.writestr("c/train.en", b"one\n")
    assert archive.stat().st_size < 100_000

    def read() -> None:
        list(iter_text_pairs(Location(archive, "c/train.de"), Location(archive, "c/train.en")))

    with pytest.raises(
        MTError, match=rf"^{archive}:c/train.de:1: the line is longer than 1,048,576"
    ):
        read()
    assert _peak(read) < 8 * MIB


@pytest.mark.parametrize(
    ("name", "read"),
    [
        ("c.tsv", lambda loc, limits: iter_tsv_pairs(loc, limits=limits)),
        ("c.jsonl", lambda loc, limits: iter_jsonl_pairs(loc, limits=limits)),
        ("c.sgm", lambda loc, limits: iter_sgm_pairs(loc, loc, limits=limits)),
    ],
)
def test_every_line_reader_holds_lines_to_the_limit(tmp_path: Path, name: str, read) -> None:
    path = tmp_path / name
    path.write_text("short\t" + "x" * 200 + "\n")
    with pytest.raises(MTError, match=rf"^{path}:1: the line is longer than 100 bytes"):
        list(read(path, _limits(max_line_bytes=100)))


def test_a_long_line_in_a_training_source_stops_preparation_with_the_setting(
    tmp_path: Path,
) -> None:
    src = _gzip_line(tmp_path / "a.xx.gz", 3 * MIB, then=b"two\n")
    (tmp_path / "a.yy").write_text("one\ntwo\n")
    cfg = _config(tmp_path, f"{{src: {src}, trg: {tmp_path / 'a.yy'}}}")
    with pytest.raises(MTError, match=rf"{src}:1: the line is longer than 1,048,576 bytes"):
        prep.prepare(cfg, progress=False)
    assert not list((tmp_path / "cache").glob("spm-*")), "no tokenizer was trained"


def test_a_long_side_of_a_record_stops_extraction_with_the_setting(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    rows = [{"translation": {"xx": s, "yy": t}} for s, t in _pairs(20, 2)]
    rows[7]["translation"]["xx"] = "ü" * 600  # 1,200 bytes in UTF-8, 600 characters
    path = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    cfg = _config(tmp_path, f"{{parquet: {path}}}", "data.max_line_bytes=1000")
    with pytest.raises(MTError) as exc:
        prep.prepare(cfg, progress=False)
    assert _one_line(exc) == (
        f"c ({path}): pair 8: a side is longer than 1,000 bytes (data.max_line_bytes); check "
        "the source, or raise data.max_line_bytes"
    )
    assert not list((tmp_path / "cache").rglob("train.xx")), "nothing half-extracted is kept"


# --- archives ------------------------------------------------------------------------------------


def _tar(path: Path, members: dict[str, bytes], mode: str = "w:gz", **kwargs: object) -> Path:
    with tarfile.open(path, mode, **kwargs) as tar:  # type: ignore[call-overload]
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_zip_member_larger_than_the_bound_is_refused_before_it_is_read(tmp_path: Path) -> None:
    archive = tmp_path / "bomb.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("big.tsv", b"a\tb\n" * (4 * MIB // 4))
    limits = _limits(max_archive_bytes=MIB)
    start = time.perf_counter()
    with pytest.raises(MTError) as exc:
        list(iter_tsv_pairs(Location(archive, "big.tsv"), limits=limits))
    assert time.perf_counter() - start < 1.0  # the declared size, not the bytes, was checked
    assert _one_line(exc) == (
        f"{archive}:big.tsv: the member is 4,194,304 bytes, more than 1,048,576 "
        "(data.max_archive_bytes); unpack the archive and name the file itself, or raise "
        "data.max_archive_bytes"
    )


def test_a_tar_member_behind_a_large_one_is_refused_before_the_large_one_is_read(
    tmp_path: Path,
) -> None:
    archive = _tar(tmp_path / "c.tgz", {"filler": bytes(8 * MIB), "c.tsv": b"a\tb\n"})
    with pytest.raises(MTError) as exc:
        list(iter_tsv_pairs(Location(archive, "c.tsv"), limits=_limits(max_archive_bytes=MIB)))
    assert _one_line(exc).startswith(
        f"{archive}:c.tsv: reaching it passes 'filler' of 8,388,608 bytes: more than 1,048,576 "
        "in all (data.max_archive_bytes)"
    )
    assert list(iter_tsv_pairs(Location(archive, "c.tsv"))) == [("a", "b")]  # the default


def test_a_compressed_member_is_counted_as_it_decompresses(tmp_path: Path) -> None:
    lines = b"a\tb\n" * (4 * MIB // 4)  # 4 MiB of short lines: no line is long
    archive = _tar(tmp_path / "c.tar", {"c.tsv.gz": gzip.compress(lines)}, mode="w")
    read = []
    with pytest.raises(MTError) as exc:
        for pair in iter_tsv_pairs(
            Location(archive, "c.tsv.gz"), limits=_limits(max_archive_bytes=MIB)
        ):
            read.append(pair)
    assert _one_line(exc).startswith(
        f"{archive}:c.tsv.gz: decompresses to more than 1,048,576 bytes (data.max_archive_bytes)"
    )
    assert 0 < len(read) < MIB // 4 + 1  # stopped while reading, at the bound


def test_archives_with_too_many_members_are_refused(tmp_path: Path) -> None:
    members = {f"m{i}": b"" for i in range(20)} | {"c.tsv": b"a\tb\n"}
    limits = _limits(max_archive_members=10)
    tar = _tar(tmp_path / "many.tgz", members)
    with pytest.raises(MTError) as exc:
        list(iter_tsv_pairs(Location(tar, "c.tsv"), limits=limits))
    assert _one_line(exc) == (
        f"{tar}: the archive holds more than 10 members (data.max_archive_members); unpack it "
        "and name the file itself, or raise data.max_archive_members"
    )
    zipped = tmp_path / "many.zip"
    with zipfile.ZipFile(zipped, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    with pytest.raises(MTError, match=rf"^{zipped}: the archive holds 21 members, more than 10 "):
        list(iter_tsv_pairs(Location(zipped, "c.tsv"), limits=limits))
    assert list(iter_tsv_pairs(Location(zipped, "c.tsv"))) == [("a", "b")]


def test_a_tar_header_larger_than_the_line_bound_is_refused_before_it_is_read(
    tmp_path: Path,
) -> None:
    name = "d/" + "n" * 5000 + ".tsv"  # a pax header of 5,000+ bytes
    archive = _tar(tmp_path / "c.tgz", {name: b"a\tb\n"}, format=tarfile.PAX_FORMAT)
    with pytest.raises(MTError) as exc:
        list(iter_tsv_pairs(Location(archive, name), limits=_limits(max_line_bytes=1000)))
    assert "a member's name or pax header is" in _one_line(exc)
    assert "more than 1,000 (data.max_line_bytes)" in _one_line(exc)
    assert list(iter_tsv_pairs(Location(archive, name))) == [("a", "b")]


def test_archive_settings_reach_the_readers_from_the_config(tmp_path: Path) -> None:
    archive = _tar(
        tmp_path / "c.tgz", {f"m{i}": b"" for i in range(5)} | {"c.tsv": _tsv(_pairs(40, 1))}
    )
    cfg = _config(tmp_path, f"{{tsv: c.tsv, archive: {archive}}}", "data.max_archive_members=3")
    with pytest.raises(MTError, match=r"holds more than 3 members.*data.max_archive_members"):
        prep.prepare(cfg, progress=False)


# --- nesting and numbers -------------------------------------------------------------------------

TMX_HEAD = '<?xml version="1.0" encoding="UTF-8"?>\n<tmx version="1.4"><header/><body>\n'


def _tmx(path: Path, units: str) -> Path:
    path.write_text(TMX_HEAD + units + "</body></tmx>\n", encoding="utf-8")
    return path


def test_a_tmx_segment_nested_1000_deep_is_an_error_naming_the_line(tmp_path: Path) -> None:
    deep = "<hi>" * 1000 + "x" + "</hi>" * 1000
    path = _tmx(
        tmp_path / "deep.tmx",
        '<tu><tuv xml:lang="de"><seg>a</seg></tuv><tuv xml:lang="en"><seg>b</seg></tuv></tu>\n'
        f'<tu><tuv xml:lang="de"><seg>{deep}</seg></tuv><tuv xml:lang="en"><seg>b</seg></tuv></tu>'
        "\n",
    )
    with pytest.raises(MTError) as exc:
        list(iter_tmx_pairs(path, "de", "en"))
    assert _one_line(exc) == (
        f"{path}:4: XML elements nested more than 100 deep (data.max_nesting); check the file, "
        "or raise data.max_nesting"
    )
    # Within a raised bound, the text inside the <hi> elements is read (without recursion).
    deep = "<hi>" * 400 + "x" + "</hi>" * 400
    path = _tmx(
        tmp_path / "ok.tmx",
        f'<tu><tuv xml:lang="de"><seg>{deep} y</seg></tuv><tuv xml:lang="en"><seg>b</seg></tuv></tu>',
    )
    assert list(iter_tmx_pairs(path, "de", "en", limits=_limits(max_nesting=500))) == [("x y", "b")]


def test_a_tmx_unit_longer_than_the_line_bound_is_an_error_naming_its_line(tmp_path: Path) -> None:
    path = _tmx(
        tmp_path / "long.tmx",
        '<tu><tuv xml:lang="de"><seg>a</seg></tuv><tuv xml:lang="en"><seg>b</seg></tuv></tu>\n'
        f'<tu><tuv xml:lang="de"><seg>{"x" * 300_000}</seg></tuv></tu>\n',
    )
    stream = iter_tmx_pairs(path, "de", "en", limits=_limits(max_line_bytes=100_000))
    with pytest.raises(MTError) as exc:
        list(stream)
    assert _one_line(exc) == (
        f"{path}:4: the translation unit is longer than 100,000 bytes (data.max_line_bytes); "
        "check the file, or raise data.max_line_bytes"
    )


def test_a_jsonl_line_nested_5000_deep_is_an_error_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "deep.jsonl"
    good = json.dumps({"translation": {"de": "a", "en": "b"}})
    deep = '{"translation": {"de": "a", "en": "b"}, "x": ' + "[" * 5000 + "]" * 5000 + "}"
    path.write_text(f"{good}\n{deep}\n")
    with pytest.raises(MTError) as exc:
        list(iter_jsonl_pairs(path))
    assert _one_line(exc) == (
        f"{path}:2: JSON objects and arrays nested more than 100 deep (data.max_nesting); check "
        "the file, or raise data.max_nesting"
    )
    # Brackets inside strings are text, not nesting.
    text = "[" * 5000 + '\\"{'
    path.write_text(json.dumps({"translation": {"de": text, "en": "b"}}) + "\n")
    assert list(iter_jsonl_pairs(path)) == [(text, "b")]


def test_a_5000_digit_number_in_jsonl_is_read_or_refused_as_a_number(tmp_path: Path) -> None:
    path = tmp_path / "number.jsonl"
    digits = "9" * 5000
    path.write_text(f'{{"id": {digits}, "translation": {{"de": "a", "en": "b"}}}}\n')
    assert list(iter_jsonl_pairs(path)) == [("a", "b")]  # a field not read
    path.write_text(f'{{"translation": {{"de": {digits}, "en": "b"}}}}\n')
    with pytest.raises(MTError, match=rf"^{path}:1: field 'translation.de' is int, not a string$"):
        list(iter_jsonl_pairs(path))


# --- weights -------------------------------------------------------------------------------------


def test_a_weight_no_epoch_can_draw_is_refused_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(MTError) as exc:
        _config(tmp_path, "{tsv: a.tsv, weight: 1e12}")
    assert _one_line(exc) == (
        "data.train[0].weight is 1e+12; it must be finite and in (0, 1000]: an epoch draws a "
        "pair at most 1,000 times; to draw this source more than the others, lower the others' "
        "weights"
    )
    with pytest.raises(MTError) as exc:
        _config(tmp_path, "{tsv: a.tsv, weight: -1}")
    assert _one_line(exc) == "data.train[0].weight is -1; it must be finite and in (0, 1000]"
    _config(tmp_path, "{tsv: a.tsv, weight: 1000}")  # the most an epoch draws


# --- linear time ---------------------------------------------------------------------------------


def _sgm_time(path: Path, line: str) -> float:
    """The least of 3 times to read a .sgm file of one document holding ``line``."""
    path.write_text(f'<refset>\n<doc docid="1">\n{line}\n</doc>\n</refset>\n')
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        try:
            list(iter_sgm_pairs(path, path))
        except MTError as exc:
            assert "is not closed on its line" in str(exc)
        best = min(best, time.perf_counter() - start)
    return best


@pytest.mark.parametrize(
    "shape",
    [
        lambda n: "<seg>" * (n // 5),  # unclosed opens: once 381 s for 400 KB
        lambda n: "<doc docid=x " * (n // 13),  # tags without their ">"
        lambda n: "<seg id=1>" + "<doc " * (n // 5) + "</seg>",  # one long segment
        lambda n: '<seg id="1">x</seg>' * (n // 19),  # many closed segments on one line
    ],
    ids=["unclosed seg", "unended doc", "one long segment", "many segments"],
)
def test_an_sgm_line_is_read_in_linear_time(tmp_path: Path, shape: Callable[[int], str]) -> None:
    small = _sgm_time(tmp_path / "small.sgm", shape(100_000))
    large = _sgm_time(tmp_path / "large.sgm", shape(400_000))
    # 4x the input: linear time is ~4x (quadratic would be 16x); loose for a busy machine.
    assert large < 2.0, f"{large:.2f} s for 400 KB"
    assert large < 10 * small + 0.05, f"{small:.4f} s for 100 KB, {large:.4f} s for 400 KB"


def test_the_sgm_reader_still_pairs_segments_and_refuses_unclosed_ones(tmp_path: Path) -> None:
    src, trg = tmp_path / "s.sgm", tmp_path / "t.sgm"
    src.write_text('<doc docid="d"><seg id="1">a &amp; b</seg> <seg id=2>c <b>x</b></seg></doc>\n')
    trg.write_text('<doc docid="d">\n<seg id="1">A</seg>\n<seg id="2">C</seg>\n</doc>\n')
    assert list(iter_sgm_pairs(src, trg)) == [("a & b", "A"), ("c <b>x</b>", "C")]
    src.write_text('<seg id="1">a <seg id="2">b</seg>\n')
    with pytest.raises(MTError, match=rf"^{src}:1: <seg> is not closed on its line"):
        list(iter_sgm_pairs(src, trg))


# --- damaged caches ------------------------------------------------------------------------------


@pytest.fixture
def sacrebleu_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """wmt14/full de-en in a sacrebleu cache under tmp_path, as sacrebleu leaves it."""
    import sacrebleu.utils
    from sacrebleu.dataset import DATASETS

    dataset = DATASETS["wmt14/full"]
    root = tmp_path / "sacrebleu"
    monkeypatch.setattr(sacrebleu.utils, "SACREBLEU_DIR", str(root))
    monkeypatch.setattr(dataset, "_outdir", str(root / "wmt14" / "full"))
    monkeypatch.setattr(dataset, "_rawdir", str(root / "wmt14" / "full" / "raw"))
    text = {
        "src": "Ein Hund\n",
        "ref": "A dog\n",
        "docid": "1\n",
        "genre": "n\n",
        "origlang": "de\n",
    }
    files = {}
    for field in dataset.fieldnames("de-en"):
        files[field] = Path(dataset._get_txt_file_path("de-en", field))
        files[field].parent.mkdir(parents=True, exist_ok=True)
        files[field].write_text(text[field])
    return dataset, root / "wmt14" / "full", files


def test_a_damaged_sacrebleu_cache_names_the_folder_to_delete(sacrebleu_cache) -> None:
    from transformer_mt.data.external import sacrebleu_pairs

    dataset, where, files = sacrebleu_cache
    assert list(sacrebleu_pairs("wmt14/full", "de", "en")) == [("Ein Hund", "A dog")]

    files["src"].write_bytes(b"Ein \xff Hund\n")  # not UTF-8
    with pytest.raises(MTError) as exc:
        list(sacrebleu_pairs("wmt14/full", "de", "en"))
    assert _one_line(exc).endswith(
        f"sacrebleu's cache is damaged: delete {where} so that sacrebleu makes it again"
    )

    files["src"].write_bytes(b"x" * 2000 + b"\n")  # a line no test set has
    with pytest.raises(MTError, match=rf"longer than 1,000 bytes.*: delete {where}$"):
        list(sacrebleu_pairs("wmt14/full", "de", "en", max_line_bytes=1000))

    # Its raw files damaged, and the text made from them gone: sacrebleu converts them again.
    for path in files.values():
        path.unlink()
    raw = Path(dataset._rawdir)
    raw.mkdir(parents=True)
    (raw / f"wmt14_full.{Path(dataset.data[0]).name}").write_bytes(b"a tarball")  # not fetched
    for name in dataset.langpairs["de-en"]:
        (raw / name).parent.mkdir(parents=True, exist_ok=True)
        (raw / name).write_bytes(b'<seg id="1">\xff</seg>\n')
    with pytest.raises(MTError) as exc:
        list(sacrebleu_pairs("wmt14/full", "de", "en"))
    assert _one_line(exc).startswith(f"sacrebleu's copy of wmt14/full in {where} is damaged (")
    assert _one_line(exc).endswith(f"delete {where} so that sacrebleu fetches it again")


_HF_SCENARIO = """
import json, sys
from pathlib import Path
import datasets
datasets.disable_progress_bars()
from transformer_mt.data.external import hf_pairs
from transformer_mt.errors import MTError

work = Path(sys.argv[1])
out = {}
def outcome(name, path):
    try:
        out[name] = list(hf_pairs(str(path), None, "train", "de", "en"))
    except MTError as exc:
        out[name] = "MTError: " + str(exc)

rows = [{"translation": {"de": f"satz {i}", "en": f"sentence {i}"}} for i in range(300)]
saved = work / "saved"
datasets.Dataset.from_list(rows).save_to_disk(str(saved))
arrow = next(saved.glob("*.arrow"))
data = arrow.read_bytes()
outcome("intact", saved)
arrow.write_bytes(data[: len(data) // 2])
outcome("cut short", saved)
damaged = bytearray(data)
for i in range(len(data) // 3, len(data) - 200, 97):  # offsets and text overwritten
    damaged[i] = 0xFF
arrow.write_bytes(bytes(damaged))
outcome("overwritten", saved)
arrow.write_bytes(data)
(saved / "state.json").write_text("{not json")
outcome("state", saved)

scripted = work / "scripted"
scripted.mkdir()
(scripted / "scripted.py").write_text(f"open({str(work / 'ran')!r}, 'w').write('ran')")
(scripted / "train.jsonl").write_text(json.dumps(rows[0]) + "\\n")
outcome("script", scripted)
out["ran"] = (work / "ran").exists()
print(json.dumps(out))
"""


def test_a_damaged_saved_dataset_or_a_loading_script_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    done = subprocess.run(
        [sys.executable, "-c", _HF_SCENARIO, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.splitlines()[-1])
    saved = tmp_path / "saved"
    assert len(out["intact"]) == 300
    for case in ("cut short", "overwritten", "state"):
        assert out[case].startswith(
            f"MTError: {saved}: the dataset saved with save_to_disk is damaged ("
        ), out[case]
        assert out[case].endswith(f"); delete {saved} and save it again"), out[case]
        assert "\n" not in out[case]
    assert out["script"] == (
        f"MTError: {tmp_path / 'scripted'}: holds scripted.py, a dataset loading script; scripts "
        "are never run: give a directory of data files (parquet, jsonl, csv, arrow) or one saved "
        "with save_to_disk"
    )
    assert out["ran"] is False


# --- both sides the same input -------------------------------------------------------------------


def _tsv(pairs: list[tuple[str, str]]) -> bytes:
    return "".join(f"{s}\t{t}\n" for s, t in pairs).encode()


def _config(tmp_path: Path, train: str, *overrides: str, valid: str | None = None):
    """A config of one training source and a small validation pair (written here)."""
    pairs = _pairs(30, 4)
    (tmp_path / "v.xx").write_text("".join(s + "\n" for s, _ in pairs))
    (tmp_path / "v.yy").write_text("".join(t + "\n" for _, t in pairs))
    valid = valid or f"{{src: {tmp_path / 'v.xx'}, trg: {tmp_path / 'v.yy'}}}"
    path = tmp_path / "c.yaml"
    path.write_text(
        "name: bounds\n"
        "data:\n  src_lang: xx\n  trg_lang: yy\n"
        f"  cache_dir: {tmp_path / 'cache'}\n"
        f"  train:\n    - {train}\n  valid: {valid}\n"
        "tokenizer:\n  vocab_size: 120\n"
    )
    return load_config(path, list(overrides))


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "a.xx").write_text("a\n")
    (tmp_path / "a.yy").write_text("b\n")
    (tmp_path / "link.xx").symlink_to(tmp_path / "a.xx")
    os.link(tmp_path / "a.xx", tmp_path / "hard.xx")
    return tmp_path


SAME = {
    "one file twice": (
        "{src: D/a.xx, trg: D/./a.xx}",
        "data.train[0].src and data.train[0].trg are the same file (D/a.xx); give the "
        "source-language file and the target-language file",
    ),
    "a symbolic link": ("{src: D/a.xx, trg: D/link.xx}", "are the same file (D/a.xx)"),
    "a hard link": ("{src: D/a.xx, trg: D/hard.xx}", "are the same file (D/a.xx)"),
    "one archive member": (
        "{src: c/a.xx, trg: ./c/a.xx, archive: D/c.tgz}",
        "data.train[0].src and data.train[0].trg are the same file (c/a.xx in D/c.tgz)",
    ),
    "one column": (
        "{tsv: D/a.tsv, columns: [1, 1]}",
        "data.train[0].columns[0] and data.train[0].columns[1] are both 1; both sides would "
        "read column 1 of D/a.tsv: give one for each side",
    ),
    "one jsonl field": (
        "{jsonl: D/a.jsonl, fields: [t.x, t.x]}",
        "data.train[0].fields[0] and data.train[0].fields[1] are both 't.x'; both sides would "
        "read the field t.x of D/a.jsonl",
    ),
    "one language's field": (
        "{jsonl: D/a.jsonl, trg_lang: xx}",
        "data.src_lang and data.train[0].trg_lang are both 'xx'",
    ),
    "one parquet field": (
        "{parquet: D/a.parquet, fields: [s, s]}",
        "data.train[0].fields[0] and data.train[0].fields[1] are both 's'",
    ),
    "one hf field": (
        "{hf: org/set, src_lang: yy}",
        "data.train[0].src_lang and data.trg_lang are both 'yy'; both sides would read the "
        "field translation.yy of org/set",
    ),
    "one TMX language": (
        "{tmx: D/a.tmx, src_lang: de-DE, trg_lang: de_AT}",
        "data.train[0].src_lang and data.train[0].trg_lang are 'de-DE' and 'de_AT', both "
        "language de; TMX units are matched by primary language: give two languages",
    ),
    "one corpus language": (
        "{corpus: multi30k, src_lang: de, trg_lang: de}",
        "data.train[0].src_lang and data.train[0].trg_lang are both 'de'; multi30k holds one "
        "file a language: give two languages",
    ),
    "one toy language": (
        "{corpus: toy, trg_lang: xx}",
        "data.src_lang and data.train[0].trg_lang are both 'xx'; toy holds one file a language",
    ),
    "one sacrebleu language": (
        "{sacrebleu: wmt14/full, trg_lang: xx}",
        "data.src_lang and data.train[0].trg_lang are both 'xx'; both sides would read "
        "language xx of wmt14/full",
    ),
    "one mtdata language": (
        "{mtdata: Statmt-news_commentary-16-deu-eng, src_lang: yy}",
        "data.train[0].src_lang and data.trg_lang are both 'yy'",
    ),
}


@pytest.mark.parametrize("case", list(SAME))
def test_every_kind_of_source_refuses_one_input_for_both_sides(files: Path, case: str) -> None:
    source, message = SAME[case]
    cfg = _config(files, source.replace("D/", f"{files}/"))
    with pytest.raises(MTError) as exc:
        check_source(cfg)  # before any file is read or fetched
    assert message.replace("D/", f"{files}/") in _one_line(exc)


@pytest.mark.parametrize("split", ["valid", "test"])
def test_validation_and_test_sources_are_held_to_the_same_rule(files: Path, split: str) -> None:
    same = f"{{src: {files}/a.xx, trg: {files}/link.xx}}"
    extra = [f"data.test=[{same}]"] if split == "test" else []
    cfg = _config(
        files,
        f"{{src: {files}/a.xx, trg: {files}/a.yy}}",
        *extra,
        valid=same if split == "valid" else None,
    )
    with pytest.raises(MTError, match=rf"^data\.{split}\[0\]\.src and data\.{split}\[0\]\.trg are"):
        check_source(cfg)


def test_sources_whose_sides_differ_pass(files: Path) -> None:
    for source in (
        f"{{src: {files}/a.xx, trg: {files}/a.yy}}",
        f"{{tsv: {files}/a.tsv, columns: [1, 0]}}",
        f"{{jsonl: {files}/a.jsonl}}",
        f"{{tmx: {files}/a.tmx, src_lang: de-DE, trg_lang: en}}",
        f"{{src: c/a.xx, trg: c/a.yy, archive: {files}/c.tgz}}",
    ):
        check_source(_config(files, source))


def test_a_local_corpus_uses_the_same_rule(files: Path) -> None:
    base = [
        "data.corpus=local",
        f"data.train_src={files}/a.xx",
        f"data.train_trg={files}/a.yy",
        f"data.valid_src={files}/a.xx",
    ]
    cfg = load_config(None, [*base, f"data.valid_trg={files}/hard.xx"])
    with pytest.raises(MTError) as exc:
        check_source(cfg)
    assert _one_line(exc) == (
        f"data.valid_src and data.valid_trg are the same file ({files}/a.xx); give the "
        "source-language file and the target-language file"
    )
    check_source(load_config(None, [*base, f"data.valid_trg={files}/a.yy"]))


def test_a_toy_or_registry_corpus_of_one_language_is_refused() -> None:
    with pytest.raises(MTError, match=r"^data.src_lang and data.trg_lang are both 'src'; the toy"):
        check_source(load_config(None, ["data.trg_lang=src"]))
    with pytest.raises(MTError, match=r"^data.src_lang and data.trg_lang are both 'de'; pick two"):
        check_source(
            load_config(None, ["data.corpus=multi30k", "data.src_lang=de", "data.trg_lang=de"])
        )
