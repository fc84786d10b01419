"""The `llama-sparse` CLI: chat through a pipe and a pseudo-terminal, generate, serve, bench, perplexity."""
from __future__ import annotations

import json
import os
import pty
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ggufedit import zigzag_with_levels

CLI = [sys.executable, "-m", "llama_sparse"]
WIKI = Path(__file__).resolve().parents[3] / "shared" / "data" / "wikitext-2-raw" / "wiki.test.raw"


@pytest.fixture(scope="module")
def leveled(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A zigzag SmolLM2 with two hand-set levels (mechanics only; real thresholds come from calibrate)."""
    return zigzag_with_levels(smollm2_gguf, tmp_path_factory.mktemp("cli"), "q8_0",
                              {"0.25": (0.25, 0.02), "0.50": (0.5, 0.05)})


def test_chat_from_pipe(leveled: Path):
    script = "What is the capital of France?\n/sparsity 0.5\nAnd of Italy?\n/sparsity 0.9\n/quit\n"
    r = subprocess.run(CLI + ["chat", str(leveled), "-n", "24", "-c", "512"], input=script,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Paris" in r.stdout
    assert "[sparsity 0.50]" in r.stdout
    assert "sparsity 0.50]" in r.stdout.split("[sparsity 0.50]")[1]  # the second answer ran at 0.50
    assert "not in the model; it has: 0.25, 0.50" in r.stdout  # a bad level is reported, chat goes on
    assert "tok/s" in r.stdout


def test_chat_commands(leveled: Path):
    script = "/sparsity\n/sparq\n/sparsty 0.5\n//sparsity 0.5\n/quit\n"
    r = subprocess.run(CLI + ["chat", str(leveled), "-n", "4", "-c", "256"], input=script,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "[sparsity dense; levels: 0.25, 0.50 or dense]" in r.stdout  # no argument: the setting, unchanged
    assert "[sparq off;" in r.stdout
    assert "[unknown command /sparsty:" in r.stdout  # a typo is not sent to the model
    assert r.stdout.count("tok/s") == 1  # "//sparsity 0.5" went to the model as "/sparsity 0.5"


def test_chat_interactive_pty(leveled: Path):
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(sys.executable, CLI + ["chat", str(leveled), "-n", "16", "-c", "512"])
    out = b""

    def read_until(marker: bytes, timeout: float = 180) -> None:
        nonlocal out
        end = time.time() + timeout
        while marker not in out and time.time() < end:
            if select.select([fd], [], [], 0.5)[0]:
                try:
                    out += os.read(fd, 4096)
                except OSError:
                    break
        assert marker in out, out[-2000:]

    try:
        read_until(b"> ")
        assert b"/sparsity [LEVEL]" in out  # the interactive banner
        os.write(fd, b"/sparsity 0.25\n")
        read_until(b"[sparsity 0.25]")
        os.write(fd, b"Say hello.\n")
        read_until(b"tok/s")
        os.write(fd, b"/quit\n")
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.close(fd)


def test_generate_and_errors(leveled: Path, tmp_path: Path):
    r = subprocess.run(CLI + ["generate", str(leveled), "-p", "The capital of France is", "-n", "8",
                              "--sparsity", "0.25"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Paris" in r.stdout and "sparsity 0.25" in r.stderr
    r = subprocess.run(CLI + ["chat", str(tmp_path / "nope.gguf")], input="", capture_output=True, text=True)
    assert r.returncode == 1 and "model file not found" in r.stderr
    r = subprocess.run(CLI + ["generate", str(leveled), "-p", "x", "--sparsity", "0.77"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "0.77" in r.stderr and "it has: 0.25, 0.50" in r.stderr


def test_gpu_layers_without_gpu(leveled: Path):
    """-ngl on a build without a GPU backend (CI's) is said to do nothing, instead of passing silently."""
    probe = subprocess.run([sys.executable, "-c", "import llama_sparse, llama_cpp; "
                            "print(int(llama_cpp.llama_supports_gpu_offload()))"], capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr[-2000:]
    gpu = probe.stdout.strip() == "1"
    for ngl in ("2", "0"):
        r = subprocess.run(CLI + ["generate", str(leveled), "-p", "Hi", "-n", "2", "-c", "256", "-ngl", ngl],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        said = f"-ngl {ngl} has no effect" in r.stderr
        assert said == (ngl != "0" and not gpu), r.stderr[-2000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict | bytes):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        return 200, json.loads(urllib.request.urlopen(req, timeout=180).read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_serve_chat_completions(leveled: Path):
    port = _free_port()
    # a stale LLAMA_SPARSE is not the server's level (the Python API ignores it too); -c 100 runs a 256-token context
    env = {**os.environ, "LLAMA_SPARSE": "bogus"}
    proc = subprocess.Popen(CLI + ["serve", str(leveled), "--port", str(port), "--sparsity", "0.25", "-c", "100"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 180
        while True:
            try:
                urllib.request.urlopen(base + "/v1/models", timeout=2).read()
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read()[-3000:]
                assert time.time() < deadline, "server did not come up"
                time.sleep(1)
        code, reply = _post(base + "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 16,
            "temperature": 0})
        assert code == 200 and "Paris" in reply["choices"][0]["message"]["content"], reply
        # OpenAI content parts: the text parts are the message (llama-cpp-python's templates raised TypeError, a 500)
        code, parts = _post(base + "/v1/chat/completions", {
            "messages": [{"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]}],
            "max_tokens": 16, "temperature": 0})
        assert code == 200 and parts["choices"][0]["message"] == reply["choices"][0]["message"], parts
        # past the 100 tokens asked for (the server's arrays once had only 100 slots): special tokens banned, so
        # the text runs to max_tokens
        code, reply = _post(base + "/v1/completions", {"prompt": "Count: 1, 2, 3,", "max_tokens": 150,
                                                       "temperature": 0, "logit_bias": {"0": -100, "1": -100, "2": -100}})
        assert code == 200, reply
        assert reply["usage"]["completion_tokens"] == 150 and reply["choices"][0]["finish_reason"] == "length"
        # an id outside the vocabulary is an error reply, not an abort of the server
        code, reply = _post(base + "/extras/detokenize", {"tokens": [999999]})
        assert code == 400 and "not in the vocabulary" in reply["error"]["message"], reply
        # the client's mistakes are 400s with a short reason; a bad grammar used to segfault the server
        image = {"type": "image_url", "image_url": {"url": "http://example.com/a.png"}}
        for path, body, needle in (
                ("completions", {"prompt": "Hi", "max_tokens": "abc"}, "max_tokens: Input should be a valid integer"),
                ("completions", {"prompt": "Hi", "max_tokens": 2, "grammar": "root ::= ("}, "grammar: llama.cpp cannot parse"),
                ("completions", b'{"prompt": "Hi", oops', "the request body is not JSON"),
                ("completions", {"prompt": "Hi", "max_tokens": 2, "logit_bias": {"99999999": 1}}, "not in the vocabulary"),
                ("chat/completions", {"messages": [{"role": "user", "content": [image]}], "max_tokens": 2},
                 "content part of type 'image_url'"),
                ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "n": 2},
                 "n = 2: this server makes one completion a request"),
                ("completions", {"prompt": "Hi", "max_tokens": 2, "best_of": 3}, "best_of = 3")):
            code, reply = _post(base + "/v1/" + path, body)
            assert code == 400 and needle in reply["error"]["message"], reply
            assert reply["error"]["type"] == "invalid_request_error"
        # a stream has sent its 200 before the model sees the request: its error is an event (it once ended empty)
        for path, body, needle in (
                ("completions", {"prompt": "Hi", "logit_bias": {"-1": 1}}, "token id -1 is not in the vocabulary"),
                ("completions", {"prompt": "one two " * 200}, "exceed context window"),
                ("chat/completions", {"messages": [{"role": "user", "content": [image]}]}, "content part of type"),
                ("completions", {"prompt": "Hi", "n": 2}, "n = 2")):
            data = json.dumps({**body, "max_tokens": 2, "stream": True}).encode()
            req = urllib.request.Request(base + "/v1/" + path, data=data, headers={"Content-Type": "application/json"})
            lines = urllib.request.urlopen(req, timeout=180).read().decode().splitlines()
            events = [line[len("data: "):] for line in lines if line.startswith("data: ")]
            assert len(events) == 2 and events[1] == "[DONE]", events
            error = json.loads(events[0])["error"]
            assert needle in error["message"] and error["type"] == "invalid_request_error", error
        assert urllib.request.urlopen(base + "/v1/models", timeout=10).status == 200
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("server did not stop on SIGINT")
    out = proc.stdout.read()
    assert proc.returncode == 0, proc.returncode
    assert "-c 100 raised to 256" in out and "sparsity 0.25, sparq off" in out, out[-2000:]
    assert "runs dense" not in out, out[-2000:]  # the C tools' LLAMA_SPARSE note: the level is set through the API


def test_bench_table(leveled: Path):
    r = subprocess.run(CLI + ["bench", str(leveled), "--levels", "dense,0.50", "-p", "16", "-n", "8", "-r", "1"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = {l.split()[1]: l.split() for l in r.stdout.splitlines() if l.startswith("fork ")}
    assert set(lines) == {"dense", "0.50"}
    assert float(lines["dense"][3]) > 0 and float(lines["0.50"][3]) > 0


def test_perplexity_table(leveled: Path, tmp_path: Path):
    text = tmp_path / "wiki.txt"
    src = WIKI.read_text(encoding="utf-8") if WIKI.exists() else (
        "The tower is 324 metres tall , about the same height as an 81 @-@ storey building . " * 200)
    text.write_text(src[:20000], encoding="utf-8")
    r = subprocess.run(CLI + ["perplexity", str(leveled), "-f", str(text), "--levels", "dense,0.50",
                              "-c", "128", "--chunks", "2"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {l.split()[0]: float(l.split()[1]) for l in r.stdout.splitlines()[1:] if l.strip()}
    assert set(rows) == {"dense", "0.50"}
    assert 1.0 < rows["dense"] < 1000 and rows["0.50"] >= rows["dense"] * 0.9
    # more chunks than the text holds: said, and every spelling of dense is one dense row (with -ngl given)
    r = subprocess.run(CLI + ["perplexity", str(leveled), "-f", str(text), "--levels", "0,off,dense",
                              "-c", "128", "--chunks", "500", "-ngl", "0"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "every row ran" in r.stderr and "not 500" in r.stderr
    assert [l.split()[0] for l in r.stdout.splitlines()[1:] if l.strip()] == ["dense"]
