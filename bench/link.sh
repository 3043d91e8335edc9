#!/usr/bin/env bash
# Run a command with the loopback interface shaped to a given rate, then restore it.
#
#   bench/link.sh RATE COMMAND [ARG...]
#   bench/link.sh 2gbit .venv/bin/hetgmp bench train
#
# On one machine the ranks talk over loopback at tens of Gbit/s, so the bytes a placement saves
# cost next to nothing. This puts an HTB rate limit (Linux tc) on `lo` for as long as COMMAND
# runs: every byte on loopback, both directions and every process, shares RATE (a tc rate:
# 500mbit, 2gbit, 10gbit, ...), as two ranks' traffic would share one half-duplex link. The
# shaping is removed when COMMAND ends, fails or is interrupted. COMMAND sees the rate in
# HETGMP_LINK (the train benchmark prints it with its figures).
#
# Needs root (CAP_NET_ADMIN) and the kernel's htb qdisc, and refuses to touch a loopback that
# already has a qdisc of its own. Run nothing else on loopback meanwhile (a Kafka broker, tests).
set -euo pipefail

usage() {
    # The comment block at the top of this file, without its '#'.
    awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
    exit "${1:-2}"
}

[[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && usage 0
[[ $# -ge 2 ]] || { echo "link.sh: need a RATE and a COMMAND" >&2; usage; }
rate=$1
shift
[[ "$rate" =~ ^[0-9]+(\.[0-9]+)?([kmg]?bit|[kmg]?bps)$ ]] || {
    echo "link.sh: RATE must be a tc rate such as 500mbit or 2gbit, not '$rate'" >&2; exit 2; }
command -v tc >/dev/null || { echo "link.sh: tc not found (Debian package iproute2)" >&2; exit 1; }

current=$(tc qdisc show dev lo root)
if [[ "$current" != qdisc\ noqueue* ]]; then
    echo "link.sh: lo already has a root qdisc ($current); not touching it" >&2
    exit 1
fi

restore() { tc qdisc del dev lo root 2>/dev/null || true; }
# The quantum (bytes a class may send per round) is set, not derived from the rate, which would
# overflow HTB's limit at Gbit rates; it and the burst let a 64 kB loopback packet through whole.
if ! err=$(tc qdisc add dev lo root handle 1: htb default 10 2>&1); then
    echo "link.sh: cannot shape lo: $err (root and the htb qdisc needed)" >&2
    exit 1
fi
trap restore EXIT
trap 'restore; exit 130' INT TERM
tc class add dev lo parent 1: classid 1:10 htb rate "$rate" ceil "$rate" burst 256k cburst 256k \
    quantum 65536
echo "link.sh: loopback shaped to $rate for: $*" >&2
set +e
HETGMP_LINK="$rate" "$@"
status=$?
set -e
restore
trap - EXIT
echo "link.sh: loopback restored" >&2
exit "$status"
