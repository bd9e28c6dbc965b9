#!/usr/bin/env bash
# Every GPU measurement of training speed in one run: about 9 minutes on one H200.
#
#   OUT=/some/folder bash scripts/gpu_check.sh           # on a machine with a CUDA GPU
#   OUT=/tmp/x bash scripts/gpu_check.sh --smoke         # anywhere: tiny sizes on the CPU, seconds
#
# What it runs, in this order, each phase bounded in time so that the whole fits BUDGET_S
# (default 540 s; a phase that would not fit is skipped, saying so):
#   1. pytest -m gpu on the GPU tests (tests/test_gpu_training.py: SDPA reaches flash /
#      memory-efficient kernels, no host synchronisation inside a step, compiled training meets
#      few shapes; tests/test_multinode.py: NCCL, bf16, compile).
#   2. scripts/bench_train.py on WMT-shaped batches (32k vocabulary, 16,384 tokens a side): the
#      base and the big model, bf16 and fp16, each eager and compiled (`--compile on`, as `mt
#      train` compiles; the two most frequent batch shapes, so that compiling fits the time), then
#      base bf16 compiled with CUDA graphs (`--cuda-graphs`, train.cuda_graphs), then base bf16
#      eager with unbounded shapes (what bounding costs eagerly). Tokens/s, MFU against
#      989 TFLOP/s, the FLOP count per token (attention's share), peak memory, graphs and compile
#      seconds.
#   3. The GPU recipe (configs/multi30k_de_en_gpu.yaml) with train.compile for RECIPE_MINUTES
#      (default 2): the graphs compiled and when, tokens/s window by window (no stall once each
#      shape has been seen). Needs the Multi30k files: $MT_SHARED_DATA, or data/multi30k/ in the
#      checkout (train/val .de.gz/.en.gz); skipped without them.
#
# Written into $OUT (at most 8 files):
#   figures.jsonl         one JSON line per model measured by bench_train.py (see its --json)
#   summary.md            the figures as a table, the recipe run's summary, each phase's status
#   log.txt               everything the phases printed
#   pytest.txt            pytest's report
#   recipe_metrics.jsonl  the recipe run's metrics.jsonl
#   env.txt               the machine, the driver, torch
#
# --smoke: the same phases on the CPU at tiny sizes (compiling by the eager backend: tracing, no
# code generation), the recipe on the toy corpus with a tiny model, eagerly;
# tests/test_gpu_check.py runs it and checks the files.
# PYTHON: the interpreter (default .venv/bin/python where it exists, else python3).
set -uo pipefail

smoke=0
if [ "${1:-}" = "--smoke" ]; then
    smoke=1
elif [ $# -gt 0 ]; then
    echo "usage: OUT=DIR bash scripts/gpu_check.sh [--smoke]" >&2
    exit 2
fi
if [ -z "${OUT:-}" ]; then
    echo "set OUT to the folder the figures go to" >&2
    exit 2
fi
cd "$(dirname "$0")/.." || exit 2
repo=$PWD
mkdir -p "$OUT"
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
budget=${BUDGET_S:-540}
log="$OUT/log.txt"
summary="$OUT/summary.md"
figures="$OUT/figures.jsonl"
: >"$log"
: >"$figures"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ "$smoke" = 1 ]; then
    device=cpu
    bench_size=(--d-model 32 --heads 2 --ffn 64 --layers 1 --vocab 1000 --batch-tokens 512)
    bench_runs=(--runs 1 --steps 2 --warmup 1 --compile-backend eager --threads 1)
    sizes=(tiny)
    recipe_minutes=0
else
    device=cuda
    bench_size=(--batch-tokens 16384)
    bench_runs=(--runs 3 --steps 10 --warmup 3)
    sizes=(base big)
    recipe_minutes=${RECIPE_MINUTES:-2}
fi

