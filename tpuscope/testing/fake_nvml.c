/*
 * A fake libnvidia-ml.so.1, so the NVML collector can be tested at the real
 * C-library boundary (pynvml loads "libnvidia-ml.so.1" with ctypes.CDLL) on a
 * machine without an NVIDIA GPU or driver. Put the directory holding the built
 * library first on LD_LIBRARY_PATH of a subprocess; see fake_nvml.py.
 *
 * Only the entry points pynvml (nvidia-ml-py 13.x) calls for our collector are
 * exported, with the C ABI of nvml.h. Their answers come from a plain-text
 * state file named by $TPUSCOPE_FAKE_NVML_STATE, so a test can change them
 * while the process under test runs (write a temp file, then rename it over):
 *
 *   devices 2                      number of GPUs (max 16)
 *   name 0 NVIDIA H100 80GB HBM3    per-device name (rest of the line)
 *   uuid 0 GPU-...                  per-device UUID (rest of the line)
 *   utilization 0 75 40             gpu% memory%
 *   memory 0 1000000 85899345920    used_bytes total_bytes
 *   power 0 350000                  milliwatts
 *   temperature 0 65                Celsius
 *   clocks 0 1980 2619              sm_mhz mem_mhz
 *   max_clocks 0 1980 2619          sm_mhz mem_mhz (nvmlDeviceGetMaxClockInfo)
 *   clocks_event_reasons 0 0x40     the reasons bit mask, as nvml.h's nvmlClocksEventReason*
 *                                   bits (both the Event and the older Throttle entry point)
 *   xid 0 79 1                      device xid sequence: each distinct line is
 *                                   delivered once per process as an event
 *   fail init 9                     nvmlInit* returns this nvmlReturn_t
 *   fail device 15 [index]          per-device queries return this code (on
 *                                   every device, or only on [index])
 *   hang_ms 5000                    per-device queries sleep this long first
 *   notsupported power              that query returns NVML_ERROR_NOT_SUPPORTED;
 *                                   power temperature clocks utilization memory events
 *                                   max_clocks clocks_event_reasons
 *
 * A driver without an entry point (one older than the function) cannot be
 * expressed in the state file, since the symbol has to be missing from the
 * library: compile with -DFAKE_NVML_OMIT_<function name> to leave it out
 * (fake_nvml.build's `omit`).
 *
 * The file is re-read at every nvmlInit*, nvmlDeviceGetCount*, and every
 * event-wait poll, and before any other call whenever its identity (inode,
 * size, mtime) changed. A missing or unreadable file means one healthy GPU
 * with default values.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

typedef int nvmlReturn_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_MEMORY 20

#define NVML_TEMPERATURE_GPU 0
#define NVML_CLOCK_GRAPHICS 0
#define NVML_CLOCK_SM 1
#define NVML_CLOCK_MEM 2

#define NVML_EVENT_TYPE_XID_CRITICAL_ERROR 0x0000000000000008ULL

#define NVML_MEMORY_V2_VERSION 0x02000028u      /* sizeof(nvmlMemory_v2_t) | 2 << 24 */
#define NVML_TEMPERATURE_V1_VERSION 0x0100000Cu /* sizeof(nvmlTemperature_v1_t) | 1 << 24 */

#define MAX_DEVICES 16
#define MAX_XIDS 1024
#define MAX_DELIVERED 8192
#define TEXT_LEN 96
#define POLL_MS 10

/* Not-supported query bits. */
#define NS_POWER 0x01u
#define NS_TEMPERATURE 0x02u
#define NS_CLOCKS 0x04u
#define NS_UTILIZATION 0x08u
#define NS_MEMORY 0x10u
#define NS_EVENTS 0x20u
#define NS_MAX_CLOCKS 0x40u
#define NS_CLOCKS_EVENT_REASONS 0x80u

/* ---- public types, laid out as in nvml.h and pynvml ---- */

struct nvmlDevice_st {
    unsigned int index;
};
typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int version;
    unsigned int sensorType;
    int temperature;
} nvmlTemperature_v1_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

struct nvmlEventSet_st {
    unsigned long long registered[MAX_DEVICES];
};
typedef struct nvmlEventSet_st *nvmlEventSet_t;

/* ---- state ---- */

