# common.sh -- sourced by demo.sh and test.sh: install the Debian packages gvq needs (only when
# one is missing), then configure and build into build/ (or $GVQ_BUILD_DIR).
set -euo pipefail

GVQ_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GVQ_BUILD_DIR=${GVQ_BUILD_DIR:-$GVQ_ROOT/build}
GVQ_PACKAGES="build-essential cmake pkg-config python3 libopenmpi-dev openmpi-bin libucx-dev libopenblas-dev liblapacke-dev zlib1g-dev dataset-fashion-mnist python3-numpy python3-mpi4py python3-torch python3-pytest python3-torchvision nftables"

# gvq_install_packages [PACKAGE...]: the named packages (default: $GVQ_PACKAGES)
gvq_install_packages() {
    local missing="" wanted="${*:-$GVQ_PACKAGES}"
    for p in $wanted; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
    done
    if [ -n "$missing" ]; then
        echo "== installing Debian packages:$missing"
        local sudo=""
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        $sudo apt-get update
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y $wanted
    fi
}

gvq_build() {
    echo "== configuring and building gvq in $GVQ_BUILD_DIR"
    # GVQ_CMAKE_ARGS adds configure options, e.g. "-DGVQ_SANITIZE=address"
    cmake -S "$GVQ_ROOT" -B "$GVQ_BUILD_DIR" -DCMAKE_BUILD_TYPE=Release ${GVQ_CMAKE_ARGS:-} "$@"
    cmake --build "$GVQ_BUILD_DIR" -j "$(nproc)"
}

# Open MPI refuses root without these; oversubscription lets more ranks than cores run.
if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
