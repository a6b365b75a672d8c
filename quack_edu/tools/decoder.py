"""The model the model benchmark times (``quack_edu.tools.model_bench``): a Llama/Qwen3-style
decoder in plain PyTorch, its RMSNorm a class given by name.

Model (``Decoder``, random weights, nothing downloaded): token embedding, ``layers`` pre-norm
blocks (attention with a per-head QK-norm on the (B, S, H, D) view, head_dim 128, RoPE, causal
SDPA; SwiGLU MLP), a final norm, an LM head. The blocks pass the residual as serving engines do:
``x, residual = norm(h, residual)``, where ``residual = h + residual`` and ``x =
rmsnorm(residual)`` (the first block: ``residual = h``, ``x = norm(h)``); the QK-norms take no
residual.

The norms (``NORMS``): ``torch`` (the add, then nn.RMSNorm), ``quack_edu`` (QuackRMSNorm: fused
when its forward takes a residual, else the add then the norm), ``quack`` (QuACK's rmsnorm,
prenorm=True), ``control`` (``torch`` again, a second model: its ratio to ``torch`` is the
run's noise, an A/A control). Each is an nn.RMSNorm with one parameter, ``weight``: one state
dict runs with every norm (``build_models``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

EPS = 1e-6
#: hidden -> (heads, ffn): head_dim 128; ffn about 8/3 x hidden, as Llama's (11008 at 4096);
#: 1024 is a small Qwen3-style model (MLP 4096), one whose eager step the host bounds
PRESETS = {1024: (8, 4096), 2048: (16, 5632), 4096: (32, 11008)}


@dataclass(frozen=True)
class ModelConfig:
    hidden: int = 2048
    layers: int = 4
    heads: int = 16
    ffn: int = 5632
    vocab: int = 32000
    seq: int = 2048
    batch: int = 2
    rope: bool = True
    #: q, k and v from one projection, split as ``qkv.view(B, S, 3, H, D).unbind(2)``: the
    #: QK-norms' input is then a view whose rows are not evenly strided (two row modes)
    fused_qkv: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# --- the norms: one call, out, residual = norm(x, residual) --------------------------------


def add_then_norm(base: type) -> type:
    """``base`` (an nn.RMSNorm) behind the residual-passing call: ``residual_out = x +
    residual``, then ``base``'s forward on it (two ops). Without a residual: ``base``'s."""

    def forward(self, x, residual=None):
        if residual is None:
            return base.forward(self, x)
        h = x + residual
        return base.forward(self, h), h

    return type(f"{base.__name__}AddThenNorm", (base,), {"forward": forward})


TorchNorm = add_then_norm(nn.RMSNorm)


def _torch_norm():
    return TorchNorm, "add-then-norm (x + residual, then nn.RMSNorm)"


def _quack_edu_norm():
    from .. import QuackRMSNorm

    if "residual" in inspect.signature(QuackRMSNorm.forward).parameters:
        return QuackRMSNorm, "fused (QuackRMSNorm.forward(x, residual))"
    form = "add-then-norm (this QuackRMSNorm.forward takes no residual)"
    return add_then_norm(QuackRMSNorm), form


def _quack_norm():
    from quack.rmsnorm import rmsnorm  # ImportError: the norm is skipped, with the reason

    class QuackNorm(nn.RMSNorm):
        """QuACK's rmsnorm on 2-D views (as its older versions need); prenorm fuses the add."""

        def forward(self, x, residual=None):
            n = x.shape[-1]
            if residual is None:
                return rmsnorm(x.reshape(-1, n), self.weight, eps=self.eps).view(x.shape)
            out, res = rmsnorm(
                x.reshape(-1, n), self.weight, residual=residual.reshape(-1, n), eps=self.eps,
                prenorm=True,
            )  # fmt: skip
            return out.view(x.shape), res.view(x.shape)

    return QuackNorm, "fused (quack.rmsnorm.rmsnorm, prenorm=True)"


def _control_norm():
    return TorchNorm, "add-then-norm, nn.RMSNorm again: a second model, the run's noise (A/A)"


#: name -> () -> (class, form); a maker raises (ImportError...) when its norm cannot run
NORMS: dict[str, Callable] = {"torch": _torch_norm, "quack_edu": _quack_edu_norm,
                              "quack": _quack_norm, "control": _control_norm}  # fmt: skip


