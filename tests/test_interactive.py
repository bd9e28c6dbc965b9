"""`mt translate --interactive`: each line is answered before the next one is written."""

import os
import select
import subprocess
import sys
import warnings
from pathlib import Path

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint"


def _read_line(stream, timeout_s: float) -> bytes:
    """One line from ``stream`` within ``timeout_s`` seconds, or b"" when none came."""
    ready, _, _ = select.select([stream], [], [], timeout_s)
    return stream.readline() if ready else b""


def test_interactive_answers_the_first_line_before_the_second_is_written():
    lines = (FIXTURE / "src.txt").read_text(encoding="utf-8").splitlines()
    expected = (FIXTURE / "expected.beam1.txt").read_text(encoding="utf-8").splitlines()
    cmd = [sys.executable, "-m", "transformer_mt", "translate", "-c", str(FIXTURE / "old_last.pt"),
           "--beam", "1", "--interactive"]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    try:
        for i in (0, 1, 4):  # line 5 (index 4) is empty: empty in, empty out
            proc.stdin.write((lines[i] + "\n").encode())
            proc.stdin.flush()  # the pipe stays open: a batching reader would wait for more
            answer = _read_line(proc.stdout, timeout_s=60)
            assert answer.decode().rstrip("\n") == expected[i], (i, answer)
    finally:
        proc.stdin.close()
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    assert proc.stdout.read() == b"", "nothing more after the end of the input"


def test_interactive_refuses_file_options_before_loading_the_model(tmp_path):
    """--input, --output and --prefix-file have no place in a line-by-line session: each is a
    one-line error naming the option (before, --input and --prefix-file were silently ignored)."""
    from typer.testing import CliRunner

    from transformer_mt.cli import app

    src = tmp_path / "src.txt"
    src.write_text("ein Hund\n", encoding="utf-8")
    for option, what in (("--input", "reads stdin"), ("--output", "answers on stdout"),
                         ("--prefix-file", "has no file lines")):  # fmt: skip
        args = ["translate", "-c", str(FIXTURE / "old_last.pt"), "--interactive", option, str(src)]
        if option == "--output":
            args[-1] = str(tmp_path / "out.txt")
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 1, (option, result.output)
        errors = [line for line in result.output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and f"--interactive {what}" in errors[0], (option, result.output)
        assert f"drop {option} " in errors[0] and "drop --interactive" in errors[0]
    assert not (tmp_path / "out.txt").exists()


def test_interactive_numbers_pictures_and_warnings_by_the_line_of_the_session(tmp_path):
    """Each line is translated on its own, yet its attention picture and its truncation warning
    carry its own line number (before: every picture overwrote 000001.png, every warning said
    line 1)."""
    from typer.testing import CliRunner

    from transformer_mt.cli import app

    lines = (FIXTURE / "src.txt").read_text(encoding="utf-8").splitlines()
    too_long = " ".join([lines[0]] * 200)  # beyond the model's position table
    pictures = tmp_path / "att"
    args = ["translate", "-c", str(FIXTURE / "old_last.pt"), "--beam", "1", "--interactive",
            "--attention-dir", str(pictures)]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        result = CliRunner().invoke(app, args, input=f"{lines[0]}\n{lines[1]}\n{too_long}\n")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in pictures.iterdir()) == [f"00000{i}.png" for i in (1, 2, 3)]
    warned = [line for line in result.stderr.splitlines() if "exceed the limit" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: line 3:"), result.stderr


def _mt(args: list[str], **kw) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "transformer_mt", "translate", "-c", str(FIXTURE / "old_last.pt")]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120, **kw)


def test_a_closed_stdin_is_one_line_not_a_traceback():
    for args in ([], ["--interactive"]):
        done = _mt(args, stdin=subprocess.DEVNULL, preexec_fn=lambda: os.close(0))
        assert done.returncode == 1 and done.stderr.startswith("error: stdin is closed"), (
            args,
            done.stderr,
        )
        assert len(done.stderr.splitlines()) == 1


def test_a_terminal_on_stdin_with_output_names_what_to_do(tmp_path):
    """No --interactive given: a terminal on stdin is what made the session interactive, so the
    advice cannot be to drop --interactive."""
    import pty

    leader, follower = pty.openpty()
    try:
        done = _mt(["-o", str(tmp_path / "out.txt")], stdin=follower)
    finally:
        os.close(follower)
        os.close(leader)
    assert done.returncode == 1
    assert done.stderr.startswith("error: stdin is a terminal, read line by line"), done.stderr
    assert "give --input FILE or pipe the text in" in done.stderr and "--interactive" not in (
        done.stderr
    )
    assert not (tmp_path / "out.txt").exists()


def test_a_line_cut_to_the_model_is_a_bare_warning_line(tmp_path):
    src = tmp_path / "long.txt"
    src.write_text(" ".join(["ein Hund läuft"] * 200) + "\n", encoding="utf-8")
    done = _mt(["-i", str(src), "--beam", "1"])
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if "exceed the limit" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: line 1: "), done.stderr
    assert "UserWarning" not in done.stderr and ".py:" not in done.stderr


def test_a_session_samples_what_the_file_samples_line_by_line(tmp_path):
    """Sampling draws are keyed by the line number: a session, fed one line at a time, samples
    what the whole file does (before, each line of a session drew from a fresh generator)."""
    from typer.testing import CliRunner

    from transformer_mt.cli import app

    text = (FIXTURE / "src.txt").read_text(encoding="utf-8")
    sample = ["translate", "-c", str(FIXTURE / "old_last.pt"), "--sample", "--seed", "11",
              "--temperature", "1.5"]  # fmt: skip
    whole = CliRunner().invoke(app, [*sample, "-i", str(FIXTURE / "src.txt")])
    session = CliRunner().invoke(app, [*sample, "--interactive"], input=text)
    assert whole.exit_code == session.exit_code == 0, (whole.output, session.output)
    assert session.stdout == whole.stdout
    assert len(set(whole.stdout.splitlines())) > 10