typedef struct {
    char name[TEXT_LEN];
    char uuid[TEXT_LEN];
    unsigned int util_gpu, util_mem;
    unsigned long long mem_used, mem_total;
    unsigned int power_mw;
    unsigned int temperature_c;
    unsigned int clock_sm, clock_mem;
    unsigned int clock_sm_max, clock_mem_max;
    unsigned long long clocks_event_reasons;
} fake_gpu_t;

typedef struct {
    unsigned int device, xid;
    unsigned long long seq;
} xid_line_t;

typedef struct {
    unsigned int count;
    fake_gpu_t gpu[MAX_DEVICES];
    int fail_init;           /* 0 = none */
    int fail_device;         /* 0 = none */
    int fail_device_index;   /* -1 = every device */
    unsigned int hang_ms;
    unsigned int not_supported;
    unsigned int n_xids;
    xid_line_t xids[MAX_XIDS];
} fake_state_t;

typedef struct {
    int exists;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtim;
    char path[4096];
} file_stamp_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct nvmlDevice_st g_handles[MAX_DEVICES] = {
    {0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15},
};
static fake_state_t g_state;
static fake_state_t g_scratch; /* parsed into, then copied, under g_lock */
static int g_loaded;
static file_stamp_t g_stamp;
static unsigned int g_init_refcount;
static xid_line_t g_delivered[MAX_DELIVERED];
static unsigned int g_n_delivered;

static void defaults(fake_state_t *s)
{
    memset(s, 0, sizeof(*s));
    s->count = 1;
    s->fail_device_index = -1;
    for (unsigned int i = 0; i < MAX_DEVICES; i++) {
        snprintf(s->gpu[i].name, TEXT_LEN, "NVIDIA Fake GPU");
        snprintf(s->gpu[i].uuid, TEXT_LEN, "GPU-fa4e0000-0000-4000-8000-%012x", i);
    }
}

static char *trim(char *text)
{
    while (*text == ' ' || *text == '\t')
        text++;
    size_t n = strlen(text);
    while (n > 0 && (text[n - 1] == ' ' || text[n - 1] == '\t' || text[n - 1] == '\r' || text[n - 1] == '\n'))
        text[--n] = '\0';
    return text;
}

/* "<keyword> <index> <rest of line>": the device, and where the rest begins. */
static fake_gpu_t *device_line(fake_state_t *s, const char *line, const char **rest)
{
    unsigned int index;
    int used = 0;
    if (sscanf(line, "%*s %u %n", &index, &used) < 1 || used == 0 || index >= MAX_DEVICES)
        return NULL;
    *rest = line + used;
    return &s->gpu[index];
}

