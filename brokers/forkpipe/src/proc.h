/* Process plumbing shared by the broker's three kinds of process (listener, client,
 * subscription): the settings, logging, stop signals, and dying with one's parent. */
#ifndef MQTTBED_FORKPIPE_PROC_H
#define MQTTBED_FORKPIPE_PROC_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define FORKPIPE_VERSION "0.1.0"

/* Settings from the command line; read-only after start-up, inherited by every fork. */
struct broker_config {
    const char *base_dir;     /* <base>/<client pid>/<encoded topic filter> are the pipes */
    bool created_base;        /* the listener made base_dir, so the last one out removes it */
    int select_timeout_ms;    /* how often a subscription process checks its pipe still exists */
    int send_timeout_ms;      /* a client that reads nothing for this long is disconnected */
    int connect_timeout_ms;   /* a connection must send CONNECT within this */
    size_t max_packet_bytes;  /* larger packets close the connection */
    bool verbose;             /* log every connect and disconnect, not only problems */
};

extern struct broker_config g_config;

/* Set by SIGTERM, SIGINT or SIGHUP (and by PR_SET_PDEATHSIG's SIGTERM): finish and exit. */
extern volatile sig_atomic_t g_stop;

/* Installs the handlers every process shares (inherited across fork): stop signals set
 * g_stop, SIGCHLD only interrupts waits (the child is then reaped), SIGPIPE is ignored
 * (errors come back as EPIPE). No SA_RESTART: a stop signal interrupts a blocking write
 * so the process can exit.
 *
 * Children are reaped with waitpid(), promptly, on purpose: reaping moves an ended
 * child's I/O counters into its parent's /proc/<pid>/io, so the counters summed over the
 * live process tree still hold every byte an ended client or subscription process moved
 * (the backend's sampler relies on this; see backend.py). */
void proc_install_signals(void);

/* The signals a sleeping process must wake up for; block them, check g_stop, then
 * sleep with the old mask (ppoll/pselect) so a signal cannot slip in between. */
void proc_block_wake_signals(sigset_t *old);
void proc_restore_signals(const sigset_t *old);

/* The children a process started and has not reaped yet. */
struct pid_list {
    pid_t *pids;
    size_t n, cap;
};

/* Makes room for one more pid (reaping ended children first); false if out of memory. */
bool pid_list_reserve(struct pid_list *list);
/* Adds a pid; call pid_list_reserve first. */
void pid_list_push(struct pid_list *list, pid_t pid);
/* Reaps every ended child and drops it from the list. */
void pid_list_reap(struct pid_list *list);
/* Sends `sig` to every child in the list. */
void pid_list_signal(const struct pid_list *list, int sig);
/* Waits until every child has ended or `deadline_ms` (proc_now_ms) has passed. */
void pid_list_wait(struct pid_list *list, long long deadline_ms);
/* Frees the list itself; the children are left alone. */
void pid_list_free(struct pid_list *list);

/* Asks the kernel to SIGTERM this process when `parent` (the process that forked it)
 * dies, and exits at once if that already happened during the fork. */
void proc_die_with_parent(pid_t parent);

/* One line to stderr, prefixed with the program name and pid, written with one write()
 * so lines of concurrent processes do not interleave. */
void log_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Milliseconds of CLOCK_MONOTONIC. */
long long proc_now_ms(void);

#endif
