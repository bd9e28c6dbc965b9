"""Bad input to every command: exit code 1, exactly one `error:` line, no traceback, and every file
the command was given (and its run directory) left byte for byte as it was; then what the output
helper promises (never over an input, FIFOs, symlinks, devices, the umask mode, a full disk)."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

from transformer_mt.cli import app, user_errors
from transformer_mt.errors import MTError

runner = CliRunner()
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint"
TINY = """\
name: tiny
data: {corpus: toy, toy_train_size: 60, toy_valid_size: 8, toy_test_size: 8, max_tokens_per_side: 48,
       cache_dir: cache}
tokenizer: {vocab_size: 100}
model: {d_model: 16, n_head: 2, ffn_hidden: 32, n_layers: 1, max_len: 64}
train: {max_steps: 2, batch_tokens: 400, warmup_steps: 1, log_every: 1, valid_every: 2, threads: 1}
"""
LOCAL = """\
data: {corpus: local, train_src: a.src, train_trg: a.trg, valid_src: a.src, valid_trg: a.trg,
       cache_dir: cache}
"""


def _workdir(d: Path) -> None:
    """The files a case may be given: a trained checkpoint (a copy of the read-only fixture), text
    in and out of UTF-8, broken checkpoints, configs, a run directory with metrics."""
    shutil.copyfile(FIXTURE / "old_last.pt", d / "ck.pt")
    (d / "in.txt").write_text("Ein Hund läuft.\n\nZwei Katzen.\n", encoding="utf-8")
    (d / "ref.txt").write_text("A dog runs.\n\nTwo cats.\n", encoding="utf-8")
    (d / "two.txt").write_text("a\nb\n")
    (d / "latin1.txt").write_bytes("ok\nStraße\n".encode("latin-1"))
    (d / "empty1.txt").write_bytes(b"")
    (d / "empty2.txt").write_bytes(b"")
    (d / "random.pt").write_bytes(bytes(range(256)) * 8)
    (d / "empty.pt").write_bytes(b"")
    (d / "truncated.pt").write_bytes((FIXTURE / "old_last.pt").read_bytes()[:4000])
    torch.save({"hook": os.system}, d / "foreign.pt")  # a pickle of a function: never loaded
    torch.save({"weights": torch.ones(2)}, d / "notours.pt")
    ckpt = torch.load(d / "ck.pt", weights_only=True)
    ckpt["config"]["train"]["seed"] += 1  # the same model trained from another start
    torch.save(ckpt, d / "otherseed.pt")
    ckpt["config"]["train"]["seed"] -= 1
    name = next(iter(ckpt["model"]))
    ckpt["model"][name] = ckpt["model"][name].flatten()[:3]
    torch.save(ckpt, d / "badshape.pt")
    small = torch.load(d / "ck.pt", weights_only=True)  # 150 embedding rows, 200 pieces
    small["model_args"].update(enc_voc_size=150, dec_voc_size=150)
    small["model"] = {k: v[:150] if v.shape[0] == 200 else v for k, v in small["model"].items()}
    torch.save(small, d / "smallvocab.pt")
    (d / "adir").mkdir()
    (d / "exported").mkdir()
    (d / "exported" / "transformer_mt.json").write_text("{}")  # what `mt export` writes
    (d / "afile").write_text("not a directory\n")
    (d / "link.txt").symlink_to("in.txt")
    (d / "tiny.yaml").write_text(TINY)
    (d / "local.yaml").write_text(LOCAL)
    (d / "a.src").write_text("ein hund\nzwei katzen\n")
    (d / "a.trg").write_text("a dog\n")  # one line short
    (d / "latin1.yaml").write_bytes("name: x\ntrain:\n  max_steps: 3 # größer\n".encode("latin-1"))
    (d / "badyaml.yaml").write_text("model:\n  d_model: [16\n")
    (d / "list.yaml").write_text("- model\n- train\n")
    (d / "unknown.yaml").write_text("model:\n  d_modle: 16\n")
    (d / "wrongtype.yaml").write_text("train:\n  max_steps: many\n")
    (d / "twice.yaml").write_text("train:\n  seed: 7\nmodel:\n  d_model: 16\ntrain:\n  seed: 8\n")
    run = d / "run"
    run.mkdir()
    shutil.copyfile(d / "ck.pt", run / "last.pt")
    good = '{"step": 1, "loss": 5.0, "nll": 4.9, "lr": 0.001}\n'
    (run / "metrics.jsonl").write_text(good + "garbage\n" + good)
    (d / "goodrun").mkdir()
    (d / "goodrun" / "metrics.jsonl").write_text(good)
    bad = d / "badrun"
    bad.mkdir()
    (bad / "metrics.jsonl").write_bytes(  # not UTF-8, and not the (maybe cut) last line
        b'{"step": 1, "loss": 5.0, "nll": 4.9, "lr": 1, "x": "\xff"}\n' + good.encode()
    )


T, CK = "translate", ["-c", "ck.pt"]
E = "evaluate"
# name: (arguments, stdin or None, a piece of the expected message)
CASES = {
    # train / prepare: config files and --set
    "config missing": (
        ["train", "--config", "nope.yaml"],
        None,
        "config file not found: nope.yaml; pass an existing YAML file",
    ),
    "config is a directory": (
        ["train", "--config", "adir"],
        None,
        "--config adir is a directory; pass a YAML file",
    ),
    "config not UTF-8": (
        ["train", "--config", "latin1.yaml"],
        None,
        "latin1.yaml:3: invalid UTF-8",
    ),
    "config bad YAML": (
        ["train", "--config", "badyaml.yaml"],
        None,
        "badyaml.yaml:3: invalid YAML",
    ),
    "config not a mapping": (
        ["prepare", "--config", "list.yaml"],
        None,
        "list.yaml: expected a mapping of sections",
    ),
    "config unknown key": (
        ["train", "--config", "unknown.yaml"],
        None,
        "unknown.yaml: unknown config key 'model.d_modle'; known keys:",
    ),
    "config wrong type": (
        ["train", "--config", "wrongtype.yaml"],
        None,
        "'train.max_steps': expected int, got 'many'",
    ),
    "config repeats a section": (  # PyYAML alone keeps the last: the first section vanishes
        ["train", "--config", "twice.yaml"],
        None,
        "twice.yaml:5: invalid YAML (the key 'train' is repeated: first on line 1)",
    ),
    "config repeats a key": (
        ["prepare", "--set", "model={d_model: 16, d_model: 32}"],
        None,
        "the key 'd_model' is repeated",
    ),
    "run name that leaves runs/": (
        ["train", "--config", "tiny.yaml", "--set", "name=.."],
        None,
        "name='..': the run name names directories",
    ),
    "run name with a slash": (["prepare", "--set", "name=a/b"], None, "name='a/b': the run"),
    "run name not text": (["prepare", "--set", "name=null"], None, "'name': expected str"),
    "local files for another corpus": (  # a forgotten `corpus: local` trained on the toy data
        ["prepare", "--set", "data.train_src=a.src"],
        None,
        "data.train_src is set but data.corpus is 'toy', which does not read it; set "
        "data.corpus: local",
    ),
    "local corpus with one file for both sides": (
        ["prepare", "--config", "local.yaml", "--set", "data.valid_trg=a.src"],
        None,
        "data.valid_src and data.valid_trg are the same file (a.src)",
    ),
    "--set bad YAML": (["train", "--set", "train.max_steps=[1"], None, "not valid YAML"),
    "--set without =": (["prepare", "--set", "train.max_steps"], None, "section.key=value"),
    "toy corpus with one language": (
        ["prepare", "--set", "data.trg_lang=src"],
        None,
        "data.src_lang and data.trg_lang are both 'src'; the toy corpus keeps each side",
    ),
    "--set unknown key": (
        ["train", "--set", "train.max_stepz=3"],
        None,
        "unknown config key 'train.max_stepz'",
    ),
    "--set out of range": (
        ["train", "--set", "train.label_smoothing=1.5"],
        None,
        "train.label_smoothing is 1.5; it must be in [0, 1)",
    ),
    "run dir is a file": (
        ["train", "--config", "tiny.yaml", "--run-dir", "afile"],
        None,
        "run directory afile is not a directory; pass another --run-dir",
    ),
    "run dir under a file": (
        ["train", "--config", "tiny.yaml", "--run-dir", "afile/r"],
        None,
        "cannot create run directory afile/r",
    ),
    "local corpus file missing": (
        ["prepare", "--config", "local.yaml", "--set", "data.train_src=nope.src"],
        None,
        "data.train_src: nope.src is not a file",
    ),
    "local corpus lines differ": (
        ["prepare", "--config", "local.yaml"],
        None,
        "a.src:2: line has no partner: a.trg has 1 lines",
    ),
    # translate: checkpoints
    "checkpoint missing": (
        [T, "-c", "nope.pt"],
        "x\n",
        "checkpoint not found: nope.pt; pass a .pt file",
    ),
    "an export given to the torch engine": (
        [T, "-c", "exported"],
        "x\n",
        "checkpoint exported is a directory (an `mt export` directory: add --engine ct2)",
    ),
    "a checkpoint given to the ct2 engine": (
        [T, *CK, "--engine", "ct2"],
        "x\n",
        "ck.pt is not a model exported by `mt export` (no transformer_mt.json): a checkpoint of "
        "`mt train` runs with --engine torch",
    ),
    "checkpoint is a directory": (
        [T, "-c", "adir"],
        "x\n",
        "checkpoint adir is a directory; pass a .pt file",
    ),
    "checkpoint of random bytes": (
        [T, "-c", "random.pt"],
        "x\n",
        "random.pt: it is not a PyTorch checkpoint file",
    ),
    "checkpoint empty": ([T, "-c", "empty.pt"], "x\n", "empty.pt: it is empty"),
    "checkpoint truncated": (
        [T, "-c", "truncated.pt"],
        "x\n",
        "truncated.pt: it is truncated or corrupt",
    ),
    "checkpoint foreign pickle": (
        [T, "-c", "foreign.pt"],
        "x\n",
        "foreign.pt: it holds Python objects other than tensors",
    ),
    "checkpoint not ours": (
        [T, "-c", "notours.pt"],
        "x\n",
        "notours.pt is not a transformer-mt checkpoint",
    ),
    # translate: input, stdin, output
    "input missing": ([T, *CK, "-i", "nope.txt"], None, "file not found: nope.txt"),
    "input is a directory": ([T, *CK, "-i", "adir"], None, "adir is a directory; name a text file"),
    "input not UTF-8": ([T, *CK, "-i", "latin1.txt"], None, "latin1.txt:2: invalid UTF-8"),
    "stdin not UTF-8": ([T, *CK], "ok\nStra\xdfe\n".encode("latin-1"), "stdin:2: invalid UTF-8"),
    "output is the input": (
        [T, *CK, "-i", "in.txt", "-o", "in.txt"],
        None,
        "output in.txt is the input in.txt: writing it would destroy",
    ),
    "output is the input via a link": (
        [T, *CK, "-i", "in.txt", "-o", "link.txt"],
        None,
        "output link.txt is the input in.txt",
    ),
    "output is the checkpoint": (
        [T, *CK, "-i", "in.txt", "-o", "ck.pt"],
        None,
        "output ck.pt is the input ck.pt",
    ),
    "output is a directory": (
        [T, *CK, "-i", "in.txt", "-o", "adir"],
        None,
        "output adir is a directory; name a file",
    ),
    "output directory missing": (
        [T, *CK, "-i", "in.txt", "-o", "no/out.txt"],
        None,
        "output no/out.txt: directory",
    ),
    "output under a file": (
        [T, *CK, "-i", "in.txt", "-o", "afile/out.txt"],
        None,
        "output afile/out.txt: directory",
    ),
    # translate: options
    "device unknown": (
        [T, *CK, "--device", "gpu"],
        "x\n",
        "--device is 'gpu'; it must be auto, cpu",
    ),
    "attention layer out of range": (
        [T, *CK, "--attention-dir", "adir", "--attention-layer", "9"],
        "x\n",
        "--attention-layer 9: the model's decoder layers are 0 to 0",
    ),
    "attention layer without dir": (
        [T, *CK, "--attention-layer", "0"],
        "x\n",
        "--attention-layer chooses the layer of the heatmaps: add --attention-dir",
    ),
    "attention dir is a file": (
        [T, *CK, "--attention-dir", "afile"],
        "x\n",
        "--attention-dir afile is a file",
    ),
    "beam 0": (
        [T, *CK, "--beam", "0"],
        "x\n",
        "decode.beam_size (--beam) is 0; it must be 1 to 128",
    ),
    "beam 100000": (
        [T, *CK, "--beam", "100000"],
        "x\n",
        "decode.beam_size (--beam) is 100000; it must be 1 to 128",
    ),
    "beam wider than the vocabulary": (
        [T, *CK, "--beam", "100"],
        "x\n",
        "beam size 100 (--beam) needs a target vocabulary of at least 202 pieces; this model's "
        "has 200: use a beam of at most 99",
    ),
    "nbest above beam": (
        [T, *CK, "--beam", "2", "--nbest", "3"],
        "x\n",
        "decode.nbest (--nbest) is 3; it must be between 1 and the beam size (2)",
    ),
    "sample with a beam": (
        [T, *CK, "--sample", "--beam", "4"],
        "x\n",
        "decode.sampling (--sample) draws one translation per line",
    ),
    "sampling option without --sample": (
        [T, *CK, "--temperature", "0.7"],
        "x\n",
        "--temperature applies to sampling: add --sample, or drop --temperature",
    ),
    "batch tokens 0": (
        [T, *CK, "--batch-tokens", "0"],
        "x\n",
        "decode.batch_tokens (--batch-tokens) is 0; it must be at least 1",
    ),
    # evaluate
    "evaluate two empty files": (
        [E, "--hyp", "empty1.txt", "--ref", "empty2.txt"],
        None,
        "empty1.txt and empty2.txt are empty",
    ),
    "evaluate neither hyp nor src": (
        [E, "--ref", "ref.txt"],
        None,
        "give either --hyp FILE, or --src FILE with --checkpoint",
    ),
    "evaluate hyp and src": (
        [E, "--hyp", "in.txt", "--src", "in.txt", "-r", "ref.txt"],
        None,
        "give either --hyp FILE, or --src FILE with --checkpoint",
    ),
    "evaluate hyp with a beam": (
        [E, "--hyp", "in.txt", "-r", "ref.txt", "--beam", "4"],
        None,
        "--hyp scores translations made already; --beam is for translating --src",
    ),
    "evaluate src without checkpoint": (
        [E, "--src", "in.txt", "-r", "ref.txt"],
        None,
        "--src needs --checkpoint",
    ),
    "evaluate line counts differ": (
        [E, "--hyp", "two.txt", "-r", "ref.txt"],
        None,
        "line counts differ: two.txt has 2 lines, ref.txt has 3",
    ),
    "evaluate ref missing": (
        [E, "--hyp", "two.txt", "-r", "nope.txt"],
        None,
        "file not found: nope.txt",
    ),
    "evaluate ref is a directory": (
        [E, "--hyp", "two.txt", "-r", "adir"],
        None,
        "adir is a directory; name a text file",
    ),
    "evaluate ref not UTF-8": (
        [E, "--hyp", "two.txt", "-r", "latin1.txt"],
        None,
        "latin1.txt:2: invalid UTF-8",
    ),
    "evaluate bad checkpoint": (
        [E, "--src", "in.txt", "-r", "ref.txt", "-c", "random.pt"],
        None,
        "random.pt: it is not a PyTorch checkpoint file",
    ),
    # download (none of these reaches the network)
    "download unknown corpus": (
        ["download", "nosuchcorpus"],
        None,
        "unknown corpus 'nosuchcorpus'; known corpora:",
    ),
    "download without a name": (["download"], None, "name a corpus to download, or pass --list"),
    "download bad base url": (
        ["download", "multi30k", "--base-url", "ftp://x/"],
        None,
        "--base-url 'ftp://x/' is not an http(s) URL",
    ),
    "download dest is a file": (
        ["download", "multi30k", "--dest", "afile/sub"],
        None,
        "cannot create --dest afile/sub",
    ),
    # average
    "average missing checkpoint": (
        ["average", "ck.pt", "nope.pt", "-o", "avg.pt"],
        None,
        "checkpoint not found: nope.pt",
    ),
    "average random bytes": (
        ["average", "ck.pt", "random.pt", "-o", "avg.pt"],
        None,
        "random.pt: it is not a PyTorch checkpoint file",
    ),
    "average onto an input": (
        ["average", "ck.pt", "run/last.pt", "-o", "run/last.pt"],
        None,
        "output run/last.pt is the input run/last.pt",
    ),
    "translate with a tokenizer larger than the model's vocabulary": (
        ["translate", "-c", "smallvocab.pt", "-i", "in.txt"],
        None,
        "smallvocab.pt: a damaged checkpoint (its weights, model arguments or tokenizers do not "
        "fit together: the source tokenizer has 200 pieces, the model 150 rows)",
    ),
    "average a file twice": (
        ["average", "ck.pt", "run/../ck.pt", "-o", "avg.pt"],
        None,
        "run/../ck.pt is ck.pt again: name each file once",
    ),
    "average another run": (
        ["average", "ck.pt", "otherseed.pt", "-o", "avg.pt"],
        None,
        "otherseed.pt: another run than ck.pt (train.seed",
    ),
    "average a damaged tensor": (
        ["average", "ck.pt", "badshape.pt", "-o", "avg.pt"],
        None,
        "badshape.pt: ",
    ),
    "average onto a directory": (
        ["average", "ck.pt", "-o", "adir"],
        None,
        "output adir is a directory",
    ),
    "average output directory missing": (
        ["average", "ck.pt", "-o", "no/a.pt"],
        None,
        "output no/a.pt: directory",
    ),
    # plot
    "plot missing run": (["plot", "nope"], None, "no metrics.jsonl in nope"),
    "plot bad metrics line": (
        ["plot", "run", "--output", "m.png"],
        None,
        "run/metrics.jsonl:2: not a metrics record",
    ),
    "plot metrics not UTF-8": (
        ["plot", "badrun", "--output", "m.png"],
        None,
        "badrun/metrics.jsonl:1: not a metrics record ('utf-8' codec",
    ),
    "plot output is a directory": (
        ["plot", "goodrun", "--output", "adir"],
        None,
        "output adir is a directory",
    ),
    "plot output type unknown": (
        ["plot", "goodrun", "--output", "m.txt"],
        None,
        "--output m.txt: unknown image type 'txt'",
    ),
    "plot several runs, no output": (
        ["plot", "run", "badrun"],
        None,
        "2 runs to plot: say where the PNG goes with --output",
    ),
    # goodrun: its metrics are readable, so what refuses is the output check (run's bad line
    # would be refused first and hide it).
    "plot onto its metrics": (
        ["plot", "goodrun", "--output", "goodrun/metrics.jsonl"],
        None,
        "output goodrun/metrics.jsonl is the input goodrun/metrics.jsonl: writing it would destroy",
    ),
}


def _snapshot(d: Path) -> dict[str, str]:
    """Every path under ``d`` with a hash of its bytes (a link: where it points)."""
    found = {}
    for p in sorted(d.rglob("*")):
        key = str(p.relative_to(d))
        if p.is_symlink():
            found[key] = "-> " + os.readlink(p)
        elif p.is_file():
            found[key] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            found[key] = "dir"
    return found


def one_line_error(result) -> str:
    """The one `error:` line of a failed command (and no traceback, no bug's exception)."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """A directory of inputs, the current directory (so a default path lands there too)."""
    _workdir(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MT_DEBUG", raising=False)
    return tmp_path


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_and_changes_nothing(name, workdir):
    args, stdin, expected = CASES[name]
    before = _snapshot(workdir)
    message = one_line_error(runner.invoke(app, args, input=stdin))
    assert expected in message, message
    assert _snapshot(workdir) == before, "the files given (and the run directory) are unchanged"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible here")
@pytest.mark.parametrize("command", [[T, *CK], [E, "--src", "in.txt", "-r", "ref.txt", *CK]])
def test_device_cuda_without_a_gpu(command, workdir):
    before = _snapshot(workdir)
    message = one_line_error(runner.invoke(app, [*command, "--device", "cuda"], input="x\n"))
    assert "no CUDA GPU is visible" in message and "--device cpu" in message
    assert _snapshot(workdir) == before


def test_random_bytes_checkpoint_never_advises_unsafe_loading(workdir):
    for name in ("random.pt", "foreign.pt", "truncated.pt"):
        result = runner.invoke(app, [T, "-c", name], input="x\n")
        message = one_line_error(result)
        assert message.startswith(f"error: cannot load checkpoint {name}: ")
        assert "weights_only" not in result.output and "pass a .pt file" in message


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([T, *CK, "--beam", "abc"], "error: Invalid value for '--beam'"),
        ([T, *CK, "--nope"], "error: No such option: --nope"),
        ([T], "error: Missing option '--checkpoint'"),
        (["average", "--nope"], "error: No such option: --nope"),
        (["nosuch"], "error: No such command 'nosuch'"),
    ],
)
def test_usage_errors_are_one_line_with_click_exit_code_2(args, expected, workdir):
    result = runner.invoke(app, args, input="x\n")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected) and "--help`)" in lines[0], lines


