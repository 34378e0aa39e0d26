/* A fake GPIO character device for tests, loaded with LD_PRELOAD: this machine has no
 * /dev/gpiochip*, no gpio-sim and no CUSE, so the kernel's side of the v2 uAPI
 * (linux/gpio.h) is answered here, in the process, for one path.
 *
 * open() of $FAKE_GPIOCHIP_PATH returns a chip fd; on it GPIO_V2_GET_LINE_IOCTL checks the
 * request as drivers/gpio/gpiolib-cdev.c does (num_lines 1..64, zero padding, at most 10
 * attributes, each line's flags: known bits, not input and output, edges need input, drive
 * needs output, one bias, bias needs a direction; offsets inside the chip; a line already
 * held: EBUSY) and returns a line request fd. On that fd GPIO_V2_LINE_SET_VALUES_IOCTL and
 * GPIO_V2_LINE_GET_VALUES_IOCTL act as the kernel's (mask over the request's lines, none
 * set: EINVAL; setting an input: EPERM). GPIO_GET_CHIPINFO_IOCTL answers name, label,
 * lines. Every other ioctl on these fds gets EINVAL, the kernel's answer to a command it
 * does not know (line info and watches, the v1 ABI and SET_CONFIG are not faked).
 * Closing a line fd releases its lines.
 *
 * Environment:
 *   FAKE_GPIOCHIP_PATH   the path whose open() is taken over (required to fake anything)
 *   FAKE_GPIOCHIP_LOG    a file every request, release and line write is appended to:
 *                          <CLOCK_MONOTONIC ns> request <consumer> <offset>...
 *                          <CLOCK_MONOTONIC ns> set <offset> <level>    (the value changed)
 *                          <CLOCK_MONOTONIC ns> same <offset> <level>   (written unchanged)
 *                          <CLOCK_MONOTONIC ns> release <offset>...
 *                        the time is read on entry to the ioctl, before the line "moves"
 *   FAKE_GPIOCHIP_LINES  lines on the chip (default 58, a Pi 4's gpiochip0)
 *   FAKE_GPIOCHIP_HELD   comma-separated offsets another consumer holds (their requests: EBUSY)
 *   FAKE_GPIOCHIP_FAIL_AFTER  after this many SET_VALUES calls, each fails with EIO (what
 *                        the kernel passes on from a driver that cannot reach its chip)
 *
 * The chip's state lives in this process only. Build: gcc -shared -fPIC -o x.so this.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/gpio.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define MAX_LINES 512
#define MAX_FDS 64

typedef struct {
    int fd;                       /* -1: free */
    int is_request;               /* 0: a chip fd, 1: a line request fd */
    uint32_t num_lines;
    uint32_t offsets[GPIO_V2_LINES_MAX];
    uint64_t flags[GPIO_V2_LINES_MAX];
} fake_fd;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int (*real_open)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static int (*real_ioctl)(int, unsigned long, ...);
static int (*real_close)(int);
static const char *chip_path;
static int log_fd = -1;
static uint32_t chip_lines = 58;
static uint8_t held[MAX_LINES];   /* 1: a request here holds it, 2: "another consumer" */
static uint8_t level[MAX_LINES];
static long fail_after = -1;      /* SET_VALUES calls that succeed before EIO; -1: all */
static long set_calls;
static fake_fd fds[MAX_FDS];

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

