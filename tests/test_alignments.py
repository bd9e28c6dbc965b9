"""`mt translate --alignments`: Pharaoh-format word alignments from cross-attention.

On the old-checkpoint fixture (31 lines, line 5 empty): the text before the tab is plain
`mt translate` output; after it, 0-based ``i-j`` pairs with every target piece exactly once and
every source index in range; an empty line gives just the tab; the pairs are the argmax of the
matrices of :func:`attention_matrices`, computed here independently.
"""

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from transformer_mt.cli import app
from transformer_mt.data.tokenizer import EOS_ID
from transformer_mt.decoding import beam_search, greedy_search
from transformer_mt.engines import TranslateExtras, load_engine, load_for_inference
from transformer_mt.engines.alignment import to_words, word_indices
from transformer_mt.engines.attention import attention_matrices

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint"
CKPT, SRC = str(FIXTURE / "old_last.pt"), str(FIXTURE / "src.txt")
PHARAOH = re.compile(r"^(\d+-\d+( \d+-\d+)*)?$")
runner = CliRunner()


@pytest.fixture(scope="module")
def loaded():
    return load_for_inference(FIXTURE / "old_last.pt")


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return (FIXTURE / "src.txt").read_text(encoding="utf-8").splitlines()


def _translate(tmp_path, *options: str) -> list[str]:
    out = tmp_path / "out.txt"
    result = runner.invoke(app, ["translate", "-c", CKPT, "-i", SRC, "-o", str(out), *options])
    assert result.exit_code == 0, result.output
    return out.read_text(encoding="utf-8").splitlines()


def _pairs(field: str) -> list[tuple[int, int]]:
    assert PHARAOH.match(field), field
    return [tuple(map(int, pair.split("-"))) for pair in field.split()]


def _greedy(loaded, line: str):
    src_ids = [*loaded.src_tok.encode(line.strip()), EOS_ID]
    decode = dataclasses.replace(loaded.config.decode, beam_size=1, nbest=1)
    hyp = greedy_search(loaded.model, torch.tensor([src_ids]), decode)[0].nbest[0]
    return src_ids, hyp


def test_piece_alignments_format_and_line_contract(tmp_path, loaded, lines):
    got = _translate(tmp_path, "--beam", "1", "--alignments")
    plain = (FIXTURE / "expected.beam1.txt").read_text(encoding="utf-8").splitlines()
    assert len(got) == len(lines) == len(plain) == 31
    assert got[4] == "\t"  # line 5 is empty: empty text, empty alignment
    for i, (line, out) in enumerate(zip(lines, got, strict=True)):
        text, field = out.split("\t")
        assert text == plain[i]
        if not line.strip():
            assert field == ""
            continue
        src_ids, hyp = _greedy(loaded, line)
        assert loaded.trg_tok.decode(hyp.tokens) == text
        pairs = _pairs(field)
        assert [j for _, j in pairs] == list(range(len(hyp.tokens)))  # each target piece once
        assert all(0 <= src < len(src_ids) - 1 for src, _ in pairs)  # EOS excluded


def test_alignment_is_the_argmax_of_the_attention_matrices(tmp_path, loaded, lines):
    src_ids, hyp = _greedy(loaded, lines[0])
    (weights,) = attention_matrices(loaded.model, torch.tensor([src_ids]), [hyp])
    n_src, n_trg = len(src_ids) - 1, len(hyp.tokens)
    expected = [(int(np.argmax(weights[j, :n_src])), j) for j in range(n_trg)]
    field = _translate(tmp_path, "--beam", "1", "--alignments")[0].split("\t")[1]
    assert _pairs(field) == expected
    # The same through the library, with one chosen layer (the fixture has one decoder layer):
    # each result carries its line's alignments; asked for none, it carries none.
    engine = load_engine("torch", CKPT)
    decode = dataclasses.replace(engine.run_decode, beam_size=1)
    extras = TranslateExtras(alignments=True, alignment_layer=0)
    (result,) = engine.translate(lines[:1], decode, extras=extras)
    (layer0,) = attention_matrices(loaded.model, torch.tensor([src_ids]), [hyp], layer=0)
    assert result.alignments == [[(int(np.argmax(layer0[j, :n_src])), j) for j in range(n_trg)]]
    assert engine.translate(lines[:1], decode)[0].alignments is None


def _beam(loaded, line: str, beam: int, nbest: int):
    src_ids = [*loaded.src_tok.encode(line.strip()), EOS_ID]
    decode = dataclasses.replace(loaded.config.decode, beam_size=beam, nbest=nbest)
    return src_ids, beam_search(loaded.model, torch.tensor([src_ids]), decode)[0].nbest


def test_nbest_lines_carry_their_own_alignment(tmp_path, loaded, lines):
    got = _translate(tmp_path, "--beam", "3", "--nbest", "2", "--alignments")
    plain = (FIXTURE / "expected.beam3.nbest2.txt").read_text(encoding="utf-8").splitlines()
    assert len(got) == len(plain) == 62
    differ = 0  # inputs whose two hypotheses have different numbers of target pieces
    for i, line in enumerate(lines):
        outs = [out.split("\t") for out in got[2 * i : 2 * i + 2]]
        assert [f"{text}\t{score}" for text, score, _ in outs] == plain[2 * i : 2 * i + 2]
        if not line.strip():
            assert [field for _, _, field in outs] == ["", ""]
            continue
        src_ids, hyps = _beam(loaded, line, 3, 2)
        assert [loaded.trg_tok.decode(hyp.tokens) for hyp in hyps] == [t for t, _, _ in outs]
        for (_, _, field), hyp in zip(outs, hyps, strict=True):
            pairs = _pairs(field)
            # each target piece of this line's own hypothesis exactly once, in order
            assert [j for _, j in pairs] == list(range(len(hyp.tokens))), (i, field)
            assert all(0 <= src < len(src_ids) - 1 for src, _ in pairs)
        differ += len(hyps[0].tokens) != len(hyps[1].tokens)
    assert differ >= 10, "too few second hypotheses with another length to tell them apart"
    assert got[8].endswith("\t") and got[9].endswith("\t")  # the empty line's two entries


