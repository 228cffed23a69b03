"""Plain PyTorch reference of Huginn recurrent-depth models (no SGLang), fp32-capable.

The ground truth the SGLang model (`sglang_rq.models.huginn`) is tested against. Architecture
(DESIGN.md section 2; checked against upstream ``raven_modeling_minimal.py``)::

    e = wte(input_ids) * sqrt(n_embd)                         # [B, T, H]
    for p in prelude: e = p(e)                                # KV slot p
    s = 0                                                     # initial state (see below)
    for r in range(R):                                        # recurrences
        s = adapter(cat([s, e], -1))                          # Linear(2H -> H)
        for b in core_block: s = b(s)                         # KV slot P + r*C + b
    x = ln_f(s)                                               # upstream applies ln_f here too
    for c in coda: x = c(x)                                   # KV slot P + R*C + c
    logits = ln_f(x) @ wte.T                                  # tied head, fp32

Block ("sandwich", norm after the add)::

    x = norm_2(attn(norm_1(x)) + x)
    x = norm_4(mlp(norm_3(x)) + x)

Attention: ``Wqkv`` (no bias) gives q, k, v in that order; ``qk_bias`` ``[2, 1, n_heads,
head_dim]`` is added to q (row 0) and k (row 1) before RoPE; RoPE rotates adjacent channel pairs
``(2i, 2i+1)`` by ``pos * rope_base ** (-2i / head_dim)`` (GPT-J layout); causal SDPA with scale
``1/sqrt(head_dim)``; ``proj`` (no bias). MLP: ``a, g = fc(x).chunk(2)``, ``proj(silu(a) * g)``.
RMSNorm: statistics in fp32, cast back, times the weight.

Initial state: **zeros**. Upstream draws it at random per forward (truncated normal, std
``sqrt(2/(5H)) * sqrt(H)``); a random state would make a request's output, and the K/V a cached
prefix holds, depend on the draw. With zeros the state of every token is a function of the
prefix alone, so the KV cache of a prefix equals what a full recompute would produce.

Upstream checkpoints store the RoPE table as the persistent buffer ``freqs_cis`` ``[1, block_size,
1, head_dim / 2, 2]`` and omit ``lm_head.weight`` (tied); :func:`write_random_checkpoint` does
the same.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from sglang_rq.models.huginn_config import HUGINN_ARCHITECTURE, HUGINN_MODEL_TYPE, HuginnConfig

KVCache = dict  # slot -> (k, v), each [B, n_heads, T_cached, head_dim]


def upstream_param_names(config: HuginnConfig) -> list[str]:
    """Every parameter name of an upstream checkpoint (tied ``lm_head`` excluded), fixed order."""
    block = ["norm_1.weight", "attn.Wqkv.weight", "attn.proj.weight", "norm_2.weight",
             "mlp.fc.weight", "mlp.proj.weight", "norm_3.weight", "norm_4.weight"]
    if config.qk_bias:
        block.insert(2, "attn.qk_bias")
    names = ["transformer.wte.weight"]
    for stage, n in (("prelude", config.n_layers_in_prelude),
                     ("core_block", config.n_layers_in_recurrent_block),
                     ("coda", config.n_layers_in_coda)):
        names += [f"transformer.{stage}.{i}.{b}" for i in range(n) for b in block]
        if stage == "prelude":
            names += ["transformer.adapter.weight"] + (["transformer.adapter.bias"] if config.bias else [])
    names.append("transformer.ln_f.weight")
    if not config.tie_embeddings:
        names.append("lm_head.weight")
    return names


class RMSNorm(nn.Module):
    """``weight * (x / sqrt(mean(x^2) + eps)).to(x.dtype)``, statistics in fp32; ``[..., H]``."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope_table(positions: torch.Tensor, head_dim: int, base: float) -> torch.Tensor:
    """``[T, head_dim / 2, 2]`` fp32 (cos, sin) for ``positions`` ``[T]``; frequency ``i`` rotates
    channels ``2i, 2i+1``."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.outer(positions.float().cpu(), inv_freq).to(positions.device)
    return torch.stack([freqs.cos(), freqs.sin()], dim=-1)


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs of ``x`` ``[B, T, heads, D]`` by ``table`` ``[T, D/2, 2]``."""
    x2 = x.float().unflatten(-1, (-1, 2))  # [B, T, heads, D/2, 2]
    cos, sin = table[None, :, None, :, 0], table[None, :, None, :, 1]
    out = torch.stack([x2[..., 0] * cos - x2[..., 1] * sin, x2[..., 1] * cos + x2[..., 0] * sin], -1)
    return out.flatten(-2).to(x.dtype)


