"""Extend a lexicon with the everyday words its training corpus never showed it, from a dictionary word list.

    python recipe/extend_lexicon.py --lexicon evermind_memory/models/lexicon.evlx \
        --words /usr/share/dict/american-english-large --min-zipf 2.0 --out lexicon_plus.evlx [--teacher DIR]

The shipped lexicon holds the 60,000 most frequent words of the training text: manuals, API references, dictionary
glosses and the generated personal corpus, whose generator leaves out every value of the personal dev sets. So
words that people write about each other every day ("pharmacist", "migraines", "walnuts", "inhaler", "mornings")
are missing, and a text of them has no lexicon vector beyond its function words. This adds them:

1. Candidates: the words of a dictionary list (SCOWL's `wamerican-large`, Debian package, one word a line) written
   in lower case there, so that proper nouns ("Ingrid", "Volvo"), which the list capitalises, stay out: a name in
   every fact of one person's scope would pull that scope's shortest facts up (benchmarks/results/lexicon_mix.txt,
   "hashed unknown words"). Only TABLE_WORD words the table lacks, at or above --min-zipf in PyPI `wordfreq`'s
   English frequencies (Zipf scale: 2.0 is about once in ten million words), which also orders them.
2. Each new word's vector: the teacher's vector of the word alone, mapped into the table's space by the affine
   map that best takes the teacher's vectors of the table's own words to their rows (least squares over every
   row, so the map carries the table's projection and the average effect of its tuning on text).
3. Each new row is int8 with its own scale (build_lexicon.quantise); its weight is sif / (sif + p) with
   p the word's wordfreq frequency times the median ratio of corpus to wordfreq frequency over the table's words
   (their corpus frequency is recovered from their weights).

The table's existing rows, words and weights are kept as they are; new words go after them. Reads no dev set, no
manual page and no benchmark: the list and the frequencies are general English. About three minutes on two cores.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "recipe"))

from build_lexicon import MAX_WORD_CHARS, load_teacher, quantise  # noqa: E402

from evermind_memory.lm.lexicon import TABLE_WORD, Lexicon  # noqa: E402

TABLE_WORD_RE = re.compile(TABLE_WORD)


def candidates(word_list: Path, known: set[str], min_zipf: float) -> list[tuple[str, float]]:
    """(word, frequency) of the list's lower-case table words that `known` lacks, most frequent first."""
    import wordfreq

    seen: dict[str, float] = {}
    with open(word_list, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            w = line.strip()
            if w in known or w in seen or len(w) > MAX_WORD_CHARS or TABLE_WORD_RE.fullmatch(w) is None:
                continue
            if wordfreq.zipf_frequency(w, "en") >= min_zipf:
                seen[w] = wordfreq.word_frequency(w, "en")
    return sorted(seen.items(), key=lambda kv: (-kv[1], kv[0]))


def affine_map(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """(S + 1, D) float64 A minimising |[source, 1] A - target|^2 (the last row is the bias)."""
    x = np.concatenate([source.astype(np.float64), np.ones((len(source), 1))], axis=1)  # (V, S + 1)
    a, *_ = np.linalg.lstsq(x, target.astype(np.float64), rcond=None)
    return a


def extend(lexicon: Lexicon, new: list[tuple[str, float]], teacher, sif: float = 1e-3) -> Lexicon:
    """The lexicon with a row for each (word, wordfreq frequency) of `new` after its own rows."""
    import wordfreq

    if not new:
        return lexicon
    words = list(lexicon.words)
    encode = lambda ws: np.asarray(teacher.encode(ws, batch_size=512, convert_to_numpy=True,  # noqa: E731
                                                  show_progress_bar=True), dtype=np.float32)
    rows = lexicon.table.astype(np.float32) * lexicon.scale[:, None]  # (V, D) the table's vectors
    mapping = affine_map(encode(words), rows)  # (T + 1, D)
    fresh = encode([w for w, _ in new])  # (N, T)
    mapped = (np.concatenate([fresh, np.ones((len(fresh), 1), np.float32)], axis=1) @ mapping).astype(np.float32)
    table, scale = quantise(mapped)
    # p_corpus = sif (1 / weight - 1); its median ratio to wordfreq's frequency over words both know.
    corpus_p = sif * (1.0 / np.maximum(lexicon.weight.astype(np.float64), 1e-9) - 1.0)
    general_p = np.array([wordfreq.word_frequency(w, "en") for w in words])
    both = (corpus_p > 0) & (general_p > 0)
    ratio = float(np.median(corpus_p[both] / general_p[both])) if both.any() else 1.0
    weight = (sif / (sif + ratio * np.array([f for _, f in new]))).astype(np.float32)
    return Lexicon(words + [w for w, _ in new], np.concatenate([lexicon.table, table]),
                   np.concatenate([lexicon.scale, scale]), np.concatenate([lexicon.weight, weight]))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lexicon", type=Path, required=True, help="the lexicon to extend")
    ap.add_argument("--words", type=Path, required=True, help="dictionary word list, one word a line")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--min-zipf", type=float, default=2.0, help="wordfreq Zipf frequency a new word needs")
    ap.add_argument("--max-new", type=int, default=0, help="keep at most this many new words (0: all)")
    ap.add_argument("--teacher", default=None, help="sentence-transformers model directory (default: MiniLM)")
    ap.add_argument("--sif", type=float, default=1e-3, help="a of the weight a / (a + p(word)), as the table's")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    lexicon = Lexicon.load(args.lexicon)
    new = candidates(args.words, set(lexicon.words), args.min_zipf)
    if args.max_new:
        new = new[: args.max_new]
    print(f"{lexicon!r}: {len(new)} new words at Zipf >= {args.min_zipf} from {args.words}", flush=True)
    out = extend(lexicon, new, load_teacher(args.teacher), args.sif)
    out.save(args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes): {out!r} in {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main()
