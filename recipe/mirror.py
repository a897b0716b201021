"""PyTorch mirror of EvermindLM's embedding path, for training the shipped model on a GPU.

A dev-time tool only: the package never imports torch. Parameter names and shapes are exactly those of
`evermind_memory.lm.model.param_shapes`, so `to_numpy_params()` exports straight into our checkpoint format,
and the numpy model must reproduce this module's embeddings (checked in CI against golden vectors).
Routed experts are computed densely here, all experts in one batched product, and combined with the same top-k
gates, which gives the same function and gradients as the numpy model's sparse dispatch (at this width a gather by
expert costs more than the experts it skips).

Mixed precision: under `torch.autocast(dtype=torch.bfloat16)` the matrix products run in bf16 while the residual
stream, every RMSNorm, the attention softmax and the pooled mean stay float32 (rmsnorm computes in float32 and
returns float32), so an fp32 run is exactly what it was and a bf16 run only rounds the products' inputs.
`embed_bucketed` runs a batch of mixed lengths as a few length buckets, each padded only to its own longest
sequence (rounded up to a multiple of 16, so a compiled model sees few shapes); the backbone is causal and the
pooling masks padding, so a sequence's vector does not depend on how much padding follows it.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

RMS_EPS = 1e-5


def rmsnorm(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """RMSNorm in float32 whatever x's dtype (bf16 products under autocast feed it)."""
    x = x.float()
    return g * x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + RMS_EPS)


