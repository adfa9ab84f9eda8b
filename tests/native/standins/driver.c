/* Runs the stand-in workload the way PyTorch reaches cuBLAS: the library is
 * dlopened RTLD_LOCAL, so its cuBLAS/CUDA dependencies are not in the global
 * scope.  Prints the workload's JSON line, then "READY"; given CALLS and
 * PAUSE_US, then runs that many more GEMMs PAUSE_US apart and prints "DONE";
 * given "timeline" CALLS, runs run_timeline and prints its line and "DONE";
 * given "threads" THREADS CALLS, runs run_gemm_threads and prints "DONE";
 * given "paced" CALLS PAUSE_US, runs run_gemm_paced and prints its line and "DONE";
 * given "phases" FIRST THEN, runs run_gemm_stream(FIRST, 0), prints "PHASE",
 * waits for a line on stdin (the test sees the first calls folded), then runs
 * run_gemm_stream(THEN, 0) and prints "DONE"; given "captured" CALLS FROM TO,
 * runs run_gemm_captured and prints "DONE".
 * Waits for a line on stdin before exiting (so the test can look at the live
 * segment). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc < 2 || argc == 3 || argc > 6) {
        fprintf(stderr, "usage: %s libworkload.so [CALLS PAUSE_US | timeline CALLS | threads THREADS CALLS | paced CALLS PAUSE_US | phases FIRST THEN | captured CALLS FROM TO]\n", argv[0]);
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
    if (argc == 5 && strcmp(argv[2], "threads") == 0) {
        int (*threads)(int, int) = (int (*)(int, int))dlsym(lib, "run_gemm_threads");
        if (!threads || threads(atoi(argv[3]), atoi(argv[4])) != 0) return 1;
        printf("DONE\n");
        fflush(stdout);
    } else if (argc == 6 && strcmp(argv[2], "captured") == 0) {
        int (*captured)(int, int, int) = (int (*)(int, int, int))dlsym(lib, "run_gemm_captured");
        if (!captured || captured(atoi(argv[3]), atoi(argv[4]), atoi(argv[5])) != 0) return 1;
        printf("DONE\n");
        fflush(stdout);
    } else if (argc == 5 && strcmp(argv[2], "phases") == 0) {
        int (*stream)(int, int) = (int (*)(int, int))dlsym(lib, "run_gemm_stream");
        char go[16];
        if (!stream || stream(atoi(argv[3]), 0) != 0) return 1;
        printf("PHASE\n");
        fflush(stdout);
        if (!fgets(go, sizeof(go), stdin) || stream(atoi(argv[4]), 0) != 0) return 1;
        printf("DONE\n");
        fflush(stdout);
    } else if (argc == 5 && strcmp(argv[2], "paced") == 0) {
        int (*paced)(FILE *, int, int) = (int (*)(FILE *, int, int))dlsym(lib, "run_gemm_paced");
        if (!paced || paced(stdout, atoi(argv[3]), atoi(argv[4])) != 0) return 1;
        printf("DONE\n");
        fflush(stdout);
    } else if (argc == 4 && strcmp(argv[2], "timeline") == 0) {
        int (*timeline)(FILE *, int, int, int) = (int (*)(FILE *, int, int, int))dlsym(lib, "run_timeline");
        if (!timeline || timeline(stdout, atoi(argv[3]), 200000, 50) != 0) return 1;
        printf("DONE\n");
        fflush(stdout);
    } else if (argc == 4) {
        int (*stream)(int, int) = (int (*)(int, int))dlsym(lib, "run_gemm_stream");
        if (!stream || stream(atoi(argv[2]), atoi(argv[3])) != 0) return 1;
        printf("DONE\n");
        fflush(stdout);
    }
    char line[16];
    if (!fgets(line, sizeof(line), stdin)) return 0;
    return 0;
}
