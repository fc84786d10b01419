"""cuda/mul-mat-zz-tune.inc, the built-in launch configs: lines the CUDA parser accepts (it skips a malformed one
silently), and tune entries that never let one batch's config stand in for a batch the autotune measured."""
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "cuda" / "mul-mat-zz-tune.inc"
TYPES = {"q4_K", "q6_K", "q4_0", "q8_0"}


def max_warps():
    m = re.search(r"#define\s+ZZ_GEMV_MAX_WARPS\s+(\d+)", (ROOT / "cuda" / "mul-mat-zz.cuh").read_text())
    assert m, "ZZ_GEMV_MAX_WARPS not found"
    return int(m.group(1))


def table_lines():
    """The string literals of the table, in order (C comments and blank lines skipped)."""
    out = []
    for n, line in enumerate(TABLE.read_text().splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("//"):
            continue
        m = re.fullmatch(r'"(.*)\\n"', s)
        assert m, f"line {n}: not one string literal ending in \\n: {line!r}"
        out.append((n, m.group(1)))
    return out


def entries():
    """(line, direct, device, type, log2_rows, log2_n, batch, n1, n2, cluster) for every entry."""
    direct = False
    out = []
    for n, text in table_lines():
        if text.startswith("#"):
            direct = direct or text.startswith("# direct")
            continue
        f = text.split()
        assert len(f) == 8, f"line {n}: {len(f)} fields, want 8: {text!r}"
        assert re.fullmatch(r"\S+-sm\d+", f[0]), f"line {n}: device key {f[0]!r}"
        assert f[1] in TYPES, f"line {n}: type {f[1]!r}"
        out.append((n, direct, f[0], f[1], *map(int, f[2:])))
    return out


def test_every_entry_is_one_the_parser_takes():
    es = entries()
    assert len(es) > 0
    for n, _, _, _, lr, ln, batch, n1, n2, cl in es:
        assert lr >= 0 and ln >= 0 and batch in (1, 2, 4, 8), f"line {n}"
        if (n1, n2, cl) != (0, 0, 0):  # 0 0 0: the heuristic
            assert n1 >= 1 and 1 <= n2 <= max_warps() and cl in (0, 1), f"line {n}: n1 {n1} n2 {n2} cluster {cl}"


def test_no_class_twice():
    seen = {}
    for n, direct, dev, typ, lr, ln, batch, *_ in entries():
        key = (direct, dev, typ, lr, ln, batch)
        assert key not in seen, f"line {n} repeats line {seen[key]}: the lookup would take the first"
        seen[key] = n


def test_direct_entries_cover_every_batch_of_their_class():
    # a lookup takes the entry with the largest batch <= its own: a class tuned at batch 1 only would apply
    # batch 1's config to batches 2-8 (the H200 run measured 4096 x 11008 at batch 4 39 % slower that way)
    batches = defaultdict(set)
    for _, direct, dev, typ, lr, ln, batch, *_ in entries():
        if direct:
            batches[(dev, typ, lr, ln)].add(batch)
    assert batches, "no entry after '# direct'"
    for key, got in batches.items():
        assert got == {1, 2, 4, 8}, f"{key}: batches {sorted(got)}"


def test_direct_section_holds_q4_K_only():
    # the '# direct' mark says which kernel a Q4_K entry was timed on; the other types have one kernel
    for n, direct, _, typ, *_ in entries():
        if direct:
            assert typ == "q4_K", f"line {n}: {typ} after '# direct'"
