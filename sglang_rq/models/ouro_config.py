"""Configuration of ByteDance Ouro looped Transformers (``model_type = "ouro"``).

Ouro is not part of transformers 5.19 nor SGLang 0.5.23, so this module provides the config
class and :func:`register_ouro_config`, which registers it with ``transformers.AutoConfig``.

Defaults are those of Ouro-1.4B (see DESIGN.md section 2).  Two deliberate deviations from the
upstream ``config.json``:

* upstream sets ``bos_token_id = eos_token_id = pad_token_id = 0``; that is a known defect.  A
  config that arrives with ``bos == eos == 0`` is corrected on load to ``<|im_start|>`` = 1
  (bos) and ``<|im_end|>`` = 2 (eos), pad stays 0 (``<|endoftext|>``).
* ``num_loops`` (what SGLang reads to count loops) is a read-only alias of
  ``total_ut_steps``; it is never serialized separately.

``rope_theta`` is kept as a plain attribute (transformers 5 otherwise moves it into
``rope_parameters``); ``rope_parameters`` is also filled in (``rope_type="default"``) so that
transformers' own RoPE helpers see the same base.
"""

from __future__ import annotations

import logging
from typing import Any

from transformers import PretrainedConfig

logger = logging.getLogger(__name__)

OURO_MODEL_TYPE = "ouro"
OURO_ARCHITECTURE = "OuroForCausalLM"


class OuroConfig(PretrainedConfig):
    """Hyper-parameters of an Ouro model (defaults: Ouro-1.4B).

    Args:
        vocab_size: vocabulary size V (49152 for the SmolLM2 tokenizer).
        hidden_size: model width H.
        intermediate_size: SwiGLU inner width.
        num_hidden_layers: physical layers L (shared by every loop).
        num_attention_heads: query heads.
        num_key_value_heads: key/value heads (== heads for MHA; fewer for GQA).
        head_dim: per-head width D (default ``hidden_size // num_attention_heads``).
        hidden_act: MLP activation (only ``"silu"`` is supported by the reference).
        max_position_embeddings: longest supported context.
        initializer_range: std of the normal init used for fresh weights.
        rms_norm_eps: RMSNorm epsilon.
        rope_theta: RoPE base (NeoX / rotate-half layout).
        tie_word_embeddings: whether ``lm_head`` shares ``embed_tokens`` (False for Ouro).
        total_ut_steps: number of loops over the layer stack (4 for Ouro).
        early_exit_threshold: cumulative exit probability at which a token exits; 1.0 means
            "always use the last loop" (upstream default).
        bos_token_id / eos_token_id / pad_token_id: special token ids (corrected, see module
            docstring).
    """

    model_type = OURO_MODEL_TYPE
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(
        self,
        vocab_size: int = 49152,
        hidden_size: int = 2048,
        intermediate_size: int = 5632,
        num_hidden_layers: int = 24,
        num_attention_heads: int = 16,
        num_key_value_heads: int | None = 16,
        head_dim: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 65536,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        use_cache: bool = True,
        rope_theta: float | None = None,
        rope_scaling: dict | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        tie_word_embeddings: bool = False,
        total_ut_steps: int = 4,
        early_exit_threshold: float = 1.0,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        pad_token_id: int | None = 0,
        **kwargs: Any,
    ) -> None:
        # ``num_loops`` is derived from total_ut_steps; accept it on input for symmetry.
        num_loops = kwargs.pop("num_loops", None)
        if num_loops is not None and total_ut_steps is not None and int(num_loops) != int(total_ut_steps):
            raise ValueError(f"num_loops={num_loops} disagrees with total_ut_steps={total_ut_steps}")
        rope_parameters = kwargs.pop("rope_parameters", None)
        if rope_theta is None:
            if isinstance(rope_parameters, dict) and "rope_theta" in rope_parameters:
                rope_theta = rope_parameters["rope_theta"]
            else:
                rope_theta = 1_000_000.0
        if rope_scaling not in (None, {}) and (
            not isinstance(rope_scaling, dict)
            or rope_scaling.get("rope_type", rope_scaling.get("type", "default")) != "default"
        ):
            raise ValueError(f"Ouro supports only plain RoPE, got rope_scaling={rope_scaling!r}")

        if num_key_value_heads is None:
            num_key_value_heads = num_attention_heads
        if head_dim is None:
            head_dim = hidden_size // num_attention_heads
        if num_attention_heads % num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")

        # Upstream defect: bos = eos = pad = 0.  Correct to the ChatML ids of the tokenizer.
        if bos_token_id == 0 and eos_token_id in (0, [0]):
            logger.warning(
                "Ouro config has bos_token_id = eos_token_id = 0 (upstream defect); "
                "using bos=1 (<|im_start|>), eos=2 (<|im_end|>), pad=0."
            )
            bos_token_id, eos_token_id = 1, 2
            if pad_token_id is None:
                pad_token_id = 0

        self.vocab_size = int(vocab_size)
        self.hidden_size = int(hidden_size)
        self.intermediate_size = int(intermediate_size)
        self.num_hidden_layers = int(num_hidden_layers)
        self.num_attention_heads = int(num_attention_heads)
        self.num_key_value_heads = int(num_key_value_heads)
        self.head_dim = int(head_dim)
        self.hidden_act = hidden_act
        self.max_position_embeddings = int(max_position_embeddings)
        self.initializer_range = float(initializer_range)
        self.rms_norm_eps = float(rms_norm_eps)
        self.use_cache = use_cache
        self.attention_bias = bool(attention_bias)
        self.attention_dropout = float(attention_dropout)
        self.total_ut_steps = int(total_ut_steps)
        self.early_exit_threshold = float(early_exit_threshold)
        self.rope_theta = float(rope_theta)
        self.rope_parameters = {"rope_type": "default", "rope_theta": float(rope_theta)}

        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        # transformers' RoPE standardization may move / drop the legacy attribute: restore it.
        self.__dict__["rope_theta"] = float(rope_theta)
        if not isinstance(getattr(self, "rope_parameters", None), dict):
            self.rope_parameters = {"rope_type": "default", "rope_theta": float(rope_theta)}
        self.rope_parameters.setdefault("rope_theta", float(rope_theta))

    @property
    def num_loops(self) -> int:
        """Loop count as SGLang names it (``config.num_loops``); equals ``total_ut_steps``."""
        return self.total_ut_steps

    @property
    def num_kv_slots(self) -> int:
        """Number of (loop, layer) KV slots: ``total_ut_steps * num_hidden_layers``."""
        return self.total_ut_steps * self.num_hidden_layers

    def kv_slot(self, loop: int, layer: int) -> int:
        """KV slot (SGLang ``layer_id``) of ``(loop, layer)`` (`sglang_rq.layout.kv_slot`)."""
        from sglang_rq.layout import kv_slot

        return kv_slot(loop, layer, self.num_hidden_layers)


def register_ouro_config() -> None:
    """Register :class:`OuroConfig` with ``transformers.AutoConfig`` under ``"ouro"``.

    Idempotent: a second call (or a prior registration of this same class) is a no-op; a
    different class already registered under ``"ouro"`` is left in place with a warning.
    """
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        existing = CONFIG_MAPPING[OURO_MODEL_TYPE]
    except KeyError:
        existing = None
    if existing is OuroConfig:
        return
    if existing is not None:
        logger.warning("model_type 'ouro' is already registered to %r; keeping it", existing)
        return
    try:
        AutoConfig.register(OURO_MODEL_TYPE, OuroConfig)
    except ValueError:
        # Registered concurrently (or by an identical class object from a reload): ignore.
        pass
