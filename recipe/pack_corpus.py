"""Pack the corpus for the GPU machine: pairs and passages minus everything a dev or eval set holds.

    python recipe/pack_corpus.py --corpus /work/corpus --exclude /work/data/dev/exclude.jsonl \
        --drop-sources statsmodels --drop-passages debian,wordnet,foldoc,jargon,stdlib --out .carry/corpus.tar.xz

--exclude: JSONL rows {"query", "doc"}; a pair whose query or doc, or a passage whose text, is one of those
texts is dropped. --drop-sources: every pair and passage whose source name starts with one of these is dropped
(a dev source must be left out whole, not only its dev pages). --drop-passages: passages of these sources are
dropped only to save space (they repeat their pair docs). eval/ travels as it is (the training log's ndcg).
Prints what was dropped; writes <out> and <out>.json (the counts).

--add-corpus DIR --add-prefix broad- (repeatable, in pairs): also pack the pairs and passages of DIR whose source starts
with the prefix (a corpus built with `build_corpus.py --sources ...,broad`), after the same exclusions and a leak check:
an added text that covers 30% or more of the word 8-grams of any eval doc of --corpus or any doc of --leak-docs
(the dev sets' *.jsonl / *.docs.jsonl) is dropped. --add-passages N keeps N of the added passages, shared evenly
across their sources (seeded). --merge-pair-prefix P relabels every pair source "P<name>-<kind>" as "P<kind>"
so the trainer's sampler (weights by the square root of each pair source's size) sees one source, not dozens.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import tarfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_corpus import _LeakIndex, _water_fill  # noqa: E402


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
    ap.add_argument("--add-corpus", type=Path, action="append", default=[],
                    help="repeatable; the n-th --add-prefix and --add-passages go with the n-th corpus")
    ap.add_argument("--add-prefix", action="append", default=[], help="default broad-")
    ap.add_argument("--add-passages", type=int, action="append", default=[],
                    help="keep this many added passages (0 or unset: all)")
    ap.add_argument("--leak-docs", type=Path, action="append", default=[],
                    help="JSONL files whose 'doc' texts added rows must not contain")
    ap.add_argument("--merge-pair-prefix", default="")
    ap.add_argument("--seed", type=int, default=0)
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
    added = []
    for i, corpus in enumerate(args.add_corpus):
        prefix = args.add_prefix[i] if i < len(args.add_prefix) else "broad-"
        keep = args.add_passages[i] if i < len(args.add_passages) else 0
        kept_pairs, kept_passages, summary = add_corpus(args, corpus, prefix, keep, held, kept_pairs,
                                                        kept_passages, counts)
        added.append(summary)
    if args.merge_pair_prefix:
        pre = args.merge_pair_prefix
        for p in kept_pairs:
            if p["source"].startswith(pre):
                p["source"] = pre + p["source"].rsplit("-", 1)[-1]
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
               "pairs_by_source": dict(Counter(p["source"] for p in kept_pairs)), "added": added}
    args.out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary["counts"], indent=1))


def add_corpus(args, corpus: Path, pre: str, keep: int, held: set, pairs: list[dict], passages: list[dict],
               counts: Counter):
    """One --add-corpus's rows of its prefix's sources, excluded and leak-checked as the docstring says."""
    new_pairs = [p for p in read_jsonl(corpus / "pairs.jsonl") if p["source"].startswith(pre)]
    new_passages = [p for p in read_jsonl(corpus / "passages.jsonl") if p["source"].startswith(pre)]
    eval_docs = [r["doc"] for path in sorted((args.corpus / "eval").glob("*.jsonl")) for r in read_jsonl(path)]
    dev_docs = [r["doc"] for path in args.leak_docs for r in read_jsonl(path)]
    leak = _LeakIndex(sorted(set(eval_docs + dev_docs)), background=[p["doc"] for p in pairs + new_pairs])
    out_pairs = []
    for p in new_pairs:
        if p["query"] in held or p["doc"] in held:
            counts["added pairs: in a dev/eval set"] += 1
        elif leak.leaks(p["doc"]):
            counts["added pairs: leak an eval/dev doc"] += 1
        else:
            out_pairs.append(p)
    by_source: dict[str, list[dict]] = {}
    for p in new_passages:
        if p["text"] in held:
            counts["added passages: in a dev/eval set"] += 1
        elif leak.leaks(p["text"]):
            counts["added passages: leak an eval/dev doc"] += 1
        else:
            by_source.setdefault(p["source"], []).append(p)
    available = sum(len(v) for v in by_source.values())
    want = min(keep or available, available)
    quota = _water_fill({s: len(v) for s, v in by_source.items()}, want)
    out_passages = []
    for source in sorted(by_source):
        rows = sorted(by_source[source], key=lambda r: hashlib.sha1(f"{args.seed}:{r['text']}".encode()).hexdigest())
        out_passages.extend(rows[: quota[source]])
    counts["added pairs"] += len(out_pairs)
    counts["added passages"] += len(out_passages)
    counts["added passages: left out by --add-passages"] += available - len(out_passages)
    summary = {"corpus": str(corpus), "prefix": pre, "leak_docs": [str(p) for p in args.leak_docs],
               "pairs_by_source": dict(Counter(p["source"] for p in out_pairs)),
               "passages_by_source": dict(Counter(p["source"] for p in out_passages)),
               "passages_available_by_source": {s: len(v) for s, v in sorted(by_source.items())}}
    return pairs + out_pairs, passages + out_passages, summary


if __name__ == "__main__":
    main()