static void parse_line(fake_state_t *s, char *line)
{
    char *hash = strchr(line, '#');
    if (hash != NULL)
        *hash = '\0';
    line = trim(line);
    char word[32];
    if (sscanf(line, "%31s", word) != 1)
        return;

    const char *rest = NULL;
    fake_gpu_t *gpu = NULL;
    unsigned int a, b, c;
    unsigned long long x, y;
    int code, index;

    if (strcmp(word, "devices") == 0) {
        if (sscanf(line, "%*s %u", &a) == 1)
            s->count = a > MAX_DEVICES ? MAX_DEVICES : a;
    } else if (strcmp(word, "name") == 0 || strcmp(word, "uuid") == 0) {
        if ((gpu = device_line(s, line, &rest)) != NULL && *rest != '\0')
            snprintf(word[0] == 'n' ? gpu->name : gpu->uuid, TEXT_LEN, "%s", rest);
    } else if (strcmp(word, "utilization") == 0) {
        if ((gpu = device_line(s, line, &rest)) != NULL && sscanf(rest, "%u %u", &a, &b) == 2) {
            gpu->util_gpu = a;
            gpu->util_mem = b;
        }
    } else if (strcmp(word, "memory") == 0) {
        if ((gpu = device_line(s, line, &rest)) != NULL && sscanf(rest, "%llu %llu", &x, &y) == 2) {
            gpu->mem_used = x;
            gpu->mem_total = y;
        }
    } else if (strcmp(word, "power") == 0) {
        if ((gpu = device_line(s, line, &rest)) != NULL && sscanf(rest, "%u", &a) == 1)
            gpu->power_mw = a;
    } else if (strcmp(word, "temperature") == 0) {
        if ((gpu = device_line(s, line, &rest)) != NULL && sscanf(rest, "%u", &a) == 1)
            gpu->temperature_c = a;
    } else if (strcmp(word, "clocks") == 0) {
        if ((gpu = device_line(s, line, &rest)) != NULL && sscanf(rest, "%u %u", &a, &b) == 2) {
            gpu->clock_sm = a;
            gpu->clock_mem = b;
        }
    } else if (strcmp(word, "max_clocks") == 0) {
        if ((gpu = device_line(s, line, &rest)) != NULL && sscanf(rest, "%u %u", &a, &b) == 2) {
            gpu->clock_sm_max = a;
            gpu->clock_mem_max = b;
        }
    } else if (strcmp(word, "clocks_event_reasons") == 0) {
        if ((gpu = device_line(s, line, &rest)) != NULL && sscanf(rest, "%llx", &x) == 1)
            gpu->clocks_event_reasons = x;
    } else if (strcmp(word, "xid") == 0) {
        if (sscanf(line, "%*s %u %u %llu", &a, &b, &x) == 3 && s->n_xids < MAX_XIDS) {
            s->xids[s->n_xids].device = a;
            s->xids[s->n_xids].xid = b;
            s->xids[s->n_xids].seq = x;
            s->n_xids++;
        }
    } else if (strcmp(word, "fail") == 0) {
        char what[16];
        int n = sscanf(line, "%*s %15s %d %d", what, &code, &index);
        if (n >= 2 && strcmp(what, "init") == 0) {
            s->fail_init = code;
        } else if (n >= 2 && strcmp(what, "device") == 0) {
            s->fail_device = code;
            s->fail_device_index = n == 3 ? index : -1;
        }
    } else if (strcmp(word, "hang_ms") == 0) {
        if (sscanf(line, "%*s %u", &c) == 1)
            s->hang_ms = c;
    } else if (strcmp(word, "notsupported") == 0) {
        char what[32];
        if (sscanf(line, "%*s %31s", what) == 1) {
            if (strcmp(what, "power") == 0)
                s->not_supported |= NS_POWER;
            else if (strcmp(what, "temperature") == 0)
                s->not_supported |= NS_TEMPERATURE;
            else if (strcmp(what, "clocks") == 0)
                s->not_supported |= NS_CLOCKS;
            else if (strcmp(what, "utilization") == 0)
                s->not_supported |= NS_UTILIZATION;
            else if (strcmp(what, "memory") == 0)
                s->not_supported |= NS_MEMORY;
            else if (strcmp(what, "events") == 0)
                s->not_supported |= NS_EVENTS;
            else if (strcmp(what, "max_clocks") == 0)
                s->not_supported |= NS_MAX_CLOCKS;
            else if (strcmp(what, "clocks_event_reasons") == 0)
                s->not_supported |= NS_CLOCKS_EVENT_REASONS;
        }
    }
}

static void stamp_of(file_stamp_t *stamp, const char *path)
{
    struct stat st;
    memset(stamp, 0, sizeof(*stamp));
    snprintf(stamp->path, sizeof(stamp->path), "%s", path != NULL ? path : "");
    if (path != NULL && stat(path, &st) == 0) {
        stamp->exists = 1;
        stamp->dev = st.st_dev;
        stamp->ino = st.st_ino;
        stamp->size = st.st_size;
        stamp->mtim = st.st_mtim;
    }
}

static int same_stamp(const file_stamp_t *a, const file_stamp_t *b)
{
    return a->exists == b->exists && strcmp(a->path, b->path) == 0 &&
           (!a->exists || (a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
                           a->mtim.tv_sec == b->mtim.tv_sec && a->mtim.tv_nsec == b->mtim.tv_nsec));
}

/* Re-read the state file into g_state; the caller holds g_lock. */
static void reload(int always)
{
    const char *path = getenv("TPUSCOPE_FAKE_NVML_STATE");
    file_stamp_t stamp;
    stamp_of(&stamp, path);
    if (!always && g_loaded && same_stamp(&stamp, &g_stamp))
        return;
    defaults(&g_scratch);
    FILE *file = (path != NULL && *path != '\0') ? fopen(path, "r") : NULL;
    if (file != NULL) {
        char line[512];
        while (fgets(line, sizeof(line), file) != NULL)
            parse_line(&g_scratch, line);
        fclose(file);
    }
    memcpy(&g_state, &g_scratch, sizeof(g_state));
    g_stamp = stamp;
    g_loaded = 1;
}