__attribute__((constructor)) static void setup(void) {
    real_open = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open");
    real_openat = (int (*)(int, const char *, int, ...))dlsym(RTLD_NEXT, "openat");
    real_ioctl = (int (*)(int, unsigned long, ...))dlsym(RTLD_NEXT, "ioctl");
    real_close = (int (*)(int))dlsym(RTLD_NEXT, "close");
    for (int i = 0; i < MAX_FDS; i++)
        fds[i].fd = -1;
    chip_path = getenv("FAKE_GPIOCHIP_PATH");
    const char *lines = getenv("FAKE_GPIOCHIP_LINES");
    if (lines != NULL && atoi(lines) > 0 && atoi(lines) <= MAX_LINES)
        chip_lines = (uint32_t)atoi(lines);
    const char *others = getenv("FAKE_GPIOCHIP_HELD");
    for (const char *p = others; p != NULL && *p;) {
        long offset = strtol(p, (char **)&p, 10);
        if (offset >= 0 && offset < MAX_LINES)
            held[offset] = 2;
        if (*p == ',')
            p++;
        else
            break;
    }
    const char *fail = getenv("FAKE_GPIOCHIP_FAIL_AFTER");
    if (fail != NULL)
        fail_after = atol(fail);
    const char *log_path = getenv("FAKE_GPIOCHIP_LOG");
    if (log_path != NULL)
        log_fd = real_open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
}

static void log_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void log_line(const char *fmt, ...) {
    if (log_fd < 0)
        return;
    char text[1024];
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(text, sizeof text, fmt, args);
    va_end(args);
    if (n > 0 && write(log_fd, text, (size_t)n < sizeof text ? (size_t)n : sizeof text - 1) < 0)
        return;  /* a lost log line shows as a missing edge in the test */
}

static fake_fd *find(int fd) {
    for (int i = 0; i < MAX_FDS; i++)
        if (fds[i].fd == fd && fd >= 0)
            return &fds[i];
    return NULL;
}

static fake_fd *new_fd(int is_request) {
    for (int i = 0; i < MAX_FDS; i++)
        if (fds[i].fd < 0) {
            int fd = eventfd(0, EFD_CLOEXEC);  /* a real, unique fd number */
            if (fd < 0)
                return NULL;
            memset(&fds[i], 0, sizeof fds[i]);
            fds[i].fd = fd;
            fds[i].is_request = is_request;
            return &fds[i];
        }
    errno = EMFILE;
    return NULL;
}

static int open_chip(void) {
    pthread_mutex_lock(&lock);
    fake_fd *f = new_fd(0);
    pthread_mutex_unlock(&lock);
    return f == NULL ? -1 : f->fd;
}

static int is_chip(const char *path) {
    return chip_path != NULL && path != NULL && strcmp(path, chip_path) == 0;
}

int open(const char *path, int flags, ...) {
    if (is_chip(path))
        return open_chip();
    va_list args;
    va_start(args, flags);
    mode_t mode = (flags & (O_CREAT | O_TMPFILE)) ? va_arg(args, mode_t) : 0;
    va_end(args);
    return real_open(path, flags, mode);
}

int open64(const char *path, int flags, ...) __attribute__((alias("open")));

int openat(int dirfd, const char *path, int flags, ...) {
    if (is_chip(path))
        return open_chip();
    va_list args;
    va_start(args, flags);
    mode_t mode = (flags & (O_CREAT | O_TMPFILE)) ? va_arg(args, mode_t) : 0;
    va_end(args);
    return real_openat(dirfd, path, flags, mode);
}

int openat64(int dirfd, const char *path, int flags, ...) __attribute__((alias("openat")));

/* -- the kernel's checks (gpiolib-cdev.c: gpio_v2_line_flags_validate and friends) ------ */

#define DIRECTION (GPIO_V2_LINE_FLAG_INPUT | GPIO_V2_LINE_FLAG_OUTPUT)
#define EDGES (GPIO_V2_LINE_FLAG_EDGE_RISING | GPIO_V2_LINE_FLAG_EDGE_FALLING)
#define DRIVE (GPIO_V2_LINE_FLAG_OPEN_DRAIN | GPIO_V2_LINE_FLAG_OPEN_SOURCE)
#define BIAS (GPIO_V2_LINE_FLAG_BIAS_PULL_UP | GPIO_V2_LINE_FLAG_BIAS_PULL_DOWN \
              | GPIO_V2_LINE_FLAG_BIAS_DISABLED)
