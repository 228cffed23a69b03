"""Plain PyTorch reference implementation of ByteDance Ouro (no SGLang, no KV cache).

This module is the ground truth that the SGLang model, the compressed KV cache and the kernels
are compared against.  It recomputes everything from the token ids on every call.

Architecture (DESIGN.md section 2; same semantics as vLLM's ``OuroForCausalLM``)::

    x = embed_tokens(input_ids)                               # [B, T, H]
    for u in range(total_ut_steps):                           # loops
        for l in range(num_hidden_layers):                    # KV slot u * L + l
            h = x + input_layernorm_2(attn(input_layernorm(x)))
            x = h + post_attention_layernorm_2(mlp(post_attention_layernorm(h)))
        x = norm(x)                                           # h_u: state after loop u
    logits = lm_head(h_{exit})

Attention is causal with NeoX/rotate-half RoPE (base ``rope_theta``) on q and k, GQA allowed,
scale ``1/sqrt(head_dim)``; the MLP is SwiGLU ``down(silu(gate(x)) * up(x))``; RMSNorm is
computed in fp32, cast back to the input dtype, then multiplied by its weight.

Early exit (upstream options; all loops always run): ``lambda_t = sigmoid(early_exit_gate(h_t))``,
``p_t = lambda_t * prod_{j<t} (1 - lambda_j)`` for ``t < U-1`` and the last loop takes the
remaining mass ``p_{U-1} = prod_{j<U-1} (1 - lambda_j)``.

Parameter names are exactly the upstream checkpoint names (see :data:`upstream_param_names`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Iterable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from sglang_rq.layout import kv_slot
from sglang_rq.models.ouro_config import OURO_ARCHITECTURE, OuroConfig

EXIT_MODES = ("last", "step", "threshold", "weighted")
SAFE_INDEX_NAME = "model.safetensors.index.json"


def upstream_param_names(config: OuroConfig) -> list[str]:
    """All parameter names of an upstream Ouro checkpoint for ``config``, in a fixed order."""
    names = ["model.embed_tokens.weight"]
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        names += [p + f"self_attn.{n}_proj.weight" for n in ("q", "k", "v", "o")]
        names += [p + f"mlp.{n}_proj.weight" for n in ("gate", "up", "down")]
        names += [p + f"{n}.weight" for n in (
            "input_layernorm", "input_layernorm_2", "post_attention_layernorm", "post_attention_layernorm_2")]
    names += ["model.norm.weight", "model.early_exit_gate.weight", "model.early_exit_gate.bias", "lm_head.weight"]
    return names


# --------------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------------


class OuroRMSNorm(nn.Module):
    """RMSNorm: ``weight * (x / sqrt(mean(x^2) + eps)).to(x.dtype)``, statistics in fp32.

    Input ``[..., H]`` of any float dtype; output has the promoted dtype of weight and input.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE tables for ``positions`` ``[T]`` (long): ``cos, sin`` of shape ``[T, head_dim]``, fp32.

    NeoX / rotate-half layout: frequency ``i`` (``0 <= i < D/2``) is used at channels ``i`` and
    ``i + D/2``, ``inv_freq_i = theta ** (-2i / D)``.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    inv_freq = inv_freq.to(positions.device)
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` on the last dimension (halves)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[B, heads, T, D]`` by ``cos, sin`` ``[T, D]`` (fp32 math, result in x.dtype)."""
    x32 = x.float()
    return (x32 * cos + rotate_half(x32) * sin).to(x.dtype)


class OuroAttention(nn.Module):
    """Causal self-attention with RoPE and GQA; ``q/k/v/o_proj`` without bias."""

    def __init__(self, config: OuroConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = 1.0 / math.sqrt(self.head_dim)
        h = config.hidden_size
        self.q_proj = nn.Linear(h, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=False)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_out: list | None = None
    ) -> torch.Tensor:
        """``x`` ``[B, T, H]`` -> ``[B, T, H]``.  If ``kv_out`` is a list, the post-RoPE
        ``(k, v)``, each ``[B, num_kv_heads, T, head_dim]``, are appended to it."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        if kv_out is not None:
            kv_out.append((k, v))
        if self.num_kv_heads != self.num_heads:
            rep = self.num_heads // self.num_kv_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        return self.o_proj(o.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim))


class OuroMLP(nn.Module):
    """SwiGLU MLP: ``down(silu(gate(x)) * up(x))``, no biases."""

    def __init__(self, config: OuroConfig) -> None:
        super().__init__()
        if config.hidden_act != "silu":
            raise ValueError(f"unsupported hidden_act {config.hidden_act!r}")
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class OuroDecoderLayer(nn.Module):
    """One sandwich-normed layer (shared by every loop)."""

    def __init__(self, config: OuroConfig) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.self_attn = OuroAttention(config)
        self.mlp = OuroMLP(config)
        self.input_layernorm = OuroRMSNorm(config.hidden_size, eps)
        self.input_layernorm_2 = OuroRMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = OuroRMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm_2 = OuroRMSNorm(config.hidden_size, eps)
        self.dropout = 0.0  # training-only residual dropout (not part of Ouro; 0 at inference)

    def forward(self, x, cos, sin, kv_out=None):
        a = self.input_layernorm_2(self.self_attn(self.input_layernorm(x), cos, sin, kv_out))
        if self.training and self.dropout > 0:
            a = F.dropout(a, self.dropout, True)
        h = x + a
        m = self.post_attention_layernorm_2(self.mlp(self.post_attention_layernorm(h)))
        if self.training and self.dropout > 0:
            m = F.dropout(m, self.dropout, True)
        return h + m


class OuroModel(nn.Module):
    """The ``model.`` sub-module: embeddings, shared layers, final norm, early-exit gate."""

    def __init__(self, config: OuroConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(OuroDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = OuroRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.early_exit_gate = nn.Linear(config.hidden_size, 1, bias=True)


# --------------------------------------------------------------------------------------------
# Full model
# --------------------------------------------------------------------------------------------


class OuroReferenceModel(nn.Module):
    """Ouro causal LM in plain PyTorch; ``state_dict()`` uses the upstream checkpoint names.

    Args:
        config: an :class:`OuroConfig`.
    """

    def __init__(self, config: OuroConfig) -> None:
        super().__init__()
        self.config = config
        self.model = OuroModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    # ---------------------------------------------------------------- init / properties
    def init_weights(self, std: float | None = None, seed: int | None = None) -> None:
        """Fresh training init: linears and embeddings ``N(0, std)`` (default
        ``config.initializer_range``), norms 1, gate bias 0."""
        std = self.config.initializer_range if std is None else std
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight") or "layernorm" in name:
                    p.fill_(1.0)
                elif name.endswith("early_exit_gate.bias"):
                    p.zero_()
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) * std)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def set_dropout(self, p: float) -> None:
        """Residual dropout for training only (not part of the Ouro architecture)."""
        for layer in self.model.layers:
            layer.dropout = float(p)

    # ---------------------------------------------------------------- core forward
    def loop_states(
        self, input_ids: torch.Tensor, *, collect_kv: bool = False, num_loops: int | None = None
    ) -> tuple[list[torch.Tensor], dict[int, tuple[torch.Tensor, torch.Tensor]] | None]:
        """Run all loops.

        Args:
            input_ids: ``[B, T]`` long.
            collect_kv: also return the post-RoPE K/V of every (loop, layer).
            num_loops: override ``config.total_ut_steps`` (default: all loops).

        Returns:
            ``states``: list of ``U`` tensors ``[B, T, H]`` (model dtype, or fp32 under autocast),
            the ``model.norm``-ed state after each loop; ``kv``: ``None`` or a dict
            ``slot -> (k, v)`` with ``slot = u * num_hidden_layers + l`` and ``k, v`` of shape
            ``[B, num_key_value_heads, T, head_dim]``.
        """
        cfg = self.config
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, T], got {tuple(input_ids.shape)}")
        t = input_ids.shape[1]
        positions = torch.arange(t, device=input_ids.device)
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)
        x = self.model.embed_tokens(input_ids)
        n_layers = len(self.model.layers)
        states: list[torch.Tensor] = []
        kv: dict | None = {} if collect_kv else None
        for u in range(cfg.total_ut_steps if num_loops is None else num_loops):
            for li, layer in enumerate(self.model.layers):
                buf: list | None = [] if collect_kv else None
                x = layer(x, cos, sin, buf)
                if collect_kv:
                    kv[kv_slot(u, li, n_layers)] = buf[0]
            x = self.model.norm(x)
            states.append(x)
        return states, kv

    def exit_probabilities(self, states: Sequence[torch.Tensor]) -> torch.Tensor:
        """Per-loop exit probabilities ``p`` ``[U, B, T]`` fp32 (sums to 1 over ``U``)."""
        lam = [torch.sigmoid(self.model.early_exit_gate(h).float().squeeze(-1)) for h in states]
        probs = []
        remaining = torch.ones_like(lam[0])
        for i, l_i in enumerate(lam):
            if i < len(lam) - 1:
                probs.append(l_i * remaining)
                remaining = remaining * (1.0 - l_i)
            else:
                probs.append(remaining)
        return torch.stack(probs, dim=0)

    def exit_loop_index(self, states: Sequence[torch.Tensor], threshold: float) -> torch.Tensor:
        """Per token, the first loop whose cumulative exit probability is ``>= threshold``;
        ``[B, T]`` long.  ``threshold >= 1`` always selects the last loop."""
        n = len(states)
        b, t = states[0].shape[:2]
        if threshold >= 1.0:
            return torch.full((b, t), n - 1, dtype=torch.long, device=states[0].device)
        cdf = self.exit_probabilities(states).cumsum(0)  # [U, B, T]
        hit = cdf >= threshold
        hit[-1] = True
        return hit.float().argmax(0)  # first True

    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        exit_mode: str = "last",
        exit_step: int | None = None,
        exit_threshold: float | None = None,
    ) -> torch.Tensor:
        """Logits ``[B, T, V]`` fp32 for ``input_ids`` ``[B, T]`` (long).

        ``exit_mode``:
          * ``"last"``: lm_head on the last loop's state (default; = threshold 1.0);
          * ``"step"``: lm_head on loop ``exit_step``'s state (0-based);
          * ``"threshold"``: per token the first loop whose cumulative exit probability
            ``>= exit_threshold`` (default ``config.early_exit_threshold``);
          * ``"weighted"``: ``sum_t p_t * logits_t``.
        """
        if exit_mode not in EXIT_MODES:
            raise ValueError(f"exit_mode must be one of {EXIT_MODES}, got {exit_mode!r}")
        states, _ = self.loop_states(input_ids)
        if exit_mode == "last":
            return self.lm_head(states[-1]).float()
        if exit_mode == "step":
            if exit_step is None or not -len(states) <= exit_step < len(states):
                raise ValueError(f"exit_step must be in [0, {len(states)}), got {exit_step}")
            return self.lm_head(states[exit_step]).float()
        if exit_mode == "threshold":
            thr = self.config.early_exit_threshold if exit_threshold is None else float(exit_threshold)
            idx = self.exit_loop_index(states, thr)  # [B, T]
            stacked = torch.stack(states, 0)  # [U, B, T, H]
            sel = stacked.gather(0, idx[None, :, :, None].expand(1, *stacked.shape[1:])).squeeze(0)
            return self.lm_head(sel).float()
        probs = self.exit_probabilities(states)  # weighted
        out = None
        for p, h in zip(probs, states):
            term = p[..., None] * self.lm_head(h).float()
            out = term if out is None else out + term
        return out

    # ---------------------------------------------------------------- generation
    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        seed: int = 0,
        stop_token_ids: Iterable[int] | None = None,
        **exit_kwargs,
    ) -> list[list[int]]:
        """Generate continuations, recomputing the full forward every step (no cache).

        Args:
            prompts: token-id lists (each processed on its own, batch 1).
            max_new_tokens: upper bound on new tokens per prompt.
            temperature: 0 = greedy; otherwise sample from ``softmax(logits / temperature)``
                (optionally restricted to the ``top_k`` best) with a ``seed``-ed generator.
            stop_token_ids: generation stops after one of these is emitted (it is included);
                default: ``config.eos_token_id``.
            exit_kwargs: ``exit_mode`` / ``exit_step`` / ``exit_threshold`` for :meth:`forward`.

        Returns:
            list of the new tokens per prompt.
        """
        if stop_token_ids is None:
            eos = self.config.eos_token_id
            stop_token_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        stop = set(int(s) for s in stop_token_ids)
        gen = torch.Generator(device="cpu").manual_seed(seed)
        out: list[list[int]] = []
        for prompt in prompts:
            ids = list(int(i) for i in prompt)
            new: list[int] = []
            for _ in range(max_new_tokens):
                x = torch.tensor([ids[-self.config.max_position_embeddings:]], dtype=torch.long, device=self.device)
                logits = self.forward(x, **exit_kwargs)[0, -1]
                if temperature <= 0:
                    nxt = int(logits.argmax())
                else:
                    lg = logits.cpu() / temperature
                    if top_k > 0:
                        kth = torch.topk(lg, min(top_k, lg.numel())).values[-1]
                        lg = lg.masked_fill(lg < kth, float("-inf"))
                    nxt = int(torch.multinomial(torch.softmax(lg, -1), 1, generator=gen))
                ids.append(nxt)
                new.append(nxt)
                if nxt in stop:
                    break
            out.append(new)
        return out

    def greedy_generate(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int, **kwargs
    ) -> list[list[int]]:
        """Greedy decoding (argmax), full recompute per step; see :meth:`generate`."""
        kwargs.pop("temperature", None)
        return self.generate(prompts, max_new_tokens, temperature=0.0, **kwargs)

    # ---------------------------------------------------------------- I/O
    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
    ) -> "OuroReferenceModel":
        """Load ``config.json`` + safetensors shards (with or without
        ``model.safetensors.index.json``) from a directory.  Weights are cast to ``dtype``."""
        from safetensors.torch import load_file

        path = Path(path)
        config = load_config(path)
        index = path / SAFE_INDEX_NAME
        if index.exists():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        else:
            files = sorted(p.name for p in path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no safetensors files in {path}")
        state: dict[str, torch.Tensor] = {}
        for fn in files:
            state.update(load_file(str(path / fn)))
        state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
        if config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        with torch.device("meta"):
            model = cls(config)
        model = model.to_empty(device=device)
        if config.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
        if missing or unexpected:
            raise ValueError(f"checkpoint mismatch: missing={missing} unexpected={unexpected}")
        return model.to(dtype=dtype).eval()

    def save_pretrained(
        self,
        path: str | os.PathLike,
        *,
        max_shard_bytes: int = 5_000_000_000,
        dtype: torch.dtype = torch.bfloat16,
        extra_config: dict | None = None,
    ) -> list[str]:
        """Write upstream-format ``model-0000i-of-0000n.safetensors`` shards (each at most
        ``max_shard_bytes`` of tensor data, plus a small header), ``model.safetensors.index.json``
        and ``config.json``.  Returns the shard file names."""
        return save_state_dict(self.state_dict(), self.config, path, max_shard_bytes=max_shard_bytes,
                               dtype=dtype, extra_config=extra_config)


# --------------------------------------------------------------------------------------------
# Checkpoint helpers
# --------------------------------------------------------------------------------------------


def load_config(path: str | os.PathLike) -> OuroConfig:
    """Read ``config.json`` in a directory into an :class:`OuroConfig` (upstream defects fixed)."""
    d = json.loads((Path(path) / "config.json").read_text())
    d.pop("model_type", None)
    d.pop("auto_map", None)
    d.pop("transformers_version", None)
    return OuroConfig(**d)


def config_to_json_dict(config: OuroConfig, dtype: torch.dtype = torch.bfloat16) -> dict:
    """``config.json`` content in the upstream layout (architectures, model_type, torch_dtype)."""
    d = config.to_dict()
    for k in ("_name_or_path", "output_attentions", "id2label", "label2id", "problem_type",
              "return_dict", "output_hidden_states", "chunk_size_feed_forward", "is_encoder_decoder"):
        d.pop(k, None)
    dtype_name = str(dtype).replace("torch.", "")
    d["architectures"] = [OURO_ARCHITECTURE]
    d["model_type"] = "ouro"
    d["torch_dtype"] = dtype_name
    d["dtype"] = dtype_name
    return dict(sorted(d.items()))


def save_state_dict(
    state: dict[str, torch.Tensor],
    config: OuroConfig,
    path: str | os.PathLike,
    *,
    max_shard_bytes: int = 5_000_000_000,
    dtype: torch.dtype = torch.bfloat16,
    extra_config: dict | None = None,
) -> list[str]:
    """Write ``state`` (upstream names) as sharded safetensors + index + config.json.

    Tensors are written in :func:`upstream_param_names` order, cast to ``dtype``; a shard is
    closed when adding the next tensor would exceed ``max_shard_bytes`` of tensor data."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    order = [n for n in upstream_param_names(config) if n in state]
    order += sorted(set(state) - set(order))
    if config.tie_word_embeddings and "lm_head.weight" in order:
        order.remove("lm_head.weight")
    shards: list[list[str]] = [[]]
    size = 0
    for name in order:
        nbytes = state[name].numel() * torch.tensor([], dtype=dtype).element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    n = len(shards)
    weight_map: dict[str, str] = {}
    total = 0
    files = []
    for i, names in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        tensors = {k: state[k].detach().to("cpu", dtype).contiguous() for k in names}
        save_file(tensors, str(path / fn), metadata={"format": "pt"})
        for k, v in tensors.items():
            weight_map[k] = fn
            total += v.numel() * v.element_size()
        files.append(fn)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / SAFE_INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    cfg = config_to_json_dict(config, dtype)
    if extra_config:
        cfg.update(extra_config)
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return files


def tiny_config(**overrides) -> OuroConfig:
    """A small GQA Ouro config for tests: V=256, H=64, 4 heads / 2 KV heads, D=16, 2 layers, 4 loops."""
    kw = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
              rope_theta=10000.0, total_ut_steps=4, rms_norm_eps=1e-6)
    kw.update(overrides)
    return OuroConfig(**kw)


def random_state_dict(config: OuroConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random fp32 weights with upstream names, scaled so activations are O(1) and logits have
    clear margins (logit std about 8), so greedy argmax is stable across fp32 implementations."""
    g = torch.Generator().manual_seed(seed)
    h = config.hidden_size
    sd: dict[str, torch.Tensor] = {}
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in OuroReferenceModel(config).state_dict().items()}
    for name in upstream_param_names(config):
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        shape = shapes[name]
        if "layernorm" in name or name == "model.norm.weight":
            t = 1.0 + 0.2 * torch.randn(shape, generator=g)
        elif name == "model.embed_tokens.weight":
            t = torch.randn(shape, generator=g)
        elif name == "lm_head.weight":
            t = torch.randn(shape, generator=g) * (8.0 / math.sqrt(h))
        elif name == "model.early_exit_gate.bias":
            t = 0.5 * torch.randn(shape, generator=g)
        else:  # linear [out, in]
            t = torch.randn(shape, generator=g) / math.sqrt(shape[1])
        sd[name] = t
    return sd


def write_random_checkpoint(
    path: str | os.PathLike,
    config: OuroConfig | dict | None = None,
    seed: int = 0,
    *,
    dtype: torch.dtype = torch.bfloat16,
    max_shard_bytes: int | None = None,
) -> OuroConfig:
    """Write a small random Ouro checkpoint in the exact upstream format.

    Args:
        path: output directory (created).
        config: an :class:`OuroConfig`, a dict of overrides for :func:`tiny_config`, or None.
        seed: RNG seed for the weights.
        dtype: storage dtype (bf16 like upstream; load in fp32 for exact comparisons).
        max_shard_bytes: default: about a third of the model, so the checkpoint has several
            shards and an index.

    Returns:
        the config written to ``config.json``.
    """
    if config is None:
        config = tiny_config()
    elif isinstance(config, dict):
        config = tiny_config(**config)
    sd = random_state_dict(config, seed)
    if max_shard_bytes is None:
        elt = torch.tensor([], dtype=dtype).element_size()
        max_shard_bytes = max(1, sum(v.numel() for v in sd.values()) * elt // 3)
    save_state_dict(sd, config, path, max_shard_bytes=max_shard_bytes, dtype=dtype,
                    extra_config={"architectures": [OURO_ARCHITECTURE]})
    gen_cfg = {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id,
               "pad_token_id": config.pad_token_id}
    (Path(path) / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    return config
