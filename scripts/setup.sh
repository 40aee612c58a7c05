#!/usr/bin/env bash
# Create .venv and install trainrun (editable) with the embedded MPI (mpich wheel) and the pinned
# CPU torch the examples use. Idempotent. Usage: bash scripts/setup.sh [--test]
#   --test  also the test and documentation dependencies and the Debian packages the test clusters need (root): sshd for the
#           simulated hosts, slurm-wlm + munge for the Slurm cluster on them.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH=${TRAINRUN_TORCH:-torch==2.13.0}   # pinned: an unpinned torch pulls GBs of CUDA packages
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if [ "${1:-}" = "--test" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    need=""
    [ -x /usr/sbin/sshd ] || need="$need openssh-server"
    command -v ip >/dev/null || need="$need iproute2"
    command -v ssh-keygen >/dev/null || need="$need openssh-client"
    # the Slurm test cluster (scripts/slurm_testbed.py): slurmctld/slurmd/srun + munged. A distro service these
    # packages may start does not matter: the testbed's daemons run inside the hosts with their own config and socket
    [ -x /usr/sbin/slurmd ] || need="$need slurm-wlm"
    [ -x /usr/sbin/munged ] || need="$need munge"
    # a terminal for the --monitor test (tests/process/test_monitor.py: the live table in an 80x24 pane)
    command -v tmux >/dev/null || need="$need tmux"
    # Java for the Spark test cluster (tests/spark: pyspark's driver, a standalone master and workers)
    command -v java >/dev/null || need="$need openjdk-17-jre-headless"
    if [ -n "$need" ]; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need >/dev/null
    fi
  fi
  .venv/bin/python -m pip install -q -e '.[test,docs]' "$TORCH"   # docs: mkdocs for the guide's build (setup.cfg)
  # Keras 2 for the tf-keras tests, without its `tensorflow` requirement (a CUDA build over tensorflow-cpu's files)
  .venv/bin/python -m pip install -q --no-deps tf-keras==2.21.0
else
  .venv/bin/python -m pip install -q -e . "$TORCH"
fi
# Editable installs are not byte-compiled, and some machines set PYTHONDONTWRITEBYTECODE: compile once
# so every launch does not recompile the launcher (~25 ms).
.venv/bin/python -m compileall -q launcher/trainrun >/dev/null
