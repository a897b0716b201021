"""The paraphrase probe: how often recall puts the right fact first for questions that share almost no word with it.

tests/data/paraphrase_probe.jsonl holds 50 hand-written {"question", "fact"} pairs ("when does Ada travel to
Portugal?" -> "Ada's flight to Lisbon leaves Tuesday morning."): twelve people with four facts each, so a name alone
does not find the fact, plus two facts about no one. All 50 facts go into one store; each question is recalled in
every mode. Nothing is fitted on this set. The issue's target: the right fact first in hybrid for >= 40 of 50.

    python benchmarks/paraphrase_probe.py [--model M.evlm --tokenizer T.json | --model minilm]
        [--fusion fusion.json] [--json out.json]

--model minilm (with --fusion benchmarks/results/fusion_minilm.json, its fitted rule) shows what the same fusion
does with all-MiniLM-L6-v2's vectors: a reference for the embedder, not a shipped configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Sequence

if __name__ == "__main__":
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "2")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from evermind_memory import MemoryStore  # noqa: E402
from recall_quality import load_embedder  # noqa: E402

PROBE = REPO / "tests" / "data" / "paraphrase_probe.jsonl"
MODES = (("hybrid", "score"), ("hybrid", "rrf"), ("vector", "score"), ("lexical", "score"))
# with an embedder that has a lexicon (the shipped one), hybrid with the second stage too (store/rerank.py: what
# recall does by default for short facts like these; the other rows pass rerank=False)
RERANK = ("hybrid", "score", True)


def run_probe(embedder: object, pairs: Sequence[dict]) -> dict:
    """{mode: {"first": count, "top3": count, "ranks": per question 1-based rank (0: not in the top 10)}}."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="probe_") as tmp, MemoryStore(Path(tmp) / "p.db", embedder) as store:
        ids = store.remember_many([p["fact"] for p in pairs])
        runs = [(mode, fusion, False) for mode, fusion in MODES]
        if getattr(embedder, "lexicon", None) is not None:
            runs.append(RERANK)
        for mode, fusion, rerank in runs:
            ranks = []
            for i, p in enumerate(pairs):
                hits = [h.id for h in store.recall(p["question"], k=10, mode=mode, fusion=fusion, rerank=rerank)]
                ranks.append(hits.index(ids[i]) + 1 if ids[i] in hits else 0)
            name = "hybrid rerank" if rerank else mode if mode != "hybrid" else f"hybrid {fusion}"
            out[name] = {"first": sum(r == 1 for r in ranks), "top3": sum(1 <= r <= 3 for r in ranks), "ranks": ranks}
        out["info"] = {"fingerprint": store.fingerprint, "facts": len(ids)}
    return out


def main(argv: Sequence[str] | None = None) -> dict:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="an .evlm checkpoint, 'minilm', or nothing for the shipped model")
    ap.add_argument("--tokenizer", default=None, help="its tokenizer.json")
    ap.add_argument("--fusion", default=None, help="fitted fusion parameters for that embedder (calibrate_fusion.py)")
    ap.add_argument("--json", default=None, help="write the result here")
    args = ap.parse_args(argv)
    embedder = load_embedder(args.model, args.tokenizer)
    if args.fusion:
        embedder.fusion_params = args.fusion
    pairs = [json.loads(line) for line in PROBE.read_text(encoding="utf-8").splitlines() if line.strip()]
    out = run_probe(embedder, pairs)
    print(f"paraphrase probe, {len(pairs)} pairs, {out['info']['fingerprint']}")
    print(f"  {'mode':<14}{'first':>7}{'top 3':>7}")
    for name, res in out.items():
        if name != "info":
            print(f"  {name:<14}{res['first']:>7}{res['top3']:>7}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return out


if __name__ == "__main__":
    main()
