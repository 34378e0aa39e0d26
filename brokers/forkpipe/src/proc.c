/* Process plumbing shared by the listener, client and subscription processes. */
#include "proc.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct broker_config g_config;
volatile sig_atomic_t g_stop = 0;

static void on_stop_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static void on_child_signal(int sig) {
    (void)sig; /* only there so SIGCHLD interrupts ppoll and the child gets reaped */
}

void proc_install_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = on_stop_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sa.sa_handler = on_child_signal;
    sa.sa_flags = SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, NULL);
    sa.sa_handler = SIG_IGN;
    sa.sa_flags = 0;
    sigaction(SIGPIPE, &sa, NULL);
}

void proc_block_wake_signals(sigset_t *old) {
    sigset_t wake;
    sigemptyset(&wake);
    sigaddset(&wake, SIGTERM);
    sigaddset(&wake, SIGINT);
    sigaddset(&wake, SIGHUP);
    sigaddset(&wake, SIGCHLD);
    sigprocmask(SIG_BLOCK, &wake, old);
}

void proc_restore_signals(const sigset_t *old) {
    sigprocmask(SIG_SETMASK, old, NULL);
}

bool pid_list_reserve(struct pid_list *list) {
    if (list->n < list->cap)
        return true;
    pid_list_reap(list);
    if (list->n < list->cap)
        return true;
    size_t cap = list->cap ? 2 * list->cap : 16;
    pid_t *grown = realloc(list->pids, cap * sizeof *grown);
    if (grown == NULL)
        return false;
    list->pids = grown;
    list->cap = cap;
    return true;
}

void pid_list_push(struct pid_list *list, pid_t pid) {
    list->pids[list->n++] = pid;
}

void pid_list_reap(struct pid_list *list) {
    pid_t pid;
    while ((pid = waitpid(-1, NULL, WNOHANG)) > 0) {
        for (size_t i = 0; i < list->n; i++) {
            if (list->pids[i] == pid) {
                list->pids[i] = list->pids[--list->n];
                break;
            }
        }
    }
}

void pid_list_signal(const struct pid_list *list, int sig) {
    for (size_t i = 0; i < list->n; i++)
        kill(list->pids[i], sig);
}

void pid_list_wait(struct pid_list *list, long long deadline_ms) {
    for (;;) {
        pid_list_reap(list);
        if (list->n == 0 || proc_now_ms() >= deadline_ms)
            return;
        nanosleep(&(struct timespec){.tv_nsec = 5000000L}, NULL);
    }
}

void pid_list_free(struct pid_list *list) {
    free(list->pids);
    *list = (struct pid_list){0};
}

void proc_die_with_parent(pid_t parent) {
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) {
        log_line("prctl(PR_SET_PDEATHSIG) failed: %s", strerror(errno));
        exit(EXIT_FAILURE);
    }
    /* The parent may have died between fork() and prctl(): then nobody sends the signal. */
    if (getppid() != parent)
        exit(EXIT_SUCCESS);
}

void log_line(const char *fmt, ...) {
    char line[1024];
    int saved_errno = errno;
    int n = snprintf(line, sizeof line, "mqttbed-forkpipe[%d]: ", (int)getpid());
    va_list args;
    va_start(args, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, args);
    va_end(args);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    ssize_t ignored = write(STDERR_FILENO, line, len);
    (void)ignored;
    errno = saved_errno;
}

long long proc_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
