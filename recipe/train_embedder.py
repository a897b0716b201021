"""Train the shipped embedder on a GPU: contrastive pairs plus distillation from all-MiniLM-L6-v2.

    python recipe/train_embedder.py --corpus corpus --tokenizer runs/tokenizer.json \
        --teacher .teacher --state runs/state-c128 --out runs/c128 --d-model 128 --time-budget 420

Resumable: all state (tokenised corpus, teacher vectors, parameters, AdamW moments, step, rng) lives in
--state, so a run cut at the 10-minute limit continues with the same command. Teacher vectors are computed
on the GPU in the run that uses them and cached in --state. A dev-time tool: needs torch and
sentence-transformers; the package itself never imports either.

Warm start: `--init model.evlm` continues from one of our checkpoints (the architecture is read from it; an
architecture flag that disagrees is an error). The distillation head is not in the checkpoint: it starts from
a least-squares fit of the teacher vectors on the loaded model's embeddings, and the learning rate warms up
over --warmup steps (100 by default with --init). `--hard-negatives K` mines, per pair, the K docs nearest
to the query by the teacher (not the positive, not another doc of that query, scoring below 0.95 x the
positive's teacher score) and adds one of them per row to the query->doc contrastive denominator.
`--teacher-pairs MIN_COS` adds a pair source "teacher-nn": each passage with its nearest other passage by the
teacher's cosine, kept where MIN_COS <= cosine < 0.92 (above that they are near-copies). Free paraphrase-like
pairs in the teacher's sense of "about the same thing", mined once on the GPU before hard negatives.
`--kd-weight W` adds in-batch ranking distillation: the KL divergence from the teacher's softmax over each
query's batch of doc cosines (temperature --kd-tau) to the student's, so the student learns the teacher's
order of the negatives, not only which doc is the positive.
`--lexicon FILE` trains the model as the second part of the shipped vector: every loss sees what the embedder
returns with that lexicon (lm.lexicon), the model's unit vector followed by --lexicon-weight x the text's unit
lexicon vector, normalised as a whole; the lexicon stays fixed (its text vectors are computed once per machine and
cached beside the teacher's), so the model learns what the word vectors miss rather than repeating what they hold.
The exported checkpoint is the model alone, to be shipped with that lexicon and weight.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import Pool
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mirror import MirrorLM, embed_bucketed, to_device  # noqa: E402

from evermind_memory.lm.model import EvermindLM, LMConfig, param_shapes  # noqa: E402
from evermind_memory.lm.tokenizer import BPETokenizer  # noqa: E402

GOLDEN_TEXTS = [
    "Ada prefers green tea in the morning.",
    "What does Ada like to drink?",
    "The train to the city leaves at seven from platform two.",
    "library for parsing JSON documents in Python",
    "A fast, lightweight web server with a small memory footprint.",
    "sqlite3 — DB-API 2.0 interface for SQLite databases",
    "x",
    "Emoji 🙂 and CJK 汉字 and Ünïcödé survive tokenisation.",
    "utilities for manipulating PDF files: split, merge, rotate and crop pages",
    "The cat sat on the warm windowsill and watched the birds in the garden. " * 6,
]


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# -- tokenising in worker processes -----------------------------------------------------------------------
_TOK: BPETokenizer | None = None


def _init_worker(tok_path: str) -> None:
    global _TOK
    _TOK = BPETokenizer.load(tok_path)


def _encode_chunk(texts: list[str]) -> list[list[int]]:
    return [_TOK.encode(t) for t in texts]


def tokenise_all(texts: list[str], tok_path: str, max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """All texts to a padded (N, max_tokens) int32 matrix and lengths, in parallel."""
    chunks = [texts[i: i + 2000] for i in range(0, len(texts), 2000)]
    with Pool(os.cpu_count(), initializer=_init_worker, initargs=(tok_path,)) as pool:
        encoded = [ids for part in pool.map(_encode_chunk, chunks) for ids in part]
    mat = np.zeros((len(texts), max_tokens), dtype=np.int32)
    lengths = np.zeros(len(texts), dtype=np.int32)
    for i, ids in enumerate(encoded):
        ids = ids[:max_tokens] or [0]
        mat[i, : len(ids)] = ids
        lengths[i] = len(ids)
    return mat, lengths


_LEX = None


def _init_lexicon_worker(lex_path: str) -> None:
    global _LEX
    from evermind_memory.lm.lexicon import Lexicon

    _LEX = Lexicon.load(lex_path)


def _lexicon_chunk(texts: list[str]) -> np.ndarray:
    return _LEX.embed_many(texts).astype(np.float16)


def lexicon_vectors(texts: list[str], lex_path: str) -> np.ndarray:
    """(N, D) float16 unit lexicon vectors of all texts (zero rows for texts without a known word), in parallel."""
    chunks = [texts[i: i + 5000] for i in range(0, len(texts), 5000)]
    with Pool(os.cpu_count(), initializer=_init_lexicon_worker, initargs=(lex_path,)) as pool:
        return np.concatenate(pool.map(_lexicon_chunk, chunks))


# -- the teacher, and a compact copy of it for the 64 MiB transfer to the GPU machine --------------------
TEACHER_INT8 = "model.int8.safetensors"  # a packed teacher holds this instead of model.safetensors


def pack_teacher(src: str, dst: str) -> None:
    """Copy a sentence-transformers model dir with every 2-D weight as int8 plus one fp16 scale per row.

    Symmetric round-to-nearest per output row (per token for the embeddings); 1-D tensors as fp16; the other
    files as they are. Halves the fp16 teacher (45 -> 23 MB) so it travels beside the shipped checkpoint.
    """
    from safetensors.torch import load_file, save_file

    src_p, dst_p = Path(src), Path(dst)
    for f in src_p.rglob("*"):
        if f.is_file() and f.name != "model.safetensors":
            (dst_p / f.relative_to(src_p)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dst_p / f.relative_to(src_p))
    packed = {}
    for name, t in load_file(str(src_p / "model.safetensors")).items():
        if t.is_floating_point() and t.ndim == 2:
            scale = (t.float().abs().amax(dim=1).clamp_min(1e-12) / 127).half()  # (rows,)
            packed[name] = torch.round(t.float() / scale.float()[:, None]).clamp(-127, 127).to(torch.int8)
            packed[name + ".int8_scale"] = scale
        else:
            packed[name] = t.half() if t.is_floating_point() else t
    save_file(packed, str(dst_p / TEACHER_INT8), metadata={"format": "pt"})


def unpack_teacher(teacher_dir: str) -> str:
    """A directory sentence-transformers can load: teacher_dir itself, or for a packed teacher (pack_teacher)
    an fp16 copy with the int8 weights dequantised, in a temporary directory."""
    import tempfile

    from safetensors.torch import load_file, save_file

    src = Path(teacher_dir)
    if not (src / TEACHER_INT8).exists():
        return teacher_dir
    dst = Path(tempfile.mkdtemp(prefix="teacher_"))
    for f in src.rglob("*"):
        if f.is_file() and f.name != TEACHER_INT8:
            (dst / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dst / f.relative_to(src))
    packed = load_file(str(src / TEACHER_INT8))
    weights = {name: (t.float() * packed[name + ".int8_scale"].float()[:, None]).half() if t.dtype == torch.int8 else t
               for name, t in packed.items() if not name.endswith(".int8_scale")}
    save_file(weights, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return str(dst)


@contextmanager
def teacher_model_dir(teacher_dir: str) -> Iterator[str]:
    """unpack_teacher's directory while the block reads the model from it; a dequantised temporary copy is removed
    after (the model is in memory by then)."""
    model_dir = unpack_teacher(teacher_dir)
    try:
        yield model_dir
    finally:
        if model_dir != teacher_dir:
            shutil.rmtree(model_dir, ignore_errors=True)


def teacher_vectors(texts: list[str], teacher_dir: str, device: str) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    with teacher_model_dir(teacher_dir) as model_dir:
        model = SentenceTransformer(model_dir, device=device)
    model.half() if device == "cuda" else model.float()
    vec = model.encode(texts, batch_size=1024, convert_to_numpy=True, normalize_embeddings=True,
                       show_progress_bar=False)
    return vec.astype(np.float16)


# -- evaluation ---------------------------------------------------------------------------------------------
def ndcg_at_10(sim: np.ndarray, gold: np.ndarray) -> float:
    """Mean ndcg@10 with one relevant doc per query (gold[i] is its column)."""
    order = np.argsort(-sim, axis=1)[:, :10]  # (Q, 10)
    hit = order == gold[:, None]
    gains = (hit / np.log2(np.arange(2, 2 + order.shape[1]))[None, :]).sum(axis=1)  # fewer than 10 docs: toy sets
    return float(gains.mean())


def evaluate(embed_fn, sets: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> dict[str, float]:
    out = {}
    for name, (q_idx, d_idx, gold) in sets.items():
        eq = embed_fn(q_idx)
        ed = embed_fn(d_idx)
        out[name] = ndcg_at_10(eq @ ed.T, gold)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--teacher", required=True)
    ap.add_argument("--state", required=True)
    ap.add_argument("--out", required=True)
    # architecture: None means the checkpoint's value with --init, else the default in ARCH_DEFAULTS
    ap.add_argument("--d-model", type=int, default=None, help="channels C (default 128)")
    ap.add_argument("--n-layers", type=int, default=None, help="default 4")
    ap.add_argument("--conv-kernel", type=int, default=None, help="default 4")
    ap.add_argument("--hidden", type=int, default=None, help="expert hidden width (default 2 x d-model)")
    ap.add_argument("--experts", type=int, default=None, help="default 4")
    ap.add_argument("--top-k", type=int, default=None, help="default 2")
    ap.add_argument("--attn-heads", type=int, default=None, help="default 4")
    ap.add_argument("--init", default=None,
                    help="warm start from this .evlm checkpoint (architecture from it; ignored when --state resumes)")
    ap.add_argument("--warmup", type=int, default=None, help="LR warmup steps (default 200; 100 with --init)")
    ap.add_argument("--hard-negatives", type=int, default=0, metavar="K",
                    help="mine K teacher-nearest docs per pair and add one per row to the contrastive loss (0: off)")
    ap.add_argument("--teacher-pairs", type=float, default=0.0, metavar="MIN_COS",
                    help="add a 'teacher-nn' pair source: each passage with its nearest other passage by the "
                         "teacher, where that cosine is >= MIN_COS and < 0.92 (0: off)")
    ap.add_argument("--lexical-focus", type=float, default=0.0, metavar="F",
                    help="within each source, draw a pair with weight 1 + F x (share of its query's words missing "
                         "from its doc): more of the pairs keyword search cannot answer (0: uniform)")
    ap.add_argument("--lexicon", default=None, metavar="FILE",
                    help="train the model beside this fixed lexicon (lm.lexicon): the losses see the joined vector")
    ap.add_argument("--lexicon-weight", type=float, default=0.8, help="the lexicon part's weight (as shipped)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--tau", type=float, default=0.05)
    ap.add_argument("--distill-weight", type=float, default=4.0)
    ap.add_argument("--simmat-weight", type=float, default=1.0)
    ap.add_argument("--kd-weight", type=float, default=0.0,
                    help="weight of the in-batch ranking distillation: KL from the teacher's softmax over the "
                         "batch's query->doc cosines to the student's (0: off)")
    ap.add_argument("--kd-tau", type=float, default=None, help="the teacher's temperature there (default: --tau)")
    ap.add_argument("--token-distill", type=float, default=0.0, metavar="W",
                    help="weight of the words-in-context loss (recipe/token_distill.py): each word's student states "
                         "against the teacher's state of that word in the same text; 0: off")
    ap.add_argument("--token-batch", type=int, default=512,
                    help="texts a step distils word by word (half the step's queries, half its docs)")
    ap.add_argument("--time-budget", type=float, default=480.0, help="seconds of training in this call")
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cache", default=None, help="where tokens and teacher vectors are cached (default: --state)")
    ap.add_argument("--exclude", default=None,
                    help="a JSONL of pairs (e.g. the fusion dev set) whose docs and queries training must not see")
    ap.add_argument("--limit", type=int, default=0, help="use only this many pairs and passages (smoke tests)")
    ap.add_argument("--extra-corpus", action="append", default=[], metavar="DIR",
                    help="also train on the pairs and passages of DIR (repeatable; e.g. recipe/personal_corpus.py's "
                         "output, generated on the GPU machine); its sources join the sampler as they are")
    ap.add_argument("--extra-passages", type=int, default=0, metavar="N",
                    help="keep N of each --extra-corpus's passages, drawn with --seed (0: all)")
    ap.add_argument("--augment", action="store_true",
                    help="add title, summary and question pairs made from the training rows (recipe/augment_pairs.py)")
    ap.add_argument("--export-at-budget", action="store_true",
                    help="export when the time budget ends the call, even before the planned steps (runs that share "
                         "a GPU with others, where --fit-budget's estimate can be off)")
    ap.add_argument("--fit-budget", action="store_true",
                    help="on a fresh run, time the first 20 steps and lower --steps to what fits the time budget")
    ap.add_argument("--total-budget", type=float, default=0.0, metavar="SECONDS",
                    help="on a fresh run, time steps 20-40 and set --steps to what fits SECONDS of training in all, "
                         "over this and later calls that resume the state (the cosine schedule spans them all)")
    ap.add_argument("--wall-budget", type=float, default=0.0, metavar="SECONDS",
                    help="also stop training (then save and export) once this many seconds have passed since the "
                         "process started, data preparation included (a device call's limit; 0: no such limit)")
    ap.add_argument("--precision", choices=("bf16", "fp32"), default="bf16",
                    help="bf16: matrix products under bf16 autocast, norms, residuals and losses in float32 (default; "
                         "CUDA only, fp32 elsewhere); fp32: everything in float32 (TF32 products), the old step")
    ap.add_argument("--compile", choices=("dynamic", "static", "graphs", "off"), default="dynamic",
                    help="torch.compile the model's forward (CUDA only): one graph with symbolic batch and length "
                         "(dynamic, the default), one graph per shape (static), one per shape replayed as a CUDA "
                         "graph with the loss as one more (graphs: the fastest step, a compile per new shape), or "
                         "eager (off)")
    ap.add_argument("--buckets", type=int, default=3,
                    help="embed each batch as this many length buckets, each padded to its own longest text "
                         "(1: one batch padded to the longest, the old step)")
    args = ap.parse_args()
    t_start = time.time()
    torch.manual_seed(args.seed)  # the distillation head's init
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = torch.device(args.device)
    state = Path(args.state)
    state.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok = BPETokenizer.load(args.tokenizer)
    if args.init:  # checked before the data and the teacher, so a mismatch fails in seconds
        cfg, init = init_from_checkpoint(args, len(tok))
    else:
        cfg, init = fresh_config(args, len(tok)), None
    if args.warmup is None:
        args.warmup = 100 if args.init else 200

    # -- data: one table of unique texts; pairs and eval sets index into it ---------------------------
    data = prepare_data(args)
    texts, pair_q, pair_d, pair_src, pair_src_names = (data.texts, data.pair_q, data.pair_d, data.pair_src,
                                                       data.pair_src_names)
    passage_ids, eval_sets, tok_mat, tok_len, teach = (data.passage_ids, data.eval_sets, data.tok_mat, data.tok_len,
                                                       data.teach)

    tok_mat_t = torch.tensor(tok_mat, device=dev, dtype=torch.long)
    tok_len_t = torch.tensor(tok_len, device=dev, dtype=torch.long)
    teach_t = torch.tensor(teach, device=dev, dtype=torch.float32)
    join = LexiconJoin(args, texts, dev)

    # -- model ---------------------------------------------------------------------------------------------
    shapes = param_shapes(cfg)
    if init is None:
        init = EvermindLM(cfg, seed=args.seed).params
    model = MirrorLM(cfg.to_dict(), shapes, init).to(dev)
    head = torch.nn.Linear(args.d_model + join.dims, teach.shape[1], bias=False).to(dev)  # training-only, distillation
    params = list(model.parameters()) + list(head.parameters())
    words = None
    if args.token_distill:  # the teacher itself on the device, and a map from our channels to its (training-only)
        from token_distill import STUDENT_TOKENS, WordTeacher, word_loss

        with teacher_model_dir(args.teacher) as model_dir:
            words = WordTeacher(model_dir, texts, tok_mat, tok_len, tok, dev, Path(args.cache or args.state))
        word_head = torch.nn.Linear(cfg.d_model, words.dims, bias=False).to(dev)
        params += list(word_head.parameters())
        word_states = model.token_states
        if args.compile != "off" and dev.type == "cuda":
            word_states = torch.compile(model.token_states, dynamic=False)  # lengths rounded to 16: a few shapes
    # the fused kernel: one launch for every tensor's update (the step is launch-bound: 48.8 -> 35.5 ms, H100)
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01, fused=dev.type == "cuda")
    step = 0
    history: list[dict] = []
    st_file = state / "train_state.pt.npz"
    if st_file.exists():
        z = np.load(st_file, allow_pickle=False)
        with torch.no_grad():
            for i, p in enumerate(params):
                p.copy_(torch.tensor(z[f"p{i}"], device=dev))
        for i, p in enumerate(params):
            opt.state[p] = {"step": torch.tensor(float(z["step"])), "exp_avg": torch.tensor(z[f"m{i}"], device=dev),
                            "exp_avg_sq": torch.tensor(z[f"v{i}"], device=dev)}
        step = int(z["step"])
        args.steps = int(z["planned_steps"])
        history = json.loads(str(z["history"]))
        print(f"resumed at step {step}" + (" (--init ignored: the state holds the weights)" if args.init else ""),
              flush=True)
    rng = np.random.default_rng(args.seed + step)

    def lr_at(s: int) -> float:
        warm = args.warmup
        if s < warm:
            return args.lr * (s + 1) / warm
        return args.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, (s - warm) / max(1, args.steps - warm))))

    embed = Embed(model, tok_mat_t, tok_len_t, tok_len, args, dev, join)

    def embed_ids(ids: np.ndarray) -> torch.Tensor:  # float32 (eval, head fit: uncompiled); unit with a lexicon
        v, ids_t = embed_bucketed(model.pooled, tok_mat_t, tok_len_t, ids, tok_len[ids], args.buckets)
        return join(F.normalize(v, dim=-1), ids_t) if join.dims else v

    @torch.no_grad()
    def embed_np(ids: np.ndarray) -> np.ndarray:
        out_v = []
        for i in range(0, len(ids), 2048):
            out_v.append(F.normalize(embed_ids(ids[i: i + 2048]), dim=-1).cpu().numpy())
        return np.concatenate(out_v)

    def teacher_np(ids: np.ndarray) -> np.ndarray:
        return teach[ids].astype(np.float32)

    if not any(h.get("teacher") for h in history):
        history.append({"teacher": evaluate(teacher_np, eval_sets)})
        print("teacher ndcg@10", history[-1]["teacher"], flush=True)
    if args.init and step == 0:
        fit_head(head, embed_ids, teach_t, np.concatenate([pair_q, pair_d, passage_ids]), rng)
        model.eval()
        history.append({"step": 0, "init": args.init, "eval": evaluate(embed_np, eval_sets)})
        model.train()
        print(f"step 0 (warm start from {args.init}) eval ndcg@10 {history[-1]['eval']}", flush=True)

    if args.teacher_pairs:
        t0 = time.time()
        nq, nd = mine_teacher_pairs(passage_ids, teach_t, args.teacher_pairs)
        pair_q, pair_d = np.concatenate([pair_q, nq]), np.concatenate([pair_d, nd])
        pair_src = np.concatenate([pair_src, np.full(len(nq), len(pair_src_names))])
        pair_src_names.append("teacher-nn")
        print(f"mined {len(nq)} teacher-nn pairs from {len(np.unique(passage_ids))} passages in "
              f"{time.time() - t0:.1f}s", flush=True)

    hard_neg = None
    if args.hard_negatives:
        t0 = time.time()
        hard_neg = mine_hard_negatives(pair_q, pair_d, teach_t, args.hard_negatives)
        print(f"mined hard negatives in {time.time() - t0:.1f}s: {(hard_neg >= 0).mean(axis=1).mean():.3f} of "
              f"{args.hard_negatives} slots filled", flush=True)

    n_src = len(pair_src_names)
    src_rows = [np.flatnonzero(pair_src == s) for s in range(n_src)]
    src_w = np.array([math.sqrt(len(r)) for r in src_rows])
    src_w /= src_w.sum()
    src_concat = np.concatenate(src_rows)
    src_start = np.cumsum([0] + [len(r) for r in src_rows])[:-1]
    src_size = np.array([len(r) for r in src_rows])
    focus_cdf = None

    def draw_rows(srcs: np.ndarray) -> np.ndarray:
        """One pair row of each chosen source: uniform, or by the lexical-focus weights (source k's cumulative
        weights run over (k, k + 1], so one search draws inside the chosen source)."""
        if focus_cdf is None:
            return src_concat[src_start[srcs] + (rng.random(len(srcs)) * src_size[srcs]).astype(np.int64)]
        at = np.searchsorted(focus_cdf, srcs + rng.random(len(srcs)), side="right")
        return src_concat[np.minimum(at, src_start[srcs] + src_size[srcs] - 1)]

    if args.lexical_focus:
        missing = query_words_missing(texts, pair_q, pair_d)  # (P,)
        focus_cdf = segment_cdf(1.0 + args.lexical_focus * missing[src_concat], src_size)
        drawn = draw_rows(np.repeat(np.arange(n_src), 1000))
        print(f"lexical focus {args.lexical_focus}: share of query words missing from the doc {missing.mean():.3f} "
              f"over pairs, {missing[drawn].mean():.3f} as drawn (sources equal)", flush=True)
    B = args.batch
    model.train()
    t_train = time.time()
    def in_budget() -> bool:
        return time.time() - t_train < args.time_budget and not (args.wall_budget
                                                                 and time.time() - t_start >= args.wall_budget)

    while step < args.steps and in_budget():
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        srcs = rng.choice(n_src, size=B, p=src_w)
        rows = draw_rows(srcs)
        h_np = None
        if hard_neg is not None:
            h_np = hard_neg[rows, rng.integers(hard_neg.shape[1], size=B)]
            empty = h_np < 0  # no negative survived the filter: a random pair doc instead
            h_np[empty] = pair_d[rng.integers(len(pair_d), size=int(empty.sum()))]
        p_np = passage_ids[rng.integers(len(passage_ids), size=B)]
        try:
            loss, parts = step_loss(embed, head, teach_t, pair_q[rows], pair_d[rows], p_np, h_np, args)
        except Exception as exc:  # a compiler failure shows at the first steps: train on, uncompiled
            if not embed.uncompile():
                raise
            print(f"torch.compile failed ({type(exc).__name__}: {str(exc)[:300]}); continuing uncompiled", flush=True)
            loss, parts = step_loss(embed, head, teach_t, pair_q[rows], pair_d[rows], p_np, h_np, args)
        l_con, l_dis, l_sim, l_kd = parts
        l_words = torch.zeros((), device=dev)
        if words is not None:
            half = args.token_batch // 2
            w_ids = np.concatenate([pair_q[rows][:half], pair_d[rows][:half]])
            t_means, t_counts, s_word = words.targets(w_ids)
            width = min(STUDENT_TOKENS, -(-int(tok_len[w_ids].max()) // 16) * 16)
            (w_ids_t,) = to_device([w_ids], dev)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.precision == "bf16" and dev.type == "cuda"):
                states, _ = word_states(tok_mat_t[w_ids_t, :width], tok_len_t[w_ids_t].clamp(max=width))
            l_words = word_loss(states.float(), s_word[:, :width], t_means, t_counts, word_head.weight.T)
            loss = loss + args.token_distill * l_words
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if args.fit_budget and step == 20 and not st_file.exists():
            torch.cuda.synchronize() if dev.type == "cuda" else None
            per_step = (time.time() - t_train) / 20
            fits = 20 + int(0.92 * (args.time_budget - (time.time() - t_train)) / per_step)
            print(f"{per_step * 1000:.0f} ms/step: planning {min(args.steps, fits)} steps", flush=True)
            args.steps = min(args.steps, fits)
        if args.total_budget and not st_file.exists():  # steps 20-40 are past the compiles of the common shapes
            if step == 20:
                torch.cuda.synchronize() if dev.type == "cuda" else None
                t20 = time.time()
            elif step == 40:
                torch.cuda.synchronize() if dev.type == "cuda" else None
                per_step = (time.time() - t20) / 20
                used = time.time() - t_train
                fits = 40 + int(0.97 * (args.total_budget - used) / per_step)
                print(f"{per_step * 1000:.1f} ms/step: planning {min(args.steps, fits)} steps for "
                      f"{args.total_budget:.0f}s of training in all", flush=True)
                args.steps = min(args.steps, fits)
        if step % 100 == 0:
            rec = {"step": step, "loss": loss.item(), "contrastive": l_con.item(), "distill": l_dis.item(),
                   "simmat": l_sim.item(), "kd": l_kd.item(), "words": l_words.item(), "lr": lr_at(step),
                   "elapsed": round(time.time() - t_start, 1)}
            history.append(rec)
            print(json.dumps(rec), flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            model.eval()
            ev = evaluate(embed_np, eval_sets)
            model.train()
            history.append({"step": step, "eval": ev})
            print(f"step {step} eval ndcg@10 {ev}", flush=True)

    # -- save resumable state, then export ---------------------------------------------------------------
    arrays = {"step": np.array(step), "planned_steps": np.array(args.steps), "history": np.array(json.dumps(history))}
    for i, p in enumerate(params):
        arrays[f"p{i}"] = p.detach().cpu().numpy()
        stt = opt.state.get(p, {})
        arrays[f"m{i}"] = stt["exp_avg"].cpu().numpy() if "exp_avg" in stt else np.zeros(p.shape, np.float32)
        arrays[f"v{i}"] = stt["exp_avg_sq"].cpu().numpy() if "exp_avg_sq" in stt else np.zeros(p.shape, np.float32)
    np.savez(state / "train_state.tmp.npz", **arrays)
    os.replace(state / "train_state.tmp.npz", st_file)
    print(f"saved state at step {step}", flush=True)
    if step >= args.steps or args.export_at_budget:
        if step < args.steps:
            print(f"exporting at step {step} of {args.steps} planned (time budget)", flush=True)
            history.append({"cut_at_step": step, "planned_steps": args.steps})
        export(model, cfg, tok, args, history, out)


@dataclass
class TrainingData:
    """What a run trains and evaluates on: one table of unique texts, and pairs, passages and eval sets as indexes into
    it, with each text's tokens and teacher vector (cached per machine under --cache)."""

    texts: list[str]
    pair_q: np.ndarray  # (P,) text ids of the pairs' queries
    pair_d: np.ndarray  # (P,) text ids of their docs
    pair_src: np.ndarray  # (P,) index into pair_src_names
    pair_src_names: list[str]
    passage_ids: np.ndarray  # (N,) text ids of the passages
    eval_sets: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]  # name -> (query ids, doc ids, gold column)
    tok_mat: np.ndarray  # (T, max_tokens) token ids, 0-padded
    tok_len: np.ndarray  # (T,) token counts
    teach: np.ndarray  # (T, 384) the teacher's unit vectors
    pair_person: np.ndarray  # (P,) the generator's person of a pair (personal_corpus.py), -1 where it names none
    pair_kind: np.ndarray  # (P,) the kind of fact it asks about, -1 where none


