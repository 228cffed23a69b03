"""ByteDance Ouro (looped Transformer, arXiv 2510.25741) for SGLang 0.5.23.

One stack of ``num_hidden_layers`` physical layers is run ``total_ut_steps`` times per token.
Each (loop u, layer l) has its own `RadixAttention` with ``layer_id = u * num_layers + l``, so the
KV pool sees ``num_layers * num_loops`` logical layers (SGLang multiplies its layer count by
``config.num_loops``). Layers are "sandwich" normed::

    h = x + norm_b(attn(norm_a(x)))          # input_layernorm, input_layernorm_2
    y = h + norm_d(mlp(norm_c(h)))           # post_attention_layernorm(_2)

and after every full pass ``model.norm`` is applied; the normed state feeds the next loop.

Early exit (all loops are always computed, as upstream): ``exit_mode`` in the HF config (or
``--json-model-override-args``) selects the state given to ``lm_head``: ``last`` (default),
``step`` (``exit_step``), ``threshold`` (first loop whose cumulative exit probability reaches
``early_exit_threshold``, per token) or ``weighted`` (sum of per-loop logits weighted by the exit
probabilities ``p_t = lambda_t * prod_{j<t} (1 - lambda_j)``, ``lambda_t = sigmoid(gate(h_t))``).
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from sglang.srt.layers.activation import SiluAndMul
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.layers.quantization.base_config import QuantizationConfig
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.layers.rotary_embedding import get_rope
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_loader.weight_utils import default_weight_loader
from sglang.srt.runtime_context import get_parallel
from sglang.srt.utils import add_prefix

from sglang_rq.layout import kv_slot
from sglang_rq.models.exit_gate import exit_probabilities, select_exit_state

EXIT_MODES = ("last", "step", "threshold", "weighted")


class OuroMLP(nn.Module):
    """SwiGLU MLP: ``down(silu(gate(x)) * up(x))``, ``[num_tokens, hidden]``."""

    def __init__(self, config, quant_config: QuantizationConfig | None, prefix: str) -> None:
        super().__init__()
        if config.hidden_act != "silu":
            raise ValueError(f"Ouro supports hidden_act='silu' only, got {config.hidden_act!r}")
        self.gate_up_proj = MergedColumnParallelLinear(
            config.hidden_size, [config.intermediate_size] * 2, bias=False,
            quant_config=quant_config, prefix=add_prefix("gate_up_proj", prefix))
        self.down_proj = RowParallelLinear(
            config.intermediate_size, config.hidden_size, bias=False,
            quant_config=quant_config, prefix=add_prefix("down_proj", prefix))
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, _ = self.gate_up_proj(x)
        out, _ = self.down_proj(self.act_fn(gate_up))
        return out


class OuroAttention(nn.Module):
    """Causal self-attention with RoPE; one `RadixAttention` (own KV slot) per loop."""

    def __init__(self, config, layer_id: int, quant_config: QuantizationConfig | None,
                 prefix: str) -> None:
        super().__init__()
        tp_size = get_parallel().tp_size
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        total_heads, total_kv = config.num_attention_heads, config.num_key_value_heads
        if total_heads % tp_size or (total_kv % tp_size and tp_size % total_kv):
            raise ValueError(f"heads {total_heads}/{total_kv} do not split over tp_size={tp_size}")
        self.num_heads = total_heads // tp_size
        self.num_kv_heads = max(1, total_kv // tp_size)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, self.head_dim, total_heads, total_kv, bias=False,
            quant_config=quant_config, prefix=add_prefix("qkv_proj", prefix))
        self.o_proj = RowParallelLinear(
            total_heads * self.head_dim, config.hidden_size, bias=False,
            quant_config=quant_config, prefix=add_prefix("o_proj", prefix))
        self.rotary_emb = get_rope(
            self.head_dim, rotary_dim=self.head_dim, max_position=config.max_position_embeddings,
            base=config.rope_theta, rope_scaling=getattr(config, "rope_scaling", None) or None)
        num_layers = config.num_hidden_layers
        self.attn = nn.ModuleList(
            RadixAttention(self.num_heads, self.head_dim, self.head_dim**-0.5,
                           num_kv_heads=self.num_kv_heads,
                           layer_id=kv_slot(loop, layer_id, num_layers),
                           quant_config=quant_config, prefix=add_prefix(f"attn.{loop}", prefix))
            for loop in range(config.total_ut_steps)
        )

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor,
                forward_batch: ForwardBatch, loop: int) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        out = self.attn[loop](q, k, v, forward_batch)
        out, _ = self.o_proj(out)
        return out


class OuroDecoderLayer(nn.Module):
    """One physical layer with Ouro's four sandwich norms."""

    def __init__(self, config, layer_id: int, quant_config: QuantizationConfig | None,
                 prefix: str) -> None:
        super().__init__()
        self.self_attn = OuroAttention(config, layer_id, quant_config, add_prefix("self_attn", prefix))
        self.mlp = OuroMLP(config, quant_config, add_prefix("mlp", prefix))
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps=eps)
        self.input_layernorm_2 = RMSNorm(config.hidden_size, eps=eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=eps)
        self.post_attention_layernorm_2 = RMSNorm(config.hidden_size, eps=eps)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, forward_batch: ForwardBatch,
                loop: int) -> torch.Tensor:
        h = x + self.input_layernorm_2(
            self.self_attn(positions, self.input_layernorm(x), forward_batch, loop))
        return h + self.post_attention_layernorm_2(self.mlp(self.post_attention_layernorm(h)))


