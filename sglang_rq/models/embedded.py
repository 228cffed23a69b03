"""The embedded model: the mini-Ouro checkpoint shipped inside the package.

`EMBEDDED_MODEL` is what ``sglang-rq serve`` serves without ``--model-path`` and the default
``--model-path`` of ``sglang-rq eval`` / ``calibrate``; ``training/`` builds it (see
``training/README.md``). Its KV shape is ``ModelKVShape.from_hf_config(EMBEDDED_MODEL)``.
"""

from __future__ import annotations

from pathlib import Path

EMBEDDED_MODEL = Path(__file__).resolve().parents[1] / "assets" / "mini-ouro"
"""Directory of the embedded mini-Ouro (``config.json``, ``model.safetensors``, tokenizer)."""
