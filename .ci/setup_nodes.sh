#!/usr/bin/env bash
# Test nodes on this machine: one sshd on 127.0.0.2-5 (aliases node1..node4), dockerd, an image.
#
# Usage (as root):  bash .ci/setup_nodes.sh [DIR]           set up (DIR: /tmp/servesweep-nodes)
#                   bash .ci/setup_nodes.sh --down [DIR]    undo it
# What it changes on this machine: installs openssh-server, docker.io and sudo with apt if they are
# missing; creates the user `sweeper` and /etc/sudoers.d/servesweep-sweeper; starts sshd on
# 127.0.0.2-5:22 and, if no docker daemon answers, dockerd (--bridge=none --iptables=false);
# imports the image servesweep-sim:local. `--down` stops the sshd and dockerd it started (by the
# pids in DIR), removes the image, the user and the sudoers entry if it made them, and DIR; it
# leaves the apt packages installed.
# Idempotent: keys, users and the image are made once; sshd and dockerd are started only if they
# are not already running. Everything it starts writes its pid into DIR; it kills nothing it did
# not start. It binds only loopback addresses (127.0.0.2-5 port 22, dockerd's unix socket).
# Progress goes to stderr; stdout carries only an `export SERVESWEEP_TEST_NODES=DIR` line (the
# tests default to /tmp/servesweep-nodes, so only another DIR needs it: eval "$(bash ... DIR)").
#
# What DIR holds afterwards:
#   ssh_config           Host node1..node4 (root) and node1-sweeper..node4-sweeper (User sweeper)
#   known_hosts          the host keys for 127.0.0.2-5 (referenced by ssh_config)
#   id_ed25519[.pub]     the client key pair, authorized for root and sweeper
#   sweeper_password     mode 0600: the password of user `sweeper` (a canary: `canary-<random>`);
#                        sweeper may run docker only via `sudo` WITH this password
#   sshd_config, sshd.pid, sshd.log, ssh_host_*_key, authorized_keys/<user>
#   dockerd.pid, dockerd.log   (only if this script started dockerd)
#
# The image `servesweep-sim:local` is `docker import` of an empty tar: containers run the host's
# Python through read-only bind mounts, at the same paths as on the host. For
# `python3 -m servesweep.sim ...` to run in it, `docker run` needs (servesweep.cluster.runtime
# .host_python_mounts() computes this list for the running interpreter):
#   -v /lib:/lib:ro -v /lib64:/lib64:ro -v /usr/lib:/usr/lib:ro     libc, ld.so, libssl, libffi ...
#   -v <sys.base_prefix>:<sys.base_prefix>:ro                       the interpreter and stdlib
#   -v <sys.prefix>:<sys.prefix>:ro                                 a venv's site-packages, if any
#   -v <site-packages>:<site-packages>:ro                           if outside both prefixes
#   -v <repo>/src:<repo>/src:ro                                     if servesweep is pip install -e'd
#   -e PATH=<sys.prefix>/bin:/usr/bin:/bin                          so `python3` resolves
# plus `--network host` so the server's port is reachable from the host at 127.0.0.1.
set -euo pipefail

DOWN=""
if [ "${1:-}" = "--down" ]; then
    DOWN=1
    shift
fi
DIR="${1:-/tmp/servesweep-nodes}"
ADDRS=(127.0.0.2 127.0.0.3 127.0.0.4 127.0.0.5)
IMAGE="servesweep-sim:local"

log() { echo "setup_nodes: $*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

[ "$(id -u)" -eq 0 ] || die "must run as root"

pid_alive() { # pid_alive PIDFILE NAME: the pid in PIDFILE is a running NAME
    local pid
    [ -s "$1" ] || return 1
    pid="$(cat "$1")"
    [ -d "/proc/$pid" ] && grep -q "$2" "/proc/$pid/comm" 2>/dev/null
}

stop_pidfile() { # stop_pidfile PIDFILE NAME: SIGTERM the NAME process this script started, wait
    local pid
    if pid_alive "$1" "$2"; then
        pid="$(cat "$1")"
        kill -TERM "$pid"
        for _ in $(seq 100); do
            [ -d "/proc/$pid" ] || break
            sleep 0.1
        done
        [ -d "/proc/$pid" ] && die "$2 (pid $pid) did not stop within 10 s"
        log "$2 stopped (pid $pid)"
    fi
    rm -f "$1"
}

if [ -n "$DOWN" ]; then
    [ -d "$DIR" ] || {
        log "nothing to undo: no $DIR"
        exit 0
    }
    if [ -f "$DIR/image.imported" ] && docker info >/dev/null 2>&1; then
        docker image rm "$IMAGE" >/dev/null 2>&1 && log "image $IMAGE removed"
    fi
    stop_pidfile "$DIR/dockerd.pid" dockerd
    stop_pidfile "$DIR/sshd.pid" sshd
    rm -f /etc/sudoers.d/servesweep-sweeper
    if [ -f "$DIR/user.created" ] && id sweeper >/dev/null 2>&1; then
        userdel --remove sweeper 2>/dev/null || userdel sweeper
        log "user sweeper removed"
    fi
    rm -rf "$DIR"
    log "down: $DIR removed"
    exit 0
fi

# ------------------------------------------------------------------ packages
missing=()
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v dockerd >/dev/null || missing+=(docker.io)
command -v sudo >/dev/null || missing+=(sudo)
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]}"
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi

