"""scripts/bench_decode_fair.py: each engine alone in its process, engines alternating, outputs
and BLEU beside the times.

The end-to-end check runs a tiny checkpoint on a few lines (about ten processes of a second or
two each); it is skipped where ctranslate2 is not installed.
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench_decode_fair.py"
FIXTURE = ROOT / "tests" / "fixtures" / "old_checkpoint"


def load_script():
    """The benchmark script as a module (its top level imports the standard library only)."""
    spec = importlib.util.spec_from_file_location("bench_decode_fair", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_engines_take_every_place_in_turn():
    bench = load_script()
    engines = ["a", "b", "c"]
    bench.ENGINES.update({name: ("ours", "fp32") for name in engines})
    order = bench.schedule(engines, ["chunks"], runs=3)
    runs = [[engine for run, _, engine in order if run == r] for r in range(3)]
    assert runs == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]


@pytest.mark.parametrize("warm_pass", [False, True])
def test_the_timed_pass_follows_the_warm_up_and_with_warm_pass_a_whole_untimed_pass(
    warm_pass, monkeypatch
):
    bench = load_script()
    calls = []
    clock = [0.0]  # each engine call takes 10 "seconds" of a fake clock
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])

    def translate(todo):
        calls.append(list(todo))
        clock[0] += 10.0
        return [text.upper() for text in todo]

    spec = {"warmup": 1, "chunks": [[2, 0], [1]], "warm_pass": warm_pass}
    report = bench.timed_run(translate, ["a", "b", "c"], spec, started=0.0)
    one_pass = [["c", "a"], ["b"]]
    assert calls == [["a"], *one_pass] + (one_pass if warm_pass else [])
    assert report["outputs"] == ["A", "B", "C"]
    assert report["seconds"] == 20.0, "one pass timed"
    assert report["warmup_s"] == 10.0 + 20.0 * warm_pass


def test_continuous_search_runs_in_the_preferred_batching_only():
    bench = load_script()
    order = bench.schedule(["ours-fp32", "ours-continuous"], ["chunks", "preferred"], runs=2)
    assert ("chunks", "ours-continuous") not in {(b, e) for _, b, e in order}
    assert sum(e == "ours-continuous" for _, b, e in order) == 2


def check_reports(reports: dict, lines: list[str]) -> None:
    """One batching's runs of ours-fp32 and ct2-float32 (greedy) on ``lines``: each engine's
    process held only its own packages, and both translated every line alike."""
    ours, ct2 = (reports[engine][0] for engine in ("ours-fp32", "ct2-float32"))
    # The CTranslate2 process imported its engine and sentencepiece, never torch or ours.
    assert "ctranslate2" in ct2["packages"]
    assert not {"torch", "transformer_mt"} & set(ct2["packages"])
    assert {"torch", "transformer_mt"} <= set(ours["packages"])
    assert "ctranslate2" not in ours["packages"]
    # Greedy search: the same weights give the same text, line for line.
    assert ct2["outputs"] == ours["outputs"]
    assert ours["outputs"][4] == "" and ours["outputs"][-1] == "12:30 -- 45"
    assert sum(bool(text) for text in ours["outputs"]) == len(lines) - 1
    assert ours["seconds"] > 0 and ours["load_s"] > 0


def test_each_engine_runs_alone_and_greedy_outputs_agree(tmp_path):
    pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed")
    lines = (FIXTURE / "src.txt").read_text(encoding="utf-8").splitlines()[:9]
    lines.append("12:30 -- 45")  # nothing to translate: every engine returns it as it is
    src, ref, report = tmp_path / "src.txt", tmp_path / "ref.txt", tmp_path / "report.json"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ref.write_text("\n".join(line.lower() for line in lines) + "\n", encoding="utf-8")
    command = [
        sys.executable,
        str(SCRIPT),
        "--checkpoint",
        str(FIXTURE / "old_last.pt"),
        "--src",
        str(src),
        "--ref",
        str(ref),
        "--valid-src",
        str(src),
        "--valid-ref",
        str(ref),
        "--len-penalty-grid",
        "0.6",
        "2.0",
        "--beam",
        "1",
        "--batch",
        "4",
        "--warmup",
        "2",
        "--threads",
        "1",
        "--runs",
        "1",
        "--pause",
        "0",
        "--batch-tokens",
        "7",
        "--engines",
        "ours-fp32",
        "ct2-float32",
        "--json",
        str(report),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(report.read_text(encoding="utf-8"))

    for batching in ("chunks", "preferred"):
        check_reports(result["reports"][batching], lines)
    # --batch-tokens sets ours' batches in the preferred batching, and CTranslate2's by default.
    assert result["reports"]["preferred"]["ours-fp32"][0]["batch_tokens"] == 7
    assert "ours decode.batch_tokens 7; CTranslate2 max_batch_size 7," in done.stdout

    grid = {float(alpha): bleu for alpha, bleu in result["len_penalty_grid"].items()}
    assert set(grid) == {0.6, 2.0}
    assert grid[result["ct2_len_penalty"]] == max(grid.values())
    rows = {row["engine"]: row for row in result["tables"]["chunks"]}
    assert rows["ct2-float32"]["speed_vs_base"] == 1.0
    assert rows["ours-fp32"]["bleu"] == rows["ct2-float32"]["bleu"]
    assert "| ours-fp32 |" in done.stdout and "| ct2-float32 |" in done.stdout
    assert "avx512_bf16" in done.stdout
