"""Configuration of Huginn recurrent-depth models (``model_type = "huginn_raven"``).

Huginn-3.5B (arXiv 2502.05171, ``RavenForCausalLM``) is in neither transformers 5.19 nor SGLang
0.5.23; upstream ships its config as remote code (``raven_config_minimal.py``). This module
re-declares it with the same field names and defaults (read from that file: ``n_embd`` 5280,
``n_heads`` 55, ``n_layers`` 8, ``n_layers_in_prelude`` 2, ``n_layers_in_recurrent_block`` 4,
``n_layers_in_coda`` 2, ``mean_recurrence`` 32, ``vocab_size`` 65536, ``block_size`` 4096,
``intermediate_size`` 17920, ``norm_eps`` 1e-6, ``rope_base`` 50000, ``qk_bias`` True,
``tie_embeddings`` True, ``bias`` False) and :func:`register_huginn_config`, which registers it
with ``transformers.AutoConfig`` so SGLang reads an upstream ``config.json`` without remote code.

Derived attributes, recomputed on every construction (never read back from a file):

* ``hidden_size`` / ``num_attention_heads`` alias ``n_embd`` / ``n_heads`` (as upstream);
  ``num_key_value_heads = n_heads`` (MHA), ``head_dim = n_embd // n_heads``.
* ``num_hidden_layers`` is **the number of KV slots** ``P + C * R + K`` (prelude, core blocks x
  recurrences, coda; 132 for Huginn-3.5B at R = 32), because that is what SGLang sizes its KV pool
  by (one ``RadixAttention`` per slot, see `kv_slot`). Upstream maps it to ``n_layers`` (8
  physical blocks); that value stays in ``n_layers``. There is deliberately no ``num_loops``
  attribute: SGLang would multiply the slot count by it.
* ``num_recurrences`` = ``mean_recurrence``: the recurrence count the server runs (upstream
  samples it during training and runs ``mean_recurrence`` at inference).
* ``max_position_embeddings = block_size`` (SGLang's context length), ``tie_word_embeddings =
  tie_embeddings``, ``embed_scale = sqrt(n_embd)``.

Upstream fields this code does not use (init strategy, sampling scheme, class names, ...) are
kept as plain attributes so that a round trip through ``to_dict`` preserves them.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from transformers import PretrainedConfig

from sglang_rq.layout import HUGINN_MODEL_TYPE

logger = logging.getLogger(__name__)

HUGINN_ARCHITECTURE = "RavenForCausalLM"

# Attributes computed from the upstream fields; a value arriving in kwargs (a to_dict round
# trip) is dropped and recomputed.
_DERIVED = ("num_hidden_layers", "num_key_value_heads", "head_dim", "max_position_embeddings",
            "tie_word_embeddings", "padded_vocab_size", "num_recurrences", "embed_scale",
            "effective_expected_depth", "init_values", "num_kv_slots")


# Upstream fields the derived attributes are computed from.
_UPSTREAM_SHAPE = ("n_embd", "n_heads", "vocab_size", "block_size", "mean_recurrence",
                   "n_layers_in_prelude", "n_layers_in_recurrent_block", "n_layers_in_coda",
                   "tie_embeddings")


class HuginnConfig(PretrainedConfig):
    """Hyper-parameters of a Huginn (Raven) recurrent-depth model (defaults: Huginn-3.5B).

    Parameters
    ----------
    n_embd
        Model width H.
    n_heads
        Attention heads (MHA: as many KV heads); ``head_dim = n_embd // n_heads``.
    n_layers
        Physical blocks ``P + C + K`` (checked against the three counts below).
    n_layers_in_prelude, n_layers_in_recurrent_block, n_layers_in_coda
        P prelude blocks (run once), C core blocks (run ``mean_recurrence`` times), K coda blocks.
    mean_recurrence
        Recurrences R of the core at inference.
    block_size
        Longest context (the RoPE table length upstream).
    vocab_size
        Vocabulary V (upstream sets ``padded_vocab_size = vocab_size``).
    intermediate_size
        Gated-MLP inner width; ``mlp.fc`` produces ``2 * intermediate_size``.
    norm_eps
        RMSNorm epsilon.
    rope_base
        RoPE base (GPT-J layout: adjacent channel pairs).
    qk_bias
        Whether attention has the learned ``qk_bias`` added to q and k before RoPE.
    tie_embeddings
        ``lm_head`` shares ``wte`` (True for Huginn).
    bias
        Bias of the ``adapter`` linear (False upstream).
    """

    model_type = HUGINN_MODEL_TYPE
    keys_to_ignore_at_inference = ["past_key_values"]
    attribute_map = {"num_attention_heads": "n_heads", "hidden_size": "n_embd"}

    def __init__(
        self,
        n_embd: int = 5280,
        n_heads: int = 55,
        n_layers: int = 8,
        block_size: int = 4096,
        vocab_size: int = 65536,
        padding_multiple: int = 4096,
        tie_embeddings: bool = True,
        intermediate_size: int = 17920,
        bias: bool = False,
        norm_eps: float = 1e-6,
        n_layers_in_recurrent_block: int = 4,
        mean_recurrence: int = 32,
        n_layers_in_prelude: int = 2,
        n_layers_in_coda: int = 2,
        qk_bias: bool = True,
        rope_base: float = 50_000.0,
        injection_type: str = "linear",
        state_init: str = "like-init",
        **kwargs: Any,
    ) -> None:
        for key in _DERIVED:
            kwargs.pop(key, None)
        if n_layers != n_layers_in_prelude + n_layers_in_recurrent_block + n_layers_in_coda:
            raise ValueError(
                f"n_layers={n_layers} != n_layers_in_prelude ({n_layers_in_prelude}) + "
                f"n_layers_in_recurrent_block ({n_layers_in_recurrent_block}) + n_layers_in_coda "
                f"({n_layers_in_coda})")
        if n_embd % n_heads:
            raise ValueError(f"n_embd={n_embd} is not a multiple of n_heads={n_heads}")
        if mean_recurrence < 1 or n_layers_in_recurrent_block < 1:
            raise ValueError(f"mean_recurrence={mean_recurrence} and n_layers_in_recurrent_block="
                             f"{n_layers_in_recurrent_block} must be >= 1")
        if injection_type != "linear":
            raise ValueError(f"injection_type={injection_type!r}: only 'linear' (the adapter over "
                             "[state, embedded]) is supported")
        self.n_embd = int(n_embd)
        self.n_heads = int(n_heads)
        self.n_layers = int(n_layers)
        self.block_size = int(block_size)
        self.vocab_size = int(vocab_size)
        self.padding_multiple = int(padding_multiple)
        self.tie_embeddings = bool(tie_embeddings)
        self.intermediate_size = int(intermediate_size)
        self.bias = bool(bias)
        self.norm_eps = float(norm_eps)
        self.n_layers_in_recurrent_block = int(n_layers_in_recurrent_block)
        self.mean_recurrence = int(mean_recurrence)
        self.n_layers_in_prelude = int(n_layers_in_prelude)
        self.n_layers_in_coda = int(n_layers_in_coda)
        self.qk_bias = bool(qk_bias)
        self.rope_base = float(rope_base)
        self.injection_type = injection_type
        self.state_init = state_init
        super().__init__(tie_word_embeddings=self.tie_embeddings, **kwargs)
        self._set_derived()

    def __setattr__(self, key: str, value: Any) -> None:
        # SGLang's --json-model-override-args (sglang-rq's --rq-recurrences) setattr()s upstream
        # fields after construction; keep the derived slot count in step.
        super().__setattr__(key, value)
        if key in _UPSTREAM_SHAPE and "padded_vocab_size" in self.__dict__:
            self._set_derived()

    def _set_derived(self) -> None:
        self.padded_vocab_size = self.vocab_size
        self.num_key_value_heads = self.n_heads
        self.head_dim = self.n_embd // self.n_heads
        self.max_position_embeddings = self.block_size
        self.num_recurrences = self.mean_recurrence
        self.num_hidden_layers = self.num_kv_slots
        self.embed_scale = math.sqrt(self.n_embd)

    # ------------------------------------------------------------------ KV slots
    @property
    def num_kv_slots(self) -> int:
        """KV slots ``P + C * R + K`` (SGLang's layer count): one per (block, recurrence)."""
        return (self.n_layers_in_prelude + self.n_layers_in_recurrent_block * self.mean_recurrence
                + self.n_layers_in_coda)

    def kv_slot(self, stage: str, block: int, recurrence: int = 0) -> int:
        """SGLang ``layer_id`` of a block's KV slot.

        Layout: prelude block ``p`` -> ``p``; core block ``b`` at recurrence ``r`` ->
        ``P + r * C + b``; coda block ``c`` -> ``P + R * C + c`` (upstream's cache indexes the
        prelude and core the same way and the coda by -1, -2).

        Raises
        ------
        ValueError
            On an unknown ``stage`` or an index out of range.
        """
        p, c, k = self.n_layers_in_prelude, self.n_layers_in_recurrent_block, self.n_layers_in_coda
        r_max = self.mean_recurrence
        if stage == "prelude" and 0 <= block < p and recurrence == 0:
            return block
        if stage == "core" and 0 <= block < c and 0 <= recurrence < r_max:
            return p + recurrence * c + block
        if stage == "coda" and 0 <= block < k and recurrence == 0:
            return p + r_max * c + block
        raise ValueError(f"no KV slot for stage={stage!r} block={block} recurrence={recurrence} "
                         f"(P={p}, C={c}, K={k}, R={r_max})")


def register_huginn_config() -> None:
    """Register :class:`HuginnConfig` with ``transformers.AutoConfig`` under ``"huginn_raven"``.

    Idempotent; a different class already registered under that name is left in place with a
    warning.
    """
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        existing = CONFIG_MAPPING[HUGINN_MODEL_TYPE]
    except KeyError:
        existing = None
    if existing is HuginnConfig:
        return
    if existing is not None:
        logger.warning("model_type %r is already registered to %r; keeping it",
                       HUGINN_MODEL_TYPE, existing)
        return
    try:
        AutoConfig.register(HUGINN_MODEL_TYPE, HuginnConfig)
    except ValueError:
        pass  # registered concurrently
