#!/usr/bin/env python3
"""Translate a Metal kernel file (metal/*.metal) into C++ for the MSL-on-CPU shim.

The kernel text stays as it is except for: [[...]] attributes removed; `device`, `thread`, `threadgroup`
and `kernel` dropped and `constant` made `const`; `threadgroup T name[N];` in a kernel body made a static
that the shim poisons once per threadgroup; function constants made statics that the test sets by index;
the `template [[host_name(...)]] kernel ...` instantiations replaced by launcher entries. For every kernel
an entry function is generated that passes the dispatch's buffers, threadgroup memory and built-ins.
Line numbers are kept, so compiler messages point into the .metal file.

usage: msl2cpp.py in.metal out.cpp
"""
import re
import sys
from pathlib import Path

BUILTINS = {
    "threadgroup_position_in_grid":   "shim::B_TGPIG",
    "threadgroups_per_grid":          "shim::B_NTGPG",
    "thread_position_in_threadgroup": "shim::B_TPITG",
    "threads_per_threadgroup":        "shim::B_NTG",
    "thread_index_in_threadgroup":    "shim::B_TIITG",
    "thread_index_in_simdgroup":      "shim::B_TIISG",
    "simdgroup_index_in_threadgroup": "shim::B_SGITG",
    "simdgroups_per_threadgroup":     "shim::B_NSG",
    "thread_position_in_grid":        "shim::B_TPIG",
    "threads_per_simdgroup":          "shim::B_TPSG",
    "threads_per_grid":               "shim::B_NGRID",
}

ADDRESS_SPACES = [(r"\bdevice\b", ""), (r"\bthreadgroup\b", ""), (r"\bthread\b", ""),
                  (r"\bconstant\b", "const"), (r"\bkernel\b", "")]


def strip_comments(text):
    # keep newlines so line numbers stay
    def blank(m):
        return re.sub(r"[^\n]", " ", m.group(0))
    return re.sub(r"//[^\n]*|/\*.*?\*/", blank, text, flags=re.S)


def match_paren(text, i):
    """index just past the bracket that closes the one at text[i]"""
    pairs = {"(": ")", "<": ">", "[": "]", "{": "}"}
    open_c, close_c = text[i], pairs[text[i]]
    depth = 0
    for j in range(i, len(text)):
        if text[j] == open_c:
            depth += 1
        elif text[j] == close_c:
            depth -= 1
            if depth == 0:
                return j + 1
    raise SystemExit("msl2cpp: unbalanced %s" % open_c)


def split_top(text, sep=","):
    out, depth, cur = [], 0, ""
    for c in text:
        if c in "(<[{":
            depth += 1
        elif c in ")>]}":
            depth -= 1
        if c == sep and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += c
    if cur.strip():
        out.append(cur)
    return out


def plain(text):
    for pat, rep in ADDRESS_SPACES:
        text = re.sub(pat, rep, text)
    return " ".join(text.split())


def parse_params(ptext):
    params, nbuf = [], 0
    for p in split_top(ptext):
        m = re.search(r"\[\[(.*?)\]\]", p)
        attr = m.group(1).strip() if m else None
        decl = plain(re.sub(r"\[\[.*?\]\]", "", p))
        name = re.search(r"(\w+)\s*$", decl).group(1)
        typ = decl[: decl.rfind(name)].strip()
        if attr is None or attr.startswith("buffer"):
            idx = int(re.search(r"\((\d+)\)", attr).group(1)) if attr else nbuf
            nbuf = idx + 1
            params.append("shim::buf_arg<%s>(%d)" % (typ, idx))
        elif attr.startswith("threadgroup("):
            idx = int(re.search(r"\((\d+)\)", attr).group(1))
            params.append("shim::tg_arg<%s>(%d)" % (typ, idx))
        elif attr in BUILTINS:
            params.append("shim::builtin<%s>(%s)" % (typ, BUILTINS[attr]))
        else:
            raise SystemExit("msl2cpp: unsupported kernel parameter attribute [[%s]]" % attr)
    return params


def translate(src, path):
    code = strip_comments(src)
    entries, regs = [], []

    # kernels (plain and templated)
    for m in re.finditer(r"(template\s*<([^;{]*?)>\s*)?\bkernel\s+void\s+(\w+)\s*\(", code):
        tparams, name = m.group(2), m.group(3)
        p0 = m.end() - 1
        params = parse_params(code[p0 + 1 : match_paren(code, p0) - 1])
        call_args = ",\n        ".join(params)
        if tparams:
            tnames = [re.search(r"(\w+)\s*(=.*)?$", t.strip()).group(1) for t in split_top(tparams)]
            entries.append("template <%s> static void shim_entry_%s() {\n    %s<%s>(\n        %s);\n}\n"
                           % (tparams, name, name, ", ".join(tnames), call_args))
        else:
            entries.append("static void shim_entry_%s() {\n    %s(\n        %s);\n}\n" % (name, name, call_args))
            regs.append('static shim::reg_kernel shim_reg_%s("%s", &shim_entry_%s);' % (name, name, name))

    # explicit instantiations of templated kernels: registered under their host name, removed from the text
    def inst(m):
        host, name, args = m.group(1), m.group(2), m.group(3)
        regs.append('static shim::reg_kernel shim_reg_%d("%s", &shim_entry_%s<%s>);' % (len(regs), host, name, args))
        return "\n" * m.group(0).count("\n")
    code = re.sub(r'template\s*\[\[\s*host_name\(\s*"(\w+)"\s*\)\s*\]\]\s*kernel\s+\w+\s+(\w+)\s*<([^;]*)>\s*;', inst, code)

    # function constants
    def fconst(m):
        typ, name, idx = m.group(1), m.group(2), m.group(3)
        regs.append("static shim::reg_fc shim_fc_%s((%s), &%s, sizeof(%s));" % (name, idx, name, name))
        return "static %s %s;" % (typ, name)
    code = re.sub(r"\bconstant\s+(\w+)\s+(\w+)\s*\[\[\s*function_constant\((.*?)\)\s*\]\]\s*;", fconst, code)

    # threadgroup variables declared in a body (indented): one static copy, poisoned per threadgroup
    def tgvar(m):
        ind, typ, name, dims = m.group(1), m.group(2), m.group(3), m.group(4) or ""
        return ("%sstatic %s %s%s; static uint64_t %s_shim_epoch = ~0ull; shim::tg_decl(&%s, sizeof(%s), &%s_shim_epoch);"
                % (ind, typ, name, dims, name, name, name, name))
    code = re.sub(r"^([ \t]+)threadgroup\s+([\w:<> ]+?)\s+(\w+)\s*((?:\[[^\]]*\])*)\s*;", tgvar, code, flags=re.M)

    code = re.sub(r"\[\[.*?\]\]", "", code)
    code = re.sub(r"^\s*#\s*include\s*<metal_stdlib>.*$", "", code, flags=re.M)
    for pat, rep in ADDRESS_SPACES:
        code = re.sub(pat, rep, code)

    ns = "msl_" + re.sub(r"\W", "_", Path(path).stem)
    return ('#include <metal_stdlib>\nnamespace %s {\n#line 1 "%s"\n%s\n#line 1 "%s (shim entries)"\n%s\n%s\n} // namespace %s\n'
            % (ns, path, code, path, "\n".join(entries), "\n".join(regs), ns))


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    src = Path(sys.argv[1])
    Path(sys.argv[2]).write_text(translate(src.read_text(), str(src)))


if __name__ == "__main__":
    main()