status=()  # one line per phase: what ran, and how it ended
left() { echo $((budget - SECONDS)); }
# run_phase NAME MAX_SECONDS COMMAND...: the command, bounded by MAX_SECONDS and the time left
run_phase() {
    local name=$1 cap=$2
    shift 2
    local limit
    limit=$(left)
    if [ "$limit" -gt "$cap" ]; then limit=$cap; fi
    if [ "$limit" -lt 20 ]; then
        status+=("$name: skipped ($(left) s of the budget left)")
        echo "== $name: skipped, $(left) s left" >>"$log"
        return 0
    fi
    echo "== $name (at most ${limit} s)" >>"$log"
    local started=$SECONDS
    timeout --signal=INT --kill-after=15 "$limit" "$@" >>"$log" 2>&1
    local code=$?
    local spent=$((SECONDS - started))
    if [ "$code" = 0 ]; then
        status+=("$name: ok (${spent} s)")
    elif [ "$code" = 124 ] || [ "$code" = 130 ]; then
        status+=("$name: stopped at its limit of ${limit} s")
    else
        status+=("$name: failed (exit $code, ${spent} s; see log.txt)")
    fi
    echo "== $name: exit $code after ${spent} s" >>"$log"
}

{
    echo "date: $(date -u +%FT%TZ)"
    echo "mode: $([ "$smoke" = 1 ] && echo smoke || echo full)"
    grep -m1 'model name' /proc/cpuinfo 2>/dev/null || true
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    "$PYTHON" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.get_device_name() if torch.cuda.is_available() else None)"
} >"$OUT/env.txt" 2>&1

# 1. The GPU tests (on a CPU they skip, saying why).
run_phase "pytest -m gpu" 150 "$PYTHON" -m pytest -q -m gpu -rs -p no:cacheprovider \
    tests/test_gpu_training.py tests/test_multinode.py
grep -E "passed|failed|skipped|error|SKIPPED|FAILED" "$log" >"$OUT/pytest.txt" || true

# 2. bench_train.py: WMT-shaped batches.
for size in "${sizes[@]}"; do
    for precision in bf16 fp16; do
        model=()
        if [ "$size" != tiny ]; then model=(--model "$size"); fi
        run_phase "bench $size $precision eager+compiled" 100 \
            "$PYTHON" scripts/bench_train.py --device "$device" --data wmt "${model[@]}" \
            "${bench_size[@]}" "${bench_runs[@]}" --precision "$precision" --only ours \
            --compile on --max-shapes 2 --json "$figures"
    done
done
model=()
if [ "$smoke" = 0 ]; then model=(--model base); fi
graphs=(--cuda-graphs)
if [ "$smoke" = 1 ]; then graphs=(); fi  # aot_eager on a CPU: nothing to replay
run_phase "bench ${sizes[0]} bf16 compiled with CUDA graphs" 60 \
    "$PYTHON" scripts/bench_train.py --device "$device" --data wmt "${model[@]}" \
    "${bench_size[@]}" "${bench_runs[@]}" --precision bf16 --only compiled \
    --compile on --max-shapes 2 "${graphs[@]}" --json "$figures"
run_phase "bench ${sizes[0]} bf16 eager, unbounded shapes" 60 \
    "$PYTHON" scripts/bench_train.py --device "$device" --data wmt "${model[@]}" \
    "${bench_size[@]}" "${bench_runs[@]}" --precision bf16 --only ours --pad-to-multiple 0 \
    --json "$figures"

# 3. The recipe with train.compile (the toy corpus and a tiny model in --smoke).
m30k=${MT_SHARED_DATA:-$repo/data/multi30k}
if [ -f "$m30k/multi30k/train.de.gz" ]; then m30k=$m30k/multi30k; fi
run="$work/run"
if [ "$smoke" = 1 ]; then
    recipe=(--config configs/toy.yaml --set train.max_steps=6 --set train.compile=false
        --set model.d_model=32 --set model.n_head=2 --set model.ffn_hidden=64
        --set model.n_layers=1 --set data.toy_train_size=300 --set data.toy_valid_size=10
        --set data.toy_test_size=10 --set tokenizer.vocab_size=200 --set train.batch_tokens=512
        --set train.warmup_steps=10 --set train.log_every=2 --set train.threads=1
        --set "data.cache_dir=$work/cache" --set train.precision=fp32 --set decode.precision=fp32
        --set train.pad_to_multiple=8)