mkdir -p "$DIR" "$DIR/authorized_keys"
DIR="$(cd "$DIR" && pwd)"
# sshd reads authorized_keys/<user> as that user: the directory must be traversable.
chmod 755 "$DIR" "$DIR/authorized_keys"

# ------------------------------------------------------------------ keys
for type in ed25519 ecdsa rsa; do
    [ -f "$DIR/ssh_host_${type}_key" ] ||
        ssh-keygen -q -t "$type" -N '' -C "servesweep-test-host" -f "$DIR/ssh_host_${type}_key"
done
[ -f "$DIR/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C "servesweep-test-client" \
    -f "$DIR/id_ed25519"
chmod 600 "$DIR"/ssh_host_*_key "$DIR/id_ed25519"

# ------------------------------------------------------------------ users and sudo
if ! id sweeper >/dev/null 2>&1; then
    useradd --create-home --shell /bin/bash sweeper
    : >"$DIR/user.created" # --down removes only a user this script made
fi
if [ ! -s "$DIR/sweeper_password" ]; then
    (
        umask 077
        printf 'canary-%s\n' "$(head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9')" \
            >"$DIR/sweeper_password"
    )
fi
chmod 600 "$DIR/sweeper_password"
printf 'sweeper:%s\n' "$(head -n1 "$DIR/sweeper_password")" | chpasswd

# `sudo docker` resolves docker through sudo's secure_path, which may find /usr/local/bin/docker
# before /usr/bin/docker: allow every docker binary present, each only with a password.
dockers=()
for d in /usr/bin/docker /usr/local/bin/docker; do
    [ -x "$d" ] && dockers+=("$d")
done
[ "${#dockers[@]}" -gt 0 ] || die "no docker binary in /usr/bin or /usr/local/bin"
sudoers_tmp="$(mktemp)"
{
    echo "# servesweep test nodes: sweeper may run docker as root, with its password."
    echo "Defaults:sweeper timestamp_timeout=0, !lecture"
    rule="$(printf '%s, ' "${dockers[@]}")"
    echo "sweeper ALL=(root) ${rule%, }"
} >"$sudoers_tmp"
visudo -cqf "$sudoers_tmp" || die "generated sudoers rule is invalid"
install -m 0440 "$sudoers_tmp" /etc/sudoers.d/servesweep-sweeper
rm -f "$sudoers_tmp"

cp "$DIR/id_ed25519.pub" "$DIR/authorized_keys/root"
cp "$DIR/id_ed25519.pub" "$DIR/authorized_keys/sweeper"
chmod 644 "$DIR/authorized_keys/root" "$DIR/authorized_keys/sweeper"

# ------------------------------------------------------------------ fake nvidia-smi
# The test nodes have no GPU: a fake nvidia-smi on their PATH replays real output recorded on an
# H200 (tests/data), as 8 GPUs. It answers the snapshot query and the sampling loop
# (`--loop-ms=N`): the loop replays the recorded 500 ms series (idle, load, idle; values with
# their units stripped, as `nounits` prints them) round and round, one line per GPU every N ms,
# stamped with the current time (the loop runs with TZ=UTC).
REPO=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$DIR/bin"
cp "$REPO/tests/data/nvidia-smi-8gpu/query-load-8gpu-noheader-nounits.csv" "$DIR/bin/query.csv"
tail -n +2 "$REPO/tests/data/nvidia-smi-series/loop-500ms-idle-load-idle.csv" |
    cut -d, -f2- | sed -e 's/^ [0-9]*, //' -e 's/ \(W\|%\|MiB\|MHz\)//g' >"$DIR/bin/series.csv"
cat >"$DIR/bin/nvidia-smi" <<FAKE
#!/bin/sh
case "\$*" in
  *--query-gpu=timestamp,index,uuid,power.draw,*--format=csv,noheader,nounits*--loop-ms=*)
    ms=\$(echo "\$*" | sed 's/.*--loop-ms=\([0-9]*\).*/\1/')
    pause=\$(awk "BEGIN { print \$ms / 1000 }")
    while :; do
      while IFS= read -r line; do
        now=\$(date '+%Y/%m/%d %H:%M:%S.%3N')
        for i in 0 1 2 3 4 5 6 7; do echo "\$now, \$i, \$line"; done
        sleep "\$pause"
      done <"$DIR/bin/series.csv"
    done ;;
  *--query-gpu=*--format=csv,noheader,nounits*) exec cat "$DIR/bin/query.csv" ;;
  *) echo "fake nvidia-smi: unsupported arguments: \$*" >&2; exit 2 ;;
esac
FAKE
chmod 755 "$DIR/bin" "$DIR/bin/nvidia-smi"
chmod 644 "$DIR/bin/query.csv" "$DIR/bin/series.csv"

