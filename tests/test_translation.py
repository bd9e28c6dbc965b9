"""translate_lines keeps its promise: one result per input line, in input order, empty in -> empty
out, over-long lines truncated with a warning; batching does not change outputs; n-best output
format; attention matrices and their pictures (the weights themselves: test_model.py)."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from transformer_mt.config import DecodeConfig, validate_decode
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer, TokenizerSettings
from transformer_mt.decoding import Hypothesis, greedy_search
from transformer_mt.engines import format_best, format_nbest, translate_lines
from transformer_mt.engines.attention import attention_matrices
from transformer_mt.errors import MTError
from transformer_mt.model import Transformer
from transformer_mt.text.content import has_text

WORDS = "the a cat dog sat ran on under big small red house garden quickly away far".split()
FAST = DecodeConfig(beam_size=1, max_len_a=4.0, max_len_b=1.0)


def _decode(**changes) -> DecodeConfig:
    return dataclasses.replace(FAST, **changes)


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    gen = torch.Generator().manual_seed(0)
    texts = []
    for _ in range(400):
        n = int(torch.randint(2, 9, (1,), generator=gen))
        texts.append(
            " ".join(WORDS[int(i)] for i in torch.randint(len(WORDS), (n,), generator=gen))
        )
    return Tokenizer.train(texts, TokenizerSettings(vocab_size=60))


@pytest.fixture(scope="module")
def model(tok: Tokenizer) -> Transformer:
    torch.manual_seed(0)
    v = tok.vocab_size
    return Transformer(
        PAD_ID, PAD_ID, BOS_ID, v, v, d_model=32, n_head=4, max_len=48, ffn_hidden=64,
        n_layers=2, drop_prob=0.1, tie_embeddings=False,
    ).eval()  # fmt: skip


LINES = [
    "the cat sat on the red house",
    "",
    "   \t  ",
    "a dog ran far away quickly under the big small garden",
    "the cat sat on the red house",
    "dog",
]


def test_one_result_per_line_in_input_order(model, tok):
    results = translate_lines(model, tok, tok, LINES, FAST)
    assert len(results) == len(LINES)
    assert results[1] == [("", 0.0)] and results[2] == [("", 0.0)]
    assert results[0] == results[4]
    for line, res in zip(LINES, results, strict=True):
        if line.strip():
            alone = translate_lines(model, tok, tok, [line], FAST)[0]
            assert [t for t, _ in alone] == [t for t, _ in res]
            assert [s for _, s in alone] == pytest.approx([s for _, s in res], abs=1e-4)


def test_empty_lines_do_not_run_the_model(model, tok):
    calls = []
    hook = model.encoder[0].register_forward_hook(lambda *_: calls.append(1))
    try:
        results = translate_lines(
            model, tok, tok, ["", " ", "\n", "\t\n"], _decode(beam_size=2, nbest=2)
        )
    finally:
        hook.remove()
    assert results == [[("", 0.0)] * 2] * 4
    assert calls == []
    assert translate_lines(model, tok, tok, [], FAST) == []


def test_lines_with_nothing_to_translate_come_back_unchanged_without_the_model(model, tok):
    nothing = [
        "🙂",
        " 42 ",
        "--> ...",
        "https://example.com/a?b=c",
        "(www.example.org).",
        "a@b.org",
    ]
    sizes = []
    hook = model.encoder[0].register_forward_hook(
        lambda _m, args, _o: sizes.append(args[0].shape[0])
    )
    try:
        results = translate_lines(
            model, tok, tok, [*nothing, "the cat sat", ""], _decode(beam_size=2, nbest=2)
        )
    finally:
        hook.remove()
    assert results[: len(nothing)] == [[(line.strip(), 0.0)] * 2 for line in nothing]
    assert results[-1] == [("", 0.0)] * 2
    assert (
        results[-2]
        == translate_lines(model, tok, tok, ["the cat sat"], _decode(beam_size=2, nbest=2))[0]
    )
    assert sizes == [1], "only the line with words was encoded"
    # A prefix does not make such a line translatable, and a word next to an emoji does.
    assert translate_lines(model, tok, tok, ["🙂"], FAST, prefixes=["the"]) == [[("🙂", 0.0)]]
    assert translate_lines(model, tok, tok, ["🙂 dog"], FAST)[0][0][0] != "🙂 dog"


@pytest.mark.parametrize(
    ("line", "expected"),
    [("🙂", False), ("3.14 %", False), ("—", False), ("http://x.org/a", False),
     ("<https://x.org>,", False), ("www.x.org", False), ("me@x.org", False), ("", False),
     ("dog", True), ("3 km", True), ("日本語", True), ("Привет", True), ("e.g.", True),
     ("see https://x.org", True), ("mailto", True)],
)  # fmt: skip
def test_has_text(line, expected):
    assert has_text(line) is expected


def test_batching_does_not_change_outputs(model, tok):
    lines = [" ".join(WORDS[i : i + n]) for i, n in enumerate([3, 7, 1, 5, 9, 2, 6, 4])]
    small = translate_lines(model, tok, tok, lines, _decode(beam_size=3, nbest=2, batch_tokens=8))
    large = translate_lines(
        model, tok, tok, lines, _decode(beam_size=3, nbest=2, batch_tokens=100_000)
    )
    assert [[t for t, _ in r] for r in small] == [[t for t, _ in r] for r in large]


def test_over_long_line_truncated_with_warning_not_dropped(model, tok):
    lines = ["the cat", "", " ".join(WORDS), "dog"]
    with pytest.warns(UserWarning, match=r"line 3: \d+ source pieces .* the limit of 6;") as record:
        results = translate_lines(model, tok, tok, lines, FAST, max_src_len=6)
    assert len(record) == 1
    assert len(results) == 4 and results[1] == [("", 0.0)]
    # The long line is translated from its first max_src_len - 1 = 5 pieces (and EOS).
    cut = tok.encode(" ".join(WORDS))[:5]
    assert tok.decode(cut) == "the a cat dog sat"
    (alone,) = greedy_search(model, torch.tensor([[*cut, EOS_ID]]), FAST)
    text, score = results[2][0]
    assert text and text == tok.decode(alone.nbest[0].tokens)
    assert score == pytest.approx(alone.nbest[0].score, abs=1e-4)
    assert text != translate_lines(model, tok, tok, [" ".join(WORDS)], FAST)[0][0][0], "not cut"
    # Without max_src_len the model's position table (48) is the cap: no crash, a warning.
    huge = " ".join(WORDS * 4)
    with pytest.warns(UserWarning, match="line 2"):
        capped = translate_lines(model, tok, tok, ["dog", huge], FAST)
    assert len(capped) == 2 and capped[1][0][0], "the over-long line still gets a translation"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # short lines warn about nothing
        translate_lines(model, tok, tok, ["the cat", "dog"], FAST, max_src_len=6)


def test_nbest_lists_and_format(model, tok):
    results = translate_lines(model, tok, tok, LINES, _decode(beam_size=4, nbest=3))
    assert all(len(r) == 3 for r in results)
    for r in results:
        scores = [s for _, s in r]
        assert scores == sorted(scores, reverse=True)
    out = list(format_nbest(results))
    assert len(out) == 3 * len(LINES)
    assert out[3:6] == ["\t0.0000"] * 3  # the empty line 2
    for line, (text, score) in zip(out, [p for r in results for p in r], strict=True):
        assert line.count("\t") == 1 and line == f"{text}\t{score:.4f}"
    best = list(format_best(results))
    assert best == [r[0][0] for r in results] and best[1] == ""
    assert list(format_best([[("two\nlines\tand tab", 0.0)]])) == ["two lines and tab"]
    with pytest.raises(MTError, match="nbest"):  # checked with the config, before any work
        validate_decode(_decode(beam_size=2, nbest=3))


def test_a_line_with_fewer_translations_than_asked_keeps_its_nbest_lines():
    from transformer_mt.engines.lines import format_results
    from transformer_mt.engines.results import LineResult

    short = LineResult("a b", -0.5, [("a b", -0.5)], alignments=[[(0, 0), (1, 1)]])
    full = LineResult("c", -0.1, [("c", -0.1), ("d", -0.2)], alignments=[[(0, 0)], [(0, 0)]])
    assert list(format_results([short, full], 2)) == [
        "a b\t-0.5000\t0-0 1-1", "\t-inf\t", "c\t-0.1000\t0-0", "d\t-0.2000\t0-0",
    ]  # fmt: skip
    short.alignments = full.alignments = None
    assert list(format_results([short], 3)) == ["a b\t-0.5000", "\t-inf", "\t-inf"]
    assert list(format_results([short], 1)) == ["a b"]


def test_progress_bar_on_stderr(model, tok, capsys):
    translate_lines(model, tok, tok, ["the cat", "dog"], FAST, progress=True)
    assert "2/2" in capsys.readouterr().err


def test_attention_matrices_rows_follow_hypotheses(model):
    src = torch.tensor([[9, 12, 7, EOS_ID], [15, EOS_ID, PAD_ID, PAD_ID]])
    hyps = [Hypothesis([20, 21], -1.0, True), Hypothesis([30, 31, 32], -2.0, False)]
    mean = attention_matrices(model, src, hyps)
    last = attention_matrices(model, src, hyps, layer=-1)
    # Finished: its tokens plus the EOS row; cut at max length: its tokens only.
    assert [m.shape for m in mean] == [(3, 4), (3, 2)] == [m.shape for m in last]
    assert all(abs(m.sum(axis=1) - 1).max() < 1e-5 for m in mean + last)


def test_attention_pictures_one_png_per_sentence(model, tok, tmp_path):
    out = tmp_path / "attn"
    translate_lines(model, tok, tok, ["the cat sat", "", "dog ran away"], FAST, attention_dir=out)
    pngs = sorted(p.name for p in out.iterdir())
    assert pngs == ["000001.png", "000003.png"]
    assert all((out / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    translate_lines(model, tok, tok, ["dog"], attention_dir=tmp_path / "l1", attention_layer=1)
    assert (tmp_path / "l1" / "000001.png").is_file()
    with pytest.raises(ValueError, match="attention_layer=2"):
        translate_lines(model, tok, tok, ["dog"], attention_dir=out, attention_layer=2)


PREFIX_LINES = ["the cat sat on the red house", "", "a dog ran far away", "dog", "the big garden"]
PREFIX_TEXTS = ["the red", "house", "", "a small dog ran", "garden"]


@pytest.mark.parametrize("decode", [FAST, _decode(beam_size=4, nbest=3)])
def test_prefix_starts_every_translation(decode, model, tok):
    results = translate_lines(model, tok, tok, PREFIX_LINES, decode, prefixes=PREFIX_TEXTS)
    assert len(results) == len(PREFIX_LINES)
    assert results[1] == [("", 0.0)] * decode.nbest  # empty in, empty out, whatever the prefix
    for line, prefix, nbest in zip(PREFIX_LINES, PREFIX_TEXTS, results, strict=True):
        if line:
            assert len(nbest) == decode.nbest
            assert all(text.startswith(prefix) for text, _ in nbest)
    plain = translate_lines(model, tok, tok, PREFIX_LINES, decode)
    assert results[2] == plain[2]  # an empty prefix changes nothing
    assert translate_lines(model, tok, tok, PREFIX_LINES, decode, prefixes=[""] * 5) == plain


def test_prefix_count_and_length_checked(model, tok):
    with pytest.raises(MTError, match="2 prefixes for 5 input lines"):
        translate_lines(model, tok, tok, PREFIX_LINES, FAST, prefixes=["a", "b"])
    long_prefix = " ".join(WORDS * 4)  # more target pieces than the 48 positions
    with pytest.warns(UserWarning, match=r"line 2: a prefix of \d+ target pieces"):
        results = translate_lines(model, tok, tok, ["dog", "cat"], FAST, prefixes=["", long_prefix])
    assert results[1][0][0].startswith(" ".join(WORDS[:4]))
