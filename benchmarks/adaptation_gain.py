"""Does one adaptation round help on an unseen domain without hurting general recall, and how long does it take?

Domains are Texinfo HTML manuals from Debian packages that recipe/build_corpus.py never reads (no man pages):
`--domain octave` (the GNU Octave manual, octave-doc: the reported result, never tuned on) and `--domain maxima`
(the Maxima manual, maxima-doc: the development domain the AdaptationPolicy defaults were tuned on). Pairs are
(definition line -> the description under it) and (page title -> the page's opening prose); the store also holds
other passages of the manual as distractors, up to --memories. Only the descriptions and passages are stored.
The queries are split: the evaluation half is never seen by any round; the usage half is what an agent asks
before the second round. We measure vector ndcg@10 of the evaluation queries through `store.recall` before and
after each of two `store.adapt_now()` rounds from the same base model: "memories only" (the stored texts) and
"with feedback" (after the agent recalled each usage query in hybrid mode and called `store.feedback(query, id)`
for the right fact when it was in its top 10), ndcg@10 on a general probe set (corpus/eval/debian.jsonl, exact
search) with the same models, and each round's time split into training, gate, re-embed, index and swap.

    python benchmarks/adaptation_gain.py --domain maxima --out benchmarks/results/adaptation_gain_dev.json
    python benchmarks/adaptation_gain.py --domain octave --out benchmarks/results/adaptation_gain_shipped.json
    python benchmarks/adaptation_gain.py --set lm_weight=0.05 --set views=two-spans   # any policy field

Targets (shipped model): domain ndcg@10 +0.05 or more, general probe drop <= 0.01, a round over 5,000 memories
<= 60 s on 2 cores. Needs `apt-get download` to reach a Debian mirror the first time (cached in --work-dir).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, fields
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evermind_memory import MemoryStore  # noqa: E402
from evermind_memory.adaptation import AdaptationPolicy  # noqa: E402

@dataclass(frozen=True)
class Domain:
    """An offline Texinfo-HTML manual from a Debian package that recipe/build_corpus.py never reads."""

    package: str
    doc_root: str  # the manual's HTML folder inside the package
    extra_roots: tuple[str, ...]  # more HTML folders: distractor passages only
    title_tail: str  # regex removed from page titles
    signature: str  # regex of a definition line; group "sig" is the query
    merged_signatures: bool = False  # definition lines repeat the name: keep the first signature only


DOMAINS = {
    # the reported domain (never tuned on)
    "octave": Domain("octave-doc", "usr/share/doc/octave/octave.html", ("usr/share/doc/octave/liboctave.html",),
                     r"\s*\(GNU Octave.*\)\s*$", r"^: (?P<sig>.+?)\s*\u00b6$"),
    # the development domain (policy defaults were tuned here): the Maxima manual, same Texinfo layout
    "maxima": Domain("maxima-doc", "usr/share/doc/maxima-doc/html", (),
                     r"\s*\(Maxima .*\)\s*$", r"^[A-Z][A-Za-z ]{1,30}: (?P<sig>.+?)\s*\u00b6$", True),
}
DOC_CHARS = 600


def fetch_doc(domain: Domain, work_dir: Path) -> Path:
    """Download and unpack the domain's package once (apt-get download + dpkg-deb -x; nothing is installed)."""
    root = work_dir / "x"
    if (root / domain.doc_root).is_dir():
        return root
    work_dir.mkdir(parents=True, exist_ok=True)
    debs = sorted(work_dir.glob(f"{domain.package}_*.deb"))
    if not debs:
        subprocess.run(["apt-get", "download", domain.package], cwd=work_dir, check=True, capture_output=True)
        debs = sorted(work_dir.glob(f"{domain.package}_*.deb"))
    subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(root)], check=True)
    return root


def first_signature(sig: str) -> str:
    """The first of several merged definition lines ("name name (a) name (a, b)" -> "name (a)")."""
    words = sig.split()
    if len(words) > 1 and words[1].startswith(words[0]) and words[0].isidentifier():
        sig = " ".join(words[1:])
        name = words[0]
        again = sig.find(f" {name} ", len(name))
        if again > 0:
            sig = sig[:again]
    return sig.strip()


