/* Retained state (workload.retained): publishers that set retained values, subscribers
 * that arrive once they are set.
 *
 * A retained publisher sends message k, with the RETAIN flag (MQTT 3.1.1 3.3.1.3), to
 * topic first + (k mod count) * stride of the level-one tree {topic}/{i} (topics_tree.c
 * interns the names once and writes the PUBLISH): its `count` topics in turn, so that
 * after count * updates messages the last value of each is the one sent last.
 *
 * A late subscriber's SUBSCRIBE is written during the run, at its intended time: the
 * run's start plus after_start_ns (the controller's window: every publisher's schedule,
 * over all agents, then the wait), and no earlier than after_publishers_ns past the
 * moment this engine's own publishers had all sent their messages and, at QoS > 0, had
 * them acknowledged (the broker then holds every value it was given here). The loop
 * wakes for it (mqe_later_wait), and the run is not over while one has no SUBACK. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

struct mqe_later {
    char *filter;
    int qos;
    int64_t after_start_ns, after_publishers_ns;
    int sent;                   /* the SUBSCRIBE was written */
};

int mqe_set_retained(mqe_engine *e, int client, uint32_t topics, uint32_t first,
                     uint32_t stride, uint32_t count) {
    if (client < 0 || (size_t)client >= e->n_clients) {
        snprintf(e->error, sizeof e->error, "no client %d", client);
        return -1;
    }
    mqe_client *c = &e->clients[client];
    if (count < 1 || stride < 1 || first >= topics
        || (uint64_t)first + (uint64_t)(count - 1) * stride >= topics) {
        snprintf(e->error, sizeof e->error, "client %s: retained topics %u + j * %u for j < "
                 "%u are not all below %u", c->client_id, first, stride, count, topics);
        return -1;
    }
    /* the names {topic}/{i}: a tree of one level of `topics` (its message i is topic i) */
    if (mqe_set_topic_tree(e, client, 1, topics, 0) != 0)
        return -1;
    c->retain = 1;
    c->retain_first = first;
    c->retain_stride = stride;
    c->retain_count = count;
    return 0;
}

int64_t mqe_retained_slot(const mqe_client *c, int64_t k) {
    return (int64_t)c->retain_first
           + (k % (int64_t)c->retain_count) * (int64_t)c->retain_stride;
}

int mqe_subscribe_later(mqe_engine *e, int client, const char *topic_filter, int qos,
                        int64_t after_start_ns, int64_t after_publishers_ns) {
    if (client < 0 || (size_t)client >= e->n_clients) {
        snprintf(e->error, sizeof e->error, "no client %d", client);
        return -1;
    }
    mqe_client *c = &e->clients[client];
    if (qos < 0 || qos > 2 || after_start_ns < 0 || after_publishers_ns < 0 || c->later) {
        snprintf(e->error, sizeof e->error, "client %s: a later subscription at QoS %d, %lld "
                 "ns after the start and %lld ns after the publishers (once per client, "
                 "none negative)", c->client_id, qos, (long long)after_start_ns,
                 (long long)after_publishers_ns);
        return -1;
    }
    struct mqe_later *later = calloc(1, sizeof *later);
    if (later == NULL || (later->filter = strdup(topic_filter)) == NULL) {
        free(later);
        snprintf(e->error, sizeof e->error, "out of memory for client %s", c->client_id);
        return -1;
    }
    later->qos = qos;
    later->after_start_ns = after_start_ns;
    later->after_publishers_ns = after_publishers_ns;
    c->later = later;
    e->n_later++;
    e->n_later_unsent++;
    e->publishers_done_ns = MQE_NO_TIME;
    return 0;
}

/* When this engine's publishers were all done (sent, and acknowledged at QoS > 0), or
 * MQE_NO_TIME while one is not; INT64_MIN + 1 when it has none. */
static int64_t publishers_done(mqe_engine *e, int64_t now) {
    if (e->publishers_done_ns != MQE_NO_TIME)
        return e->publishers_done_ns;
    int any = 0;
    for (size_t i = 0; i < e->n_clients; i++) {
        const mqe_client *c = &e->clients[i];
        if (c->role != 0)
            continue;
        any = 1;
        int window_over = now > e->t_publish_end_ns;
        if ((c->sent < c->messages && !window_over) || (c->qos && c->acked < c->sent))
            return MQE_NO_TIME;
    }
    e->publishers_done_ns = any ? now : INT64_MIN + 1;
    return e->publishers_done_ns;
}

/* A later subscription's intended time, or MQE_NO_TIME while its publishers are busy. */
static int64_t due_ns(const mqe_engine *e, const struct mqe_later *later, int64_t done) {
    if (done == MQE_NO_TIME)
        return MQE_NO_TIME;
    int64_t from_start = e->t_start_ns + later->after_start_ns;
    int64_t from_done = done == INT64_MIN + 1 ? from_start : done + later->after_publishers_ns;
    return from_start > from_done ? from_start : from_done;
}

void mqe_later_tick(mqe_engine *e, int64_t now) {
    if (!e->running || !e->n_later_unsent)  /* nothing to do: no cost per loop turn */
        return;
    int64_t done = MQE_NO_TIME;
    for (size_t i = 0; i < e->n_clients; i++) {
        mqe_client *c = &e->clients[i];
        struct mqe_later *later = c->later;
        if (later == NULL || later->sent)
            continue;
        if (done == MQE_NO_TIME && (done = publishers_done(e, now)) == MQE_NO_TIME)
            return;
        int64_t due = due_ns(e, later, done);
        if (now < due)
            continue;
        later->sent = 1;
        e->n_later_unsent--;
        if (mqe_subscribe(e, (int)i, later->filter, later->qos) != 0) {
            mqe_client_fail(e, c, "%s", e->error);
            continue;
        }
        c->t_subscribe_intended_ns = due;
    }
}

int64_t mqe_later_wait(mqe_engine *e, int64_t now, int64_t wait) {
    if (!e->running || !e->n_later_unsent)
        return wait;
    int64_t done = publishers_done(e, now);
    if (done == MQE_NO_TIME)
        return wait;  /* an acknowledgement wakes the loop */
    for (size_t i = 0; i < e->n_clients; i++) {
        const struct mqe_later *later = e->clients[i].later;
        if (later == NULL || later->sent)
            continue;
        int64_t until = due_ns(e, later, done) - now;
        if (until < wait)
            wait = until > 0 ? until : 0;
    }
    return wait;
}

int mqe_later_pending(const mqe_engine *e) {
    if (!e->n_later)
        return 0;
    for (size_t i = 0; i < e->n_clients; i++) {
        const mqe_client *c = &e->clients[i];
        if (c->later && !c->dead && !c->failure[0] && (!c->later->sent || !c->subscribed))
            return 1;
    }
    return 0;
}

void mqe_later_free(mqe_client *c) {
    if (c->later == NULL)
        return;
    free(c->later->filter);
    free(c->later);
    c->later = NULL;
}
