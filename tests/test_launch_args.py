"""`sglang_rq.launch_server.prepare_environment`: the SGLang argv the launcher builds."""

from __future__ import annotations

import os
import re
import sys

import pytest

from sglang_rq.launch_server import prepare_environment


@pytest.fixture
def clean_env(monkeypatch):
    """prepare_environment exports the --rq-* flags and CPU settings; undo that afterwards."""
    saved_env, saved_path = dict(os.environ), list(sys.path)
    yield
    os.environ.clear()
    os.environ.update(saved_env)
    sys.path[:] = saved_path


def test_rq_triton_keeps_decode_cuda_graphs_and_disables_prefill_graphs(clean_env):
    argv = prepare_environment(["--attention-backend", "rq_triton"])
    assert "--disable-cuda-graph" not in argv
    assert argv[argv.index("--cuda-graph-backend-prefill") + 1] == "disabled"
    eager = prepare_environment(["--attention-backend", "rq_triton", "--disable-cuda-graph"])
    assert "--cuda-graph-backend-prefill" not in eager


def test_user_flags_are_kept(clean_env):
    argv = prepare_environment(["--attention-backend", "rq_native", "--max-total-tokens", "999"])
    assert argv[argv.index("--max-total-tokens") + 1] == "999"
    assert "--disable-cuda-graph" not in argv


def test_format_is_checked_against_the_model_before_weights_load(tmp_path):
    """Loop bits vs the embedded model's 4 loops, and a missing rotation file, are refused from
    config.json alone (the pool would refuse them too, but only after the weights load)."""
    from sglang_rq.config import RQConfig, RQConfigError
    from sglang_rq.launch_server import validate_against_model
    from sglang_rq.models.embedded import EMBEDDED_MODEL

    validate_against_model(RQConfig(), str(EMBEDDED_MODEL))  # the default format fits
    with pytest.raises(RQConfigError, match="--rq-loop-bits gives 2 widths .* 4 loops"):
        validate_against_model(RQConfig(loop_bits=(2, 2)), str(EMBEDDED_MODEL))
    missing = tmp_path / "none.safetensors"
    with pytest.raises(RQConfigError, match="--rq-rotation=.*none.safetensors"):
        validate_against_model(RQConfig(rotation=str(missing)), str(EMBEDDED_MODEL))
    validate_against_model(RQConfig(loop_bits=(2, 2)), str(tmp_path))  # no config.json: later


def test_bad_format_exits_fast_with_the_flag_named():
    """The real launcher process: exit status 2 and a one-line error, no server start."""
    import subprocess
    import time

    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "sglang_rq.launch_server", "--rq-loop-bits", "2,2",
                        "--port", "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "error: --rq-loop-bits gives 2 widths but the model runs 4 loops" in r.stderr
    assert "Traceback" not in r.stderr
    print(f"refused in {time.monotonic() - t:.1f} s")


# the CPU server's defaults, given explicitly so that a CUDA host (whose SGLang defaults differ)
# gets the same figures
CPU_SIZES = ("--chunked-prefill-size", "2048", "--max-running-requests", "32")


def test_format_flags_with_rq_disable_are_named_as_ignored(clean_env, capsys):
    """A new-user review: `--rq-disable --rq-anchor-bits 8` started without a word."""
    prepare_environment(["--rq-disable", "--rq-anchor-bits", "8", "--rq-loop-bits=8,2,2,2",
                         "--rq-kv-budget-gb", "1"])
    err = capsys.readouterr().err
    assert ("sglang-rq: warning: --rq-disable serves SGLang's BF16 pool; ignoring "
            "--rq-anchor-bits, --rq-loop-bits") in err
    prepare_environment(["--rq-disable", "--rq-kv-budget-gb", "1"])
    assert "ignoring" not in capsys.readouterr().err


def test_format_flags_the_format_overrides_are_named_as_ignored(clean_env, capsys):
    """A fifth new-user review (session 39): the seed and basis under ``--rq-rotation none``
    and the anchor/residual bits under ``--rq-loop-bits`` were ignored without a word."""
    prepare_environment(["--rq-rotation", "none", "--rq-rotation-seed", "5",
                         "--no-rq-rotate-anchor", "--rq-loop-bits=2,2,2,4",
                         "--rq-anchor-bits", "8"])
    err = capsys.readouterr().err
    assert ("warning: --rq-loop-bits sets every loop's bits; ignoring --rq-anchor-bits\n"
            in err)
    assert ("warning: --rq-rotation none rotates nothing; ignoring --no-rq-rotate-anchor, "
            "--rq-rotation-seed\n" in err)
    prepare_environment(["--rq-rotation=hadamard", "--rq-rotation-seed=3"])
    assert ("warning: --rq-rotation hadamard has no random signs; ignoring --rq-rotation-seed"
            in capsys.readouterr().err)
    prepare_environment(["--rq-rotation", "signed-hadamard", "--rq-rotation-seed", "3",
                         "--rq-anchor-bits", "8"])
    assert "ignoring" not in capsys.readouterr().err
    # the embedded model (Ouro-shaped) has no prelude or coda: its format line said unlooped=8
    prepare_environment(["--rq-unlooped-bits", "8"])
    assert ("warning: the model has no un-looped (prelude or coda) layers; ignoring "
            "--rq-unlooped-bits\n" in capsys.readouterr().err)
    from sglang_rq.models.embedded import EMBEDDED_HUGINN  # prelude and coda

    prepare_environment(["--rq-unlooped-bits", "8", "--model-path", str(EMBEDDED_HUGINN)])
    assert "ignoring" not in capsys.readouterr().err


