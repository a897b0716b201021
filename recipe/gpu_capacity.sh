#!/bin/bash
# Capacity by depth: the shipped model deepened to LAYERS layers (recipe/deepen.py) and its control (the shipped
# model as it is), trained side by side on one GPU with the same data, flags and step count.
#
#   bash recipe/gpu_capacity.sh DATA CALL_SECONDS STEPS LAYERS [train_embedder flags...]
#
# DATA as for recipe/gpu_train.sh. The data is prepared once (`gpu_train.sh DATA prep 1 1`), then runs `d<LAYERS>`
# and `c4` train with `--steps STEPS --compile graphs` and the flags given (e.g. `--lr 1e-3 --warmup 300 --kd-weight
# 4`, `--lexicon evermind_memory/models/lexicon.evlx`) until CALL_SECONDS after the start. A later call on the same
# warm machine resumes both. A deepened model.evlm over 15 MiB is split into model.evlm.part_* (a returned file may
# hold 16 MiB): `cat model.evlm.part_* > model.evlm`.
set -u
DATA=$1; CALL=$2; STEPS=$3; LAYERS=$4; shift 4
t0=$(date +%s)
DEEP=/tmp/deep$LAYERS.evlm
[ -f "$DEEP" ] || python3 recipe/deepen.py evermind_memory/models/model.evlm "$DEEP" --layers "$LAYERS" || exit 1
if [ ! -f /tmp/c/corpus/pairs.jsonl ] || [ ! -d /tmp/cache ]; then
  bash recipe/gpu_train.sh "$DATA" prep 1 1 --init evermind_memory/models/model.evlm > /tmp/prep.log 2>&1 || exit 1
fi
left=$(( CALL - ($(date +%s) - t0) ))
echo "data ready after $(( $(date +%s) - t0 )) s; $left s left"
FLAGS=(--steps "$STEPS" --compile graphs "$@")
bash recipe/gpu_train.sh "$DATA" "d$LAYERS" "$left" 1e9 --init "$DEEP" "${FLAGS[@]}" > "/tmp/d$LAYERS.out" 2>&1 &
sleep 60  # the first run computes the caches the second reads (with --lexicon, the lexicon vectors)
bash recipe/gpu_train.sh "$DATA" c4 "$((left - 60))" 1e9 --init evermind_memory/models/model.evlm "${FLAGS[@]}" \
  > /tmp/c4.out 2>&1 &
wait
for n in "d$LAYERS" c4; do
  echo "== $n"
  grep -E "ms/step|eval ndcg|exported|failed" "/tmp/$n.out" | tail -6
  f="${OUT:-/tmp/out}/$n/model.evlm"
  if [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt 15728640 ]; then split -b 15m "$f" "$f.part_" && rm "$f"; fi
done
