#!/usr/bin/env bash
# Set up everything the whole test suite needs, then run it: unit, process, cluster (network
# namespaces + sshd, needs root), runtime and docker (real dockerd) tests. Usage: bash scripts/test.sh [pytest args]
set -euo pipefail
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"  # root tools (dockerd, sshd, ip) even from a minimal PATH
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
if [ "$(id -u)" = 0 ]; then
  # installs docker.io/mmdebstrap/compose if missing and starts dockerd if none answers; --stop at exit
  # stops only a dockerd this script started
  bash scripts/ci_docker_setup.sh || echo "test.sh: docker engine set-up failed; docker tests will skip with the reason" >&2
  trap 'bash scripts/ci_docker_setup.sh --stop >/dev/null 2>&1 || true' EXIT
fi
export TRAINRUN_DOCKER_TORCH=${TRAINRUN_DOCKER_TORCH:-1}   # the full run includes training across containers
if [ "${CI:-}" = true ]; then
  export TRAINRUN_STRICT_SKIPS=1   # in CI only "no GPU" may skip (tests/conftest.py)
fi
if [ $# -eq 0 ]; then
  .venv/bin/ruff check .   # the project's linter (configured in pyproject.toml): the whole tree is clean
  .venv/bin/mypy           # the type checker ([tool.mypy] in pyproject.toml: which files, how strictly)
  # the user's guide (mkdocs.yml): a broken page or link fails; the reference is generated from the code here
  site=$(mktemp -d) && NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict -q -d "$site" && rm -rf "$site"
fi
.venv/bin/python -m pytest -ra "$@"