# --- the model ------------------------------------------------------------------------------


def _wide(t):
    """``t`` in at least fp32 (a float64 model stays float64)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def apply_rope(x, cos, sin):
    """Rotate-half RoPE on (B, S, H, D) with cos, sin (S, 1, D/2), computed in >= fp32."""
    x1, x2 = _wide(x).chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, norm: type):
        super().__init__()
        h = cfg.hidden
        self.heads, self.head_dim = cfg.heads, cfg.head_dim
        if cfg.fused_qkv:
            self.qkv = nn.Linear(h, 3 * h, bias=False)
        else:
            self.q, self.k, self.v = (nn.Linear(h, h, bias=False) for _ in range(3))
        self.o = nn.Linear(h, h, bias=False)
        self.q_norm, self.k_norm = norm(cfg.head_dim, eps=EPS), norm(cfg.head_dim, eps=EPS)

    def forward(self, x, rope):
        B, S, _ = x.shape
        shape = (B, S, self.heads, self.head_dim)
        if hasattr(self, "qkv"):  # views of one (B, S, 3 * hidden) output, rows not contiguous
            q, k, v = self.qkv(x).view(B, S, 3, self.heads, self.head_dim).unbind(2)
        else:
            q, k, v = self.q(x).view(shape), self.k(x).view(shape), self.v(x).view(shape)
        q, k = self.q_norm(q), self.k_norm(k)  # per head, on the (B, S, H, D) view
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.o(o.transpose(1, 2).reshape(B, S, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.up = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.down = nn.Linear(cfg.ffn, cfg.hidden, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, norm: type):
        super().__init__()
        self.attn_norm, self.attn = norm(cfg.hidden, eps=EPS), Attention(cfg, norm)
        self.mlp_norm, self.mlp = norm(cfg.hidden, eps=EPS), MLP(cfg)

    def forward(self, h, residual, rope):
        if residual is None:
            x, residual = self.attn_norm(h), h
        else:
            x, residual = self.attn_norm(h, residual)
        x, residual = self.mlp_norm(self.attn(x, rope), residual)
        return self.mlp(x), residual


def lm_loss(logits, targets):
    return F.cross_entropy(_wide(logits.flatten(0, 1)), targets.flatten())


class Decoder(nn.Module):
    """The Llama/Qwen3-style decoder, its every RMSNorm of class ``norm``."""

    def __init__(self, cfg: ModelConfig, norm: type):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg, norm) for _ in range(cfg.layers))
        self.norm = norm(cfg.hidden, eps=EPS)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        inv = 1.0 / 10000 ** (torch.arange(0, cfg.head_dim, 2).float() / cfg.head_dim)
        angles = torch.outer(torch.arange(cfg.seq).float(), inv)  # (seq, D/2)
        self.register_buffer("cos", angles.cos(), persistent=False)  # not in the state dict
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens, targets=None, start: int = 0, last_only: bool = False):
        h = self.embed(tokens)
        S = tokens.shape[1]
        rope = None
        if self.cfg.rope:
            rope = (self.cos[start : start + S, None], self.sin[start : start + S, None])
        residual = None
        for block in self.blocks:
            h, residual = block(h, residual, rope)
        x, _ = self.norm(h, residual)
        logits = self.lm_head(x[:, -1:] if last_only else x)
        return logits if targets is None else lm_loss(logits, targets)


def init_weights(model: nn.Module, seed: int = 0) -> None:
    """Linear and embedding weights N(0, 0.02); norm weights 1 + N(0, 0.1), not all ones, so
    that a norm that drops its weight changes the output and fails the gradient check."""
    g = torch.Generator(model.embed.weight.device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.1, generator=g)
            else:
                p.normal_(0.0, 0.02, generator=g)


def build_models(cfg: ModelConfig, classes: dict, device) -> dict:
    """{name: Decoder} of each norm class, all loading the first one's state dict."""
    models, state = {}, None
    for name, cls in classes.items():
        with torch.device(device):
            model = Decoder(cfg, cls)
        if state is None:
            init_weights(model)
            state = model.state_dict()
        else:
            model.load_state_dict(state)
        models[name] = model
    return models