# ------------------------------------------------------------------ sshd
{
    echo "# servesweep test nodes (written by .ci/setup_nodes.sh)"
    for a in "${ADDRS[@]}"; do echo "ListenAddress $a:22"; done
    for type in ed25519 ecdsa rsa; do echo "HostKey $DIR/ssh_host_${type}_key"; done
    echo "PidFile $DIR/sshd.pid"
    echo "AuthorizedKeysFile $DIR/authorized_keys/%u"
    echo "PermitRootLogin prohibit-password"
    echo "PubkeyAuthentication yes"
    echo "PasswordAuthentication no"
    echo "KbdInteractiveAuthentication no"
    echo "UsePAM no"
    # the key files live under /tmp (world-writable), which strict modes refuses
    echo "StrictModes no"
    echo "MaxStartups 64:30:128"
    echo "MaxSessions 64"
    echo "PrintMotd no"
    echo "AcceptEnv LANG LC_*"
    echo "SetEnv PATH=$DIR/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    echo "Subsystem sftp internal-sftp"
} >"$DIR/sshd_config"
mkdir -p /run/sshd # privilege separation directory
chmod 755 /run/sshd
/usr/sbin/sshd -t -f "$DIR/sshd_config" || die "sshd rejects $DIR/sshd_config"

if pid_alive "$DIR/sshd.pid" sshd; then
    log "sshd already running (pid $(cat "$DIR/sshd.pid")); reloading its config"
    kill -HUP "$(cat "$DIR/sshd.pid")"
else
    rm -f "$DIR/sshd.pid"
    /usr/sbin/sshd -f "$DIR/sshd_config" -E "$DIR/sshd.log"
    for _ in $(seq 50); do
        [ -s "$DIR/sshd.pid" ] && break
        sleep 0.1
    done
    pid_alive "$DIR/sshd.pid" sshd || die "sshd did not start; see $DIR/sshd.log"
    log "sshd started (pid $(cat "$DIR/sshd.pid")) on ${ADDRS[*]}"
fi

# ------------------------------------------------------------------ ssh client config
{
    echo "# servesweep test nodes (written by .ci/setup_nodes.sh)"
    for i in "${!ADDRS[@]}"; do
        for user in root sweeper; do
            alias="node$((i + 1))"
            [ "$user" = root ] || alias="$alias-$user"
            echo "Host $alias"
            echo "    HostName ${ADDRS[$i]}"
            echo "    Port 22"
            echo "    User $user"
            echo "    IdentityFile $DIR/id_ed25519"
            echo "    IdentitiesOnly yes"
            echo "    UserKnownHostsFile $DIR/known_hosts"
            echo "    StrictHostKeyChecking yes"
            echo "    BatchMode yes"
        done
    done
} >"$DIR/ssh_config"

: >"$DIR/known_hosts.tmp"
for i in "${!ADDRS[@]}"; do
    for type in ed25519 ecdsa rsa; do
        printf '%s %s\n' "${ADDRS[$i]}" "$(cut -d' ' -f1,2 "$DIR/ssh_host_${type}_key.pub")" \
            >>"$DIR/known_hosts.tmp"
    done
done
mv "$DIR/known_hosts.tmp" "$DIR/known_hosts"
chmod 644 "$DIR/ssh_config" "$DIR/known_hosts"

for i in "${!ADDRS[@]}"; do
    ok=""
    for _ in $(seq 50); do
        if ssh -F "$DIR/ssh_config" -o ConnectTimeout=5 "node$((i + 1))" true 2>/dev/null; then
            ok=1
            break
        fi
        sleep 0.1
    done
    [ -n "$ok" ] || die "ssh to node$((i + 1)) (${ADDRS[$i]}) fails; see $DIR/sshd.log"
done
ssh -F "$DIR/ssh_config" -o ConnectTimeout=5 node1-sweeper true ||
    die "ssh as sweeper fails; see $DIR/sshd.log"
log "ssh works: node1..node4 and node1-sweeper..node4-sweeper"

# ------------------------------------------------------------------ dockerd
if docker info >/dev/null 2>&1; then
    log "docker daemon already answers; not starting one"
else
    if pid_alive "$DIR/dockerd.pid" dockerd; then
        log "dockerd (pid $(cat "$DIR/dockerd.pid")) is running but not answering yet"
    else
        rm -f "$DIR/dockerd.pid"
        nohup dockerd --bridge=none --iptables=false --pidfile "$DIR/dockerd.pid" \
            >"$DIR/dockerd.log" 2>&1 </dev/null &
        log "dockerd started (pid $!)"
    fi
    for _ in $(seq 120); do
        docker info >/dev/null 2>&1 && break
        sleep 0.5
    done
    docker info >/dev/null 2>&1 || die "dockerd does not answer; see $DIR/dockerd.log"
fi

if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
    tar cf - -T /dev/null | docker import - "$IMAGE" >/dev/null
    : >"$DIR/image.imported"
    log "image $IMAGE imported (empty; run the host's Python through read-only mounts)"
fi

log "ready in $DIR"
echo "export SERVESWEEP_TEST_NODES=$DIR"
