/* A stand-in libnvidia-ml.so.1 for tests: the subset of the NVML C API tray-agent calls,
 * behaving like a GPU where it matters: power limits are constrained to [min, max]
 * (NVML_ERROR_INVALID_ARGUMENT outside), a limit set takes effect only after a delay (the
 * read-back is the proof), drawn power is the demand clamped by the enforced limit (and
 * sw_power_cap is reported while it clamps). Configured by environment variables:
 *   STANDIN_NVML_GPUS (4), STANDIN_NVML_DEMAND_MW (900000), STANDIN_NVML_MIN_MW (200000),
 *   STANDIN_NVML_MAX_MW (1200000), STANDIN_NVML_DEFAULT_MW (1000000),
 *   STANDIN_NVML_SET_DELAY_MS (300), STANDIN_NVML_EXTRA_REASONS (0: bits or'ed into the
 *   clock-event reasons, e.g. 0x10000 a bit no agent knows), STANDIN_NVML_SET_ERROR (0: the
 *   NVML return code of every set, e.g. 4 NO_PERMISSION), STANDIN_NVML_LOST (-1: a device index
 *   that answers GPU_IS_LOST), STANDIN_NVML_READ_DELAY_FILE (unset: a file whose content, a
 *   number of ms, each power read sleeps: a driver that hangs, switched at run time),
 *   STANDIN_NVML_NVLINKS (2: NVLinks per GPU, all active; link >= it: NOT_SUPPORTED; 0: no
 *   NVLink), STANDIN_NVML_NVLINK_ERRORS (0: NVLink error counter (device d, link l, counter c)
 *   reads N x (l + 1) x (c + 1) + d), STANDIN_NVML_ECC_CORRECTED / _UNCORRECTED (0: device d's
 *   volatile ECC totals read N + d; aggregate twice that), STANDIN_NVML_ECC (1; 0: ECC off,
 *   NOT_SUPPORTED), STANDIN_NVML_XID_FILE (unset: no Xid events supported; else a file of
 *   lines "<device> <xid>": each nvmlEventSetWait_v2 delivers the next line of a device
 *   registered in the set, else sleeps the timeout and answers TIMEOUT).
 * Built by the tests with the system's gcc: gcc -shared -fPIC -o libnvidia-ml.so.1 this.c */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
typedef struct { unsigned int gpu; unsigned int memory; } nvmlUtilization_t;
typedef struct dev {
    unsigned int index;
    unsigned int limit_mw, pending_mw;
    double pending_at;
    unsigned long long energy_mj;
    double energy_t;
} dev_t_;
typedef dev_t_ *nvmlDevice_t;

#define MAXG 64
static dev_t_ devs[MAXG];
static int ngpus = 4, lost = -1, inited = 0;
static unsigned int demand_mw, min_mw, max_mw, default_mw, delay_ms, set_error;
static unsigned long long extra_reasons;
static unsigned int nvlinks, ecc_on;
static unsigned long long nvlink_errors, ecc_corr, ecc_uncorr;

static double now_s(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}
static unsigned long long env_u(const char *k, unsigned long long d) {
    const char *v = getenv(k); return v ? strtoull(v, NULL, 0) : d;
}
static void settle(dev_t_ *d) {
    double t = now_s();
    if (d->pending_at > 0 && t >= d->pending_at) { d->limit_mw = d->pending_mw; d->pending_at = 0; }
    unsigned int p = demand_mw < d->limit_mw ? demand_mw : d->limit_mw;
    d->energy_mj += (unsigned long long)((t - d->energy_t) * p);  /* mW x s = mJ */
    d->energy_t = t;
}
static nvmlReturn_t check(nvmlDevice_t d) {
    if (!inited) return 1;                       /* UNINITIALIZED */
    if (!d) return 2;                            /* INVALID_ARGUMENT */
    if ((int)d->index == lost) return 15;        /* GPU_IS_LOST */
    settle(d);
    return 0;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    ngpus = (int)env_u("STANDIN_NVML_GPUS", 4); if (ngpus > MAXG) ngpus = MAXG;
    demand_mw = env_u("STANDIN_NVML_DEMAND_MW", 900000);
    min_mw = env_u("STANDIN_NVML_MIN_MW", 200000); max_mw = env_u("STANDIN_NVML_MAX_MW", 1200000);
    default_mw = env_u("STANDIN_NVML_DEFAULT_MW", 1000000);
    delay_ms = env_u("STANDIN_NVML_SET_DELAY_MS", 300);
    extra_reasons = env_u("STANDIN_NVML_EXTRA_REASONS", 0);
    set_error = env_u("STANDIN_NVML_SET_ERROR", 0);
    const char *l = getenv("STANDIN_NVML_LOST"); lost = l ? atoi(l) : -1;
    nvlinks = env_u("STANDIN_NVML_NVLINKS", 2); nvlink_errors = env_u("STANDIN_NVML_NVLINK_ERRORS", 0);
    ecc_on = env_u("STANDIN_NVML_ECC", 1);
    ecc_corr = env_u("STANDIN_NVML_ECC_CORRECTED", 0); ecc_uncorr = env_u("STANDIN_NVML_ECC_UNCORRECTED", 0);
    if (!inited) {
        for (int i = 0; i < ngpus; i++) {
            devs[i].index = i; devs[i].limit_mw = default_mw; devs[i].pending_at = 0;
            devs[i].energy_mj = 1000000ULL * (i + 1); devs[i].energy_t = now_s();
        }
    }
    inited = 1;
    return 0;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) { inited = 0; return 0; }
