"""PyTorch mirror of EvermindLM's embedding path, for training the shipped model on a GPU.

A dev-time tool only: the package never imports torch. Parameter names and shapes are exactly those of
`evermind_memory.lm.model.param_shapes`, so `to_numpy_params()` exports straight into our checkpoint format,
and the numpy model must reproduce this module's embeddings (checked in CI against golden vectors).
Routed experts are computed densely here (the GPU does not care) and combined with the same top-k gates,
which gives the same function and gradients as the numpy model's sparse dispatch.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

RMS_EPS = 1e-5


def rmsnorm(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return g * x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + RMS_EPS)


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

    def _moe(self, x, l):
        E, k = self.cfg["n_experts"], self.cfg["top_k"]
        pre = f"layers.{l}"
        out = self._ffn(x, pre + ".shared")  # (B, T, C)
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
        return out + (gates[..., None] * chosen).sum(dim=2)

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
            h = h + o @ self.w("pool.wo")
            h = rmsnorm(h, self.w("pool.out_norm"))
        m = real[..., None].to(h.dtype)
        return (h * m).sum(dim=1) / lengths[:, None].to(h.dtype)

    def embed(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.pooled(tokens, lengths), dim=-1, eps=1e-12)