def test_a_model_the_format_cannot_shape_still_serves_bf16(clean_env, capsys, tmp_path):
    """The shape read for the --rq-unlooped-bits warning must not refuse a model --rq-disable
    serves: a config nested under text_config has no top-level num_hidden_layers."""
    (tmp_path / "config.json").write_text('{"text_config": {"num_hidden_layers": 2}}')
    argv = prepare_environment(["--rq-disable", "--rq-unlooped-bits", "8",
                                "--model-path", str(tmp_path)])
    assert str(tmp_path) in argv
    assert ("--rq-disable serves SGLang's BF16 pool; ignoring --rq-unlooped-bits"
            in capsys.readouterr().err)


def test_staging_below_one_forward_is_refused_before_weights_load():
    """A new-user review found `--rq-staging-tokens 100` accepted: the server started and the
    first ~500-token prompt killed its scheduler (the pool's save refuses a forward larger than
    the staging buffer). The CPU server's defaults (chunks of 2,048 tokens, 32 running
    requests) need max(2048, 32) = 2,048 staging tokens (`layout.staging_tokens`)."""
    import subprocess

    r = subprocess.run([sys.executable, "-m", "sglang_rq.launch_server", "--rq-staging-tokens",
                        "100", "--port", "1", *CPU_SIZES], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert ("error: --rq-staging-tokens=100 is below the 2048 tokens one forward can carry "
            "(--chunked-prefill-size 2048, --max-running-requests 32)") in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr


def test_budget_below_the_fixed_bytes_is_refused_before_weights_load():
    """A new-user review: `--rq-kv-budget-gb 0.00001` loaded the weights, then SGLang stopped
    with its advice to raise --mem-fraction-static (exit 137). The embedded model's staging
    buffer alone (2,048 tokens) is ~50 MB."""
    import subprocess

    r = subprocess.run([sys.executable, "-m", "sglang_rq.launch_server", "--rq-kv-budget-gb",
                        "0.00001", "--port", "1", *CPU_SIZES], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "error: --rq-kv-budget-gb=1e-05 holds 0 tokens, fewer than the 64 a server needs"\
        in r.stderr, r.stderr[-2000:]
    assert "(staging for 2048 tokens per forward, rotations)" in r.stderr
    assert "Traceback" not in r.stderr


def test_bf16_budget_below_what_sglang_warms_up_with_is_refused():
    """Session 44 (robustness.md 11, left since session 42): under --rq-disable,
    ``--rq-kv-budget-gb 0.0001`` loaded the weights, SGLang sized a BF16 pool of 3 tokens (its
    log: "#tokens: 3"), refused its own warm-up request ("maximum allowed length (-3 tokens)")
    and was killed (rc 137)."""
    import subprocess

    r = subprocess.run([sys.executable, "-m", "sglang_rq.launch_server", "--rq-disable",
                        "--rq-kv-budget-gb", "0.0001", "--port", "1", *CPU_SIZES],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "error: --rq-kv-budget-gb=0.0001 holds 3 tokens, fewer than the 64 a server needs; "\
        "give at least" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr


def test_staging_past_the_machine_memory_is_refused_before_weights_load():
    """A seventh new-user review (session 42): ``--rq-staging-tokens 100000000000`` loaded the
    weights, then SGLang stopped with its advice to raise --mem-fraction-static (exit 137). A
    staging buffer of 10^11 BF16 tokens is far past any host's memory."""
    import subprocess

    r = subprocess.run([sys.executable, "-m", "sglang_rq.launch_server", "--rq-staging-tokens",
                        "100000000000", "--port", "1", *CPU_SIZES], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert re.search(r"error: the pool's fixed bytes \([0-9.]+ GiB: staging for 100000000000 "
                     r"tokens per forward, --rq-staging-tokens, and rotations\) exceed", r.stderr)
    assert "Traceback" not in r.stderr


def test_missing_local_model_path_is_refused_before_sglang(clean_env, tmp_path):
    """Found by a fresh-clone check: ``--model-path /nonexistent/model`` reached transformers,
    which printed a misleading canary line and four chained tracebacks."""
    from sglang_rq.config import RQConfigError

    for bad in (str(tmp_path / "missing"), "./missing-model", "a/b/c"):
        with pytest.raises(RQConfigError, match=f"--model-path={bad}: no such directory"):
            prepare_environment(["--model-path", bad])
    from sglang_rq.models.embedded import EMBEDDED_MODEL

    prepare_environment(["--model-path", str(EMBEDDED_MODEL)])  # a checkpoint directory passes
    prepare_environment(["--model-path", "org/name"])  # a hub id is SGLang's to resolve


def test_cpu_tensor_parallel_is_refused_before_loading(clean_env):
    import torch

    from sglang_rq.config import RQConfigError

    if torch.cuda.is_available():
        pytest.skip("CPU-engine refusal")
    for argv in (["--tp-size", "2"], ["--tensor-parallel-size=2"], ["--rq-disable", "--tp-size", "2"]):
        with pytest.raises(RQConfigError, match="--tp-size 2 is not supported on the CPU engine"):
            prepare_environment(argv)
    # --dp-size / --pp-size: SGLang's CPU engine asserts dp x tp x pp NUMA nodes after ~25 s and
    # the launcher stayed up with no server (a new-user review, 12-06)
    for argv, named in ((["--dp-size", "2"], "--dp-size 2"), (["--data-parallel-size=3"], "--dp-size 3"),
                        (["--pp-size", "2"], "--pp-size 2"),
                        (["--dp-size", "2", "--tp-size", "2"], "--tp-size 2, --dp-size 2")):
        with pytest.raises(RQConfigError, match=f"{named} is not supported on the CPU engine"):
            prepare_environment(argv)
    with pytest.raises(RQConfigError, match="--dp-size=x must be an integer >= 1"):
        prepare_environment(["--dp-size", "x"])
    prepare_environment(["--tp-size", "1", "--dp-size", "1", "--pp-size", "1"])


def test_tp_size_must_divide_kv_heads_before_weights_load(tmp_path):
    """The embedded model has 4 KV heads: --tp-size 2 fits (2 per rank), 3 is refused from
    config.json, and a rotation file (all heads) is refused with TP > 1."""
    from sglang_rq.config import RQConfig, RQConfigError
    from sglang_rq.launch_server import validate_against_model
    from sglang_rq.models.embedded import EMBEDDED_MODEL

    validate_against_model(RQConfig(), str(EMBEDDED_MODEL), tp_size=2)
    with pytest.raises(RQConfigError, match="--tp-size 3 does not divide the model's 4 KV heads"):
        validate_against_model(RQConfig(), str(EMBEDDED_MODEL), tp_size=3)
    rot = EMBEDDED_MODEL.parent / "mini-ouro-rotation.safetensors"
    with pytest.raises(RQConfigError, match="not sharded across ranks"):
        validate_against_model(RQConfig(rotation=str(rot)), str(EMBEDDED_MODEL), tp_size=2)


def test_disconnect_poll_defaults_to_one_second_unless_set(clean_env):
    """SGLang notices a vanished client only when a request's wait times out (its default 4 s);
    the launcher's 1 s stops a disconnected chunked prefill after one chunk instead of 3-4
    (tests/test_engine_disconnect.py, docs/robustness.md section 5)."""
    os.environ.pop("SGLANG_REQUEST_STATE_WAIT_TIMEOUT", None)
    prepare_environment([])
    assert os.environ["SGLANG_REQUEST_STATE_WAIT_TIMEOUT"] == "1"
    os.environ["SGLANG_REQUEST_STATE_WAIT_TIMEOUT"] = "7"
    prepare_environment([])
    assert os.environ["SGLANG_REQUEST_STATE_WAIT_TIMEOUT"] == "7"


def test_taken_port_is_refused_with_the_flag_named():
    """Found by a fresh-clone check: a second `sglang-rq serve` on a taken port logged SGLang's
    bind error and kept running without an HTTP port, while its readiness probe and the
    quickstart's request were answered by the first server."""
    import socket

    from sglang_rq.server_process import port_in_use_reason

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        why = port_in_use_reason("127.0.0.1", port)
        assert why == (f"--port={port}: 127.0.0.1:{port} is already in use (another server "
                       "listening there?); stop it or pass a free --port")
    assert port_in_use_reason("127.0.0.1", port) is None  # free again once closed
    # a new-user review (session 38): the resolver wraps 99999 to 34463 (the check passed, SGLang
    # then listened on 34463 while its warm-up called 99999), and -1 was blamed on --host
    for bad in (99999, 65536, 0, -1):
        assert port_in_use_reason("127.0.0.1", bad) == f"--port={bad}: must be 1-65535"


def test_model_directory_without_config_is_refused(clean_env, tmp_path):
    """Found by a fresh-clone check: an existing directory without config.json reached
    SGLang, which failed with a traceback."""
    from sglang_rq.config import RQConfigError

    empty = tmp_path / "empty-model"
    empty.mkdir()
    for given in (str(empty), f"{empty}/"):
        with pytest.raises(RQConfigError, match=f"--model-path={given}: the directory has no "
                                                "config.json"):
            prepare_environment(["--model-path", given])


def test_mistyped_flag_is_one_line_with_the_closest_flags():
    """Found by a fresh-clone check: a mistyped flag printed SGLang's ~500-line usage before
    the line that named it."""
    from sglang_rq.config import RQConfigError
    from sglang_rq.launch_server import check_sglang_flags

    with pytest.raises(RQConfigError) as e:
        check_sglang_flags(["--model-path", "x", "--tp-sise", "2", "--rq-anchor-bitz=2"])
    msg = str(e.value)
    assert msg.startswith("unrecognized arguments: --tp-sise 2 --rq-anchor-bitz=2; did you mean ")
    assert "--tp-size" in msg and "--rq-anchor-bits" in msg and "\n" not in msg
    with pytest.raises(RQConfigError, match="argument --port: invalid int value: 'x'"):
        check_sglang_flags(["--port", "x"])
    check_sglang_flags(["--model-path", "x", "--tp-size", "2", "--port", "30001"])  # accepted
    # abbreviations are refused: the launcher reads some flags by their full names (an
    # abbreviated --json-model-override escaped the --rq-recurrences check)
    with pytest.raises(RQConfigError, match="unrecognized arguments: --json-model-override .*"
                                            "did you mean --json-model-override-args"):
        check_sglang_flags(["--model-path", "x", "--json-model-override", "{}"])
    # SGLang loaded the model, then died of "Not enough memory" (--max-total-tokens), divided
    # by zero (--page-size, --context-length) or served one request at a time
    # (--max-running-requests) (new-user reviews, 12-06)
    for flag in ("--max-total-tokens", "--page-size", "--context-length",
                 "--max-running-requests"):
        for value in ("0", "-5"):
            with pytest.raises(RQConfigError, match=f"{flag}={value} must be > 0"):
                check_sglang_flags(["--model-path", "x", flag, value])
        check_sglang_flags(["--model-path", "x", flag, "64" if flag == "--max-total-tokens" else "1"])
    # a pool of 10 slots loaded the model, then failed SGLang's warm-up (rc 137; 12-06): the
    # warm-up's prompt and 8 new tokens need MIN_POOL_TOKENS (64)
    for value in ("10", "63"):
        with pytest.raises(RQConfigError, match=f"--max-total-tokens {value} is below 64"):
            check_sglang_flags(["--model-path", "x", "--max-total-tokens", value])
    # --port's range with the other flags, before the model loads (it was checked after
    # SGLang's import: 13 s; a new-user review, 12-06)
    for value in ("0", "99999", "-1"):
        with pytest.raises(RQConfigError, match=f"--port={value}: must be 1-65535"):
            check_sglang_flags(["--model-path", "x", "--port", value])


@pytest.mark.parametrize("flag,value", [("--rq-kv-budget-gb", "-1"), ("--rq-kv-budget-gb", "0"),
                                        ("--rq-staging-tokens", "0"),
                                        ("--rq-recurrences", "0"),
                                        ("--rq-max-request-bytes", "0"),
                                        ("--rq-max-n", "-1"),
                                        ("--rq-kv-budget-gb", "nan")])
def test_serving_values_below_one_are_refused(clean_env, flag, value):
    """Found by a fresh-clone check: a negative KV budget started a server sized by SGLang's
    RAM profiling (18.7 GB on a 23 GB host), and a zero staging size or recurrence count was
    silently replaced by the default. A new-user review (session 38): ``--rq-canary-interval-s
    nan`` passed the ``<= 0`` test and the canary then sent about 125 requests a second; a NaN
    budget stopped on a ValueError traceback."""
    from sglang_rq.config import RQConfigError

    shown = float(value) if flag == "--rq-kv-budget-gb" else value
    with pytest.raises(RQConfigError, match=f"{flag}={shown} must be > 0 and finite"):
        prepare_environment([flag, value])


@pytest.mark.parametrize("value", ["-5", "0", "0.5", "1e-9", "nan", "inf", "1e10"])
@pytest.mark.parametrize("by_env", [False, True])
def test_canary_interval_below_a_second_or_not_finite_is_refused(clean_env, monkeypatch, value,
                                                                  by_env):
    """A new-user review (session 38): ``--rq-canary-interval-s nan`` passed a ``<= 0`` test and
    the canary sent ~125 requests a second; the fix's second review found the same through
    ``SGLANG_RQ_CANARY_INTERVAL_S=nan`` (unchecked: /rq/ready then a 500, and SIGTERM never
    drained) and through 1e-9 (back-to-back checks). A seventh review (session 42): 1e10 passed,
    past what the canary thread's ``Event.wait`` takes (OverflowError)."""
    from sglang_rq.config import RQConfigError

    name = "SGLANG_RQ_CANARY_INTERVAL_S" if by_env else "--rq-canary-interval-s"
    if by_env:
        monkeypatch.setenv(name, value)
    with pytest.raises(RQConfigError, match=rf"{name}={float(value)} must be at least 1 s and "
                                            "at most a year"):
        prepare_environment([] if by_env else [name, value])


def test_missing_canary_file_is_refused(clean_env, tmp_path):
    """Found by a new-user review (12-05): a mistyped --rq-canary-file started the server, whose
    /rq/ready then said "not found" forever while its log reported the canary passing."""
    from sglang_rq.config import RQConfigError

    missing = tmp_path / "nope.json"
    with pytest.raises(RQConfigError, match=f"--rq-canary-file={missing}: no such file"):
        prepare_environment(["--rq-canary-file", str(missing)])
    os.environ["SGLANG_RQ_CANARY_FILE"] = str(missing)  # the variable, as k8s would set it
    with pytest.raises(RQConfigError, match=f"SGLANG_RQ_CANARY_FILE={missing}: no such file"):
        prepare_environment([])
    with pytest.raises(RQConfigError, match=f"--rq-canary-file={tmp_path}: not a file"):
        prepare_environment(["--rq-canary-file", str(tmp_path)])
    spec = tmp_path / "canary.json"
    spec.write_text('{"input_ids": [1, 2]}')
    prepare_environment(["--rq-canary-file", str(spec)])


@pytest.mark.parametrize("content,needle", [
    ("", "Expecting value"), ("[1, 2]", "a JSON object of input_ids"),
    ('{"prompt": "x"}', "missing 1 required positional argument: 'input_ids'"),
    ('{"input_ids": []}', "input_ids is empty"), ('{"input_ids": [1], "ids": 2}', "'ids'"),
    # the fix's review: values of the wrong type passed
    ('{"input_ids": "12"}', "must be lists of token ids"),
    ('{"input_ids": [-1, 1e30]}', "must be lists of token ids"),
    ('{"input_ids": [1, 2], "max_new_tokens": 0}', "max_new_tokens=0 must be an integer >= 1")])
def test_malformed_canary_file_is_refused_before_the_model_loads(clean_env, tmp_path, content,
                                                                 needle):
    """A seventh new-user review (session 42): an empty file, one without ``input_ids`` or with an
    empty list passed the start-up check (it only tested that the file exists) and failed 13 s
    later with a JSONDecodeError or TypeError traceback that named neither file nor flag."""
    from sglang_rq.config import RQConfigError

    spec = tmp_path / "canary.json"
    spec.write_text(content)
    with pytest.raises(RQConfigError, match=f"--rq-canary-file: canary spec {spec}: .*") as err:
        prepare_environment(["--rq-canary-file", str(spec)])
    assert needle in str(err.value)


def test_model_checks_come_before_sglang_is_imported(tmp_path):
    """Session 44: the loop bits, the KV heads against --tp-size, the rotation file and the
    fixed bytes of a given --rq-staging-tokens were checked after SGLang's import (13-38 s on a
    loaded 2-core host); config.json and the flags alone decide them, so the launcher refuses
    them before importing any of SGLang."""
    import subprocess

    from sglang_rq.models.embedded import EMBEDDED_MODEL

    rot = EMBEDDED_MODEL.parent / "mini-ouro-rotation.safetensors"
    probe = ("import sys\n"
             "from sglang_rq.config import RQConfigError\n"
             "from sglang_rq.launch_server import prepare_environment\n"
             "try:\n"
             "    prepare_environment(sys.argv[1:])\n"
             "except RQConfigError as exc:\n"
             "    print('refused:', exc)\n"
             "print('sglang imported:', any(m.split('.')[0] == 'sglang' for m in sys.modules))\n")
    for argv, reason in ((["--rq-rotation", str(tmp_path / "none.safetensors")],
                          "--rq-rotation=.*none.safetensors"),
                         (["--rq-loop-bits", "2,2"], "--rq-loop-bits gives 2 widths"),
                         (["--rq-rotation", str(rot), "--tp-size", "2"],
                          "not sharded across ranks"),
                         (["--rq-staging-tokens", "100000000000"], "the pool's fixed bytes")):
        r = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        assert re.search("refused: .*" + reason, r.stdout), r.stdout
        assert "sglang imported: False" in r.stdout


def test_unreadable_or_non_finite_rotation_is_refused(tmp_path):
    """Found by a new-user review (12-05): a file that is not safetensors gave a traceback, and a
    rotation of the right shape full of NaN passed the orthogonality check (NaN > 1e-3 is false)
    and served empty answers."""
    from safetensors.torch import load_file, save_file

    from sglang_rq.config import RQConfig, RQConfigError
    from sglang_rq.launch_server import validate_against_model
    from sglang_rq.models.embedded import EMBEDDED_MODEL

    junk = tmp_path / "junk.safetensors"
    junk.write_text("hello")
    with pytest.raises(RQConfigError, match="--rq-rotation=.*junk.safetensors: cannot read"):
        validate_against_model(RQConfig(rotation=str(junk)), str(EMBEDDED_MODEL))
    good = load_file(str(EMBEDDED_MODEL.parent / "mini-ouro-rotation.safetensors"))["rotation"]
    for name, value in (("nan", float("nan")), ("inf", float("inf"))):
        bad = good.clone()
        bad[0, 0, 3, 5] = value
        path = tmp_path / f"{name}.safetensors"
        save_file({"rotation": bad}, str(path))
        with pytest.raises(RQConfigError, match="holds NaN or infinite values"):
            validate_against_model(RQConfig(rotation=str(path)), str(EMBEDDED_MODEL))
    save_file({"rotation": good}, str(tmp_path / "good.safetensors"))
    validate_against_model(RQConfig(rotation=str(tmp_path / "good.safetensors")),
                           str(EMBEDDED_MODEL))


def test_kv_budget_above_the_machine_is_refused(clean_env):
    from sglang_rq.config import RQConfigError

    with pytest.raises(RQConfigError, match=r"--rq-kv-budget-gb=100000.0 exceeds .* GiB"):
        prepare_environment(["--rq-kv-budget-gb", "100000"])
    prepare_environment(["--rq-kv-budget-gb", "0.5"])  # within any machine's memory


def test_malformed_rq_flag_is_one_line(clean_env):
    """Found by a fresh-clone check: argparse's own errors for our flags printed a 14-line
    usage headed by the wrong program name."""
    from sglang_rq.config import RQConfigError

    with pytest.raises(RQConfigError, match="argument --rq-anchor: invalid choice: 'middle'"):
        prepare_environment(["--rq-anchor", "middle"])
    with pytest.raises(RQConfigError, match="argument --rq-residual-bits: invalid int value"):
        prepare_environment(["--rq-residual-bits", "abc"])


def test_staging_refusal_follows_one_forward_not_the_default_margin(monkeypatch):
    """`plugin.check_staging_tokens`: one forward carries at most max(chunk, decode batch);
    with --enable-mixed-chunk SGLang takes the decode tokens out of the chunk's budget, so
    8,192 staging tokens serve chunks of 8,192 mixed with 256 decodes (the default size,
    `layout.staging_tokens`, adds them: 8,448), and 8,191 do not."""
    from types import SimpleNamespace

    from sglang_rq import env
    from sglang_rq.config import RQConfigError
    from sglang_rq.plugin import check_staging_tokens

    args = SimpleNamespace(chunked_prefill_size=8192, max_prefill_tokens=16384,
                           max_running_requests=256, enable_mixed_chunk=True)
    monkeypatch.setenv(env.RQ_STAGING_TOKENS.name, "8192")
    check_staging_tokens(args)
    monkeypatch.setenv(env.RQ_STAGING_TOKENS.name, "8191")
    with pytest.raises(RQConfigError, match="below the 8192 tokens one forward can carry"):
        check_staging_tokens(args)
    args.max_running_requests = None  # unset: taken as 4096, below the chunk
    with pytest.raises(RQConfigError, match="unset, taken as 4096"):
        check_staging_tokens(args)


def test_empty_prompt_refused_unless_multimodal_or_embeddings():
    """`plugin._input_ids_hook`: no token ids is a 400 (ValueError) for a text prompt; a
    multimodal request (ids filled in by its processor) or one carrying embeddings passes on."""
    from types import SimpleNamespace

    from sglang_rq.plugin import _input_ids_hook

    def original(self, obj, input_ids):
        return "validated"

    tm = SimpleNamespace(model_config=SimpleNamespace(vocab_size=8192, hidden_size=4))
    text = SimpleNamespace(contains_mm_input=lambda: False, input_embeds=None)
    with pytest.raises(ValueError, match="the prompt is empty"):
        _input_ids_hook(original, tm, text, [])
    audio = SimpleNamespace(contains_mm_input=lambda: True, input_embeds=None)
    assert _input_ids_hook(original, tm, audio, []) == "validated"
    embeds = SimpleNamespace(contains_mm_input=lambda: False, input_embeds=[[0.0] * 4] * 3)
    assert _input_ids_hook(original, tm, embeds, []) == "validated"
    assert _input_ids_hook(original, tm, text, None) == "validated"


def test_logprob_requests_the_scheduler_cannot_serve_are_refused():
    """`plugin._input_ids_hook`: top_logprobs_num above the vocabulary (or below 0) and
    logprob_start_len below -1 are a 400 (ValueError) naming the field; SGLang 0.5.23's
    scheduler died on them (a new-user review, 12-05). A top_k of 0 or below -1 is refused at
    temperature 0 too, where SGLang replaced it by 1 unchecked (12-06). The edges pass."""
    from types import SimpleNamespace

    from sglang_rq.plugin import _input_ids_hook

    def original(self, obj, input_ids):
        return "validated"

    tm = SimpleNamespace(model_config=SimpleNamespace(vocab_size=8192, hidden_size=4))

    def req(**kw):
        return SimpleNamespace(contains_mm_input=lambda: False, input_embeds=None, **kw)
    for k in (8193, 10**5, -1, [3, 9000]):
        with pytest.raises(ValueError, match=r"top_logprobs_num .* must be in \[0, 8192\]"):
            _input_ids_hook(original, tm, req(top_logprobs_num=k), [1, 2])
    for start in (-2, -5, [0, -3]):
        with pytest.raises(ValueError, match="logprob_start_len is -[0-9]+: it must be -1"):
            _input_ids_hook(original, tm, req(logprob_start_len=start), [1, 2])
    for params in ({"top_k": 0, "temperature": 0}, {"top_k": -5}, [{"top_k": 1}, {"top_k": 0}]):
        with pytest.raises(ValueError, match=r"top_k must be -1 \(disable\) or at least 1, got"):
            _input_ids_hook(original, tm, req(sampling_params=params), [1, 2])
    for params in ({"top_k": -1, "temperature": 0}, {"top_k": 1}, {}, None, [{"top_k": 40}]):
        assert _input_ids_hook(original, tm, req(sampling_params=params), [1, 2]) == "validated"
    # stop_regex (12-06): patterns that do not compile, and nested variable repeats (the shape
    # of catastrophic backtracking, hand-picked), are refused; ordinary patterns pass
    for pat in ("[a-", "(", "a{2,1}"):
        with pytest.raises(ValueError, match="is not a valid regular expression"):
            _input_ids_hook(original, tm, req(sampling_params={"stop_regex": pat}), [1, 2])
    for pat in ("(a+)+b", r"(\w*\s?)*$", "(a*)*", "(?:x{1,3})+y", ["ok", "((ab)+c?)+"]):
        with pytest.raises(ValueError, match="nests a repeat of variable count"):
            _input_ids_hook(original, tm, req(sampling_params=[{}, {"stop_regex": pat}]), [1, 2])
    for pat in ("a+b", r"\n\n+", "(ab)+", r"(\d{2})+", "Answer: .*", "(foo|bar)+", ["x", "y+"]):
        assert _input_ids_hook(original, tm, req(sampling_params={"stop_regex": pat}),
                               [1, 2]) == "validated"
    ok = req(top_logprobs_num=8192, logprob_start_len=-1)
    assert _input_ids_hook(original, tm, ok, [1, 2]) == "validated"
    assert _input_ids_hook(original, tm, req(top_logprobs_num=[0, 20], logprob_start_len=[0, 1]),
                           [1, 2]) == "validated"


def _handled(obj):
    """Run the hook around SGLang's own ``_handle_parallel_sampling`` on ``obj``, after the steps
    of ``normalize_batch_and_arguments`` before it; returns ``obj``."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    from sglang_rq.plugin import _parallel_samples_hook

    obj._validate_inputs()
    obj._determine_batch_size()
    _parallel_samples_hook(GenerateReqInput._handle_parallel_sampling, obj)
    return obj


@pytest.mark.parametrize("n,refused", [(1, False), (128, False), (129, True), (10**6, True),
                                       (0, True), (-3, True), (None, True), (2.5, True),
                                       (True, True)])
def test_n_outside_one_to_max_is_refused_before_the_request_is_copied(clean_env, n, refused):
    """`plugin._parallel_samples_hook` around SGLang's own ``_handle_parallel_sampling``:
    SGLang 0.5.23 expanded ``n: 1000000`` into a million requests (the worker stayed busy),
    answered ``n: -3`` (a new-user review, 12-05), and its comparison raised on ``n: null``
    (a 500; the second review)."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    obj = GenerateReqInput(text="hi", sampling_params={"n": n, "max_new_tokens": 2})
    if refused:
        with pytest.raises(ValueError, match=rf"n \(parallel samples of one prompt\) is "
                                             rf"{re.escape(repr(n))}: it must be an integer in "
                                             r"\[1, 128\] \(--rq-max-n\)"):
            _handled(obj)
    else:
        assert _handled(obj).parallel_sample_num == n


def test_n_is_checked_in_every_prompt_of_a_batch_and_the_flag_moves_the_limit(clean_env):
    from sglang.srt.managers.io_struct import GenerateReqInput

    prepare_environment(["--rq-max-n", "300"])
    ok = _handled(GenerateReqInput(text=["a", "b"], sampling_params=[{"n": 300}, {"n": 300}]))
    assert ok.parallel_sample_num == 300
    with pytest.raises(ValueError, match=r"is 301: .*\[1, 300\]"):
        _handled(GenerateReqInput(text=["a", "b"], sampling_params=[{"n": 1}, {"n": 301}]))


@pytest.mark.parametrize("text,params", [("hi", []), (["a", "b", "c"], [{"max_new_tokens": 2}])])
def test_a_list_of_sampling_params_must_match_the_prompts(clean_env, text, params):
    """SGLang 0.5.23 indexed past the end of such a list (IndexError, a 500; a third review)."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    with pytest.raises(ValueError, match=rf"sampling_params is a list of {len(params)} for "
                                         rf"{1 if isinstance(text, str) else len(text)} prompt"):
        _handled(GenerateReqInput(text=text, sampling_params=params))


@pytest.mark.parametrize("embeds,field", [([], "input_embeds"), ([[]], "input_embeds[0]")])
def test_input_embeds_without_a_first_row_is_refused_before_sglang_reads_it(embeds, field):
    """`plugin._embeds_batch_hook` around SGLang's own ``_determine_batch_size``, which reads
    ``input_embeds[0][0]``: ``[]`` and ``[[]]`` were an IndexError there, a 500 (a new-user
    review, 12-06); now a ValueError (SGLang's 400) naming the field."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    from sglang_rq.plugin import _embeds_batch_hook

    bare = GenerateReqInput(input_embeds=embeds)
    bare._validate_inputs()
    with pytest.raises(IndexError):  # SGLang alone
        bare._determine_batch_size()
    obj = GenerateReqInput(input_embeds=embeds)
    obj._validate_inputs()
    with pytest.raises(ValueError, match=rf"^{re.escape(field)} is empty: send one row of the "
                                         r"model's hidden size per token"):
        _embeds_batch_hook(GenerateReqInput._determine_batch_size, obj)


@pytest.mark.parametrize("kw,single,size", [
    ({"input_embeds": [[0.5, 0.25]]}, True, 1),  # one prompt of one token
    ({"input_embeds": [[[0.5]], [[0.25], [0.75]]]}, False, 2),  # a batch of two prompts
    ({"input_embeds": [[[0.5]], []]}, False, 2),  # a later empty prompt: `_check_input_embeds`
    ({"text": "hi", "input_embeds": []}, True, 1),  # SGLang drops embeds beside text
    ({"input_ids": [[1], [2]], "input_embeds": [[]]}, False, 2),  # ... and beside input_ids
])
def test_input_embeds_with_a_first_row_pass_to_sglang(kw, single, size):
    from sglang.srt.managers.io_struct import GenerateReqInput

    from sglang_rq.plugin import _embeds_batch_hook

    obj = GenerateReqInput(**kw)
    obj._validate_inputs()
    _embeds_batch_hook(GenerateReqInput._determine_batch_size, obj)
    assert (obj.is_single, obj.batch_size) == (single, size)


def test_detokenize_ids_the_tokenizer_cannot_take_are_refused():
    """`plugin._detokenize_request_hook` around SGLang's ``_validate_request``: ``/v1/detokenize``
    with ``tokens: [-1]`` was the tokenizer's OverflowError, answered 500 (a new-user review,
    12-06). The bound is the fast tokenizer's: 2**32 - 1 decodes (to nothing, past the
    vocabulary), 2**32 and -1 raise; every id of a batch is checked."""
    from sglang.srt.entrypoints.openai.protocol import DetokenizeRequest
    from sglang.srt.entrypoints.openai.serving_base import OpenAIServingBase
    from tokenizers import Tokenizer

    from sglang_rq.models.embedded import EMBEDDED_MODEL
    from sglang_rq.plugin import _detokenize_request_hook

    tok = Tokenizer.from_file(str(EMBEDDED_MODEL / "tokenizer.json"))
    assert tok.decode([2**32 - 1]) == ""
    for bad in (-1, 2**32):
        with pytest.raises(OverflowError):
            tok.decode([bad])

    def check(tokens):
        return _detokenize_request_hook(OpenAIServingBase._validate_request, None,
                                        DetokenizeRequest(tokens=tokens))

    for tokens, bad in (([-1], -1), ([5, -7, 3], -7), ([[1, 2], [-5]], -5), ([2**32], 2**32),
                        ([[3], [4, 2**40]], 2**40)):
        assert check(tokens) == (f"tokens holds token id {bad}: a token id is an integer from 0 "
                                 "to 4294967295")
    for tokens in ([], [0, 1, 2], [[0], [2**32 - 1]], [[]]):
        assert check(tokens) is None  # SGLang's own (it checks nothing here)


def test_recurrences_past_the_ceiling_are_refused():
    """A seventh new-user review (session 42): ``--rq-recurrences 100000000`` grew memory for
    minutes while the pool's slot tables were built (no upper bound)."""
    from pathlib import Path

    from sglang_rq.config import RQConfigError
    from sglang_rq.launch_server import with_recurrences
    from sglang_rq.layout import MAX_LOOPS
    from sglang_rq.models.embedded import EMBEDDED_MODEL

    huginn = str(Path(EMBEDDED_MODEL).parent / "mini-huginn")
    with pytest.raises(RQConfigError, match=f"--rq-recurrences=100000000 must be in 1 .. "
                                            f"{MAX_LOOPS}"):
        with_recurrences(["--model-path", huginn], 100_000_000)
    assert "mean_recurrence" in " ".join(with_recurrences(["--model-path", huginn], MAX_LOOPS))
    # the same count through the override the flag sets (the fix's review: no check, the hang;
    # refused where the model's shape is read, after SGLang's parser)
    import subprocess

    r = subprocess.run([sys.executable, "-m", "sglang_rq.launch_server", "--model-path", huginn,
                        "--json-model-override-args", '{"mean_recurrence": 100000000}',
                        "--port", "1", *CPU_SIZES], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and (f"error: config: field 'mean_recurrence' (100000000) is above "
                                  f"{MAX_LOOPS} loops per token") in r.stderr, r.stderr[-2000:]


def test_recurrences_and_an_override_that_disagree_are_refused():
    """A fifth new-user review (session 39): ``--rq-recurrences 8`` silently replaced the
    user's ``--json-model-override-args '{"mean_recurrence": 4}'``."""
    import json
    from pathlib import Path

    from sglang_rq.config import RQConfigError
    from sglang_rq.launch_server import with_recurrences
    from sglang_rq.models.embedded import EMBEDDED_MODEL

    huginn = str(Path(EMBEDDED_MODEL).parent / "mini-huginn")
    argv = ["--model-path", huginn, "--json-model-override-args", '{"mean_recurrence": 4}']
    with pytest.raises(RQConfigError, match="--rq-recurrences=8 and --json-model-override-args' "
                                            "mean_recurrence=4 disagree"):
        with_recurrences(argv, 8)
    # given twice, argparse keeps the last (the review of the fix: only the first was read)
    with pytest.raises(RQConfigError, match="mean_recurrence=4 disagree"):
        with_recurrences(["--model-path", huginn, "--json-model-override-args", '{"x": 1}',
                          '--json-model-override-args={"mean_recurrence": 4}'], 8)
    with pytest.raises(RQConfigError, match=r"--json-model-override-args=\[1\]: must be a JSON "
                                            "object"):
        with_recurrences(["--model-path", huginn, "--json-model-override-args", "[1]"], 8)
    out = with_recurrences(["--model-path", huginn, "--json-model-override-args",
                            '{"mean_recurrence": 8, "x": 1}'], 8)  # agreeing: kept, merged
    assert json.loads(out[out.index("--json-model-override-args") + 1]) == {
        "mean_recurrence": 8, "x": 1}


def test_the_launcher_reads_a_repeated_flag_as_argparse_does():
    """SGLang's argparse keeps a flag's last value (over all its spellings); the launcher's own
    checks read the same one."""
    from sglang_rq.launch_server import _flag_value

    argv = ["--model-path", "a", "--tp-size=2", "--model", "b", "--tp-size", "4"]
    assert _flag_value(argv, "--model-path", "--model") == "b"
    assert _flag_value(argv, "--tp-size") == "4"
    assert _flag_value(argv, "--port") is None


@pytest.mark.parametrize("argv", [["--tp-size", "abc"], ["--tp-size", "2.5"], ["--tp=abc"],
                                  ["--tensor-parallel-size", "0"]])
def test_a_tensor_parallel_size_that_is_no_count_is_named(clean_env, argv):
    """A seventh new-user review (session 42): ``--tp-size abc`` and ``2.5`` were ValueError
    tracebacks from a bare ``int()`` in this package, before SGLang's parser named the flag."""
    from sglang_rq.config import RQConfigError

    with pytest.raises(RQConfigError, match=r"--tp-size=\S+ must be an integer >= 1"):
        prepare_environment(argv)


def test_a_malformed_canary_json_beside_the_model_is_refused_before_weights_load(tmp_path):
    """The seventh review's fix review (session 42): the model's own ``canary.json`` (read where
    no --rq-canary-file is given) was loaded only by the canary's install, whose ValueError was a
    traceback; it is checked where the model path is known, before the weights load."""
    import subprocess
    from pathlib import Path

    from sglang_rq.models.embedded import EMBEDDED_MODEL

    model = tmp_path / "model"
    model.mkdir()
    for f in Path(EMBEDDED_MODEL).iterdir():
        if f.name != "canary.json":
            (model / f.name).symlink_to(f)
    (model / "canary.json").write_text("[1, 2]")
    r = subprocess.run([sys.executable, "-m", "sglang_rq.launch_server", "--model-path", str(model),
                        "--port", "1", *CPU_SIZES], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"error: canary spec {model / 'canary.json'}: a JSON object of input_ids" in r.stderr
    assert "Traceback" not in r.stderr
