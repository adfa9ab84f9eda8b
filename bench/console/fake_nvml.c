/* A stand-in libnvidia-ml.so.1 for machines without a GPU: one H100 whose figures change every
 * second, with the processes named in $FAKE_NVML_PIDS (comma-separated) on it. Both nvitop and
 * the tuiprof agent load it through the real nvidia-ml-py bindings (LD_LIBRARY_PATH), so
 * bench/console/console_nvitop_vm.sh can put them side by side on one host with NVML's own cost taken
 * out (every call answers in microseconds): what is compared is each tool's own work.
 * Functions not here are absent, as on an old driver: the bindings raise FunctionNotFound and
 * both tools show the figure as unavailable.
 *
 *     cc -shared -fPIC -O2 -o DIR/libnvidia-ml.so.1 bench/console/fake_nvml.c
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
enum { OK = 0, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, INSUFFICIENT_SIZE = 7, NOT_FOUND = 6 };
#define MAX_PIDS 16

static char device_token;  /* the one device's handle points here */
static unsigned pids[MAX_PIDS];
static unsigned pid_count;

typedef struct { unsigned gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct { unsigned pid; unsigned long long usedGpuMemory; unsigned gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;
typedef struct { unsigned pid; unsigned long long timeStamp; unsigned smUtil, memUtil, encUtil, decUtil; } nvmlProcessUtilizationSample_t;
typedef struct { unsigned version; int sensorType; int temperature; } nvmlTemperature_t;
typedef struct {
    uint32_t fieldId, scopeId;
    int64_t timestamp, latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    union { double d; unsigned ui; unsigned long ul; unsigned long long ull; long long sll; } value;
} nvmlFieldValue_t;
typedef struct { unsigned version, isSupportedDevice; } nvmlGpmSupport_t;
typedef struct { double taken_at; } gpm_sample;
typedef struct { const char *shortName, *longName, *unit; } metric_info;
typedef struct { unsigned metricId; nvmlReturn_t nvmlReturn; double value; metric_info metricInfo; } nvmlGpmMetric_t;
typedef struct { unsigned version, numMetrics; gpm_sample *sample1, *sample2; nvmlGpmMetric_t metrics[477]; } nvmlGpmMetricsGet_t;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* A figure in [low, high] that changes once a second (the same within a second for every caller). */
static unsigned per_second(unsigned low, unsigned high, unsigned salt) {
    unsigned long long x = (unsigned long long)now_s() * 2654435761ULL + salt * 40503ULL;
    x ^= x >> 13;
    x *= 0x5bd1e995ULL;
    x ^= x >> 15;
    return low + (unsigned)(x % (high - low + 1));
}

static int is_device(nvmlDevice_t device) { return device == &device_token; }

static nvmlReturn_t copy_text(char *out, unsigned length, const char *text) {
    if (length <= strlen(text)) return INSUFFICIENT_SIZE;
    strcpy(out, text);
    return OK;
}

nvmlReturn_t nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    const char *listed = getenv("FAKE_NVML_PIDS");
    pid_count = 0;
    while (listed && *listed && pid_count < MAX_PIDS) {
        pids[pid_count++] = (unsigned)strtoul(listed, (char **)&listed, 10);
        if (*listed == ',') listed++;
    }
    return OK;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) { return OK; }
const char *nvmlErrorString(nvmlReturn_t result) { return result == OK ? "Success" : "Not Supported"; }

nvmlReturn_t nvmlSystemGetDriverVersion(char *out, unsigned length) { return copy_text(out, length, "580.159.04"); }
nvmlReturn_t nvmlSystemGetNVMLVersion(char *out, unsigned length) { return copy_text(out, length, "13.580.159.04"); }
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) { *version = 13000; return OK; }
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) { *version = 13000; return OK; }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count) { *count = 1; return OK; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t *device) {
    if (index != 0) return INVALID_ARGUMENT;
    *device = &device_token;
    return OK;
}
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned *index) {
    if (!is_device(device)) return INVALID_ARGUMENT;
    *index = 0;
    return OK;
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *out, unsigned length) {
    return is_device(device) ? copy_text(out, length, "NVIDIA H100 80GB HBM3") : INVALID_ARGUMENT;
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *out, unsigned length) {
    return is_device(device) ? copy_text(out, length, "GPU-5e1f0c2a-0000-4000-8000-000000000001") : INVALID_ARGUMENT;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    if (!is_device(device)) return INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    strcpy(pci->busIdLegacy, "0000:18:00.0");
    strcpy(pci->busId, "00000000:18:00.0");
    pci->bus = 0x18;
    pci->pciDeviceId = 0x233010de;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned *minor) { *minor = 0; return is_device(device) ? OK : INVALID_ARGUMENT; }
nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned *arch) { *arch = 9; return is_device(device) ? OK : INVALID_ARGUMENT; }  /* Hopper */
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    *major = 9; *minor = 0;
    return is_device(device) ? OK : INVALID_ARGUMENT;
}

static const unsigned long long TOTAL = 80ULL << 30;
static unsigned long long used_bytes(void) { return (20ULL << 30) * (pid_count ? pid_count : 1) + per_second(0, 64, 1) * (1ULL << 20); }

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    memory->total = TOTAL; memory->used = used_bytes(); memory->free = TOTAL - memory->used;
    return is_device(device) ? OK : INVALID_ARGUMENT;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    memory->total = TOTAL; memory->reserved = 512ULL << 20; memory->used = used_bytes();
    memory->free = TOTAL - memory->reserved - memory->used;
    return is_device(device) ? OK : INVALID_ARGUMENT;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *rates) {
    rates->gpu = per_second(20, 40, 2); rates->memory = per_second(5, 20, 3);
    return is_device(device) ? OK : INVALID_ARGUMENT;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned *milliwatts) { *milliwatts = per_second(150000, 300000, 4); return OK; }
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned *milliwatts) { *milliwatts = 700000; return OK; }
nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned *milliwatts) { *milliwatts = 700000; return OK; }
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned *celsius) { *celsius = per_second(40, 45, 5); return OK; }
nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature) {
    temperature->temperature = (int)per_second(40, 45, 5);
    return OK;
}
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned *mhz) {
    *mhz = type == 2 ? 2619 : per_second(0, 1, 6) ? 1980 : 1755;  /* 2: memory clock */
    return OK;
}
nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, int type, unsigned *mhz) { *mhz = type == 2 ? 2619 : 1980; return OK; }
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *mask) { *mask = 0; return OK; }
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int type, int counter, unsigned long long *count) { *count = 0; return OK; }
nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, int *state) { *state = 0; return OK; }
nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, int *mode) { *mode = 1; return OK; }
nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, int *mode) { *mode = 0; return OK; }
nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t device, int *active) { *active = 0; return OK; }
nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t device, int *mode) { *mode = 0; return OK; }
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned *current, unsigned *pending) { return NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned *percent) { return NOT_SUPPORTED; }  /* as an H100 SXM */
nvmlReturn_t nvmlDeviceGetDriverModel(nvmlDevice_t device, int *current, int *pending) { return NOT_SUPPORTED; }  /* Windows only */
nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned *percent, unsigned *period_us) {
    *percent = 0; *period_us = 167000;
    return OK;
}
nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned *percent, unsigned *period_us) {
    *percent = 0; *period_us = 167000;
    return OK;
}

/* nvml.h's field ids this stand-in answers, with the figures of the single calls above; any other id
 * is answered per field as a driver that does not know it answers: NVML_ERROR_INVALID_ARGUMENT. */
