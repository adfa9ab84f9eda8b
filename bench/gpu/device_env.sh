# The start the GPU bench scripts share; sourced as `. bench/gpu/device_env.sh bench/.work/NAME`: $OUT (that
# folder unless set) with log.txt taking all output, the machine's rule against NVLink multicast, and the
# wheels carried in .whl (device README) installed into /tmp/site.
OUT=${OUT:-$1}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
