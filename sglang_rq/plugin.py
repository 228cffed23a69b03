"""The SGLang plugin: the only module that registers hooks (entry point ``sglang.srt.plugins``).

SGLang runs `register` in every process (engine, scheduler, detokenizer) before the scheduler
builds anything. It always registers the Ouro model and config; when ``SGLANG_RQ_CONFIG`` holds an
enabled `RQConfig` (set by the launcher) it also installs, on private names of SGLang 0.5.23:

* ``DefaultPoolConfigurator._compute_cell_size`` (AROUND): cell size = `layout.kv_bytes_per_token`,
* ``DefaultPoolConfigurator.__init__`` (AFTER): staging + rotation bytes as fixed overhead,
* ``KVCacheConfigurator._profile_available_bytes`` (AROUND): an explicit byte budget
  (``--rq-kv-budget-gb``) when given,
* ``SRTPlatform.get_kv_pool_cls`` (AROUND): the `RQTokenToKVPool` for ``kind == "mha"``,
* the attention backends ``rq_native`` (CPU reference) and ``rq_triton`` (CUDA kernels).

Under the launcher (``SGLANG_RQ_CONFIG`` set, the RQ pool on or off) it also installs
``TokenizerManager._validate_one_request`` (AROUND): token ids outside ``[0, vocab_size)`` and
prompts of no tokens are refused with a 400 (SGLang 0.5.23 checks only ``token_ids_logprob``; an
out-of-vocabulary ``input_ids``, or ``"text": ""``, on ``/generate`` killed the server), as are
log-probability requests the scheduler cannot serve and a ``top_k`` of 0 or below -1 at any
temperature,
``GenerateReqInput._handle_parallel_sampling`` (AROUND: an ``n`` that is not an integer in
``[1, --rq-max-n]`` is refused with a 400 before the request is copied n times),
``sglang.srt.utils.auth.decide_request_auth`` (AROUND: the readiness probe ``/rq/ready`` needs no
``--api-key``, as SGLang's ``/health`` and ``/ready`` need none),
``OpenAIServingChat._validate_request`` (AROUND: a chat ``max_completion_tokens`` below 1 is a
400; SGLang read 0 as unset and generated to the end of the context),
``WeightUpdater.update_weights_from_disk`` (AROUND: a failed update reloads the weights the
server had, instead of ending it),
``GenerateReqInput._determine_batch_size`` (AROUND: an ``input_embeds`` of ``[]`` or ``[[]]``
is a 400; SGLang indexed its first row, a 500),
``OpenAIServingDetokenize._validate_request`` (AROUND: ``/v1/detokenize`` token ids below 0 or
past 32 bits are a 400; the tokenizer's ``OverflowError`` was a 500), and
``CpuDeviceMixin.empty_cache`` (AFTER: ``malloc_trim(0)``, so ``/flush_cache`` on a CPU server
returns the C heap's free pages to the OS; docs/robustness.md section 6).

Every hook is verified after ``HookRegistry.apply_hooks()``; one that did not apply stops the
process (SystemExit, which SGLang's plugin loader does not swallow).
"""

from __future__ import annotations

import logging
from typing import Any

from sglang_rq import env
from sglang_rq.config import RQConfig, RQConfigError

logger = logging.getLogger(__name__)

_CFG = "sglang.srt.model_executor.pool_configurator.DefaultPoolConfigurator"
HOOK_TARGETS = (
    f"{_CFG}._compute_cell_size",
    f"{_CFG}.__init__",
    "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._profile_available_bytes",
    "sglang.srt.platforms.interface.SRTPlatform.get_kv_pool_cls",
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
    "sglang.srt.platforms.cpu.CpuDeviceMixin.empty_cache",
    "sglang.srt.managers.io_struct.GenerateReqInput._handle_parallel_sampling",
    "sglang.srt.utils.auth.decide_request_auth",
    "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._validate_request",
    "sglang.srt.model_executor.model_runner_components.weight_updater.WeightUpdater"
    ".update_weights_from_disk",
    "sglang.srt.managers.io_struct.GenerateReqInput._determine_batch_size",
    "sglang.srt.entrypoints.openai.serving_tokenize.OpenAIServingDetokenize._validate_request",
)
RQ_BACKENDS = ("rq_native", "rq_triton")


