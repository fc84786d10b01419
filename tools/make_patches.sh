#!/usr/bin/env bash
# Regenerate patches/ from an edited upstream tree.
#
#   tools/make_patches.sh init DIR   make DIR a git tree: pristine upstream as the root commit,
#                                    then one commit per patch of the current series (git am)
#   (edit DIR: amend, add or reorder commits; one purpose per commit)
#   tools/make_patches.sh export DIR write DIR's commits after the root as patches/NNNN-*.patch
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cmd=${1:-}; dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { sed -n '2,9p' "$0"; exit 2; }
export GIT_AUTHOR_NAME=llama-sparse GIT_AUTHOR_EMAIL=dev@llama-sparse.invalid
export GIT_COMMITTER_NAME=llama-sparse GIT_COMMITTER_EMAIL=dev@llama-sparse.invalid
case "$cmd" in
init)
    [ ! -e "$dir" ] || { echo "error: $dir exists" >&2; exit 1; }
    src=$(python3 "$repo/tools/upstream.py" pristine)
    cp -a "$src" "$dir"
    rm -f "$dir/.complete"
    git -C "$dir" init -q
    git -C "$dir" add -A
    git -C "$dir" commit -qm "upstream llama.cpp 0c1e570 (pristine)"
    for p in "$repo"/patches/*.patch; do
        [ -e "$p" ] || continue
        git -C "$dir" am -q --keep-cr "$p"
    done
    git -C "$dir" log --oneline
    ;;
export)
    # the series keeps its numbers (0009 stays unused; the docs cite patches by number): the k-th commit takes
    # the k-th number in use now, commits beyond them the numbers after the last
    root=$(git -C "$dir" rev-list --max-parents=0 HEAD)
    tmp=$(mktemp -d)
    git -C "$dir" format-patch -q --zero-commit --no-signature --no-stat -o "$tmp" "$root..HEAD"
    mapfile -t old < <(cd "$repo/patches" && ls -- *.patch 2>/dev/null | cut -c1-4)
    rm -f "$repo"/patches/*.patch
    i=0; last=0
    for f in "$tmp"/*.patch; do
        if [ $i -lt ${#old[@]} ]; then n=$((10#${old[$i]})); else n=$((last + 1)); fi
        last=$n; i=$((i + 1))
        b=$(basename "$f")
        mv "$f" "$repo/patches/$(printf %04d "$n")-${b#????-}"
    done
    rmdir "$tmp"
    ls "$repo/patches"/*.patch
    ;;
*)
    echo "error: unknown command $cmd" >&2; exit 2;;
esac
