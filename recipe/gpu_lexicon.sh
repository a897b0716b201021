#!/bin/bash
# The shipped lexicon on one GPU machine (evermind_memory/lm/lexicon.py; recipe/build_lexicon.py), about 4 minutes:
#
#   bash recipe/gpu_lexicon.sh CORPUS_TAR TEACHER_DIR PERSONAL_VOCAB [build_lexicon flags...]
#
# CORPUS_TAR: a corpus pack (recipe/pack_corpus.py, or one with its pairs.jsonl and an empty passages.jsonl, which is
# what the shipped lexicon read, so that the call's files stay under the 64 MiB a call carries); TEACHER_DIR: the
# int8-packed teacher of training (train_embedder.pack_teacher, model.int8.safetensors optionally xz-compressed);
# PERSONAL_VOCAB: recipe/personal_corpus.py --dump-vocab. Writes $OUT/lexicon.evlx.
set -u
export PYTHONUNBUFFERED=1
TAR=$1; TEACH=$2; VOCAB=$3; shift 3
t0=$(date +%s)
mkdir -p /tmp/c "${OUT:-/tmp/out}"
[ -f /tmp/c/corpus/pairs.jsonl ] || tar xJf "$TAR" -C /tmp/c || exit 1
[ -d /tmp/teacher ] || { cp -r "$TEACH" /tmp/teacher && { [ ! -f /tmp/teacher/model.int8.safetensors.xz ] \
  || xz -d /tmp/teacher/model.int8.safetensors.xz; }; } || exit 1
[ -f /tmp/cp/pairs.jsonl ] || python3 recipe/personal_corpus.py --vocab "$VOCAB" --out /tmp/cp --people 40000 \
  > /tmp/cp.log || exit 1
T=$(python3 -c "import sys; sys.path.insert(0, 'recipe'); from train_embedder import unpack_teacher; \
print(unpack_teacher('/tmp/teacher'))" 2>/dev/null | tail -1)
echo "data ready after $(( $(date +%s) - t0 )) s"
python3 recipe/build_lexicon.py --corpus /tmp/c/corpus --corpus /tmp/cp --words 60000 --teacher "$T" --device cuda \
  --tune-texts 300000 --tune-epochs 3 --tune-lr 1e-3 --out "${OUT:-/tmp/out}/lexicon.evlx" "$@" 2>&1 | grep -v Batches
echo "done after $(( $(date +%s) - t0 )) s"
