"""The package runs llama-cpp-python on the fork's library."""
import os
import subprocess
import sys
from pathlib import Path


def test_llama_cpp_loads_our_library():
    import llama_sparse
    import llama_cpp.llama_cpp as ll
    from llama_sparse import _native

    ours = Path(llama_sparse.lib_dir()).resolve()
    loaded = Path(ll._lib._name).resolve()
    assert loaded.parent == ours, f"llama_cpp loaded {loaded}, not the fork's library in {ours}"
    assert os.environ["LLAMA_CPP_LIB_PATH"] == str(llama_sparse.lib_dir())
    # the fork's symbols are in the loaded library
    assert _native.library_path() == ll._lib._name
    # exactly one libllama is mapped into this process, and it is ours
    maps = Path(f"/proc/{os.getpid()}/maps").read_text().splitlines()
    mapped = {line.split(maxsplit=5)[-1] for line in maps if "libllama.so" in line}
    assert mapped, "no libllama mapped"
    assert all(Path(p.replace(" (deleted)", "")).resolve().parent == ours for p in mapped), mapped


def test_import_order_guard():
    code = "import llama_cpp; import llama_sparse"
    env = dict(os.environ, LLAMA_CPP_LIB_PATH="")
    env.pop("LLAMA_CPP_LIB_PATH")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    # llama_cpp alone has no library of its own (built with LLAMA_BUILD=OFF), or loaded another one:
    # either way importing llama_sparse afterwards must not silently run on the wrong library
    assert r.returncode != 0


def test_cxx_runtime_is_global_after_import():
    # numpy 2.5 in a torch venv maps libstdc++ privately; libllama loaded after it segfaulted in model load
    # (bench/results/cuda_h200_2026-11-28b.md). Importing llama_sparse, even after numpy, makes it global.
    code = ("import ctypes, numpy, llama_sparse\n"
            "ctypes.CDLL(None)['_ZNSt8ios_base4InitC1Ev']\n"
            "print('global')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and "global" in r.stdout, r.stderr[-2000:]


def test_tools_are_bundled():
    from llama_sparse.tools import tool_path
    for name in ("cli", "completion", "bench", "perplexity", "quantize", "test-backend-ops"):
        p = tool_path(name)
        assert p.exists() and os.access(p, os.X_OK), p
    r = subprocess.run([str(tool_path("bench")), "--help"], capture_output=True, text=True)
    assert "usage" in (r.stdout + r.stderr).lower()


def test_llama_h_is_upstream_and_patches_only_hook():
    """The ABI contract: llama.h is byte-for-byte upstream's; the series touches no public llama header."""
    import importlib.util
    repo = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("ls_upstream", repo / "python" / "llama_sparse" / "_upstream.py")
    up = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(up)
    pristine, fork = up.pristine(), up.fork()
    for header in ("include/llama.h", "include/llama-cpp.h"):
        assert (pristine / header).read_bytes() == (fork / header).read_bytes(), header
    touched = [line.split()[2][2:] for p in sorted((repo / "patches").glob("*.patch"))
               for line in p.read_text().splitlines() if line.startswith("diff --git")]
    assert touched and not any(t.startswith("include/") for t in touched), touched
