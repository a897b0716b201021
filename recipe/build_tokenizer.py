"""Train the shipped byte-level BPE tokenizer on the training side of the corpus (never the eval split).

    python recipe/build_tokenizer.py --corpus corpus --vocab 16384 --out runs/tokenizer.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evermind_memory.lm.tokenizer import BPETokenizer  # noqa: E402


def training_texts(corpus: Path, max_chars: int) -> list[str]:
    """Pair queries, pair docs and passages, in file order, up to max_chars characters."""
    texts: list[str] = []
    total = 0
    for name, keys in (("pairs.jsonl", ("query", "doc")), ("passages.jsonl", ("text",))):
        with open(corpus / name, encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                for key in keys:
                    texts.append(row[key])
                    total += len(row[key])
                if total >= max_chars:
                    return texts
    return texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="corpus")
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--max-chars", type=int, default=120_000_000)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    t0 = time.time()
    texts = training_texts(Path(args.corpus), args.max_chars)
    tok = BPETokenizer.train(texts, args.vocab)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    tok.save(args.out)
    sample = texts[: 20000]
    n_tok = sum(len(tok.encode(t)) for t in sample)
    n_chr = sum(len(t) for t in sample)
    print(json.dumps({"vocab": len(tok), "texts": len(texts), "chars_per_token": round(n_chr / n_tok, 3),
                      "seconds": round(time.time() - t0, 1), "digest": tok.digest()}))


if __name__ == "__main__":
    main()
