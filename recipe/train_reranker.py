"""Train a reranker on a GPU: EvermindLM reads "question <sep> memory" and scores it (issue 36).

    python recipe/train_reranker.py --corpus corpus --tokenizer evermind_memory/models/tokenizer.json \
        --teacher teacher --init evermind_memory/models/model.evlm --layers 2 --cache /tmp/cache \
        --out runs/rerank [--extra-corpus DIR --extra-passages N] [--negatives 7] [--time-budget 480]

The reranker starts from the embedder's embedding table, its first --layers layers and its pooling block (the
quiet-machine cost of 30 candidates on 2 cores: 14 ms with two layers at C=256, 26 ms with all four:
benchmarks/rerank_speed.py); a linear head on the pooled vector gives a correction. With --residual-tau T (the
default) a candidate's score is the frozen embedder's cosine / T plus that correction, so the untrained reranker
(head zero) orders candidates exactly as the embedder does and training only has to learn where it is wrong; with
--residual-tau 0 the head's output alone is the score (a plain cross-encoder: after 5,000 steps it reranked the
debian eval set to 0.30 ndcg@10 from the embedder's 0.84). The separator is the tokenizer's BOS id, which no text
contains mid-sequence. Each training row is one question with its positive and --negatives hard negatives: by
default the ones the embedder ranks highest (what the store will hand the reranker), with likely unlabelled
positives (teacher cosine >= 0.95 x the positive's) dropped; `--mine teacher` ranks by the teacher instead;
`--labelled L` takes up to L of them from the personal corpus's labels first (the same person's facts of other
kinds, which are surely not the answer). The loss
is the listwise cross-entropy of the positive plus --kd-weight x the KL divergence from the teacher's softmax over
the same list (cosines / --kd-tau). The data (texts, tokens, teacher vectors, with their caches) is
train_embedder.prepare_data's, without passages unless --passages (a reranker reads only pairs). The eval reranks
the embedder's top --eval-pool on the corpus's eval sets and reports ndcg@10 of both orders. Exports
`reranker.evlm` (our checkpoint format) and `reranker.json` (the head, the separator, the layer count, the residual
temperature and the eval), no pickles. A dev-time tool: needs torch and sentence-transformers.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mirror import MirrorLM, to_device  # noqa: E402
from train_embedder import mine_hard_negatives, ndcg_at_10, prepare_data, tokenise_all  # noqa: E402

from evermind_memory.lm.model import LMConfig, load_model, param_shapes, save_model  # noqa: E402
from evermind_memory.lm.tokenizer import BPETokenizer  # noqa: E402

RERANKER_FORMAT = "evermind-reranker 1"


def truncate_layers(cfg: LMConfig, params: dict[str, np.ndarray], layers: int) -> tuple[LMConfig, dict]:
    """The embedder's first `layers` layers with its embedding table and pooling block."""
    if not 1 <= layers <= cfg.n_layers:
        raise SystemExit(f"--layers must be 1..{cfg.n_layers} (the embedder's depth), got {layers}")
    new = LMConfig(**{**cfg.to_dict(), "n_layers": layers})
    return new, {name: params[name] for name in param_shapes(new)}