def test_help_still_works():
    assert runner.invoke(app, ["--help"]).exit_code == 0
    done = runner.invoke(app, ["translate", "--help"])
    assert done.exit_code == 0 and "--attention-layer" in done.stdout


# ---- the output helper: never over an input; FIFOs, links and devices stay what they are ----


def _translate(*args: str, stdin: str | None = None):
    return runner.invoke(app, [T, "-c", "ck.pt", "--beam", "1", *args], input=stdin)


@pytest.fixture
def expected(workdir) -> str:
    """The translation of in.txt on stdout (what every output below must hold)."""
    result = _translate("-i", "in.txt")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("\n") == 3
    return result.stdout


def test_output_onto_a_fifo_writes_through_it(workdir, expected):
    fifo = workdir / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    result = _translate("-i", "in.txt", "-o", str(fifo))
    reader.join(timeout=60)
    assert result.exit_code == 0, result.output
    assert got == [expected]
    assert fifo.is_fifo(), "still a FIFO, not replaced by a regular file"


def test_input_from_a_fifo(workdir, expected):
    """`mt translate -i <(zcat in.gz)`: a pipe is read like a file."""
    fifo = workdir / "in.pipe"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text((workdir / "in.txt").read_text()))
    writer.start()
    result = _translate("-i", str(fifo))
    writer.join(timeout=60)
    assert result.exit_code == 0, result.output
    assert result.stdout == expected


