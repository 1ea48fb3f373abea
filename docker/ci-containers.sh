#!/usr/bin/env bash
# Build the images and run the compose files for real, without Docker: podman + runc, base images
# bootstrapped from Debian's archive (no registry is reachable), then tests/repo/test_containers_live.py.
# Called by .ci/run; runs as root (rootful podman, mmdebstrap). Prints "SKIP containers: ..." and
# exits 0 only where podman cannot be installed; any other failure fails CI.
#
#   docker/ci-containers.sh            # everything; base images are cached between runs
#   DISAN_CONTAINERS_FRESH=1 docker/ci-containers.sh   # re-bootstrap the base images too
#
# Leaves the base and service images behind (the next run reuses them and their layers) and removes
# every container and network it made. `podman rmi` the images listed at the end to reclaim the disk.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
log() { printf '[containers %3ds] %s\n' $((SECONDS - started)) "$*"; }
skip() { echo "SKIP containers: $*"; exit 0; }

STATE=${DISAN_CONTAINERS_STATE:-/var/tmp/disan-containers}
# Stand-ins for the upstream bases, built from Debian packages (docs/containers.md).
PYTHON_BASE=localhost/debian-python:bookworm    # for python:3.12-slim-bookworm and the CUDA base
NGINX_ROOTFS=localhost/debian-nginx:sid         # sid: the first Debian with nginx >= 1.27.3
CPU_IMAGE=localhost/disan-serve:cpu             # the name docker-compose.yml runs
GPU_IMAGE=localhost/disan-serve:gpu-debian      # GPU Dockerfile on the Debian base: no CUDA inside
LB_IMAGE=localhost/disan-nginx:debian
PROJECTS_PREFIX=disan-ci-                       # compose projects and containers of the tests

# ------------------------------------------------------------------------------ tools
[ "$(id -u)" = 0 ] || skip "needs root (rootful podman and mmdebstrap); CI runs as root"
if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v mmdebstrap >/dev/null \
        || [ ! -x /usr/lib/podman/netavark ] || [ ! -x /usr/lib/podman/aardvark-dns ] \
        || ! PATH=$PATH:/usr/sbin:/sbin command -v iptables >/dev/null; then
    log "installing podman, runc, netavark, aardvark-dns, iptables, mmdebstrap (apt)"
    # netavark + aardvark-dns: compose service names resolve inside the network (nginx needs it).
    # netavark drives iptables; without it every container start fails with
    # "netavark: No such file or directory", and iptables is only a Recommends of podman.
    if ! { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
            --no-install-recommends podman runc netavark aardvark-dns iptables mmdebstrap \
            >/dev/null; }; then
        skip "podman could not be installed with apt-get"
    fi
fi
command -v podman-compose >/dev/null || python -m pip install -q 'podman-compose>=1.5,<2'

# Debian's podman defaults to crun, which fails here ("cgroups in hybrid mode not supported");
# setting RLIMIT_NPROC is not permitted in some sandboxes; no systemd, so cgroupfs and file events.
mkdir -p "$STATE"
cat > "$STATE/containers.conf" <<'EOF'
[containers]
default_ulimits = []

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"

[network]
network_backend = "netavark"
EOF
export CONTAINERS_CONF="$STATE/containers.conf"

cleanup() {
    local names
    names=$(podman ps -a --format '{{.Names}}' | grep "^$PROJECTS_PREFIX" || true)
    [ -z "$names" ] || podman rm -f -t 5 $names >/dev/null 2>&1 || true
    names=$(podman network ls --format '{{.Name}}' | grep "^$PROJECTS_PREFIX" || true)
    [ -z "$names" ] || podman network rm -f $names >/dev/null 2>&1 || true
}
trap cleanup EXIT
cleanup  # leftovers of an interrupted run

