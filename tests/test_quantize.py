"""`--quantize int8`: int8 linear layers keep the line contract and most outputs, and a row's
result (a sentence's translation) does not depend on what is batched with it."""

import dataclasses
from pathlib import Path

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from transformer_mt.cli import app
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID
from transformer_mt.engines import format_nbest, load_for_inference, translate_lines
from transformer_mt.engines.loading import Int8Linear, quantize

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint"


def test_cli_int8_reaches_the_model_keeps_the_line_contract_and_half_the_texts(tmp_path):
    fixture = FIXTURE
    loaded = load_for_inference(fixture / "old_last.pt")
    quantized = quantize(loaded.model, "int8")
    assert isinstance(quantized.out, Int8Linear)
    assert not any(isinstance(m, nn.Linear) for m in quantized.modules())
    assert not any(isinstance(m, Int8Linear) for m in loaded.model.modules()), "original: fp32"
    runner = CliRunner()
    args = ["translate", "-c", str(fixture / "old_last.pt"), "-i", str(fixture / "src.txt")]
    args += ["--beam", "2", "--nbest", "2"]  # n-best lines: "text<TAB>score", 2 per input line
    fp32 = runner.invoke(app, args)
    int8 = runner.invoke(app, [*args, "--quantize", "int8"])
    assert fp32.exit_code == 0, fp32.output
    assert int8.exit_code == 0, int8.output
    lines = int8.stdout.split("\n")
    assert len(lines) == len(fp32.stdout.split("\n")) == 2 * 31 + 1
    assert lines[8:10] == ["\t0.0000", "\t0.0000"]  # line 5 is empty
    # The CLI's int8 output is the int8 model's, as the library gives it ...
    library = load_for_inference(fixture / "old_last.pt", quantization="int8")
    decode = dataclasses.replace(library.config.decode, beam_size=2, nbest=2)
    sources = (fixture / "src.txt").read_text(encoding="utf-8").splitlines()
    results = translate_lines(library.model, library.src_tok, library.trg_tok, sources, decode)
    assert int8.stdout == "".join(line + "\n" for line in format_nbest(results))
    # ... not fp32's: int8 rounding moves the score of every non-empty line's hypotheses
    pairs = [
        (a.split("\t"), b.split("\t"))
        for a, b in zip(fp32.stdout.splitlines(), int8.stdout.splitlines(), strict=True)
    ]
    moved = sum(a[1] != b[1] for a, b in pairs if a[0] and b[0])
    assert moved >= 0.9 * 60, f"only {moved} of 60 scores differ from fp32's"
    # and about half or more of the best translations stay fp32's (17 of the 30 here).
    best = [(a[0], b[0]) for a, b in pairs[::2] if a[0]]
    same = sum(a == b for a, b in best)
    assert len(best) == 30 and same >= 0.5 * len(best), f"only {same} of 30 best texts kept"
    # int8 rounding moves a tiny (d_model 32) model's probabilities by a few hundredths.
    greedy = (fixture / "expected.beam1.txt").read_text(encoding="utf-8").splitlines()
    src = torch.tensor([[*loaded.src_tok.encode("Di stair staustaet eni bistor ."), EOS_ID]])
    trg = torch.tensor([[BOS_ID, *loaded.trg_tok.encode(greedy[0])]])
    with torch.no_grad():
        exact = torch.softmax(loaded.model(src, trg), dim=-1)
        rounded = torch.softmax(quantized(src, trg), dim=-1)
    assert 0 < (exact - rounded).abs().max() < 0.2
    bad = runner.invoke(app, [*args, "--quantize", "int4"])
    assert bad.exit_code == 1 and "--quantize='int4': expected one of int8" in bad.stderr


@pytest.mark.parametrize("bias", [True, False])
def test_int8_linear_rounds_each_row_alone_and_stays_close_to_fp32(bias):
    torch.manual_seed(0)
    plain = nn.Linear(256, 512, bias=bias)
    int8 = Int8Linear(plain)
    x = torch.randn(6, 10, 256)
    loud = torch.randn(1, 10, 256) * 100  # would set the whole batch's scale if it were shared
    with torch.no_grad():
        alone, exact = int8(x), plain(x)
        beside = int8(torch.cat([x, loud]))[:6]
        one_row = int8(x[2, 3])
    assert torch.equal(alone, beside), "a row's result depends on the rows beside it"
    assert torch.equal(one_row, alone[2, 3])
    assert alone.shape == exact.shape == (6, 10, 512)
    # 7-bit activations (fbgemm's reduce_range) and 8-bit weights: about 1 % of the output's scale
    assert 0 < (alone - exact).abs().max() < 0.03 * exact.abs().max()


def test_an_int8_translation_does_not_depend_on_the_lines_batched_with_it():
    loaded = load_for_inference(FIXTURE / "old_last.pt", quantization="int8")
    lines = (FIXTURE / "src.txt").read_text(encoding="utf-8").splitlines()[:24]
    for beam in (1, 4):
        decode = dataclasses.replace(loaded.config.decode, beam_size=beam, nbest=1)
        run = [loaded.model, loaded.src_tok, loaded.trg_tok]
        together = translate_lines(*run, lines, decode)
        alone = [translate_lines(*run, [line], decode)[0] for line in lines]
        assert [t for ((t, _),) in together] == [t for ((t, _),) in alone]
        assert [s for ((_, s),) in together] == pytest.approx([s for ((_, s),) in alone], abs=1e-5)
