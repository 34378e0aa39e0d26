/* The state of one client process, shared by its packet handlers and its connection loop. */
#ifndef MQTTBED_FORKPIPE_SESSION_H
#define MQTTBED_FORKPIPE_SESSION_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "proc.h"

#define CLIENT_ID_SHOWN 64u

struct client {
    int sock;
    pid_t pid;
    pid_t listener;
    char dir[PATH_MAX];
    char id[CLIENT_ID_SHOWN + 1];   /* printable prefix of the client id, for the log */
    bool connected;
    bool dir_created;
    unsigned keepalive_s;
    long long last_packet_ms;
    uint8_t *in;                    /* received bytes not yet handled */
    size_t in_len, in_cap;
    uint8_t *out;                   /* the packet being built */
    size_t out_cap;
    struct pid_list subscriptions;  /* subscription processes started */
    char reason[192];               /* why the connection ended */
    bool violation;                 /* ... and whether that is the client's fault */
};

/* Records why the connection must end (a protocol violation, or not the client's
 * fault) and returns false, so handlers can `return close_because(...)`. */
bool close_because(struct client *c, bool violation, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Acts on one complete packet (first byte, body); false when the connection must close. */
bool handle_packet(struct client *c, uint8_t first, const uint8_t *body, size_t len);

#endif
