#!/usr/bin/env bash
# Installs PyTorch from PyPI for the peer comparison (bench/peer/run). Not part of make test.
#
# PyPI's Linux x86_64 torch wheel is the CUDA build and pulls the nvidia-* wheels (a few
# GB); it runs on the CPU all the same, and PyPI is the only index reachable here.
# Into the python on PATH (or $PYTHON) when pip may install there; where pip refuses
# (PEP 668 "externally-managed-environment", e.g. Debian's python3), into a venv at
# bench/peer/.venv (git-ignored), which bench/peer/run then uses.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv="$here/.venv"
PY=${PYTHON:-python3}
PKGS=(torch numpy)

has_torch() { "$1" -c 'import torch, torch.distributed.pipelining' >/dev/null 2>&1; }

if [ -x "$venv/bin/python" ] && has_torch "$venv/bin/python"; then
    echo "torch already installed in $venv"; exit 0
fi
if has_torch "$PY"; then
    echo "torch already installed for $PY"; exit 0
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
if "$PY" -m pip install "${PKGS[@]}" 2>&1 | tee "$log"; then
    if has_torch "$PY"; then echo "installed torch for $PY"; exit 0; fi
fi
if ! grep -qi 'externally-managed' "$log"; then
    echo "install.sh: pip install torch failed for $PY (see above)" >&2
    exit 1
fi

echo "install.sh: $PY is externally managed; using a venv at $venv"
if ! "$PY" -m venv "$venv" 2>/dev/null; then
    rm -rf "$venv"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get install -y python3-venv || { apt-get update && apt-get install -y python3-venv; }
        "$PY" -m venv "$venv"
    else
        echo "install.sh: cannot create a venv (install python3-venv)" >&2
        exit 1
    fi
fi
"$venv/bin/python" -m pip install "${PKGS[@]}"
has_torch "$venv/bin/python"
echo "installed torch in $venv"
