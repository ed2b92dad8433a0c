#!/usr/bin/env bash
# device-check.sh BUNDLE -- on a lent GPU machine (see scripts/device-bundle.sh): unpack the
# bundle, find the machine's own CUDA libraries, and run what CI cannot: the GPU tests as ctest
# defines them (probe, device ops against the host backend, collectives at 1-3 ranks with NCCL
# and with staging) and gvq-gpu-bench. Logs to $OUT (or ./device-out).
set -uo pipefail
bundle=$1
out=${OUT:-$PWD/device-out}
mkdir -p "$out"
exec > >(tee "$out/log") 2>&1
d=/opt/gvqdev
mkdir -p $d && tar -C $d -xJf "$bundle" || exit 1
for p in usr/lib/x86_64-linux-gnu/openmpi usr/lib/x86_64-linux-gnu/pmix2 usr/share/openmpi etc/openmpi \
         usr/lib/x86_64-linux-gnu/ucx; do
    [ -e "/$p" ] && mv "/$p" "/$p.orig"
done
tar -C / -xf $d/mpi.tar
libdirs=$d/lib
for so in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcusolver.so.12 libcusparse.so.12 \
          libnccl.so.2 libnvJitLink.so.13; do
    f=$(find /usr/local /usr/lib /opt -name "$so" 2>/dev/null | grep -v "^$d" | head -1)
    echo "== $so: ${f:-NOT FOUND}"
    [ -n "$f" ] && libdirs="$libdirs:$(dirname "$f")"
done
export LD_LIBRARY_PATH=$libdirs
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
export OMPI_MCA_mca_base_component_show_load_errors=0 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp
export PMIX_MCA_gds=hash GVQ_DEBUG=${GVQ_DEBUG:-WARN}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
ldd $d/bin/test_gpu_device | grep "not found"
step() { # step NAME TIMEOUT CMD...
    local name=$1 t=$2; shift 2
    local s=$(date +%s%N)
    timeout "$t" "$@" > "$out/$name.txt" 2>&1
    local rc=$?
    local ms=$((($(date +%s%N) - s) / 1000000))
    printf '%-28s rc %3d  %6d ms\n' "$name" $rc $ms | tee -a "$out/summary.txt"
    tail -n 15 "$out/$name.txt"
}
B=$d/bin
step gpu_probe 60 $B/test_gpu_probe
step gpu_device 240 $B/test_gpu_device
step gpu_bench 240 $B/gvq-gpu-bench
step gpu_bench_2 240 $B/gvq-gpu-bench # the second run is the one recorded
for np in 1 2 3; do
    for nccl in 1 0; do
        step gpu_collectives_nccl${nccl}_np$np 120 env GVQ_NCCL=$nccl $B/mpirun -np $np --oversubscribe $B/test_gpu_collectives
    done
done
if command -v compute-sanitizer >/dev/null; then
    step sanitizer_gpu_device 180 compute-sanitizer --error-exitcode 9 $B/test_gpu_device
fi
# GVQ_DEVICE_PROFILE=1: Nsight Compute on one launch of each codec kernel of gvq-gpu-bench
# (GVQ_PROFILE_KERNELS: NAME:LAUNCHES-TO-SKIP ...)
# (speed of light, occupancy, warp stalls, memory) into $OUT/ncu-*.txt
if [ "${GVQ_DEVICE_PROFILE:-0}" = 1 ]; then
    ncu=$(command -v ncu || find /usr/local /opt -name ncu -type f 2>/dev/null | head -1)
    echo "== ncu: ${ncu:-NOT FOUND}"
    if [ -n "$ncu" ]; then
        for k in ${GVQ_PROFILE_KERNELS:-k_gq_decode_rows:0 k_qsgd_encode_tile:0 \
                 k_qsgd_encode_tile:21 k_qsgd_decode:0}; do
            step "ncu-${k/:/-}" 240 "$ncu" -k "regex:${k%%:*}" -s "${k##*:}" -c 1 \
                --section SpeedOfLight --section Occupancy --section WarpStateStats \
                --section MemoryWorkloadAnalysis --section LaunchStats $B/gvq-gpu-bench
        done
    fi
fi
cat "$out/summary.txt"
