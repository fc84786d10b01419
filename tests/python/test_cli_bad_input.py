"""Bad input at the CLI: a clear error and a nonzero exit, no traceback, and nothing of the user's destroyed."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gguf import GGUFValueType

from ggufedit import rewrite_gguf, zigzag_with_levels

CLI = [sys.executable, "-m", "llama_sparse"]
AUSTEN = Path(__file__).resolve().parents[3] / "shared" / "data" / "austen"


@pytest.fixture(scope="module")
def leveled(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return zigzag_with_levels(smollm2_gguf, tmp_path_factory.mktemp("clibad"), "q8_0",
                              {"0.25": (0.25, 0.02), "0.50": (0.5, 0.05)})


def run(*args: str, stdin: str | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), input=stdin, capture_output=True, text=True, timeout=timeout)


def refused(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode != 0, r.stdout[-1000:] + r.stderr[-1000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    for n in needles:
        assert n in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("level", ["-0.5", "1.0", "1.5"])
def test_out_of_range_levels_refused(leveled: Path, level: str):
    # "-0.5" once ran as 0.50 (the dash read as an empty mode)
    refused(run("generate", str(leveled), "-p", "Hi", "-n", "2", f"--sparsity={level}"), "sparsity")


def test_zero_as_a_number_is_dense(leveled: Path):
    r = run("generate", str(leveled), "-p", "Hi", "-n", "2", "--sparsity", "0.0")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "sparsity dense" in r.stderr


def test_level_specs_in_c_api(leveled: Path):
    import llama_sparse
    from llama_sparse import _native
    llm = llama_sparse.Llama(leveled, n_ctx=64, verbose=False)
    try:
        assert _native.llama_sparse_set_level(llm._ctx.ctx, b"-0.50") != 0
        assert llm.sparsity == "dense"
        assert _native.llama_sparse_set_level(llm._ctx.ctx, b"0.00") == 0  # a zero is dense
        assert llm.sparsity == "dense"
        # a number in any notation Python's level_name reads ("5e-1" was once mode "5e" at 1, refused)
        for spec in (b"5e-1", b".5", b"0.500"):
            assert _native.llama_sparse_set_level(llm._ctx.ctx, spec) == 0, spec
            assert llm.sparsity == "0.50", spec
        for spec in (b"5e-1x", b"5e-", b"1e0"):
            assert _native.llama_sparse_set_level(llm._ctx.ctx, spec) != 0, spec
            assert llm.sparsity == "0.50", spec  # a refused level leaves the current one
    finally:
        llm.close()


@pytest.mark.parametrize("args,needle", [
    (["-n", "0"], "-n 0"), (["-n", "-2"], "-n -2"), (["-c", "-5"], "-c -5"), (["-t", "0"], "-t 0"),
    (["--temp", "-1"], "--temp"), (["-p", "  "], "prompt is empty"),
])
def test_generate_bad_numbers(leveled: Path, args: list[str], needle: str):
    base = ["generate", str(leveled), "-n", "2"]
    if "-p" not in args:
        base += ["-p", "Hi"]
    refused(run(*base, *args), needle)


def test_prompt_longer_than_context(leveled: Path):
    # llama.cpp sizes contexts in steps of 256 tokens: -c 4 becomes 256, and the CLI says so
    refused(run("generate", str(leveled), "-p", "Hello there my friend, how are you today? " * 40, "-n", "4", "-c", "4"),
            "-c 4 raised to 256", "does not leave room in the context (-c 256)")


def test_chat_survives_a_full_context(leveled: Path):
    long = "Summarize: " + "the cat sat on the mat and " * 12  # ~90 tokens: the third turn cannot fit 256
    script = f"hi\n{long}\n{long}\n{long}\n/reset\nhi\n/quit\n"
    r = run("chat", str(leveled), "-n", "40", "-c", "256", stdin=script)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "no longer fits the context (-c 256" in r.stdout
    assert "[history cleared]" in r.stdout
    assert r.stdout.rstrip().endswith("]")  # the last turn, after /reset, answered


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_output_that_is_not_a_regular_file_is_kept(smollm2_gguf: Path, leveled: Path, tmp_path: Path, kind: str):
    out = tmp_path / "special.gguf"
    if kind == "device":
        if os.geteuid() != 0:
            pytest.skip("mknod of a character device needs root")
        os.mknod(out, 0o666 | 0o020000, os.makedev(1, 3))  # like /dev/null
    else:
        os.mkfifo(out)
    refused(run("convert", str(smollm2_gguf), "-o", str(out), "--type", "q8_0"), "not a regular file")
    refused(run("calibrate", str(leveled), "-o", str(out), "--random-tokens", "1", "-n", "64", "-c", "32"),
            "not a regular file")
    assert not out.is_file() and out.exists()


def test_fifo_input_refused(tmp_path: Path):
    fifo = tmp_path / "in.gguf"
    os.mkfifo(fifo)
    refused(run("convert", str(fifo), "-o", str(tmp_path / "o.gguf"), timeout=60), "not a regular file")


def test_binary_text_refused(smollm2_gguf: Path, leveled: Path, tmp_path: Path):
    refused(run("calibrate", str(leveled), "-o", str(tmp_path / "c.gguf"), "--text", str(smollm2_gguf)),
            "is not UTF-8 text")
    refused(run("perplexity", str(leveled), "-f", str(smollm2_gguf), "--chunks", "1", "-c", "128", "--levels", "dense"),
            "binary file")


def test_recalibrate_over_broken_thresholds(leveled: Path, tmp_path: Path):
    n_layer = 30  # SmolLM2-135M
    bad = rewrite_gguf(leveled, tmp_path / "nan.gguf", {
        "llama_sparse.thresholds.0.50": ([float("nan")] * (4 * n_layer), GGUFValueType.ARRAY, GGUFValueType.FLOAT32)})
    out = tmp_path / "fixed.gguf"
    r = run("calibrate", str(bad), "-o", str(out), "--random-tokens", "1", "--levels", "0.5", "--mode", "unified",
            "-n", "256", "-c", "64", "-q")
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(r.stdout.splitlines()) + len(r.stderr.splitlines()) < 20  # no native load log
    import llama_sparse
    llm = llama_sparse.Llama(out, sparsity=0.5, n_ctx=64, verbose=False)
    try:
        assert llm.sparsity == "0.50"
    finally:
        llm.close()


@pytest.mark.parametrize("args,needle", [
    (["-ub", "4"], "-ub 4"), (["-ub", "0"], "-ub 0"), (["--chunks", "0"], "--chunks"), (["-t", "0"], "-t 0"),
])
def test_perplexity_bad_args(leveled: Path, args: list[str], needle: str):
    text = sorted(AUSTEN.glob("*.txt"))[0]
    refused(run("perplexity", str(leveled), "-f", str(text), "-c", "128", "--levels", "dense", *args), needle)


def test_perplexity_text_too_short(leveled: Path, tmp_path: Path):
    short = tmp_path / "short.txt"
    short.write_text("A few words only.\n")
    refused(run("perplexity", str(leveled), "-f", str(short), "--chunks", "1", "-c", "128", "--levels", "dense"),
            "gave no estimate")


@pytest.mark.parametrize("args,needle", [
    (["-r", "0"], "-r 0"), (["-p", "0", "-n", "0"], "at least one of them"), (["--levels", "0.55"], "'0.55' is not in"),
    (["--levels", "-0.5"], "sparsity"), (["-t", "0"], "-t 0"), (["-d", "-5"], "-d -5"),
])
def test_bench_bad_args(leveled: Path, args: list[str], needle: str):
    refused(run("bench", str(leveled), "-p", "8", "-n", "4", "-r", "1", *args), needle)


def test_sigterm_leaves_no_temp_file(smollm2_gguf: Path, tmp_path: Path):
    out = tmp_path / "keep.gguf"
    p = subprocess.Popen(CLI + ["convert", str(smollm2_gguf), "-o", str(out), "--type", "q4_k"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not any(f.name.endswith(".tmp") for f in tmp_path.iterdir()):
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode != 0, err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())


def test_perplexity_and_bench_on_a_truncated_model(leveled: Path, tmp_path: Path):
    bad = tmp_path / "trunc.gguf"
    bad.write_bytes(leveled.read_bytes()[: leveled.stat().st_size // 3])
    text = sorted(AUSTEN.glob("*.txt"))[0]
    refused(run("perplexity", str(bad), "-f", str(text), "--chunks", "1", "-c", "128"), "may be truncated")
    refused(run("bench", str(bad), "-p", "8", "-n", "4", "-r", "1", "--levels", "0.5"), "may be truncated")


@pytest.mark.parametrize("level", ["0.33", "bogus", "-0.5"])
def test_serve_bad_level_says_why(leveled: Path, level: str):
    refused(run("serve", str(leveled), f"--sparsity={level}", "--port", "8799", timeout=120), "sparsity")


@pytest.mark.parametrize("args,needle", [
    (["-t", "0"], "-t 0"), (["--port", "-1"], "--port -1"), (["--port", "70000"], "--port 70000"), (["-c", "-1"], "-c -1"),
    (["-ngl", "-5"], "-ngl -5: give a layer count >= 0"),
])
def test_serve_bad_numbers(leveled: Path, args: list[str], needle: str):
    refused(run("serve", str(leveled), "--port", "8799", *args, timeout=120), needle)


def test_serve_one_level_and_a_free_port(leveled: Path):
    refused(run("serve", str(leveled), "--port", "8799", "--sparsity", "0.25,0.5", timeout=120), "one level")
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run("serve", str(leveled), "--port", str(port), timeout=120)
    refused(r, f"cannot listen on 127.0.0.1:{port}")
    assert "OpenAI-compatible API at" not in r.stderr


def test_level_on_a_standard_model_says_convert(smollm2_gguf: Path):
    refused(run("serve", str(smollm2_gguf), "--sparsity", "0.5", "--port", "8799", timeout=120),
            "is not a zigzag model (llama-sparse convert")


def test_copies_keep_the_settings(leveled: Path):
    import copy
    import pickle

    import llama_sparse
    llm = llama_sparse.Llama(leveled, n_ctx=64, sparsity=0.5, sparq="r=16,k=32", n_threads=2, verbose=False)
    for other in (pickle.loads(pickle.dumps(llm)), copy.deepcopy(llm)):
        assert (other.sparsity, other.sparq, other.n_ctx()) == ("0.50", llama_sparse.SparQ(r=16, k=32), 256)
        other.close()
    llm.set_sparsity(None)
    llm.set_sparq("off")
    other = pickle.loads(pickle.dumps(llm))
    assert (other.sparsity, other.sparq) == ("dense", None)


def test_detokenize_refuses_ids_outside_the_vocabulary(leveled: Path):
    import llama_sparse
    llm = llama_sparse.Llama(leveled, n_ctx=64, verbose=False)
    ids = llm.tokenize(b"Hello world")
    assert llm.detokenize(ids) == b"Hello world"
    for bad, needle in (([llm.n_vocab()], "not in the vocabulary"), ([-1], "not in the vocabulary"),
                        ([1.5], "list of integers")):
        with pytest.raises(ValueError, match=needle):
            llm.detokenize(ids + bad)
    with pytest.raises(ValueError, match="not in the vocabulary"):
        llm.detokenize(ids, prev_tokens=[10**7])


@pytest.mark.parametrize("args,needle", [(["-t", "0"], "-t 0"), (["-n", "0"], "-n 0")])
def test_demo_bad_numbers(args: list[str], needle: str):
    # -n 0 once ran to the end of the context (llama-cpp-python's max_tokens=0)
    refused(run("demo", *args, timeout=120), needle)


def test_convert_and_calibrate_refuse_zero_threads(smollm2_gguf: Path, leveled: Path, tmp_path: Path):
    refused(run("convert", str(smollm2_gguf), "-o", str(tmp_path / "a.gguf"), "-t", "0"), "threads (-t) must be an int >= 1")
    refused(run("calibrate", str(leveled), "-o", str(tmp_path / "b.gguf"), "-t", "-2"), "threads (-t) must be an int >= 1")
    assert list(tmp_path.iterdir()) == []


def test_convert_and_calibrate_refuse_too_many_threads(smollm2_gguf: Path, leveled: Path, tmp_path: Path):
    # calibrate -t 100000 once aborted in ggml (std::bad_alloc)
    refused(run("convert", str(smollm2_gguf), "-o", str(tmp_path / "a.gguf"), "-t", "100000"), "at most 512 threads")
    refused(run("calibrate", str(leveled), "-o", str(tmp_path / "b.gguf"), "-t", "100000"), "at most 512 threads")
    assert list(tmp_path.iterdir()) == []


def test_explicit_settings_beat_a_bad_environment(leveled: Path):
    code = ("import llama_sparse\n"
            f"l = llama_sparse.Llama({str(leveled)!r}, n_ctx=64, sparsity=0.5, sparq='off', verbose=False)\n"
            "print(l.sparsity, l.sparq)\n")
    env = {**os.environ, "LLAMA_SPARQ": "garbage", "LLAMA_SPARSE": "bogus"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["0.50", "None"]


def test_perf_after_reset_is_zero(leveled: Path):
    import llama_sparse
    llm = llama_sparse.Llama(leveled, n_ctx=64, verbose=False)
    try:
        llm("Hello", max_tokens=2)
        assert llm.perf()["gen_tokens"] >= 1
        llm.reset_stats()
        p = llm.perf()
        assert p["prompt_tokens"] == 0 and p["gen_tokens"] == 0, p
    finally:
        llm.close()


@pytest.mark.parametrize("sig, needle", [(signal.SIGILL, "tools/build_stock.sh rebuilds stock here without AMX"),
                                         (signal.SIGSEGV, "was killed by SIGSEGV")])
def test_bench_names_a_stock_crash(leveled: Path, tmp_path: Path, sig: signal.Signals, needle: str):
    # a stock llama-bench killed by a signal (SIGILL: a native build's AMX path on a guest that reports AMX)
    fake = tmp_path / "bin"
    fake.mkdir()
    exe = fake / "llama-bench"
    exe.write_text(f"#!/bin/sh\nkill -{sig.name[3:]} $$\n")
    exe.chmod(0o755)
    r = run("bench", str(leveled), "--stock-bin", str(fake), "--stock-model", str(leveled), "-p", "8", "-n", "4",
            "-r", "1", "--levels", "dense")
    refused(r, "llama-bench", needle)


def test_small_context_is_raised_to_what_llama_cpp_makes(leveled: Path):
    # -c 16 once reported "-c 16" in its errors while llama.cpp ran a 256-token context
    r = run("generate", str(leveled), "-p", "Hi there", "-n", "40", "-c", "16")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "-c 16 raised to 256" in r.stderr
    assert "[40 tokens," in r.stderr  # the count is the tokens generated, not llama.cpp's decode steps (39)


def test_demo_bad_type_is_a_usage_error():
    r = run("demo", "--type", "bogus")
    assert r.returncode == 2 and "invalid choice: 'bogus'" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("level", ["0.004", "1e-9"])
def test_level_that_rounds_to_zero_refused(leveled: Path, level: str):
    # levels have two decimals: 0.004 once ran dense without a word
    refused(run("generate", str(leveled), "-p", "Hi", "-n", "2", f"--sparsity={level}"), "rounds to 0.00")


def test_sparq_key_twice_refused(leveled: Path):
    r = run("generate", str(leveled), "-p", "Hi", "-n", "2", "--sparq", "r=32,k=128,r=4")
    assert r.returncode == 2 and "r is given twice" in r.stderr


def test_stock_bin_without_llama_bench(leveled: Path, tmp_path: Path):
    refused(run("bench", str(leveled), "-p", "8", "-n", "4", "-r", "1", "--stock-model", str(leveled),
                "--stock-bin", str(tmp_path / "nowhere")), "no llama-bench there")


def test_fallback_none_says_why(smollm2_gguf: Path, tmp_path: Path):
    r = run("convert", str(smollm2_gguf), "-o", str(tmp_path / "n.gguf"), "--fallback", "none")
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout + r.stderr
    assert "no fallback type was allowed (--fallback none)" in out
    assert "not a multiple of any zigzag block size" not in out  # 576 and 192 are multiples of 32


def test_closed_model_says_so(leveled: Path):
    import llama_sparse
    llm = llama_sparse.Llama(leveled, n_ctx=64, sparsity=0.5, verbose=False)
    llm.close()
    for call in (lambda: llm.sparsity, llm.sparse_stats, lambda: llm.set_sparsity(0.25),
                 lambda: llm.create_completion("Hi", max_tokens=2), lambda: llm.tokenize(b"Hi"), lambda: llm.eval([1])):
        with pytest.raises(RuntimeError, match="was closed"):
            call()


def test_signals_held_defers_ctrl_c():
    # convert and calibrate remove their temp file under this, so that a second Ctrl-C cannot cut the removal short
    # (Python's own handler set first: a shell starts background jobs with SIGINT ignored, which held() keeps)
    from llama_sparse import _signals
    done = False
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with _signals.held():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
                done = True
        assert done
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


def test_fork_tool_says_why_an_environment_level_fails(leveled: Path):
    # llama-bench mutes the library's log; it once said only "failed to create context"
    env = dict(os.environ, LLAMA_SPARSE="0.3")
    r = subprocess.run([sys.executable, "-m", "llama_sparse.tools", "bench", "-m", str(leveled), "-p", "8", "-n", "4",
                        "-r", "1"], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode != 0
    assert "LLAMA_SPARSE: sparsity level '0.3' is not in the model" in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("args,rc,needle", [
    ([], 2, "NAME is one of"), (["nosuch"], 2, "no tool 'nosuch'"), (["--help"], 0, ""),
])
def test_tools_entry_point(args: list[str], rc: int, needle: str):
    r = subprocess.run([sys.executable, "-m", "llama_sparse.tools", *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == rc and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert needle in r.stderr


def test_calibrate_level_with_three_decimals(leveled: Path, tmp_path: Path):
    # 0.125 was calibrated and stored under the name 0.12
    refused(run("calibrate", str(leveled), "-o", str(tmp_path / "c.gguf"), "--levels", "0.125", "--random-tokens", "1"),
            "more than two decimals")
    assert list(tmp_path.iterdir()) == []


def test_fork_tool_says_large_batches_run_dense(leveled: Path, tmp_path: Path):
    # llama-perplexity with LLAMA_SPARSE alone once printed the dense perplexity with no word of it
    text = tmp_path / "t.txt"
    text.write_text("The tower is 324 metres tall , about the same height as an 81 @-@ storey building . " * 60)
    base = [sys.executable, "-m", "llama_sparse.tools", "perplexity", "-m", str(leveled), "-f", str(text), "-c", "128",
            "--chunks", "1", "-t", "2"]
    for emulate, told in (("0", True), ("1", False)):
        env = dict(os.environ, LLAMA_SPARSE="0.50", LLAMA_SPARSE_EMULATE=emulate)
        r = subprocess.run(base, capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        assert ("runs dense, as prompts do" in r.stderr) == told, r.stderr[-2000:]
    # a level set through the API (the CLI, Python) is set knowingly: no note at the prompt
    r = run("generate", str(leveled), "-p", "The tower is 324 metres tall, about the same height as", "-n", "2",
            "--sparsity", "0.50")
    assert r.returncode == 0 and "runs dense" not in r.stderr, r.stderr[-2000:]


def test_quantize_refuses_a_zigzag_file(leveled: Path, tmp_path: Path):
    # llama-quantize --allow-requantize once rewrote zigzag tensors into a file that does not load
    out = tmp_path / "q.gguf"
    r = subprocess.run([sys.executable, "-m", "llama_sparse.tools", "quantize", "--allow-requantize", str(leveled),
                        str(out), "Q4_K_M", "2"], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "zigzag GGUF, which cannot be requantized" in r.stdout + r.stderr, (r.stdout + r.stderr)[-2000:]
    assert not out.exists()


def test_levels_of_the_wrong_type(leveled: Path, tmp_path: Path):
    # an int array once ended in a traceback in bench/perplexity/serve, a plain string in "it has: 0, ., 5, 0"
    for name, value in (("ints", ([1, 2], GGUFValueType.ARRAY, GGUFValueType.INT32)),
                        ("str", ("0.50", GGUFValueType.STRING, None))):
        bad = rewrite_gguf(leveled, tmp_path / f"{name}.gguf", {"llama_sparse.levels": value})
        refused(run("bench", str(bad), "--levels", "0.5", "-p", "8", "-n", "2", "-r", "1"),
                "llama_sparse.levels must be an array of strings")


def test_bench_says_why_the_fork_refused_a_model(leveled: Path, tmp_path: Path):
    # llama-bench mutes the loader's log; bench once printed only "failed to load model"
    bad = rewrite_gguf(leveled, tmp_path / "nan.gguf",
                       {"llama_sparse.thresholds.0.50": ([float("nan")] * 120, GGUFValueType.ARRAY, GGUFValueType.FLOAT32)})
    refused(run("bench", str(bad), "--levels", "0", "-p", "8", "-n", "0", "-r", "1"),
            "llama_sparse.thresholds.0.50 holds a threshold of nan")


@pytest.mark.parametrize("args,needle", [
    (["-t", "100000"], "at most 512 threads"), (["--temp", "nan"], "--temp nan"),
    (["-p", "caf\udce9"], "the prompt is not UTF-8 text"),
])
def test_generate_more_bad_values(leveled: Path, args: list[str], needle: str):
    # -t 100000 crashed in ggml's thread pool; nan was taken as a temperature; a non-UTF-8 prompt gave a codec error
    base = ["generate", str(leveled), "-n", "2"] + ([] if "-p" in args else ["-p", "Hi"])
    refused(subprocess.run(CLI + base + args, capture_output=True, text=True, timeout=300,
                           errors="surrogateescape"), needle)


def test_calibrate_output_is_the_text(leveled: Path, tmp_path: Path):
    text = tmp_path / "book.txt"
    text.write_text("It is a truth universally acknowledged. " * 50)
    refused(run("calibrate", str(leveled), "-o", str(text), "--text", str(text), "--levels", "0.5", "-n", "16",
                "-c", "32", "-q"), "is the calibration text")
    assert text.read_text().startswith("It is a truth")


def test_calibrate_in_place_through_a_symlink(leveled: Path, tmp_path: Path):
    # the link was once replaced by a new file, the model it points at left as it was
    import shutil
    real = tmp_path / "real.gguf"
    shutil.copy(leveled, real)
    link = tmp_path / "link.gguf"
    link.symlink_to("real.gguf")
    text = tmp_path / "book.txt"
    text.write_text((AUSTEN / sorted(os.listdir(AUSTEN))[0]).read_text()[:20000])
    r = run("calibrate", str(link), "--in-place", "--text", str(text), "--mode", "unified", "--levels", "0.4",
            "-n", "16", "-c", "32", "-q")
    assert r.returncode == 0, r.stderr[-2000:]
    assert link.is_symlink()
    from gguf import GGUFReader
    assert list(GGUFReader(real).get_field("llama_sparse.levels").contents()) == ["0.40"]


def test_closed_streams(leveled: Path):
    def closed(cmd: list[str], fd: int) -> subprocess.CompletedProcess:
        # the child starts with fd 0 or 1 closed (preexec_fn runs after the pipes are set up; Python then makes
        # sys.stdin / sys.stdout None)
        return subprocess.run(CLI + cmd, capture_output=True, text=True, timeout=300, preexec_fn=lambda: os.close(fd))
    r = closed(["chat", str(leveled), "-n", "2"], 0)
    refused(r, "standard input is closed")
    r = closed(["generate", str(leveled), "-p", "Hi", "-n", "2"], 1)
    refused(r, "standard output is closed")


def test_output_to_a_pipe_that_closes(leveled: Path):
    # `| head -c 5` once left a BrokenPipeError traceback; now the command ends quietly with SIGPIPE's status
    p = subprocess.Popen(CLI + ["generate", str(leveled), "-p", "Once upon a time", "-n", "64", "--temp", "0.8"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.read(1)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) in (0, 141), err[-2000:]  # 0: the text ended before a write found the pipe closed
    assert "Traceback" not in err and "Exception ignored" not in err, err[-2000:]


def test_output_to_a_full_disk(leveled: Path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        r = subprocess.run(CLI + ["generate", str(leveled), "-p", "Hi", "-n", "8"], stdout=full, stderr=subprocess.PIPE,
                           text=True, timeout=300)
    refused(r, "No space left on device")
    assert "Exception ignored" not in r.stderr


def test_serve_names_a_bad_environment(leveled: Path):
    r = subprocess.run(CLI + ["serve", str(leveled)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "LLAMA_SPARQ": "r=1"})
    refused(r, "LLAMA_SPARQ in the environment")


def test_perplexity_shows_progress(leveled: Path, tmp_path: Path):
    from llama_sparse.cli import _PerplexityProgress
    p = _PerplexityProgress("0.50", 20)
    p.tty, p.last = False, p.last - 60  # a pipe, and half a minute since the last line
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stderr(buf):
        p("[1]12.5,[2]13.25,", "perplexity: calculating perplexity over 4 chunks, n_ctx=512")
    assert "0.50: chunk 2/4, running estimate 13.25" in buf.getvalue()


def test_closed_model_refuses_every_native_call(leveled: Path):
    # n_ctx(), save_state(), embed(), tokenizer() ... once reached the freed context and crashed the process
    import llama_sparse
    llm = llama_sparse.Llama(leveled, n_ctx=64, verbose=False)
    llm.close()
    for call in (llm.n_ctx, llm.save_state, llm.n_embd, llm.n_vocab, lambda: llm.tokenizer().encode("hi"),
                 lambda: llm.embed("hi")):
        with pytest.raises(RuntimeError, match="was closed"):
            call()
    llm.close()  # twice is fine


def test_level_with_a_nul_refused():
    from llama_sparse.llama import level_name
    with pytest.raises(ValueError, match="NUL"):
        level_name("0.5\x000")


def test_environment_sparq_none_is_off(leveled: Path):
    # Python's SparQ.parse took "none" (any case) as off, the C parser of LLAMA_SPARQ refused it at context creation
    r = subprocess.run(CLI + ["generate", str(leveled), "-p", "Hi", "-n", "2"], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "LLAMA_SPARQ": "None"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "sparq off" in r.stderr


def test_level_that_rounds_to_one_refused():
    # 0.999 was named "1.00" and then reported as a level the model lacks
    from llama_sparse.llama import level_name
    with pytest.raises(ValueError, match="rounds to 1.00"):
        level_name(0.999)


def test_note_on_cuda_for_zigzag_types_other_than_q4_k(smollm2_gguf: Path, tmp_path: Path, monkeypatch, capsys):
    """With -ngl on a CUDA build, a model with zigzag weights that CUDA runs slower than stock (not Q4_K, and not Q4_0 it
    regroups) gets a note (CI has no CUDA build, so the build is faked: GPU offload on, a libggml-cuda present)."""
    import argparse

    from llama_sparse import _lib, cli  # before llama_cpp: it points llama_cpp at the fork
    from llama_sparse.convert import convert

    import llama_cpp
    zz = convert(smollm2_gguf, tmp_path / "zz.gguf", "q4_k", progress=False).output  # 60 q4_K, 150 q8_0 (576 rows)
    fake = tmp_path / "lib"
    fake.mkdir()
    (fake / _lib._shared_lib_name("ggml-cuda")).write_bytes(b"")
    monkeypatch.setattr(_lib, "lib_dir", lambda: fake)
    monkeypatch.setattr(llama_cpp, "llama_supports_gpu_offload", lambda: True)
    for command, ngl, expect in (("generate", 99, True), ("bench", 8, True), ("generate", None, False),
                                 ("calibrate", 99, False)):
        cli._note_cuda_types(argparse.Namespace(model=zz, n_gpu_layers=ngl, command=command))
        err = capsys.readouterr().err
        assert ("has zigzag weights that decode slower than stock llama.cpp on CUDA (150 q8_0;" in err) == expect, \
            (command, ngl, err)
    # Q4_0: CUDA regroups the weights whose 32-row blocks come in whole groups of 8 (gate/up: 1536 rows) and runs them
    # fast; the other 150 are noted, all 210 with the regrouping off
    zz0 = convert(smollm2_gguf, tmp_path / "zz0.gguf", "q4_0", progress=False).output
    for g8, want in (("1", "(150 q4_0;"), ("0", "(210 q4_0;")):
        monkeypatch.setenv("LLAMA_SPARSE_CUDA_G8", g8)
        cli._note_cuda_types(argparse.Namespace(model=zz0, n_gpu_layers=99, command="generate"))
        err = capsys.readouterr().err
        assert want in err, (g8, err)
    monkeypatch.delenv("LLAMA_SPARSE_CUDA_G8")
    (fake / _lib._shared_lib_name("ggml-cuda")).unlink()  # a Metal build: no note
    cli._note_cuda_types(argparse.Namespace(model=zz, n_gpu_layers=99, command="chat"))
    assert capsys.readouterr().err == ""
