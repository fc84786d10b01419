"""`llama-sparse cuda-tune`: the GEMV shapes it reads from a zigzag GGUF, and its errors on a build without CUDA
(CI has no GPU; the tune itself runs on the device, cuda/README.md)."""
import pytest
from gguf import GGUFReader

from llama_sparse import _lib, cuda_tune, zigzag
from llama_sparse.cli import main
from llama_sparse.convert import convert


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    from conftest import write_tiny_gguf
    d = tmp_path_factory.mktemp("cuda-tune")
    src = write_tiny_gguf(d / "tiny.gguf")
    out = d / "tiny.zz.gguf"
    convert(src, out, "q4_k", progress=False)
    return src, out


def test_shapes_are_the_source_weights(tiny_pair):
    src, out = tiny_pair
    # (m, n) from the source file's ne = [n, m]; types from the zigzag file's tensor records
    src_ne = {t.name: (int(t.shape[1]), int(t.shape[0])) for t in GGUFReader(src).tensors if len(t.shape) == 2}
    reader = GGUFReader(out)
    zz = zigzag.read_zigzag_info(reader)
    want = {(*src_ne[t.name], int(t.tensor_type)) for t in reader.tensors if t.name in zz}
    # the CUDA backend runs a layer's ffn_gate + ffn_up (Q4_K, same input and width) as one launch of 1024 rows;
    # attn_q (Q4_K) and attn_v (a Q8_0 fallback) differ in type, attn_k is not zigzag: no q/k/v group
    q4k = int(zigzag.Q.Q4_K)
    assert (512, 256, q4k) in want
    want.add((1024, 256, q4k))
    got = cuda_tune.model_gemv_shapes(out)
    assert set(got) == want and len(got) == len(want)
    assert {(512, 256), (256, 512)} <= {(m, n) for m, n, _ in got}  # ffn_gate/up and ffn_down
    assert all(m % zigzag.block_size(t) == 0 for m, _, t in got)


def test_standard_gguf_is_refused(tiny_pair):
    src, _ = tiny_pair
    with pytest.raises(ValueError, match="not a zigzag GGUF"):
        cuda_tune.model_gemv_shapes(src)


def test_damaged_files_are_refused(tiny_pair, tmp_path):
    _, out = tiny_pair
    text = tmp_path / "notes.gguf"
    text.write_text("not a model\n")
    with pytest.raises(ValueError, match="not a GGUF file"):
        cuda_tune.model_gemv_shapes(text)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(out.read_bytes()[:2000])  # the header and part of the key-values
    with pytest.raises(ValueError, match="may be truncated"):
        cuda_tune.model_gemv_shapes(cut)


def test_default_path_follows_the_library(monkeypatch, tmp_path):
    monkeypatch.setenv(cuda_tune.TUNE_FILE_ENV, str(tmp_path / "t.txt"))
    assert cuda_tune.default_tune_path() == tmp_path / "t.txt"
    monkeypatch.delenv(cuda_tune.TUNE_FILE_ENV)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cuda_tune.default_tune_path() == tmp_path / ".cache" / "llama-sparse" / "cuda-tune.txt"


def test_cli_errors(tiny_pair, tmp_path, capsys):
    src, out = tiny_pair
    tune_file = tmp_path / "tune.txt"
    assert main(["cuda-tune", str(out), "--max-batch", "9", "-o", str(tune_file)]) == 1
    assert "max batch 9" in capsys.readouterr().err
    assert main(["cuda-tune", str(out), "--sparsity", "1", "-o", str(tune_file)]) == 1
    assert "sparsity 1" in capsys.readouterr().err
    assert main(["cuda-tune", str(src), "-o", str(tune_file)]) == 1
    assert "not a zigzag GGUF" in capsys.readouterr().err
    assert main(["cuda-tune", str(tmp_path / "missing.gguf"), "-o", str(tune_file)]) == 1
    assert "not found" in capsys.readouterr().err
    assert not tune_file.exists()


def test_cli_without_cuda_backend(tiny_pair, tmp_path, capsys):
    _, out = tiny_pair
    if (_lib.lib_dir() / _lib._shared_lib_name("ggml-cuda")).exists():
        pytest.skip("this build has a CUDA backend: the tune would run (device only)")
    tune_file = tmp_path / "tune.txt"
    assert main(["cuda-tune", str(out), "-o", str(tune_file)]) == 1
    err = capsys.readouterr().err
    assert "no CUDA backend" in err and "GGML_CUDA=ON" in err
    assert not tune_file.exists()


def test_tune_passes_the_shapes_to_the_backend(tiny_pair, tmp_path, monkeypatch, capsys):
    # the ctypes call as the C side reads it (cuda/mul-mat-zz.cuh): device, (m, n) pairs, types, count, max batch,
    # sparsity, path; a stand-in library records it (no GPU here)
    _, out = tiny_pair
    seen = {}

    class FakeLib:
        def llama_sparse_cuda_autotune(self, device, mn, types, n, max_batch, sparsity, path):
            seen.update(device=device, mn=[mn[i] for i in range(2 * n)], types=[types[i] for i in range(n)],
                        max_batch=max_batch, sparsity=sparsity, path=path.decode())
            return 3

    monkeypatch.setattr(cuda_tune, "load_cuda_backend", lambda: FakeLib())
    tune_file = tmp_path / "sub" / "dir" / "tune.txt"
    assert main(["cuda-tune", str(out), "-o", str(tune_file), "--device", "1", "--max-batch", "4",
                 "--sparsity", "0.4"]) == 0
    shapes = cuda_tune.model_gemv_shapes(out)
    assert seen["mn"] == [v for m, n, _ in shapes for v in (m, n)]
    assert seen["types"] == [t for _, _, t in shapes]
    assert (seen["device"], seen["max_batch"], seen["path"]) == (1, 4, str(tune_file))
    assert abs(seen["sparsity"] - 0.4) < 1e-6
    assert tune_file.parent.is_dir()  # made for the backend, which only writes the file
    assert "wrote 3 entries" in capsys.readouterr().out

    monkeypatch.setattr(FakeLib, "llama_sparse_cuda_autotune", lambda self, *a: -1)
    assert main(["cuda-tune", str(out), "-o", str(tune_file)]) == 1
    assert "autotune failed" in capsys.readouterr().err
