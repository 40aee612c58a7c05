#!/bin/sh
# Node entrypoint: per-container host key, the job's authorized key, then sshd in the foreground.
# Keys are never baked into the image. The authorized key comes from (first found):
#   $TRAINRUN_AUTHORIZED_KEY (the public key line itself), /keys/authorized_keys (mounted file).
# Optional, for launching from inside the cluster (node1 -> others): /keys/id_ed25519 (job private key),
# /keys/ssh_config and /keys/known_hosts (written by scripts/cluster once the host keys are collected).
set -eu
umask 077
mkdir -p /root/.ssh /run/sshd
[ -f /etc/ssh/ssh_host_ed25519_key ] || ssh-keygen -q -t ed25519 -N '' -C "$(hostname)" -f /etc/ssh/ssh_host_ed25519_key
if [ -n "${TRAINRUN_AUTHORIZED_KEY:-}" ]; then
  printf '%s\n' "$TRAINRUN_AUTHORIZED_KEY" > /root/.ssh/authorized_keys
elif [ -f /keys/authorized_keys ]; then
  install -m 600 /keys/authorized_keys /root/.ssh/authorized_keys
else
  echo "entrypoint: no authorized key: mount one at /keys/authorized_keys or set TRAINRUN_AUTHORIZED_KEY" >&2
  exit 64
fi
[ -f /keys/id_ed25519 ] && install -m 600 /keys/id_ed25519 /root/.ssh/id_ed25519
# a link, not a copy: scripts/cluster writes known_hosts after the nodes are up
[ -f /keys/ssh_config ] && ln -sfn /keys/ssh_config /root/.ssh/config
exec /usr/sbin/sshd -D -e