def test_output_onto_a_symlink_updates_its_target(workdir, expected):
    target = workdir / "target.txt"
    target.write_text("old\n")
    target.chmod(0o640)
    (workdir / "out.txt").symlink_to("target.txt")
    assert _translate("-i", "in.txt", "-o", "out.txt").exit_code == 0
    assert (workdir / "out.txt").is_symlink() and os.readlink(workdir / "out.txt") == "target.txt"
    assert target.read_text(encoding="utf-8") == expected
    assert target.stat().st_mode & 0o777 == 0o640, "an existing file keeps its mode"


def test_output_onto_dev_null(workdir, expected):
    before = os.stat("/dev/null")
    assert _translate("-i", "in.txt", "-o", "/dev/null").exit_code == 0
    after = os.stat("/dev/null")
    assert (after.st_ino, after.st_mode, after.st_rdev) == (
        before.st_ino,
        before.st_mode,
        before.st_rdev,
    )


def test_a_device_is_no_input_file_to_protect():
    # `mt translate -o /dev/null < /dev/null`: the same inode on both sides, but nothing to lose.
    from transformer_mt.fileio import check_output

    assert check_output("/dev/null", [os.stat("/dev/null")]) == Path("/dev/null")


def test_lines_are_split_as_wc_l_counts_them(tmp_path):
    # Only "\n" ends a line (a lone CR stays inside it; CRs before the "\n" go): translating
    # keeps one output line per line `wc -l` counts.
    from transformer_mt.fileio import read_lines

    path = tmp_path / "cr.txt"
    path.write_bytes(b"a\rb\nc\r\r\nd\n")
    assert read_lines(path) == ["a\rb", "c", "d"]