class _Runtime:
    """Per-process facts the hooks share: set once by the cell-size hook, read by the pool hook."""

    cfg: RQConfig | None = None
    shape: Any = None
    staging_tokens: int = 0
    kernels: Any = None  # dispatch.KernelRequest
    cell_line: tuple = ()  # the cell-size log line's numbers, last logged


def register() -> None:
    """Entry point (``sglang.srt.plugins``: ``sglang_rq = sglang_rq.plugin:register``)."""
    register_models()
    register_backends()
    raw = env.RQ_CONFIG.get()
    if not raw:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    cfg = RQConfig.from_json(raw)
    around, after = HookType.AROUND, HookType.AFTER
    hooks = [(7, _probe_auth_hook, around), (9, _weights_from_disk_hook, around),
             (8, _chat_request_hook, around), (2, _budget_hook, around),
             (4, _input_ids_hook, around), (5, _trim_heap_hook, after),
             (6, _parallel_samples_hook, around), (10, _embeds_batch_hook, around),
             (11, _detokenize_request_hook, around)]
    if cfg.enabled:
        _Runtime.cfg = cfg
        hooks += [(0, _cell_size_hook, around), (1, _fixed_overhead_hook, after),
                  (3, _pool_cls_hook, around)]
    for i, hook, kind in hooks:
        HookRegistry.register(HOOK_TARGETS[i], hook, kind)
    HookRegistry.apply_hooks()
    verify_hooks([HOOK_TARGETS[i] for i, _, _ in hooks])
    logger.info("sglang-rq: KV cache format: %s", cfg.describe())


def register_models() -> None:
    """Register the Ouro and Huginn models with SGLang and their configs with transformers."""
    from sglang.srt.models.registry import ModelRegistry

    from sglang_rq.models.huginn import RavenForCausalLM
    from sglang_rq.models.huginn_config import register_huginn_config
    from sglang_rq.models.ouro import OuroForCausalLM
    from sglang_rq.models.ouro_config import register_ouro_config

    register_ouro_config()
    register_huginn_config()
    ModelRegistry.models["OuroForCausalLM"] = OuroForCausalLM
    ModelRegistry.models["RavenForCausalLM"] = RavenForCausalLM


def register_backends() -> None:
    """Register the RQ attention backends and add their names to ``--attention-backend``."""
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    def native(runner):
        from sglang_rq.backend_native import RQNativeAttnBackend

        return RQNativeAttnBackend(runner)

    def triton(runner):
        from sglang_rq.backend_triton import RQTritonAttnBackend

        return RQTritonAttnBackend(runner)

    ATTENTION_BACKENDS["rq_native"], ATTENTION_BACKENDS["rq_triton"] = native, triton
    for name in RQ_BACKENDS:
        if name not in ATTENTION_BACKEND_CHOICES:
            ATTENTION_BACKEND_CHOICES.append(name)


