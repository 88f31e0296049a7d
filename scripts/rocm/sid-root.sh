#!/usr/bin/env bash
# A reproducible ROCm userland from Debian's packages (sid ships ROCm 6.4;
# Debian 13 ships HIP 5.7, below what llama.cpp's ggml-hip accepts).
#
#   scripts/rocm/sid-root.sh create             make the root once (reused after)
#   scripts/rocm/sid-root.sh install PKG...     apt-get install inside the root
#   scripts/rocm/sid-root.sh run CMD [ARG...]   run a command inside the root
#   scripts/rocm/sid-root.sh venv               python3 -m venv + pip install -e the project
#   scripts/rocm/sid-root.sh path               print the root's path
#
# The HIP build, as it was compiled there (2 cores: give it time; `nice` for a shared host):
#   scripts/rocm/sid-root.sh create && scripts/rocm/sid-root.sh venv
#   scripts/rocm/sid-root.sh run nice -n 19 forge build --accel hip --gpu-targets gfx1100 -j 2 -v
# The recorded outputs the tests replay: scripts/rocm/record-fixtures.sh (see its header).
#
# `run` works in a private mount namespace (unshare --mount): /proc, /sys,
# /dev, the project (at the same path) and the forge cache are mounted for the
# command only and vanish when it ends, on failure or a kill too, so the host's
# mount table is never left with stale mounts and parallel runs do not clash.
#
# Environment:
#   ROCM_SID_CACHE    where the root lives (default /var/cache/rocmforge-sid)
#   ROCM_SID_MIRROR   Debian mirror (default: the host's apt mirror)
#   FORGE_CACHE_HOST  the host directory mounted as the root's forge cache
#                     (default $ROCM_SID_CACHE/forge-cache: a HIP build made
#                     in the root links sid's libraries and does not run on
#                     the host, so it is kept out of the host's build cache;
#                     the host's pinned source is bind-mounted read-only into
#                     it when present, so nothing is downloaded twice)
# Every step prints its wall time.
# (end of usage)
set -euo pipefail

CACHE=${ROCM_SID_CACHE:-/var/cache/rocmforge-sid}
ROOT=$CACHE/root
PROJECT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
FORGE_CACHE_HOST=${FORGE_CACHE_HOST:-$CACHE/forge-cache}
HOST_SRC_CACHE=${HOST_SRC_CACHE:-$HOME/.cache/rocmforge/src}
APTOPT='Acquire::Check-Valid-Until "false"'
BASE_PACKAGES=hipcc,libamdhip64-dev,libhipblas-dev,librocblas-dev,rocm-cmake,cmake,ninja-build,g++,python3,python3-venv,git,ca-certificates,procps

mirror() {
    if [[ -n ${ROCM_SID_MIRROR:-} ]]; then
        echo "$ROCM_SID_MIRROR"
        return
    fi
    local uri
    uri=$(grep -hE '^\s*URIs:\s*\S+/debian/?\s*$' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1 | awk '{print $2}')
    if [[ -z $uri ]]; then
        uri=$(grep -hE '^\s*deb\s+\S+/debian/?\s' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | head -n1 | awk '{print $2}')
    fi
    echo "${uri:-http://deb.debian.org/debian}"
}

timed() {
    local label=$1
    shift
    local start rc=0
    start=$(date +%s)
    echo "== $label" >&2
    "$@" || rc=$?
    echo "== $label: $(($(date +%s) - start)) s (exit $rc)" >&2
    return $rc
}

need_root() {
    if [[ ! -x $ROOT/usr/bin/apt-get ]]; then
        echo "no root at $ROOT: run '$0 create' first" >&2
        exit 2
    fi
}