class OuroModel(nn.Module):
    """Embedding, the shared layer stack run ``total_ut_steps`` times, final norm and exit gate."""

    def __init__(self, config, quant_config: QuantizationConfig | None = None,
                 prefix: str = "") -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = VocabParallelEmbedding(
            config.vocab_size, config.hidden_size, prefix=add_prefix("embed_tokens", prefix))
        self.layers = nn.ModuleList(
            OuroDecoderLayer(config, i, quant_config, add_prefix(f"layers.{i}", prefix))
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.early_exit_gate = ReplicatedLinear(config.hidden_size, 1, bias=True,
                                                prefix=add_prefix("early_exit_gate", prefix))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                forward_batch: ForwardBatch, input_embeds: torch.Tensor | None = None
                ) -> list[torch.Tensor]:
        """Returns the normed state after every loop: ``num_loops x [num_tokens, hidden]``."""
        x = self.embed_tokens(input_ids) if input_embeds is None else input_embeds
        states = []
        for loop in range(self.config.total_ut_steps):
            for layer in self.layers:
                x = layer(positions, x, forward_batch, loop)
            x = self.norm(x)
            states.append(x)
        return states


class OuroForCausalLM(nn.Module):
    """SGLang entry class for ``architectures: ["OuroForCausalLM"]``."""

    def __init__(self, config, quant_config: QuantizationConfig | None = None,
                 prefix: str = "") -> None:
        super().__init__()
        self.config = config
        self.exit_mode = getattr(config, "exit_mode", None) or (
            "threshold" if getattr(config, "early_exit_threshold", 1.0) < 1.0 else "last")
        if self.exit_mode not in EXIT_MODES:
            raise ValueError(f"exit_mode={self.exit_mode!r}; choose one of {EXIT_MODES}")
        self.model = OuroModel(config, quant_config, add_prefix("model", prefix))
        if config.tie_word_embeddings:
            self.lm_head = self.model.embed_tokens
        else:
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size,
                                          prefix=add_prefix("lm_head", prefix))
        self.logits_processor = LogitsProcessor(config)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                forward_batch: ForwardBatch, input_embeds: torch.Tensor | None = None,
                get_embedding: bool = False):
        states = self.model(input_ids, positions, forward_batch, input_embeds)
        if self.exit_mode == "weighted":
            probs = exit_probabilities(self._gate_logits(states))  # [num_tokens, num_loops]
            outs = [self.logits_processor(input_ids, s, self.lm_head, forward_batch) for s in states]
            out = outs[-1]
            idx = _selected_rows(forward_batch, states[0].shape[0], out.next_token_logits.shape[0])
            p = probs[idx]
            out.next_token_logits = sum(
                p[:, t:t + 1].to(o.next_token_logits.dtype) * o.next_token_logits
                for t, o in enumerate(outs))
            return out
        if self.exit_mode == "last":
            hidden = states[-1]
        else:
            hidden = select_exit_state(
                states, self._gate_logits(states) if self.exit_mode == "threshold" else None,
                mode=self.exit_mode, step=getattr(self.config, "exit_step", None),
                threshold=getattr(self.config, "early_exit_threshold", 1.0))
        return self.logits_processor(input_ids, hidden, self.lm_head, forward_batch)

    def _gate_logits(self, states: list[torch.Tensor]) -> torch.Tensor:
        """Exit-gate logits ``[num_tokens, num_loops]`` fp32."""
        return torch.cat([self.model.early_exit_gate(s)[0].float() for s in states], dim=-1)

    _STACKED = (("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"),
                ("qkv_proj", "v_proj", "v"), ("gate_up_proj", "gate_proj", 0),
                ("gate_up_proj", "up_proj", 1))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load upstream-format names (``model.layers.{i}.self_attn.q_proj.weight`` ...).

        Raises
        ------
        ValueError
            On an unknown tensor name or a parameter left unloaded.
        """
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, w in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if self.config.tie_word_embeddings and name == "lm_head.weight":
                continue
            for fused, part, shard in self._STACKED:
                if f".{part}." in name:
                    target = name.replace(part, fused)
                    params[target].weight_loader(params[target], w, shard)
                    loaded.add(target)
                    break
            else:
                if name not in params:
                    raise ValueError(f"checkpoint tensor {name!r} has no parameter in OuroForCausalLM")
                p = params[name]
                getattr(p, "weight_loader", default_weight_loader)(p, w)
                loaded.add(name)
        missing = set(params) - loaded
        if missing:
            raise ValueError(f"checkpoint is missing {sorted(missing)[:5]} ({len(missing)} in all)")


def _selected_rows(forward_batch: ForwardBatch, num_tokens: int, num_rows: int) -> torch.Tensor:
    """Token rows the logits processor kept: the last token of each extend, every decode token."""
    if num_rows == num_tokens:
        return torch.arange(num_tokens, device=forward_batch.seq_lens.device)
    lens = forward_batch.extend_seq_lens
    return torch.cumsum(lens, 0) - 1


EntryClass = [OuroForCausalLM]
