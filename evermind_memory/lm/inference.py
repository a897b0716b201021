"""The embedding path without caches: an inference plan of the weights, and FrozenEmbedder.

`EvermindLM.hidden_forward`/`pooled_forward` keep what a backward needs; embeddings need only outputs. The
plan holds the weights rearranged once (norm gains folded into the following linear maps, the attention scale
into the query columns) and the functions below run the same maths with fewer numpy calls and temporaries.
Results equal the training path's up to float rounding. Shape letters as in model.py.
"""

from __future__ import annotations

import math
import os
import threading
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from evermind_memory.errors import InvalidInput
from evermind_memory.lm.attention import key_mask
from evermind_memory.lm.batch import prepare_list
from evermind_memory.lm.config import LMConfig
from evermind_memory.lm.layers import RMS_EPS
from evermind_memory.lm.moe import SHORT_MAX_ROWS, moe_infer, moe_infer_short, moe_inference_weights

__all__ = ["EMBED_THREADS_ENV", "FrozenEmbedder", "build_plan", "embed_threads", "plan_embed_one", "plan_embed_many"]

EMBED_THREADS_ENV = "EVERMIND_EMBED_THREADS"

_NORM_EPS = 1e-12  # an all-zero pooled vector stays zero instead of dividing by zero
_EMBED_BUCKET_SEQS = 64  # at most this many sequences per embedding forward
_HAS_VECDOT = hasattr(np, "vecdot")
# Padded positions x C per embedding forward (1024 positions at C=128): the layer's arrays stay in L2, which
# measured faster than larger buckets although the matmuls get smaller.
_EMBED_BUCKET_ELEMENTS = 1 << 17
# A single text (a recall's query) runs with its positions padded to a multiple of this: OpenBLAS's sgemm takes
# longer for 4k+1..4k+3 rows than for 4k + 4 (its kernels step 4 rows; the rest go through slower edge code). On
# 2 cores, one MoE layer of 10 rows took 386 us and of 12 rows 350 us; benchmarks/query_speed.py has the figures.
_ROW_MULTIPLE = 4


class _PoolPlan(NamedTuple):
    wqkv: np.ndarray  # (C, 3C) attn_norm gain folded into the rows, 1/sqrt(D) into the query columns
    wo: np.ndarray  # (C, C)
    out_gain: np.ndarray  # (C,) out_norm gain, applied after pooling (a per-channel scale commutes with the mean)
    heads: int


class _Plan(NamedTuple):
    emb: np.ndarray  # (V, C)
    taps: list  # per layer (K, C): conv taps * conv_norm gain, reversed (tap K-1 first) for the window view
    moe: list  # per layer MoEInference
    pool: _PoolPlan | None
    top_k: int


