"""Pack the corpus for the GPU machine: pairs and passages minus everything a dev or eval set holds.

    python recipe/pack_corpus.py --corpus /work/corpus --exclude /work/data/dev/exclude.jsonl \
        --drop-sources statsmodels --drop-passages debian,wordnet,foldoc,jargon,stdlib --out .carry/corpus.tar.xz

--exclude: JSONL rows {"query", "doc"}; a pair whose query or doc, or a passage whose text, is one of those
texts is dropped. --drop-sources: every pair and passage whose source name starts with one of these is dropped
(a dev source must be left out whole, not only its dev pages). --drop-passages: passages of these sources are
dropped only to save space (they repeat their pair docs). eval/ travels as it is (the training log's ndcg).
Prints what was dropped; writes <out> and <out>.json (the counts).
"""

from __future__ import annotations

import argparse
import io
import json
import tarfile
from collections import Counter
from pathlib import Path


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--exclude", type=Path, action="append", default=[])
    ap.add_argument("--drop-sources", default="")
    ap.add_argument("--drop-passages", default="")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    held = {t for path in args.exclude for row in read_jsonl(path) for t in (row["query"], row["doc"])}
    drop = tuple(s for s in args.drop_sources.split(",") if s)
    drop_pass = tuple(s for s in args.drop_passages.split(",") if s)
    pairs = read_jsonl(args.corpus / "pairs.jsonl")
    passages = read_jsonl(args.corpus / "passages.jsonl")
    counts: Counter = Counter()
    kept_pairs = []
    for p in pairs:
        if drop and p["source"].startswith(drop):
            counts["pairs: dropped source"] += 1
        elif p["query"] in held or p["doc"] in held:
            counts["pairs: in a dev/eval set"] += 1
        else:
            kept_pairs.append(p)
    kept_passages = []
    for p in passages:
        if drop and p["source"].startswith(drop):
            counts["passages: dropped source"] += 1
        elif p["text"] in held:
            counts["passages: in a dev/eval set"] += 1
        elif drop_pass and p["source"].startswith(drop_pass):
            counts["passages: repeat pair docs (space)"] += 1
        else:
            kept_passages.append(p)
    counts["pairs kept"], counts["passages kept"] = len(kept_pairs), len(kept_passages)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(args.out, "w:xz", preset=9) as tar:
        def add(name: str, rows: list[dict]) -> None:
            data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
            info = tarfile.TarInfo(f"corpus/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        add("pairs.jsonl", kept_pairs)
        add("passages.jsonl", kept_passages)
        for path in sorted((args.corpus / "eval").glob("*.jsonl")):
            add(f"eval/{path.name}", read_jsonl(path))
    summary = {"counts": dict(counts), "exclude": [str(p) for p in args.exclude], "drop_sources": drop,
               "drop_passages": drop_pass, "excluded_texts": len(held),
               "pairs_by_source": dict(Counter(p["source"] for p in kept_pairs))}
    args.out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary["counts"], indent=1))


if __name__ == "__main__":
    main()
