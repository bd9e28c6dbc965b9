"""`--quantize int8`: dynamic int8 linear layers keep the line contract and most outputs."""

from pathlib import Path

import torch
from typer.testing import CliRunner

from transformer_mt.cli import app
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID
from transformer_mt.inference import load_for_inference
from transformer_mt.inference.loading import quantize

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint"


def test_int8_quantization_keeps_the_line_contract_and_most_translations(tmp_path):
    fixture = FIXTURE
    loaded = load_for_inference(fixture / "old_last.pt")
    quantized = quantize(loaded.model, "int8")
    linears = [m for m in quantized.modules() if type(m).__name__ == "Linear"]
    assert linears and all("quantized" in type(m).__module__ for m in linears)
    assert "quantized" not in type(loaded.model.out).__module__, "the original stays fp32"
    runner = CliRunner()
    args = ["translate", "-c", str(fixture / "old_last.pt"), "-i", str(fixture / "src.txt")]
    fp32 = runner.invoke(app, [*args, "--beam", "1"]).stdout.split("\n")
    int8 = runner.invoke(app, [*args, "--beam", "1", "--quantize", "int8"])
    assert int8.exit_code == 0, int8.output
    lines = int8.stdout.split("\n")
    assert len(lines) == len(fp32) and lines[4] == ""
    # int8 rounding moves a tiny (d_model 32) model's probabilities by a few hundredths.
    src = torch.tensor([[*loaded.src_tok.encode("Di stair staustaet eni bistor ."), EOS_ID]])
    trg = torch.tensor([[BOS_ID, *loaded.trg_tok.encode(fp32[0])]])
    with torch.no_grad():
        exact = torch.softmax(loaded.model(src, trg), dim=-1)
        rounded = torch.softmax(quantized(src, trg), dim=-1)
    assert 0 < (exact - rounded).abs().max() < 0.2
    bad = runner.invoke(app, [*args, "--quantize", "int4"])
    assert bad.exit_code == 1 and "--quantize 'int4'" in bad.stderr
