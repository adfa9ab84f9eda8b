# Sourced by the host-cost benches (native_callcost.sh, nccl_fallback_callcost.sh): where their
# libraries come from.
#   wheel_libs NAME...   the path of each library NAME (libcublas.so, libcudart.so, libnccl.so) that
#                        PyTorch's nvidia wheels bring (else the CUDA toolkit's), one line, space
#                        separated; missing-NAME for one found nowhere
#   standin_cuda DIR     build the stand-in CUDA driver (DIR/libcuda.so.1) and runtime over it
#                        (DIR/libcudart.so) from tests/native/standins
wheel_libs() {
  ${PYTHON:-python3} - "$@" <<'PY'
import glob, os, sys
dirs = [os.path.join(d, "nvidia") for d in sys.path if os.path.isdir(os.path.join(d, "nvidia"))] + ["/usr/local/cuda"]
def find(name):
    for d in dirs:
        hits = sorted(glob.glob(os.path.join(d, "**", name + ".*[0-9]"), recursive=True))
        if hits:
            return hits[0]
    return "missing-" + name
print(" ".join(find(name) for name in sys.argv[1:]))
PY
}

standin_cuda() {
  gcc -O1 -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$1/libcuda.so.1" tests/native/standins/cuda.c
  gcc -O1 -shared -fPIC -o "$1/libcudart.so" tests/native/standins/cudart.c "$1/libcuda.so.1" -Wl,-rpath,'$ORIGIN'
}