def test_word_units(tmp_path, lines):
    got = _translate(tmp_path, "--beam", "1", "--alignments", "--alignment-units", "words")
    assert got[4] == "\t"
    for line, out in zip(lines, got, strict=True):
        text, field = out.split("\t")
        pairs = _pairs(field)
        assert {j for _, j in pairs} == set(range(len(text.split())))
        assert all(0 <= i < len(line.split()) for i, _ in pairs)
    assert word_indices(["▁The", "▁ca", "t", "s", "▁", "."]) == [0, 1, 1, 1, 2, 2]
    assert word_indices(["ab", "▁c"]) == [0, 1]
    pieces = [(0, 0), (2, 1), (1, 2)]  # source words [0, 0, 1], target words [0, 0, 1]
    assert to_words(pieces, ["▁a", "b", "▁c"], ["▁x", "y", "▁z"]) == [(0, 0), (1, 0), (0, 1)]


def test_interactive_alignments(lines):
    cmd = ["translate", "-c", CKPT, "--beam", "1", "--interactive", "--alignments"]
    result = runner.invoke(app, cmd, input=f"{lines[0]}\n\n")
    assert result.exit_code == 0, result.output
    first, empty = result.stdout.splitlines()
    assert first.startswith("Di stair staustaet eni bistor.\t0-0 ") and empty == "\t"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--alignment-layer", "0"], "add --alignments"),
        (["--alignment-units", "words"], "add --alignments"),
        (["--alignments", "--alignment-units", "letters"], "expected pieces or words"),
        (["--alignments", "--alignment-layer", "3"], "--alignment-layer 3"),
        (["--alignments", "-c", CKPT], "one checkpoint"),
    ],
)
def test_alignment_option_errors(options, message):
    result = runner.invoke(app, ["translate", "-c", CKPT, *options], input="x\n")
    assert result.exit_code == 1 and message in result.output, result.output


def test_ct2_engine_refuses_alignments(tmp_path, loaded):
    pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed")
    from transformer_mt.convert.ctranslate2 import export_ctranslate2

    directory = export_ctranslate2(loaded, tmp_path / "ct2")
    cmd = ["translate", "--engine", "ct2", "-c", str(directory), "--alignments"]
    result = runner.invoke(app, cmd, input="x\n")
    assert result.exit_code == 1 and "--alignments needs --engine torch" in result.output


def test_attention_of_a_hypothesis_that_fills_the_position_table():
    """A hypothesis cut at the length limit may hold max_len tokens: its teacher-forced pass
    needs max_len positions (BOS and all but the last token), not one more."""
    from transformer_mt.decoding.search import Hypothesis
    from transformer_mt.model import Transformer

    torch.manual_seed(0)
    model = Transformer(0, 0, 1, 12, 12, d_model=16, n_head=2, max_len=8, ffn_hidden=32,
                        n_layers=1).eval()  # fmt: skip
    src = torch.tensor([[5, 6, 7, EOS_ID]])
    cut = Hypothesis(tokens=[4, 5, 6, 7, 8, 9, 10, 11], score=-1.0, finished=False)
    ended = Hypothesis(tokens=[4, 5, 6, 7, 8, 9, 10], score=-1.0, finished=True)
    for hyp in (cut, ended):
        (weights,) = attention_matrices(model, src, [hyp])
        assert weights.shape == (8, 4)  # a row per target piece (and EOS), a column per source
        np.testing.assert_allclose(weights.sum(axis=1), 1.0, rtol=1e-5)
    # The same weights in a model with a longer position table (same parameters; the table is
    # computed, not learned), from a pass over BOS and all 8 pieces: its first 8 rows.
    longer = Transformer(0, 0, 1, 12, 12, d_model=16, n_head=2, max_len=16, ffn_hidden=32,
                         n_layers=1).eval()  # fmt: skip
    longer.load_state_dict(model.state_dict())
    (weights,) = attention_matrices(model, src, [cut])
    full = longer.cross_attention(src, torch.tensor([[1, *cut.tokens]])).mean(dim=(0, 2))[0]
    np.testing.assert_allclose(weights, full[:8].numpy(), rtol=1e-5, atol=1e-7)


def test_alignments_need_one_checkpoint(lines):
    """An ensemble's alignments would be one model's: refused in one line, before decoding."""
    from transformer_mt.errors import MTError

    ensemble = load_engine("torch", [CKPT, CKPT])
    with pytest.raises(MTError, match="alignments need one checkpoint, not an ensemble"):
        ensemble.translate(lines[:1], ensemble.run_decode, extras=TranslateExtras(alignments=True))
    result = runner.invoke(app, ["translate", "-c", CKPT, "-c", CKPT, "-i", SRC, "--alignments"])
    assert result.exit_code == 1
    assert result.output.strip() == "error: alignments need one checkpoint, not an ensemble"
