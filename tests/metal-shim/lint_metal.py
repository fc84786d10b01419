#!/usr/bin/env python3
"""Keep metal/*.metal inside what Apple's Metal compiler accepts (nothing here can run it):
only #include <metal_stdlib>; no C/C++ standard library (std::, printf, malloc/new, exceptions, ...);
no recursion; no dynamic allocation; no function pointers or virtual functions; no double; threadgroup
variables only in kernel functions; no comparison with an infinity (fast math may fold it); every
top-level name prefixed (zz_, sparse_idx_, sparq_, kernel_..., ggml_sparse_metal_...) and absent from
upstream's kernels/common.h, so the embedded build (which prepends common.h) has no clashes.

usage: lint_metal.py file.metal ...
"""
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from msl2cpp import strip_comments, match_paren  # noqa: E402

FORBIDDEN = [
    (r"\bstd::", "C++ standard library"),
    (r"\b(printf|malloc|calloc|realloc|free|memcpy|memset|abort|exit)\s*\(", "C library call"),
    (r"\bnew\b|\bdelete\b", "dynamic allocation"),
    (r"\b(throw|try|catch)\b", "exceptions"),
    (r"\bvirtual\b", "virtual functions"),
    (r"\bdouble\b", "double (not supported on Apple GPUs)"),
    (r"\bgoto\b", "goto"),
    (r"\(\s*\*\s*\w+\s*\)\s*\(", "function pointer"),
    (r"\bstatic\s+(?!inline\b|constexpr\b|constant\b)\w+[^;(]*;", "static variable"),
    (r"\bthread_local\b|\b_Thread_local\b", "thread_local"),
    (r"\balloca\b", "alloca"),
    (r"[=!]=\s*-?INFINITY|-?INFINITY\s*[=!]=", "comparison with an infinity (Metal's fast math may fold it)"),
]

PREFIXES = ("zz_", "sparse_idx_", "sparq_", "kernel_", "ggml_sparse_metal_", "FC_ZZ", "FC_zz", "FC_SPARQ", "FC_sparq", "SPARQ_", "ZZ_")


def upstream_words():
    """identifiers of what ggml-metal's embed step prepends (kernels/common.h with ggml-common.h and ggml-metal-impl.h)"""
    import os
    up = os.environ.get("LLAMA_SPARSE_UPSTREAM")
    if not up:
        return None
    src = Path(up) / "ggml" / "src"
    words = set()
    for f in (src / "ggml-metal" / "kernels" / "common.h", src / "ggml-common.h", src / "ggml-metal" / "ggml-metal-impl.h"):
        words |= set(re.findall(r"\w+", f.read_text()))
    return words


UPSTREAM = upstream_words()


def lint(path):
    errors = []
    raw = Path(path).read_text()
    code = strip_comments(raw)
    lines = code.split("\n")

    for i, line in enumerate(lines, 1):
        s = line.strip()
        if s.startswith("#include"):
            if s != "#include <metal_stdlib>":
                errors.append("%s:%d: only #include <metal_stdlib> is allowed: %s" % (path, i, s))
            continue
        for pat, what in FORBIDDEN:
            if re.search(pat, line):
                errors.append("%s:%d: %s: %s" % (path, i, what, s))

    # function definitions and their bodies, for the call graph (recursion, direct or mutual)
    funcs = {}
    top_funcs = set()
    for m in re.finditer(r"(?:^|\n)([ \t]*)(?:template\s*<[^;{]*?>\s*)?(?:(?:static|inline|kernel)\s+)*[\w:<>]+[\s*&]+(\w+)\s*\(", code):
        name = m.group(2)
        if name in ("if", "for", "while", "switch", "return", "sizeof"):
            continue
        p = m.end() - 1
        q = match_paren(code, p)
        rest = code[q:].lstrip()
        if not rest.startswith("{"):
            continue
        b0 = code.index("{", q)
        funcs[name] = code[b0:match_paren(code, b0)]
        if not m.group(1):
            top_funcs.add(name)
    # struct member functions: Type::f style calls resolve to the member name
    for m in re.finditer(r"\n[ \t]+static\s+inline\s+[\w:<>]+\s+(\w+)\s*\(", code):
        p = m.end() - 1
        q = match_paren(code, p)
        b0 = code.index("{", q)
        funcs[m.group(1)] = code[b0:match_paren(code, b0)]

    # threadgroup variables may only be declared in kernel functions
    kernels = set(re.findall(r"\bkernel\s+void\s+(\w+)", code))
    for f, body in funcs.items():
        if f not in kernels and re.search(r"(?m)^\s*threadgroup\s+[\w:]+\s+\w+\s*[\[;]", body):
            errors.append("%s: %s declares a threadgroup variable outside a kernel function" % (path, f))

    calls = {f: set(c for c in re.findall(r"\b(\w+)\s*(?:<[^;(){}]*>)?\s*\(", body) if c in funcs) for f, body in funcs.items()}

    def reaches(start):
        seen, todo = set(), list(calls[start])
        while todo:
            f = todo.pop()
            if f == start:
                return True
            if f not in seen:
                seen.add(f)
                todo.extend(calls.get(f, ()))
        return False

    for f in funcs:
        if reaches(f):
            errors.append("%s: recursion through %s (not allowed in Metal)" % (path, f))

    # top-level names must be prefixed and must not clash with upstream's kernels/common.h
    depth = 0
    top = ""
    for c in code:
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif depth == 0:
            top += c
    names = set(re.findall(r"\bstruct\s+(\w+)", top))
    names |= set(re.findall(r"}\s*(\w+)\s*;", code))
    names |= set(re.findall(r"#define\s+(\w+)", code))
    names |= top_funcs
    names |= set(re.findall(r"typedef\s+void\s*\(\s*(\w+)\s*\)", code))
    for n in sorted(names):
        if not n.startswith(PREFIXES):
            errors.append("%s: top-level name %s lacks a llama-sparse prefix (clash risk with ggml-metal's common.h)" % (path, n))
        if UPSTREAM is not None and n in UPSTREAM:
            errors.append("%s: top-level name %s is also defined by ggml-metal's common.h/ggml-common.h/ggml-metal-impl.h" % (path, n))
    return errors


def main():
    errors = []
    for p in sys.argv[1:]:
        errors += lint(p)
    for e in errors:
        print(e)
    if errors:
        sys.exit(1)
    print("lint: %d file(s) ok%s" % (len(sys.argv[1:]), "" if UPSTREAM is not None else " (no LLAMA_SPARSE_UPSTREAM: upstream name clashes not checked)"))


if __name__ == "__main__":
    main()
