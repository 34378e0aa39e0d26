/* mqttbed-forkpipe: an MQTT 3.1.1 broker made of processes and named pipes.
 *
 * The listener process accepts connections and forks one client process per
 * connection (client.c); each client forks one process per subscription
 * (subscription.c); they meet through named pipes under --base-dir (topicfs.c). This is
 * the design of the fork/pipe seed broker, kept on purpose: mqttbed measures what it
 * costs next to Mosquitto.
 *
 * Stopping: SIGTERM/SIGINT/SIGHUP make the listener stop its clients, wait for them and
 * remove the base directory it created. If the listener is killed outright, every child
 * gets SIGTERM from the kernel (PR_SET_PDEATHSIG) and cleans up after itself. */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "counters.h"
#include "mqtt.h"
#include "proc.h"
#include "topicfs.h"

#define STOP_GRACE_MS 5000

static const char USAGE[] =
    "usage: mqttbed-forkpipe --port N --base-dir DIR [options]\n"
    "\n"
    "An MQTT 3.1.1 broker with one process per client and per subscription, which meet\n"
    "through named pipes DIR/<client pid>/<encoded topic filter>.\n"
    "\n"
    "  --port N                 TCP port to listen on (0: any free port)\n"
    "  --base-dir DIR           state directory; created (and removed at exit) if missing\n"
    "  --bind ADDR              IPv4 address to listen on (default 127.0.0.1)\n"
    "  --select-timeout-ms MS   how often a subscription checks its pipe (default 100)\n"
    "  --send-timeout-ms MS     disconnect a client that reads nothing this long (10000)\n"
    "  --connect-timeout-ms MS  a connection must send CONNECT within this (10000)\n"
    "  --max-packet-bytes N     close connections sending larger packets (268435460)\n"
    "  --counters-file FILE     keep socket bytes in and out of all processes here\n"
    "                           (two native-endian uint64, shared by every process)\n"
    "  --verbose                log every connect and disconnect\n"
    "  --version                print the version and exit\n";

static long parse_number(const char *option, const char *text, long min, long max) {
    char *end;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno != 0 || *text == '\0' || *end != '\0' || value < min || value > max) {
        fprintf(stderr, "mqttbed-forkpipe: %s %s: expected a whole number from %ld to %ld\n",
                option, text, min, max);
        exit(2);
    }
    return value;
}

