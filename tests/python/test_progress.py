"""Progress lines of long work when stderr is not a terminal (CI logs): one per 10 %, bytes in binary units."""
from llama_sparse._progress import Progress


def test_one_line_per_ten_percent_with_counts():
    lines: list[str] = []
    bar = Progress(200, "calibrating m.gguf", True, lines.append)
    for _ in range(200):
        bar.update(1)
    bar.close()
    assert len(lines) == 10
    assert lines[0].startswith("calibrating m.gguf: 10% (20/200 tok, ")
    assert lines[-1].startswith("calibrating m.gguf: 100% (200/200 tok, ")


def test_bytes_and_big_steps():
    lines: list[str] = []
    bar = Progress(3 << 30, "convert m.gguf", True, lines.append, unit="B")
    bar.update(1 << 30)  # one step over three thresholds logs once
    bar.update(2 << 30)
    assert [ln.split(" (")[0] for ln in lines] == ["convert m.gguf: 33%", "convert m.gguf: 100%"]
    assert "(1 GiB of 3 GiB, " in lines[0] and lines[0].endswith("B/s)")


def test_disabled_or_empty_work_is_silent():
    lines: list[str] = []
    bar = Progress(10, "x", False, lines.append)
    bar.update(10)
    assert lines == []
    bar = Progress(0, "x", True, lines.append)  # nothing to do: no division by zero
    bar.update(0)
    assert lines == []
