"""The canary's question: `CanarySpec` (JSON), its recording from the fp32 reference model and
its binding to the weights (`weights_fingerprint`, `load_spec_for`). See `sglang_rq.canary`."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_PROMPTS = (
    "The capital of France is",
    "Question: What is 2 + 3?\nAnswer:",
    "Once upon a time, there was a",
    "The quick brown fox jumps over the",
)


@dataclass(frozen=True)
class CanarySpec:
    """The question and its known greedy answer (token ids; tokenizer-independent)."""

    input_ids: list[int]
    max_new_tokens: int = 8
    expect_ids: list[int] = field(default_factory=list)
    match_tokens: int = 0
    prompt: str = ""
    weights_fingerprint: str = ""

    def __post_init__(self) -> None:
        def ids(x) -> bool:
            return isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                               and t >= 0 for t in x)

        if not ids(self.input_ids) or not ids(self.expect_ids):
            raise ValueError("canary spec: input_ids and expect_ids must be lists of token ids "
                             "(integers >= 0)")
        if not self.input_ids:
            raise ValueError("canary spec: input_ids is empty")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"canary spec: max_new_tokens={self.max_new_tokens!r} must be an "
                             "integer >= 1")
        if self.match_tokens > len(self.expect_ids) or self.match_tokens > self.max_new_tokens:
            raise ValueError(f"canary spec: match_tokens={self.match_tokens} exceeds expect_ids "
                             f"({len(self.expect_ids)}) or max_new_tokens ({self.max_new_tokens})")

    @classmethod
    def load(cls, path: str | Path) -> CanarySpec:
        """The spec in the JSON file ``path``.

        Raises
        ------
        ValueError
            Naming ``path``: not readable, not JSON, not an object of the spec's fields, or a
            spec `__post_init__` refuses (a review got a bare JSONDecodeError or TypeError
            traceback from a malformed ``--rq-canary-file``, 13 s into start-up).
        """
        try:
            data = json.loads(Path(path).read_text())
            if not isinstance(data, dict):
                raise ValueError(f"a JSON object of {', '.join(cls.__dataclass_fields__)} "
                                 "is expected")
            return cls(**data)
        except (OSError, TypeError, ValueError) as exc:  # JSONDecodeError is a ValueError
            why = str(exc).removeprefix("canary spec: ")
            raise ValueError(f"canary spec {path}: {why}") from exc

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=1) + "\n")


def weights_fingerprint(model_path: str | Path) -> str:
    """sha256 over name, size and a 1 MiB tail sample of every ``*.safetensors`` file.

    Cheap (reads ~1 MiB per shard) and changes when the weights are retrained.
    """
    h = hashlib.sha256()
    for f in sorted(Path(model_path).glob("*.safetensors")):
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with open(f, "rb") as fh:
            fh.seek(max(0, size - (1 << 20)))
            h.update(fh.read())
    return h.hexdigest()


def load_spec_for(model_path: str, spec_file: str = "") -> tuple[CanarySpec | None, str]:
    """``(spec, stale_reason)`` for a model directory; the reason is non-empty on a mismatch."""
    path = Path(spec_file) if spec_file else Path(model_path) / "canary.json"
    if not path.is_file():
        if spec_file:
            return None, f"canary file {spec_file} not found"
        logger.warning("sglang-rq canary: no %s; readiness only checks that generation works", path)
        return None, ""
    spec = CanarySpec.load(path)
    if spec.weights_fingerprint and Path(model_path).is_dir():
        if weights_fingerprint(model_path) != spec.weights_fingerprint:
            return spec, (f"{path} was recorded for other weights (fingerprint mismatch); "
                          "re-run `python -m sglang_rq.canary record`")
    return spec, ""


def record(model_path: str | Path, *, prompts: tuple[str, ...] = DEFAULT_PROMPTS,
           max_new_tokens: int = 8, min_margin: float = 3.0,
           max_match_tokens: int = 4) -> CanarySpec:
    """A spec from the fp32 reference model: the prompt with the longest confident answer.

    ``match_tokens`` counts the leading greedy tokens (at most ``max_match_tokens``) whose top-1
    minus top-2 logit is at least ``min_margin``. BF16 weights and the 2-bit cache move logits,
    and the drift grows with every decoded token: on a random test checkpoint a token with a
    2.4 margin at step 8 flipped, so the defaults keep to early tokens with a margin of 3.
    """
    import torch

    from sglang_rq.models.ouro_reference import OuroReferenceModel

    model = OuroReferenceModel.from_pretrained(model_path, dtype=torch.float32)
    tok_file = Path(model_path) / "tokenizer.json"
    best: CanarySpec | None = None
    for text in prompts:
        if tok_file.is_file():
            from tokenizers import Tokenizer

            ids = Tokenizer.from_file(str(tok_file)).encode(text).ids
        else:
            ids = [int(b) % model.config.vocab_size for b in text.encode()]
        if not ids or max(ids) >= model.config.vocab_size:
            continue  # tokenizer larger than the model's vocabulary (test checkpoints)
        seq, confident, margins_ok = list(ids), 0, True
        with torch.no_grad():
            for _ in range(max_new_tokens):
                logits = model(torch.tensor([seq]))[0, -1]
                top = torch.topk(logits, 2).values
                margins_ok = margins_ok and float(top[0] - top[1]) >= min_margin
                confident += int(margins_ok and confident < max_match_tokens)
                seq.append(int(logits.argmax()))
        spec = CanarySpec(input_ids=list(ids), max_new_tokens=max_new_tokens,
                          expect_ids=seq[len(ids):], match_tokens=confident, prompt=text,
                          weights_fingerprint=weights_fingerprint(model_path))
        if best is None or spec.match_tokens > best.match_tokens:
            best = spec
    if best is None or best.match_tokens == 0:
        raise RuntimeError(f"no prompt has a greedy first token with margin >= {min_margin}; "
                           "pass other --prompt values or a lower --min-margin")
    return best