#define VALID (GPIO_V2_LINE_FLAG_ACTIVE_LOW | DIRECTION | EDGES | DRIVE | BIAS \
               | GPIO_V2_LINE_FLAG_EVENT_CLOCK_REALTIME | GPIO_V2_LINE_FLAG_EVENT_CLOCK_HTE)

static int flags_valid(uint64_t flags) {
    if (flags & ~(uint64_t)VALID)
        return 0;
    if ((flags & GPIO_V2_LINE_FLAG_INPUT) && (flags & GPIO_V2_LINE_FLAG_OUTPUT))
        return 0;
    if ((flags & EDGES) && !(flags & GPIO_V2_LINE_FLAG_INPUT))
        return 0;
    if ((flags & DRIVE) == DRIVE)
        return 0;
    if ((flags & DRIVE) && !(flags & GPIO_V2_LINE_FLAG_OUTPUT))
        return 0;
    if ((flags & BIAS) && !(flags & DIRECTION))
        return 0;
    uint64_t bias = flags & BIAS;
    if (bias & (bias - 1))  /* more than one bias flag */
        return 0;
    return 1;
}

static int zero(const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return 0;
    return 1;
}

/* The line's flags, or its output value: a config attribute whose mask names the line
 * overrides the default (the first one that does, as the kernel looks them up). */
static uint64_t line_flags(const struct gpio_v2_line_config *c, uint32_t line) {
    for (uint32_t i = 0; i < c->num_attrs; i++)
        if (c->attrs[i].attr.id == GPIO_V2_LINE_ATTR_ID_FLAGS && (c->attrs[i].mask >> line & 1))
            return c->attrs[i].attr.flags;
    return c->flags;
}

static int output_value(const struct gpio_v2_line_config *c, uint32_t line) {
    for (uint32_t i = 0; i < c->num_attrs; i++)
        if (c->attrs[i].attr.id == GPIO_V2_LINE_ATTR_ID_OUTPUT_VALUES
            && (c->attrs[i].mask >> line & 1))
            return (int)(c->attrs[i].attr.values >> line & 1);
    return 0;
}

static int debounced(const struct gpio_v2_line_config *c, uint32_t line) {
    for (uint32_t i = 0; i < c->num_attrs; i++)
        if (c->attrs[i].attr.id == GPIO_V2_LINE_ATTR_ID_DEBOUNCE
            && (c->attrs[i].mask >> line & 1))
            return c->attrs[i].attr.debounce_period_us != 0;
    return 0;
}

static int get_line(struct gpio_v2_line_request *r) {
    if (r->num_lines == 0 || r->num_lines > GPIO_V2_LINES_MAX)
        return -EINVAL;
    if (!zero(r->padding, sizeof r->padding))
        return -EINVAL;
    const struct gpio_v2_line_config *c = &r->config;
    if (c->num_attrs > GPIO_V2_LINE_NUM_ATTRS_MAX || !zero(c->padding, sizeof c->padding))
        return -EINVAL;
    for (uint32_t i = 0; i < r->num_lines; i++) {
        uint64_t flags = line_flags(c, i);
        if (!flags_valid(flags))
            return -EINVAL;
        if (debounced(c, i) && !(flags & GPIO_V2_LINE_FLAG_INPUT))
            return -EINVAL;
    }
    for (uint32_t i = 0; i < r->num_lines; i++) {
        if (r->offsets[i] >= chip_lines)
            return -EINVAL;
        if (held[r->offsets[i]])
            return -EBUSY;
        for (uint32_t j = 0; j < i; j++)
            if (r->offsets[j] == r->offsets[i])
                return -EBUSY;  /* the kernel's second request of the same descriptor */
    }
    fake_fd *f = new_fd(1);
    if (f == NULL)
        return -errno;
    f->num_lines = r->num_lines;
    char text[16 * GPIO_V2_LINES_MAX];
    size_t used = 0;
    for (uint32_t i = 0; i < r->num_lines; i++) {
        uint32_t offset = r->offsets[i];
        f->offsets[i] = offset;
        f->flags[i] = line_flags(c, i);
        held[offset] = 1;
        if (f->flags[i] & GPIO_V2_LINE_FLAG_OUTPUT)
            level[offset] = (uint8_t)output_value(c, i);
        used += (size_t)snprintf(text + used, sizeof text - used, " %u", offset);
    }
    char consumer[GPIO_MAX_NAME_SIZE + 1] = {0};
    memcpy(consumer, r->consumer, GPIO_MAX_NAME_SIZE);
    log_line("%lld request %s%s\n", (long long)now_ns(), consumer[0] ? consumer : "?", text);
    r->fd = f->fd;
    return 0;
}

