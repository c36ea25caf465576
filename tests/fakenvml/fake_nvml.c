/*
 * fake_nvml.c: a small fake libnvidia-ml.so.1 for batchscope's NVML tests.
 *
 * The real pynvml bindings load it with CDLL("libnvidia-ml.so.1") when its
 * directory is on LD_LIBRARY_PATH, so the tests exercise pynvml's own ctypes
 * marshalling and error mapping, not a Python mock.
 *
 * Build:  cc -shared -fPIC -o <dir>/libnvidia-ml.so.1 tests/fakenvml/fake_nvml.c
 * Variant without nvmlDeviceGetProcessesUtilizationInfo (an older driver, so
 * pynvml raises NVMLError_FunctionNotFound):  add -DNO_PROCESSES_UTILIZATION_INFO
 *
 * Values and errors come from the plain-text scenario file named by
 * FAKE_NVML_SCENARIO, re-read on every call so a test can change it between two
 * collections. The format is described in README.md next to this file. When
 * FAKE_NVML_CALL_LOG names a file, every exported call appends one line to it
 * ("<symbol> <handle> [details]"), so a test can see what was polled.
 *
 * Struct layouts follow the ctypes classes in pynvml.py (nvidia-ml-py 13.615);
 * the _Static_asserts below pin the sizes and offsets checked against them.
 */

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#define EXPORT __attribute__((visibility("default")))

/* ------------------------------------------------------------------ NVML types */

typedef int nvmlReturn_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 8
#define MAX_MIGS 8 /* slot 0 of a handle row is the GPU itself */

typedef struct fake_device {
    int gpu;
    int mig; /* -1: the physical GPU, else the MIG slot */
} *nvmlDevice_t;

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;
typedef struct {
    unsigned long long timeStamp;
    unsigned int pid, smUtil, memUtil, encUtil, decUtil, jpgUtil, ofaUtil;
} nvmlProcessUtilizationInfo_v1_t;
typedef struct {
    unsigned int version;
    unsigned int processSamplesCount;
    unsigned long long lastSeenTimeStamp;
    nvmlProcessUtilizationInfo_v1_t *procUtilArray;
} nvmlProcessesUtilizationInfo_t;
typedef struct { unsigned int version, isSupportedDevice; } nvmlGpmSupport_t;

#define GPM_MAX_CAPTURED 16
typedef struct fake_gpm_sample {
    unsigned int magic;
    int gpu, mig;      /* which device (or GPU instance) it was taken on */
    long long seq;     /* 0: never filled */
    int n;
    unsigned int ids[GPM_MAX_CAPTURED];
    double values[GPM_MAX_CAPTURED];
} *nvmlGpmSample_t;
#define GPM_MAGIC 0x67706d31u

typedef struct { const char *shortName, *longName, *unit; } nvmlGpmMetricInfo_t;
typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    nvmlGpmMetricInfo_t metricInfo;
} nvmlGpmMetric_t;
typedef struct {
    unsigned int version;
    unsigned int numMetrics;
    nvmlGpmSample_t sample1, sample2;
    nvmlGpmMetric_t metrics[]; /* pynvml sizes this by its NVML_GPM_METRIC_MAX */
} nvmlGpmMetricsGet_t;

#define PROCESSES_UTILIZATION_INFO_V1 0x01000018u
#define MEMORY_V2 0x02000028u
#define NVML_VALUE_NOT_AVAILABLE_ULL (~0ULL)

