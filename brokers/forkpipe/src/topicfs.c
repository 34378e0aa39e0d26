/* The broker's state as a file tree: client directories and subscription pipes. */
#include "topicfs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mqtt.h"
#include "proc.h"

static const char HEX[] = "0123456789ABCDEF";

static bool kept_as_is(uint8_t b) {
    return (b >= 'A' && b <= 'Z') || (b >= 'a' && b <= 'z') || (b >= '0' && b <= '9') ||
           b == '_' || b == '-';
}

bool topicfs_encode(const uint8_t *filter, size_t len, char out[NAME_MAX + 1]) {
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        size_t need = kept_as_is(filter[i]) ? 1 : 3;
        if (n + need > NAME_MAX)
            return false;
        if (need == 1) {
            out[n++] = (char)filter[i];
        } else {
            out[n++] = '%';
            out[n++] = HEX[filter[i] >> 4];
            out[n++] = HEX[filter[i] & 0x0F];
        }
    }
    out[n] = '\0';
    return n > 0;
}

static int hex_value(char c) {
    const char *at = c ? strchr(HEX, c) : NULL;
    return at ? (int)(at - HEX) : -1;
}

bool topicfs_decode(const char *name, uint8_t out[NAME_MAX], size_t *len) {
    size_t n = 0;
    for (const char *p = name; *p; p++) {
        if (n >= NAME_MAX)
            return false;
        if (kept_as_is((uint8_t)*p)) {
            out[n++] = (uint8_t)*p;
        } else if (*p == '%') {
            int hi = hex_value(p[1]), lo = hi < 0 ? -1 : hex_value(p[2]);
            if (lo < 0)
                return false;
            out[n++] = (uint8_t)(hi << 4 | lo);
            p += 2;
        } else {
            return false;
        }
    }
    *len = n;
    return n > 0;
}

bool topicfs_client_dir(pid_t pid, char out[PATH_MAX]) {
    int n = snprintf(out, PATH_MAX, "%s/%d", g_config.base_dir, (int)pid);
    return n > 0 && n < PATH_MAX;
}

bool topicfs_create_client_dir(pid_t pid) {
    char dir[PATH_MAX];
    if (!topicfs_client_dir(pid, dir))
        return false;
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        log_line("cannot create %s: %s", dir, strerror(errno));
        return false;
    }
    return true;
}

void topicfs_remove_client_dir(pid_t pid) {
    char dir[PATH_MAX];
    if (!topicfs_client_dir(pid, dir))
        return;
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *entry;
    while ((entry = readdir(d)) != NULL) {
        if (entry->d_name[0] != '.')
            unlinkat(dirfd(d), entry->d_name, 0);
    }
    closedir(d);
    if (rmdir(dir) != 0 && errno != ENOENT)
        log_line("cannot remove %s: %s", dir, strerror(errno));
}

static bool all_digits(const char *s) {
    if (*s == '\0')
        return false;
    for (; *s; s++)
        if (*s < '0' || *s > '9')
            return false;
    return true;
}

/* Writes all of packet into the pipe `fd` (opened O_NONBLOCK): waits while the pipe is
 * full, gives up when the reader is gone or the broker is stopping. */
static bool write_to_pipe(int fd, const uint8_t *packet, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, packet, len);
        if (n > 0) {
            packet += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR && !g_stop)
            continue;
        if (n < 0 && errno == EAGAIN) {
            /* A full pipe means a slow subscriber: wait for it (back-pressure, as a
             * blocking pipe would). Its subscription process gives up on a client that
             * reads nothing for send_timeout_ms, and then POLLERR ends this wait. */
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            if (poll(&p, 1, -1) < 0 && errno != EINTR)
                return false;
            if (g_stop || (p.revents & (POLLERR | POLLHUP)))
                return false;
            continue;
        }
        return false; /* EPIPE: the subscription process ended meanwhile */
    }
    return true;
}

/* Takes the pipe's writer lock, waiting for another publisher to finish its packet. */
static bool lock_pipe(int fd) {
    while (flock(fd, LOCK_EX) != 0) {
        if (errno != EINTR || g_stop) /* EINTR: a SIGCHLD, not a reason to skip the pipe */
            return false;
    }
    return true;
}

/* Delivers to the matching pipes of one client directory; returns how many took it. */
static int publish_to_client(int dir_fd, const uint8_t *topic, size_t topic_len,
                             const uint8_t *packet, size_t packet_len) {
    DIR *d = fdopendir(dir_fd);
    if (d == NULL) {
        close(dir_fd);
        return 0;
    }
    int delivered = 0;
    struct dirent *entry;
    uint8_t filter[NAME_MAX];
    size_t filter_len;
    while ((entry = readdir(d)) != NULL) {
        if (entry->d_name[0] == '.' || !topicfs_decode(entry->d_name, filter, &filter_len) ||
            !mqtt_topic_matches(filter, filter_len, topic, topic_len))
            continue;
        /* O_NONBLOCK: opening a pipe nobody reads fails (ENXIO) instead of hanging. */
        int fd = openat(dirfd(d), entry->d_name, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0)
            continue; /* ENOENT: unsubscribed meanwhile; ENXIO: its reader is gone */
        struct stat st;
        if (fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode) && lock_pipe(fd) &&
            write_to_pipe(fd, packet, packet_len))
            delivered++;
        close(fd); /* also releases the flock */
    }
    closedir(d);
    return delivered;
}

int topicfs_publish(const uint8_t *topic, size_t topic_len, const uint8_t *packet,
                    size_t packet_len) {
    DIR *base = opendir(g_config.base_dir);
    if (base == NULL) {
        log_line("cannot read %s: %s", g_config.base_dir, strerror(errno));
        return 0;
    }
    int delivered = 0;
    struct dirent *entry;
    while ((entry = readdir(base)) != NULL && !g_stop) {
        if (!all_digits(entry->d_name))
            continue;
        int dir_fd = openat(dirfd(base), entry->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir_fd >= 0)
            delivered += publish_to_client(dir_fd, topic, topic_len, packet, packet_len);
    }
    closedir(base);
    return delivered;
}
