"""The corpus readers on files written here: plain, compressed and inside archives; every bad input
is one MTError naming the file and the line; a large TMX is read in flat memory."""

from __future__ import annotations

import bz2
import functools
import gzip
import hashlib
import http.server
import io
import json
import lzma
import sys
import tarfile
import threading
import tracemalloc
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from transformer_mt.data.corpus import clean_parallel
from transformer_mt.data.download import download_corpus
from transformer_mt.data.readers import (
    Location,
    TmxStats,
    clean_segment,
    iter_iwslt_pairs,
    iter_jsonl_pairs,
    iter_parquet_pairs,
    iter_sgm_pairs,
    iter_text_pairs,
    iter_tmx_pairs,
    iter_tsv_pairs,
    open_location,
    write_pairs,
)
from transformer_mt.data.registry import Corpus, CorpusFile
from transformer_mt.errors import MTError

DE = b"Ein Hund .\n\xc3\x9cber die Br\xc3\xbccke\n"
EN = b"A dog .\nOver the bridge\n"
PAIRS = [("Ein Hund .", "A dog ."), ("Über die Brücke", "Over the bridge")]


def _write(path: Path, data: bytes | str) -> Path:
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


def _tar(path: Path, members: dict[str, bytes], mode: str) -> Path:
    with tarfile.open(path, mode) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


# --- one sentence per line: normalisation, length, UTF-8, compression ---------------------------


def test_breaks_inside_a_segment_become_spaces_and_outer_whitespace_goes(tmp_path: Path) -> None:
    src = _write(
        tmp_path / "s.de", "\ufeffeins\u2028zwei\r\n  drei\rvier \n f\u00fcnf\u0085sechs\n"
    )
    trg = _write(tmp_path / "s.en", "one\u2029two\nthree\tfour\n\n")
    assert list(iter_text_pairs(src, trg)) == [
        ("eins zwei", "one two"),
        ("drei vier", "three four"),
        ("fünf sechs", ""),  # an empty side is yielded: cleaning drops and counts it
    ]
    assert clean_segment(" a\nb\x0bc\x0cd\x1ce\u2028f\t ") == "a b c d e f"


@pytest.mark.parametrize("longer", ["src", "trg"])
def test_sides_of_different_length_name_both_files_and_the_line(
    tmp_path: Path, longer: str
) -> None:
    three, two = "a\nb\nc\n", "x\ny\n"
    src = _write(tmp_path / "s.de", three if longer == "src" else two)
    trg = _write(tmp_path / "s.en", two if longer == "src" else three)
    long_, short = (src, trg) if longer == "src" else (trg, src)
    with pytest.raises(MTError) as info:
        list(iter_text_pairs(src, trg))
    message = str(info.value)
    assert message.startswith(f"{long_}:3: line 3 has no partner: {short} ends after 2 lines")
    assert "has 3" in message and "\n" not in message


@pytest.mark.parametrize(
    "make",
    [
        lambda d: _write(d / "bad.de", b"gut\nschlecht \xff\n"),
        lambda d: _write(d / "bad.de.xz", lzma.compress(b"gut\nschlecht \xff\n")),
        lambda d: Location(
            _tar(d / "c.tgz", {"bad.de": b"gut\nschlecht \xff\n"}, "w:gz"), "bad.de"
        ),
    ],
    ids=["plain", "xz", "tar member"],
)
def test_invalid_utf8_names_the_file_and_line(tmp_path: Path, make) -> None:
    src = make(tmp_path)
    trg = _write(tmp_path / "t.en", "good\nbad\n")
    with pytest.raises(MTError, match=r"bad\.de(\.xz)?:2: invalid UTF-8"):
        list(iter_text_pairs(src, trg))


