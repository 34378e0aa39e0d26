/* One process per subscription: it reads its named pipe and forwards to the client.
 *
 * The process waits on its pipe with select() and a timeout. On each timeout (and at
 * least that often while messages flow) it checks that its pipe still exists under its
 * name: UNSUBSCRIBE and DISCONNECT work by deleting pipes, and that deletion is what
 * stops this process. It also stops on SIGTERM (its client process died: PDEATHSIG),
 * when the client stops reading for send_timeout_ms, or when the connection is gone. */
#include "subscription.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mqtt.h"
#include "proc.h"
#include "sendlock.h"

#define READ_CHUNK 65536u

struct forwarder {
    int sock;
    int read_fd;
    int keep_open_fd;      /* our own write end: keeps select() from seeing EOF forever */
    char path[PATH_MAX];   /* the pipe, to notice its deletion */
    ino_t inode;           /* a re-subscription makes a new pipe under the same name */
    dev_t device;
    uint8_t *buf;          /* bytes read from the pipe, not yet sent */
    size_t len, cap;
};

static bool pipe_still_ours(const struct forwarder *f) {
    struct stat st;
    return stat(f->path, &st) == 0 && st.st_ino == f->inode && st.st_dev == f->device;
}

/* Bytes at the start of buf that form complete packets; SIZE_MAX if the pipe holds
 * something that is not MQTT (cannot happen unless someone else writes into it). */
static size_t complete_packets(const uint8_t *buf, size_t len, size_t *needed) {
    size_t done = 0;
    *needed = 0;
    while (done < len) {
        size_t header, remaining;
        enum mqtt_frame_status st = mqtt_frame(buf + done, len - done, &header, &remaining);
        if (st == MQTT_FRAME_MALFORMED)
            return SIZE_MAX;
        if (st == MQTT_FRAME_INCOMPLETE || header + remaining > len - done) {
            *needed = st == MQTT_FRAME_OK ? header + remaining : MQTT_MAX_FIXED_HEADER;
            break;
        }
        done += header + remaining;
    }
    return done;
}

/* Reads what the pipe holds and sends the complete packets; false when this
 * subscription must end. */
static bool forward_available(struct forwarder *f) {
    for (;;) {
        size_t needed;
        size_t ready = complete_packets(f->buf, f->len, &needed);
        if (ready == SIZE_MAX) {
            log_line("pipe %s holds bytes that are not MQTT; ending this subscription",
                     f->path);
            return false;
        }
        if (ready > 0) {
            if (!send_packet(f->sock, f->buf, ready)) {
                /* The client is gone or stuck: close the connection for all its
                 * processes; its client process sees that and cleans up. */
                shutdown(f->sock, SHUT_RDWR);
                return false;
            }
            memmove(f->buf, f->buf + ready, f->len - ready);
            f->len -= ready;
        }
        size_t want = f->len + READ_CHUNK > needed ? f->len + READ_CHUNK : needed;
        if (want > f->cap) {
            uint8_t *grown = realloc(f->buf, want);
            if (grown == NULL) {
                log_line("out of memory forwarding %s", f->path);
                return false;
            }
            f->buf = grown;
            f->cap = want;
        }
        ssize_t n = read(f->read_fd, f->buf + f->len, f->cap - f->len);
        if (n > 0) {
            f->len += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR && !g_stop)
            continue;
        return n < 0 && errno == EAGAIN; /* drained; anything else ends it */
    }
}

static void forward_until_unsubscribed(struct forwarder *f) {
    long long next_check = proc_now_ms() + g_config.select_timeout_ms;
    for (;;) {
        fd_set readable;
        FD_ZERO(&readable);
        FD_SET(f->read_fd, &readable);
        struct timespec timeout = {.tv_sec = g_config.select_timeout_ms / 1000,
                                   .tv_nsec = (g_config.select_timeout_ms % 1000) * 1000000L};
        sigset_t old;
        proc_block_wake_signals(&old);
        int ready = g_stop ? -1 : pselect(f->read_fd + 1, &readable, NULL, NULL, &timeout, &old);
        proc_restore_signals(&old);
        if (g_stop)
            return;
        if (ready > 0 && !forward_available(f))
            return;
        if (ready < 0 && errno != EINTR)
            return;
        long long now = proc_now_ms();
        if (ready == 0 || now >= next_check) {
            if (!pipe_still_ours(f))
                return;
            next_check = now + g_config.select_timeout_ms;
        }
    }
}

static void run_subscription(struct forwarder *f) {
    struct stat st;
    if (fstat(f->read_fd, &st) == 0) {
        f->inode = st.st_ino;
        f->device = st.st_dev;
        forward_until_unsubscribed(f);
    }
    free(f->buf);
    close(f->read_fd);
    close(f->keep_open_fd);
    close(f->sock);
    sendlock_release();
}

enum subscription_result subscription_start(int sock, const char *dir_path,
                                            const char *pipe_name, pid_t *pid) {
    struct forwarder f = {.sock = sock, .read_fd = -1, .keep_open_fd = -1};
    int n = snprintf(f.path, sizeof f.path, "%s/%s", dir_path, pipe_name);
    if (n <= 0 || (size_t)n >= sizeof f.path)
        return SUBSCRIPTION_FAILED;
    if (mkfifo(f.path, 0600) != 0) {
        if (errno == EEXIST)
            return SUBSCRIPTION_EXISTED; /* as in the seed: the pipe is the subscription */
        log_line("cannot create pipe %s: %s", f.path, strerror(errno));
        return SUBSCRIPTION_FAILED;
    }
    /* Opened here, before the fork, so the pipe has a reader before the SUBACK goes out. */
    f.read_fd = open(f.path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (f.read_fd >= 0)
        f.keep_open_fd = open(f.path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    pid_t client = getpid();
    pid_t child = f.keep_open_fd >= 0 ? fork() : -1;
    if (child == 0) {
        proc_die_with_parent(client);
        run_subscription(&f);
        exit(EXIT_SUCCESS);
    }
    int saved_errno = errno;
    if (f.read_fd >= 0)
        close(f.read_fd);
    if (f.keep_open_fd >= 0)
        close(f.keep_open_fd);
    if (child < 0) {
        log_line("cannot start a subscription process for %s: %s", f.path,
                 strerror(saved_errno));
        unlink(f.path);
        return SUBSCRIPTION_FAILED;
    }
    *pid = child;
    return SUBSCRIPTION_STARTED;
}
