/* Whole packets onto a client's socket from several processes. */
#include "sendlock.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "counters.h"
#include "proc.h"

static pthread_mutex_t *g_send_lock;

bool sendlock_init(void) {
    void *shared = mmap(NULL, sizeof(pthread_mutex_t), PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) {
        log_line("cannot map the send lock: %s", strerror(errno));
        return false;
    }
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    /* Robust: a subscription process killed while holding it must not wedge the rest. */
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    int rc = pthread_mutex_init(shared, &attr);
    pthread_mutexattr_destroy(&attr);
    if (rc != 0) {
        log_line("cannot initialise the send lock: %s", strerror(rc));
        munmap(shared, sizeof(pthread_mutex_t));
        return false;
    }
    g_send_lock = shared;
    return true;
}

void sendlock_release(void) {
    if (g_send_lock != NULL) {
        munmap(g_send_lock, sizeof(pthread_mutex_t));
        g_send_lock = NULL;
    }
}

static bool send_all(int sock, const unsigned char *buf, size_t len) {
    while (len > 0) {
        /* write(), not send(): it counts in the process's wchar, as Mosquitto's writes
         * do; SIGPIPE is ignored, so a gone peer is EPIPE either way. */
        ssize_t n = write(sock, buf, len);
        if (n > 0) {
            counters_add_out((size_t)n);
            buf += n;
            len -= (size_t)n;
        } else if (n < 0 && errno == EINTR && !g_stop) {
            continue;
        } else {
            return false; /* EAGAIN here means SO_SNDTIMEO expired: the client is stuck */
        }
    }
    return true;
}

bool send_packet(int sock, const void *buf, size_t len) {
    if (g_send_lock == NULL)
        return send_all(sock, buf, len);
    int rc = pthread_mutex_lock(g_send_lock);
    if (rc == EOWNERDEAD)
        pthread_mutex_consistent(g_send_lock);
    else if (rc != 0)
        return false;
    bool sent = send_all(sock, buf, len);
    pthread_mutex_unlock(g_send_lock);
    return sent;
}
