"""Bad input to the offline commands (``score``, ``eval``, ``calibrate``) is an argparse error
naming the flag, given before any work starts: a new-user review (session 38) got Python
tracebacks (a missing or non-JSON ids file, a missing model directory, a Huginn checkpoint for
the Ouro-only calibration) or the error only after a 69 s reference run (a missing rotation
file)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sglang_rq.models.embedded import EMBEDDED_MODEL

HUGINN = Path(EMBEDDED_MODEL).parent / "mini-huginn"
OURO_ROTATION = Path(EMBEDDED_MODEL).parent / "mini-ouro-rotation.safetensors"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sglang_rq.cli", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("content,needle", [
    (None, "No such file"), ("[1, 2,", "Expecting value"), ('{"ids": [1]}', "needs 'input_ids'"),
    # the fix's review: tracebacks (5, null) or silently misread ("123" as [1, 2, 3], 1.5 as 1,
    # true as 1)
    ("5", "must be a JSON list of integer token ids"),
    ("null", "must be a JSON list of integer token ids"),
    ('"123"', "must be a JSON list of integer token ids"),
    ("[1.5, 2, 3]", "must be a JSON list of integer token ids"),
    ("[true, false, 3]", "must be a JSON list of integer token ids"),
    ('{"input_ids": [1, 2, 3], "start": "2"}', "start='2' (--start or the file's 'start')"),
    # a seventh review (session 42): these were rc 1 from the library, naming no flag
    ("[]", "start=1 (--start or the file's 'start') must satisfy 1 <= start < 0"),
    ('{"input_ids": [1, 2], "start": 5}', "start=5 (--start or the file's 'start') must satisfy")])
def test_score_ids_file_errors(tmp_path, content, needle):
    path = tmp_path / "ids.json"
    if content is not None:
        path.write_text(content)
    r = _cli("score", "--url", "http://127.0.0.1:9", "--input-ids-file", str(path))
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    assert needle.startswith("start=") or f"--input-ids-file={path}: " in r.stderr
    assert "Traceback" not in r.stderr


def test_score_timeout_must_be_positive(tmp_path):
    (tmp_path / "ids.json").write_text("[1, 2, 3]")
    r = _cli("score", "--input-ids-file", str(tmp_path / "ids.json"), "--timeout", "nan")
    assert r.returncode == 2 and "--timeout=nan must be > 0 and finite" in r.stderr


def test_waits_past_a_year_are_refused(tmp_path):
    """A seventh new-user review (session 42): ``--timeout 1e10`` and ``--timeout-s 1e10`` raised
    OverflowError tracebacks from the socket and the task pool, the latter after the model had
    answered."""
    (tmp_path / "ids.json").write_text("[1, 2, 3]")
    r = _cli("score", "--input-ids-file", str(tmp_path / "ids.json"), "--timeout", "1e10")
    assert r.returncode == 2 and "--timeout=10000000000.0 s is longer than a year" in r.stderr
    r = _cli("tasks", "--url", "http://127.0.0.1:9", "--task", "gsm8k", "--timeout-s", "1e10")
    assert r.returncode == 2 and "--timeout-s=10000000000.0 s is longer than a year" in r.stderr


@pytest.mark.parametrize("args,needle", [
    (["--out", "{tmp}/d.safetensors"], "--out={tmp}/d.safetensors is a directory"),
    (["--out", "/proc/sglang-rq-test/r.safetensors"],
     "--out=/proc/sglang-rq-test/r.safetensors: cannot write under /proc"),
    (["--lr", "nan"], "--lr=nan must be > 0 and finite"),
    (["--seed", str(2 ** 64)], f"--seed={2 ** 64} must be in -2^63 .. 2^64 - 1"),
    (["--rq-rotation-seed", str(2 ** 64)], f"--rq-rotation-seed={2 ** 64} must be in"),
    (["--rq-disable"], "--rq-disable: calibrate learns the rotations of the RQ cache"),
    (["--rq-loop-bits", "2,2"], "--rq-loop-bits gives 2 widths but the model runs 4 loops"),
    # a review (12-06): nothing rounded, an autograd traceback after the capture
    (["--rq-loop-bits", "16,16,16,16"], "the format rounds no loop (widths 16,16,16,16"),
    (["--rq-anchor-bits", "16", "--rq-residual-bits", "0"], "the format rounds no loop"),
    (["--data-dir", "/"], "--data-dir=/: /literature/herman.melville.moby.dick.or.the.whale.txt "
                          "not found")])
def test_calibrate_refuses_before_the_capture(tmp_path, args, needle):
    """A seventh new-user review (session 42): each of these failed with a traceback only after
    the model load and the capture, or after the learning (the output path, which lost it)."""
    (tmp_path / "d.safetensors").mkdir()
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    out = [] if args[0] == "--out" else ["--out", str(tmp_path / "r.safetensors")]
    r = _cli("calibrate", *out, *args)
    assert r.returncode == 2 and needle.replace("{tmp}", str(tmp_path)) in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("args,needle", [
    (["--model-path", "/nonexistent"], "--model-path=/nonexistent: no config.json there"),
    (["--formats", "rotation=/nonexistent.safetensors"],
     "--formats rotation=/nonexistent.safetensors: no such file"),
    # session 44: a file the server refuses was found only when its server started, after the
    # whole BF16 run (another model's rotation, or not safetensors)
    (["--model-path", str(HUGINN), "--formats", f"rotation={OURO_ROTATION}"],
     "rotation has shape"),
    (["--formats", "rotation={tmp}/junk.safetensors"], "cannot read a 'rotation' tensor"),
    # a seventh new-user review (session 42): tracebacks (IndexError, FileNotFoundError, shlex's
    # ValueError after 13 s), a BF16-only run that exited 0, a 400 after a whole server run
    (["--datasets", ","], "--datasets=',' names none"),
    (["--data-dir", "/"], "--data-dir=/: /literature/jane.austen.pride.and.prejudice.txt not found"),
    (["--server-args", "'--foo"], "--server-args=\"'--foo\": No closing quotation"),
    # a new-user review (12-06): "--rq-disable" served every format as BF16 and the table gave
    # each format's bits beside BF16's KL 0 (rc 0)
    (["--server-args", "--rq-disable --mem-fraction-static 0.3"],
     "--server-args sets --rq-disable: the KV format comes from --formats"),
    (["--server-args", "--port=31000 --chunked-prefill-size 64"],
     "--server-args sets --port=31000, --chunked-prefill-size:"),
    (["--formats", ""], "--formats is empty"),
    # the server's 400 came after the BF16 server had loaded (a review, 12-06)
    (["--top-k", "100000"], "--top-k=100000 exceeds the model's vocabulary (8192 tokens)"),
    (["--gen-prompts", "0"], "--gen-prompts must be >= 1"),
])
def test_eval_refuses_before_serving(tmp_path, args, needle):
    (tmp_path / "junk.safetensors").write_text("hello")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    r = _cli("eval", "--out", str(tmp_path / "o"), *args)
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "o").exists()


def test_calibrate_refuses_a_model_it_cannot_capture(tmp_path):
    r = _cli("calibrate", "--model-path", str(HUGINN), "--out", str(tmp_path / "r.safetensors"))
    assert r.returncode == 2 and "model_type 'huginn_raven'" in r.stderr, r.stderr
    assert "supports only 'ouro'" in r.stderr and "Traceback" not in r.stderr


def test_kv_size_budget_past_a_byte_count():
    """``--memory-gb 1e300`` is finite, and overflowed int64 bytes (a traceback; fix review)."""
    r = _cli("kv-size", "--model-config", str(EMBEDDED_MODEL), "--memory-gb", "1e300")
    assert r.returncode == 2 and "--memory-gb=1e+300 is past what a byte count holds" in r.stderr


def test_kv_size_checks_a_rotation_file(tmp_path):
    """``kv-size --rq-rotation FILE`` read nothing of the file (its bytes come from the shape), so
    a missing one, one of another model's shape or one under ``--tp-size 2`` printed figures
    for a format that `serve` refuses (session 42's review, left then)."""
    good = str(OURO_ROTATION)
    base = ("kv-size", "--model-config", str(EMBEDDED_MODEL), "--rq-rotation")
    r = _cli(*base, str(tmp_path / "none.safetensors"))
    assert r.returncode == 2 and "cannot read a 'rotation' tensor" in r.stderr, r.stderr
    r = _cli(*base, good, "--tp-size", "2")
    assert r.returncode == 2 and "not sharded across ranks" in r.stderr, r.stderr
    r = _cli("kv-size", "--model-config", str(HUGINN), "--rq-rotation", good)
    assert r.returncode == 2 and "rotation has shape" in r.stderr, r.stderr
    r = _cli(*base, good)
    assert r.returncode == 0 and "bytes/token" in r.stdout, r.stderr


def test_out_paths_refused_before_the_run(tmp_path):
    """``tasks --out`` under a file and ``eval --out`` naming a file failed only after the run or
    with a traceback (fix review)."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    r = _cli("tasks", "--url", "http://127.0.0.1:9", "--task", "gsm8k", "--out",
             str(afile / "res.json"))
    assert r.returncode == 2 and f"--out={afile / 'res.json'}: a parent of it is a file" in r.stderr
    r = _cli("eval", "--out", str(afile))
    assert r.returncode == 2 and f"--out={afile} is a file" in r.stderr
    # a parent that cannot be made (session 42's review: after grading, a traceback)
    r = _cli("tasks", "--url", "http://127.0.0.1:9", "--task", "gsm8k", "--out",
             "/proc/sglang-rq-test/out.json")
    assert r.returncode == 2 and "/proc/sglang-rq-test/out.json: cannot write under /proc" in r.stderr
    for cmd in ("eval", "bundle"):  # output directories (the fix's review: tracebacks)
        r = _cli(cmd, "--out", "/proc/sglang-rq-test/res")
        assert r.returncode == 2 and "--out=/proc/sglang-rq-test/res: cannot write under /proc" \
            in r.stderr, r.stderr


@pytest.mark.parametrize("field,value,needle", [
    ("num_attention_heads", 0, "field 'num_attention_heads' must be a positive integer, got 0"),
    ("num_hidden_layers", "4", "field 'num_hidden_layers' must be a positive integer, got '4'"),
    ("total_ut_steps", 2.5, "field 'total_ut_steps' must be a positive integer, got 2.5"),
    ("total_ut_steps", 2000, "field 'total_ut_steps' (2000) is above 1024 loops per token"),
    ("head_dim", 100, "no supported group size (16, 32, 64) does; serve it with --rq-disable")])
def test_kv_size_bad_model_config_is_one_line(tmp_path, field, value, needle):
    # a fifth new-user review (session 39): tracebacks (ZeroDivisionError, TypeError), 2.5 loops
    # read as 2, and "choose a group size in []"
    import json

    hf = json.loads((Path(EMBEDDED_MODEL) / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**hf, field: value}))
    r = _cli("kv-size", "--model-config", str(tmp_path / "config.json"))
    assert r.returncode != 0 and needle in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_doctor_unpack_of_a_file_that_is_no_bundle(tmp_path):
    fake = tmp_path / "fake.tar.xz"
    fake.write_text("not a bundle")
    r = subprocess.run([sys.executable, "-m", "sglang_rq.doctor", "--unpack", str(fake), "--site",
                        str(tmp_path / "site")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "not a readable .tar.xz bundle" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    # a --site that cannot be a directory is named as such, not blamed on the bundle
    r = subprocess.run([sys.executable, "-m", "sglang_rq.doctor", "--unpack", str(fake), "--site",
                        str(fake / "site")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"--site {fake / 'site'}: cannot be a directory" in r.stderr


@pytest.mark.parametrize("args,needle", [
    (["--host-freeze", "{tmp}/missing.txt"], "--host-freeze={tmp}/missing.txt: cannot read it"),
    (["--host-freeze", "{tmp}"], "--host-freeze={tmp}: cannot read it"),
    (["--host-freeze", "{tmp}/binary.txt"], "--host-freeze={tmp}/binary.txt: cannot read it"),
    (["--python", "abc"], "--python=abc must be a Python version such as 3.12")])
def test_bundle_refuses_before_pip(tmp_path, args, needle):
    """A seventh new-user review (session 42): tracebacks for each, and for ``--python abc``
    pip's usage text and a CalledProcessError, leaving an empty --out directory."""
    (tmp_path / "binary.txt").write_bytes(b"\x00\xff\xfe")
    afile = tmp_path / "afile"
    afile.write_text("x")
    out = tmp_path / "bundle"
    r = _cli("bundle", "--out", str(out), *(a.replace("{tmp}", str(tmp_path)) for a in args))
    assert r.returncode == 2 and needle.replace("{tmp}", str(tmp_path)) in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not out.exists()
    for bad, said in ((afile, f"--out={afile} is a file"),
                      (afile / "b", f"--out={afile / 'b'}: a parent of it is a file")):
        r = _cli("bundle", "--out", str(bad))
        assert r.returncode == 2 and said in r.stderr, r.stderr


def test_doctor_site_alone_must_be_a_site(tmp_path):
    """A seventh new-user review (session 42): ``doctor --site DIR`` without ``--unpack`` was
    ignored, and the venv's check reported "serving can work"; it now checks that site, which
    must exist."""
    r = subprocess.run([sys.executable, "-m", "sglang_rq.doctor", "--site", str(tmp_path / "no")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"--site {tmp_path / 'no'}: no such directory" in r.stderr


def test_eval_server_errors_carry_the_servers_reason():
    """A review (12-06): ``eval --doc-tokens 3000`` (past the 2,048-token context) stopped after
    40 s with only "400 Client Error: Bad Request for url"; the server's reason is kept."""
    import requests

    from sglang_rq.quality.harness import _ok

    r = requests.Response()
    r.status_code, r.url = 400, "http://127.0.0.1:1/generate"
    r._content = b'{"error": {"message": "The input (3001 tokens) is longer than the model\'s context"}}'
    with pytest.raises(requests.HTTPError, match=r"/generate answered 400: .*longer than the model"):
        _ok(r)
    r.status_code = 200
    assert _ok(r) is r


def test_kv_size_takes_huginn_recurrences_as_serve_does():
    """README's Huginn example serves ``--rq-recurrences 8``; ``kv-size`` had no such flag, so it
    could only size the config's 32 recurrences (a new-user review, 12-06). With the flag it sizes
    the config with ``mean_recurrence`` 8, as serve's ``--json-model-override-args`` does.

    By hand (mini-Huginn: 2 core layers, 2 KV heads, head_dim 96, a 16-bit prelude and coda
    layer; the default format, loop groups of 4): an un-looped layer holds 2 (K, V) x 2 heads x
    96 x 2 B = 768 B; a core layer's loop group per (K or V, head) holds a 4-bit anchor (48 B),
    three 2-bit residuals (3 x 24 B), FP8 (scale, offset) for 4 loops x 3 groups of 32 (24 B)
    and three bf16 LSQ coefficients (6 B): 150 B. At 8 recurrences (2 groups): 2 x 768 +
    2 layers x 2 groups x 2 x 2 x 150 = 3,936 B, what the served pool exported as
    ``sglang_rq_kv_bytes_per_token`` in that review; at 32 (8 groups) 1,536 + 9,600 = 11,136 B,
    README's table."""
    import json

    r = _cli("kv-size", "--model-config", str(HUGINN), "--rq-recurrences", "8", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["bytes_per_token"] == 3936
    r = _cli("kv-size", "--model-config", str(HUGINN), "--json")
    assert json.loads(r.stdout)["bytes_per_token"] == 11136
    r = _cli("kv-size", "--model-config", str(EMBEDDED_MODEL), "--rq-recurrences", "8")
    assert r.returncode == 2 and "--rq-recurrences applies to Huginn" in r.stderr
    r = _cli("kv-size", "--model-config", str(HUGINN), "--rq-recurrences", "0")
    assert r.returncode == 2 and "--rq-recurrences=0 must be in 1 .. 1024" in r.stderr