def prepare_data(args) -> TrainingData:
    """Read the corpus (--corpus, --exclude, --extra-corpus, --limit, --augment), tokenise every text and compute its
    teacher vector, both cached; shared by every trainer that learns from the teacher (the embedder, a reranker)."""
    corpus = Path(args.corpus)
    pairs = read_jsonl(corpus / "pairs.jsonl")
    passages = [] if getattr(args, "no_passages", False) else read_jsonl(corpus / "passages.jsonl")
    if args.exclude:
        held = {t for row in read_jsonl(Path(args.exclude)) for t in (row["query"], row["doc"])}
        before = len(pairs)
        pairs = [p for p in pairs if p["query"] not in held and p["doc"] not in held]
        passages = [p for p in passages if p["text"] not in held]
        print(f"excluded {before - len(pairs)} pairs held out by {args.exclude}", flush=True)
    for n_extra, extra in enumerate(args.extra_corpus, 1):
        more_pairs = read_jsonl(Path(extra) / "pairs.jsonl")
        for row in more_pairs:  # a person's number is its corpus's own
            if "person" in row:
                row["person"] = f"{n_extra}:{row['person']}"
        more_passages = [] if getattr(args, "no_passages", False) else read_jsonl(Path(extra) / "passages.jsonl")
        if args.extra_passages and len(more_passages) > args.extra_passages:
            keep = np.random.default_rng(args.seed).choice(len(more_passages), args.extra_passages, replace=False)
            more_passages = [more_passages[i] for i in sorted(keep)]
        pairs, passages = pairs + more_pairs, passages + more_passages
        print(f"added {len(more_pairs)} pairs and {len(more_passages)} passages of {extra}", flush=True)
    if args.limit:
        pairs, passages = pairs[: args.limit], passages[: args.limit]
    if args.augment:
        from augment_pairs import augment

        extra = augment(pairs, passages, seed=args.seed)
        pairs = pairs + extra
        kinds = {k: sum(r["source"] == k for r in extra) for k in sorted({r["source"] for r in extra})}
        print(f"augmented with {len(extra)} pairs: {kinds}", flush=True)
    eval_sets_raw = {p.stem: read_jsonl(p) for p in sorted((corpus / "eval").glob("*.jsonl"))}
    text_id: dict[str, int] = {}

    def tid(t: str) -> int:
        return text_id.setdefault(t, len(text_id))

    pair_q = np.array([tid(p["query"]) for p in pairs], dtype=np.int64)
    pair_d = np.array([tid(p["doc"]) for p in pairs], dtype=np.int64)
    pair_src_names = sorted({p["source"] for p in pairs})
    pair_src = np.array([pair_src_names.index(p["source"]) for p in pairs])
    passage_ids = np.array([tid(p["text"]) for p in passages], dtype=np.int64)
    people: dict[str, int] = {}
    kinds: dict[str, int] = {}
    pair_person = np.array([people.setdefault(str(p["person"]), len(people)) if "person" in p else -1 for p in pairs],
                           dtype=np.int64)
    pair_kind = np.array([kinds.setdefault(str(p["kind"]), len(kinds)) if "kind" in p else -1 for p in pairs],
                         dtype=np.int64)
    eval_sets = {}
    for name, rows in eval_sets_raw.items():
        docs = sorted({r["doc"] for r in rows})
        d_ids = np.array([tid(d) for d in docs])
        col = {d: i for i, d in enumerate(docs)}
        eval_sets[name] = (np.array([tid(r["query"]) for r in rows]), d_ids, np.array([col[r["doc"]] for r in rows]))
    texts = list(text_id)
    print(f"texts {len(texts)}  pairs {len(pairs)}  passages {len(passages)}  eval "
          f"{ {k: len(v[0]) for k, v in eval_sets.items()} }", flush=True)

    cache_dir = Path(args.cache or args.state)
    cache_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha1("\x00".join(texts).encode("utf-8")).hexdigest()[:12]  # the caches fit this text table only
    cache = cache_dir / f"tokens-{args.max_tokens}-{digest}.npz"
    if cache.exists():
        z = np.load(cache, allow_pickle=False)
        tok_mat, tok_len = z["mat"], z["len"]
        assert len(tok_len) == len(texts)
    else:
        t0 = time.time()
        tok_mat, tok_len = tokenise_all(texts, args.tokenizer, args.max_tokens)
        np.savez(cache, mat=tok_mat, len=tok_len)
        print(f"tokenised {len(texts)} texts in {time.time() - t0:.0f}s, mean length {tok_len.mean():.1f}", flush=True)
    tcache = cache_dir / f"teacher-{digest}.npy"
    if tcache.exists():
        teach = np.load(tcache, allow_pickle=False)
    else:
        t0 = time.time()
        teach = teacher_vectors(texts, args.teacher, args.device)
        np.save(tcache, teach)
        print(f"teacher vectors for {len(texts)} texts in {time.time() - t0:.0f}s", flush=True)

    return TrainingData(texts, pair_q, pair_d, pair_src, pair_src_names, passage_ids, eval_sets, tok_mat, tok_len,
                        teach, pair_person, pair_kind)