def verify_hooks(targets: list[str]) -> None:
    """Stop the process unless every hook in ``targets`` was applied by SGLang."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    missing = [t for t in targets if t not in HookRegistry._patched]
    if missing:
        raise SystemExit(
            f"sglang-rq: hooks did not apply to {missing}; this SGLang is not the pinned 0.5.23 "
            "(see the log above for the error). Refusing to start with a half-installed KV cache.")


# ----------------------------------------------------------------------------- hooks
def _trim_heap_hook(result, self):
    """After SGLang's CPU ``empty_cache`` (``/flush_cache``, idle sleep): hand the C heap's free
    pages back to the OS (glibc ``malloc_trim(0)``; a no-op under another allocator).

    The CPU path's large transients (fp32 K/V, rotation products: MiBs per forward) come from
    the glibc heap once its dynamic mmap threshold has risen; oneDNN's per-shape matmul primitives
    (~0.5 MiB each, created while the server meets new batch sizes) are then allocated between
    them and keep the freed space from being trimmed, so RSS kept ~4x the live growth
    (docs/robustness.md section 6)."""
    _malloc_trim()
    return result


def _malloc_trim() -> None:
    """``malloc_trim(0)`` of glibc; nothing where the C library has none."""
    import ctypes

    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


def _cell_size_hook(original, self, kvc, num_layers):
    """AROUND ``DefaultPoolConfigurator._compute_cell_size``: SGLang's bytes per token.

    Parameters
    ----------
    original:
        SGLang's method (called only for the log line: the stock figure).
    self:
        The ``DefaultPoolConfigurator``.
    kvc:
        SGLang's KV-cache configurator: ``server_args`` and ``model_config``.
    num_layers:
        KV layers SGLang counts (`layout.ModelKVShape.num_slots`: layers x loops, plus
        un-looped layers).

    Returns
    -------
    int
        `layout.kv_bytes_per_token` of the model on this rank under the bound `RQConfig`.

    Raises
    ------
    RQConfigError
        For server flags the pool cannot serve (`validate_server_args`), a KV-head count the
        tensor-parallel size does not divide, or a layer count that is not layers x loops.

    Note
    ----
    Runs first in the scheduler process, so it also fixes the facts the later hooks read
    (`_Runtime`: shape, staging tokens, `dispatch.KernelRequest`).
    """
    from sglang_rq.layout import kv_bytes_per_token, staging_bytes

    validate_server_args(kvc.server_args)
    shape = model_kv_shape(kvc.model_config)
    if shape.num_slots != num_layers:
        raise RQConfigError(
            f"sglang-rq: SGLang counts {num_layers} KV layers but the model has "
            f"{shape.num_layers} layers x {shape.num_loops} loops + {shape.unlooped_layers} "
            "un-looped (pipeline parallelism is unsupported)")
    _Runtime.shape = shape
    _Runtime.staging_tokens = staging_tokens_for(kvc.server_args)
    _Runtime.kernels = kernel_request_for(kvc.server_args, kvc.model_config)
    cell = kv_bytes_per_token(shape, _Runtime.cfg)
    line = (cell, original(self, kvc, num_layers), _Runtime.staging_tokens,
            staging_bytes(shape, _Runtime.cfg, staging_tokens=_Runtime.staging_tokens))
    if line != _Runtime.cell_line:  # SGLang sizes the pool more than once: log it once
        _Runtime.cell_line = line
        logger.info("sglang-rq: cell size %d B/token (stock would be %d), staging %d tokens = "
                    "%d B", *line)
    return cell


def _fixed_overhead_hook(result, self, kvc):
    """AFTER ``DefaultPoolConfigurator.__init__``: add the BF16 staging buffer
    (`layout.staging_bytes`, the model's dtype) and the rotation matrices
    (`layout.rotation_bytes`) to ``self._fixed_overhead_bytes``, so SGLang's token count leaves
    room for them. Returns ``result`` unchanged; a no-op before `_cell_size_hook` ran."""
    from sglang_rq.layout import fixed_bytes

    if _Runtime.shape is not None:
        self._fixed_overhead_bytes += fixed_bytes(
            _Runtime.shape, _Runtime.cfg, staging_tokens=_Runtime.staging_tokens,
            dtype_bytes=kvc.model_config.dtype.itemsize)
    return result


def _budget_hook(original, self, pre_model_load_memory):
    """AROUND ``KVCacheConfigurator._profile_available_bytes``: bytes for the KV cache.

    Returns
    -------
    int
        SGLang's profiled figure, or ``SGLANG_RQ_KV_BUDGET_GB`` (``--rq-kv-budget-gb``) GiB
        when set and positive.

    Raises
    ------
    RQConfigError
        When the budget exceeds what SGLang profiled as available.
    """
    budget_gb = env.RQ_KV_BUDGET_GB.get()
    profiled = original(self, pre_model_load_memory)
    if budget_gb <= 0:
        return profiled
    budget = int(budget_gb * (1 << 30))
    if budget > profiled:
        raise RQConfigError(f"--rq-kv-budget-gb={budget_gb} exceeds the {profiled / (1 << 30):.2f} GiB "
                            "available for the KV cache")
    return budget


def _probe_auth_hook(original, *args, **kwargs):
    """AROUND ``sglang.srt.utils.auth.decide_request_auth`` (keyword arguments ``method``,
    ``path``, ...): a GET of the readiness route (`readiness.READY_PATH`, the probe of the
    shipped manifests and router) is allowed without a key, as SGLang 0.5.23 allows its own
    ``/health``, ``/ready`` and ``/metrics`` (by path prefix); everything else is SGLang's
    decision. Under ``--api-key`` the probe was a 401, so no worker ever became ready (a
    new-user review, 12-06)."""
    from sglang_rq.readiness import READY_PATH

    if kwargs.get("method") == "GET" and kwargs.get("path") == READY_PATH:
        from sglang.srt.utils.auth import AuthDecision

        return AuthDecision(allowed=True)
    return original(*args, **kwargs)


def _chat_request_hook(original, self, request, *args, **kwargs):
    """AROUND ``OpenAIServingChat._validate_request`` (returns an error message for a 400, or
    None): a ``max_completion_tokens`` below 1 is refused. SGLang 0.5.23 takes
    ``max_completion_tokens or max_tokens``, so 0 read as unset and the answer ran to the end of
    the context (a new-user review, 12-06; ``/v1/completions`` refuses ``max_tokens`` 0)."""
    limit = getattr(request, "max_completion_tokens", None)
    if limit is not None and limit < 1:
        return f"max_completion_tokens must be at least 1, got {limit}"
    return original(self, request, *args, **kwargs)


def _weights_from_disk_hook(original, self, model_path, *args, **kwargs):
    """AROUND ``WeightUpdater.update_weights_from_disk`` (``/update_weights_from_disk``; returns
    ``(success, message)``): when the update raises, reload the weights the server had and
    answer ``(False, reason)``.

    SGLang 0.5.23 sets ``model_config.model_path`` to the new checkpoint before loading it, so
    its rollback after a failed load reloads the new checkpoint again, outside its ``try``: a
    checkpoint with a tensor the model does not have (mini-Huginn's into a mini-Ouro server)
    raised in the scheduler and every process exited (a new-user review, 12-06). Here the old
    path is restored and the whole checkpoint reloaded from it; a failure of that reload is
    raised (the weights are then neither checkpoint's).
    """
    old = self.model_config.model_path
    try:
        return original(self, model_path, *args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - any failure of the update is answered, not fatal
        if model_path == old:
            raise  # the reload below would be this same load
        self.model_config.model_path = old
        logger.warning("sglang-rq: updating the weights from %s failed (%s); reloading %s",
                       model_path, exc, old)
        ok, message = original(self, old, *args, **kwargs)
        if not ok:
            raise RuntimeError(f"reloading the weights of {old} after a failed update from "
                               f"{model_path} failed: {message}") from exc
        return False, (f"Failed to update weights from {model_path}: {exc}. The weights of "
                       f"{old} were reloaded.")


def _input_ids_hook(original, self, obj, input_ids, *args, **kwargs):
    """AROUND ``TokenizerManager._validate_one_request``: refuse token ids outside the
    vocabulary, a prompt of no tokens, and log-probability requests the scheduler cannot serve,
    before they reach the scheduler.

    Parameters
    ----------
    input_ids:
        The request's token ids (a list of ints, possibly empty; None where the request carries
        embeddings instead); the rest is passed through.

    Raises
    ------
    ValueError
        Naming the first offending id and ``[0, vocab_size)``, or the empty prompt; SGLang's
        HTTP layer answers 400. (SGLang 0.5.23 refuses an empty ``input_ids`` and an empty
        ``/v1/completions`` prompt, but ``/generate`` with ``"text": ""`` tokenizes to no ids
        under a tokenizer that adds no BOS (the embedded models'): alone, its prefill of 0
        tokens killed the scheduler; in a batch it was answered from another request's last
        token.) A multimodal or embeddings request may carry no ids and passes. Also a
        ``top_logprobs_num`` (OpenAI: ``logprobs`` / ``top_logprobs``) above the vocabulary size
        or below 0, and a ``logprob_start_len`` below -1: SGLang 0.5.23 validates neither, and
        the scheduler's top-k (``k out of range``) or its input-logprob assertion killed the
        whole server (found by a new-user review, 12-05). And a ``top_k`` of 0 or below -1
        at temperature 0, where SGLang 0.5.23 sets ``top_k = 1`` before its own check, so only
        a sampled request was refused (a new-user review, 12-06). And ``input_embeds`` rows
        that are not the model's hidden size (`_check_input_embeds`), and a ``stop_regex``
        that does not compile or nests variable repeats (`_check_stop_regex`).
    """
    multimodal = getattr(obj, "contains_mm_input", None)
    if (input_ids is not None and len(input_ids) == 0
            and not (multimodal is not None and multimodal())
            and getattr(obj, "input_embeds", None) is None):
        raise ValueError("the prompt is empty (no tokens after tokenization): send at least one "
                         "token")
    _check_input_embeds(getattr(obj, "input_embeds", None), self.model_config.hidden_size)
    vocab = self.model_config.vocab_size
    _check_logprob_args(obj, vocab)
    _check_top_k(obj)
    _check_stop_regex(obj)
    if input_ids:
        lo, hi = min(input_ids), max(input_ids)
        bad = lo if lo < 0 else hi if hi >= vocab else None
        if bad is not None:
            raise ValueError(f"input_ids holds token id {bad}, outside the model's vocabulary "
                             f"[0, {vocab})")
    return original(self, obj, input_ids, *args, **kwargs)


def _check_input_embeds(embeds, hidden: int) -> None:
    """Raise ValueError unless one request's ``input_embeds`` (None, or ``[tokens][hidden]``
    numbers) holds at least one row and every row ``hidden`` numbers. SGLang 0.5.23 checks
    neither: a row of 2 values for a model of hidden size 512 reached the model's first norm in
    the scheduler, and every process exited (a new-user review, 12-06)."""
    if embeds is None:
        return
    if not isinstance(embeds, list) or not embeds:
        raise ValueError("input_embeds is empty: send one row of the model's hidden size "
                         f"({hidden} numbers) per token")
    for i, row in enumerate(embeds):
        if not isinstance(row, list) or len(row) != hidden:
            got = f"{len(row)} values" if isinstance(row, list) else f"a {type(row).__name__}"
            raise ValueError(f"input_embeds row {i} holds {got}: each row must hold the model's "
                             f"hidden size, {hidden} numbers")


def _embeds_batch_hook(original, self):
    """AROUND ``GenerateReqInput._determine_batch_size`` (where SGLang reads
    ``input_embeds[0][0]`` to tell one prompt from a batch): refuse an ``input_embeds`` with no
    first row (`_check_embeds_batch`), then run SGLang's own."""
    _check_embeds_batch(self)
    return original(self)


def _check_embeds_batch(obj) -> None:
    """Raise ValueError when request ``obj`` carries only ``input_embeds`` (SGLang drops them
    beside ``text`` or ``input_ids``) and that list, or its first entry, is empty: ``[]`` or
    ``[[]]``. SGLang 0.5.23 tells one prompt (``[tokens][hidden]``) from a batch
    (``[prompts][tokens][hidden]``) by ``input_embeds[0][0]``, so both were an ``IndexError``
    and a 500, before `_input_ids_hook` runs (a new-user review, 12-06). Other shapes are left
    to SGLang's request model and `_check_input_embeds`."""
    embeds = obj.input_embeds
    if obj.text is not None or obj.input_ids is not None or not isinstance(embeds, list):
        return
    empty = ("input_embeds" if not embeds else
             "input_embeds[0]" if isinstance(embeds[0], list) and not embeds[0] else None)
    if empty is not None:
        raise ValueError(f"{empty} is empty: send one row of the model's hidden size per token "
                         "(for a batch, one list of such rows per prompt)")


TOKEN_ID_END = 1 << 32  # the fast tokenizers' token ids are unsigned 32-bit


def _detokenize_request_hook(original, self, request, *args, **kwargs):
    """AROUND ``OpenAIServingDetokenize._validate_request`` (``/v1/detokenize`` and
    ``/detokenize``; returns an error message for a 400, or None): token ids the tokenizer
    cannot take are refused (`_detokenize_ids_error`). SGLang 0.5.23 passes them to the
    tokenizer's ``decode``, whose ``OverflowError`` ("out of range integral type conversion
    attempted") it answered with a 500 (a new-user review, 12-06). An id in range but past the
    vocabulary still decodes to nothing, as in SGLang."""
    why = _detokenize_ids_error(getattr(request, "tokens", None))
    return why if why is not None else original(self, request, *args, **kwargs)


def _detokenize_ids_error(tokens) -> str | None:
    """Why ``/v1/detokenize``'s ``tokens`` (a list of ints, or a list of such lists) cannot be
    decoded, naming the field and the first id below 0 or at or above `TOKEN_ID_END`; None if
    every id is in range. Other types are left to SGLang's own checks."""
    if not isinstance(tokens, list):
        return None
    for item in tokens:
        for t in item if isinstance(item, list) else [item]:
            if isinstance(t, int) and not 0 <= t < TOKEN_ID_END:
                return (f"tokens holds token id {t}: a token id is an integer from 0 to "
                        f"{TOKEN_ID_END - 1}")
    return None


def _per_prompt(value) -> list:
    """A request field that is None, one value for all prompts, or a list of one per prompt, as
    a list (empty for None)."""
    return [] if value is None else value if isinstance(value, list) else [value]


def _check_logprob_args(obj, vocab: int) -> None:
    """Raise ValueError for a request's ``top_logprobs_num`` outside ``[0, vocab]`` or
    ``logprob_start_len`` below -1 (either an int or, for a batch, a list of ints)."""
    for k in _per_prompt(getattr(obj, "top_logprobs_num", None)):
        if not 0 <= k <= vocab:
            raise ValueError(f"top_logprobs_num (OpenAI: logprobs / top_logprobs) is {k}: it must "
                             f"be in [0, {vocab}], the model's vocabulary size")
    for start in _per_prompt(getattr(obj, "logprob_start_len", None)):
        if start < -1:
            raise ValueError(f"logprob_start_len is {start}: it must be -1 (output tokens only) "
                             "or a prompt position >= 0")


def _check_top_k(obj) -> None:
    """Raise ValueError for a request whose sampling parameters (a dict, or for a batch a list
    of dicts) hold an integer ``top_k`` of 0 or below -1, whatever the temperature, with SGLang's
    own wording for a sampled request. Other types are left to SGLang."""
    for params in _per_prompt(getattr(obj, "sampling_params", None)):
        k = params.get("top_k") if isinstance(params, dict) else None
        if isinstance(k, int) and not isinstance(k, bool) and (k == 0 or k < -1):
            raise ValueError(f"top_k must be -1 (disable) or at least 1, got {k} (also at "
                             "temperature 0)")


def _check_stop_regex(obj) -> None:
    """Raise ValueError for a request whose sampling parameters (a dict, or for a batch a list
    of dicts) hold a ``stop_regex`` (a string or a list of strings) that does not compile, or
    that nests a repeat of variable count inside another repeat of more than one (``(a+)+b``,
    ``(\\w*\\s?)*$``), the shape of catastrophic backtracking.

    SGLang 0.5.23 runs ``re.search`` over the output's tail at every decode step inside the
    scheduler (``Req.check_finished``), the whole output for a pattern of unbounded length: with
    ``(a+)+b`` over 28 generated ``a`` one request took 24.5 s and stalled every other request,
    and 40 wedged the scheduler for over 10 minutes; a pattern that does not compile was a 500
    (a new-user review, 12-06). Overlapping alternatives under a repeat (``(a|a)+b``) backtrack
    too and are not detected."""
    import re

    try:  # Python 3.11+ names it re._parser; sre_parse is its deprecated alias
        import re._parser as sre_parse
    except ImportError:  # pragma: no cover - Python < 3.11
        import sre_parse

    for params in _per_prompt(getattr(obj, "sampling_params", None)):
        pats = params.get("stop_regex") if isinstance(params, dict) else None
        for pat in _per_prompt(pats):
            if not isinstance(pat, str):
                continue  # SGLang's own validation names the type
            try:
                re.compile(pat)
            except re.error as exc:
                raise ValueError(f"stop_regex {pat!r} is not a valid regular expression: {exc}"
                                 ) from None
            if _nested_repeat(sre_parse.parse(pat), sre_parse, outer=False):
                raise ValueError(
                    f"stop_regex {pat!r} nests a repeat of variable count inside another repeat, "
                    "which backtracks exponentially in the scheduler's per-token search: rewrite "
                    "it without the nested repeat (e.g. (a+)+b as a+b)")


def _nested_repeat(pattern, sre_parse, *, outer: bool) -> bool:
    """Whether parsed ``pattern`` holds a repeat of variable count (min < max) inside a repeat of
    max > 1 (``outer``: such a repeat encloses it)."""
    repeats = (sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT)
    if hasattr(sre_parse, "POSSESSIVE_REPEAT"):
        repeats += (sre_parse.POSSESSIVE_REPEAT,)
    for op, value in pattern:
        if op in repeats:
            lo, hi, sub = value
            if outer and lo != hi:
                return True
            if _nested_repeat(sub, sre_parse, outer=outer or hi > 1):
                return True
        elif op == sre_parse.SUBPATTERN:
            if _nested_repeat(value[-1], sre_parse, outer=outer):
                return True
        elif op == sre_parse.BRANCH:
            if any(_nested_repeat(b, sre_parse, outer=outer) for b in value[1]):
                return True
        elif op in (sre_parse.ASSERT, sre_parse.ASSERT_NOT):
            if _nested_repeat(value[1], sre_parse, outer=outer):
                return True
    return False


def _parallel_samples_hook(original, self):
    """AROUND ``GenerateReqInput._handle_parallel_sampling`` (where SGLang reads ``n``, before
    the request is copied n times): refuse an ``n`` that is not an integer in
    ``[1, SGLANG_RQ_MAX_N]`` (``--rq-max-n``, default 128) in any of the request's sampling
    parameters, and a list of sampling parameters whose length is not the number of prompts
    (SGLang indexed past its end: a 500), then run SGLang's own.

    Raises
    ------
    ValueError
        Naming ``n``, the range and the flag; SGLang's HTTP layer answers 400. SGLang 0.5.23
        accepts any integer n: ``n: 1000000`` was expanded into a million requests (no reply
        within 30 s, the worker busy), ``n: -3`` on the chat route answered an empty
        completion, and ``"n": null`` on ``/generate`` was a 500 (its comparison raised).
    """
    params = self.sampling_params
    if isinstance(params, list) and len(params) != self.batch_size:
        raise ValueError(f"sampling_params is a list of {len(params)} for {self.batch_size} "
                         "prompt(s): give one object per prompt, or one object for all")
    most = env.RQ_MAX_N.get()
    for sp in _per_prompt(params):
        if not isinstance(sp, dict) or "n" not in sp:
            continue
        n = sp["n"]
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= most:
            raise ValueError(f"n (parallel samples of one prompt) is {n!r}: it must be an "
                             f"integer in [1, {most}] (--rq-max-n)")
    return original(self)


def _pool_cls_hook(original, self, *, kind):
    """AROUND ``SRTPlatform.get_kv_pool_cls``: the pool class SGLang instantiates.

    Returns
    -------
    type
        For ``kind == "mha"``, `pool.bind_pool_class` of the bound format, shape, staging size
        and `dispatch.KernelRequest` (the pool resolves its kernel paths when built); SGLang's
        own class for any other kind.

    Raises
    ------
    RuntimeError
        If `_cell_size_hook` has not run in this process (the shape is unknown).
    """
    if kind != "mha":
        return original(self, kind=kind)
    from sglang_rq.pool import bind_pool_class

    if _Runtime.shape is None:
        raise RuntimeError("sglang-rq: the cell-size hook did not run before the pool was built")
    return bind_pool_class(cfg=_Runtime.cfg, shape=_Runtime.shape,
                           staging_tokens=_Runtime.staging_tokens, kernels=_Runtime.kernels)


# ----------------------------------------------------------------------------- helpers
def model_kv_shape(model_config):
    """`ModelKVShape` of an SGLang ``ModelConfig`` on this rank: KV heads divided by the
    attention tensor-parallel size (as SGLang's own cell size and pool do).

    Raises
    ------
    RQConfigError
        When ``--tp-size`` does not divide the model's KV heads (`ModelKVShape.from_model_config`).
    """
    from sglang.srt.runtime_context import get_parallel

    from sglang_rq.layout import ModelKVShape

    return ModelKVShape.from_model_config(model_config, tp_size=get_parallel().attn_tp_size)


def _layout_staging_tokens(server_args, *, enable_mixed_chunk: bool) -> int:
    """`layout.staging_tokens` of SGLang's ``ServerArgs`` (its chunk, prefill and running-request
    sizes), with or without the mixed-chunk margin."""
    from sglang_rq.layout import staging_tokens

    return staging_tokens(chunked_prefill_size=server_args.chunked_prefill_size,
                          max_prefill_tokens=server_args.max_prefill_tokens,
                          max_running_requests=server_args.max_running_requests,
                          enable_mixed_chunk=enable_mixed_chunk)


def staging_tokens_for(server_args) -> int:
    """`layout.staging_tokens` of SGLang's ``ServerArgs``, unless ``SGLANG_RQ_STAGING_TOKENS``
    (``--rq-staging-tokens``, no less than one forward: `check_staging_tokens`) overrides it."""
    given = env.RQ_STAGING_TOKENS.get()
    if given:
        return given
    return _layout_staging_tokens(server_args, enable_mixed_chunk=server_args.enable_mixed_chunk)


def kernel_request_for(server_args, model_config):
    """What the pool asks `dispatch.resolve` for: the attention backend (``rq_native`` runs the
    C library, ``rq_triton`` the Triton kernels), ``SGLANG_RQ_USE_KERNELS`` (false: the PyTorch
    twins serve every path) and the model's query heads per KV head (the CUDA-core decode split kernel serves MHA)."""
    from sglang_rq.dispatch import KernelRequest

    return KernelRequest(
        backend=server_args.attention_backend, use_kernels=env.RQ_USE_KERNELS.get(),
        qo_heads_per_kv=max(1, model_config.get_total_num_attention_heads()
                            // model_config.get_total_num_kv_heads()))


def validate_server_args(args) -> None:
    """Refuse SGLang options that bypass or cannot serve the ResidualQuant pool.

    Raises
    ------
    RQConfigError
        Naming the offending flag and ``--rq-disable`` as the way out.
    """
    problems = []
    if str(args.kv_cache_dtype) not in ("auto", "bfloat16", "bf16", "float32"):
        problems.append(f"--kv-cache-dtype={args.kv_cache_dtype} (the RQ pool is the KV format)")
    if args.enable_hierarchical_cache:
        problems.append("--enable-hierarchical-cache (HiCache assumes dense per-layer buffers)")
    if str(args.disaggregation_mode) not in ("null", "None"):
        problems.append(f"--disaggregation-mode={args.disaggregation_mode} (PD transfer assumes dense buffers)")
    if args.speculative_algorithm:
        problems.append(f"--speculative-algorithm={args.speculative_algorithm}")
    if getattr(args, "enable_kv_cache_sharding", False):
        problems.append("--enable-kv-cache-sharding")
    if getattr(args, "prefill_only_disable_kv_cache", False):
        problems.append("--prefill-only-disable-kv-cache")
    if args.pp_size != 1:
        problems.append(f"--pp-size={args.pp_size}")
    if args.chunked_prefill_size is not None and args.chunked_prefill_size <= 0:
        problems.append("--chunked-prefill-size<=0 (the staging buffer needs a bounded chunk)")
    if args.attention_backend not in RQ_BACKENDS:
        problems.append(f"--attention-backend={args.attention_backend} (use rq_native on CPU or "
                        "rq_triton on CUDA; `sglang-rq serve` picks one)")
    if problems:
        raise RQConfigError("ResidualQuant KV cache cannot run with: " + "; ".join(problems)
                            + ". Remove these flags or pass --rq-disable.")
    check_staging_tokens(args)


def check_staging_tokens(args) -> None:
    """Refuse a ``--rq-staging-tokens`` below what one forward can carry under SGLang's
    ``ServerArgs`` ``args`` (`layout.staging_tokens` without the mixed-chunk margin: the larger
    of the prefill chunk and the decode batch), which the pool's ``save`` would otherwise meet
    at the first long prompt, with the scheduler's death.

    Raises
    ------
    RQConfigError
        Naming ``--rq-staging-tokens``, the tokens needed and the flags they come from.
    """
    from sglang_rq.layout import DEFAULT_MAX_RUNNING_REQUESTS

    given = env.RQ_STAGING_TOKENS.get()
    # SGLang takes a mixed batch's decode tokens out of the chunk's budget, so one forward
    # carries at most the larger of the two (the default size adds them, to be safe)
    need = _layout_staging_tokens(args, enable_mixed_chunk=False)
    if given and given < need:
        running = (f"--max-running-requests {args.max_running_requests}"
                   if args.max_running_requests else
                   f"--max-running-requests unset, taken as {DEFAULT_MAX_RUNNING_REQUESTS}")
        raise RQConfigError(
            f"--rq-staging-tokens={given} is below the {need} tokens one forward can carry "
            f"(--chunked-prefill-size {args.chunked_prefill_size}, {running}); raise it "
            f"to at least {need}, lower those flags, or leave it out for its default")
