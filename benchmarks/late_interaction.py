"""Late interaction without training (issue 36): rerank the shipped embedder's top 30 by cosine + w x MaxSim over its
own token states, on the left-out manual sources, the personal-memory protocol and the paraphrase probe.

A token's state is the pooling block's per-token output (attention over the text plus the residual: what the model
averages into the text's vector), normalised; MaxSim is ColBERT's: for each query token the best cosine with any
token of the candidate, averaged over the query's tokens. Nothing is fitted: the table shows every weight, so the
reader sees whether one weight helps everywhere (it does not need choosing on the data it is shown on to be read).

- manual: the first 120 questions of each dev source (recipe/build_devsets.py, --dev-dir), among their gold docs
  and the source's other docs up to 600: ndcg@10 of the embedder's ranking with its top 30 reranked;
- personal: benchmarks/personal_data.py's answerable questions, scoped (the user's facts) and store-wide (all
  facts): right first;
- probe: tests/data/paraphrase_probe.jsonl, 50 questions among their 50 facts: right first.

Vector ranking only (the store's hybrid already holds the lexical evidence this partly duplicates).

--tokens lexicon ranks by the shipped vector instead (the model's part joined with the lexicon's, as the store
embeds) and takes the lexicon's word vectors as the tokens (each known word's row, unit length; a query word's best
cosine counts by the word's lexicon weight, the frequency weight that sums rows into a text's lexicon vector):
MaxSim then asks, for each word of the question, how close the memory's nearest word is ("migraines" and "headache"),
which the summed lexicon vector blurs.

    python benchmarks/late_interaction.py [--dev-dir DIR] [--sources apache,gimp,...] [--tokens model|lexicon]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np  # noqa: E402

WEIGHTS = (0.0, 0.2, 0.4, 0.7, 1.0, 1.5)
POOL = 30


class TokenStates:
    """The shipped model's text vector and normalised per-token states of a text (the numpy forward)."""

    def __init__(self) -> None:
        from evermind_memory.lm import inference
        from evermind_memory.lm.model import load_model
        from evermind_memory.lm.tokenizer import BPETokenizer

        models = ROOT / "evermind_memory" / "models"
        cfg, params = load_model(models / "model.evlm")
        self.tok = BPETokenizer.load(models / "tokenizer.json")
        self.inf = inference
        self.plan = inference.build_plan(cfg, {k: np.asarray(v, np.float32) for k, v in params.items()}, fused=True)

    def __call__(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """(the text's unit vector (C,), its unit token states (T, C))."""
        inf, pp = self.inf, self.plan.pool
        ids = np.array(self.tok.encode(text)[:128] or [self.tok.bos_id])[None, :]  # (1, T)
        h = inf._plan_hidden(self.plan, ids)  # (T, C)
        t, c = h.shape
        n, d = pp.heads, c // pp.heads
        qkv = (h * inf._rms_scale(h)[:, None]) @ pp.wqkv  # (T, 3C)
        q, k, v = np.ascontiguousarray(qkv.reshape(1, t, 3, n, d).transpose(2, 0, 3, 1, 4))  # (1, N, T, D) each
        s = q @ k.transpose(0, 1, 3, 2)  # (1, N, T, T)
        s -= s.max(-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(-1, keepdims=True)
        z = (s @ v).transpose(0, 2, 1, 3).reshape(t, c) @ pp.wo + h  # (T, C)
        pooled = (z * inf._rms_scale(z)[:, None]).mean(0) * pp.out_gain  # (C,) as the model pools it
        return pooled / np.linalg.norm(pooled), z / np.linalg.norm(z, axis=1, keepdims=True)


class LexiconStates:
    """The shipped embedder's vector of a text (model and lexicon joined) and its known words' unit lexicon rows; as
    a query (`query`), each row is scaled by the word's weight over the text's mean weight, so the mean over the
    query's rows in `rerank` is the weighted mean of its words' best cosines."""

    def __init__(self) -> None:
        from evermind_memory import default_embedder

        self.embedder = default_embedder()
        self.lex = self.embedder.lexicon

    def __call__(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        from evermind_memory.store.rerank import unit_rows

        vec = self.embedder.embed_many([text])[0]  # (C + D,)
        ids = self.lex.word_ids(text)
        if not ids:
            return vec, np.zeros((1, self.lex.dims), dtype=np.float32)  # (1, D): MaxSim 0
        return vec, unit_rows(self.lex, ids)  # (T, D)

    def query(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        vec, rows = self(text)
        ids = self.lex.word_ids(text)
        if not ids:
            return vec, rows
        w = self.lex.weight[ids]  # (T,)
        return vec, rows * (w / max(float(w.mean()), 1e-12))[:, None]  # (T, D)


def rerank(states: TokenStates, query: str, cand_vecs: np.ndarray, cand_toks: list[np.ndarray]) -> dict[float, int]:
    """For each weight, the candidates (indices into cand_vecs) in reranked order: {w: order (P,)}."""
    qv, qt = states.query(query) if hasattr(states, "query") else states(query)
    cos = cand_vecs @ qv  # (N,)
    top = np.argsort(-cos, kind="stable")[:POOL]  # (P,)
    maxsim = np.array([(qt @ cand_toks[j].T).max(1).mean() for j in top.tolist()])  # (P,)
    return {w: top[np.argsort(-(cos[top] + w * maxsim), kind="stable")] for w in WEIGHTS}


def manual(states: TokenStates, dev: Path, source: str) -> dict[float, float]:
    rows = [json.loads(line) for line in open(dev / f"{source}.jsonl")][:120]
    extra = [json.loads(line)["doc"] for line in open(dev / f"{source}.docs.jsonl")]
    docs = list(dict.fromkeys([r["doc"] for r in rows] + extra))[:600]
    encoded = [states(d) for d in docs]
    vecs = np.stack([v for v, _ in encoded])  # (D, C)
    gains = {w: [] for w in WEIGHTS}
    for r in rows:
        gold = docs.index(r["doc"])
        for w, order in rerank(states, r["query"], vecs, [t for _, t in encoded]).items():
            hit = np.flatnonzero(order[:10] == gold)
            gains[w].append(1 / np.log2(hit[0] + 2) if len(hit) else 0.0)
    return {w: float(np.mean(g)) for w, g in gains.items()}


def right_first(states: TokenStates, asks: list[tuple[str, list[int], int]], texts: list[str]) -> dict[float, int]:
    """asks: (question, candidate indices, the right one)."""
    encoded = [states(t) for t in texts]
    vecs = np.stack([v for v, _ in encoded])
    out = {w: 0 for w in WEIGHTS}
    for question, cand, right in asks:
        cand_a = np.array(cand)
        orders = rerank(states, question, vecs[cand_a], [encoded[i][1] for i in cand])
        for w, order in orders.items():
            out[w] += int(cand_a[order[0]] == right)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dev-dir", type=Path, default=ROOT / "data" / "dev")
    ap.add_argument("--sources", default="apache,gimp,libreoffice,lilypond,maxima,nodejs,octave,rust,statsmodels")
    ap.add_argument("--tokens", choices=("model", "lexicon"), default="model",
                    help="model: the shipped model's vector and token states; lexicon: the shipped vector and the "
                         "lexicon's word vectors")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    import personal_data

    states = TokenStates() if args.tokens == "model" else LexiconStates()
    rows: dict[str, dict] = {}
    for source in args.sources.split(","):
        rows[f"manual {source} (ndcg@10)"] = manual(states, args.dev_dir, source)
        print(source, rows[f"manual {source} (ndcg@10)"], flush=True)
    ps = personal_data.personal_set()
    texts = [f.text for f in ps.facts]
    answerable = [q for q in ps.questions if q.fact is not None]
    for scoped in (True, False):
        asks = [(q.text, [i for i, f in enumerate(ps.facts) if not scoped or f.user == q.user], q.fact)
                for q in answerable]
        rows[f"personal {'scoped' if scoped else 'store-wide'} (right first of {len(asks)})"] = right_first(
            states, asks, texts)
    probe = [json.loads(line) for line in open(ROOT / "tests" / "data" / "paraphrase_probe.jsonl")]
    facts = list(dict.fromkeys(r["fact"] for r in probe))
    rows[f"paraphrase probe (right first of {len(probe)})"] = right_first(
        states, [(r["question"], list(range(len(facts))), facts.index(r["fact"])) for r in probe], facts)
    print(f"\n| set | {' | '.join(f'w={w}' for w in WEIGHTS)} |")
    print(f"|---|{'---|' * len(WEIGHTS)}")
    for name, by_w in rows.items():
        print(f"| {name} | " + " | ".join(f"{by_w[w]:.4f}" if isinstance(by_w[w], float) else str(by_w[w])
                                          for w in WEIGHTS) + " |")
    manual_rows = [r for n, r in rows.items() if n.startswith("manual")]
    if manual_rows:
        print("| manual mean | " + " | ".join(f"{np.mean([r[w] for r in manual_rows]):.4f}" for w in WEIGHTS) + " |")
    if args.json:
        args.json.write_text(json.dumps({n: {str(w): v for w, v in r.items()} for n, r in rows.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