def build_plan(config: LMConfig, params: Mapping[str, np.ndarray], *, fused: bool) -> _Plan:
    """Rearrange params for inference; fused=False only derives the small arrays (cheap per call)."""
    taps, moes = [], []
    for layer in range(config.n_layers):
        p = f"layers.{layer}."
        taps.append(np.ascontiguousarray((params[p + "conv"] * params[p + "conv_norm"])[::-1]))  # (K, C)
        local = {n[len(p) :]: a for n, a in params.items() if n.startswith(p)}
        moes.append(moe_inference_weights(local, params[p + "moe_norm"], fused=fused))
    pool = None
    if config.attn_heads:
        c = config.d_model
        wqkv = params["pool.attn_norm"][:, None] * params["pool.wqkv"]  # (C, 3C)
        wqkv[:, :c] *= wqkv.dtype.type(1.0 / math.sqrt(c // config.attn_heads))
        pool = _PoolPlan(wqkv, params["pool.wo"], params["pool.out_norm"], config.attn_heads)
    return _Plan(params["emb"], taps, moes, pool, config.top_k)


def _row_sumsq(x: np.ndarray) -> np.ndarray:
    """Sum of squares of each row of x (N, C): np.vecdot where numpy has it (2.0+; faster), else einsum."""
    return np.vecdot(x, x) if _HAS_VECDOT else np.einsum("nc,nc->n", x, x)  # (N,)


def _rms_scale(x: np.ndarray) -> np.ndarray:
    """1 / sqrt(mean(x^2) + eps) per row of x (N, C), as in rmsnorm_forward."""
    ms = _row_sumsq(x) / x.shape[-1]  # (N,)
    return 1.0 / np.sqrt(ms + RMS_EPS)  # (N,)


def _windows(padded: np.ndarray, k: int) -> np.ndarray:
    """(B, T, C, K) view of a (B, T+K-1, C) buffer: [b, t, :, j] is row t + j (sliding_window_view, cheaper)."""
    b, tk, c = padded.shape
    s0, s1, s2 = padded.strides
    return np.ndarray((b, tk - k + 1, c, k), padded.dtype, padded, 0, (s0, s1, s2, s1))


def _plan_hidden(plan: _Plan, tokens: np.ndarray) -> np.ndarray:
    """Final hidden states (B*T, C) of a (B, T) token batch; rows of padded positions hold finite junk.

    A single short sequence runs every expert on every row (moe_infer_short); anything else is dispatched
    by expert. Padded positions go through the layers like real ones (cheaper than gathering the real rows
    of a length-sorted bucket); nothing after them reads them.
    """
    b, t = tokens.shape
    x = np.take(plan.emb, tokens.ravel(), axis=0)  # (B*T, C)
    c = x.shape[1]
    k = plan.taps[0].shape[0]
    padded = np.zeros((b, t + k - 1, c), dtype=x.dtype)  # (B, T+K-1, C): K-1 zero rows before each sequence
    body = padded[:, k - 1 :]  # (B, T, C) where the normalised input goes
    windows = _windows(padded, k)  # (B, T, C, K): tap K-1-j multiplies [..., j] (the plan keeps taps reversed)
    short = b * t <= SHORT_MAX_ROWS and plan.moe[0].w1_aug is not None
    if short:
        xa = np.ones((b * t, c + 1), dtype=x.dtype)  # (B*T, C+1) MoE input with a ones column
    for taps, moe in zip(plan.taps, plan.moe):
        np.multiply(x.reshape(b, t, c), _rms_scale(x).reshape(b, t, 1), out=body)
        h = np.einsum("btck,kc->btc", windows, taps).reshape(b * t, c)  # (B*T, C) causal depthwise conv
        h += x
        if short:
            np.multiply(h, _rms_scale(h)[:, None], out=xa[:, :c])
            moe_infer_short(moe, xa, plan.top_k, h)
        else:
            moe_infer(moe, h * _rms_scale(h)[:, None], plan.top_k, h)
        x = h
    return x


def _plan_pool(plan: _Plan, h: np.ndarray, b: int, lengths: np.ndarray | None) -> np.ndarray:
    """Pooled (B, C) of hidden states h (B*T, C); lengths None means no padding."""
    t = h.shape[0] // b
    c = h.shape[1]
    if lengths is None:
        weights = np.full((b, t), 1.0 / t, dtype=h.dtype)  # (B, T)
    else:
        real = np.arange(t)[None, :] < lengths[:, None]  # (B, T)
        weights = (real / lengths[:, None]).astype(h.dtype)  # (B, T)
    pp = plan.pool
    if pp is None:
        return np.einsum("bt,btc->bc", weights, h.reshape(b, t, c))  # (B, C) mean over real positions
    n, d = pp.heads, c // pp.heads
    qkv = (h * _rms_scale(h)[:, None]) @ pp.wqkv  # (B*T, 3C)
    qkv = qkv.reshape(b, t, 3, n, d).transpose(2, 0, 3, 1, 4)  # (3, B, N, T, D) view
    q, k, v = np.ascontiguousarray(qkv)  # (B, N, T, D) each
    s = q @ k.transpose(0, 1, 3, 2)  # (B, N, T, T) scores, already scaled by 1/sqrt(D)
    if lengths is not None:
        s += key_mask(lengths, t, s.dtype)
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    o = (s @ v).transpose(0, 2, 1, 3).reshape(b * t, c)  # (B*T, C) heads concatenated
    z = o @ pp.wo  # (B*T, C)
    z += h
    weights *= _rms_scale(z).reshape(b, t)  # out_norm's 1/rms folded into the pooling weights
    return np.einsum("bt,btc->bc", weights, z.reshape(b, t, c)) * pp.out_gain  # (B, C)


def _normalise_rows(pooled: np.ndarray) -> np.ndarray:
    """L2-normalise each row (an exactly zero row stays zero); float32."""
    norms = np.sqrt(_row_sumsq(pooled))  # (B,)
    return (pooled / np.maximum(norms, _NORM_EPS)[:, None]).astype(np.float32, copy=False)


def plan_embed_one(plan: _Plan, seq: np.ndarray) -> np.ndarray:
    """Embedding (C,) float32 of one validated (T,) sequence.

    A short sequence runs padded to a multiple of _ROW_MULTIPLE positions: the padding comes after every real
    position, so the causal convolutions never read it, and the pooling leaves it out as it does a bucket's. Not
    one row (BLAS's matrix-vector products: fastest as it is), nor past the short MoE path (SHORT_MAX_ROWS), where
    each expert gets its own row count and padding measured 0-5% slower.
    """
    t = seq.shape[0]
    rows = -(-t // _ROW_MULTIPLE) * _ROW_MULTIPLE
    if rows == t or t == 1 or rows > SHORT_MAX_ROWS:
        return _normalise_rows(_plan_pool(plan, _plan_hidden(plan, seq[None, :]), 1, None))[0]
    tokens = np.zeros((1, rows), dtype=seq.dtype)  # (1, T') padding is token 0: finite junk, never read
    tokens[0, :t] = seq
    h = _plan_hidden(plan, tokens)  # (T', C)
    return _normalise_rows(_plan_pool(plan, h, 1, np.array([t])))[0]


def _buckets(lens: np.ndarray, d_model: int) -> list[list[int]]:
    """Indices of sequences grouped into forwards: short to long, so a bucket pads little; a bucket holds at
    most _EMBED_BUCKET_SEQS sequences and _EMBED_BUCKET_ELEMENTS padded positions x C."""
    order = np.argsort(lens, kind="stable").tolist()
    max_rows = max(1, _EMBED_BUCKET_ELEMENTS // d_model)
    out, start = [], 0
    while start < len(order):
        stop = start + 1
        while (
            stop < len(order)
            and stop - start < _EMBED_BUCKET_SEQS
            and (stop - start + 1) * lens[order[stop]] <= max_rows
        ):
            stop += 1
        out.append(order[start:stop])
        start = stop
    return out


def _embed_bucket(plan: _Plan, seqs: Sequence[np.ndarray], ids: list[int], lens: np.ndarray, out: np.ndarray) -> None:
    """Write the embeddings of seqs[ids] (one padded forward) into out[ids]."""
    if len(ids) == 1:
        out[ids[0]] = plan_embed_one(plan, seqs[ids[0]])
        return
    sub_lens = lens[ids]  # (b,)
    t = int(sub_lens[-1])
    tokens = np.zeros((len(ids), t), dtype=np.intp)  # (b, t) padding is token 0: finite junk, never read
    for row, i in enumerate(ids):
        tokens[row, : sub_lens[row]] = seqs[i]
    h = _plan_hidden(plan, tokens)  # (b*t, C)
    padded = None if sub_lens[0] == t else sub_lens
    out[ids] = _normalise_rows(_plan_pool(plan, h, len(ids), padded))


# The library's own background threads (the store's vector thread, adaptation rounds, these workers) embed on one
# worker, so that work nobody waits for leaves the other core to a concurrent recall.
BACKGROUND_THREADS = ("evermind-embed", "evermind-vectors", "evermind-adaptation")
DEFAULT_EMBED_THREADS = 2  # the most workers a foreground embed_many takes unless EVERMIND_EMBED_THREADS says


def embed_threads() -> int:
    """Worker threads for the buckets of one embed_many: EVERMIND_EMBED_THREADS, else the cores this process may
    use up to DEFAULT_EMBED_THREADS; 1 in the library's background threads (BACKGROUND_THREADS) unless the
    variable is set.

    Each worker runs whole buckets with single-threaded BLAS (see _blas.py: no spinning threads), and buckets
    are computed exactly as serially, so the vectors do not depend on the thread count. On 2 quiet cores two
    workers embed 1.4-1.6x as many texts a second as one (`python benchmarks/embed_threads.py`); under heavy load
    from other processes they gained 11% (benchmarks/results/embed_speed_dev_docs.json, load 8-17)."""
    raw = os.environ.get(EMBED_THREADS_ENV, "")
    if not raw.strip():
        if threading.current_thread().name.startswith(BACKGROUND_THREADS):
            return 1
        return max(1, min(DEFAULT_EMBED_THREADS, _usable_cores()))
    try:
        n = int(raw)
    except ValueError:
        raise InvalidInput(f"{EMBED_THREADS_ENV} expected a whole number of threads >= 1, got {raw!r}.") from None
    if n < 1:
        raise InvalidInput(f"{EMBED_THREADS_ENV} expected a whole number of threads >= 1, got {raw!r}.")
    return n


def _usable_cores() -> int:
    """The cores this process may run on (its affinity where the platform says, else the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # (not on macOS or Windows)
        return os.cpu_count() or 1


_POOL_LOCK = threading.Lock()
_POOLS: dict[tuple[int, int], Any] = {}


def _pool(n: int) -> Any:
    """The process's ThreadPoolExecutor of n embedding workers (keyed by pid too: a forked child has none of the
    parent's threads, so it starts its own pool instead of queueing work no thread would take).

    Raises:
        RuntimeError: the interpreter is exiting (concurrent.futures refuses to load, or to start threads, then).
    """
    from concurrent.futures import ThreadPoolExecutor  # here: first imported at exit, it raises (see above)

    key = (os.getpid(), n)
    with _POOL_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = ThreadPoolExecutor(n, thread_name_prefix="evermind-embed")
        return pool


def plan_embed_many(plan: _Plan, seqs: Sequence[np.ndarray], d_model: int) -> np.ndarray:
    """Embeddings (N, C) float32 of validated sequences, run in length-sorted buckets of similar length,
    spread over embed_threads() workers when there are several buckets."""
    out = np.zeros((len(seqs), d_model), dtype=np.float32)  # (N, C)
    if not seqs:
        return out
    lens = np.array([s.size for s in seqs], dtype=np.intp)  # (N,)
    buckets = _buckets(lens, d_model)
    workers = min(embed_threads(), len(buckets))
    if workers <= 1 or threading.current_thread().name.startswith("evermind-embed"):
        for ids in buckets:
            _embed_bucket(plan, seqs, ids, lens, out)
        return out
    # longest buckets first, so the last one to start is short and the workers finish together
    order = list(reversed(buckets))
    jobs = []
    try:
        for ids in order:
            jobs.append(_pool(workers).submit(_embed_bucket, plan, seqs, ids, lens, out))
    except RuntimeError:  # the interpreter is exiting (an atexit hook closing a store): no new threads, so here
        pass
    for job in jobs:
        job.result()
    for ids in order[len(jobs):]:
        _embed_bucket(plan, seqs, ids, lens, out)
    return out


class FrozenEmbedder:
    """A snapshot of an EvermindLM's embedding function, with its weights arranged once for speed.

    Made by `EvermindLM.frozen()`. It copies the weights, so later changes to the model do not reach it
    (an embedder's fingerprint names the weights it was made with). Thread-safe: it is only read.
    """

    def __init__(self, model: Any) -> None:
        params = {name: np.array(p, copy=True) for name, p in model.params.items()}
        self.config = model.config
        self._vocab = int(model.config.vocab_size)
        self._plan = build_plan(model.config, params, fused=True)

    def embed(self, tokens: Sequence[int]) -> np.ndarray:
        """Same as `EvermindLM.embed` with the weights of the snapshot.

        Args:
            tokens: non-empty list of token ids.

        Returns:
            (C,) float32 vector of norm 1 (or zero if the pooled state is exactly zero).

        Raises:
            InvalidInput: empty list or ids out of range.
        """
        return plan_embed_one(self._plan, prepare_list(tokens, self._vocab, "embed()"))

    def embed_batch(self, token_lists: Sequence[Sequence[int]]) -> np.ndarray:
        """Same as `EvermindLM.embed_batch` with the weights of the snapshot.

        Args:
            token_lists: sequence of non-empty token-id lists.

        Returns:
            (N, C) float32, row i the embedding of token_lists[i]; (0, C) for an empty input.

        Raises:
            InvalidInput: an empty list or ids out of range (the message names the index).
        """
        seqs = [prepare_list(tokens, self._vocab, f"embed_batch() item {i}") for i, tokens in enumerate(token_lists)]
        return plan_embed_many(self._plan, seqs, self.config.d_model)