def join_pairs(tok_mat: torch.Tensor, tok_len: torch.Tensor, q: torch.Tensor, d: torch.Tensor, sep: int,
               q_max: int, d_max: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows "question <sep> doc" for text ids q and d (both (B,)), the question cut at q_max tokens and the doc
    at d_max, padded with 0 after the doc. Returns (tokens (B, q_max + 1 + d_max), lengths (B,))."""
    lq = torch.clamp(tok_len[q], max=q_max)  # (B,)
    ld = torch.clamp(tok_len[d], max=d_max)
    width = q_max + 1 + d_max
    j = torch.arange(width, device=q.device)[None, :]  # (1, W)
    q_tok = tok_mat[q][:, :q_max]  # (B, q_max)
    d_tok = tok_mat[d][:, :d_max]
    from_q = q_tok.gather(1, torch.clamp(j, max=q_max - 1).expand(len(q), -1))
    from_d = d_tok.gather(1, torch.clamp(j - lq[:, None] - 1, min=0, max=d_max - 1))
    lengths = lq + 1 + ld
    rows = torch.where(j < lq[:, None], from_q, torch.where(j == lq[:, None], torch.full_like(from_q, sep), from_d))
    rows = torch.where(j < lengths[:, None], rows, torch.zeros_like(rows))
    return rows, lengths


def labelled_negatives(pair_d: np.ndarray, person: np.ndarray, kind: np.ndarray, k: int,
                       rng: np.random.Generator) -> np.ndarray:
    """Per pair, up to k docs of the same person's pairs about another kind of fact, drawn at random: negatives the
    generator's labels say are not the answer (a fact about "the user" that a teacher scores high is often a second
    answer, so mined negatives of personal text are unsure). (P, k) int64, -1 where fewer exist or the pair names no
    person. Data preparation: one pass over the labelled pairs."""
    out = np.full((len(pair_d), k), -1, dtype=np.int64)
    labelled = np.flatnonzero(person >= 0)
    order = labelled[np.argsort(person[labelled], kind="stable")]
    starts = np.flatnonzero(np.r_[True, person[order][1:] != person[order][:-1]])
    for rows in np.split(order, starts[1:]):  # one person's pairs
        for i in rows:
            other = np.unique(pair_d[rows[(kind[rows] != kind[i]) & (pair_d[rows] != pair_d[i])]])
            pick = rng.permutation(other)[:k]
            out[i, : len(pick)] = pick
    return out


def merge_negatives(first: np.ndarray, then: np.ndarray) -> np.ndarray:
    """(P, K): each row's ids of `first` (P, L <= K), then those of `then` (P, K) not already taken, -1 after them."""
    k = then.shape[1]
    out = then.copy()
    for i in np.flatnonzero((first >= 0).any(axis=1)):  # rows without a labelled one keep `then` as it is
        out[i] = -1
        taken = list(dict.fromkeys(int(x) for x in np.concatenate([first[i], then[i]]) if x >= 0))[:k]
        out[i, : len(taken)] = taken
    return out


class Reranker(torch.nn.Module):
    """The truncated backbone and pooling block (MirrorLM) plus a linear score."""

    def __init__(self, cfg: LMConfig, params: dict[str, np.ndarray], cross_layers: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        self.lm = MirrorLM(cfg.to_dict(), param_shapes(cfg), params)
        # --cross-layers: bidirectional attention layers over the joined sequence, between the trunk and a mean
        # pool, so question and memory attend to each other (the trunk is convolutional and the pooling block has
        # one attention layer). A training experiment: the numpy model has no such layers, so it exports nothing.
        self.cross = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(cfg.d_model, 4, 2 * cfg.d_model, dropout=0.0, batch_first=True,
                                             norm_first=True) for _ in range(cross_layers))
        self.head = torch.nn.Linear(cfg.d_model, 1)
        torch.nn.init.zeros_(self.head.weight)  # every candidate starts level; the first steps set the direction
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor, trim: bool = True) -> torch.Tensor:
        """The head's score of each row "question <sep> doc" (B,): the correction to the embedder's cosine / tau.
        trim cuts the rows to the longest one (a device sync and a new shape a step); False keeps the full width, as a
        CUDA graph needs."""
        if trim:
            tokens = tokens[:, :int(lengths.max())]
        if not len(self.cross):
            v = F.normalize(self.lm.pooled(tokens, lengths), dim=-1)
            return self.head(v).squeeze(-1)  # (B,)
        h = self.lm.hidden(tokens)  # (B, T, C)
        real = torch.arange(h.shape[1], device=h.device)[None, :] < lengths[:, None]  # (B, T)
        for layer in self.cross:
            h = layer(h, src_key_padding_mask=~real)
        m = real[..., None].to(h.dtype)
        v = F.normalize((h * m).sum(dim=1) / lengths[:, None].to(h.dtype), dim=-1)  # (B, C)
        return self.head(v).squeeze(-1)  # (B,)


