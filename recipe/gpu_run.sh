#!/bin/bash
# One GPU call: unpack the corpus, train the width variants side by side on the one GPU (the first run
# computes the shared token and teacher caches; the others start once they exist), pack what comes back.
# (tracked copy of .carry/run.sh; copy it there or into runs/<name>/ beside the corpus, teacher and tokenizer)
# usage: bash .carry/run.sh TIME_BUDGET "NAME:FLAGS" ["NAME:FLAGS" ...]
set -u
export PYTHONUNBUFFERED=1
C=$(cd "$(dirname "$0")" && pwd)
TB=$1; shift
OUTD=${OUT:-/tmp/out}
mkdir -p /tmp/c /tmp/runs "$OUTD"
t0=$(date +%s)
tar xJf "$C/corpus.tar.xz" -C /tmp/c || exit 1
nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv | tee "$OUTD/gpu.txt"
cd "${CODE:-$C/..}" || exit 1   # the working tree that travelled (CODE=$C/code for an older copy)
common="--corpus /tmp/c/corpus --tokenizer $C/tokenizer.json --teacher $C/teacher --cache /tmp/cache --fit-budget --export-at-budget --eval-every 100000 --time-budget $TB ${EXTRA:-}"
pids=()
first=1
for spec in "$@"; do
  name=${spec%%:*}; flags=${spec#*:}
  python3 recipe/train_embedder.py $common --state /tmp/st_$name --out /tmp/runs/$name $flags > /tmp/runs/$name.log 2>&1 &
  pids+=($!)
  if [ $first = 1 ]; then
    first=0
    until grep -q "teacher ndcg" /tmp/runs/$name.log 2>/dev/null; do sleep 2; kill -0 ${pids[0]} 2>/dev/null || break; done
    echo "caches ready after $(( $(date +%s) - t0 )) s"
  fi
done
( while kill -0 ${pids[0]} 2>/dev/null; do nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader >> /tmp/runs/gpu_util.txt; sleep 15; done ) &
for p in "${pids[@]}"; do wait $p; done
echo "all runs done after $(( $(date +%s) - t0 )) s"
cd /tmp/runs
for spec in "$@"; do
  name=${spec%%:*}
  [ -f $name/model.evlm ] && split -b 15m -d $name/model.evlm $name.evlm.part && rm $name/model.evlm $name/tokenizer.json
done
tar czf "$OUTD/logs.tgz" *.log gpu_util.txt */golden_embeddings.json */train_log.json 2>/dev/null
mv *.evlm.part* "$OUTD"/ 2>/dev/null
ls -la "$OUTD"
tail -n 4 /tmp/runs/*.log
