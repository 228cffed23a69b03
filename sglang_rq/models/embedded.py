"""The embedded models: the mini-Ouro (default) and mini-Huginn checkpoints shipped inside the
package.

`EMBEDDED_MODEL` is what ``sglang-rq serve`` serves without ``--model-path`` and the default
``--model-path`` of ``sglang-rq eval`` / ``calibrate``; ``training/`` builds it (see
``training/README.md``). Its KV shape is ``ModelKVShape.from_hf_config(EMBEDDED_MODEL)``.
"""

from __future__ import annotations

from pathlib import Path

EMBEDDED_MODEL = Path(__file__).resolve().parents[1] / "assets" / "mini-ouro"
"""Directory of the embedded mini-Ouro (``config.json``, ``model.safetensors``, tokenizer)."""

EMBEDDED_HUGINN = Path(__file__).resolve().parents[1] / "assets" / "mini-huginn"
"""Directory of the embedded mini-Huginn (recurrent depth, ``huginn_raven``: 1 prelude + 2 core
x 32 recurrences + 1 coda blocks, head_dim 96; built by ``training/train_mini_huginn.py``)."""