class Embed:
    """The training step's embedding of text ids: bucketed by length, bf16 products under autocast and a compiled
    forward (CUDA), normalised float32 vectors out. `--precision fp32 --no-compile --buckets 1` is the old step."""

    def __init__(self, model: MirrorLM, tok_mat_t: torch.Tensor, tok_len_t: torch.Tensor, tok_len: np.ndarray,
                 args, dev: torch.device, join: LexiconJoin | None = None) -> None:
        self.cuda = dev.type == "cuda"
        self.amp = args.precision == "bf16" and self.cuda
        self.model, self.pooled, self.loss_tail = model, model.pooled, loss_tail
        if args.compile != "off" and self.cuda:
            import torch._dynamo

            torch._dynamo.config.cache_size_limit = 64  # static: one graph per (rows, padded length) of the buckets
            # graphs: static shapes, each replayed as a CUDA graph (no launch overhead), and the loss over the step's
            # vectors, whose shapes are the same at every step, one graph too
            mode = "reduce-overhead" if args.compile == "graphs" else None
            self.pooled = torch.compile(model.pooled, dynamic=args.compile == "dynamic", mode=mode)
            if args.compile == "graphs":
                self.loss_tail = torch.compile(loss_tail, dynamic=False, mode=mode)
        self.tok_mat_t, self.tok_len_t, self.tok_len = tok_mat_t, tok_len_t, tok_len
        self.buckets, self.dev, self.join = args.buckets, dev, join

    def uncompile(self) -> bool:
        """Go back to the eager forward and loss (a compiler failure); False when they were eager already."""
        if self.pooled is self.model.pooled and self.loss_tail is loss_tail:
            return False
        self.pooled, self.loss_tail = self.model.pooled, loss_tail
        return True

    def __call__(self, ids: np.ndarray) -> torch.Tensor:
        """(B, C) unit vectors of the texts `ids` (host array of text ids); (B, C + D) joined with a lexicon."""
        return self.vectors(ids)[0]

    def vectors(self, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """As calling it, and `ids` on the device (copied once, without waiting for the device)."""
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.amp):
            v, ids_t = embed_bucketed(self.pooled, self.tok_mat_t, self.tok_len_t, ids, self.tok_len[ids],
                                      self.buckets)
        v = F.normalize(v.float(), dim=-1)
        return (v if self.join is None else self.join(v, ids_t)), ids_t