def top_k_first(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest values of the last axis and their indices, the first index on ties (the numpy model's stable
    argsort of -logits). k argmax passes over E experts, which the compiler fuses into the router's kernel, where
    torch.topk runs as a separate sort kernel per call (a tenth of the step's GPU time at E=4, k=2)."""
    idx, masked = [], logits
    for _ in range(k):  # k experts, not batch positions
        i = masked.argmax(dim=-1, keepdim=True)  # (..., 1)
        idx.append(i)
        masked = masked.scatter(-1, i, float("-inf"))
    chosen = torch.cat(idx, dim=-1)  # (..., k)
    return logits.gather(-1, chosen), chosen


class MirrorLM(torch.nn.Module):
    """EvermindLM's layers plus the embedder's pooling block, as torch parameters with our names."""

    def __init__(self, cfg: dict, shapes: dict[str, tuple[int, ...]], init: dict[str, np.ndarray]):
        super().__init__()
        self.cfg = cfg
        self.names = list(shapes)
        self.p = torch.nn.ParameterDict()
        for name in self.names:
            arr = init[name]
            assert tuple(arr.shape) == tuple(shapes[name]), (name, arr.shape, shapes[name])
            self.p[name.replace(".", "__")] = torch.nn.Parameter(torch.tensor(arr, dtype=torch.float32))

    def w(self, name: str) -> torch.Tensor:
        return self.p[name.replace(".", "__")]

    def to_numpy_params(self) -> dict[str, np.ndarray]:
        return {n: self.w(n).detach().float().cpu().numpy().astype(np.float32) for n in self.names}

    # -- layers ------------------------------------------------------------------------------------------
    def _ffn(self, x, prefix):
        h = F.relu(x @ self.w(prefix + ".w1") + self.w(prefix + ".b1"))
        return h @ self.w(prefix + ".w2") + self.w(prefix + ".b2")

    moe_impl = "grouped"  # "gather": the previous step's dense (E, B, T, C) einsum and gather (benchmarks only)

    def _moe(self, x, l):
        if self.moe_impl == "gather":
            return self._moe_gather(x, l)
        return self._moe_grouped(x, l)

    def _moe_gather(self, x, l):
        """The previous formulation: every expert's output (E, B, T, C), then the top-k gathered and gated."""
        E, k = self.cfg["n_experts"], self.cfg["top_k"]
        pre = f"layers.{l}"
        out = self._ffn(x, pre + ".shared").float()  # (B, T, C)
        logits = x @ self.w(pre + ".router")  # (B, T, E)
        top, idx = torch.topk(logits, k, dim=-1)  # (B, T, k)
        gates = torch.softmax(top, dim=-1)  # (B, T, k)
        w1 = torch.stack([self.w(f"{pre}.expert{e}.w1") for e in range(E)])  # (E, C, H)
        b1 = torch.stack([self.w(f"{pre}.expert{e}.b1") for e in range(E)])  # (E, H)
        w2 = torch.stack([self.w(f"{pre}.expert{e}.w2") for e in range(E)])  # (E, H, C)
        b2 = torch.stack([self.w(f"{pre}.expert{e}.b2") for e in range(E)])  # (E, C)
        h = F.relu(torch.einsum("btc,ech->ebth", x, w1) + b1[:, None, None, :])  # (E, B, T, H)
        y = torch.einsum("ebth,ehc->ebtc", h, w2) + b2[:, None, None, :]  # (E, B, T, C)
        y = y.permute(1, 2, 0, 3)  # (B, T, E, C)
        chosen = torch.gather(y, 2, idx[..., None].expand(-1, -1, -1, y.shape[-1]))  # (B, T, k, C)
        return out + (gates[..., None].float() * chosen.float()).sum(dim=2)

    def _moe_grouped(self, x, l):
        """Shared FFN plus the top-k routed experts: sum_e g_e * (relu(x W1_e + b1_e) W2_e + b2_e), with g_e the
        softmax over the top-k router logits and 0 for the other experts. Written as two products over all experts
        side by side, (C, E*H) then (E*H, C), with the hidden units of unchosen experts zeroed by their gate: the
        same function and gradients as a sparse dispatch, in two large matrix products."""
        E, k = self.cfg["n_experts"], self.cfg["top_k"]
        pre = f"layers.{l}"
        out = self._ffn(x, pre + ".shared").float()  # (B, T, C)
        with torch.autocast(x.device.type, enabled=False):  # routing in float32, as the numpy model routes
            logits = x.float() @ self.w(pre + ".router")  # (B, T, E)
        top, idx = top_k_first(logits, k)  # (B, T, k)
        gates = torch.zeros_like(logits).scatter(-1, idx, torch.softmax(top, dim=-1))  # (B, T, E)
        w1 = torch.cat([self.w(f"{pre}.expert{e}.w1") for e in range(E)], dim=1)  # (C, E*H)
        b1 = torch.cat([self.w(f"{pre}.expert{e}.b1") for e in range(E)])  # (E*H,)
        w2 = torch.cat([self.w(f"{pre}.expert{e}.w2") for e in range(E)], dim=0)  # (E*H, C)
        b2 = torch.stack([self.w(f"{pre}.expert{e}.b2") for e in range(E)])  # (E, C)
        h = F.relu(x @ w1 + b1)  # (B, T, E*H)
        B, T, EH = h.shape
        h = (h.view(B, T, E, EH // E) * gates[..., None].to(h.dtype)).view(B, T, EH)
        return out + (h @ w2).float() + gates @ b2

    def _conv(self, x, l):
        K = self.cfg["conv_kernel"]
        kern = self.w(f"layers.{l}.conv")  # (K, C)
        xp = F.pad(x, (0, 0, K - 1, 0))  # (B, T+K-1, C), zeros before the sequence
        T = x.shape[1]
        return sum(kern[j] * xp[:, K - 1 - j: K - 1 - j + T] for j in range(K))

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.w("emb")[tokens]  # (B, T, C)
        for l in range(self.cfg["n_layers"]):
            x = x + self._conv(rmsnorm(x, self.w(f"layers.{l}.conv_norm")), l)
            x = x + self._moe(rmsnorm(x, self.w(f"layers.{l}.moe_norm")), l)
        return x

    def pooled(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Unnormalised pooled vector (B, C); `embed` L2-normalises it."""
        h, real = self.token_states(tokens, lengths)
        m = real[..., None].to(h.dtype)
        return (h * m).sum(dim=1) / lengths[:, None].to(h.dtype)

    def token_states(self, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(states (B, T, C) float32, real (B, T) bool): each position's output of the pooling block, the vectors
        `pooled` averages over the real positions."""
        h = self.hidden(tokens)
        B, T, C = h.shape
        real = torch.arange(T, device=h.device)[None, :] < lengths[:, None]  # (B, T)
        nh = self.cfg.get("attn_heads", 0)
        if nh:
            a = rmsnorm(h, self.w("pool.attn_norm"))
            qkv = (a @ self.w("pool.wqkv")).view(B, T, 3, nh, C // nh)
            q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # (B, N, T, D)
            s = q @ k.transpose(-1, -2) / math.sqrt(C // nh)
            s = s.masked_fill(~real[:, None, None, :], -1e9)
            o = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
            h = h + (o @ self.w("pool.wo")).float()
            h = rmsnorm(h, self.w("pool.out_norm"))
        return h.float(), real

    def embed(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.pooled(tokens, lengths), dim=-1, eps=1e-12)


def bucket_plan(lengths: np.ndarray, buckets: int, multiple: int = 16) -> list[tuple[np.ndarray, int]]:
    """Split rows by length into `buckets` groups of equal count (sorted by length) and give each group's padded
    length: its longest row rounded up to `multiple`. Returns [(row positions, padded length)]."""
    order = np.argsort(lengths, kind="stable")
    out = []
    for part in np.array_split(order, max(1, min(buckets, len(order)))):
        if len(part):
            longest = int(lengths[part].max())
            out.append((part, int(-(-longest // multiple) * multiple)))
    return out


def to_device(arrays: list[np.ndarray], dev: torch.device) -> list[torch.Tensor]:
    """Host integer arrays on the device as int64, in one pinned, non-blocking copy. A plain copy from pageable host
    memory waits until the device has finished everything queued before it, so a step that copied its ids that way
    could not queue its launches while the device ran the previous step's kernels."""
    sizes = [len(a) for a in arrays]
    host = torch.from_numpy(np.concatenate([np.asarray(a, dtype=np.int64).reshape(-1) for a in arrays]))
    if dev.type == "cuda":
        host = host.pin_memory()  # the caching host allocator keeps the block until the copy has completed
    return list(torch.split(host.to(dev, non_blocking=True), sizes))


def embed_bucketed(pooled_fn, tok_mat: torch.Tensor, tok_len: torch.Tensor, ids: np.ndarray, lengths: np.ndarray,
                   buckets: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Unnormalised pooled vectors (B, C) of texts `ids` (host array of rows of tok_mat / tok_len), in the order given,
    and `ids` on the device.

    `lengths` (B,) are the same rows' token counts on the host (to plan without a device sync); `pooled_fn` is
    MirrorLM.pooled or a compiled copy of it. With buckets <= 1, one batch padded to the longest row (the old step).
    The ids, their bucket order and its inverse reach the device in one copy that does not wait for the device.
    """
    ids = np.asarray(ids, dtype=np.int64)
    if buckets <= 1:
        (ids_t,) = to_device([ids], tok_mat.device)
        T = int(lengths.max())
        return pooled_fn(tok_mat[ids_t, :T], tok_len[ids_t]), ids_t
    plan = bucket_plan(lengths, buckets)
    order = np.concatenate([pos for pos, _ in plan])
    inverse = np.empty(len(order), dtype=np.int64)
    inverse[order] = np.arange(len(order))
    ids_t, sorted_t, inverse_t = to_device([ids, ids[order], inverse], tok_mat.device)
    outs, start = [], 0
    for pos, T in plan:
        sel = sorted_t[start:start + len(pos)]
        start += len(pos)
        T = min(T, tok_mat.shape[1])
        outs.append(pooled_fn(tok_mat[sel, :T], tok_len[sel]))
    return torch.cat(outs)[inverse_t], ids_t
