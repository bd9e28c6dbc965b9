"""scripts/gpu_check.sh --smoke: every phase of the GPU measurements, at tiny sizes on the CPU, and
the files it writes into $OUT."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_smoke_runs_end_to_end_and_writes_its_figures(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--smoke"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = (tmp_path / "log.txt").read_text() if (tmp_path / "log.txt").is_file() else ""
    assert result.returncode == 0, result.stderr + log
    names = {p.name for p in tmp_path.iterdir()}
    assert names >= {"figures.jsonl", "summary.md", "log.txt", "pytest.txt", "env.txt"}, names
    assert len(names) <= 8, "the device tool brings back at most 8 files"
    rows = [json.loads(x) for x in (tmp_path / "figures.jsonl").read_text().splitlines()]
    # two precisions x (eager, compiled), then eager with unbounded shapes
    assert [(r["precision"], r["compile"], r["pad_to_multiple"]) for r in rows] == [
        ("bf16", "off", 8),
        ("bf16", "on", 8),
        ("fp16", "off", 8),
        ("fp16", "on", 8),
        ("bf16", "on", 8),  # --cuda-graphs on a GPU (--smoke: compiled alone)
        ("bf16", "off", 0),
    ]
    for r in rows:
        assert r["data"] == "wmt" and r["tokens_per_s"] > 0 and r["gflop_per_target_token"] > 0
        assert 0 < r["attention_share_of_flops"] < 1 and r["shapes_used"] >= 1
        assert (r["compiled_graphs"] is not None) == (r["compile"] == "on")
    compiled = [r for r in rows if r["compile"] == "on"]
    assert all(r["compiled_graphs"] == 2 * r["shapes_used"] for r in compiled), compiled
    summary = (tmp_path / "summary.md").read_text()
    assert "gpu_check (smoke, CPU)" in summary and "failed" not in summary, summary
    assert "compiled / eager" in summary and "recipe: 6 steps" in summary
    assert "batch shapes (train.pad_to_multiple=8)" in summary
    assert (tmp_path / "recipe_metrics.jsonl").is_file()
