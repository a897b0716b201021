"""Word vectors trained for the rerank's word match (store/rerank.py), starting from the lexicon's.

The rerank scores a memory for a question by MaxSim over word vectors: each question word's best cosine with the
memory's words, averaged with the question words' weights. Untrained it reads the lexicon (each word as the teacher
encoder sees it alone): "headaches" meets "migraines", but nothing tells it that "when" should meet "Tuesday" or
"sport" meet "squash" in the sense a question asks. This trains the same score on (question, memory) pairs of the
training corpus (recipe/personal_corpus.py's personal questions and facts, the base corpus's pairs): in-batch
listwise cross-entropy over the MaxSim scores, the word vectors and the words' weights learned, the vectors held
near the lexicon's by an L2 anchor on the rows each step reads. The result is a lexicon file (same words,
lm/lexicon.py's format) that the rerank can read in place of the embedder's.

    python recipe/train_word_rerank.py prepare --lexicon evermind_memory/models/lexicon.evlx \
        --pairs /work/corpus_personal/pairs.jsonl --pairs /work/corpus/pairs.jsonl --limit 200000,100000 --out ids.npz
    python recipe/train_word_rerank.py train --lexicon evermind_memory/models/lexicon.evlx --data ids.npz \
        --out rerank.evlx [--steps 20000 --batch 256 --lr 2e-3 --anchor 1.0 --device cuda]

`prepare` runs on the CPU (the lexicon's own word splitting); `train` wants torch (a GPU: about 20 ms a step at
batch 256; the CPU works for a smoke run).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evermind_memory.lm.lexicon import Lexicon  # noqa: E402

PAD = np.iinfo(np.uint16).max
Q_WORDS = 16
D_WORDS = 48


def _pad(ids: list[int], n: int) -> np.ndarray:
    out = np.full(n, PAD, dtype=np.uint16)
    ids = ids[:n]
    out[:len(ids)] = ids
    return out


def prepare(lexicon: Lexicon, pairs: list[str], limits: list[int], out: Path, seed: int) -> dict:
    """Each file's first `limit` usable pairs (both sides with a known word), as padded word ids; every distinct
    memory gets an id, so that a batch can tell a repeated memory from a negative."""
    assert len(lexicon) < PAD
    rng = np.random.default_rng(seed)
    qs, ds, doc_ids, part = [], [], [], []
    docs: dict[str, int] = {}
    for k, (path, limit) in enumerate(zip(pairs, limits)):
        rows = [json.loads(line) for line in open(path, encoding="utf-8")]
        order = rng.permutation(len(rows))
        kept = 0
        for i in order:
            if kept >= limit:
                break
            q, d = lexicon.word_ids(rows[i]["query"]), lexicon.word_ids(rows[i]["doc"])
            if not q or not d:
                continue
            qs.append(_pad(q, Q_WORDS))
            ds.append(_pad(d, D_WORDS))
            doc_ids.append(docs.setdefault(rows[i]["doc"], len(docs)))
            part.append(k)
            kept += 1
    perm = rng.permutation(len(qs))
    arrays = {"q": np.stack(qs)[perm], "d": np.stack(ds)[perm], "doc": np.array(doc_ids, np.int64)[perm],
              "part": np.array(part, np.uint8)[perm]}
    np.savez_compressed(out, **arrays)
    return {"pairs": len(qs), "docs": len(docs), "per_file": np.bincount(arrays["part"]).tolist()}


def train(lexicon: Lexicon, data: Path, out: Path, *, steps: int, batch: int, lr: float, anchor: float, tau: float,
          device: str, seed: int, budget: float = float("inf"), log_every: int = 500) -> dict:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    arrays = np.load(data)
    q_all, d_all, doc_all = (torch.from_numpy(arrays[k].astype(np.int64)) for k in ("q", "d", "doc"))
    n = q_all.shape[0]
    base = lexicon.table.astype(np.float32)
    base /= np.maximum(np.linalg.norm(base, axis=1, keepdims=True), 1e-12)
    pad_row = len(lexicon)  # ids equal to PAD map to an extra zero row
    e0 = torch.from_numpy(np.vstack([base, np.zeros((1, base.shape[1]), np.float32)])).to(device)
    emb = torch.nn.Parameter(e0.clone())
    logw = torch.nn.Parameter(torch.from_numpy(np.log(np.append(lexicon.weight, 1.0) + 1e-6)).float().to(device))
    opt = torch.optim.Adam([emb, logw], lr=lr)
    gen = torch.Generator().manual_seed(seed)
    log, t0 = [], time.perf_counter()
    for step in range(1, steps + 1):
        idx = torch.randint(0, n, (batch,), generator=gen)
        q = q_all[idx].to(device)
        d = d_all[idx].to(device)
        doc = doc_all[idx].to(device)
        q = torch.where(q == int(PAD), pad_row, q)
        d = torch.where(d == int(PAD), pad_row, d)
        qm, dm = q != pad_row, d != pad_row  # (B, Q), (B, W)
        eq = F.normalize(emb[q], dim=-1)  # (B, Q, D)
        ed = F.normalize(emb[d], dim=-1)  # (B, W, D)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda")):
            sims = torch.einsum("iqc,jwc->ijqw", eq, ed).float()  # (B, B, Q, W)
        sims = sims.masked_fill(~dm[None, :, None, :], -2.0)
        best = sims.max(dim=-1).values  # (B, B, Q)
        w = torch.exp(logw[q]) * qm  # (B, Q)
        w = w / w.sum(-1, keepdim=True).clamp_min(1e-9)
        score = torch.einsum("ijq,iq->ij", best, w)  # (B, B)
        same = (doc[:, None] == doc[None, :]) & ~torch.eye(batch, dtype=torch.bool, device=device)
        logits = (score / tau).masked_fill(same, -1e4)
        loss = F.cross_entropy(logits, torch.arange(batch, device=device))
        used = torch.cat([q.flatten(), d.flatten()])  # the rows this step reads: held near the lexicon's
        reg = anchor * ((emb[used] - e0[used]) ** 2).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        (loss + reg).backward()
        opt.step()
        last = step == steps or time.perf_counter() - t0 > budget
        if step % log_every == 0 or step == 1 or last:
            acc = (logits.argmax(1) == torch.arange(batch, device=device)).float().mean().item()
            row = {"step": step, "loss": round(loss.item(), 4), "reg": round(reg.item(), 5), "acc": round(acc, 4),
                   "s": round(time.perf_counter() - t0, 1)}
            log.append(row)
            print(json.dumps(row), flush=True)
        if last:
            break
    rows = F.normalize(emb.detach()[:-1], dim=-1).cpu().numpy()  # (V, D)
    scale = np.maximum(np.abs(rows).max(axis=1), 1e-12) / 127.0
    table = np.clip(np.round(rows / scale[:, None]), -127, 127).astype(np.int8)
    weight = np.exp(logw.detach()[:-1].cpu().numpy()).astype(np.float32)
    Lexicon(lexicon.words, table, scale.astype(np.float32), weight).save(out)
    moved = float(np.mean(np.sum(rows * base, axis=1)))
    summary = {"steps": log[-1]["step"], "batch": batch, "lr": lr, "anchor": anchor, "tau": tau, "pairs": n,
               "mean cosine to the lexicon's rows": round(moved, 4), "log": log}
    Path(str(out) + ".json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--lexicon", required=True)
    p.add_argument("--pairs", action="append", required=True)
    p.add_argument("--limit", default="", help="comma-separated pairs per --pairs file (default: all)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("train")
    t.add_argument("--lexicon", required=True)
    t.add_argument("--data", type=Path, required=True)
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--steps", type=int, default=20000)
    t.add_argument("--batch", type=int, default=256)
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--anchor", type=float, default=1.0, help="weight of the L2 pull towards the lexicon's rows")
    t.add_argument("--tau", type=float, default=0.05)
    t.add_argument("--device", default="cuda")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--time-budget", type=float, default=float("inf"), help="stop (and export) after this many seconds")
    args = ap.parse_args(argv)
    lexicon = Lexicon.load(args.lexicon)
    if args.cmd == "prepare":
        limits = [int(x) for x in args.limit.split(",")] if args.limit else [1 << 62] * len(args.pairs)
        print(prepare(lexicon, args.pairs, limits, args.out, args.seed))
    else:
        s = train(lexicon, args.data, args.out, steps=args.steps, batch=args.batch, lr=args.lr, anchor=args.anchor,
                  tau=args.tau, device=args.device, seed=args.seed, budget=args.time_budget)
        print({k: v for k, v in s.items() if k != "log"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