@pytest.mark.parametrize(
    "compress", [gzip.compress, lzma.compress, bz2.compress], ids=["gz", "xz", "bz2"]
)
@pytest.mark.parametrize("by", ["suffix", "magic"])
def test_compressed_files_read_as_plain_ones(tmp_path: Path, compress, by: str) -> None:
    suffix = {gzip.compress: ".gz", lzma.compress: ".xz", bz2.compress: ".bz2"}[compress]
    name = "c.de" + (suffix if by == "suffix" else "")
    src = _write(tmp_path / name, compress(DE))
    trg = _write(tmp_path / "c.en", EN)
    assert list(iter_text_pairs(src, trg)) == PAIRS
    # data/corpus.py's cleaning reads them the same way.
    assert clean_parallel(src, trg)[:2] == ([s for s, _ in PAIRS], [t for _, t in PAIRS])


def test_text_that_starts_like_bzip2_is_not_taken_for_it(tmp_path: Path) -> None:
    src = _write(tmp_path / "b.de", "BZh9 ist kein Archiv\n")
    trg = _write(tmp_path / "b.en", "BZh9 is no archive\n")
    assert list(iter_text_pairs(src, trg)) == [("BZh9 ist kein Archiv", "BZh9 is no archive")]


@pytest.mark.parametrize("compress", [lzma.compress, bz2.compress], ids=["xz", "bz2"])
def test_truncated_compressed_file_names_the_file(tmp_path: Path, compress) -> None:
    data = compress("".join(f"Satz {i} hier\n" for i in range(30_000)).encode())
    src = _write(tmp_path / "t.de.z", data[: len(data) // 2])
    trg = _write(tmp_path / "t.en", "x\n" * 30_000)
    with pytest.raises(MTError, match=r"t\.de\.z:\d+: .*corrupt or truncated"):
        list(iter_text_pairs(src, trg))
    with pytest.raises(MTError, match=r"t\.de\.z(:\d+)?: .*corrupt or truncated"):
        clean_parallel(src, trg)


# --- archives ------------------------------------------------------------------------------------

MEMBERS = {"de-en/train.de": DE, "de-en/train.en.gz": gzip.compress(EN), "de-en/README": b"hi\n"}


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("c.tgz", lambda p: _tar(p, MEMBERS, "w:gz")),
        ("c.tar.xz", lambda p: _tar(p, MEMBERS, "w:xz")),
        ("c.tar.bz2", lambda p: _tar(p, MEMBERS, "w:bz2")),
        ("c.tar", lambda p: _tar(p, MEMBERS, "w")),
        ("c.zip", lambda p: _zip(p, MEMBERS)),
        ("c.bin", lambda p: _zip(p, MEMBERS)),  # a zip without the suffix: told by its content
    ],
)
def test_archive_members_read_in_place(tmp_path: Path, name: str, make) -> None:
    archive = make(tmp_path / name)
    src = Location(archive, "de-en/train.de")
    trg = Location(archive, "de-en/train.en.gz")  # a .gz member is decompressed too
    assert list(iter_text_pairs(src, trg)) == PAIRS
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # nothing unpacked
    with open_location(src) as f:
        assert f.read() == DE


@pytest.mark.parametrize("name", ["c.tgz", "c.zip"])
def test_missing_member_names_the_archive_and_similar_members(tmp_path: Path, name: str) -> None:
    archive = (_tar if name.endswith("tgz") else _zip)(
        tmp_path / name, MEMBERS, *(["w:gz"] if name.endswith("tgz") else [])
    )
    with pytest.raises(MTError) as info:
        list(iter_text_pairs(Location(archive, "train.de"), tmp_path / "unused"))
    message = str(info.value)
    assert message.startswith(f"{archive}: no member 'train.de'")
    assert "'de-en/train.de'" in message and "\n" not in message