# ------------------------------------------------------------------------------ images
# The host's Debian mirror (deb822 URIs: or one-line `deb` entries); security and other archives
# are skipped.
MIRROR=$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
             /etc/apt/sources.list.d/*.sources | grep -oE 'https?://[^ ]+/debian/?( |$)' | head -1 \
             | tr -d ' ' || true)
MIRROR=${MIRROR:-http://deb.debian.org/debian}
# mmdebstrap rather than debootstrap: it resolves with apt and writes the tarball `podman import`
# takes. Its work directory goes to memory where possible: dpkg syncs many small files.
SCRATCH=/var/tmp
[ -d /dev/shm ] && [ -w /dev/shm ] && SCRATCH=/dev/shm

bootstrap() {  # IMAGE SUITE PACKAGES [mmdebstrap options] [-- podman import options]
    local image=$1 suite=$2 packages=$3 opts=() import_opts=()
    shift 3
    while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
    [ $# -gt 0 ] && shift && import_opts=("$@")
    if [ -z "${DISAN_CONTAINERS_FRESH:-}" ] && podman image exists "$image"; then
        log "$image: cached"
        return
    fi
    log "$image: bootstrapping Debian $suite with $packages from $MIRROR"
    local tmp
    tmp=$(mktemp -d "$SCRATCH/disan-rootfs.XXXXXX")
    # A tarball first, imported only once complete: a failed bootstrap never leaves an image.
    if ! TMPDIR=$tmp mmdebstrap --quiet --variant=minbase --include="$packages" \
            --dpkgopt=force-unsafe-io --aptopt='Acquire::Languages "none"' "${opts[@]}" \
            "$suite" "$tmp/rootfs.tar" "$MIRROR"; then
        rm -rf "$tmp"
        echo "mmdebstrap $suite failed" >&2
        exit 1
    fi
    podman import "${import_opts[@]}" "$tmp/rootfs.tar" "$image" >/dev/null
    rm -rf "$tmp"
}

build() {  # TAG DOCKERFILE [podman build options]
    local tag=$1 file=$2 out="$STATE/build-$(basename "$2" .Dockerfile).log" old new
    shift 2
    old=$(podman image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
    log "building $tag from $file"
    # --format docker keeps HEALTHCHECK (OCI images have no such field); --network host: pip and
    # apt reach their registries the way this host does.
    if ! podman build --network host --pull=never --format docker -f "$file" -t "$tag" "$@" . \
            >"$out" 2>&1; then
        tail -n 60 "$out" >&2
        echo "podman build of $file failed (log: $out)" >&2
        exit 1
    fi
    # The image this one replaces would otherwise pile up run after run. It is removed once every
    # build is done: removing it while another build looks up its cache fails that build with
    # "layer not known" (a podman race, containers/buildah#5674).
    new=$(podman image inspect --format '{{.Id}}' "$tag")
    [ -z "$old" ] || [ "$old" = "$new" ] || echo "$old" >>"$STATE/replaced-images"
    log "built $tag"
}

python_images() {
    # pip inside the builds must trust the same CAs as this host (a TLS-inspecting proxy may sit
    # in between), and pip uses its own CA list unless PIP_CERT says otherwise.
    bootstrap "$PYTHON_BASE" bookworm python3,python3-venv,ca-certificates \
        --customize-hook='copy-in /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs' \
        --customize-hook='chroot "$1" ln -sf python3 /usr/bin/python' \
        -- --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' --change 'CMD ["python3"]'
    build "$CPU_IMAGE" docker/service-cpu.Dockerfile --build-arg "PYTHON_IMAGE=$PYTHON_BASE" &
    build "$GPU_IMAGE" docker/service-gpu.Dockerfile --build-arg "CUDA_IMAGE=$PYTHON_BASE" &
    wait_all
}

nginx_image() {
    # sid's Release file may be older than its 7-day Valid-Until on a snapshot mirror; signatures
    # are still checked.
    bootstrap "$NGINX_ROOTFS" sid nginx,wget,gettext-base \
        --aptopt='Acquire::Check-Valid-Until "false"' -- --change 'CMD ["nginx", "-g", "daemon off;"]'
    build "$LB_IMAGE" docker/nginx-debian.Dockerfile --build-arg "NGINX_ROOTFS=$NGINX_ROOTFS"
}

wait_all() {  # wait for every background job; fail if any failed
    local failed=0 job
    for job in $(jobs -p); do wait "$job" || failed=1; done
    return $failed
}

stale_images=$(podman images -q --filter dangling=true --filter "after=$PYTHON_BASE" 2>/dev/null || true)
# The steps wait on the network, on disk and on one core each (pip, dpkg): run them side by side.
rm -f "$STATE/replaced-images"
python_images &
nginx_image &
wait_all
if [ -f "$STATE/replaced-images" ]; then
    # shellcheck disable=SC2046  # one image id per line
    podman rmi $(sort -u "$STATE/replaced-images") >/dev/null 2>&1 || true
    rm -f "$STATE/replaced-images"
fi

# ------------------------------------------------------------------------------ run
log "running tests/repo/test_containers_live.py"
DISAN_CONTAINERS_LIVE=1 DISAN_CPU_IMAGE=$CPU_IMAGE DISAN_GPU_IMAGE=$GPU_IMAGE DISAN_LB_IMAGE=$LB_IMAGE PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} \
    python -m pytest tests/repo/test_containers_live.py -x -q -p no:cacheprovider -s
# Untagged leftovers of earlier runs' builds on our base (old builder stages, about 1 GB a run);
# this run's stay as the next run's layer cache.
[ -z "$stale_images" ] || podman rmi $stale_images >/dev/null 2>&1 || true
log "done; images kept for the next run: $PYTHON_BASE $NGINX_ROOTFS $CPU_IMAGE $GPU_IMAGE $LB_IMAGE"
