/* Runs the stand-in workload the way PyTorch reaches cuBLAS: the library is
 * dlopened RTLD_LOCAL, so its cuBLAS/CUDA dependencies are not in the global
 * scope.  Prints the workload's JSON line, then "READY", and waits for a line
 * on stdin before exiting (so the test can look at the live segment). */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s libworkload.so\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    int (*run)(FILE *) = (int (*)(FILE *))dlsym(lib, "run_workload");
    if (!run || run(stdout) != 0) return 1;
    printf("READY\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof(line), stdin)) return 0;
    return 0;
}