elif [ -f "$m30k/train.de.gz" ]; then
    recipe=(--config configs/multi30k_de_en_gpu.yaml --set data.corpus=local
        --set "data.train_src=$m30k/train.de.gz" --set "data.train_trg=$m30k/train.en.gz"
        --set "data.valid_src=$m30k/val.de.gz" --set "data.valid_trg=$m30k/val.en.gz"
        --set "train.max_minutes=$recipe_minutes" --set train.compile=true
        --set "data.cache_dir=$work/cache" --set train.log_every=25)
else
    recipe=()
    status+=("recipe: skipped (no Multi30k files in \$MT_SHARED_DATA or data/multi30k)")
fi
if [ ${#recipe[@]} -gt 0 ]; then
    run_phase "recipe" $((recipe_minutes * 60 + 150)) \
        "$PYTHON" -m transformer_mt train "${recipe[@]}" --run-dir "$run" --no-progress \
        --set train.valid_bleu=false --set train.best_metric=loss \
        --set train.valid_every=1000000 --set train.average_last=0
    if [ -f "$run/metrics.jsonl" ]; then cp "$run/metrics.jsonl" "$OUT/recipe_metrics.jsonl"; fi
fi

# The summary: the figures as a table, the recipe run's windows.
{
    echo "# gpu_check ($([ "$smoke" = 1 ] && echo smoke, CPU || echo full)), $(date -u +%FT%TZ)"
    echo
    cat "$OUT/env.txt"
    echo
    for line in "${status[@]}"; do echo "- $line"; done
    echo
    "$PYTHON" - "$figures" "$OUT/recipe_metrics.jsonl" "$log" <<'EOF'
import json
import sys
from pathlib import Path

figures, metrics, log = (Path(a) for a in sys.argv[1:])
rows = [json.loads(x) for x in figures.read_text().splitlines() if x.strip()]
if rows:
    print("| model | precision | shapes | compile | tok/s (min..max) | TFLOP/s | MFU | peak MiB |"
          " graphs | compile s | padding src/trg | GFLOP/tok (attn) |")
    print("|" + "---|" * 12)
for r in rows:
    mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else ""
    print(
        f"| {r['model']} d{r['d_model']} | {r['precision']} | "
        f"{'x' + str(r['pad_to_multiple']) if r['pad_to_multiple'] else 'unbounded'} "
        f"({r['shapes_used']}) | {r['compile']} | {r['tokens_per_s']:,} "
        f"({r['tokens_per_s_min']:,}..{r['tokens_per_s_max']:,}) | {r['tflops']} | {mfu} | "
        f"{r['peak_mib']:,} | {r['compiled_graphs'] or ''} | {r['compile_s'] or ''} | "
        f"{r['padding_source']:.1%} / {r['padding_target']:.1%} | "
        f"{r['gflop_per_target_token']} ({r['attention_share_of_flops']:.1%}) |"
    )
eager = {(r["model"], r["precision"]): r for r in rows if r["compile"] == "off"
         and r["pad_to_multiple"]}
for r in rows:
    e = eager.get((r["model"], r["precision"]))
    if r["compile"] != "off" and e:
        print(f"\n{r['model']} {r['precision']}: compiled / eager = "
              f"{r['tokens_per_s'] / e['tokens_per_s']:.2f}x", end="")
print()
if metrics.is_file():
    records = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    steps = [r for r in records if "tokens_per_s" in r]
    valid = [r for r in records if "val_loss" in r]
    print(f"\nrecipe: {steps[-1]['step'] if steps else 0} steps in "
          f"{steps[-1]['time_s'] if steps else 0} s")
    for r in steps:
        print(f"  step {r['step']:>6} at {r['time_s']:>7} s: {r['tokens_per_s']:>10,.0f} tok/s")
    for r in valid:
        print(f"  validation at step {r['step']}: val_loss {r['val_loss']:.3f}, "
              f"compiled_graphs {r.get('compiled_graphs')}, compile_s {r.get('compile_s')}")
text = log.read_text(errors="replace")
lines = [
    x for x in text.splitlines() if x.startswith(("batch shapes", "torch.compile: graph"))
]
if lines:
    print("\nrecipe log:\n" + "\n".join("  " + x for x in lines))
EOF
} >"$summary" 2>&1
cat "$summary"
