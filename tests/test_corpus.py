"""Cleaning parallel text: every bad input stops with a message naming the file and the line,
every drop is counted exactly, and gzipped input reads the same as plain."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from conftest import shared_multi30k

from transformer_mt.data.corpus import (
    CleanConfig,
    CleanReport,
    clean_parallel,
    iter_clean_pairs,
    open_text,
)
from transformer_mt.errors import MTError


def _write(path: Path, data: bytes | str) -> Path:
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


def _pair(tmp_path: Path, src: bytes | str, trg: bytes | str) -> tuple[Path, Path]:
    return _write(tmp_path / "c.de", src), _write(tmp_path / "c.en", trg)


def test_clean_pairs_are_stripped_and_kept_in_order(tmp_path: Path) -> None:
    src, trg = _pair(tmp_path, "  Ein Hund .\nZwei  Katzen\n", "A dog .\t\nTwo cats\n")
    srcs, trgs, report = clean_parallel(src, trg)
    # Surrounding whitespace goes; the double space inside stays (nothing else is collapsed).
    assert srcs == ["Ein Hund .", "Zwei  Katzen"]
    assert trgs == ["A dog .", "Two cats"]
    assert (report.kept, report.total, report.dropped) == (2, 2, 0)


def test_crlf_and_stray_cr_are_normalized_and_counted(tmp_path: Path) -> None:
    src, trg = _pair(tmp_path, b"eins\r\nzwei\r\ndrei\rvier\n", b"one\ntwo\nthree four\n")
    srcs, trgs, report = clean_parallel(src, trg)
    assert srcs == ["eins", "zwei", "drei vier"]
    assert trgs == ["one", "two", "three four"]
    assert report.crlf_normalized == 3
    assert report.kept == 3
    assert "CR/CRLF" in report.format()


def test_unicode_line_separators_do_not_split_lines(tmp_path: Path) -> None:
    # str.splitlines() would split on U+2028 and form feeds and misalign the files.
    src, trg = _pair(tmp_path, "a\u2028b\x0cc\n", "x\n")
    srcs, trgs, _ = clean_parallel(src, trg)
    assert srcs == ["a\u2028b\x0cc"] and trgs == ["x"]


def test_utf8_bom_at_file_start_is_removed(tmp_path: Path) -> None:
    src, trg = _pair(tmp_path, "\ufeffHallo\n", "Hello\n")
    srcs, _, _ = clean_parallel(src, trg)
    assert srcs == ["Hallo"]


def test_empty_pairs_dropped_and_counted(tmp_path: Path) -> None:
    src, trg = _pair(tmp_path, "a\n\n  \nd\ne\n", "A\nB\nC\n\t\nE\n")
    srcs, trgs, report = clean_parallel(src, trg)
    assert (srcs, trgs) == (["a", "e"], ["A", "E"])
    assert report.dropped_empty == 3
    assert (report.kept, report.total) == (2, 5)


def test_too_long_pairs_dropped_and_counted(tmp_path: Path) -> None:
    long4 = "w w w w"
    src, trg = _pair(tmp_path, f"a b c\n{long4}\nx\n", f"A B C\nW\n{long4}\n")
    cfg = CleanConfig(max_words=3, max_ratio=None)
    srcs, _, report = clean_parallel(src, trg, cfg)
    assert srcs == ["a b c"]
    assert report.dropped_too_long == 2
    assert "2 over 3 words" in report.format()


def test_ratio_drops_counted_and_short_pairs_spared(tmp_path: Path) -> None:
    six, seven = " ".join("w" * 6), " ".join("w" * 7)
    src = f"a\nb c\nb c\n{seven}\n"
    trg = f"A B C\n{six}\n{seven}\nx y\n"
    cfg = CleanConfig(max_words=250, max_ratio=3.0, ratio_min_words=5)
    srcs, trgs, report = clean_parallel(*_pair(tmp_path, src, trg), cfg)
    # 1 vs 3 words: under the guard, kept. 2 vs 6: ratio exactly 3, kept.
    # 2 vs 7 and 7 vs 2: dropped.
    assert srcs == ["a", "b c"]
    assert trgs == ["A B C", six]
    assert report.dropped_ratio == 2
    assert report.kept + report.dropped == 4


def test_report_counts_add_up_and_format_reads_well() -> None:
    report = CleanReport(kept=28_950, dropped_empty=30, dropped_too_long=20)
    assert report.total == 29_000
    text = report.format()
    assert "kept 28,950 of 29,000 pairs" in text
    assert "30 empty" in text and "20 over 250 words" in text and "0 with length ratio > 3" in text


@pytest.mark.parametrize("longer", ["src", "trg"])
def test_mismatched_line_counts_name_both_files_and_the_line(tmp_path: Path, longer: str) -> None:
    three, two = "a\nb\nc\n", "A\nB\n"
    src, trg = _pair(tmp_path, three, two) if longer == "src" else _pair(tmp_path, two, three)
    long_, short = (src, trg) if longer == "src" else (trg, src)
    with pytest.raises(MTError) as info:
        clean_parallel(src, trg)
    msg = str(info.value)
    assert f"{long_}:3:" in msg
    assert f"{short} has 2 lines" in msg and f"{long_} has 3" in msg
    assert "\n" not in msg


def test_mismatched_line_counts_are_an_error_even_when_skipping(tmp_path: Path) -> None:
    src, trg = _pair(tmp_path, "a\nb\n", "A\nB\nC\nD\n")
    with pytest.raises(MTError, match=r"c\.en:3: .*has 2 lines but .*has 4"):
        clean_parallel(src, trg, CleanConfig(skip_bad_lines=True))


def test_invalid_utf8_stops_with_file_and_line(tmp_path: Path) -> None:
    src, trg = _pair(tmp_path, "a\nb\nc\n", b"A\nB \xff\xfe\nC\n")
    with pytest.raises(MTError) as info:
        clean_parallel(src, trg)
    msg = str(info.value)
    assert msg.startswith(f"{trg}:2: invalid UTF-8")
    assert "data.skip_bad_lines: true" in msg
    assert "\n" not in msg


def test_invalid_utf8_skipped_and_counted_when_asked(tmp_path: Path) -> None:
    # Latin-1 "für" on line 1 of the source, a truncated 2-byte sequence on line 3 of the target.
    src, trg = _pair(tmp_path, b"f\xfcr\nb\nc\nd\n", b"for\nB\nC \xc3\nD\n")
    srcs, trgs, report = clean_parallel(src, trg, CleanConfig(skip_bad_lines=True))
    assert (srcs, trgs) == (["b", "d"], ["B", "D"])
    assert report.skipped_bad_utf8 == 2
    assert (report.kept, report.total) == (2, 4)
    assert "skipped 2 pairs with invalid UTF-8" in report.format()


def test_gzip_reads_the_same_as_plain_by_suffix_and_by_magic(tmp_path: Path) -> None:
    src_text = b"Ein Hund\r\n\xc3\xbcber\n\n"
    trg_text = b"A dog\nover\nempty\n"
    plain = clean_parallel(*_pair(tmp_path, src_text, trg_text))
    by_suffix = (
        _write(tmp_path / "s.de.gz", gzip.compress(src_text)),
        _write(tmp_path / "s.en.gz", gzip.compress(trg_text)),
    )
    # Gzipped bytes under a name without .gz: recognized by the magic bytes.
    by_magic = (
        _write(tmp_path / "m.de", gzip.compress(src_text)),
        _write(tmp_path / "m.en", trg_text),
    )
    assert clean_parallel(*by_suffix) == plain
    assert clean_parallel(*by_magic) == plain
    assert plain[0] == ["Ein Hund", "über"]


def test_truncated_gzip_names_the_file(tmp_path: Path) -> None:
    data = gzip.compress(("line\n" * 20_000).encode())
    src = _write(tmp_path / "t.de.gz", data[: len(data) // 2])
    trg = _write(tmp_path / "t.en", "x\n" * 20_000)
    with pytest.raises(MTError, match=r"t\.de\.gz:\d+: .*corrupt or truncated"):
        clean_parallel(src, trg)


def _corrupt_gzip(text: bytes) -> bytes:
    """``text`` gzipped in a stored (uncompressed) block with one byte in the middle set to 0xFF:
    the garbled line decompresses before the checksum at the end can say the file is damaged."""
    data = bytearray(gzip.compress(text, compresslevel=0))
    data[len(data) // 2] = 0xFF
    return bytes(data)


@pytest.mark.parametrize("skip_bad_lines", [False, True])
def test_corrupt_gzip_is_not_reported_as_invalid_utf8(tmp_path: Path, skip_bad_lines) -> None:
    text = "".join(f"Satz {i} ist hier\n" for i in range(2000)).encode()
    src = _write(tmp_path / "c.de.gz", _corrupt_gzip(text))
    trg = _write(tmp_path / "c.en", text)
    with pytest.raises(MTError) as err:
        clean_parallel(src, trg, CleanConfig(skip_bad_lines=skip_bad_lines))
    message = str(err.value)
    assert message.startswith(str(src)) and "corrupt or truncated" in message
    assert "gzip" in message and "iconv" not in message and "\n" not in message


def test_invalid_utf8_in_an_intact_gzip_is_still_invalid_utf8(tmp_path: Path) -> None:
    src = _write(tmp_path / "c.de.gz", gzip.compress(b"gut\nschlecht \xff\n"))
    trg = _write(tmp_path / "c.en", "good\nbad\n")
    with pytest.raises(MTError, match=r"c\.de\.gz:2: invalid UTF-8 .*iconv"):
        clean_parallel(src, trg)


def test_missing_file_and_directory_are_clear_errors(tmp_path: Path) -> None:
    trg = _write(tmp_path / "c.en", "x\n")
    with pytest.raises(MTError, match=r"nope\.de: file not found"):
        clean_parallel(tmp_path / "nope.de", trg)
    with pytest.raises(MTError, match="is a directory"):
        open_text(tmp_path)


def test_bad_config_values_name_the_key() -> None:
    with pytest.raises(MTError, match=r"data\.max_words"):
        CleanConfig(max_words=0)
    with pytest.raises(MTError, match=r"data\.max_ratio"):
        CleanConfig(max_ratio=0.5)


def test_streaming_fills_the_report_as_it_goes(tmp_path: Path) -> None:
    src, trg = _pair(tmp_path, "a\n\nc\n", "A\nB\nC\n")
    report = CleanReport()
    it = iter_clean_pairs(src, trg, CleanConfig(), report)
    assert next(it) == ("a", "A")
    assert (report.kept, report.dropped_empty) == (1, 0)
    assert list(it) == [("c", "C")]
    assert (report.kept, report.dropped_empty) == (2, 1)


def test_multi30k_train_reads_29000_pairs() -> None:
    data = shared_multi30k()
    if data is None:
        pytest.skip("original Multi30k files absent (../shared/data/multi30k; set MT_SHARED_DATA)")
    de, en = data / "train.de.gz", data / "train.en.gz"
    srcs, trgs, report = clean_parallel(de, en)
    assert report.total == 29_000
    assert report.kept + report.dropped == 29_000
    assert len(srcs) == len(trgs) == report.kept
    # The default ratio check removes only the junk "@@" lines; nothing else is lost.
    assert report.kept >= 28_990