const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case 0: return "Success"; case 1: return "Uninitialized"; case 2: return "Invalid Argument";
    case 3: return "Not Supported"; case 4: return "Insufficient Permissions";
    case 10: return "Timeout";
    case 15: return "GPU is lost"; default: return "Unknown Error";
    }
}
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { if (!inited) return 1; *n = ngpus; return 0; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    if (!inited) return 1;
    if ((int)i >= ngpus) return 2;
    *d = &devs[i]; return 0;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    nvmlReturn_t r = check(d); if (r) return r;
    const char *f = getenv("STANDIN_NVML_READ_DELAY_FILE");
    if (f) {
        FILE *fh = fopen(f, "r"); long ms = 0;
        if (fh) { if (fscanf(fh, "%ld", &ms) != 1) ms = 0; fclose(fh); }
        if (ms > 0) { struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L}; nanosleep(&ts, NULL); }
    }
    *mw = demand_mw < d->limit_mw ? demand_mw : d->limit_mw; return 0;
}
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *mj) {
    nvmlReturn_t r = check(d); if (r) return r;
    *mj = d->energy_mj; return 0;
}
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *t) {
    nvmlReturn_t r = check(d); if (r) return r;
    if (sensor != 0) return 3;
    unsigned int p = demand_mw < d->limit_mw ? demand_mw : d->limit_mw;
    *t = 40 + p / 30000; return 0;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *m) {
    nvmlReturn_t r = check(d); if (r) return r;
    *m = (demand_mw > d->limit_mw ? 0x4ULL : 0ULL) | extra_reasons; return 0;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    nvmlReturn_t r = check(d); if (r) return r;
    u->gpu = 93; u->memory = 40; return 0;
}
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *mw) {
    nvmlReturn_t r = check(d); if (r) return r;
    *mw = d->limit_mw; return 0;
}
nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t d, unsigned int *mw) {
    return nvmlDeviceGetEnforcedPowerLimit(d, mw);
}
nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t d, unsigned int *lo,
                                                          unsigned int *hi) {
    nvmlReturn_t r = check(d); if (r) return r;
    *lo = min_mw; *hi = max_mw; return 0;
}
nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t d, unsigned int *mw) {
    nvmlReturn_t r = check(d); if (r) return r;
    *mw = default_mw; return 0;
}
nvmlReturn_t nvmlDeviceSetPowerManagementLimit(nvmlDevice_t d, unsigned int mw) {
    nvmlReturn_t r = check(d); if (r) return r;
    if (set_error) return (nvmlReturn_t)set_error;
    if (mw < min_mw || mw > max_mw) return 2;
    d->pending_mw = mw; d->pending_at = now_s() + delay_ms / 1000.0;
    return 0;
}

/* --- NVLink, ECC, Xid events ------------------------------------------------------------- */
nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, unsigned int *active) {
    nvmlReturn_t r = check(d); if (r) return r;
    if (link >= nvlinks) return 3;               /* NOT_SUPPORTED: no such link */
    *active = 1; return 0;
}
nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t d, unsigned int link, int counter,
                                             unsigned long long *v) {
    nvmlReturn_t r = check(d); if (r) return r;
    if (link >= nvlinks) return 3;
    if (counter < 0 || counter > 4) return 2;
    *v = nvlink_errors * (link + 1) * (unsigned long long)(counter + 1) + d->index; return 0;
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int type, int counter,
                                         unsigned long long *v) {
    nvmlReturn_t r = check(d); if (r) return r;
    if (!ecc_on) return 3;
    if (type < 0 || type > 1 || counter < 0 || counter > 1) return 2;
    *v = ((type ? ecc_uncorr : ecc_corr) + d->index) * (counter + 1); return 0;
}
typedef struct { nvmlDevice_t device; unsigned long long type, data;
                 unsigned int gi, ci; } nvmlEventData_t;
typedef struct { int used; unsigned long long mask[MAXG]; long offset; } eventset_t;
static eventset_t the_set;
static const unsigned long long XID = 0x8ULL;

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
    nvmlReturn_t r = check(d); if (r) return r;
    *types = getenv("STANDIN_NVML_XID_FILE") ? XID : 0; return 0;
}
nvmlReturn_t nvmlEventSetCreate(eventset_t **set) {
    if (!inited) return 1;
    memset(&the_set, 0, sizeof the_set); the_set.used = 1; *set = &the_set; return 0;
}
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, eventset_t *set) {
    nvmlReturn_t r = check(d); if (r) return r;
    if (!set || !set->used) return 2;
    if (!getenv("STANDIN_NVML_XID_FILE") || (types & ~XID)) return 3;
    set->mask[d->index] |= types; return 0;
}
nvmlReturn_t nvmlEventSetWait_v2(eventset_t *set, nvmlEventData_t *data, unsigned int ms) {
    if (!inited) return 1;
    if (!set || !set->used) return 2;
    const char *f = getenv("STANDIN_NVML_XID_FILE");
    FILE *fh = f ? fopen(f, "r") : NULL;
    if (fh) {
        fseek(fh, set->offset, SEEK_SET);
        unsigned int dev; unsigned long long xid;
        while (fscanf(fh, "%u %llu\n", &dev, &xid) == 2) {
            set->offset = ftell(fh);
            if (dev < MAXG && (set->mask[dev] & XID)) {
                fclose(fh);
                data->device = &devs[dev]; data->type = XID; data->data = xid;
                data->gi = data->ci = 0xFFFFFFFF;
                return 0;
            }
        }
        fclose(fh);
    }
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L}; nanosleep(&ts, NULL);
    return 10;                                   /* TIMEOUT */
}
nvmlReturn_t nvmlEventSetFree(eventset_t *set) {
    if (!set || !set->used) return 2;
    set->used = 0; return 0;
}