def domain_pairs(domain: Domain, root: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """(query, doc) pairs and extra prose passages from a Texinfo HTML manual.

    Pairs are (definition line -> the description under it) and (page title -> the page's opening prose);
    other paragraphs become distractor passages.
    """
    from recipe.build_corpus import extract_html_page

    title_tail, sig_re = re.compile(domain.title_tail), re.compile(domain.signature)
    pairs: list[tuple[str, str]] = []
    passages: list[str] = []
    for path in sorted((root / domain.doc_root).glob("*.html")):
        page = extract_html_page(path.read_text(encoding="utf-8", errors="replace"), path.name)
        title = title_tail.sub("", page.title).strip()
        signature, body, opening, seen_signature = None, [], [], False

        def flush() -> None:
            if signature and body:
                pairs.append((signature, "\n".join(body)[:DOC_CHARS]))

        for kind, text in page.blocks:
            m = sig_re.match(text) if kind == "p" else None
            if m:
                seen_signature = True
                if signature is None or body:
                    flush()
                    sig = m.group("sig").strip()
                    signature, body = (first_signature(sig) if domain.merged_signatures else sig), []
                continue
            if kind.startswith("h"):
                flush()
                signature, body = None, []
                continue
            if kind != "p" or len(text) < 40 or text.startswith("Categories:"):
                continue
            if signature:
                if sum(len(t) for t in body) < DOC_CHARS:
                    body.append(text)
                else:
                    passages.append(text[:DOC_CHARS])  # beyond the pair's doc: a distractor
            elif not seen_signature:
                opening.append(text)
            else:
                passages.append(text[:DOC_CHARS])
        flush()
        if title and sum(len(t) for t in opening) >= 80:
            pairs.append((title, "\n".join(opening)[:DOC_CHARS]))
            passages.extend(t[:DOC_CHARS] for t in opening[2:])
    for extra in domain.extra_roots:
        for path in sorted((root / extra).glob("*.html")):
            page = extract_html_page(path.read_text(encoding="utf-8", errors="replace"), path.name)
            passages.extend(t[:DOC_CHARS] for kind, t in page.blocks if kind == "p" and len(t) >= 80)
    seen: set[str] = set()
    unique = []
    for q, d in pairs:
        if d not in seen:
            seen.add(d)
            unique.append((q, d))
    return unique, [p for p in dict.fromkeys(passages) if p not in seen]


def ndcg_at_10(ranks: np.ndarray) -> np.ndarray:
    """Per-query ndcg@10 (Q,) with one relevant doc per query at 0-based `ranks` (>= 10 or -1: missed)."""
    ok = (ranks >= 0) & (ranks < 10)
    return np.where(ok, 1.0 / np.log2(np.maximum(ranks, 0) + 2), 0.0)


def paired_ci(before: np.ndarray, after: np.ndarray, seed: int = 0, draws: int = 2000) -> tuple[float, float]:
    """95% bootstrap interval of mean(after - before) over the same queries (resampled together)."""
    diff = np.asarray(after, dtype=np.float64) - np.asarray(before, dtype=np.float64)  # (Q,)
    idx = np.random.default_rng(seed).integers(0, len(diff), size=(draws, len(diff)))  # (draws, Q)
    means = diff[idx].mean(axis=1)  # (draws,)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def store_ndcg(store: MemoryStore, queries: list[str], doc_ids: list[str]) -> np.ndarray:
    """Per-query ndcg@10 (Q,) of vector recall through the store (what an agent gets)."""
    ranks = np.full(len(queries), -1)  # (Q,)
    for i, (q, fid) in enumerate(zip(queries, doc_ids)):
        got = [h.id for h in store.recall(q, k=10, mode="vector")]
        ranks[i] = got.index(fid) if fid in got else -1
    return ndcg_at_10(ranks)


def exact_ndcg(embedder, queries: list[str], docs: list[str]) -> np.ndarray:
    """Per-query ndcg@10 (Q,) by exact search: query i's relevant doc is docs[i] (duplicate docs share one row)."""
    uniq = list(dict.fromkeys(docs))
    pos = {d: i for i, d in enumerate(uniq)}
    target = np.array([pos[d] for d in docs])  # (Q,)
    dv = embedder.embed_many(uniq)  # (N, D)
    qv = embedder.embed_many(queries)  # (Q, D)
    scores = qv @ dv.T  # (Q, N)
    own = scores[np.arange(len(queries)), target]  # (Q,)
    ranks = (scores > own[:, None]).sum(axis=1)  # (Q,)
    return ndcg_at_10(ranks)


def load_embedder(args: argparse.Namespace):
    from evermind_memory.embedder import LMEmbedder
    from evermind_memory.lm.model import EvermindLM, LMConfig
    from evermind_memory.lm.tokenizer import BPETokenizer

    if args.model is None and not args.random_d_model:
        from evermind_memory import default_embedder

        return default_embedder(), "shipped"
    tok = BPETokenizer.load(args.tokenizer)
    if args.random_d_model:
        d = args.random_d_model
        cfg = LMConfig(vocab_size=len(tok), d_model=d, n_layers=4, conv_kernel=4, hidden_dim=2 * d, n_experts=4,
                       top_k=2, attn_heads=4)
        return LMEmbedder(EvermindLM(cfg, seed=0), tok), f"untrained d_model={d} (timing only)"
    return LMEmbedder(EvermindLM.load(args.model), tok), str(args.model)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="EvermindLM checkpoint (default: the shipped model)")
    ap.add_argument("--tokenizer", type=Path, default=None)
    ap.add_argument("--random-d-model", type=int, default=0,
                    help="time a round with an untrained model of the shipped shape (needs --tokenizer)")
    ap.add_argument("--domain", choices=sorted(DOMAINS), default="octave",
                    help="octave: the reported domain; maxima: the development domain the policy was tuned on")
    ap.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "evermind_bench")
    ap.add_argument("--memories", type=int, default=5000, help="memories in the store (pairs first, then passages)")
    ap.add_argument("--general", type=Path, default=REPO / "corpus/eval/debian.jsonl")
    ap.add_argument("--general-limit", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--rank", type=int, default=None)
    ap.add_argument("--lm-weight", type=float, default=None)
    ap.add_argument("--targets", default=None, help="comma-separated LoRA targets (default: the policy's)")
    ap.add_argument("--max-cpu-seconds", type=float, default=None)
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override an AdaptationPolicy field (repeatable; tuples comma-separated)")
    ap.add_argument("--usage-fraction", type=float, default=0.5,
                    help="share of the query->doc pairs whose queries an agent issues and judges before the feedback "
                         "round; the rest are the evaluation queries of both rounds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    if (args.model is None) != (args.tokenizer is None) and not args.random_d_model:
        ap.error("--model and --tokenizer go together")
    if not 0.0 <= args.usage_fraction <= 0.9:
        ap.error(f"--usage-fraction must lie in [0, 0.9], got {args.usage_fraction}")

    embedder, model_name = load_embedder(args)
    domain = DOMAINS[args.domain]
    pairs, passages = domain_pairs(domain, fetch_doc(domain, args.work_dir / domain.package))
    rng = np.random.default_rng(args.seed)
    pairs = [pairs[i] for i in rng.permutation(len(pairs))][: args.memories]
    fillers = [passages[i] for i in rng.permutation(len(passages))][: max(0, args.memories - len(pairs))]
    general = [json.loads(line) for line in args.general.read_text(encoding="utf-8").splitlines()[: args.general_limit]] \
        if args.general.is_file() else []
    print(f"model: {model_name}  ({embedder.fingerprint})")
    print(f"domain: {domain.package}: {len(pairs)} query->doc pairs + {len(fillers)} distractor passages; "
          f"general probe: {len(general)} pairs from {args.general}")

    chosen = {"steps": args.steps, "lr": args.lr, "rank": args.rank, "lm_weight": args.lm_weight,
              "max_cpu_seconds": args.max_cpu_seconds}
    if args.targets:
        chosen["targets"] = tuple(t.strip() for t in args.targets.split(",") if t.strip())
    defaults = {f.name: f.default for f in fields(AdaptationPolicy)}
    for item in args.set:
        key, _, raw = item.partition("=")
        if key not in defaults:
            ap.error(f"--set {item}: no AdaptationPolicy field {key!r}")
        kind = type(defaults[key])
        chosen[key] = (tuple(t.strip() for t in raw.split(",") if t.strip()) if key == "targets"
                       else raw if kind is str else kind(float(raw)) if kind is int else kind(raw))
    policy = AdaptationPolicy(seed=args.seed, **{k: v for k, v in chosen.items() if v is not None})
    usage_n = int(round(len(pairs) * args.usage_fraction))
    rounds: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        with MemoryStore(Path(tmp) / "bench.db", embedder, background_embedding=False) as store:
            t0 = time.perf_counter()
            ids = []
            for start in range(0, len(pairs), 512):
                ids += store.remember_many([d for _, d in pairs[start : start + 512]], source=domain.package)
            for start in range(0, len(fillers), 512):
                store.remember_many(fillers[start : start + 512], source=domain.package)
            fill_s = time.perf_counter() - t0
            eval_q, eval_ids = [q for q, _ in pairs[usage_n:]], ids[usage_n:]

            def measure() -> dict[str, np.ndarray]:
                out = {"domain_ndcg10": store_ndcg(store, eval_q, eval_ids)}
                if general:
                    out["general_ndcg10"] = exact_ndcg(store.embedder, [g["query"] for g in general],
                                                       [g["doc"] for g in general])
                return out

            before_q = measure()
            before = {k: float(v.mean()) for k, v in before_q.items()}
            for name in ("memories only", "with feedback"):
                judged = 0
                if name == "with feedback":
                    store.rollback_adapter("base")  # the same start as the first round
                    # an agent at work: it recalls the usage half and marks the hit that answered (if shown)
                    for (q, _), want in zip(pairs[:usage_n], ids[:usage_n]):
                        if want in [h.id for h in store.recall(q, k=10)]:
                            store.feedback(q, want)
                            judged += 1
                cpu0 = time.process_time()
                report = store.adapt_now(policy)
                cpu = time.process_time() - cpu0
                after_q = measure()
                after = {k: float(v.mean()) for k, v in after_q.items()}
                rounds[name] = {
                    "judged": judged, "after": after,
                    "delta": {k: after[k] - float(before_q[k].mean()) for k in before_q},
                    "delta_ci95": {k: paired_ci(before_q[k], after_q[k]) for k in before_q},
                    "round": {k: report.to_dict()[k] for k in (
                        "status", "reason", "steps", "trained_on", "feedback_pairs", "reembedded", "replayed",
                        "train_seconds", "train_cpu_seconds", "gate_seconds", "reembed_seconds", "index_seconds",
                        "swap_seconds", "total_seconds")},
                    "round_process_cpu_seconds": cpu, "gate": None if report.gate is None else report.gate.to_dict(),
                }
    result = {
        "model": model_name, "base_fingerprint": embedder.fingerprint, "domain": domain.package, "pairs": len(pairs),
        "usage_queries": usage_n, "eval_queries": len(pairs) - usage_n,
        "memories": len(pairs) + len(fillers), "general_pairs": len(general), "fill_seconds": fill_s,
        "policy": {k: v for k, v in policy.__dict__.items()}, "before": before, "rounds": rounds,
        "cores": os.cpu_count(),
    }
    print(f"queries: {len(pairs) - usage_n} evaluated (never judged, never trained on); {usage_n} in the usage half")
    print(f"before: " + "  ".join(f"{k} {v:.4f}" for k, v in before.items()))
    for name, res in rounds.items():
        r, g = res["round"], res["gate"]
        print(f"round '{name}': {r['status']} {r['reason']}")
        if name == "with feedback":
            print(f"  the agent judged {res['judged']} of {usage_n} usage queries useful (right fact in its hybrid top 10); "
                  f"{r['feedback_pairs']} trained on (the rest hit the gate's probes)")
        print(f"  steps {r['steps']} on {r['trained_on']} memories; re-embedded {r['reembedded']} (+ the gate's "
              f"{g['corpus'] if g else 0}), replayed {r['replayed']}")
        print(f"  seconds: train {r['train_seconds']:.1f} | gate {r['gate_seconds']:.1f} | re-embed {r['reembed_seconds']:.1f}"
              f" | index {r['index_seconds']:.1f} | swap {r['swap_seconds']:.2f} | total {r['total_seconds']:.1f}"
              f" (process CPU {res['round_process_cpu_seconds']:.1f})")
        if g:
            print(f"  gate: {g['reason']} ({g['probes']} probes, corpus {g['corpus']})")
        for key in before:
            lo, hi = res["delta_ci95"][key]
            print(f"  {key:>15}: {before[key]:.4f} -> {res['after'][key]:.4f}  ({res['delta'][key]:+.4f}, "
                  f"95% paired bootstrap [{lo:+.4f}, {hi:+.4f}])")
    p = policy
    print(f"policy: views {p.views} {p.query_min_words}-{p.query_max_words} words (idf^{p.query_idf_power:g}), "
          f"negatives {p.negatives}, anchor {p.anchor_weight:g} x {p.anchor_batch}, feedback {p.query_weight:g} x "
          f"{p.query_batch}, lm_weight {p.lm_weight:g}, lr {p.lr:g} {p.lr_schedule}, batch {p.batch_size}, "
          f"rank {p.rank}, cpu budget {p.max_cpu_seconds:g} s, gate tolerance {p.gate_tolerance:g}")
    for name, res in rounds.items():
        d, r = res["delta"], res["round"]
        print(f"targets ({name}): domain {d['domain_ndcg10']:+.4f} (>= +0.05), general "
              f"{d.get('general_ndcg10', float('nan')):+.4f} (>= -0.01), round {r['total_seconds']:.1f} s (<= 60)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
