/* Socket bytes in and out of the whole broker (see counters.h). */
#include "counters.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct socket_bytes {
    uint64_t in;
    uint64_t out;
};

static struct socket_bytes *g_counters;

bool counters_open(const char *path) {
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, sizeof(struct socket_bytes)) != 0) {
        fprintf(stderr, "mqttbed-forkpipe: --counters-file %s: %s\n", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return false;
    }
    void *shared = mmap(NULL, sizeof(struct socket_bytes), PROT_READ | PROT_WRITE, MAP_SHARED,
                        fd, 0);
    int saved = errno;
    close(fd); /* the mapping keeps the file */
    if (shared == MAP_FAILED) {
        fprintf(stderr, "mqttbed-forkpipe: --counters-file %s: %s\n", path, strerror(saved));
        return false;
    }
    g_counters = shared;
    return true;
}

void counters_add_in(size_t bytes) {
    if (g_counters != NULL)
        __atomic_fetch_add(&g_counters->in, (uint64_t)bytes, __ATOMIC_RELAXED);
}

void counters_add_out(size_t bytes) {
    if (g_counters != NULL)
        __atomic_fetch_add(&g_counters->out, (uint64_t)bytes, __ATOMIC_RELAXED);
}