def test_new_output_gets_mode_0644_under_umask_022(workdir, expected):
    old = os.umask(0o022)
    try:
        assert _translate("-i", "in.txt", "-o", "new.txt").exit_code == 0
        assert runner.invoke(app, ["average", "ck.pt", "-o", "avg.pt"]).exit_code == 0
        assert runner.invoke(app, ["plot", "goodrun", "--output", "m.png"]).exit_code == 0
    finally:
        os.umask(old)
    assert (workdir / "new.txt").read_text(encoding="utf-8") == expected
    assert (workdir / "new.txt").stat().st_mode & 0o777 == 0o644
    assert (workdir / "avg.pt").stat().st_mode & 0o777 == 0o644
    assert (workdir / "m.png").stat().st_mode & 0o777 == 0o644
    assert [p.name for p in workdir.iterdir() if p.name.endswith(".tmp")] == []


def test_average_refuses_to_overwrite_an_input_even_by_another_name(workdir):
    os.link(workdir / "run" / "last.pt", workdir / "hard.pt")
    before = _snapshot(workdir)
    result = runner.invoke(app, ["average", "ck.pt", "run/last.pt", "-o", "hard.pt"])
    assert "is the input run/last.pt" in one_line_error(result)
    assert _snapshot(workdir) == before


def test_plot_skips_a_half_written_last_line(workdir):
    good = '{"step": 1, "loss": 5.0, "nll": 4.9, "lr": 0.001}\n'
    (workdir / "run" / "metrics.jsonl").write_text(
        good + good.replace("1", "2") + '{"step": 3, "lo'
    )
    result = runner.invoke(app, ["plot", "run"])
    assert result.exit_code == 0, result.output
    assert "half-written last line" in result.stderr
    assert (workdir / "run" / "metrics.png").read_bytes()[:4] == b"\x89PNG"


