"""`evermind demo`: remember and recall on a throwaway store, to show what the library does in a minute.

With the shipped model it uses `MemoryStore()` defaults. Without one, it says so, trains a tiny model for a
few seconds on a short bundled text, generates from it and uses it as the store's embedder.
"""

from __future__ import annotations

import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

import numpy as np

FACTS = [  # (text, the user it belongs to: a scope, store.scope(user=...); None: the whole household's)
    ("Ada prefers green tea in the morning and coffee after lunch.", "ada"),
    ("Bob drinks black coffee every day and never takes sugar.", "bob"),
    ("Bob is allergic to peanuts, so the party food must not contain nuts.", "bob"),
    ("The train to the city leaves at seven in the morning from platform two.", None),
    ("My sister lives in Zurich and works as a nurse at the city hospital.", None),
    ("The password for the guest network is written on the card in the kitchen.", None),
    ("The server restarts every night at two, so backups run at one.", None),
    ("Ada's birthday is in May, and she would like a book about birds.", "ada"),
]
QUERIES = [
    "what does Ada drink?",
    "when does the train leave",
    "food allergies",
    "wifi password",
    "present for Ada",
]


_OUT = {"file": sys.stdout, "quiet": False}  # where run_demo prints; quiet with --json (one object at the end)


def _say(text: str = "") -> None:
    if not _OUT["quiet"]:
        print(text, file=_OUT["file"], flush=True)


def _tiny_embedder(seconds: float):
    """Train a tokenizer and a tiny EvermindLM on the bundled text; return an embedder over them."""
    from evermind_memory.embedder import embedder_for
    from evermind_memory.lm import BPETokenizer, EvermindLM, LMConfig
    from evermind_memory.training import LMTrainer, TrainConfig

    text = resources.files("evermind_memory").joinpath("data/demo_corpus.txt").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.strip()]
    tok = BPETokenizer.train(lines, 512)
    config = LMConfig(vocab_size=len(tok), d_model=64, n_layers=2, conv_kernel=4, hidden_dim=128,
                      n_experts=4, top_k=2)
    model = EvermindLM(config, seed=0)
    data = [tok.encode(line, add_bos=True, add_eos=True) for line in lines]
    trainer = LMTrainer(model, TrainConfig(lr=1e-2, batch_size=16, warmup=5, seed=0, progress=False))
    _say(f"Training a TINY model ({model.num_parameters():,} parameters, vocabulary {len(tok)}) "
         f"on {len(text):,} bytes of bundled text for about {seconds:.0f} s...")
    start = time.monotonic()
    history = trainer.fit(data, steps=5)
    first = history.losses[0]
    while time.monotonic() - start < seconds:
        history = trainer.fit(data, steps=5)
    _say(f"  next-token loss {first:.2f} -> {history.losses[-1]:.2f} in {len(history.losses)} steps "
         f"(uniform guess: {np.log(len(tok)):.2f})")
    prompt = "The cat sat on the"
    ids = model.generate(tok.encode(prompt, add_bos=True), 16, temperature=0.8, seed=0, stop_token=tok.eos_id)
    _say(f"  generate({prompt!r}) -> {prompt + tok.decode(ids)!r}")
    return embedder_for(model, tok)


def run_demo(args=None, *, seconds: float = 8.0, out=None) -> int:
    """Run the demo and print what it does; returns a process exit code.

    Args:
        args: the CLI's parsed arguments (uses `keep`: leave the store in ./evermind-demo.db; `json`: print one
            JSON object with the model, the recalls and the check instead of prose), or None.
        seconds: training time of the tiny model when no shipped model is installed.
        out: where to print (default: stdout).
    """
    import json

    from evermind_memory import MemoryStore
    from evermind_memory.embedder import default_embedder
    from evermind_memory.errors import EvermindError

    as_json = bool(getattr(args, "json", False))
    _OUT.update(file=out or sys.stdout, quiet=as_json)
    result: dict = {"recalls": []}

    try:
        embedder = default_embedder()
        result["model"] = "shipped"
        _say(f"Using the shipped model {embedder.fingerprint}.")
    except EvermindError:
        _say("No shipped model is installed yet, so this demo trains a tiny one: expect rough, mostly")
        _say("word-overlap recall. The real default model is a separate, larger training run.")
        embedder = _tiny_embedder(seconds)
        result["model"] = "tiny (trained now)"
    result["fingerprint"] = embedder.fingerprint

    with tempfile.TemporaryDirectory() as tmp:
        path = "evermind-demo.db" if getattr(args, "keep", False) else str(Path(tmp) / "demo.db")
        with MemoryStore(path, embedder=embedder) as store:
            _say()
            _say(f"remember() x {len(FACTS)} into {path}")
            for i, (text, user) in enumerate(FACTS):  # by id: a rerun with --keep replaces them, adds none
                (store if user is None else store.scope(user=user)).remember(text, source="demo", id=f"demo-{i}")
            for query in QUERIES:
                _say()
                _say(f"recall({query!r}, k=2)")
                hits = store.recall(query, k=2)
                for hit in hits:
                    _say(f"  {hit.score:5.2f}  {hit.text}")
                result["recalls"].append({"query": query, "hits": [{"score": h.score, "text": h.text} for h in hits]})
            _say()
            ada = store.scope(user="ada").recall("what does Ada like?", k=3)  # only Ada's memories
            _say("scope(user='ada').recall('what does Ada like?') -> " + "; ".join(h.text for h in ada))
            result["recalls"].append({"query": "what does Ada like?", "scope": {"user": "ada"},
                                      "hits": [{"score": h.score, "text": h.text} for h in ada]})
            report = store.check()
            _say(f"check(): {report}")
            result.update(store=path, remembered=len(FACTS), check={"ok": report.ok, "problems": list(report.problems),
                                                                    "facts": report.facts, "indexed": report.indexed})
    if as_json:
        print(json.dumps(result, ensure_ascii=False), file=_OUT["file"])
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(run_demo())
