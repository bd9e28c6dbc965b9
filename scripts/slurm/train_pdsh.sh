#!/bin/bash
# Train on several machines without a scheduler: one torchrun agent per host, started over pdsh
# (or ssh where pdsh is absent), meeting at a c10d rendezvous on the first host. Run it from the
# project directory, which every host must see at the same path (shared storage):
#
#   HOSTS=gpu1,gpu2 GPUS_PER_NODE=8 scripts/slurm/train_pdsh.sh \
#       configs/wmt14_en_de_base.yaml /shared/runs/wmt14 [--set KEY=VALUE ...]
#
# RUN_DIR and the data cache (CACHE_DIR, default: RUN_DIR/../cache) must be on that shared
# storage too. The data is prepared once, here, before the launch. Environment: HOSTS (comma
# separated; the first hosts the rendezvous), GPUS_PER_NODE (default 1), PY (default
# .venv/bin/python), CACHE_DIR, RDZV_PORT (default 29500), MAX_RESTARTS (default 3).

set -euo pipefail

usage="usage: HOSTS=h1,h2 [GPUS_PER_NODE=G] $0 CONFIG RUN_DIR [--set KEY=VALUE ...]"
CONFIG=${1:?$usage}
RUN_DIR=${2:?$usage}
shift 2
HOSTS=${HOSTS:?$usage}

PY=${PY:-.venv/bin/python}
CACHE_DIR=${CACHE_DIR:-$(dirname "$RUN_DIR")/cache}
RDZV_PORT=${RDZV_PORT:-29500}
MAX_RESTARTS=${MAX_RESTARTS:-3}
GPUS_PER_NODE=${GPUS_PER_NODE:-1}
IFS=, read -r -a hosts <<<"$HOSTS"
HEAD=${hosts[0]}

echo "${#hosts[@]} node(s) x $GPUS_PER_NODE GPU(s), rendezvous $HEAD:$RDZV_PORT, run $RUN_DIR"
"$PY" -m transformer_mt prepare --config "$CONFIG" --set "data.cache_dir=$CACHE_DIR" "$@"

# The same command on every host, quoted for the remote shell.
launch=(
    "$PY" -m transformer_mt.training.distributed
    --nnodes "${#hosts[@]}" --nproc-per-node "$GPUS_PER_NODE"
    --rdzv-backend c10d --rdzv-endpoint "$HEAD:$RDZV_PORT" --rdzv-id "mt-$$-$(date +%s)"
    --max-restarts "$MAX_RESTARTS"
    -m transformer_mt train --config "$CONFIG" --run-dir "$RUN_DIR" --no-progress
    --set "data.cache_dir=$CACHE_DIR" "$@"
)
remote="cd $(printf %q "$PWD") && $(printf '%q ' "${launch[@]}")"

if command -v pdsh >/dev/null 2>&1; then
    # -S: exit with the largest of the remote commands' exit codes.
    exec pdsh -S -w "$HOSTS" "$remote"
fi
pids=()
for host in "${hosts[@]}"; do
    # shellcheck disable=SC2029  # expanded here on purpose: $remote is quoted for the far side
    ssh "$host" "$remote" 2>&1 | sed "s/^/$host: /" &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
    wait "$pid" || status=$?
done
exit "$status"