static int listen_on(const char *address, int port) {
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, address, &addr.sin_addr) != 1) {
        fprintf(stderr, "mqttbed-forkpipe: --bind %s: not an IPv4 address\n", address);
        return -1;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, SOMAXCONN) != 0) {
        fprintf(stderr, "mqttbed-forkpipe: cannot listen on %s:%d: %s\n", address, port,
                strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

static bool prepare_base_dir(const char *dir) {
    if (mkdir(dir, 0700) == 0) {
        g_config.created_base = true;
        return true;
    }
    struct stat st;
    if (errno == EEXIST && stat(dir, &st) == 0 && S_ISDIR(st.st_mode))
        return true;
    fprintf(stderr, "mqttbed-forkpipe: --base-dir %s: %s\n", dir,
            errno == EEXIST ? "exists and is not a directory" : strerror(errno));
    return false;
}

/* Forks the process that serves `conn`. */
static void start_client(int listener_fd, int conn, struct pid_list *clients) {
    if (!pid_list_reserve(clients)) {
        log_line("out of memory tracking client processes; connection refused");
        close(conn);
        return;
    }
    pid_t listener = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        close(listener_fd);
        pid_list_free(clients); /* the listener's business, not the client's */
        exit(client_run(conn, listener));
    }
    if (pid < 0)
        /* The finding the seed paper describes at scale: say it, drop this client only. */
        log_line("cannot fork a client process: %s; connection refused", strerror(errno));
    else
        pid_list_push(clients, pid);
    close(conn);
}

/* Asks every client process to finish, waits, and kills what does not. */
static void stop_clients(struct pid_list *clients) {
    pid_list_signal(clients, SIGTERM);
    pid_list_wait(clients, proc_now_ms() + STOP_GRACE_MS);
    for (size_t i = 0; i < clients->n; i++) {
        log_line("client process %d did not stop; killing it", (int)clients->pids[i]);
        kill(clients->pids[i], SIGKILL);
        waitpid(clients->pids[i], NULL, 0);
        topicfs_remove_client_dir(clients->pids[i]);
    }
}

int main(int argc, char **argv) {
    const char *bind_address = "127.0.0.1";
    long port = -1;
    g_config = (struct broker_config){
        .select_timeout_ms = 100,
        .send_timeout_ms = 10000,
        .connect_timeout_ms = 10000,
        .max_packet_bytes = MQTT_MAX_FIXED_HEADER + MQTT_MAX_REMAINING,
    };
    const char *counters_file = NULL;
    enum { OPT_PORT = 256, OPT_BASE, OPT_BIND, OPT_SELECT, OPT_SEND, OPT_CONNECT, OPT_MAX,
           OPT_COUNTERS, OPT_VERBOSE, OPT_VERSION, OPT_HELP };
    static const struct option options[] = {
        {"port", required_argument, NULL, OPT_PORT},
        {"base-dir", required_argument, NULL, OPT_BASE},
        {"bind", required_argument, NULL, OPT_BIND},
        {"select-timeout-ms", required_argument, NULL, OPT_SELECT},
        {"send-timeout-ms", required_argument, NULL, OPT_SEND},
        {"connect-timeout-ms", required_argument, NULL, OPT_CONNECT},
        {"max-packet-bytes", required_argument, NULL, OPT_MAX},
        {"counters-file", required_argument, NULL, OPT_COUNTERS},
        {"verbose", no_argument, NULL, OPT_VERBOSE},
        {"version", no_argument, NULL, OPT_VERSION},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0},
    };
    int opt;
    while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (opt) {
        case OPT_PORT: port = parse_number("--port", optarg, 0, 65535); break;
        case OPT_BASE: g_config.base_dir = optarg; break;
        case OPT_BIND: bind_address = optarg; break;
        case OPT_SELECT:
            g_config.select_timeout_ms = (int)parse_number("--select-timeout-ms", optarg, 1, 60000);
            break;
        case OPT_SEND:
            g_config.send_timeout_ms = (int)parse_number("--send-timeout-ms", optarg, 1, 3600000);
            break;
        case OPT_CONNECT:
            g_config.connect_timeout_ms =
                (int)parse_number("--connect-timeout-ms", optarg, 1, 3600000);
            break;
        case OPT_MAX:
            g_config.max_packet_bytes = (size_t)parse_number(
                "--max-packet-bytes", optarg, 64, MQTT_MAX_FIXED_HEADER + MQTT_MAX_REMAINING);
            break;
        case OPT_COUNTERS: counters_file = optarg; break;
        case OPT_VERBOSE: g_config.verbose = true; break;
        case OPT_VERSION: printf("mqttbed-forkpipe %s (MQTT 3.1.1)\n", FORKPIPE_VERSION); return 0;
        case OPT_HELP: fputs(USAGE, stdout); return 0;
        default: fputs(USAGE, stderr); return 2;
        }
    }
    if (port < 0 || g_config.base_dir == NULL || optind != argc) {
        fputs(USAGE, stderr);
        return 2;
    }

    if (counters_file != NULL && !counters_open(counters_file))
        return 1;
    proc_install_signals();
    int listener_fd = listen_on(bind_address, (int)port);
    if (listener_fd < 0 || !prepare_base_dir(g_config.base_dir))
        return 1;
    struct sockaddr_in bound;
    socklen_t bound_len = sizeof bound;
    getsockname(listener_fd, (struct sockaddr *)&bound, &bound_len);
    log_line("version %s listening on %s:%d, state in %s", FORKPIPE_VERSION, bind_address,
             ntohs(bound.sin_port), g_config.base_dir);

    struct pid_list clients = {0};
    while (!g_stop) {
        struct pollfd p = {.fd = listener_fd, .events = POLLIN};
        sigset_t old;
        proc_block_wake_signals(&old);
        int ready = g_stop ? -1 : ppoll(&p, 1, NULL, &old);
        proc_restore_signals(&old);
        pid_list_reap(&clients);
        if (ready <= 0)
            continue;
        int conn = accept4(listener_fd, NULL, NULL, SOCK_CLOEXEC);
        if (conn >= 0) {
            start_client(listener_fd, conn, &clients);
        } else if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            log_line("cannot accept a connection: %s", strerror(errno));
            nanosleep(&(struct timespec){.tv_nsec = 100000000L}, NULL); /* don't spin */
        }
    }
    close(listener_fd);
    stop_clients(&clients);
    pid_list_free(&clients);
    if (g_config.created_base && rmdir(g_config.base_dir) != 0 && errno != ENOENT)
        log_line("cannot remove %s: %s", g_config.base_dir, strerror(errno));
    log_line("stopped");
    return 0;
}