def test_location_reads_as_the_user_wrote_it(tmp_path: Path) -> None:
    assert str(Location(Path("corpus.tgz"), "de-en/train.de")) == "corpus.tgz:de-en/train.de"
    assert str(Location("train.de")) == "train.de"
    assert Location.parse("data/train.de") == Location(Path("data/train.de"))
    assert Location.parse("d/a.TGZ:b:c") == Location(Path("d/a.TGZ"), "b:c")
    assert Location.parse("x.tar.xz:de-en/train.de") == Location(Path("x.tar.xz"), "de-en/train.de")
    with pytest.raises(MTError, match=r"nope\.tgz: file not found"):
        list(iter_text_pairs(Location(tmp_path / "nope.tgz", "x"), Location(tmp_path / "y")))
    not_archive = _write(tmp_path / "plain.tgz", "just text\n")
    with pytest.raises(MTError, match=r"plain\.tgz: cannot read the archive"):
        list(iter_text_pairs(Location(not_archive, "x"), Location(not_archive, "y")))


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # keep pytest output clean
        pass


@pytest.fixture
def loopback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str]]:
    """A static file server on 127.0.0.1: (served directory, base URL)."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)  # 127.0.0.1 must not go through a proxy
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


def test_downloaded_archive_is_read_member_by_member(
    loopback: tuple[Path, str], tmp_path: Path
) -> None:
    root, url = loopback
    archive = _tar(root / "de-en.tgz", {"de-en/train.tags.de-en.de": DE}, "w:gz")
    _zip(root / "de-en.zip", {"de-en/train.tags.de-en.en": EN})
    files = tuple(
        CorpusFile(p.name, hashlib.sha256(p.read_bytes()).hexdigest(), "none", p.name)
        for p in (archive, root / "de-en.zip")
    )
    corpus = Corpus("tiny", "a test corpus", "http://unused.invalid/", files)
    tgz, zipped = download_corpus(corpus, tmp_path / "dest", url, progress=False)
    pairs = iter_iwslt_pairs(
        Location(tgz, "de-en/train.tags.de-en.de"), Location(zipped, "de-en/train.tags.de-en.en")
    )
    assert list(pairs) == PAIRS


# --- TSV, JSON lines, Parquet --------------------------------------------------------------------


def test_tsv_columns_are_picked_and_quotes_are_text(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.tsv", '0.9\t"Ja," sagte er\t"Yes," he said\n0.8\tzwei\ttwo\r\n')
    assert list(iter_tsv_pairs(path, columns=(1, 2))) == [
        ('"Ja," sagte er', '"Yes," he said'),
        ("zwei", "two"),
    ]
    assert list(iter_tsv_pairs(path, columns=(2, 1)))[1] == ("two", "zwei")


def test_tsv_line_lacking_a_column_names_file_line_and_column(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.tsv.gz", gzip.compress(b"eins\tone\nzwei two\n"))
    with pytest.raises(MTError, match=r"c\.tsv\.gz:2: has 1 column, needs column 1 "):
        list(iter_tsv_pairs(path))


def test_jsonl_dotted_fields_read_nested_objects(tmp_path: Path) -> None:
    lines = [
        {"id": 1, "translation": {"de": "Hallo\nWelt", "en": "Hello world"}},
        {"id": 2, "translation": {"de": "", "en": "empty"}},
    ]
    path = _write(tmp_path / "c.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n\n")
    assert list(iter_jsonl_pairs(path)) == [("Hallo Welt", "Hello world"), ("", "empty")]
    swapped = list(iter_jsonl_pairs(path, ("translation.en", "translation.de")))
    assert swapped[0] == ("Hello world", "Hallo Welt")


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ('{"translation": {"de": "a", "en": "b"', r"c\.jsonl:2: bad JSON"),
        ('{"translation": {"de": "a"}}', r"c\.jsonl:2: no field 'translation\.en'"),
        ('{"translation": "de"}', r"c\.jsonl:2: no field 'translation\.de'"),
        ('{"translation": {"de": "a", "en": 3}}', r"c\.jsonl:2: field 'translation\.en' is int"),
        (
            '{"translation": {"de": null, "en": "b"}}',
            r"c\.jsonl:2: field 'translation\.de' is null",
        ),
        ('{"translation": {"de": "\\ud800", "en": "b"}}', r"c\.jsonl:2: field 'translation\.de'"),
    ],
    ids=["bad json", "missing field", "not an object", "not a string", "null", "surrogate"],
)
def test_bad_jsonl_names_file_line_and_field(tmp_path: Path, line: str, error: str) -> None:
    good = '{"translation": {"de": "a", "en": "b"}}'
    path = _write(tmp_path / "c.jsonl", f"{good}\n{line}\n")
    with pytest.raises(MTError, match=error):
        list(iter_jsonl_pairs(path))


def test_parquet_struct_fields_stream_across_record_batches(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [{"de": f"Satz {i}\n.", "en": f"sentence {i} ."} for i in range(10)]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"translation": rows, "id": list(range(10))}), path, row_group_size=4)
    pairs = list(iter_parquet_pairs(path, ("translation.de", "translation.en"), batch_rows=3))
    assert pairs == [(f"Satz {i} .", f"sentence {i} .") for i in range(10)]

    pq.write_table(pa.table({"translation": rows[:4] + [None]}), path)
    with pytest.raises(MTError, match=r"train\.parquet: row 5: field 'translation\.de' is null"):
        list(iter_parquet_pairs(path, batch_rows=2))
    with pytest.raises(MTError, match=r"no field 'translation\.fr' .*\['de', 'en'\]"):
        list(iter_parquet_pairs(path, ("translation.fr", "translation.en")))
    with pytest.raises(MTError, match=r"no column 'de' "):
        list(iter_parquet_pairs(path, ("de", "en")))
    bad = _write(tmp_path / "bad.parquet", b"PAR1 not really")
    with pytest.raises(MTError, match=r"bad\.parquet: cannot read it as Parquet"):
        list(iter_parquet_pairs(bad))


def test_parquet_without_pyarrow_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("pyarrow", "pyarrow.parquet", "pyarrow.compute"):
        monkeypatch.setitem(sys.modules, name, None)  # `import pyarrow` now fails
    with pytest.raises(MTError, match=r"needs pyarrow; pip install 'transformer-mt\[hf\]'$"):
        list(iter_parquet_pairs(tmp_path / "train.parquet"))


# --- SGML (WMT) and IWSLT ------------------------------------------------------------------------

SRC_SGM = """<srcset setid="newstest2014" srclang="any">
<doc sysid="ref" docid="d1" genr="news" origlang="en">
<hl><seg id="1">Tom &amp; Jerry</seg></hl>
<p>
<seg id="2">AT&T &quot;sagt&quot; &lt;nein&gt;</seg><seg id="3"> zwei auf einer Zeile </seg>
</p>
</doc>
<doc docid="d2">
<seg id="1">Ende</seg>
</doc>
</srcset>
"""
TRG_SGM = (
    SRC_SGM.replace("srcset", "refset")
    .replace("Tom &amp; Jerry", "Tom and Jerry")
    .replace("AT&T &quot;sagt&quot; &lt;nein&gt;", "AT&T says no")
    .replace(" zwei auf einer Zeile ", "two on one line")
    .replace("Ende", "End")
)


def test_sgm_segments_pair_by_document_and_id_with_entities_decoded(tmp_path: Path) -> None:
    src = _write(tmp_path / "newstest.de.sgm", SRC_SGM)
    trg = _write(tmp_path / "newstest.en.sgm", TRG_SGM)
    assert list(iter_sgm_pairs(src, trg)) == [
        ("Tom & Jerry", "Tom and Jerry"),
        ('AT&T "sagt" <nein>', "AT&T says no"),
        ("zwei auf einer Zeile", "two on one line"),
        ("Ende", "End"),
    ]
    # Without ids, segments pair by their order.
    no_ids = _write(
        tmp_path / "plain.en.sgm", TRG_SGM.replace(' id="1"', "").replace(' id="2"', "")
    )
    assert len(list(iter_sgm_pairs(src, no_ids))) == 4


@pytest.mark.parametrize(
    ("edit", "error"),
    [
        (
            lambda t: t.replace('<seg id="3">', '<seg id="4">'),
            r"e\.sgm:5: segment .*'4'.*d\.sgm:5 .*'3'",
        ),
        (lambda t: t.replace('docid="d2"', 'docid="d3"'), r"e\.sgm:9: segment \(doc 'd3'"),
        (lambda t: t.replace('<seg id="1">End</seg>\n', ""), r"d\.sgm:9: segment 4 has no "),
        (lambda t: t.replace("two on one line</seg>", "two on"), r"e\.sgm:5: <seg> is not closed"),
    ],
    ids=["seg id", "doc id", "count", "unclosed"],
)
def test_sgm_mismatch_names_file_and_line(tmp_path: Path, edit, error: str) -> None:
    src = _write(tmp_path / "d.sgm", SRC_SGM)
    trg = _write(tmp_path / "e.sgm", edit(TRG_SGM))
    with pytest.raises(MTError, match=error):
        list(iter_sgm_pairs(src, trg))


TAGS_DE = """<doc docid="1" genre="lectures">
<url>http://www.ted.com/talks/a</url>
<keywords>talks, science</keywords>
<speaker>A</speaker>
<talkid>1</talkid>
<title>Titel</title>
<description>Beschreibung</description>
<translator href="x">T</translator>
Erster Satz.
  Zweiter Satz.