class HuginnAttention(nn.Module):
    """Causal MHA with the learned q/k bias and pairwise RoPE; optional KV cache."""

    def __init__(self, config: HuginnConfig) -> None:
        super().__init__()
        self.n_heads, self.head_dim = config.n_heads, config.head_dim
        h = config.n_embd
        self.Wqkv = nn.Linear(h, 3 * h, bias=False)
        if config.qk_bias:
            self.qk_bias = nn.Parameter(torch.zeros(2, 1, self.n_heads, self.head_dim))
        self.proj = nn.Linear(h, h, bias=False)

    def forward(self, x: torch.Tensor, table: torch.Tensor, cache: KVCache | None,
                slot: int) -> torch.Tensor:
        """``x`` ``[B, T, H]`` at positions ``table`` covers -> ``[B, T, H]``; appends this
        call's post-RoPE ``k, v`` to ``cache[slot]`` and attends to all of it."""
        b, t, _ = x.shape
        q, k, v = (y.view(b, t, self.n_heads, self.head_dim) for y in self.Wqkv(x).chunk(3, -1))
        if hasattr(self, "qk_bias"):
            q, k = q + self.qk_bias[0], k + self.qk_bias[1]
        q, k = apply_rope(q, table), apply_rope(k, table)
        q, k, v = (y.transpose(1, 2) for y in (q, k, v))  # [B, heads, T, D]
        if cache is not None:
            if slot in cache:
                k = torch.cat([cache[slot][0], k], dim=2)
                v = torch.cat([cache[slot][1], v], dim=2)
            cache[slot] = (k, v)
        past = k.shape[2] - t
        if past == 0:
            # plain causal attention (no cached prefix): the same mask, but lets SDPA pick its
            # flash / memory-efficient kernels (training and full-recompute evaluation)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            mask = torch.ones(t, k.shape[2], dtype=torch.bool, device=x.device).tril(diagonal=past)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(o.transpose(1, 2).reshape(b, t, -1))