/* The layouts pynvml's ctypes classes expect (x86-64 / aarch64 LP64). */
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "c_nvmlMemory_v2_t");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "c_nvmlProcessInfo_v3_t");
_Static_assert(offsetof(nvmlProcessInfo_t, gpuInstanceId) == 16, "c_nvmlProcessInfo_v3_t");
_Static_assert(sizeof(nvmlProcessUtilizationSample_t) == 32, "c_nvmlProcessUtilizationSample_t");
_Static_assert(sizeof(nvmlProcessUtilizationInfo_v1_t) == 40, "c_nvmlProcessUtilizationInfo_v1_t");
_Static_assert(offsetof(nvmlProcessUtilizationInfo_v1_t, pid) == 8, "c_nvmlProcessUtilizationInfo_v1_t");
_Static_assert(sizeof(nvmlProcessesUtilizationInfo_t) == 24, "c_nvmlProcessesUtilizationInfo_v1_t");
_Static_assert(sizeof(nvmlGpmMetric_t) == 40, "c_nvmlGpmMetric_t");
_Static_assert(offsetof(nvmlGpmMetricsGet_t, metrics) == 24, "c_nvmlGpmMetricsGet_t");

/* ------------------------------------------------------------------ scenario */

#define MAX_ENTRIES 2048
#define KEY_LEN 128
#define VAL_LEN 128

static char g_keys[MAX_ENTRIES][KEY_LEN];
static char g_vals[MAX_ENTRIES][VAL_LEN];
static int g_entries;

static int g_init_count;   /* NVML's own init reference count */
static long long g_gpm_seq; /* orders GPM samples */
static struct fake_device g_handles[MAX_GPUS][MAX_MIGS + 1];

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    char *end = s + strlen(s);
    while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r' || end[-1] == '\n'))
        *--end = '\0';
    return s;
}

/* Re-read on every call: the files are tiny, and it means a test may rewrite the
 * scenario at any point between two calls without any cache to invalidate. */
static void load_scenario(void) {
    g_entries = 0;
    const char *path = getenv("FAKE_NVML_SCENARIO");
    if (!path || !*path) return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[KEY_LEN + VAL_LEN + 16];
    while (fgets(line, sizeof line, f) && g_entries < MAX_ENTRIES) {
        char *s = trim(line);
        if (*s == '\0' || *s == '#') continue;
        char *eq = strchr(s, '=');
        if (!eq) continue;
        *eq = '\0';
        snprintf(g_keys[g_entries], KEY_LEN, "%s", trim(s));
        snprintf(g_vals[g_entries], VAL_LEN, "%s", trim(eq + 1));
        g_entries++;
    }
    fclose(f);
}