# ---- the one place that turns failures into lines ----


def _call(fn):
    """Run ``fn`` through the CLI's decorator: (exit code, or the exception that escaped)."""
    try:
        user_errors(fn)()
    except typer.Exit as done:
        return done.exit_code
    return 0


@pytest.mark.parametrize(
    ("err", "expected"),
    [
        (PermissionError(13, "Permission denied", "runs/x"), "error: runs/x: permission denied"),
        (IsADirectoryError(21, "Is a directory", "out"), "error: out: is a directory"),
        (NotADirectoryError(20, "Not a directory", "f/x"), "error: f/x: a part of this path"),
        (FileExistsError(17, "File exists", "runs/r"), "error: runs/r: already exists"),
        (OSError(28, "No space left on device"), "error: no space left on device"),
        (MTError("bad thing"), "error: bad thing"),
    ],
)
def test_ordinary_failures_are_one_line(err, expected, capsys, monkeypatch):
    monkeypatch.delenv("MT_DEBUG", raising=False)

    def fail():
        raise err

    assert _call(fail) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), lines


def test_disk_full_inside_a_library_error_is_one_line(capsys):
    def fail():
        try:
            raise OSError(28, "No space left on device")
        except OSError as err:
            raise RuntimeError("unexpected pos 64 vs 0") from err  # what torch.save raises

    assert _call(fail) == 1
    assert capsys.readouterr().err.startswith("error: no space left on device")