enum {
    FI_ECC_SBE_VOL_TOTAL = 3, FI_ECC_DBE_VOL_TOTAL = 4,
    FI_NVLINK_THROUGHPUT_DATA_TX = 138, FI_NVLINK_THROUGHPUT_DATA_RX = 139,
    FI_POWER_AVERAGE = 185, FI_POWER_INSTANT = 186, FI_POWER_CURRENT_LIMIT = 190,
};
enum { VALUE_UNSIGNED_INT = 1, VALUE_UNSIGNED_LONG_LONG = 3 };

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int count, nvmlFieldValue_t *values) {
    if (!is_device(device) || count < 0 || (count && !values)) return INVALID_ARGUMENT;
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *field = &values[i];
        field->timestamp = (int64_t)(now_s() * 1e6);
        field->latencyUsec = 0;
        field->nvmlReturn = OK;
        switch (field->fieldId) {
        case FI_NVLINK_THROUGHPUT_DATA_TX:
        case FI_NVLINK_THROUGHPUT_DATA_RX:  /* KiB over all links, growing */
            field->valueType = VALUE_UNSIGNED_LONG_LONG;
            field->value.ull = (unsigned long long)(now_s() * 1e5);
            break;
        case FI_POWER_AVERAGE:
        case FI_POWER_INSTANT:  /* mW, as nvmlDeviceGetPowerUsage */
            field->valueType = VALUE_UNSIGNED_INT;
            field->value.ui = per_second(150000, 300000, 4);
            break;
        case FI_POWER_CURRENT_LIMIT:  /* mW, as nvmlDeviceGetEnforcedPowerLimit */
            field->valueType = VALUE_UNSIGNED_INT;
            field->value.ui = 700000;
            break;
        case FI_ECC_SBE_VOL_TOTAL:
        case FI_ECC_DBE_VOL_TOTAL:  /* as nvmlDeviceGetTotalEccErrors(volatile) */
            field->valueType = VALUE_UNSIGNED_LONG_LONG;
            field->value.ull = 0;
            break;
        default:
            field->nvmlReturn = INVALID_ARGUMENT;
        }
    }
    return OK;
}
nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, int counter, unsigned *kib_per_s) { *kib_per_s = per_second(1000, 9000, 7); return OK; }

static nvmlReturn_t running_processes(nvmlDevice_t device, unsigned *count, nvmlProcessInfo_t *infos) {
    if (!is_device(device)) return INVALID_ARGUMENT;
    if (*count < pid_count || (!infos && pid_count)) { *count = pid_count; return INSUFFICIENT_SIZE; }
    for (unsigned i = 0; i < pid_count; i++) {
        infos[i].pid = pids[i];
        infos[i].usedGpuMemory = 20ULL << 30;
        infos[i].gpuInstanceId = infos[i].computeInstanceId = 0xFFFFFFFF;
    }
    *count = pid_count;
    return OK;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned *count, nvmlProcessInfo_t *infos) {
    return running_processes(device, count, infos);
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned *count, nvmlProcessInfo_t *infos) {
    *count = 0;
    return is_device(device) ? OK : INVALID_ARGUMENT;
}

/* Five samples per process over the last half second, as a busy GPU gives. */
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *samples,
                                             unsigned *count, unsigned long long since_us) {
    unsigned wanted = 5 * pid_count;
    if (!is_device(device)) return INVALID_ARGUMENT;
    if (!pid_count) return NOT_FOUND;
    if (!samples || *count < wanted) { *count = wanted; return INSUFFICIENT_SIZE; }
    unsigned long long now_us = (unsigned long long)(now_s() * 1e6);
    unsigned n = 0;
    for (unsigned s = 0; s < 5; s++)
        for (unsigned p = 0; p < pid_count; p++) {
            unsigned long long at = now_us - 500000 + s * 100000;
            if (at <= since_us) continue;
            samples[n++] = (nvmlProcessUtilizationSample_t){pids[p], at, per_second(10, 40, 10 + p), per_second(5, 15, 20 + p), 0, 0};
        }
    *count = n;
    return n ? OK : NOT_FOUND;
}

nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *support) {
    support->isSupportedDevice = 1;
    return is_device(device) ? OK : INVALID_ARGUMENT;
}
nvmlReturn_t nvmlGpmSampleAlloc(gpm_sample **sample) { *sample = calloc(1, sizeof **sample); return *sample ? OK : 8; }
nvmlReturn_t nvmlGpmSampleFree(gpm_sample *sample) { free(sample); return OK; }
nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, gpm_sample *sample) {
    if (!is_device(device)) return INVALID_ARGUMENT;
    sample->taken_at = now_s();
    return OK;
}
nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *request) {
    static const metric_info info = {"fake", "a stand-in GPM metric", "%"};
    for (unsigned i = 0; i < request->numMetrics && i < 477; i++) {
        nvmlGpmMetric_t *metric = &request->metrics[i];
        metric->nvmlReturn = OK;
        metric->value = per_second(10, 60, 100 + metric->metricId);
        metric->metricInfo = info;
    }
    return OK;
}
