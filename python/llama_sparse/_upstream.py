"""Fetch pinned upstream llama.cpp and apply the llama-sparse patch series.

Upstream is llama.cpp 0c1e570, vendored in the llama-cpp-python 0.3.36 sdist on PyPI.
The sdist is verified by sha256 and unpacked once into a cache outside the repo
(~/.cache/llama-sparse, or $LLAMA_SPARSE_CACHE). Nothing here is ever committed.

  upstream.py pristine   print the path of the unpatched tree (fetching it if needed)
  upstream.py fork       print the path of the patched tree (patches/*.patch applied in order)
  upstream.py check      apply the series to a fresh copy and report, without caching
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

SDIST_NAME = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_URL = ("https://files.pythonhosted.org/packages/ec/e9/"
             "e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/" + SDIST_NAME)
SIMPLE_INDEX = "https://pypi.org/simple/llama-cpp-python/"
UPSTREAM_COMMIT = "0c1e570"
VENDOR_PREFIX = "llama_cpp_python-0.3.36/vendor/llama.cpp/"

# not needed to build or convert; keeps the fork tree and the device tarball small
PRUNE = ("models/", "docs/", "media/", ".github/", "examples/", "pocs/", "benches/", "skills/",
         "tools/server/webui/", "tools/server/public_legacy/")

# patches/ of the source checkout (only the build applies them)
PATCH_DIR = Path(os.environ.get("LLAMA_SPARSE_PATCH_DIR", Path(__file__).resolve().parents[2] / "patches"))


def log(msg: str) -> None:
    print(f"[upstream] {msg}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    d = Path(os.environ.get("LLAMA_SPARSE_CACHE", Path.home() / ".cache" / "llama-sparse"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sdist_urls() -> list[str]:
    urls = [SDIST_URL]
    try:  # the pinned URL is stable; the index is asked only as a fallback
        req = urllib.request.Request(SIMPLE_INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            for f in json.load(r)["files"]:
                if f["filename"] == SDIST_NAME and f["url"] not in urls:
                    urls.append(f["url"])
    except Exception as e:  # noqa: BLE001 - the pinned URL may still work
        log(f"package index not reachable ({e}); using the pinned URL")
    return urls


def fetch_sdist() -> Path:
    dst = cache_dir() / "dl" / SDIST_NAME
    if dst.exists() and sha256(dst) == SDIST_SHA256:
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    errors = []
    for url in sdist_urls():
        tmp = dst.with_suffix(".part")
        try:
            log(f"downloading {url}")
            with urllib.request.urlopen(url, timeout=120) as r, open(tmp, "wb") as f:
                shutil.copyfileobj(r, f)
            got = sha256(tmp)
            if got != SDIST_SHA256:
                raise RuntimeError(f"sha256 mismatch: got {got}, expected {SDIST_SHA256}")
            tmp.replace(dst)
            return dst
        except Exception as e:  # noqa: BLE001
            errors.append(f"{url}: {e}")
            tmp.unlink(missing_ok=True)
    raise SystemExit("error: could not fetch a verified " + SDIST_NAME + ":\n  " + "\n  ".join(errors))


def pristine() -> Path:
    dst = cache_dir() / f"upstream-{UPSTREAM_COMMIT}"
    if (dst / ".complete").exists():
        return dst
    lock = _locked("pristine")
    if (dst / ".complete").exists():
        lock.close()
        return dst
    sdist = fetch_sdist()
    log(f"unpacking llama.cpp {UPSTREAM_COMMIT} into {dst}")
    tmp = Path(tempfile.mkdtemp(prefix="upstream-", dir=cache_dir()))
    try:
        with tarfile.open(sdist) as tf:
            for m in tf.getmembers():
                if not m.name.startswith(VENDOR_PREFIX):
                    continue
                rel = m.name[len(VENDOR_PREFIX):]
                if not rel or rel == ".git" or rel.startswith(PRUNE) or not (m.isfile() or m.isdir()):
                    continue
                m.name = rel
                tf.extract(m, tmp, filter="data") if hasattr(tarfile, "data_filter") else tf.extract(m, tmp)
        (tmp / ".complete").write_text(UPSTREAM_COMMIT + "\n")
        shutil.rmtree(dst, ignore_errors=True)
        tmp.rename(dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        lock.close()
    return dst


def patch_files() -> list[Path]:
    files = sorted(PATCH_DIR.glob("*.patch"))
    if not files:
        raise SystemExit(f"error: no patches in {PATCH_DIR}; run this from a llama-sparse source checkout")
    return files


def series_hash() -> str:
    h = hashlib.sha256(UPSTREAM_COMMIT.encode())
    for p in patch_files():
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def apply_series(tree: Path) -> None:
    for p in patch_files():
        # patch(1) with no fuzz: a hunk that does not apply exactly is an error
        r = subprocess.run(["patch", "-p1", "--forward", "--batch", "--fuzz=0", "--no-backup-if-mismatch",
                            "-s", "-d", str(tree), "-i", str(p)], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"error: patch {p.name} does not apply to llama.cpp {UPSTREAM_COMMIT}:\n{r.stdout}{r.stderr}")
        log(f"applied {p.name}")


def _locked(name: str):
    """An exclusive lock file in the cache: parallel builds (several checkouts) must not unpack over each other."""
    import fcntl
    f = open(cache_dir() / f".{name}.lock", "w")
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def fork() -> Path:
    key = series_hash()
    dst = cache_dir() / f"fork-{UPSTREAM_COMMIT}-{key}"
    if (dst / ".complete").exists():
        return dst
    src = pristine()
    with _locked(f"fork-{key}"):
        if (dst / ".complete").exists():  # made by another process while we waited
            return dst
        tmp = Path(tempfile.mkdtemp(prefix="fork-", dir=cache_dir()))
        try:
            shutil.copytree(src, tmp, dirs_exist_ok=True, symlinks=True)
            (tmp / ".complete").unlink()
            apply_series(tmp)
            (tmp / ".complete").write_text(key + "\n")
            shutil.rmtree(dst, ignore_errors=True)  # an incomplete leftover
            tmp.rename(dst)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    # trees of other series may still be in use by other checkouts: drop only those unused for a week
    week = time.time() - 7 * 86400
    for old in cache_dir().glob(f"fork-{UPSTREAM_COMMIT}-*"):
        done = old / ".complete"
        if old != dst and done.exists() and done.stat().st_mtime < week:
            shutil.rmtree(old, ignore_errors=True)
    done = dst / ".complete"
    done.touch()
    return dst


def check() -> None:
    src = pristine()
    with tempfile.TemporaryDirectory(prefix="check-", dir=cache_dir()) as d:
        shutil.copytree(src, d, dirs_exist_ok=True, symlinks=True)
        apply_series(Path(d))
    log(f"all {len(patch_files())} patches apply cleanly to {UPSTREAM_COMMIT}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["pristine", "fork", "check", "sdist"])
    a = ap.parse_args()
    if a.what == "check":
        check()
        return
    path = {"pristine": pristine, "fork": fork, "sdist": fetch_sdist}[a.what]()
    print(path)


if __name__ == "__main__":
    main()