static int set_values(fake_fd *f, const struct gpio_v2_line_values *v, int64_t t) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < f->num_lines; i++)
        if (v->mask >> i & 1) {
            if (!(f->flags[i] & GPIO_V2_LINE_FLAG_OUTPUT))
                return -EPERM;
            n++;
        }
    if (n == 0)
        return -EINVAL;
    if (fail_after >= 0 && set_calls++ >= fail_after)
        return -EIO;
    for (uint32_t i = 0; i < f->num_lines; i++)
        if (v->mask >> i & 1) {
            uint32_t offset = f->offsets[i];
            uint8_t value = (uint8_t)(v->bits >> i & 1);
            log_line("%lld %s %u %u\n", (long long)t, level[offset] == value ? "same" : "set",
                     offset, value);
            level[offset] = value;
        }
    return 0;
}

static int get_values(const fake_fd *f, struct gpio_v2_line_values *v) {
    uint64_t bits = 0;
    uint32_t n = 0;
    for (uint32_t i = 0; i < f->num_lines; i++)
        if (v->mask >> i & 1) {
            bits |= (uint64_t)level[f->offsets[i]] << i;
            n++;
        }
    if (n == 0)
        return -EINVAL;
    v->bits = bits;
    return 0;
}

static int chip_info(struct gpiochip_info *info) {
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "gpiochip-fake");
    snprintf(info->label, sizeof info->label, "mqttbed fake_gpiochip");
    info->lines = chip_lines;
    return 0;
}

int ioctl(int fd, unsigned long request, ...) {
    va_list args;
    va_start(args, request);
    void *arg = va_arg(args, void *);
    va_end(args);
    int64_t t = now_ns();
    pthread_mutex_lock(&lock);
    fake_fd *f = find(fd);
    if (f == NULL) {
        pthread_mutex_unlock(&lock);
        return real_ioctl(fd, request, arg);
    }
    int result = -EINVAL;
    if (arg == NULL)
        result = -EFAULT;
    else if (!f->is_request && request == GPIO_V2_GET_LINE_IOCTL)
        result = get_line(arg);
    else if (!f->is_request && request == GPIO_GET_CHIPINFO_IOCTL)
        result = chip_info(arg);
    else if (f->is_request && request == GPIO_V2_LINE_SET_VALUES_IOCTL)
        result = set_values(f, arg, t);
    else if (f->is_request && request == GPIO_V2_LINE_GET_VALUES_IOCTL)
        result = get_values(f, arg);
    pthread_mutex_unlock(&lock);
    if (result < 0) {
        errno = -result;
        return -1;
    }
    return result;
}

int close(int fd) {
    pthread_mutex_lock(&lock);
    fake_fd *f = find(fd);
    if (f != NULL) {
        if (f->is_request) {
            char text[16 * GPIO_V2_LINES_MAX];
            size_t used = 0;
            for (uint32_t i = 0; i < f->num_lines; i++) {
                held[f->offsets[i]] = 0;
                used += (size_t)snprintf(text + used, sizeof text - used, " %u",
                                         f->offsets[i]);
            }
            log_line("%lld release%s\n", (long long)now_ns(), text);
        }
        f->fd = -1;
    }
    pthread_mutex_unlock(&lock);
    return real_close(fd);
}