do_create() {
    if [[ -x $ROOT/usr/bin/apt-get ]]; then
        echo "root exists at $ROOT (reused)" >&2
        return 0
    fi
    command -v mmdebstrap >/dev/null || timed "apt-get install mmdebstrap" \
        bash -c 'apt-get update -qq && apt-get install -y -qq mmdebstrap'
    mkdir -p "$CACHE"
    rm -rf "$ROOT.partial"
    timed "mmdebstrap sid" mmdebstrap --variant=apt --aptopt="$APTOPT" \
        --include="$BASE_PACKAGES" sid "$ROOT.partial" "$(mirror)"
    mv "$ROOT.partial" "$ROOT"
}

# Runs "$@" inside the root, in a private mount namespace.
inner_run() {
    mount -t proc proc "$ROOT/proc"
    mount -t sysfs sysfs "$ROOT/sys" 2>/dev/null || mount --rbind /sys "$ROOT/sys"
    mount --rbind /dev "$ROOT/dev"
    mkdir -p "$ROOT$PROJECT" "$ROOT/root/.cache/rocmforge" "$FORGE_CACHE_HOST"
    mount --bind "$PROJECT" "$ROOT$PROJECT"
    mount --bind "$FORGE_CACHE_HOST" "$ROOT/root/.cache/rocmforge"
    if [[ -d $HOST_SRC_CACHE && $FORGE_CACHE_HOST != "$HOME/.cache/rocmforge" ]]; then
        mkdir -p "$ROOT/root/.cache/rocmforge/src"
        mount --bind -o ro "$HOST_SRC_CACHE" "$ROOT/root/.cache/rocmforge/src"
    fi
    cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf"
    # The host's CA bundle (a site's own CA for its proxy is added there): pip and git inside
    # then trust what the host trusts.
    if [[ -f /etc/ssl/certs/ca-certificates.crt && -f $ROOT/etc/ssl/certs/ca-certificates.crt ]]; then
        mount --bind -o ro /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/ca-certificates.crt"
    fi
    # The command starts where it was called from when that is in the project (same path inside).
    local workdir=/
    [[ $CALLER_PWD == "$PROJECT" || $CALLER_PWD == "$PROJECT"/* ]] && workdir=$CALLER_PWD
    exec chroot "$ROOT" /usr/bin/env -i -C "$workdir" HOME=/root TERM="${TERM:-dumb}" \
        PATH=/root/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 PIP_CERT=/etc/ssl/certs/ca-certificates.crt PIP_DISABLE_PIP_VERSION_CHECK=1 \
        "${PASSTHROUGH_ENV[@]}" "$@"
}

do_run() {
    need_root
    [[ $# -gt 0 ]] || set -- /bin/bash
    # FORGE_* and a few build variables cross into the root; nothing else does.
    local -a env=()
    local name
    while IFS= read -r name; do
        env+=("$name=${!name}")
    done < <(compgen -e | grep -E '^(FORGE_|HIP_|HIPCXX$|ROCM_PATH$|CMAKE_BUILD_PARALLEL_LEVEL$|MAKEFLAGS$)' || true)
    PASSTHROUGH_ENV=("${env[@]}")
    CALLER_PWD=$PWD
    export ROOT PROJECT FORGE_CACHE_HOST HOST_SRC_CACHE HOME CALLER_PWD
    # shellcheck disable=SC2016
    unshare --mount --propagation private -- bash -c "$(declare -f inner_run); $(declare -p PASSTHROUGH_ENV); inner_run \"\$@\"" inner "$@"
}

do_install() {
    need_root
    timed "apt-get install $*" do_run bash -c \
        "apt-get -o Acquire::Check-Valid-Until=false update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $*"
}

do_venv() {
    need_root
    timed "venv + pip install -e $PROJECT" do_run bash -c \
        "test -x /root/venv/bin/python || python3 -m venv /root/venv; /root/venv/bin/pip install -q -e '$PROJECT'"
}

cmd=${1:-}
shift || true
case $cmd in
    create) timed "create" do_create ;;
    install) do_install "$@" ;;
    run) do_run "$@" ;;
    venv) do_venv ;;
    path) echo "$ROOT" ;;
    *)
        sed -n '2,/^# (end of usage)/p' "$0" | sed '$d' >&2
        exit 2
        ;;
esac