class HuginnMLP(nn.Module):
    """Gated MLP: ``a, g = fc(x).chunk(2)``; ``proj(silu(a) * g)``."""

    def __init__(self, config: HuginnConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 2 * config.intermediate_size, bias=False)
        self.proj = nn.Linear(config.intermediate_size, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, g = self.fc(x).chunk(2, dim=-1)
        return self.proj(F.silu(a) * g)


class HuginnBlock(nn.Module):
    """Upstream ``SandwichBlock``: norms after the residual adds."""

    def __init__(self, config: HuginnConfig) -> None:
        super().__init__()
        eps = config.norm_eps
        self.norm_1, self.norm_2 = RMSNorm(config.n_embd, eps), RMSNorm(config.n_embd, eps)
        self.norm_3, self.norm_4 = RMSNorm(config.n_embd, eps), RMSNorm(config.n_embd, eps)
        self.attn = HuginnAttention(config)
        self.mlp = HuginnMLP(config)

    def forward(self, x, table, cache, slot):
        x = self.norm_2(self.attn(self.norm_1(x), table, cache, slot) + x)
        return self.norm_4(self.mlp(self.norm_3(x)) + x)


class HuginnReferenceModel(nn.Module):
    """Huginn causal LM; ``state_dict()`` names are the upstream checkpoint names."""

    def __init__(self, config: HuginnConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c.vocab_size, c.n_embd),
            prelude=nn.ModuleList(HuginnBlock(c) for _ in range(c.n_layers_in_prelude)),
            adapter=nn.Linear(2 * c.n_embd, c.n_embd, bias=c.bias),
            core_block=nn.ModuleList(HuginnBlock(c) for _ in range(c.n_layers_in_recurrent_block)),
            coda=nn.ModuleList(HuginnBlock(c) for _ in range(c.n_layers_in_coda)),
            ln_f=RMSNorm(c.n_embd, c.norm_eps),
        ))
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight

    def forward(self, input_ids: torch.Tensor, *, cache: KVCache | None = None,
                num_recurrences: int | None = None) -> torch.Tensor:
        """Logits ``[B, T, V]`` fp32 of ``input_ids`` ``[B, T]`` (long).

        With ``cache`` (a dict, filled in place), the tokens continue the cached sequence: their
        positions start at the cached length. ``num_recurrences`` defaults to
        ``config.mean_recurrence``; KV slots follow `HuginnConfig.kv_slot`'s layout for that R.
        """
        r_total = self.config.mean_recurrence if num_recurrences is None else int(num_recurrences)
        past = next(iter(cache.values()))[0].shape[2] if cache else 0
        table, e = self._prelude(input_ids, past, cache)
        s = torch.zeros_like(e)
        for r in range(r_total):
            s = self._recurrence(s, e, table, cache, r)
        return self._coda_head(s, table, cache, r_total)

    # The three stages of `forward`, shared with `forward_train` so both run the same maths.
    def _prelude(self, input_ids: torch.Tensor, past: int, cache: KVCache | None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE table of the positions ``past ..`` and the embedded input ``e`` after the prelude."""
        c, tr = self.config, self.transformer
        positions = torch.arange(past, past + input_ids.shape[1], device=input_ids.device)
        table = rope_table(positions, c.head_dim, c.rope_base)
        e = tr.wte(input_ids) * c.embed_scale
        for i, block in enumerate(tr.prelude):
            e = block(e, table, cache, i)
        return table, e

    def _recurrence(self, s: torch.Tensor, e: torch.Tensor, table: torch.Tensor,
                    cache: KVCache | None, r: int) -> torch.Tensor:
        """Recurrence ``r``: the adapter over ``[s, e]`` then the core blocks."""
        c, tr = self.config, self.transformer
        s = tr.adapter(torch.cat([s, e], dim=-1))
        for b, block in enumerate(tr.core_block):
            s = block(s, table, cache, c.n_layers_in_prelude + r * c.n_layers_in_recurrent_block + b)
        return s

    def _coda_head(self, s: torch.Tensor, table: torch.Tensor, cache: KVCache | None,
                   r_total: int) -> torch.Tensor:
        """``ln_f``, the coda blocks, ``ln_f`` again and the (tied) head -> fp32 logits."""
        c, tr = self.config, self.transformer
        x = tr.ln_f(s)
        for i, block in enumerate(tr.coda):
            x = block(x, table, cache, c.n_layers_in_prelude + r_total * c.n_layers_in_recurrent_block + i)
        return self.lm_head(tr.ln_f(x)).float()

    # ----------------------------------------------------------------------------- training
    def forward_train(self, input_ids: torch.Tensor, num_recurrences: int | None = None,
                      backprop_depth: int | None = None, *, return_states: bool = False):
        """Training forward with truncated backpropagation through the recurrence (upstream's
        scheme, arXiv 2502.05171 section 3): the first ``R - k`` recurrences run under
        ``no_grad``, only the last ``k = min(backprop_depth, R)`` build a graph. The prelude
        still gets gradients, through the adapter's input ``e`` in those last ``k`` recurrences.

        Same maths as `forward` without a cache (zeros initial state, like serving), so the
        logits equal ``forward(input_ids, num_recurrences=R)``. ``backprop_depth=None`` means
        full backpropagation. Returns fp32 logits ``[B, T, V]``, and with ``return_states`` also
        the list of the ``R`` states after each recurrence (``requires_grad`` only on the last
        ``k``)."""
        r_total = self.config.mean_recurrence if num_recurrences is None else int(num_recurrences)
        k = r_total if backprop_depth is None else max(0, min(int(backprop_depth), r_total))
        table, e = self._prelude(input_ids, 0, None)
        s = torch.zeros_like(e)
        states = []
        with torch.no_grad():
            for r in range(r_total - k):
                s = self._recurrence(s, e, table, None, r)
                states.append(s)
        for r in range(r_total - k, r_total):
            s = self._recurrence(s, e, table, None, r)
            states.append(s)
        logits = self._coda_head(s, table, None, r_total)
        return (logits, states) if return_states else logits

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """Upstream-style initialisation (the ``init_values`` `config_json` writes, "takase"
        scheme): every linear and the embedding ``N(0, std)`` truncated at 3 std with ``std =
        sqrt(2 / (5 H))``; the residual-branch outputs (``attn.proj``, ``mlp.proj``) with ``std /
        sqrt(2 * depth)``, ``depth = P + C * R + K``; norms 1, ``qk_bias`` and biases 0."""
        c = self.config
        g = torch.Generator().manual_seed(seed)
        std = math.sqrt(2 / (5 * c.n_embd))
        out_std = std / math.sqrt(2 * c.num_kv_slots)
        for name, p in self.named_parameters():
            if "norm" in name or name.startswith("transformer.ln_f"):
                p.fill_(1.0)
                continue
            if name.endswith("qk_bias") or name.endswith(".bias"):
                p.zero_()
                continue
            sd = out_std if name.endswith("proj.weight") else std
            t = torch.randn(p.shape, generator=g).clamp_(-3, 3) * sd
            p.copy_(t)

    def save_pretrained(self, path: str | os.PathLike, *, dtype: torch.dtype = torch.bfloat16,
                        max_shard_bytes: int = 3_000_000, keep_freqs_cis: bool = False
                        ) -> list[str]:
        """Save in the upstream layout `write_random_checkpoint` writes: ``config.json``
        (`config_json`), safetensors shards ``model-0000i-of-0000n.safetensors`` with upstream
        names (tied ``lm_head`` omitted), ``model.safetensors.index.json``. ``keep_freqs_cis``
        also stores upstream's fp32 RoPE buffer (both loaders ignore it). Returns the shard
        file names; ``generation_config.json`` is the caller's."""
        from safetensors.torch import save_file

        c = self.config
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        own = self.state_dict()
        sd = {k: own[k].detach().to("cpu", dtype).contiguous() for k in upstream_param_names(c)}
        if keep_freqs_cis:
            table = rope_table(torch.arange(c.block_size), c.head_dim, c.rope_base)
            sd["freqs_cis"] = table[None, :, None].contiguous()
        shards: list[list[str]] = [[]]
        size = 0
        for k, v in sd.items():
            nbytes = v.numel() * v.element_size()
            if shards[-1] and size + nbytes > max_shard_bytes:
                shards.append([])
                size = 0
            shards[-1].append(k)
            size += nbytes
        files, weight_map = [], {}
        for i, part in enumerate(shards):
            fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file({k: sd[k] for k in part}, str(path / fn), metadata={"format": "pt"})
            weight_map.update({k: fn for k in part})
            files.append(fn)
        total = sum(v.numel() * v.element_size() for v in sd.values())
        (path / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
        (path / "config.json").write_text(json.dumps(config_json(c, dtype), indent=2) + "\n")
        return files

    @torch.no_grad()
    def greedy_generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
                        use_cache: bool = True, num_recurrences: int | None = None
                        ) -> list[list[int]]:
        """Greedy continuation of each prompt (batch 1 each): with ``use_cache`` a prefill then
        one-token steps on a per-(block, recurrence) KV cache; otherwise a full recompute per
        token. Returns the new tokens per prompt."""
        dev = self.lm_head.weight.device
        out = []
        for prompt in prompts:
            ids, new = list(map(int, prompt)), []
            cache: KVCache | None = {} if use_cache else None
            step = torch.tensor([ids], device=dev)
            for _ in range(max_new_tokens):
                logits = self(step if use_cache else torch.tensor([ids], device=dev),
                              cache=cache, num_recurrences=num_recurrences)
                nxt = int(logits[0, -1].argmax())
                ids.append(nxt)
                new.append(nxt)
                step = torch.tensor([[nxt]], device=dev)
            out.append(new)
        return out

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, dtype: torch.dtype = torch.float32
                        ) -> HuginnReferenceModel:
        """Load ``config.json`` and the safetensors files of a directory (``freqs_cis`` and a
        tied ``lm_head.weight`` are ignored), cast to ``dtype``."""
        from safetensors.torch import load_file

        path = Path(path)
        raw = json.loads((path / "config.json").read_text())
        for key in ("model_type", "architectures", "auto_map", "transformers_version"):
            raw.pop(key, None)
        model = cls(HuginnConfig(**raw))
        state: dict[str, torch.Tensor] = {}
        for f in sorted(path.glob("*.safetensors")):
            state.update(load_file(str(f)))
        state.pop("freqs_cis", None)
        if model.config.tie_embeddings:
            state.pop("lm_head.weight", None)
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [m for m in missing if not (model.config.tie_embeddings and m == "lm_head.weight")]
        if missing or unexpected:
            raise ValueError(f"checkpoint mismatch: missing={missing} unexpected={unexpected}")
        return model.to(dtype).eval()


