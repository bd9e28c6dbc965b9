"""A full disk, for real: a small tmpfs mounted in a private mount namespace (``unshare -m``, or
``unshare -rm`` without root), so nothing is mounted outside the test's own processes.

What is proved: preparing data onto a full disk is one ``error:`` line naming the path and the
space, not a SIGBUS; no temporary directory is left; an existing cache or checkpoint is kept.
The tests skip, saying why, where no mount namespace can be made (no ``unshare``, no privileges).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Runs inside the namespace: mount a tmpfs of argv[1] bytes on argv[2], run the rest of argv,
# then report its exit status, output and what it left on the tmpfs (which vanishes with us).
_DRIVER = """
import json, os, subprocess, sys
size, mnt, *argv = sys.argv[1:]
subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", mnt], check=True)
run = subprocess.run(argv, capture_output=True, text=True)
files = sorted(os.path.relpath(os.path.join(d, f), mnt)
               for d, dirs, names in os.walk(mnt) for f in dirs + names)
print(json.dumps({"rc": run.returncode, "out": run.stdout, "err": run.stderr, "files": files}))
"""


@functools.cache
def _namespace() -> tuple[list[str] | None, str]:
    """The command prefix that runs a process in a private mount namespace where it may mount a
    tmpfs, or None and the reason why there is none."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None, "no `unshare` command to make a private mount namespace"
    prefix = [unshare, "-m"] if os.geteuid() == 0 else [unshare, "-r", "-m"]
    probe = 'd=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs "$d" && umount "$d" && rmdir "$d"'
    try:
        done = subprocess.run([*prefix, "sh", "-c", probe], capture_output=True, text=True,
                              timeout=60)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"cannot run {prefix}: {exc}"
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return None, f"cannot mount a tmpfs in a private mount namespace ({why})"
    return prefix, ""


def on_tmpfs(tmp_path: Path, size: str, argv: list[str]) -> tuple[dict, Path]:
    """Run ``argv`` with a tmpfs of ``size`` mounted at ``tmp_path/mnt``: its result and the
    mount point (empty again afterwards)."""
    prefix, why = _namespace()
    if prefix is None:
        pytest.skip(why)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [*prefix, sys.executable, "-c", _DRIVER, size, str(mnt), *argv]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1]), mnt


def _error_line(result: dict) -> str:
    """The process's stderr, which must be exactly one ``error:`` line after its progress."""
    assert "Traceback" not in result["err"], result["err"]
    last = result["err"].strip().splitlines()[-1]
    assert last.startswith("error: "), result["err"]
    return last


# --- the binarized cache --------------------------------------------------------------------------

# A cache built, then a rebuild sized so that the token ids and lengths fit but the offsets do
# not: exactly where the memory-mapped offsets used to die of SIGBUS.
_REBUILD = """
import shutil, sys
from pathlib import Path
from transformer_mt.data.binarized import build_binarized, load_binarized
from transformer_mt.errors import MTError
out = Path(sys.argv[1]) / "run-train"
build_binarized(out, "old", [([5, 6], [7])] * 3, 100)
free = shutil.disk_usage(out.parent).free
n = (free - 64 * 1024) // 96  # 20 uint16 ids a side (80 B) and two int64 lengths (16 B) a pair
try:
    build_binarized(out, "new", ([[4 + i % 90] * 20, [5] * 20] for i in range(n)), 100)
except MTError as err:
    print(f"error: {err}", file=sys.stderr)
    print("kept" if load_binarized(out, "old") is not None else "lost")
    sys.exit(1)
"""


def test_binarizing_onto_a_full_disk_is_one_line_not_sigbus(tmp_path):
    result, mnt = on_tmpfs(tmp_path, "2m", [sys.executable, "-c", _REBUILD, str(tmp_path / "mnt")])
    assert result["rc"] == 1, result  # was -7 (SIGBUS), with no message
    line = _error_line(result)
    assert line.startswith(f"error: {mnt / 'run-train'}: no space left on device while writing")
    sizes = re.search(r"it needs about ([\d.]+) MiB there and ([\d.]+) MiB are free", line)
    assert sizes and float(sizes[1]) > float(sizes[2]) and "data.cache_dir" in line, line
    assert result["out"].strip() == "kept"  # the previous cache is still there and valid
    assert result["files"] == [  # nothing else: no run-train.tmp-<pid>, no .old-<pid>
        "run-train",
        *(f"run-train/{f}" for f in ("meta.json", "src_offsets.npy", "src_tokens.bin")),
        *(f"run-train/{f}" for f in ("trg_offsets.npy", "trg_tokens.bin")),
    ]


def test_mt_prepare_onto_a_full_disk(tmp_path):
    """`mt prepare` of a local corpus larger than the disk that holds data.cache_dir."""
    from transformer_mt.data.toy import generate_pairs

    pairs = generate_pairs(20_000, seed=5)
    for split, chunk in (("train", pairs), ("valid", pairs[:200])):
        for side, lang in enumerate(("src", "trg")):
            text = "".join(p[side] + "\n" for p in chunk)
            (tmp_path / f"{split}.{lang}").write_text(text, encoding="utf-8")
    sets = ["data.corpus=local", f"data.cache_dir={tmp_path / 'mnt'}", "tokenizer.vocab_size=200"]
    sets += [f"data.{s}_{lang}={tmp_path / f'{s}.{lang}'}" for s in ("train", "valid")
             for lang in ("src", "trg")]  # fmt: skip
    argv = [sys.executable, "-m", "transformer_mt", "prepare"]
    argv += [arg for s in sets for arg in ("--set", s)]
    result, mnt = on_tmpfs(tmp_path, "256k", argv)
    assert result["rc"] == 1, result
    line = _error_line(result)
    assert str(mnt) in line and "no space left on device" in line, line
    assert not [f for f in result["files"] if ".tmp" in f or ".old-" in f], result["files"]


# --- checkpoints ----------------------------------------------------------------------------------

_SAVE = """
import sys
from pathlib import Path
import torch
from transformer_mt.checkpoint import save_checkpoint
from transformer_mt.errors import MTError
path = Path(sys.argv[1]) / "last.pt"
save_checkpoint({"model": {"w": torch.ones(1000)}, "step": 1}, path)
try:
    save_checkpoint({"model": {"w": torch.ones(1_000_000)}, "step": 2}, path)  # 4 MB
except MTError as err:
    print(f"error: {err}", file=sys.stderr)
    old = torch.load(path, weights_only=True)
    print("kept" if old["step"] == 1 and torch.equal(old["model"]["w"], torch.ones(1000)) else "?")
    sys.exit(1)
"""


def test_saving_a_checkpoint_onto_a_full_disk_keeps_the_old_one(tmp_path):
    result, mnt = on_tmpfs(tmp_path, "1m", [sys.executable, "-c", _SAVE, str(tmp_path / "mnt")])
    assert result["rc"] == 1, result
    line = _error_line(result)
    assert line.startswith(f"error: {mnt / 'last.pt'}: no space left on device"), line
    assert result["out"].strip() == "kept"
    assert result["files"] == ["last.pt"]  # no temporary file beside it


def test_mt_prepare_of_the_toy_corpus_onto_a_full_disk_names_the_file(tmp_path):
    argv = [sys.executable, "-m", "transformer_mt", "prepare", "--set"]
    result, mnt = on_tmpfs(tmp_path, "64k", [*argv, f"data.cache_dir={tmp_path / 'mnt'}"])
    assert result["rc"] == 1, result
    line = _error_line(result)
    assert str(mnt) in line and "no space left on device" in line, line
    assert not [f for f in result["files"] if ".tmp" in f], result["files"]