def test_bugs_keep_their_traceback_and_mt_debug_shows_user_errors_too(monkeypatch):
    def bug():
        raise KeyError("a bug")

    def mistake():
        raise MTError("a user's mistake")

    with pytest.raises(KeyError):
        _call(bug)
    with pytest.raises(OSError):  # an errno that is no user's mistake
        _call(lambda: (_ for _ in ()).throw(OSError(9, "Bad file descriptor")))
    monkeypatch.setenv("MT_DEBUG", "1")
    with pytest.raises(MTError):
        _call(mistake)


def test_a_closed_stdout_pipe_ends_quietly(tmp_path):
    """`mt translate ... | head`: the reader went away; no traceback, no error, code 141."""
    code = "from transformer_mt.cli import main; main()"
    args = [sys.executable, "-c", code, T, "-c", str(FIXTURE / "old_last.pt"), "--beam", "1"]
    src = (FIXTURE / "src.txt").read_text(encoding="utf-8")
    proc = subprocess.Popen(
        args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path
    )
    proc.stdout.close()  # the reader is gone before anything is written
    _, err = proc.communicate(src.encode(), timeout=120)
    assert proc.returncode == 141, err
    assert b"Traceback" not in err and b"error" not in err.lower(), err


def test_stdout_on_a_full_disk_is_one_line(tmp_path):
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    code = "from transformer_mt.cli import main; main()"
    args = [sys.executable, "-c", code, T, "-c", str(FIXTURE / "old_last.pt"), "--beam", "1"]
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            args, input=b"ein Hund\n", stdout=full, stderr=subprocess.PIPE, timeout=120
        )
    lines = [x for x in done.stderr.decode().splitlines() if "sent/s" not in x]
    assert done.returncode == 1, done.stderr
    assert len(lines) == 1 and lines[0].startswith("error: stdout: no space left on device"), lines


