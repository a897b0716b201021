"""Helpers shared by the store tests and their child processes: the tiny real embedder and child envs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from evermind_memory.embedder import LMEmbedder
from evermind_memory.lm.model import EvermindLM, LMConfig
from evermind_memory.lm.tokenizer import BPETokenizer

REPO = Path(__file__).resolve().parents[2]

CORPUS = [
    "Ada prefers green tea in the morning and black coffee after lunch.",
    "Bob drinks espresso and reads the news every day at eight.",
    "The cat sat on the mat while the dog slept by the fire.",
    "Paris is the capital of France; Berlin is the capital of Germany.",
    "Python is a programming language; SQLite is a small database engine.",
    "Memories are stored as text, tags and vectors in one transaction.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Agents remember facts about users, projects, meetings and deadlines.",
]


def build_embedder(seed: int = 0, d_model: int = 32) -> LMEmbedder:
    """The tiny deterministic real embedder used by store tests (vocab ~320, d_model 32, 2 layers)."""
    tok = BPETokenizer.train(CORPUS * 4, 320)
    model = EvermindLM(LMConfig(vocab_size=len(tok), d_model=d_model, n_layers=2, hidden_dim=64), seed=seed)
    return LMEmbedder(model, tok)


def child_env() -> dict[str, str]:
    """Environment for child python processes: the repo on sys.path, no crash point inherited."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("EVERMIND_CRASH_AT", None)
    env["OPENBLAS_NUM_THREADS"] = env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = "1"
    return env


PYTHON = sys.executable

CHILD_PRELUDE = """
import sys
from evermind_memory import MemoryStore
from evermind_memory.embedder import LMEmbedder
from evermind_memory.lm.model import EvermindLM
from evermind_memory.lm.tokenizer import BPETokenizer
emb = LMEmbedder(EvermindLM.load(sys.argv[1]), BPETokenizer.load(sys.argv[2]))
db = sys.argv[3]
"""


def stored_rows(db, sql: str, params: tuple = ()) -> list[tuple]:
    """Rows of one query (`?` placeholders) straight from a store's database, without opening a MemoryStore:
    an SQLite file, or a postgresql:// URL."""
    if str(db).startswith("postgresql://"):
        import psycopg

        with psycopg.connect(str(db)) as conn:
            return conn.execute(sql.replace("?", "%s"), params).fetchall()
    import sqlite3

    with sqlite3.connect(db) as conn:
        return conn.execute(sql, params).fetchall()


def execute(db, statements: list[tuple[str, tuple]]) -> None:
    """Run statements (`?` placeholders) in one transaction straight on a store's database, without opening a
    MemoryStore: an SQLite file, or a postgresql:// URL."""
    if str(db).startswith("postgresql://"):
        import psycopg

        with psycopg.connect(str(db)) as conn:
            for sql, params in statements:
                conn.execute(sql.replace("?", "%s"), params)
        return
    import sqlite3

    with sqlite3.connect(db) as conn:
        for sql, params in statements:
            conn.execute(sql, params)


SCHEMA_5 = [  # a store of schema 6 turned back into what schema 5 looked like: each fact row holds its fingerprint
    ("ALTER TABLE facts ADD COLUMN fingerprint TEXT", ()),
    ("UPDATE facts SET fingerprint = (SELECT p.fingerprint FROM fingerprints p WHERE p.id = facts.fingerprint_id)", ()),
    ("DROP INDEX facts_fingerprint", ()),
    ("ALTER TABLE facts DROP COLUMN fingerprint_id", ()),
    ("DROP TABLE fingerprints", ()),
    ("CREATE INDEX facts_fingerprint ON facts (fingerprint, label)", ()),
    ("UPDATE meta SET value = '5' WHERE key = 'schema_version'", ()),
]


def as_schema_5(db) -> None:
    """Rewrite a store (closed) as schema 5 left it: the fingerprint string in every fact row."""
    execute(db, SCHEMA_5)


def row_vector(blob: bytes, dim: int):
    """A stored row's vector as float32, before the unit scaling (read here without evermind_memory's decoder):
    int8 components times the float32 scale before them (schema 7), float16 (schemas 5 and 6) or float32."""
    import numpy as np

    if len(blob) == dim + 4:
        return np.frombuffer(blob[4:], np.int8).astype(np.float32) * np.frombuffer(blob[:4], "<f4")[0]
    return np.frombuffer(blob, np.float16 if len(blob) == 2 * dim else np.float32).astype(np.float32)


def as_rows_hold(vectors):
    """(N, D) unit vectors as a row holds them and a read gives them back (schema 7, emulated here without
    evermind_memory): int8 steps of each row's largest magnitude / 127 (at float16's precision), scaled back to unit
    length."""
    import numpy as np

    x = np.asarray(vectors, dtype=np.float32)
    scale = (np.abs(x).max(axis=1, keepdims=True) / 127).astype(np.float16).astype(np.float32)
    back = np.rint(x / scale) * scale
    return (back / np.linalg.norm(back, axis=1, keepdims=True)).astype(np.float32)


def recall_at_k(store, db: Path, queries: list[str], k: int = 10) -> float:
    """recall@k of store.recall(mode="vector") against exact search over the vectors stored in the database
    (`db`: an SQLite file, or a postgresql:// URL, read straight with the driver).

    Tie-aware: a returned fact counts when its exact score reaches the k-th best exact score (the tiny
    untrained model maps some texts to identical vectors, and any member of a tie is a right answer).
    """
    import numpy as np

    rows = stored_rows(db,
                       "SELECT f.id, f.vector FROM facts f LEFT JOIN fingerprints p ON p.id = f.fingerprint_id WHERE "
                       "p.fingerprint = ?", (store.fingerprint,))
    rows = [(fid, bytes(blob)) for fid, blob in rows]
    if not rows:
        return 1.0
    dim = store.embedder.dimensions
    vec_of = {fid: row_vector(blob, dim) for fid, blob in rows}
    vec_of = {fid: v / np.linalg.norm(v) for fid, v in vec_of.items()}
    matrix = np.stack(list(vec_of.values()))
    hits = total = 0
    for q in queries:
        qv = store.embedder.embed(q).astype(np.float32)
        qv = qv / np.linalg.norm(qv)
        exact = np.sort(matrix @ qv)[::-1][:k]
        threshold = exact[-1] - 1e-5
        got = [h.id for h in store.recall(q, k=k, mode="vector")]
        hits += min(len(exact), sum(1 for fid in got if float(vec_of[fid] @ qv) >= threshold))
        total += len(exact)
        assert dim == len(qv)
    return hits / total