</doc>
"""
TAGS_EN = """<doc docid="1" genre="lectures">
<url>http://www.ted.com/talks/a</url>
<keywords>talks, science</keywords>
<speaker>A</speaker>
<talkid>1</talkid>
<title>Title</title>
<description>Description</description>
First sentence.
Second sentence.
</doc>
"""


def test_iwslt_tags_files_leave_out_markup_lines(tmp_path: Path) -> None:
    # The German file has a <translator> line that the English one lacks: each side drops its own.
    src = _write(tmp_path / "train.tags.de-en.de", TAGS_DE)
    trg = _write(tmp_path / "train.tags.de-en.en.gz", gzip.compress(TAGS_EN.encode()))
    assert list(iter_iwslt_pairs(src, trg)) == [
        ("Erster Satz.", "First sentence."),
        ("Zweiter Satz.", "Second sentence."),
    ]
    short = _write(tmp_path / "short.en", TAGS_EN.replace("Second sentence.\n", ""))
    with pytest.raises(MTError, match=r"train\.tags\.de-en\.de:10: text line 2 has no partner"):
        list(iter_iwslt_pairs(src, short))


def test_iwslt_xml_files_pair_their_segments(tmp_path: Path) -> None:
    xml = """<?xml version="1.0" encoding="UTF-8"?>
