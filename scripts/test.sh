#!/usr/bin/env bash
# Set up everything the whole test suite needs, then run it: unit, process, cluster (network
# namespaces + sshd, needs root), runtime and docker (real dockerd) tests. Usage: bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
if [ "$(id -u)" = 0 ] && [ -x scripts/ci_docker_setup.sh ]; then
  bash scripts/ci_docker_setup.sh || echo "test.sh: docker engine set-up failed; docker tests will skip with the reason" >&2
fi
exec .venv/bin/python -m pytest -ra "$@"
