/* Persistent sessions and reconnects, set up (engine.h: mqe_set_persistent,
 * mqe_set_absence, mqe_set_reconnect) and read back (mqe_reconnects, mqe_reconnect_of,
 * mqe_session_present_of); what a client goes through is reconnect.c's. */
#include <stdio.h>
#include <stdlib.h>

#include "reconnect.h"

static struct mqe_reconnect *reconnect_of(mqe_engine *e, mqe_client *c) {
    if (c->rc)
        return c->rc;
    c->rc = calloc(1, sizeof *c->rc);
    if (c->rc == NULL)
        return NULL;
    c->rc->absent_at_ns = -1;
    c->rc->first_present = -1;
    c->session_present = -1;
    e->n_rc++;
    return c->rc;
}

static int check_client(mqe_engine *e, int client) {
    if (client < 0 || (size_t)client >= e->n_clients)
        return mqe_refuse(e, "no client %s", "");
    mqe_client *c = &e->clients[client];
    if (c->udp || c->sn)
        return mqe_refuse(e, "client %s: sessions and reconnects ride on mqtt-tcp only (its "
                      "connection is what goes and comes back)", c->client_id);
    if (c->fd >= 0)
        return mqe_refuse(e, "client %s: set its session and reconnects before it connects",
                      c->client_id);
    return reconnect_of(e, c) ? 0 : mqe_refuse(e, "out of memory for client %s", c->client_id);
}

int mqe_set_persistent(mqe_engine *e, int client, uint32_t session_expiry_s) {
    if (check_client(e, client))
        return -1;
    mqe_client *c = &e->clients[client];
    c->keep_session = 1;
    c->session_expiry_s = session_expiry_s;
    return 0;
}

int mqe_set_absence(mqe_engine *e, int client, int64_t at_ns, int64_t for_ns, int drop) {
    if (check_client(e, client))
        return -1;
    mqe_client *c = &e->clients[client];
    if (at_ns < 0 || for_ns <= 0)
        return mqe_refuse(e, "client %s: an absence starts at 0 or later and lasts more than 0",
                      c->client_id);
    c->rc->absent_at_ns = at_ns;
    c->rc->absent_for_ns = for_ns;
    c->rc->drop = drop != 0;
    return 0;
}

int mqe_set_reconnect(mqe_engine *e, int client, int64_t backoff_initial_ns,
                      int64_t backoff_max_ns) {
    if (check_client(e, client))
        return -1;
    mqe_client *c = &e->clients[client];
    if (backoff_initial_ns <= 0 || backoff_max_ns < backoff_initial_ns)
        return mqe_refuse(e, "client %s: the backoff starts above 0 and its maximum is no less",
                      c->client_id);
    c->rc->on_loss = 1;
    c->rc->backoff_initial_ns = backoff_initial_ns;
    c->rc->backoff_max_ns = backoff_max_ns;
    return 0;
}

int mqe_reconnect_remember(mqe_engine *e, mqe_client *c, int32_t topic, int qos) {
    (void)e;
    struct mqe_reconnect *rc = c->rc;
    for (size_t i = 0; i < rc->n_subs; i++)
        if (rc->subs[i].topic == topic) {
            rc->subs[i].qos = qos;
            return 0;
        }
    rc_subscription *subs = realloc(rc->subs, (rc->n_subs + 1) * sizeof *subs);
    if (subs == NULL)
        return -1;
    rc->subs = subs;
    rc->subs[rc->n_subs++] = (rc_subscription){topic, qos};
    return 0;
}

int mqe_reconnects(const mqe_engine *e, int client) {
    const mqe_client *c = &e->clients[client];
    return c->rc ? (int)c->rc->n_records : 0;
}

int mqe_reconnect_of(const mqe_engine *e, int client, int n, mqe_reconnect_record *out) {
    const mqe_client *c = &e->clients[client];
    if (c->rc == NULL || n < 0 || (size_t)n >= c->rc->n_records)
        return -1;
    *out = c->rc->records[n];
    return 0;
}

int mqe_session_present_of(const mqe_engine *e, int client) {
    const mqe_client *c = &e->clients[client];
    return c->rc ? c->rc->first_present : -1;
}

int mqe_reconnect_away(const mqe_client *c) { return c->rc->state != RC_LIVE || !c->connected; }
int64_t mqe_reconnect_abandoned(const mqe_client *c) { return c->rc->abandoned; }
int64_t mqe_reconnect_not_sent(const mqe_client *c) { return c->rc->skipped; }

void mqe_reconnect_skipped(mqe_client *c) {
    c->rc->skipped++;
    if (c->rc->n_records)
        c->rc->records[c->rc->n_records - 1].skipped++;
}

void mqe_reconnect_free(mqe_client *c) {
    if (c->rc == NULL)
        return;
    free(c->rc->subs);
    free(c->rc->records);
    free(c->rc);
    c->rc = NULL;
}