# ------------------------------------------------------------------------------- checkpoints
def tiny_config(**overrides) -> HuginnConfig:
    """A small Huginn for tests: V=512, H=96, 3 heads (D=32), MLP 128, 1+2+1 blocks, R=4."""
    kw = dict(n_embd=96, n_heads=3, n_layers=4, n_layers_in_prelude=1,
              n_layers_in_recurrent_block=2, n_layers_in_coda=1, mean_recurrence=4,
              vocab_size=512, padding_multiple=64, intermediate_size=128, block_size=512,
              rope_base=50_000.0, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    kw.update(overrides)
    if "n_layers" not in overrides:
        kw["n_layers"] = kw["n_layers_in_prelude"] + kw["n_layers_in_recurrent_block"] + kw["n_layers_in_coda"]
    return HuginnConfig(**kw)


def random_state_dict(config: HuginnConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random fp32 weights with upstream names, scaled so activations are O(1) and the tied
    head's logits have std about 8 (clear top-1 margins, so greedy argmax agrees across fp32
    implementations); norms ``1 + 0.2 N(0,1)``, ``qk_bias`` ``0.5 N(0,1)``, linears
    ``N(0, 1/fan_in)``."""
    g = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in HuginnReferenceModel(config).state_dict().items()}
    sd = {}
    for name in upstream_param_names(config):
        shape = shapes[name]
        if "norm" in name or name.startswith("transformer.ln_f"):
            t = 1.0 + 0.2 * torch.randn(shape, generator=g)
        elif name == "transformer.wte.weight" or name == "lm_head.weight":
            t = torch.randn(shape, generator=g) * (8.0 / math.sqrt(config.n_embd))
        elif name.endswith("qk_bias") or name.endswith(".bias"):
            t = 0.5 * torch.randn(shape, generator=g)
        else:  # linear [out, in]
            t = torch.randn(shape, generator=g) / math.sqrt(shape[1])
        sd[name] = t
    return sd


def config_json(config: HuginnConfig, dtype: torch.dtype) -> dict:
    """``config.json`` in the upstream layout (the fields upstream's ``RavenConfig`` writes; no
    SGLang-facing aliases such as ``num_hidden_layers``)."""
    keys = ("n_embd", "n_heads", "n_layers", "block_size", "vocab_size", "padding_multiple",
            "tie_embeddings", "intermediate_size", "bias", "norm_eps", "n_layers_in_recurrent_block",
            "mean_recurrence", "n_layers_in_prelude", "n_layers_in_coda", "qk_bias", "rope_base",
            "injection_type", "state_init", "bos_token_id", "eos_token_id", "pad_token_id")
    d = {k: getattr(config, k) for k in keys}
    # Derived values upstream's RavenConfig also writes (HuginnConfig recomputes them on load).
    std = math.sqrt(2 / (5 * config.n_embd))
    depth = config.num_kv_slots
    d.update(num_key_value_heads=config.n_heads, head_dim=config.head_dim,
             padded_vocab_size=config.vocab_size, effective_expected_depth=depth,
             init_values={"std": std, "out_proj": std / math.sqrt(2 * depth), "embedding": std,
                          "embed_scale": math.sqrt(config.n_embd)})
    d.update(architectures=[HUGINN_ARCHITECTURE], model_type=HUGINN_MODEL_TYPE,
             torch_dtype=str(dtype).replace("torch.", ""))
    return dict(sorted(d.items()))


def write_random_checkpoint(path: str | os.PathLike, config_overrides: dict | None = None,
                            seed: int = 0, *, dtype: torch.dtype = torch.bfloat16) -> HuginnConfig:
    """Write a random checkpoint in the upstream format: two safetensors shards plus
    ``model.safetensors.index.json``, ``config.json`` (`config_json`), the ``freqs_cis`` buffer.

    Parameters
    ----------
    path
        Output directory (created).
    config_overrides
        Overrides of `tiny_config`.
    seed
        Seed of `random_state_dict`.
    dtype
        Storage dtype (bf16 like upstream; load in fp32 for exact comparisons).

    Returns
    -------
    HuginnConfig
        The config written.
    """
    from safetensors.torch import save_file

    config = tiny_config(**(config_overrides or {}))
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    sd = {k: v.to(dtype).contiguous() for k, v in random_state_dict(config, seed).items()}
    table = rope_table(torch.arange(config.block_size), config.head_dim, config.rope_base)
    sd["freqs_cis"] = table[None, :, None].contiguous()  # [1, block_size, 1, D/2, 2] fp32
    names = list(sd)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:])):
        fn = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({k: sd[k] for k in part}, str(path / fn), metadata={"format": "pt"})
        weight_map.update({k: fn for k in part})
    total = sum(v.numel() * v.element_size() for v in sd.values())
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    (path / "config.json").write_text(json.dumps(config_json(config, dtype), indent=2) + "\n")
    (path / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id,
         "pad_token_id": config.pad_token_id}, indent=2) + "\n")
    return config
