#!/bin/bash
# Two reranker runs side by side on one GPU over one data preparation (recipe/train_reranker.py), in one device call:
#
#   A="--labelled 3" B="--labelled 0" CALL=560 bash recipe/rerank_pair.sh DATA
#
# DATA holds corpus.tar.xz, teacher/ and personal_vocab.json (as for recipe/gpu_train.sh; carry it with the call).
# A and B are each run's own flags on top of the common recipe (the residual form of "The reranker on the fast
# step" in benchmarks/results/training/README.md, --eval-personal); B starts once A has prepared and cached the data.
# Both stop by CALL seconds after the start; their logs and reranker.json (and checkpoints) go to $OUT/r.
set -u
export PYTHONUNBUFFERED=1
DATA=$1
t0=$(date +%s)
mkdir -p /tmp/c "${OUT:-/tmp/out}/r"
[ -f /tmp/c/corpus/pairs.jsonl ] || tar xJf "$DATA/corpus.tar.xz" -C /tmp/c || exit 1
[ -d /tmp/teacher ] || { cp -r "$DATA/teacher" /tmp/teacher && xz -d /tmp/teacher/model.int8.safetensors.xz; } || exit 1
[ -f /tmp/cp/pairs.jsonl ] || python3 recipe/personal_corpus.py --vocab "$DATA/personal_vocab.json" --out /tmp/cp \
  --people 20000 > /tmp/cp.log || exit 1
echo "unpacked after $(( $(date +%s) - t0 )) s"
COMMON=(--corpus /tmp/c/corpus --tokenizer evermind_memory/models/tokenizer.json --teacher /tmp/teacher
  --init evermind_memory/models/model.evlm --cache /tmp/cache --extra-corpus /tmp/cp --layers 2 --batch 64
  --negatives 7 --residual-tau 0.05 --kd-weight 1 --lr 3e-4 --warmup 200 --steps "${STEPS:-12000}" --time-budget 1e9
  --eval-personal)
CALL=${CALL:-560}
# shellcheck disable=SC2086  # A and B are flag lists
python3 recipe/train_reranker.py "${COMMON[@]}" ${A:-} --wall-budget $((CALL - 25)) --out /tmp/rA > /tmp/rA.log 2>&1 &
PA=$!
while ! grep -q "step 0 eval" /tmp/rA.log 2>/dev/null; do sleep 5; kill -0 $PA 2>/dev/null || break; done
echo "A at step 0 after $(( $(date +%s) - t0 )) s"
# shellcheck disable=SC2086
python3 recipe/train_reranker.py "${COMMON[@]}" ${B:-} --wall-budget $((CALL - 25 - ($(date +%s) - t0))) \
  --out /tmp/rB > /tmp/rB.log 2>&1 &
PB=$!
wait $PA $PB
for r in A B; do
  echo "== $r"
  grep -vE '^\{"step"' /tmp/r$r.log | grep -E "labelled|questions with|eval|Error|Traceback|exported|written" | cut -c1-3000
  grep '"step"' /tmp/r$r.log | tail -1
  cp /tmp/r$r.log "${OUT:-/tmp/out}/r/r$r.log"
  cp /tmp/r$r/reranker.json "${OUT:-/tmp/out}/r/r$r.json" 2>/dev/null
  cp /tmp/r$r/reranker.evlm "${OUT:-/tmp/out}/r/r$r.evlm" 2>/dev/null
done
echo "done after $(( $(date +%s) - t0 )) s"