def list_loss(model: Reranker, tok_mat: torch.Tensor, tok_len: torch.Tensor, emb: torch.Tensor, teach: torch.Tensor,
              q: torch.Tensor, d: torch.Tensor, sep: int, batch: int, k1: int, q_max: int, d_max: int,
              residual_tau: float, kd_tau: float, kd_weight: float, trim: bool = True):
    """One step's loss over `batch` lists of k1 candidates (q, d: (batch * k1,) text ids, each list's positive
    first): the listwise cross-entropy of the positive plus kd_weight x the KL divergence from the teacher's softmax
    over the same list. Returns (loss, cross-entropy, KL, scores (batch, k1)). Static shapes when trim is False
    (`--compile graphs` captures the whole of it)."""
    tokens, lengths = join_pairs(tok_mat, tok_len, q, d, sep, q_max, d_max)
    scores = model(tokens, lengths, trim).float().view(batch, k1)  # (B, K1), the positive first
    if residual_tau:
        scores = scores + (emb[q] * emb[d]).sum(-1).view(batch, k1) / residual_tau
    target = torch.zeros(batch, dtype=torch.long, device=scores.device)
    loss_ce = F.cross_entropy(scores, target)
    t_scores = (teach[q] * teach[d]).sum(-1).view(batch, k1) / kd_tau
    loss_kd = F.kl_div(F.log_softmax(scores, -1), F.log_softmax(t_scores, -1), log_target=True, reduction="batchmean")
    return loss_ce + kd_weight * loss_kd, loss_ce, loss_kd, scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--teacher", required=True)
    ap.add_argument("--init", required=True, help="the embedder checkpoint the reranker starts from")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cache", default=None, help="tokens and teacher vectors (train_embedder's cache)")
    ap.add_argument("--state", default="/tmp/reranker_state", help="where the cache goes when --cache is not given")
    ap.add_argument("--exclude", default=None)
    ap.add_argument("--extra-corpus", action="append", default=[], metavar="DIR")
    ap.add_argument("--extra-passages", type=int, default=0)
    ap.add_argument("--augment", action="store_true")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--q-tokens", type=int, default=32, help="question tokens kept")
    ap.add_argument("--d-tokens", type=int, default=64, help="memory tokens kept")
    ap.add_argument("--negatives", type=int, default=7, help="hard negatives per question")
    ap.add_argument("--batch", type=int, default=64, help="questions a step (each with 1 + negatives candidates)")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--kd-weight", type=float, default=1.0)
    ap.add_argument("--kd-tau", type=float, default=0.05)
    ap.add_argument("--eval-pool", type=int, default=30, help="the embedder's top N that the eval reranks")
    ap.add_argument("--time-budget", type=float, default=480.0, help="seconds of training (after data and eval)")
    ap.add_argument("--wall-budget", type=float, default=0.0,
                    help="stop training this many seconds after the start, data preparation included (0: no limit)")
    ap.add_argument("--residual-tau", type=float, default=0.05,
                    help="score = embedder cosine / this + the head's correction (0: the head alone)")
    ap.add_argument("--mine", choices=("embedder", "teacher"), default="embedder",
                    help="whose ranking picks the hard negatives")
    ap.add_argument("--labelled", type=int, default=0, metavar="L",
                    help="up to L of each question's negatives from the generator's labels: the same person's "
                         "facts of other kinds (personal_corpus.py), the rest mined as --mine says")
    ap.add_argument("--passages", action="store_true", help="read the corpus passages too (only pairs are used)")
    ap.add_argument("--cross-layers", type=int, default=0,
                    help="an experiment: this many bidirectional attention layers over the joined sequence (not "
                         "exported: the numpy model has none)")
    ap.add_argument("--eval-personal", action="store_true",
                    help="also rerank on the personal dev protocol and its validation set (benchmarks/personal_data)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--compile", choices=("off", "graphs"), default="off",
                    help="graphs: the step's loss compiled at the full list width and replayed as CUDA graphs")
    args = ap.parse_args()
    args.no_passages = not args.passages
    t_start = time.time()
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    tok = BPETokenizer.load(args.tokenizer)
    full_cfg, full_params = load_model(args.init)
    cfg, params = truncate_layers(full_cfg, full_params, args.layers)
    data = prepare_data(args)
    if args.eval_personal:
        data.tok_mat, data.tok_len = add_personal_sets(data.eval_sets, data.tok_mat, data.tok_len, args.tokenizer)
    tok_mat = torch.tensor(data.tok_mat, device=dev, dtype=torch.long)
    tok_len = torch.tensor(data.tok_len, device=dev, dtype=torch.long)
    teach = torch.tensor(data.teach, device=dev, dtype=torch.float32)
    t0 = time.time()
    emb = embed_all(full_cfg, full_params, tok_mat, tok_len, dev)  # (N, C) the frozen embedder's unit vectors
    print(f"embedder vectors for {len(emb)} texts in {time.time() - t0:.0f}s", flush=True)
    t0 = time.time()
    hard = mine_hard_negatives(data.pair_q, data.pair_d, teach, args.negatives,
                               rank_t=emb if args.mine == "embedder" else None)  # (P, K), -1 where none survived
    print(f"mined by the {args.mine} in {time.time() - t0:.0f}s", flush=True)
    if args.labelled:
        labelled = labelled_negatives(data.pair_d, data.pair_person, data.pair_kind, min(args.labelled, args.negatives),
                                      np.random.default_rng(args.seed))
        hard = merge_negatives(labelled, hard)
        print(f"labelled negatives: {(labelled >= 0).sum(axis=1).mean():.2f} a question on average "
              f"({(data.pair_person >= 0).mean():.3f} of questions name a person)", flush=True)
    usable = (hard >= 0).all(axis=1)
    pair_q, pair_d, hard = data.pair_q[usable], data.pair_d[usable], hard[usable]
    print(f"{len(pair_q)} questions with {args.negatives} hard negatives each ({(~usable).sum()} with fewer left out)",
          flush=True)
    if not len(pair_q):
        raise SystemExit("no question kept its hard negatives: a larger corpus (or fewer --negatives) is needed")

    model = Reranker(cfg, params, args.cross_layers).to(dev)
    amp = dev.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01, fused=amp)
    rng = np.random.default_rng(args.seed)
    sep, K1 = tok.bos_id, args.negatives + 1
    graphs = args.compile == "graphs" and amp
    # graphs: every step has the same shapes (the lists padded to the full width), so the whole loss is one compiled
    # forward and backward replayed as CUDA graphs (the embedder's --compile graphs)
    step_fn = torch.compile(list_loss, dynamic=False, mode="reduce-overhead") if graphs else list_loss

    def lr_at(s: int) -> float:
        if s < args.warmup:
            return args.lr * (s + 1) / args.warmup
        return args.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, (s - args.warmup) / max(1, args.steps - args.warmup))))

    history: list[dict] = [{"eval": evaluate(model, data, emb, tok_mat, tok_len, sep, args), "step": 0}]
    print(f"step 0 eval {history[-1]['eval']}", flush=True)
    step, t_train = 0, time.time()
    while (step < args.steps and time.time() - t_train < args.time_budget
           and not (args.wall_budget and time.time() - t_start >= args.wall_budget)):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        rows = rng.integers(len(pair_q), size=args.batch)
        q, d = to_device([np.repeat(pair_q[rows], K1),  # (B*K1,) each list: the positive, then its negatives
                          np.concatenate([pair_d[rows, None], hard[rows]], axis=1).reshape(-1)], dev)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss, loss_ce, loss_kd, scores = step_fn(
                model, tok_mat, tok_len, emb, teach, q, d, sep, args.batch, K1, args.q_tokens, args.d_tokens,
                float(args.residual_tau), float(args.kd_tau), float(args.kd_weight), not graphs)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 100 == 0:
            acc = float((scores.argmax(-1) == 0).float().mean())
            history.append({"step": step, "loss": loss.item(), "ce": loss_ce.item(), "kd": loss_kd.item(),
                            "list_accuracy": acc, "lr": lr_at(step), "elapsed": round(time.time() - t_start, 1)})
            print(json.dumps(history[-1]), flush=True)
    history.append({"step": step, "eval": evaluate(model, data, emb, tok_mat, tok_len, sep, args)})
    print(f"step {step} eval {history[-1]['eval']}", flush=True)
    export(model, cfg, sep, args, history)


