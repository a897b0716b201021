#!/bin/bash
# One long training run over several consecutive device calls (the same command each call resumes it).
#
#   bash recipe/gpu_train.sh DATA NAME CALL_SECONDS TOTAL_SECONDS [train_embedder flags...]
#
# DATA holds corpus.tar.xz (recipe/pack_corpus.py), teacher/ (train_embedder.pack_teacher, its
# model.int8.safetensors optionally xz-compressed) and optionally personal_vocab.json (recipe/personal_corpus.py
# --dump-vocab): the personal corpus is then generated here from it and added with --extra-corpus. The first call unpacks them under /tmp, tokenises, computes the
# teacher vectors (cached in /tmp/cache: a later call on the same warm machine reuses them) and plans the step count
# so that TOTAL_SECONDS of training fit over all calls (--total-budget: one cosine schedule). Every call trains for
# until CALL_SECONDS after its start (data preparation included), saves its state in /tmp/st_NAME and exports the model so far (model.evlm, golden vectors,
# train log) to $OUT/NAME: if the machine goes back before the last call, the last export is the run's result.
# To continue on another machine, put the exported model.evlm in place of the shipped model and start a new run
# with --init (the optimiser moments start again; the log records it).
set -u
export PYTHONUNBUFFERED=1
DATA=$1; NAME=$2; CALL=$3; TOTAL=$4; shift 4
OUTD=${OUT:-/tmp/out}/$NAME
mkdir -p /tmp/c "$OUTD"
t0=$(date +%s)
if [ ! -f /tmp/c/corpus/pairs.jsonl ]; then
  tar xJf "$DATA/corpus.tar.xz" -C /tmp/c || exit 1
fi
TEACHER=/tmp/teacher
if [ ! -d $TEACHER ]; then
  cp -r "$DATA/teacher" $TEACHER && { [ ! -f $TEACHER/model.int8.safetensors.xz ] || xz -d $TEACHER/model.int8.safetensors.xz; } || exit 1
fi
EXTRA=()
if [ -f "$DATA/personal_vocab.json" ]; then  # the personal corpus, regenerated from its values (no WordNet here)
  [ -f /tmp/cp/pairs.jsonl ] || python3 recipe/personal_corpus.py --vocab "$DATA/personal_vocab.json" --out /tmp/cp \
    --people "${PERSONAL_PEOPLE:-40000}" > /tmp/cp.log || exit 1
  EXTRA=(--extra-corpus /tmp/cp --extra-passages "${PERSONAL_PASSAGES:-80000}")
fi
echo "data ready after $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
python3 recipe/train_embedder.py --corpus /tmp/c/corpus --tokenizer evermind_memory/models/tokenizer.json \
  --teacher $TEACHER --cache /tmp/cache --state /tmp/st_$NAME --out /tmp/runs/$NAME \
  --total-budget "$TOTAL" --wall-budget "$CALL" --time-budget 1e9 --export-at-budget "${EXTRA[@]}" "$@" 2>&1 | tee -a /tmp/runs_$NAME.log
cp /tmp/runs_$NAME.log "$OUTD/train.log"
cp /tmp/runs/$NAME/model.evlm /tmp/runs/$NAME/golden_embeddings.json /tmp/runs/$NAME/train_log.json "$OUTD/" 2>/dev/null
echo "call done after $(( $(date +%s) - t0 )) s"
ls -la "$OUTD"