# Runs in a private mount namespace (nothing is mounted outside it): a 200 KiB tmpfs, nearly
# filled, then `mt translate -o` and `mt average -o` onto it; prints what came back as JSON.
_FULL_DISK = """
import hashlib, json, os, subprocess, sys
mnt, ckpt = sys.argv[1:]
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", mnt], check=True)
with open(os.path.join(mnt, "fill"), "wb") as f:
    f.write(bytes(160 * 1024))
with open(os.path.join(mnt, "old.txt"), "w") as f:
    f.write("old\\n")
from typer.testing import CliRunner
from transformer_mt.cli import app
runs = [
    CliRunner().invoke(app, ["translate", "-c", ckpt, "--beam", "1", "-o", mnt + "/old.txt"],
                       input="ein Hund\\n" * 3000),
    CliRunner().invoke(app, ["average", ckpt, "-o", mnt + "/avg.pt"]),
]
files = {n: hashlib.sha256(open(os.path.join(mnt, n), "rb").read()).hexdigest()[:8]
         for n in sorted(os.listdir(mnt))}
print(json.dumps({"runs": [[r.exit_code, r.stderr] for r in runs], "files": files,
                  "old": open(os.path.join(mnt, "old.txt")).read()}))
"""


def test_outputs_on_a_full_disk_are_one_line_and_leave_nothing(tmp_path):
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no `unshare` to make a private mount namespace for a small tmpfs")
    prefix = [unshare, "-m"] if os.geteuid() == 0 else [unshare, "-r", "-m"]
    mnt = tmp_path / "small"
    mnt.mkdir()
    ckpt = tmp_path / "ck.pt"
    shutil.copyfile(FIXTURE / "old_last.pt", ckpt)
    cmd = [*prefix, sys.executable, "-c", _FULL_DISK, str(mnt), str(ckpt)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0 and "mount" in done.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for (code, stderr), name in zip(result["runs"], ["old.txt", "avg.pt"], strict=True):
        lines = [x for x in stderr.strip().splitlines() if "sent/s" not in x]
        assert code == 1 and len(lines) == 1, stderr
        assert lines[0].startswith(f"error: {mnt / name}: no space left on device to write ")
        assert lines[0].split("to write ")[1].split(" bytes")[0].replace(",", "").isdigit()
    assert sorted(result["files"]) == ["fill", "old.txt"], "no temporary file left behind"
    assert result["old"] == "old\n", "the old output is unchanged"


def test_average_of_other_runs_only_when_asked(workdir):
    refused = runner.invoke(app, ["average", "ck.pt", "otherseed.pt", "-o", "avg.pt"])
    assert "--other-runs" in one_line_error(refused) and not (workdir / "avg.pt").exists()
    done = runner.invoke(app, ["average", "ck.pt", "otherseed.pt", "--other-runs", "-o", "avg.pt"])
    assert done.exit_code == 0, done.output
    assert (workdir / "avg.pt").is_file()


def test_plot_draws_a_validation_line_without_its_loss(workdir):
    good = '{"step": 1, "loss": 5.0, "nll": 4.9, "lr": 0.001}\n'
    (workdir / "run" / "metrics.jsonl").write_text(
        good + '{"step": 1, "time_s": 2.0, "val_bleu": 1.0}\n' + good.replace("1,", "2,")
    )
    result = runner.invoke(app, ["plot", "run"])
    assert result.exit_code == 0, result.output
    assert (workdir / "run" / "metrics.png").read_bytes()[:4] == b"\x89PNG"


def test_commands_given_nothing_say_so_in_one_line(tmp_path):
    """Nothing to work on (no checkpoint to average, empty files to score) is one line, exit 1,
    and nothing is written."""
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    cases = [
        (["average", "-o", str(tmp_path / "avg.pt")], "nothing to average: name the checkpoints"),
        (["average", str(FIXTURE / "old_last.pt")], "give --output FILE"),
        (["evaluate", "--hyp", str(empty), "--ref", str(empty)], "are empty: nothing to score"),
    ]
    for args, message in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 1, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt"]
