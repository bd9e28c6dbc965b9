"""``decode.precision`` / ``--precision``: what a loaded model's linear layers multiply in.

bf16 products (:class:`Bf16Linear`) compute exactly autocast's bf16 linear, fp32 around it (a
feed-forward block's first layer hands bf16 to the second, on oneDNN and elsewhere); ``auto``
chooses by the device and a probe and says why; checkpoints written before the key translate in
fp32 as they did; an option that cannot apply is a one-line error."""

import dataclasses
import logging
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional
from typer.testing import CliRunner

from transformer_mt.checkpoint import load_checkpoint, save_checkpoint
from transformer_mt.cli import app
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID
from transformer_mt.devices import cpu_has_native_bf16
from transformer_mt.engines import load_for_inference, translate_lines
from transformer_mt.engines.linear_layers import Bf16Linear, PackedLinear, to_bf16
from transformer_mt.engines.loading import agreed_precision
from transformer_mt.engines.torch_engine import TorchEngine
from transformer_mt.errors import MTError
from transformer_mt.model.layers import FeedForward

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint"
CKPT = FIXTURE / "old_last.pt"
runner = CliRunner()


@pytest.mark.parametrize("rows", [1, 7, 64])
def test_a_bf16_layer_computes_autocasts_bf16_linear_in_fp32(rows):
    torch.manual_seed(0)
    linear = nn.Linear(48, 80)
    x = torch.randn(3, rows, 48)
    with torch.inference_mode():
        out = Bf16Linear(linear)(x)
        w, b = linear.weight.to(torch.bfloat16), linear.bias.to(torch.bfloat16)
        expected = functional.linear(x.to(torch.bfloat16), w, b).float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = linear(x).float()
        exact = linear(x)
    assert out.dtype == torch.float32 and out.shape == (3, rows, 80)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(out, autocast, rtol=0, atol=1e-6)
    # and it is rounded: bf16 keeps 8 bits of mantissa, so fp32's result moves by about 2^-8
    error = (out - exact).abs().max().item()
    assert 1e-4 < error < 0.1, error


@pytest.mark.parametrize("onednn", [True, False])
def test_a_bf16_first_feed_forward_layer_hands_bf16_to_the_second(monkeypatch, onednn):
    import transformer_mt.engines.linear_layers as layers

    if not onednn:  # the path of a GPU, or of a CPU without oneDNN's bf16 product
        monkeypatch.setattr(layers, "_onednn_linear_works", lambda dtype=None: False)
    torch.manual_seed(0)
    block = FeedForward(48, 96, drop_prob=0.0, activation="relu").eval()
    rounded = to_bf16(block)
    x = torch.randn(7, 48)
    with torch.inference_mode():
        hidden = rounded.fc1(x)
        out = rounded(x)
        bf = {name: p.to(torch.bfloat16) for name, p in block.named_parameters()}
        first = functional.linear(x.to(torch.bfloat16), bf["fc1.weight"], bf["fc1.bias"]).relu()
        want = functional.linear(first, bf["fc2.weight"], bf["fc2.bias"]).float()
    assert hidden.dtype == torch.bfloat16 and out.dtype == torch.float32
    # oneDNN applies relu before rounding, autocast after: relu commutes with rounding
    torch.testing.assert_close(hidden, first, rtol=0, atol=0)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-6)


def test_to_bf16_copies_the_model_and_keeps_its_outputs_close():
    loaded = load_for_inference(CKPT)
    model = loaded.model
    rounded = to_bf16(model)
    assert not any(isinstance(m, (nn.Linear, PackedLinear)) for m in rounded.modules())
    assert isinstance(rounded.out, Bf16Linear)
    assert not any(isinstance(m, Bf16Linear) for m in model.modules()), "the original stays fp32"
    greedy = (FIXTURE / "expected.beam1.txt").read_text(encoding="utf-8").splitlines()
    src = torch.tensor([[*loaded.src_tok.encode("Di stair staustaet eni bistor ."), EOS_ID]])
    trg = torch.tensor([[BOS_ID, *loaded.trg_tok.encode(greedy[0])]])
    with torch.inference_mode():
        exact = torch.softmax(model(src, trg), dim=-1)
        close = torch.softmax(rounded(src, trg), dim=-1)
    assert not torch.equal(exact, close)
    assert (exact - close).abs().max() < 0.05