<mteval>
<srcset setid="iwslt2017-dev2010" srclang="german">
<doc docid="535" genre="lectures">
<url>http://www.ted.com/talks/x.html</url>
<talkid>535</talkid>
<seg id="1"> {one} </seg>
<seg id="2"> {two} </seg>
</doc>
</srcset>
</mteval>
"""
    src = _write(tmp_path / "IWSLT17.TED.dev2010.de-en.de.xml", xml.format(one="Eins", two="Zwei"))
    trg = _write(tmp_path / "IWSLT17.TED.dev2010.de-en.en.xml", xml.format(one="One", two="Two"))
    assert list(iter_iwslt_pairs(src, trg)) == [("Eins", "One"), ("Zwei", "Two")]
    with pytest.raises(MTError, match=r"one is an IWSLT \.xml file and the other is not"):
        list(iter_iwslt_pairs(src, tmp_path / "train.tags.de-en.en"))


# --- TMX -----------------------------------------------------------------------------------------

TMX = """<?xml version="1.0" encoding="UTF-8"?>
<tmx version="1.4">
<header srclang="en" datatype="plaintext" segtype="sentence" adminlang="en" o-tmf="x"/>
<body>
<tu><tuv xml:lang="EN-us"><seg>Click <bpt i="1">&lt;b&gt;</bpt>Save<ept i="1">&lt;/b&gt;</ept>.</seg></tuv>
<tuv xml:lang="de-DE"><seg>Klicken Sie auf <ph x="1">{{0}}</ph><hi type="b">Speichern</hi>.</seg></tuv></tu>
<tu><prop type="x">ignored</prop><tuv lang="fr"><seg>Bonjour</seg></tuv>
<tuv lang="EN"><seg>Hello</seg></tuv></tu>
<tu><tuv xml:lang="en"><seg>two
lines</seg></tuv><tuv xml:lang="de"><seg>zwei&#x2028;Zeilen</seg></tuv></tu>
{extra}</body>
</tmx>
"""


def test_tmx_pairs_by_primary_language_with_the_text_a_reader_sees(tmp_path: Path) -> None:
    path = _write(tmp_path / "memory.tmx.gz", gzip.compress(TMX.format(extra="").encode()))
    stats = TmxStats()
    pairs = list(iter_tmx_pairs(path, "de", "en", stats))
    assert pairs == [("Klicken Sie auf Speichern.", "Click Save."), ("zwei Zeilen", "two lines")]
    assert (stats.units, stats.skipped, stats.pairs) == (3, 1, 2)
    assert "skipped 1 without both de and en" in stats.format("de", "en")
    assert list(iter_tmx_pairs(path, "fr", "EN-GB")) == [("Bonjour", "Hello")]


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ("<tu><tuv xml:lang='de'><seg>offen</tuv></tu>\n", r"m\.tmx:11: malformed TMX \("),
        ("<tu><tuv xml:lang='de'><seg>A & B</seg></tuv></tu>\n", r"m\.tmx:11: malformed TMX"),
        ("<tu><tuv xml:lang='de'><seg>\udcff</seg></tuv></tu>\n", r"m\.tmx:11: invalid UTF-8"),
    ],
    ids=["mismatched tag", "bare ampersand", "bad utf-8"],
)
def test_malformed_tmx_names_file_and_line(tmp_path: Path, extra: str, error: str) -> None:
    data = TMX.format(extra=extra).encode("utf-8", errors="surrogateescape")
    path = _write(tmp_path / "m.tmx", data)
    with pytest.raises(MTError, match=error):
        list(iter_tmx_pairs(path, "de", "en"))


def test_tmx_memory_stays_flat_on_a_large_file(tmp_path: Path) -> None:
    units = 60_000
    unit = (
        '<tu><tuv xml:lang="de"><seg>Satz Nummer {0} .</seg></tuv>'
        '<tuv xml:lang="en"><seg>sentence number {0} .</seg></tuv></tu>\n'
    )
    path = tmp_path / "big.tmx"
    with path.open("w", encoding="utf-8") as f:
        f.write(TMX.split("<body>")[0] + "<body>\n")
        f.writelines(unit.format(i) for i in range(units))
        f.write("</body>\n</tmx>\n")
    assert path.stat().st_size > 6_000_000
    tracemalloc.start()
    try:
        count = sum(1 for _ in iter_tmx_pairs(path, "de", "en"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == units
    assert peak < 1_500_000, f"peak {peak:,} bytes: the parsed tree is not being freed"


# --- writing -------------------------------------------------------------------------------------


def test_write_pairs_streams_two_aligned_files_and_counts(tmp_path: Path) -> None:
    src, trg = tmp_path / "out" / "train.de", tmp_path / "out" / "train.en"
    n = write_pairs(iter([("eins\nzwei", "one two"), ("", "empty")]), src, trg)
    assert n == 2
    assert src.read_bytes() == b"eins zwei\n\n" and trg.read_bytes() == b"one two\nempty\n"


def test_write_pairs_leaves_both_files_untouched_when_reading_fails(tmp_path: Path) -> None:
    src, trg = tmp_path / "train.de", tmp_path / "train.en"
    src.write_text("old de\n")
    bad_src = _write(tmp_path / "in.de", "a\nb\nc\n")
    bad_trg = _write(tmp_path / "in.en", "x\ny\n")
    with pytest.raises(MTError, match="has no partner"):
        write_pairs(iter_text_pairs(bad_src, bad_trg), src, trg)
    assert src.read_text() == "old de\n"
    assert not trg.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.de", "in.en", "train.de"]
