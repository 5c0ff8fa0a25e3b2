# Sourced by the device scripts from the repository root: what every run on
# the device machine needs. NVLink multicast stays off on these machines
# (NCCL, torch and NVSHMEM alike); the libraries staged in .deps/
# (tools/device/stage_deps.sh) are found at run time; $OUT (default out/)
# exists.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=$PWD/.deps/prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
