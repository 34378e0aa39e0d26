/* The state of a persistent or reconnecting client (reconnect.c, reconnect_setup.c). */
#ifndef MQE_RECONNECT_H
#define MQE_RECONNECT_H

#include <stddef.h>
#include <stdint.h>

#include "client.h"

enum { RC_LIVE, RC_AWAY, RC_CONNECTING, RC_HANDSHAKE };

typedef struct {
    int32_t topic;
    int qos;
} rc_subscription;

struct mqe_reconnect {
    /* what was asked */
    int64_t absent_at_ns, absent_for_ns;   /* from the run's start; absent_at_ns < 0: none */
    int drop;                              /* leave by closing the socket, no DISCONNECT */
    int on_loss;                           /* a lost connection is connected again */
    int64_t backoff_initial_ns, backoff_max_ns;
    rc_subscription *subs;                 /* what it subscribed to, for a subscribe again */
    size_t n_subs;
    /* where it stands */
    int state, absence_taken, first_present;
    int64_t due_ns;                        /* RC_AWAY: the next attempt */
    int64_t backoff_ns;                    /* the wait after the next failed attempt */
    int64_t abandoned, skipped;
    mqe_reconnect_record *records;
    size_t n_records, cap_records;
};

#endif