def test_a_checkpoint_from_before_the_key_translates_in_fp32(tmp_path):
    ckpt = load_checkpoint(CKPT)
    assert "precision" not in ckpt["config"]["decode"]
    loaded = load_for_inference(CKPT)
    assert (loaded.precision, loaded.precision_why) == ("fp32", "decode.precision")
    assert any(isinstance(m, PackedLinear) for m in loaded.model.modules())
    # a new checkpoint says bf16: its layers are bf16 ones, and an option overrides it
    ckpt["config"]["decode"]["precision"] = "bf16"
    save_checkpoint(ckpt, tmp_path / "bf16.pt")
    loaded = load_for_inference(tmp_path / "bf16.pt")
    assert (loaded.precision, loaded.precision_why) == ("bf16", "decode.precision")
    assert isinstance(loaded.model.out, Bf16Linear)
    again = load_for_inference(tmp_path / "bf16.pt", precision="fp32")
    assert (again.precision, again.precision_why) == ("fp32", "--precision")
    assert load_for_inference(tmp_path / "bf16.pt", pack=False).precision == "fp32"
    # what `mt serve --workers N` decides once and hands every worker
    assert agreed_precision(CKPT) == ("fp32", "decode.precision")
    assert agreed_precision(tmp_path / "bf16.pt") == ("bf16", "decode.precision")
    assert agreed_precision(tmp_path / "bf16.pt", given="fp32") == ("fp32", "--precision")
    assert agreed_precision(tmp_path / "bf16.pt", quantization="int8")[0] is None
    chosen, why = agreed_precision(CKPT, given="auto")
    assert chosen in ("fp32", "bf16") and why.startswith("auto: ")
    # mt score stays fp32 whatever the checkpoint says: scores compare across machines
    pairs = ["--src", str(FIXTURE / "src.txt"), "--trg", str(FIXTURE / "expected.beam1.txt")]
    scored = [
        runner.invoke(app, ["score", "-c", str(c), *pairs]) for c in (CKPT, tmp_path / "bf16.pt")
    ]
    assert scored[0].exit_code == 0 and scored[0].stdout == scored[1].stdout, scored[1].output


def test_auto_chooses_by_the_cpu_and_says_why():
    loaded = load_for_inference(CKPT, precision="auto")
    assert loaded.precision_why.startswith("auto: ")
    if not cpu_has_native_bf16():
        assert loaded.precision == "fp32" and "no AVX512-BF16 or AMX" in loaded.precision_why
    else:
        speedup = float(loaded.precision_why.split("ran bf16 ")[1].split("x")[0])
        assert (loaded.precision == "bf16") == (speedup > 1.15), loaded.precision_why
    assert isinstance(loaded.model.out, Bf16Linear if loaded.precision == "bf16" else PackedLinear)


def test_bf16_search_keeps_beam_1_equal_to_greedy_and_the_line_contract():
    loaded = load_for_inference(CKPT, precision="bf16")
    sources = (FIXTURE / "src.txt").read_text(encoding="utf-8").splitlines()
    greedy = dataclasses.replace(loaded.config.decode, beam_size=1)
    beam = dataclasses.replace(greedy, beam_size=2, nbest=1)
    args = (loaded.model, loaded.src_tok, loaded.trg_tok, sources)
    by_greedy = translate_lines(*args, greedy)
    with_beam_one = translate_lines(*args, dataclasses.replace(beam, beam_size=1))
    assert by_greedy == with_beam_one
    two = translate_lines(*args, beam)
    assert len(two) == len(sources) and two[4][0][0] == ""  # line 5 is empty
    # most best translations are fp32's (the fixture's model is tiny: d_model 32)
    expected = (FIXTURE / "expected.beam1.txt").read_text(encoding="utf-8").splitlines()
    same = sum(r[0][0] == e for r, e in zip(by_greedy, expected, strict=True))
    assert same >= 0.7 * len(expected), f"only {same} of {len(expected)} greedy lines kept"


def test_the_cli_passes_precision_and_refuses_what_cannot_apply(tmp_path, caplog):
    args = ["translate", "-c", str(CKPT), "-i", str(FIXTURE / "src.txt"), "--beam", "1"]
    fp32 = runner.invoke(app, args)
    bf16 = runner.invoke(app, [*args, "--precision", "bf16"])
    assert fp32.exit_code == 0 and bf16.exit_code == 0, (fp32.output, bf16.output)
    loaded = load_for_inference(CKPT, precision="bf16")
    decode = dataclasses.replace(loaded.config.decode, beam_size=1)
    sources = (FIXTURE / "src.txt").read_text(encoding="utf-8").splitlines()
    results = translate_lines(loaded.model, loaded.src_tok, loaded.trg_tok, sources, decode)
    assert bf16.stdout == "".join(r[0][0] + "\n" for r in results)
    assert fp32.stdout == (FIXTURE / "expected.beam1.txt").read_text(encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="transformer_mt"):
        auto = runner.invoke(app, [*args, "--precision", "auto"])
    assert auto.exit_code == 0 and "linear layers in " in caplog.text and "(auto: " in caplog.text

    errors = {
        "--precision='fp16': expected one of auto, fp32, bf16": [*args, "--precision", "fp16"],
        "--quantize int8": [*args, "--precision", "bf16", "--quantize", "int8"],
        "--engine torch": [*args, "--precision", "bf16", "--engine", "ct2", "-c", str(tmp_path)],
    }
    for expected, argv in errors.items():
        result = runner.invoke(app, argv)
        lines = result.output.strip().splitlines()
        assert result.exit_code != 0 and len(lines) == 1 and expected in lines[0], result.output
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("a\n", encoding="utf-8")
    scored = runner.invoke(
        app, ["evaluate", "--hyp", str(hyp), "-r", str(hyp), "--precision", "bf16"]
    )
    assert scored.exit_code != 0 and "--precision" in scored.output


def test_the_engine_reports_its_precision():
    assert TorchEngine(CKPT).describe()["precision"] == "fp32"
    assert TorchEngine(CKPT, precision="bf16").describe()["precision"] == "bf16"
    with pytest.raises(MTError, match="--precision is for --engine torch"):
        from transformer_mt.engines.engine import check_engine

        check_engine("ct2", FIXTURE, precision="bf16")