class LexiconJoin:
    """The lexicon part of the shipped vector during training: each text's unit lexicon vector (fixed, computed once
    with lm.lexicon.Lexicon.embed_many and cached as float16 under --cache), joined to the model's unit vector as
    LMEmbedder joins them. Without --lexicon, dims is 0 and nothing is joined."""

    def __init__(self, args, texts: list[str], dev: torch.device) -> None:
        self.dims, self.weight = 0, float(args.lexicon_weight)
        if not args.lexicon:
            return
        from evermind_memory.lm.lexicon import Lexicon

        lex = Lexicon.load(args.lexicon)
        digest = hashlib.sha1(("\x00".join(texts) + lex.digest()).encode("utf-8")).hexdigest()[:12]
        path = Path(args.cache or args.state) / f"lexicon-{digest}.npy"
        if path.exists():
            vecs = np.load(path, allow_pickle=False)
        else:
            t0 = time.time()
            vecs = lexicon_vectors(texts, args.lexicon)  # (T, D)
            np.save(path, vecs)
            print(f"lexicon vectors for {len(texts)} texts in {time.time() - t0:.0f}s "
                  f"({(np.abs(vecs).sum(1) == 0).mean():.3f} without a known word)", flush=True)
        self.vecs = torch.tensor(vecs, device=dev)  # (T, D) float16
        self.dims = vecs.shape[1]
        print(f"training beside the lexicon {args.lexicon} ({lex!r}) at weight {self.weight}", flush=True)

    def __call__(self, v: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """(B, C + D): [v, weight x lexicon vector] normalised; v (B, C) unit model vectors (v itself without a
        lexicon)."""
        if not self.dims:
            return v
        lex = self.vecs[ids].float() * self.weight
        return F.normalize(torch.cat([v, lex], dim=-1), dim=-1)


def step_loss(embed: Embed, head: torch.nn.Linear, teach_t: torch.Tensor, q_np: np.ndarray, d_np: np.ndarray,
              p_np: np.ndarray, h_np: np.ndarray | None, args):
    """The recipe's loss for one batch: query->doc InfoNCE (both directions; over hard negatives too when h_np is
    given), the teacher-vector head, the passages' similarity matrix against the teacher's and, with --kd-weight,
    in-batch ranking distillation. Returns (loss, (contrastive, distill, simmat, kd))."""
    groups = [q_np, d_np, p_np] + ([] if h_np is None else [h_np])
    ids = np.concatenate(groups)
    # every text of the step in one call: its length buckets span queries, docs and passages alike (fewer,
    # fuller forward passes: the step's cost is mostly kernel launches, not arithmetic)
    vecs, ids_t = embed.vectors(ids)
    return embed.loss_tail(vecs, ids_t, teach_t, head.weight, len(q_np), h_np is not None,
                           args.tau, args.kd_tau or args.tau, float(args.kd_weight), float(args.distill_weight),
                           float(args.simmat_weight))


def loss_tail(vecs: torch.Tensor, ids: torch.Tensor, teach_t: torch.Tensor, head_w: torch.Tensor, B: int,
              negatives: bool, tau: float, kd_tau: float, kd_weight: float, distill_weight: float,
              simmat_weight: float):
    """step_loss over the step's vectors: vecs (nB, C') are the unit vectors of ids (nB,), queries, docs, passages
    and (with `negatives`) hard negatives, B rows each; head_w (T, C') the distillation head."""
    eq, ed, p_vec = vecs[:B], vecs[B:2 * B], vecs[2 * B:3 * B]
    q_ids, d_ids, p_ids = ids[:B], ids[B:2 * B], ids[2 * B:3 * B]
    col_ids, e_cols = d_ids, ed  # the docs each query is scored against: the batch's, then hard negatives
    if negatives:
        col_ids, e_cols = torch.cat([d_ids, ids[3 * B:]]), torch.cat([ed, vecs[3 * B:]])
    sim = eq @ e_cols.T / tau  # (B, B) or (B, 2B)
    same = col_ids[None, :] == d_ids[:, None]
    diag = torch.eye(B, sim.shape[1], dtype=torch.bool, device=sim.device)
    sim = sim.masked_fill(same & ~diag, -1e4)  # duplicate docs (and negatives equal to a row's positive)
    target = torch.arange(B, device=sim.device)
    l_con = 0.5 * (F.cross_entropy(sim, target) + F.cross_entropy(sim[:, :B].T, target))
    if kd_weight > 0:  # the teacher's ranking of the same columns as soft targets
        t_sim = (teach_t[q_ids] @ teach_t[col_ids].T) / kd_tau  # (B, B) or (B, 2B)
        t_sim = t_sim.masked_fill(same & ~diag, -1e4)
        l_kd = F.kl_div(F.log_softmax(sim, dim=-1), F.log_softmax(t_sim, dim=-1), log_target=True,
                        reduction="batchmean")
    else:
        l_kd = torch.zeros((), device=sim.device)
    all_ids = torch.cat([q_ids, col_ids, p_ids])
    pooled_all = torch.cat([eq, e_cols, p_vec])
    t_all = teach_t[all_ids]
    h_all = F.normalize(pooled_all @ head_w.T, dim=-1)
    l_dis = (1 - (h_all * t_all).sum(-1)).mean()
    s_sub = p_vec @ p_vec.T
    t_sub = t_all[-B:] @ t_all[-B:].T
    l_sim = F.mse_loss(s_sub, t_sub)
    loss = l_con + distill_weight * l_dis + simmat_weight * l_sim + kd_weight * l_kd
    return loss, (l_con, l_dis, l_sim, l_kd)


ARCH_ARGS = {  # LMConfig field -> (argparse dest, default without --init)
    "d_model": ("d_model", 128), "n_layers": ("n_layers", 4), "conv_kernel": ("conv_kernel", 4),
    "hidden_dim": ("hidden", None), "n_experts": ("experts", 4), "top_k": ("top_k", 2), "attn_heads": ("attn_heads", 4),
}


def query_words_missing(texts: list[str], pair_q: np.ndarray, pair_d: np.ndarray) -> np.ndarray:
    """Per pair (P,): the share of the query's distinct words (lower-cased runs of 3+ letters or digits) that its
    doc does not contain; 0 when the query has no such word."""
    import re

    word = re.compile(r"[0-9a-z]{3,}")
    sets: dict[int, set[str]] = {}

    def words(i: int) -> set[str]:
        if i not in sets:
            sets[i] = set(word.findall(texts[i].lower()))
        return sets[i]

    out = np.zeros(len(pair_q), dtype=np.float64)
    for n, (q, d) in enumerate(zip(pair_q.tolist(), pair_d.tolist())):
        qw = words(q)
        if qw:
            out[n] = len(qw - words(d)) / len(qw)
    return out


def segment_cdf(weights: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Cumulative weights of consecutive segments (sizes), each scaled to (k, k + 1] for segment k."""
    seg = np.repeat(np.arange(len(sizes)), sizes)  # (N,)
    cum = np.cumsum(weights)
    starts = np.cumsum(np.concatenate([[0], sizes]))[:-1]
    before = np.concatenate([[0.0], cum])[starts]  # (S,) total weight before each segment
    total = np.add.reduceat(weights, starts) if len(weights) else np.zeros(0)  # (S,)
    return seg + (cum - before[seg]) / total[seg]


def fresh_config(args, vocab_size: int) -> LMConfig:
    """The architecture from the flags (defaults as before --init existed); fills args in place for the log."""
    if args.hidden == 0:  # the old spelling of "2 x d-model"
        args.hidden = None
    for field, (dest, default) in ARCH_ARGS.items():
        if getattr(args, dest) is None:
            setattr(args, dest, 2 * args.d_model if field == "hidden_dim" else default)
    return LMConfig(vocab_size=vocab_size, **{f: getattr(args, d) for f, (d, _) in ARCH_ARGS.items()})


def init_from_checkpoint(args, vocab_size: int) -> tuple[LMConfig, dict[str, np.ndarray]]:
    """Config and weights of --init (the inverse of export); flags left unset take the checkpoint's values.

    Raises SystemExit when an architecture flag or the tokenizer's vocabulary disagrees with the checkpoint.
    """
    from evermind_memory.lm.model import load_model

    cfg, params = load_model(args.init)  # fp16 on disk, float32 here
    if args.hidden == 0:
        args.hidden = None
    ck = cfg.to_dict()
    clash = [f"--{dest.replace('_', '-')} {getattr(args, dest)} (checkpoint {field}={ck[field]})"
             for field, (dest, _) in ARCH_ARGS.items() if getattr(args, dest) not in (None, ck[field])]
    if clash:
        raise SystemExit(f"--init {args.init}: architecture flags disagree with the checkpoint: {'; '.join(clash)}. "
                         "Leave them out to take the checkpoint's.")
    if vocab_size != cfg.vocab_size:
        raise SystemExit(f"--init {args.init}: the tokenizer has {vocab_size} tokens, the checkpoint "
                         f"{cfg.vocab_size}; pass the tokenizer the checkpoint was trained with.")
    for field, (dest, _) in ARCH_ARGS.items():
        setattr(args, dest, ck[field])
    print(f"warm start from {args.init}: {ck}", flush=True)
    return cfg, params


@torch.no_grad()
def fit_head(head: torch.nn.Linear, embed_ids, teach_t: torch.Tensor, ids: np.ndarray, rng,
             n: int = 16384, ridge: float = 1e-2) -> None:
    """Set the distillation head to the ridge least-squares map from normalised embeddings to teacher vectors
    on a sample of texts, so a warm start does not push a random head's gradients into trained weights."""
    ids = np.unique(ids)
    ids = rng.choice(ids, size=min(n, len(ids)), replace=False)
    x = torch.cat([F.normalize(embed_ids(ids[i: i + 2048]), dim=-1)
                   for i in range(0, len(ids), 2048)]).double()  # (n, C)
    t = teach_t[torch.tensor(ids, device=teach_t.device)].double()  # (n, D)
    gram = x.T @ x + ridge * torch.eye(x.shape[1], dtype=x.dtype, device=x.device)  # (C, C)
    w = torch.linalg.solve(gram, x.T @ t)  # (C, D)
    head.weight.copy_(w.T.to(head.weight.dtype))
    cos = F.cosine_similarity((x @ w).float(), t.float(), dim=-1).mean()
    print(f"distillation head fitted on {len(ids)} texts: mean cos to teacher {float(cos):.3f}", flush=True)


@torch.no_grad()
def mine_teacher_pairs(passage_ids: np.ndarray, teach_t: torch.Tensor, min_cos: float, max_cos: float = 0.92,
                       chunk: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Each passage with its nearest other passage by teacher cosine, kept where min_cos <= cosine < max_cos
    (above max_cos the two are near-copies and teach nothing). Returns (query ids, doc ids), text ids."""
    ids = np.unique(passage_ids)
    t_all = teach_t[torch.tensor(ids, device=teach_t.device)]  # (P, 384), unit rows
    qs, ds = [], []
    for i in range(0, len(ids), chunk):
        sim = t_all[i: i + chunk] @ t_all.T  # (b, P)
        sim[sim >= max_cos] = -1.0  # itself (1.0) and near-copies
        score, col = sim.max(dim=1)
        keep = (score >= min_cos).cpu().numpy()
        qs.append(ids[i: i + chunk][keep])
        ds.append(ids[col.cpu().numpy()][keep])
    return np.concatenate(qs), np.concatenate(ds)


def mine_hard_negatives(pair_q: np.ndarray, pair_d: np.ndarray, teach_t: torch.Tensor, k: int,
                        keep_below: float = 0.95, chunk: int = 2048, rank_t: torch.Tensor | None = None) -> np.ndarray:
    """Per pair, up to k text ids of pair docs nearest to the query by teacher cosine (or by rank_t's, another model's
    unit vectors of the same texts: the negatives that model ranks high), excluding any doc paired with that query
    and any doc the teacher scores >= keep_below x the positive's score (likely unlabelled positives).

    Returns (P, k) int64, -1 where fewer than k survive.
    """
    rank_t = teach_t if rank_t is None else rank_t
    docs = np.unique(pair_d)  # (D,)
    docs_t = torch.tensor(docs, device=teach_t.device)
    t_docs, r_docs = teach_t[docs_t], rank_t[docs_t]  # (D, 384), (D, C)
    pair_keys = np.unique(pair_q * (int(pair_d.max()) + 1) + pair_d)
    m = min(len(docs), 8 * k + 64)  # candidates before filtering (the filter drops about half of the nearest 32)
    out = np.full((len(pair_q), k), -1, dtype=np.int64)
    for i in range(0, len(pair_q), chunk):
        q = torch.tensor(pair_q[i: i + chunk], device=teach_t.device)
        d = torch.tensor(pair_d[i: i + chunk], device=teach_t.device)
        tq = teach_t[q]  # (b, 384)
        pos = (tq * teach_t[d]).sum(-1)  # (b,)
        col = torch.topk(rank_t[q] @ r_docs.T, m, dim=1).indices  # (b, m)
        score = (tq[:, None, :] * t_docs[col]).sum(-1)  # (b, m) the teacher's cosines of the candidates
        cand = docs[col.cpu().numpy()]  # (b, m) text ids
        bad = np.isin(pair_q[i: i + chunk, None] * (int(pair_d.max()) + 1) + cand, pair_keys)
        bad |= (score >= keep_below * pos[:, None]).cpu().numpy()
        order = np.argsort(bad, axis=1, kind="stable")[:, :k]  # surviving candidates first, nearest first
        kept = np.take_along_axis(cand, order, axis=1)
        kept[np.take_along_axis(bad, order, axis=1)] = -1
        out[i: i + chunk, : kept.shape[1]] = kept
    return out


def export(model: MirrorLM, cfg, tok: BPETokenizer, args, history: list[dict], out: Path) -> None:
    """Write the fp16 checkpoint, the tokenizer, golden vectors (mirror on CPU, fp32) and the training log."""
    from evermind_memory.lm.model import load_model, save_model

    params = model.to_numpy_params()
    save_model(out / "model.evlm", cfg, params, fp16=True)
    tok.save(out / "tokenizer.json")
    _, stored = load_model(out / "model.evlm")  # the fp16-rounded weights users will load
    cpu = MirrorLM(cfg.to_dict(), param_shapes(cfg), stored).eval()
    torch.backends.cuda.matmul.allow_tf32 = False
    ids = [tok.encode(t)[: args.max_tokens] for t in GOLDEN_TEXTS]
    T = max(len(i) for i in ids)
    mat = torch.zeros((len(ids), T), dtype=torch.long)
    for i, row in enumerate(ids):
        mat[i, : len(row)] = torch.tensor(row)
    with torch.no_grad():
        vec = cpu.embed(mat, torch.tensor([len(r) for r in ids]))
    golden = {"texts": GOLDEN_TEXTS, "max_tokens": args.max_tokens, "vectors": vec.numpy().astype(float).tolist()}
    (out / "golden_embeddings.json").write_text(json.dumps(golden))
    (out / "train_log.json").write_text(json.dumps({"config": cfg.to_dict(), "args": vars(args),
                                                    "history": history}, indent=1))
    print(f"exported to {out}", flush=True)


if __name__ == "__main__":
    main()
