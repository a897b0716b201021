"""Encode speed of our byte-level BPE against Hugging Face `tokenizers`, trained alike on the same text.

Corpus: the top-level Python standard library sources (offline everywhere Python is). Both tokenizers are
trained to the same vocabulary, then encode the whole corpus twice (a fresh tokenizer first, so its
pre-token cache starts empty, then again warm). Hugging Face runs single-threaded (RAYON_NUM_THREADS=1
unless set), per text and through encode_batch. Speeds use process CPU time, not wall time, because the
machines we run on are shared; they are indicative only.

    python benchmarks/tokenizer_speed.py [--vocab 8192] [--max-mb 5] [--json results.json]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # must precede the first use of tokenizers
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evermind_memory.lm.tokenizer import BPETokenizer  # noqa: E402

SPECIALS = ["<bos>", "<eos>", "<pad>", "<unk>"]


def load_corpus(max_mb: float) -> list[str]:
    """The stdlib's top-level .py files, sorted by name, up to max_mb megabytes of UTF-8."""
    stdlib = sysconfig.get_paths()["stdlib"]
    texts, total = [], 0
    for path in sorted(glob.glob(os.path.join(stdlib, "*.py"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        size = len(text.encode("utf-8"))
        if total + size > max_mb * 1e6:
            break
        texts.append(text)
        total += size
    return texts


def timed(fn):
    """fn() and the process CPU seconds it took (steadier than wall time on a shared machine)."""
    start = time.process_time()
    result = fn()
    return result, time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=8192, help="vocabulary size for both tokenizers")
    parser.add_argument("--max-mb", type=float, default=5.0, help="corpus size cap in MB")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args()

    texts = load_corpus(args.max_mb)
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    rows: list[dict] = []

    ours, train_s = timed(lambda: BPETokenizer.train(texts, args.vocab))
    with tempfile.TemporaryDirectory() as tmp:  # a fresh instance from disk, so the first pass starts cold
        ours.save(Path(tmp) / "tok.json")
        ours = BPETokenizer.load(Path(tmp) / "tok.json")
    ids, cold_s = timed(lambda: [ours.encode(t) for t in texts])
    _, warm_s = timed(lambda: [ours.encode(t) for t in texts])
    _, batch_s = timed(lambda: ours.encode_batch(texts))
    n_tokens = sum(map(len, ids))
    assert all(ours.decode(i) == t for i, t in zip(ids, texts)), "round trip failed"
    rows += [
        {"tokenizer": "evermind", "mode": "encode per text, cold cache", "cpu_seconds": cold_s},
        {"tokenizer": "evermind", "mode": "encode per text, warm cache", "cpu_seconds": warm_s},
        {"tokenizer": "evermind", "mode": "encode_batch, warm cache", "cpu_seconds": batch_s},
    ]
    summary = {"evermind": {"train_s": train_s, "vocab": len(ours), "tokens_per_byte": n_tokens / n_bytes}}

    try:
        import tokenizers
        from tokenizers import ByteLevelBPETokenizer
    except ImportError:
        print("tokenizers is not installed (pip install tokenizers): Hugging Face rows skipped.")
        tokenizers = None
    if tokenizers is not None:
        hf = ByteLevelBPETokenizer()
        _, hf_train_s = timed(
            lambda: hf.train_from_iterator(
                texts, vocab_size=args.vocab, min_frequency=2, special_tokens=SPECIALS, show_progress=False
            )
        )
        with tempfile.TemporaryDirectory() as tmp:  # a fresh instance from disk, like ours
            hf.save(str(Path(tmp) / "hf.json"))
            hf = tokenizers.Tokenizer.from_file(str(Path(tmp) / "hf.json"))
        hf_ids, hf_cold_s = timed(lambda: [hf.encode(t).ids for t in texts])
        _, hf_warm_s = timed(lambda: [hf.encode(t).ids for t in texts])
        _, hf_batch_s = timed(lambda: [e.ids for e in hf.encode_batch(texts)])
        threads = os.environ["RAYON_NUM_THREADS"]
        rows += [
            {"tokenizer": "hf tokenizers", "mode": "encode per text, first pass", "cpu_seconds": hf_cold_s},
            {"tokenizer": "hf tokenizers", "mode": "encode per text, second pass", "cpu_seconds": hf_warm_s},
            {"tokenizer": "hf tokenizers", "mode": f"encode_batch ({threads} thread(s))", "cpu_seconds": hf_batch_s},
        ]
        summary["hf tokenizers"] = {
            "train_s": hf_train_s,
            "vocab": hf.get_vocab_size(),
            "tokens_per_byte": sum(map(len, hf_ids)) / n_bytes,
            "version": tokenizers.__version__,
        }
        summary["ours_over_hf_single_thread"] = (hf_cold_s + hf_warm_s) / (cold_s + warm_s)

    for row in rows:
        row["mb_per_s"] = n_bytes / row["cpu_seconds"] / 1e6
    print(f"corpus: {len(texts)} stdlib files, {n_bytes / 1e6:.2f} MB; vocab {args.vocab}; "
          f"Python {platform.python_version()}")
    print(f"{'tokenizer':<15} {'mode':<36} {'MB/s':>8} {'CPU s':>8}")
    for row in rows:
        print(f"{row['tokenizer']:<15} {row['mode']:<36} {row['mb_per_s']:>8.2f} {row['cpu_seconds']:>8.2f}")
    for name, info in summary.items():
        if isinstance(info, dict):
            print(f"{name}: train {info['train_s']:.1f} s, vocab {info['vocab']}, "
                  f"{info['tokens_per_byte']:.3f} tokens/byte")
    if "ours_over_hf_single_thread" in summary:
        print(f"ours / HF single-thread encode speed (both passes): {summary['ours_over_hf_single_thread']:.2f}")
    if args.json:
        result = {
            "corpus_bytes": n_bytes, "corpus_files": len(texts), "vocab": args.vocab, "rows": rows,
            "summary": summary, "python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(),
        }
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