static void sleep_ms(unsigned int ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int is_handle(nvmlDevice_t device)
{
    return device != NULL && device >= &g_handles[0] && device < &g_handles[MAX_DEVICES];
}

/*
 * Start of every per-device query: sleeps hang_ms (without the lock, so other
 * threads and event waits go on), then returns with g_lock held and
 * NVML_SUCCESS, or without it and the error to return.
 */
static nvmlReturn_t begin_query(nvmlDevice_t device, unsigned int not_supported_bit, int hang)
{
    pthread_mutex_lock(&g_lock);
    if (g_init_refcount == 0) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    reload(0);
    unsigned int hang_ms = hang ? g_state.hang_ms : 0;
    if (hang_ms > 0) {
        pthread_mutex_unlock(&g_lock);
        sleep_ms(hang_ms);
        pthread_mutex_lock(&g_lock);
        reload(0);
    }
    nvmlReturn_t ret = NVML_SUCCESS;
    if (!is_handle(device) || device->index >= g_state.count)
        ret = NVML_ERROR_INVALID_ARGUMENT;
    else if (g_state.fail_device != 0 &&
             (g_state.fail_device_index < 0 || (unsigned int)g_state.fail_device_index == device->index))
        ret = g_state.fail_device;
    else if ((g_state.not_supported & not_supported_bit) != 0)
        ret = NVML_ERROR_NOT_SUPPORTED;
    if (ret != NVML_SUCCESS)
        pthread_mutex_unlock(&g_lock);
    return ret;
}

static nvmlReturn_t end_query(nvmlReturn_t ret)
{
    pthread_mutex_unlock(&g_lock);
    return ret;
}

static nvmlReturn_t copy_text(char *out, unsigned int length, const char *text)
{
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

/* ---- initialisation ---- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    pthread_mutex_lock(&g_lock);
    reload(1);
    nvmlReturn_t ret = g_state.fail_init;
    if (ret == NVML_SUCCESS)
        g_init_refcount++;
    pthread_mutex_unlock(&g_lock);
    return ret;
}

nvmlReturn_t nvmlInit_v2(void)
{
    return nvmlInitWithFlags(0);
}

nvmlReturn_t nvmlInit(void)
{
    return nvmlInitWithFlags(0);
}

nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t ret = NVML_SUCCESS;
    if (g_init_refcount == 0)
        ret = NVML_ERROR_UNINITIALIZED;
    else
        g_init_refcount--;
    pthread_mutex_unlock(&g_lock);
    return ret;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupt Request Issue";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 17: return "The operating system has blocked the request.";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    case 19: return "In use by another client";
    case 20: return "Insufficient Memory";
    case 21: return "No data";
    case 22: return "vGPU ECC not supported";
    case 23: return "Insufficient resources";
    case 24: return "Frequency not supported";
    case 25: return "Argument version mismatch";
    case 26: return "Deprecated";
    case 27: return "Not ready";
    case 28: return "GPU not found";
    case 29: return "Invalid state";
    case 30: return "Reset type not supported";
    case 999: return "Unknown Error";
    default: return "Unknown Error (fake NVML)";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    return copy_text(version, length, "999.99-fake");
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    return copy_text(version, length, "13.999.99-fake");
}

/* ---- enumeration ---- */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t ret = NVML_ERROR_UNINITIALIZED;
    if (g_init_refcount > 0) {
        reload(1);
        *count = g_state.count;
        ret = NVML_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return ret;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *count)
{
    return nvmlDeviceGetCount_v2(count);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t ret = NVML_ERROR_UNINITIALIZED;
    if (g_init_refcount > 0) {
        reload(0);
        ret = NVML_ERROR_INVALID_ARGUMENT;
        if (index < g_state.count) {
            *device = &g_handles[index];
            ret = NVML_SUCCESS;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return ret;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    nvmlReturn_t ret = begin_query(device, 0, 1);
    if (ret != NVML_SUCCESS)
        return ret;
    if (index == NULL)
        return end_query(NVML_ERROR_INVALID_ARGUMENT);
    *index = device->index;
    return end_query(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    nvmlReturn_t ret = begin_query(device, 0, 1);
    if (ret != NVML_SUCCESS)
        return ret;
    return end_query(copy_text(name, length, g_state.gpu[device->index].name));
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    nvmlReturn_t ret = begin_query(device, 0, 1);
    if (ret != NVML_SUCCESS)
        return ret;
    return end_query(copy_text(uuid, length, g_state.gpu[device->index].uuid));
}

/* ---- metrics ---- */

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    nvmlReturn_t ret = begin_query(device, NS_UTILIZATION, 1);
    if (ret != NVML_SUCCESS)
        return ret;
    if (utilization == NULL)
        return end_query(NVML_ERROR_INVALID_ARGUMENT);
    utilization->gpu = g_state.gpu[device->index].util_gpu;
    utilization->memory = g_state.gpu[device->index].util_mem;
    return end_query(NVML_SUCCESS);
}

static void memory_of(const fake_gpu_t *gpu, unsigned long long *total, unsigned long long *free_,
                      unsigned long long *used)
{
    *total = gpu->mem_total;
    *used = gpu->mem_used;
    *free_ = gpu->mem_total > gpu->mem_used ? gpu->mem_total - gpu->mem_used : 0;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    nvmlReturn_t ret = begin_query(device, NS_MEMORY, 1);
    if (ret != NVML_SUCCESS)
        return ret;
    if (memory == NULL)
        return end_query(NVML_ERROR_INVALID_ARGUMENT);
    memory_of(&g_state.gpu[device->index], &memory->total, &memory->free, &memory->used);
    return end_query(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    nvmlReturn_t ret = begin_query(device, NS_MEMORY, 1);
    if (ret != NVML_SUCCESS)
        return ret;
    if (memory == NULL)
        return end_query(NVML_ERROR_INVALID_ARGUMENT);
    if (memory->version != NVML_MEMORY_V2_VERSION)
        return end_query(25); /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
    memory->reserved = 0;
    memory_of(&g_state.gpu[device->index], &memory->total, &memory->free, &memory->used);
    return end_query(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    nvmlReturn_t ret = begin_query(device, NS_POWER, 1);
    if (ret != NVML_SUCCESS)
        return ret;
    if (power == NULL)
        return end_query(NVML_ERROR_INVALID_ARGUMENT);
    *power = g_state.gpu[device->index].power_mw;
    return end_query(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, unsigned int sensorType, unsigned int *temp)
{
    nvmlReturn_t ret = begin_query(device, NS_TEMPERATURE, 1);
    if (ret != NVML_SUCCESS)
        return ret;
    if (temp == NULL || sensorType != NVML_TEMPERATURE_GPU)
        return end_query(NVML_ERROR_INVALID_ARGUMENT);
    *temp = g_state.gpu[device->index].temperature_c;
    return end_query(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_v1_t *temperature)
{
    nvmlReturn_t ret = begin_query(device, NS_TEMPERATURE, 1);
    if (ret != NVML_SUCCESS)
        return ret;
    if (temperature == NULL || temperature->sensorType != NVML_TEMPERATURE_GPU)
        return end_query(NVML_ERROR_INVALID_ARGUMENT);
    if (temperature->version != NVML_TEMPERATURE_V1_VERSION)
        return end_query(25); /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
    temperature->temperature = (int)g_state.gpu[device->index].temperature_c;
    return end_query(NVML_SUCCESS);
}

/* A clock query, the current clocks' or the maximum ones (``max``): the same arguments and answers. */
static nvmlReturn_t clock_query(nvmlDevice_t device, unsigned int type, unsigned int *clock, int max)
{
    nvmlReturn_t ret = begin_query(device, max ? NS_MAX_CLOCKS : NS_CLOCKS, 1);
    if (ret != NVML_SUCCESS)
        return ret;
    if (clock == NULL)
        return end_query(NVML_ERROR_INVALID_ARGUMENT);
    if (type == NVML_CLOCK_SM || type == NVML_CLOCK_GRAPHICS)
        *clock = max ? g_state.gpu[device->index].clock_sm_max : g_state.gpu[device->index].clock_sm;
    else if (type == NVML_CLOCK_MEM)
        *clock = max ? g_state.gpu[device->index].clock_mem_max : g_state.gpu[device->index].clock_mem;
    else
        return end_query(NVML_ERROR_NOT_SUPPORTED); /* video clock, or out of range */
    return end_query(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, unsigned int type, unsigned int *clock)
{
    return clock_query(device, type, clock, 0);
}

#ifndef FAKE_NVML_OMIT_nvmlDeviceGetMaxClockInfo
nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, unsigned int type, unsigned int *clock)
{
    return clock_query(device, type, clock, 1);
}
#endif

/* The two names of one query: R535 renamed "throttle reasons" to "clocks event reasons", same bits. */
static nvmlReturn_t clocks_event_reasons(nvmlDevice_t device, unsigned long long *reasons)
{
    nvmlReturn_t ret = begin_query(device, NS_CLOCKS_EVENT_REASONS, 1);
    if (ret != NVML_SUCCESS)
        return ret;
    if (reasons == NULL)
        return end_query(NVML_ERROR_INVALID_ARGUMENT);
    *reasons = g_state.gpu[device->index].clocks_event_reasons;
    return end_query(NVML_SUCCESS);
}

#ifndef FAKE_NVML_OMIT_nvmlDeviceGetCurrentClocksEventReasons
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *clocksEventReasons)
{
    return clocks_event_reasons(device, clocksEventReasons);
}
#endif

#ifndef FAKE_NVML_OMIT_nvmlDeviceGetCurrentClocksThrottleReasons
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *clocksThrottleReasons)
{
    return clocks_event_reasons(device, clocksThrottleReasons);
}
#endif

/* ---- XID events ---- */

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    if (set == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    unsigned int initialised = g_init_refcount;
    pthread_mutex_unlock(&g_lock);
    if (initialised == 0)
        return NVML_ERROR_UNINITIALIZED;
    *set = calloc(1, sizeof(**set));
    return *set == NULL ? NVML_ERROR_MEMORY : NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    nvmlReturn_t ret = begin_query(device, NS_EVENTS, 0);
    if (ret != NVML_SUCCESS)
        return ret;
    if (eventTypes == NULL)
        return end_query(NVML_ERROR_INVALID_ARGUMENT);
    *eventTypes = NVML_EVENT_TYPE_XID_CRITICAL_ERROR;
    return end_query(NVML_SUCCESS);
}

/* Any event mask is accepted; only XID critical errors are ever delivered. */
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
    nvmlReturn_t ret = begin_query(device, NS_EVENTS, 0);
    if (ret != NVML_SUCCESS)
        return ret;
    if (set == NULL)
        return end_query(NVML_ERROR_INVALID_ARGUMENT);
    set->registered[device->index] |= eventTypes;
    return end_query(NVML_SUCCESS);
}

static int delivered(const xid_line_t *line)
{
    for (unsigned int i = 0; i < g_n_delivered; i++)
        if (g_delivered[i].device == line->device && g_delivered[i].xid == line->xid &&
            g_delivered[i].seq == line->seq)
            return 1;
    return 0;
}

/* The first undelivered XID line for a device `set` listens to, marked delivered; the caller holds g_lock. */
static const xid_line_t *take_xid(nvmlEventSet_t set)
{
    for (unsigned int i = 0; i < g_state.n_xids; i++) {
        const xid_line_t *line = &g_state.xids[i];
        if (line->device >= g_state.count || line->device >= MAX_DEVICES ||
            (set->registered[line->device] & NVML_EVENT_TYPE_XID_CRITICAL_ERROR) == 0 || delivered(line))
            continue;
        if (g_n_delivered < MAX_DELIVERED)
            g_delivered[g_n_delivered++] = *line;
        return line;
    }
    return NULL;
}

static nvmlReturn_t wait_xid(nvmlEventSet_t set, unsigned int timeoutms, xid_line_t *out)
{
    if (set == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    long long deadline = now_ms() + timeoutms;
    for (;;) {
        pthread_mutex_lock(&g_lock);
        if (g_init_refcount == 0) {
            pthread_mutex_unlock(&g_lock);
            return NVML_ERROR_UNINITIALIZED;
        }
        reload(1);
        const xid_line_t *line = take_xid(set);
        if (line != NULL)
            *out = *line;
        pthread_mutex_unlock(&g_lock);
        if (line != NULL)
            return NVML_SUCCESS;
        long long left = deadline - now_ms();
        if (left <= 0)
            return NVML_ERROR_TIMEOUT;
        sleep_ms(left < POLL_MS ? (unsigned int)left : POLL_MS);
    }
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    if (data == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    xid_line_t line;
    nvmlReturn_t ret = wait_xid(set, timeoutms, &line);
    if (ret != NVML_SUCCESS)
        return ret;
    data->device = &g_handles[line.device];
    data->eventType = NVML_EVENT_TYPE_XID_CRITICAL_ERROR;
    data->eventData = line.xid;
    data->gpuInstanceId = 0xFFFFFFFFu; /* not attributable to a MIG instance */
    data->computeInstanceId = 0xFFFFFFFFu;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    if (set == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    free(set);
    return NVML_SUCCESS;
}
