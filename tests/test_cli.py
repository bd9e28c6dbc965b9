"""The `mt` commands end to end through typer's CliRunner, and their one-line errors."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from transformer_mt.cli import app

runner = CliRunner()
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny run trained once for all CLI tests: (run directory, toy data directory)."""
    from conftest import TINY_CONFIG

    tmp = tmp_path_factory.mktemp("cli")
    config = tmp / "tiny.yaml"
    config.write_text(TINY_CONFIG.format(cache=tmp / "cache", steps=20))
    result = runner.invoke(
        app, ["train", "--config", str(config), "--run-dir", str(tmp / "run"), "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    (data_dir,) = (tmp / "cache").glob("toy-*")
    return tmp / "run", data_dir


def test_train_writes_a_run_directory(trained):
    run, _ = trained
    assert (run / "best.pt").is_file() and (run / "last.pt").is_file()
    assert (run / "config.yaml").is_file()
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert all("step" in r for r in lines) and any("loss" in r for r in lines)


def test_translate_keeps_one_line_per_input(tmp_path):
    # The fixture model's beam-1 output is pinned (expected.beam1.txt, test_compat.py); blank and
    # whitespace-only lines among its inputs must give empty lines in their places.
    src = (FIXTURE / "src.txt").read_text(encoding="utf-8").splitlines()
    want = (FIXTURE / "expected.beam1.txt").read_text(encoding="utf-8").splitlines()
    assert len(src) == len(want) == 31
    given, expected = [], []
    for i, (line, translation) in enumerate(zip(src, want, strict=True)):
        if i % 7 == 1:
            given.append("" if i % 2 else "  \t ")
            expected.append("")
        given.append(line)
        expected.append(translation)
    assert len(given) == 36 and expected.count("") == 6  # line 5 of src.txt is empty too
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(given) + "\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    ckpt = ["translate", "-c", str(FIXTURE / "old_last.pt"), "--beam", "1"]
    result = runner.invoke(app, [*ckpt, "-i", str(inp), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8").split("\n") == [*expected, ""]
    # stdin -> stdout gives the same translations, in the same order
    piped = runner.invoke(app, ckpt, input=inp.read_text(encoding="utf-8"))
    assert piped.exit_code == 0, piped.output
    assert piped.stdout.split("\n") == [*expected, ""]


def test_evaluate_translates_and_scores():
    # The reference is the model's own pinned beam-1 output: translating --src must match it.
    result = runner.invoke(
        app,
        ["evaluate", "-c", str(FIXTURE / "old_last.pt"), "--src", str(FIXTURE / "src.txt"),
         "--ref", str(FIXTURE / "expected.beam1.txt"), "--beam", "1", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    scores = json.loads(result.stdout)
    assert set(scores) >= {"bleu", "chrf", "ter", "bleu_signature"}
    assert "tok:13a" in scores["bleu_signature"]
    assert scores["bleu"] == pytest.approx(100) and scores["chrf"] == pytest.approx(100)
    assert scores["ter"] == pytest.approx(0)


def test_evaluate_passes_len_penalty_to_the_search(trained, monkeypatch):
    # A 20-step model translates every line to "" whatever the penalty, so a spy (that calls the
    # real search) shows which alpha reached it; the search's own tests check what alpha does.
    import transformer_mt.engines.torch_engine as inference

    seen, real = [], inference.translate_lines

    def spy(model, src_tok, trg_tok, lines, decode, **kwargs):
        seen.append(decode.len_penalty)
        return real(model, src_tok, trg_tok, lines, decode, **kwargs)

    monkeypatch.setattr(inference, "translate_lines", spy)
    run, data = trained
    args = ["evaluate", "-c", str(run / "best.pt"), "--src", str(data / "test.src")]
    args += ["--ref", str(data / "test.trg"), "--beam", "2"]
    for extra in ([], ["--len-penalty", "0.6"]):
        result = runner.invoke(app, [*args, *extra])
        assert result.exit_code == 0, result.output
    assert seen == [1.0, 0.6], "the run's decode.len_penalty, then the option's"


def test_tune_len_penalty_script_scores_each_alpha_as_evaluate_does(monkeypatch, capsys):
    import runpy
    import sys

    # At beam 3 the fixture model's outputs for src.txt differ between alpha 0 and 3 (and its
    # config's len_penalty is 1.0, which gives alpha 0's outputs): each row must be its own alpha's.
    ckpt, src = str(FIXTURE / "old_last.pt"), str(FIXTURE / "src.txt")
    ref = str(FIXTURE / "expected.beam1.txt")
    script = Path(__file__).resolve().parents[1] / "scripts" / "tune_len_penalty.py"
    argv = [str(script), "-c", ckpt, "--src", src, "--ref", ref, "--beam", "3"]
    argv += ["--alphas", "0", "3"]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(script), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    rows = {float(x.split("|")[0]): float(x.split("|")[1]) for x in lines[2:4]}
    assert set(rows) == {0.0, 3.0}
    assert rows[0.0] != rows[3.0], f"alpha 0 and 3 give the same BLEU: {rows}"
    for alpha, bleu in rows.items():
        args = ["evaluate", "-c", ckpt, "--src", src, "--ref", ref, "--beam", "3", "--json"]
        direct = runner.invoke(app, [*args, "--len-penalty", str(alpha)])
        assert direct.exit_code == 0, direct.output
        assert round(json.loads(direct.stdout)["bleu"], 2) == bleu
    best = max(rows, key=rows.get)
    assert lines[-1].startswith(f"best alpha by BLEU: {best:g} ")


def test_average_and_plot(trained, tmp_path):
    run, _ = trained
    out = tmp_path / "avg.pt"
    result = runner.invoke(
        app, ["average", str(run / "last.pt"), str(run / "best.pt"), "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert out.is_file()
    png = tmp_path / "m.png"
    assert runner.invoke(app, ["plot", str(run), "--output", str(png)]).exit_code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_overlays_several_runs_and_checks_them_all_first(trained, tmp_path):
    run, _ = trained
    png = tmp_path / "runs.png"
    done = runner.invoke(app, ["plot", str(run), str(run), "--output", str(png)])
    assert done.exit_code == 0, done.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "--output" in _one_line_error(runner.invoke(app, ["plot", str(run), str(run)]))
    missing = tmp_path / "not_a_run"
    bad = runner.invoke(app, ["plot", str(run), str(missing), "--output", str(tmp_path / "x.png")])
    assert str(missing) in _one_line_error(bad)
    assert not (tmp_path / "x.png").exists(), "nothing drawn when one run is unreadable"


def _one_line_error(result) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_missing_checkpoint_is_a_one_line_error(tmp_path):
    result = runner.invoke(app, ["translate", "-c", str(tmp_path / "nope.pt")], input="hi\n")
    assert "checkpoint not found" in _one_line_error(result)


def test_missing_config_is_a_one_line_error(tmp_path):
    result = runner.invoke(app, ["train", "--config", str(tmp_path / "nope.yaml")])
    assert "config file not found" in _one_line_error(result)


def test_bad_set_key_is_a_one_line_error(tmp_path):
    result = runner.invoke(
        app, ["train", "--set", "train.max_stepz=3", "--run-dir", str(tmp_path / "r")]
    )
    assert "train.max_stepz" in _one_line_error(result)
    assert not (tmp_path / "r").exists(), "nothing written for a bad config"


def test_evaluate_line_count_mismatch_names_both_files(tmp_path):
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("a\nb\n")
    ref.write_text("a\n")
    message = _one_line_error(
        runner.invoke(app, ["evaluate", "--hyp", str(hyp), "--ref", str(ref)])
    )
    assert "hyp.txt has 2" in message and "ref.txt has 1" in message


def test_checkpoint_that_is_not_ours_is_refused(tmp_path):
    import torch

    bogus = tmp_path / "bogus.pt"
    torch.save({"weights": torch.ones(2)}, bogus)
    result = runner.invoke(app, ["translate", "-c", str(bogus)], input="hi\n")
    assert "not a transformer-mt checkpoint" in _one_line_error(result)


def test_python_dash_m_runs_the_same_cli():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "transformer_mt", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "translate" in out.stdout and "evaluate" in out.stdout


def test_translate_counts_lines_like_wc(trained, tmp_path):
    """Form feeds and U+2028 inside a sentence are not line breaks; CRLF input works too."""
    run, _ = trained
    text = "The dog eats.\r\nA cat\x0csleeps.\nThe man\u2028runs.\n\n"
    result = runner.invoke(
        app, ["translate", "-c", str(run / "best.pt"), "--beam", "1"], input=text
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.count("\n") == text.count("\n") == 4
    assert result.stdout.split("\n")[3] == ""


def test_sampling_is_seeded_and_top_k_1_equals_greedy(trained):
    run, data = trained
    text = "".join(line + "\n" for line in (data / "test.src").read_text().splitlines()[:6])
    ckpt = ["translate", "-c", str(run / "best.pt")]
    greedy = runner.invoke(app, [*ckpt, "--beam", "1"], input=text).stdout
    top1 = runner.invoke(app, [*ckpt, "--sample", "--top-k", "1"], input=text).stdout
    assert top1 == greedy
    draws = [
        runner.invoke(app, [*ckpt, "--sample", "--seed", str(s), "--temperature", "5"], input=text)
        for s in (1, 1, 2)
    ]
    assert all(d.exit_code == 0 for d in draws)
    assert draws[0].stdout == draws[1].stdout != draws[2].stdout
    assert draws[0].stdout.count("\n") == 6
    bad = runner.invoke(app, [*ckpt, "--sample", "--beam", "4"], input=text)
    assert bad.exit_code == 1 and "--sample" in bad.stderr


def _params(command: str) -> dict:
    """The click parameters of the command ``command``, by name, as Typer builds them."""
    import typer

    return {param.name: param for param in typer.main.get_command(app).commands[command].params}


def test_each_model_option_is_read_from_its_declaration():
    """`mt translate` and `mt evaluate` take every field of ModelOptions as its declared option:
    its flag, default, help and the values it accepts; `mt score` the ones it has. A value
    outside the declared choices is one line naming the option, before any work."""
    import dataclasses

    from transformer_mt.engines.options import ModelOptions

    fields = dataclasses.fields(ModelOptions)
    for command, names in (
        ("translate", [f.name for f in fields]),
        ("evaluate", [f.name for f in fields]),
        ("score", ["device", "target_lang"]),
    ):
        params = _params(command)
        for f in (f for f in fields if f.name in names):
            param, choices = params[f.name], f.metadata["choices"]
            assert param.opts == [f.metadata["option"]], (command, f.name)
            assert param.default == f.default, (command, f.name)
            help_text = " ".join(param.help.split())
            assert help_text.lower().startswith(f.metadata["help"].lower()), (command, f.name)
            assert choices is None or f"({' or '.join(choices)})" in help_text, (command, f.name)
        defaults = {name: params[name].default for name in names}
        assert ModelOptions(**defaults) == ModelOptions(), command
    for flag, value in (("--engine", "onnx"), ("--quantize", "int4"), ("--precision", "fp16")):
        result = runner.invoke(app, ["translate", "-c", "never-read.pt", flag, value], input="x\n")
        assert result.exit_code == 1, result.output
        (line,) = result.output.strip().splitlines()
        assert line.startswith(f"error: {flag}={value!r}: expected one of "), line