@torch.no_grad()
def embed_all(cfg: LMConfig, params: dict, tok_mat: torch.Tensor, tok_len: torch.Tensor, dev: torch.device,
              chunk: int = 4096) -> torch.Tensor:
    """Every text's unit vector from the frozen embedder (N, C), float32: texts taken in order of length."""
    embedder = MirrorLM(cfg.to_dict(), param_shapes(cfg), params).to(dev).eval()
    order = torch.argsort(tok_len)
    out = torch.empty(len(tok_len), cfg.d_model, device=dev)
    for i in range(0, len(order), chunk):
        idx = order[i: i + chunk]
        T = max(1, int(tok_len[idx].max()))
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            v = embedder.embed(tok_mat[idx, :T], tok_len[idx])
        out[idx] = F.normalize(v.float(), dim=-1)
    del embedder
    return out


def add_personal_sets(eval_sets: dict, tok_mat: np.ndarray, tok_len: np.ndarray,
                      tok_path: str) -> tuple[np.ndarray, np.ndarray]:
    """Add the personal dev protocol and its validation set as eval sets (their texts appended to the token matrix):
    each answerable question against every fact ("... wide") and against its person's facts only ("... scoped",
    the other facts masked out). Neither is trained on; the reranker is judged here, the store's protocol is
    benchmarks/personal_recall.py. Returns the grown (tok_mat, tok_len)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from personal_data import personal_set, validation_set

    mats, lens, base = [tok_mat], [tok_len], len(tok_mat)
    for name, ps in (("personal", personal_set()), ("validation", validation_set())):
        asked = [q for q in ps.questions if q.fact is not None]
        texts = [f.text for f in ps.facts] + [q.text for q in asked]
        mat, lengths = tokenise_all(texts, tok_path, tok_mat.shape[1])  # (as the corpus texts were)
        mats.append(mat.astype(tok_mat.dtype))
        lens.append(lengths.astype(tok_len.dtype))
        d_ids = base + np.arange(len(ps.facts))
        q_ids = base + len(ps.facts) + np.arange(len(asked))
        gold = np.array([q.fact for q in asked])
        users = np.array([f.user or "" for f in ps.facts])
        scope = users[None, :] == np.array([q.user for q in asked])[:, None]  # (Q, F)
        eval_sets[f"{name} wide"] = (q_ids, d_ids, gold)
        eval_sets[f"{name} scoped"] = (q_ids, d_ids, gold, scope)
        base += len(texts)
    return np.concatenate(mats), np.concatenate(lens)


@torch.no_grad()
def evaluate(model: Reranker, data, emb: torch.Tensor, tok_mat: torch.Tensor, tok_len: torch.Tensor, sep: int,
             args) -> dict[str, dict[str, float]]:
    """Per eval set: ndcg@10 (and the right text first) of the embedder's ranking and of its top --eval-pool
    reranked; a set with a mask (Q, D) ranks only the texts it allows."""
    model.eval()
    out = {}
    for name, (q_ids, d_ids, gold, *mask) in data.eval_sets.items():
        dev = emb.device
        sim = emb[torch.as_tensor(q_ids, device=dev)] @ emb[torch.as_tensor(d_ids, device=dev)].T  # (Q, D)
        allowed = torch.as_tensor(mask[0], device=dev) if mask else None
        if allowed is not None:
            sim = sim.masked_fill(~allowed, -1e9)
        n = min(args.eval_pool, sim.shape[1])
        top_sim, top = torch.topk(sim, n, dim=1)  # (Q, n) columns
        q = torch.as_tensor(np.repeat(q_ids, n), device=dev)
        d = torch.as_tensor(d_ids, device=dev)[top.reshape(-1)]
        scores = torch.cat([model(*join_pairs(tok_mat, tok_len, q[i: i + 2048], d[i: i + 2048], sep, args.q_tokens,
                                              args.d_tokens)).float() for i in range(0, len(q), 2048)]).view(-1, n)
        if args.residual_tau:
            scores = scores + top_sim / args.residual_tau
        reranked = torch.full_like(sim, -1e9).scatter(1, top, scores)  # outside the pool: last
        if allowed is not None:
            reranked = reranked.masked_fill(~allowed, -2e9)
        out[name] = {"embedder": ndcg_at_10(sim.cpu().numpy(), gold),
                     "reranked": ndcg_at_10(reranked.cpu().numpy(), gold)}
        if mask or name.startswith(("personal", "validation")):
            out[name].update({"embedder_first": int((sim.argmax(1).cpu().numpy() == gold).sum()),
                              "reranked_first": int((reranked.argmax(1).cpu().numpy() == gold).sum()),
                              "questions": len(gold)})
    model.train()
    return out


def export(model: Reranker, cfg: LMConfig, sep: int, args, history: list[dict]) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.cross_layers:  # the numpy model cannot run the extra layers: keep the log, write no checkpoint
        (out / "reranker.json").write_text(json.dumps({"args": vars(args), "history": history,
                                                       "note": "--cross-layers experiment: no checkpoint"}, indent=1))
        print(f"log written to {out} (no checkpoint: --cross-layers)", flush=True)
        return
    params = model.lm.to_numpy_params()
    save_model(out / "reranker.evlm", cfg, params, fp16=True)
    meta = {"format": RERANKER_FORMAT, "init": str(args.init), "layers": cfg.n_layers, "sep_token": int(sep),
            "q_tokens": args.q_tokens, "d_tokens": args.d_tokens, "residual_tau": args.residual_tau,
            "head": model.head.weight.detach().float().cpu().numpy().reshape(-1).tolist(),
            "bias": float(model.head.bias.detach().float().cpu()), "args": vars(args), "history": history}
    (out / "reranker.json").write_text(json.dumps(meta, indent=1))
    print(f"exported to {out}", flush=True)


if __name__ == "__main__":
    main()