/* The last assignment wins, like a shell script. */
static const char *get(const char *fmt, ...) {
    char key[KEY_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(key, sizeof key, fmt, ap);
    va_end(ap);
    for (int i = g_entries - 1; i >= 0; i--)
        if (strcmp(g_keys[i], key) == 0) return g_vals[i];
    return NULL;
}

static int has_prefix(const char *fmt, ...) {
    char prefix[KEY_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    size_t n = strlen(prefix);
    for (int i = 0; i < g_entries; i++)
        if (strncmp(g_keys[i], prefix, n) == 0) return 1;
    return 0;
}

static unsigned long long to_ull(const char *v) {
    if (strcmp(v, "NA") == 0) return NVML_VALUE_NOT_AVAILABLE_ULL;
    return strtoull(v, NULL, 0);
}

static const struct { const char *name; int code; } g_error_names[] = {
    {"SUCCESS", 0}, {"UNINITIALIZED", 1}, {"INVALID_ARGUMENT", 2}, {"NOT_SUPPORTED", 3},
    {"NO_PERMISSION", 4}, {"ALREADY_INITIALIZED", 5}, {"NOT_FOUND", 6},
    {"INSUFFICIENT_SIZE", 7}, {"INSUFFICIENT_POWER", 8}, {"DRIVER_NOT_LOADED", 9},
    {"TIMEOUT", 10}, {"IRQ_ISSUE", 11}, {"LIBRARY_NOT_FOUND", 12},
    {"FUNCTION_NOT_FOUND", 13}, {"CORRUPTED_INFOROM", 14}, {"GPU_IS_LOST", 15},
    {"RESET_REQUIRED", 16}, {"OPERATING_SYSTEM", 17}, {"LIB_RM_VERSION_MISMATCH", 18},
    {"IN_USE", 19}, {"MEMORY", 20}, {"NO_DATA", 21}, {"UNKNOWN", 999},
};

static int error_code(const char *v) {
    for (size_t i = 0; i < sizeof g_error_names / sizeof g_error_names[0]; i++)
        if (strcmp(v, g_error_names[i].name) == 0) return g_error_names[i].code;
    return (int)strtol(v, NULL, 0); /* a number is taken as the code itself */
}

/* Scripted error for `fn` on device `d` (NULL: a call without a device), or -1.
 * A key names the exact symbol or the name without its _vN suffix
 * (nvmlDeviceGetCount_v2 -> nvmlDeviceGetCount). Tried in this order:
 *   MIG handle: gpu.I.mig.J.error.FN, gpu.I.mig.J.error.*, gpu.I.error.* (a lost
 *               parent takes its instances with it)
 *   GPU handle: gpu.I.error.FN, gpu.I.error.*
 *   any call:   error.FN */
static int scripted_error(const char *fn, const struct fake_device *d) {
    char base[KEY_LEN];
    snprintf(base, sizeof base, "%s", fn);
    char *v = strstr(base, "_v");
    if (v && v[2] >= '0' && v[2] <= '9') *v = '\0';
    const char *val = NULL;
    if (d && d->mig >= 0) {
        if (!val) val = get("gpu.%d.mig.%d.error.%s", d->gpu, d->mig, fn);
        if (!val) val = get("gpu.%d.mig.%d.error.%s", d->gpu, d->mig, base);
        if (!val) val = get("gpu.%d.mig.%d.error.*", d->gpu, d->mig);
        if (!val) val = get("gpu.%d.error.*", d->gpu);
    } else if (d) {
        if (!val) val = get("gpu.%d.error.%s", d->gpu, fn);
        if (!val) val = get("gpu.%d.error.%s", d->gpu, base);
        if (!val) val = get("gpu.%d.error.*", d->gpu);
    }
    if (!val) val = get("error.%s", fn);
    if (!val) val = get("error.%s", base);
    return val ? error_code(val) : -1;
}

static void call_log(const char *fn, const struct fake_device *d, const char *detail) {
    const char *path = getenv("FAKE_NVML_CALL_LOG");
    if (!path || !*path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    if (!d) fprintf(f, "%s -", fn);
    else if (d->mig < 0) fprintf(f, "%s gpu%d", fn, d->gpu);
    else fprintf(f, "%s gpu%d/mig%d", fn, d->gpu, d->mig);
    if (detail) fprintf(f, " %s", detail);
    fputc('\n', f);
    fclose(f);
}

static int gpu_count(void) {
    const char *v = get("gpu.count");
    if (v) return (int)strtol(v, NULL, 0);
    int n = 0;
    for (int i = 0; i < MAX_GPUS; i++)
        if (has_prefix("gpu.%d.", i)) n = i + 1;
    return n;
}

static int mig_enabled(int gpu) {
    const char *v = get("gpu.%d.mig.enabled", gpu);
    return v && strtol(v, NULL, 0) != 0;
}

static int mig_exists(int gpu, int slot) {
    return mig_enabled(gpu) && slot >= 0 && slot < MAX_MIGS && has_prefix("gpu.%d.mig.%d.", gpu, slot);
}

/* Key prefix of a device: "gpu.I" or "gpu.I.mig.J". */
static void prefix_of(const struct fake_device *d, char *out, size_t n) {
    if (d->mig < 0) snprintf(out, n, "gpu.%d", d->gpu);
    else snprintf(out, n, "gpu.%d.mig.%d", d->gpu, d->mig);
}

static int valid_device(const struct fake_device *d) {
    const struct fake_device *first = &g_handles[0][0];
    const struct fake_device *last = &g_handles[MAX_GPUS - 1][MAX_MIGS];
    if (d < first || d > last) return 0;
    if (d->gpu >= gpu_count()) return 0;
    return d->mig < 0 || mig_exists(d->gpu, d->mig);
}

/* Common entry of every exported device call: reload, log, check init, check the
 * handle, then any scripted error. Returns the code to return, or -1 to go on. */
static int enter(const char *fn, const struct fake_device *d, int needs_device,
                 const char *detail) {
    load_scenario();
    call_log(fn, d, detail);
    if (g_init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (needs_device && (!d || !valid_device(d))) return NVML_ERROR_INVALID_ARGUMENT;
    return scripted_error(fn, d);
}

#define ENTER(fn, d)                            \
    do {                                        \
        int rc_ = enter(fn, d, 1, NULL);              \
        if (rc_ >= 0) return (nvmlReturn_t)rc_; \
    } while (0)

/* A numeric reading of a device; NOT_SUPPORTED when the scenario does not set it. */
static nvmlReturn_t reading(const struct fake_device *d, const char *name, unsigned long long *out) {
    char prefix[64];
    prefix_of(d, prefix, sizeof prefix);
    const char *v = get("%s.%s", prefix, name);
    if (!v) return NVML_ERROR_NOT_SUPPORTED;
    *out = to_ull(v);
    return NVML_SUCCESS;
}

static unsigned long long now_us(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (unsigned long long)tv.tv_sec * 1000000ULL + (unsigned long long)tv.tv_usec;
}

/* ------------------------------------------------------------------ init */

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    char detail[32];
    snprintf(detail, sizeof detail, "flags=%u", flags);
    load_scenario();
    call_log("nvmlInitWithFlags", NULL, detail);
    int rc = scripted_error("nvmlInitWithFlags", NULL);
    if (rc >= 0 && rc != NVML_SUCCESS) return rc;
    for (int i = 0; i < MAX_GPUS; i++)
        for (int j = 0; j <= MAX_MIGS; j++) {
            g_handles[i][j].gpu = i;
            g_handles[i][j].mig = j - 1;
        }
    g_init_count++;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    call_log("nvmlShutdown", NULL, NULL);
    if (g_init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    g_init_count--;
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    for (size_t i = 0; i < sizeof g_error_names / sizeof g_error_names[0]; i++)
        if (g_error_names[i].code == result) return g_error_names[i].name;
    return "fake NVML: unknown error code";
}

/* ------------------------------------------------------------------ enumeration */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    int rc = enter("nvmlDeviceGetCount_v2", NULL, 0, NULL);
    if (rc >= 0) return rc;
    *count = (unsigned int)gpu_count();
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    char detail[32];
    snprintf(detail, sizeof detail, "index=%u", index);
    load_scenario();
    call_log("nvmlDeviceGetHandleByIndex_v2", NULL, detail);
    if (g_init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (index >= (unsigned int)gpu_count() || index >= MAX_GPUS) return NVML_ERROR_INVALID_ARGUMENT;
    int rc = scripted_error("nvmlDeviceGetHandleByIndex_v2", &g_handles[index][0]);
    if (rc >= 0) return rc;
    *device = &g_handles[index][0];
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_string(const char *s, char *buf, unsigned int len) {
    if (strlen(s) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, s, strlen(s) + 1);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) {
    ENTER("nvmlDeviceGetUUID", d);
    char prefix[64], fallback[64];
    prefix_of(d, prefix, sizeof prefix);
    const char *v = get("%s.uuid", prefix);
    if (!v) {
        if (d->mig < 0)
            snprintf(fallback, sizeof fallback, "GPU-00000000-0000-0000-0000-%012d", d->gpu);
        else
            snprintf(fallback, sizeof fallback, "MIG-00000000-0000-0000-%04d-%012d", d->gpu, d->mig);
        v = fallback;
    }
    return copy_string(v, uuid, len);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) {
    ENTER("nvmlDeviceGetName", d);
    char prefix[64];
    prefix_of(d, prefix, sizeof prefix);
    const char *v = get("%s.name", prefix);
    return copy_string(v ? v : "Fake NVIDIA GPU", name, len);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index) {
    ENTER("nvmlDeviceGetIndex", d);
    if (d->mig >= 0) return NVML_ERROR_NOT_SUPPORTED;
    *index = (unsigned int)d->gpu;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ readings */

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    ENTER("nvmlDeviceGetUtilizationRates", d);
    /* nvml.h: not supported on MIG-enabled GPUs (nor on MIG handles). */
    if (mig_enabled(d->gpu)) return NVML_ERROR_NOT_SUPPORTED;
    unsigned long long gpu, mem;
    if (reading(d, "utilization.gpu", &gpu) || reading(d, "utilization.memory", &mem))
        return NVML_ERROR_NOT_SUPPORTED;
    u->gpu = (unsigned int)gpu;
    u->memory = (unsigned int)mem;
    return NVML_SUCCESS;
}

static nvmlReturn_t memory_values(const struct fake_device *d, unsigned long long *total,
                                  unsigned long long *reserved, unsigned long long *used,
                                  unsigned long long *free_) {
    if (reading(d, "memory.total", total) || reading(d, "memory.used", used))
        return NVML_ERROR_NOT_SUPPORTED;
    if (reading(d, "memory.reserved", reserved)) *reserved = 0;
    if (reading(d, "memory.free", free_)) *free_ = *total - *reserved - *used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    ENTER("nvmlDeviceGetMemoryInfo", d);
    unsigned long long total, reserved, used, free_;
    if (memory_values(d, &total, &reserved, &used, &free_)) return NVML_ERROR_NOT_SUPPORTED;
    m->total = total;
    m->used = used + reserved; /* v1's "used" includes the driver-reserved part */
    m->free = free_;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    ENTER("nvmlDeviceGetMemoryInfo_v2", d);
    if (m->version != MEMORY_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long total, reserved, used, free_;
    if (memory_values(d, &total, &reserved, &used, &free_)) return NVML_ERROR_NOT_SUPPORTED;
    m->total = total;
    m->reserved = reserved;
    m->used = used;
    m->free = free_;
    return NVML_SUCCESS;
}

static nvmlReturn_t uint_reading(nvmlDevice_t d, const char *name, unsigned int *out) {
    unsigned long long v;
    nvmlReturn_t rc = reading(d, name, &v);
    if (rc == NVML_SUCCESS) *out = (unsigned int)v;
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    ENTER("nvmlDeviceGetPowerUsage", d);
    return uint_reading(d, "power.usage_mw", mw);
}

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *mw) {
    ENTER("nvmlDeviceGetEnforcedPowerLimit", d);
    return uint_reading(d, "power.limit_mw", mw);
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *mj) {
    ENTER("nvmlDeviceGetTotalEnergyConsumption", d);
    return reading(d, "energy_mj", mj);
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, unsigned int type, unsigned int *mhz) {
    ENTER("nvmlDeviceGetClockInfo", d);
    static const char *names[] = {"clock.graphics", "clock.sm", "clock.memory", "clock.video"};
    if (type >= 4) return NVML_ERROR_INVALID_ARGUMENT;
    return uint_reading(d, names[type], mhz);
}

/* ------------------------------------------------------------------ processes */

static int count_entries(const struct fake_device *d, const char *list) {
    char prefix[64];
    prefix_of(d, prefix, sizeof prefix);
    int n = 0;
    while (get("%s.%s.%d.pid", prefix, list, n)) n++;
    return n;
}

static unsigned long long entry(const struct fake_device *d, const char *list, int k,
                                const char *field, unsigned long long fallback) {
    char prefix[64];
    prefix_of(d, prefix, sizeof prefix);
    const char *v = get("%s.%s.%d.%s", prefix, list, k, field);
    return v ? to_ull(v) : fallback;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count,
                                                            nvmlProcessInfo_t *infos) {
    ENTER("nvmlDeviceGetComputeRunningProcesses_v3", d);
    unsigned int n = (unsigned int)count_entries(d, "process");
    if (*count < n || (n > 0 && !infos)) {
        *count = n;
        return n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int k = 0; k < n; k++) {
        infos[k].pid = (unsigned int)entry(d, "process", (int)k, "pid", 0);
        infos[k].usedGpuMemory = entry(d, "process", (int)k, "memory", NVML_VALUE_NOT_AVAILABLE_ULL);
        infos[k].gpuInstanceId = (unsigned int)entry(d, "process", (int)k, "gi", 0xFFFFFFFFu);
        infos[k].computeInstanceId = (unsigned int)entry(d, "process", (int)k, "ci", 0xFFFFFFFFu);
    }
    *count = n;
    return NVML_SUCCESS;
}

/* Utilization samples newer than `last_seen`, as indices into gpu.I.putil.K. */
static int fresh_samples(const struct fake_device *d, unsigned long long last_seen, int *idx, int cap) {
    int n = 0, total = count_entries(d, "putil");
    unsigned long long now = now_us();
    for (int k = 0; k < total && n < cap; k++)
        if (entry(d, "putil", k, "ts", now) > last_seen) idx[n++] = k;
    return n;
}

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d,
                                                    nvmlProcessUtilizationSample_t *samples,
                                                    unsigned int *count,
                                                    unsigned long long last_seen) {
    char detail[48];
    snprintf(detail, sizeof detail, "lastSeen=%llu", last_seen);
    int rc = enter("nvmlDeviceGetProcessUtilization", d, 1, detail);
    if (rc >= 0) return rc;
    if (mig_enabled(d->gpu)) return NVML_ERROR_NOT_SUPPORTED;
    int idx[64];
    int n = fresh_samples(d, last_seen, idx, 64);
    if (n == 0) return NVML_ERROR_NOT_FOUND;
    if (!samples || *count < (unsigned int)n) {
        *count = (unsigned int)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned long long now = now_us();
    for (int i = 0; i < n; i++) {
        samples[i].pid = (unsigned int)entry(d, "putil", idx[i], "pid", 0);
        samples[i].timeStamp = entry(d, "putil", idx[i], "ts", now);
        samples[i].smUtil = (unsigned int)entry(d, "putil", idx[i], "sm", 0);
        samples[i].memUtil = (unsigned int)entry(d, "putil", idx[i], "mem", 0);
        samples[i].encUtil = (unsigned int)entry(d, "putil", idx[i], "enc", 0);
        samples[i].decUtil = (unsigned int)entry(d, "putil", idx[i], "dec", 0);
    }
    *count = (unsigned int)n;
    return NVML_SUCCESS;
}

#ifndef NO_PROCESSES_UTILIZATION_INFO
EXPORT nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t d,
                                                          nvmlProcessesUtilizationInfo_t *info) {
    char detail[48];
    snprintf(detail, sizeof detail, "lastSeen=%llu", info->lastSeenTimeStamp);
    int rc = enter("nvmlDeviceGetProcessesUtilizationInfo", d, 1, detail);
    if (rc >= 0) return rc;
    if (info->version != PROCESSES_UTILIZATION_INFO_V1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (mig_enabled(d->gpu)) return NVML_ERROR_NOT_SUPPORTED;
    int idx[64];
    int n = fresh_samples(d, info->lastSeenTimeStamp, idx, 64);
    if (n == 0) return NVML_ERROR_NOT_FOUND;
    if (!info->procUtilArray || info->processSamplesCount < (unsigned int)n) {
        info->processSamplesCount = (unsigned int)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned long long now = now_us(), newest = 0;
    for (int i = 0; i < n; i++) {
        nvmlProcessUtilizationInfo_v1_t *s = &info->procUtilArray[i];
        s->timeStamp = entry(d, "putil", idx[i], "ts", now);
        s->pid = (unsigned int)entry(d, "putil", idx[i], "pid", 0);
        s->smUtil = (unsigned int)entry(d, "putil", idx[i], "sm", 0);
        s->memUtil = (unsigned int)entry(d, "putil", idx[i], "mem", 0);
        s->encUtil = (unsigned int)entry(d, "putil", idx[i], "enc", 0);
        s->decUtil = (unsigned int)entry(d, "putil", idx[i], "dec", 0);
        s->jpgUtil = 0;
        s->ofaUtil = 0;
        if (s->timeStamp > newest) newest = s->timeStamp;
    }
    info->processSamplesCount = (unsigned int)n;
    info->lastSeenTimeStamp = newest; /* pynvml drops this; the source keeps its own */
    return NVML_SUCCESS;
}
#endif

/* ------------------------------------------------------------------ MIG */

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    ENTER("nvmlDeviceGetMigMode", d);
    const char *v = get("gpu.%d.mig.enabled", d->gpu);
    if (!v || d->mig >= 0) return NVML_ERROR_NOT_SUPPORTED; /* not a MIG-capable GPU */
    *current = *pending = (unsigned int)strtoul(v, NULL, 0);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count) {
    ENTER("nvmlDeviceGetMaxMigDeviceCount", d);
    if (d->mig >= 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (!get("gpu.%d.mig.enabled", d->gpu)) return NVML_ERROR_NOT_SUPPORTED;
    const char *v = get("gpu.%d.mig.max", d->gpu);
    *count = v ? (unsigned int)strtoul(v, NULL, 0) : (mig_enabled(d->gpu) ? 7u : 0u);
    if (*count > MAX_MIGS) *count = MAX_MIGS;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index,
                                                        nvmlDevice_t *mig) {
    ENTER("nvmlDeviceGetMigDeviceHandleByIndex", d);
    if (d->mig >= 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (!mig_exists(d->gpu, (int)index)) return NVML_ERROR_NOT_FOUND; /* an empty slot */
    *mig = &g_handles[d->gpu][index + 1];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id) {
    ENTER("nvmlDeviceGetGpuInstanceId", d);
    if (d->mig < 0) return NVML_ERROR_INVALID_ARGUMENT;
    return uint_reading(d, "gi", id);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id) {
    ENTER("nvmlDeviceGetComputeInstanceId", d);
    if (d->mig < 0) return NVML_ERROR_INVALID_ARGUMENT;
    return uint_reading(d, "ci", id);
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is_mig) {
    ENTER("nvmlDeviceIsMigDeviceHandle", d);
    *is_mig = d->mig >= 0;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ GPM */

EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t d, nvmlGpmSupport_t *support) {
    ENTER("nvmlGpmQueryDeviceSupport", d);
    if (support->version != 1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    const char *v = get("gpu.%d.gpm.supported", d->gpu);
    if (d->mig >= 0) {
        const char *mv = get("gpu.%d.mig.%d.gpm.supported", d->gpu, d->mig);
        if (mv) v = mv;
    }
    support->isSupportedDevice = v ? (unsigned int)strtoul(v, NULL, 0) : 0u;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *out) {
    int rc = enter("nvmlGpmSampleAlloc", NULL, 0, NULL);
    if (rc >= 0) return rc;
    nvmlGpmSample_t s = calloc(1, sizeof *s);
    if (!s) return NVML_ERROR_MEMORY;
    s->magic = GPM_MAGIC;
    *out = s;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t s) {
    int rc = enter("nvmlGpmSampleFree", NULL, 0, NULL);
    if (rc >= 0) return rc;
    if (!s || s->magic != GPM_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    s->magic = 0;
    free(s);
    return NVML_SUCCESS;
}

/* A sample remembers the scripted gpm.metric.<id> values of its device at the
 * moment it was taken; nvmlGpmMetricsGet reports the later sample's values. */
static void capture(nvmlGpmSample_t s, const struct fake_device *d) {
    char prefix[64];
    prefix_of(d, prefix, sizeof prefix);
    size_t plen = strlen(prefix);
    s->gpu = d->gpu;
    s->mig = d->mig;
    s->seq = ++g_gpm_seq;
    s->n = 0;
    for (int i = 0; i < g_entries && s->n < GPM_MAX_CAPTURED; i++) {
        const char *k = g_keys[i];
        if (strncmp(k, prefix, plen) != 0 || strncmp(k + plen, ".gpm.metric.", 12) != 0) continue;
        unsigned int id = (unsigned int)strtoul(k + plen + 12, NULL, 10);
        int slot = s->n;
        for (int j = 0; j < s->n; j++)
            if (s->ids[j] == id) slot = j; /* a later line overrides */
        s->ids[slot] = id;
        s->values[slot] = strtod(g_vals[i], NULL);
        if (slot == s->n) s->n++;
    }
}

EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t d, nvmlGpmSample_t s) {
    ENTER("nvmlGpmSampleGet", d);
    if (!s || s->magic != GPM_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    const char *v = get("gpu.%d.gpm.supported", d->gpu);
    if (!v || strtol(v, NULL, 0) == 0) return NVML_ERROR_NOT_SUPPORTED;
    capture(s, d);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t d, unsigned int gpu_instance_id, nvmlGpmSample_t s) {
    char detail[32];
    snprintf(detail, sizeof detail, "gi=%u", gpu_instance_id);
    int rc = enter("nvmlGpmMigSampleGet", d, 1, detail);
    if (rc >= 0) return rc;
    if (!s || s->magic != GPM_MAGIC || d->mig >= 0) return NVML_ERROR_INVALID_ARGUMENT;
    const char *v = get("gpu.%d.gpm.supported", d->gpu);
    if (!v || strtol(v, NULL, 0) == 0 || !mig_enabled(d->gpu)) return NVML_ERROR_NOT_SUPPORTED;
    for (int j = 0; j < MAX_MIGS; j++) {
        const char *gi = get("gpu.%d.mig.%d.gi", d->gpu, j);
        if (mig_exists(d->gpu, j) && gi && strtoul(gi, NULL, 0) == gpu_instance_id) {
            capture(s, &g_handles[d->gpu][j + 1]);
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *m) {
    nvmlGpmSample_t a = m->sample1, b = m->sample2;
    struct fake_device dev = {b ? b->gpu : -1, b ? b->mig : -1};
    char detail[32];
    snprintf(detail, sizeof detail, "n=%u", m->numMetrics);
    /* Logged and scripted per device (the one sample2 was taken on). */
    int rc = enter("nvmlGpmMetricsGet", b ? &dev : NULL, 0, detail);
    if (rc >= 0) return rc;
    if (m->version != 1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    /* Catch a caller that swaps the samples, mixes devices or reuses one sample. */
    if (!a || !b || a->magic != GPM_MAGIC || b->magic != GPM_MAGIC || a->seq == 0 ||
        b->seq <= a->seq || a->gpu != b->gpu || a->mig != b->mig)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < m->numMetrics; i++) {
        nvmlGpmMetric_t *out = &m->metrics[i];
        out->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        out->value = 0.0;
        for (int j = 0; j < b->n; j++)
            if (b->ids[j] == out->metricId) {
                out->nvmlReturn = NVML_SUCCESS;
                out->value = b->values[j];
            }
        out->metricInfo.shortName = out->metricInfo.longName = out->metricInfo.unit = NULL;
    }
    return NVML_SUCCESS;
}
