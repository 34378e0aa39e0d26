/* The open-loop run: publishers on their schedule (intended send times kept, so
 * coordinated omission stays visible), deliveries until every client is done. */
#include <stdlib.h>
#include <string.h>

#include "client.h"

#define MAX_WAIT_NS 50000000LL
/* A publisher with this many bytes queued behind its socket builds nothing more until the
 * socket takes some: its next messages wait in the schedule, due at their intended times,
 * and leave late (the send lag shows it) instead of piling up in memory as "published". */
#define OUT_HIGH_WATER (256 * 1024)
#define MISC_INTERVAL_NS 250000000LL

int64_t mqe_due_ns(const mqe_engine *e, const mqe_client *c, int64_t k) {
    /* the same arithmetic as MqttSession._due_ns: int(k * 1e9 / rate) */
    return e->t_start_ns + c->start_offset_ns + (int64_t)((double)k * 1e9 / c->rate_hz);
}

static int due_before(const mqe_due *a, const mqe_due *b) {
    if (a->due_ns != b->due_ns)
        return a->due_ns < b->due_ns;
    if (a->client != b->client)
        return a->client < b->client;
    return a->k < b->k;
}

void mqe_heap_push(mqe_engine *e, int64_t due_ns, int32_t client, int64_t k) {
    if (e->n_heap == e->cap_heap) {
        size_t cap = e->cap_heap ? e->cap_heap * 2 : 64;
        mqe_due *heap = realloc(e->heap, cap * sizeof *heap);
        if (heap == NULL) {
            mqe_client_fail(e, &e->clients[client], "out of memory for the schedule");
            return;
        }
        e->heap = heap;
        e->cap_heap = cap;
    }
    size_t at = e->n_heap++;
    mqe_due item = {due_ns, client, k};
    while (at && due_before(&item, &e->heap[(at - 1) / 2])) {
        e->heap[at] = e->heap[(at - 1) / 2];
        at = (at - 1) / 2;
    }
    e->heap[at] = item;
}

static mqe_due heap_pop(mqe_engine *e) {
    mqe_due top = e->heap[0], last = e->heap[--e->n_heap];
    size_t at = 0;
    for (;;) {
        size_t child = 2 * at + 1;
        if (child >= e->n_heap)
            break;
        if (child + 1 < e->n_heap && due_before(&e->heap[child + 1], &e->heap[child]))
            child++;
        if (!due_before(&e->heap[child], &last))
            break;
        e->heap[at] = e->heap[child];
        at = child;
    }
    if (e->n_heap)
        e->heap[at] = last;
    return top;
}

void mqe_run_begin(mqe_engine *e, int64_t t_start_ns, int64_t t_deadline_ns,
                   int64_t t_publish_end_ns, int64_t drain_window_end_ns,
                   int64_t drain_idle_ns) {
    e->t_start_ns = t_start_ns;
    e->t_deadline_ns = t_deadline_ns;
    e->t_publish_end_ns = t_publish_end_ns;
    e->drain_end_ns = drain_window_end_ns;
    e->drain_idle_ns = drain_idle_ns;
    e->n_heap = 0;
    e->running = 1;
    for (size_t i = 0; i < e->n_clients; i++) {
        mqe_client *c = &e->clients[i];
        if (c->role == 0 && c->messages > 0)
            mqe_heap_push(e, mqe_due_ns(e, c, 0), (int32_t)i, 0);
    }
}

static int tx_remember(mqe_client *c, int64_t seq, int64_t t_pub) {
    if (c->tx_count == c->tx_cap) {
        size_t cap = c->tx_cap ? c->tx_cap * 2 : 256;
        int64_t *seqs = malloc(cap * sizeof *seqs), *t_pubs = malloc(cap * sizeof *t_pubs);
        uint64_t *ends = malloc(cap * sizeof *ends);
        if (!seqs || !t_pubs || !ends) {
            free(seqs);
            free(t_pubs);
            free(ends);
            return -1;
        }
        for (size_t i = 0; i < c->tx_count; i++) {
            size_t from = (c->tx_head + i) % (c->tx_cap ? c->tx_cap : 1);
            seqs[i] = c->tx_seq[from];
            t_pubs[i] = c->tx_t_pub[from];
            ends[i] = c->tx_end[from];
        }
        free(c->tx_seq);
        free(c->tx_t_pub);
        free(c->tx_end);
        c->tx_seq = seqs;
        c->tx_t_pub = t_pubs;
        c->tx_end = ends;
        c->tx_head = 0;
        c->tx_cap = cap;
    }
    size_t at = (c->tx_head + c->tx_count++) % c->tx_cap;
    c->tx_seq[at] = seq;
    c->tx_t_pub[at] = t_pub;
    c->tx_end[at] = c->stream_bytes;
    return 0;
}

static uint16_t new_packet_id(mqe_engine *e, mqe_client *c) {
    for (int tries = 0; tries < 0xFFFF; tries++) {
        c->next_packet_id = (uint16_t)(c->next_packet_id % 0xFFFF + 1);
        if (!c->inflight[c->next_packet_id])
            return c->next_packet_id;
    }
    mqe_client_fail(e, c, "65535 publishes await acknowledgement");
    return 0;
}

/* Build message k into the client's output (it leaves at the turn's flush). */
static void publish(mqe_engine *e, mqe_client *c, int64_t k, int64_t t_intended) {
    size_t payload = c->payload_bytes > MQE_PAYLOAD_MIN ? (size_t)c->payload_bytes
                                                        : MQE_PAYLOAD_MIN;
    size_t room = c->tree ? mqe_tree_prefix_max(c) : c->prefix_len, id_at = c->packet_id_at;
    if (mqe_out_reserve(e, c, room + 2 + payload) != 0)
        return;
    int64_t t_pub = mqe_now_ns();
    uint8_t *to = c->out + c->out_len;
    int32_t topic = c->topic_index;
    size_t n = c->prefix_len;
    if (c->tree)  /* topics_tree.c: this message's topic, written in place */
        n = mqe_tree_prefix(c, c->retain ? mqe_retained_slot(c, k) : k, to, &id_at, &topic);
    else
        memcpy(to, c->prefix, c->prefix_len);
    if (c->retain)  /* retained.c: the RETAIN flag (MQTT 3.1.1 3.3.1.3) */
        to[0] |= 0x01;
    if (c->qos) {
        uint16_t packet_id = new_packet_id(e, c);
        if (!packet_id)
            return;
        c->inflight[packet_id] = c->qos == 1 ? MQE_PUBACK : MQE_PUBREC;
        /* MQTT 5: the id's slot is inside the prefix, before the property length */
        uint8_t *slot = id_at ? to + id_at : to + n;
        slot[0] = (uint8_t)(packet_id >> 8);
        slot[1] = (uint8_t)packet_id;
        n += id_at ? 0u : 2u;
    } else if (c->sn) {  /* an MQTT-SN PUBLISH has a msg id always: 0x0000 at QoS 0 */
        to[n++] = 0;
        to[n++] = 0;
    }
    mqe_encode_payload(to + n, payload, (uint64_t)k, c->publisher_index, t_pub, t_intended);
    n += payload;
    c->out_len += n;
    c->stream_bytes += n;
    if (c->sent++ == 0)
        c->first_intended_ns = t_intended;
    c->last_pub_ns = t_pub;
    if (t_pub - t_intended > c->send_lag_max_ns)
        c->send_lag_max_ns = t_pub - t_intended;
    mqe_table *pubs = &e->tables[MQE_T_PUBLISH];
    uint32_t row = pubs->rows++;  /* room checked before the turn */
    MQE_I32(pubs, PUB_CLIENT)[row] = (int32_t)(c - e->clients);
    MQE_I64(pubs, PUB_SEQ)[row] = k;
    MQE_I64(pubs, PUB_T_INTENDED)[row] = t_intended;
    MQE_I64(pubs, PUB_T_PUB)[row] = t_pub;
    MQE_U8(pubs, PUB_WARMUP)[row] = k < c->warmup;
    MQE_I32(pubs, PUB_TOPIC)[row] = topic;
    if (e->kernel_stamps_ok && !c->udp && tx_remember(c, k, t_pub) != 0)
        mqe_client_fail(e, c, "out of memory for send stamps");
}

/* Write each batched publisher's queued PUBLISHes with one send, then mark their lines:
 * like the seed's publisher, the line moves once the PUBLISH is written. */
static void write_batch(mqe_engine *e) {
    for (size_t i = 0; i < e->n_batch; i++) {
        mqe_client *c = &e->clients[e->batch[i]];
        int64_t t_sent = mqe_flush(e, c);
        for (int m = 0; m < c->in_batch; m++)
            mqe_gpio_mark(e, c->gpio_pin, t_sent);
        c->in_batch = 0;
    }
    e->n_batch = 0;
    e->last_publish_ns = mqe_now_ns();
    mqe_gpio_settle(e);
}

/* Done once every publisher has sent (and had acknowledged) its messages and every
 * subscriber has received its own, or, with an idle drain (idle_since_ns), once no
 * subscriber of this engine has received anything since idle_since_ns: a broker still
 * delivering to one subscriber (amqtt sends retained values to one after another) may
 * yet reach the others. A subscriber away (reconnect.c) or whose subscription made in
 * the run was acknowledged since (retained.c) is waited for all the same. */
static int finished(const mqe_engine *e, int window_over, int64_t idle_since_ns) {
    if (e->n_heap || mqe_later_pending(e))  /* retained.c: a SUBSCRIBE still to come */
        return 0;
    int idle = idle_since_ns != MQE_NO_TIME;
    for (size_t i = 0; idle && i < e->n_clients; i++)
        if (e->clients[i].role != 0 && e->clients[i].last_delivery_ns >= idle_since_ns)
            idle = 0;
    for (size_t i = 0; i < e->n_clients; i++) {
        const mqe_client *c = &e->clients[i];
        /* bytes still queued (a broker behind, the socket full) are not yet published:
         * a run that ended here would close the socket on them */
        if (c->out_len && !c->dead && c->fd >= 0)
            return 0;
        if (c->role == 0) {
            if (c->sent + (c->rc ? mqe_reconnect_not_sent(c) : 0) < c->messages
                && !window_over)
                return 0;  /* a closed-loop publisher waits for its acknowledgements */
            /* (reconnect.c: what was in flight when a connection went is given up) */
            if (c->qos && c->acked + (c->rc ? mqe_reconnect_abandoned(c) : 0) < c->sent)
                return 0;
        } else if ((int64_t)c->received.count < c->messages
                   && (!idle || (c->later && c->t_suback_ns >= idle_since_ns)
                       || (c->rc && mqe_reconnect_away(c)))) {
            return 0;
        }
    }
    return 1;
}

static int any_failed(const mqe_engine *e) {
    for (size_t i = 0; i < e->n_clients; i++)
        if (e->clients[i].failure[0])
            return 1;
    return 0;
}

/* Past its slice end a step hands back at the first quiet moment (engine.h says why). */
static int64_t quiet_from(const mqe_engine *e) {
    int64_t after_read = e->last_read_ns + MQE_QUIET_AFTER_READ_NS;
    int64_t after_publish = e->last_publish_ns + MQE_QUIET_AFTER_PUBLISH_NS;
    return after_read > after_publish ? after_read : after_publish;
}

static int quiet(const mqe_engine *e, int64_t now) {
    return now >= quiet_from(e)
           && (!e->n_heap || e->heap[0].due_ns - now >= MQE_QUIET_BEFORE_DUE_NS);
}

/* Once the grace is over, at the next turn with a publish due, before it is sent: the
 * caller's work then delays that send (the send lag shows it), not a delivery. */
static int forced_hand_back(const mqe_engine *e, int64_t now, int64_t slice_end_ns) {
    return now >= slice_end_ns + MQE_SLICE_GRACE_NS
           && (!e->n_heap || e->heap[0].due_ns <= now);
}

/* The hand-back's time and whether it was quiet, as the step decided it (the caller reads
 * its clock only after the return, which a descheduled thread reads late). */
static int hand_back(mqe_engine *e, int64_t now) {
    e->hand_back_ns = now;
    e->hand_back_quiet = quiet(e, now);
    return MQE_SLICE;
}

int64_t mqe_hand_back_of(const mqe_engine *e, int *quiet_out) {
    *quiet_out = e->hand_back_quiet;
    return e->hand_back_ns;
}

int mqe_step(mqe_engine *e, int64_t slice_end_ns) {
    e->need_drain = 0;
    const mqe_table *pubs = &e->tables[MQE_T_PUBLISH], *edges = &e->tables[MQE_T_EDGE];
    for (;;) {
        int64_t now = mqe_now_ns();
        if (now >= slice_end_ns && (quiet(e, now) || forced_hand_back(e, now, slice_end_ns)))
            return hand_back(e, now);
        int full = pubs->rows + MQE_MAX_BATCH > pubs->capacity
                   || edges->rows + 2 * MQE_MAX_BATCH > edges->capacity;
        /* a generator behind schedule sends in turns of MAX_BATCH, reading between them */
        int in_turn = 0, backed_up = 0;
        while (!full && e->n_heap && e->heap[0].due_ns <= now && now <= e->t_publish_end_ns
               && in_turn < MQE_MAX_BATCH) {
            const mqe_client *next = &e->clients[e->heap[0].client];
            if (next->out_len - next->out_head >= OUT_HIGH_WATER && !next->udp) {
                backed_up = 1;  /* until its socket is writable (EPOLLOUT) again */
                break;
            }
            /* MQTT 5: no more QoS 1/2 publishes in flight than the broker's Receive
             * Maximum; the next waits for an ack (a read wakes the loop) and leaves late */
            if (next->grants.receive_maximum && next->qos
                && next->sent - next->acked >= next->grants.receive_maximum) {
                backed_up = 1;
                break;
            }
            mqe_due due = heap_pop(e);
            mqe_client *c = &e->clients[due.client];
            int away = c->rc && mqe_reconnect_away(c);  /* reconnect.c: not sent, counted */
            if (away) {
                mqe_reconnect_skipped(c);
            } else {
                publish(e, c, due.k, due.due_ns);
                if (c->in_batch++ == 0)
                    e->batch[e->n_batch++] = due.client;
            }
            in_turn++;
            if ((!c->closed_loop || away) && due.k + 1 < c->messages)
                mqe_heap_push(e, mqe_due_ns(e, c, due.k + 1), due.client, due.k + 1);
            now = mqe_now_ns();
        }
        if (e->n_batch) {
            write_batch(e);
            now = mqe_now_ns();
        }
        if (now > e->t_publish_end_ns)
            e->n_heap = 0;  /* the publishing window is over: acks and drain only */
        int64_t idle_since = MQE_NO_TIME;
        if (e->drain_idle_ns > 0 && now - e->drain_end_ns >= e->drain_idle_ns)
            idle_since = now - e->drain_idle_ns;
        if (finished(e, now > e->t_publish_end_ns, idle_since)) {
            e->running = 0;
            return MQE_DONE;
        }
        if (now > e->t_deadline_ns) {
            e->running = 0;
            return MQE_DEADLINE;
        }
        if (full || e->need_drain)
            return MQE_DRAIN;
        int64_t wait = e->n_heap && !backed_up ? e->heap[0].due_ns - now : MAX_WAIT_NS;
        if (wait > MAX_WAIT_NS)
            wait = MAX_WAIT_NS;
        if (now < slice_end_ns) {
            if (wait > slice_end_ns - now)
                wait = slice_end_ns - now;
        } else if (quiet(e, now)) {
            return hand_back(e, now);
        } else {
            /* look again when the last publish's deliveries should be in and the reads
             * have settled (a read wakes us anyway), at the next publish, or when the
             * grace is over */
            int64_t quiet_at = quiet_from(e), grace_end = slice_end_ns + MQE_SLICE_GRACE_NS;
            if (quiet_at > now && wait > quiet_at - now)
                wait = quiet_at - now;
            if (grace_end > now && wait > grace_end - now)
                wait = grace_end - now;
        }
        if (e->n_rc)  /* reconnect.c: absences and reconnect attempts due */
            wait = mqe_reconnect_tick(e, now, wait);
        if (e->n_later_unsent) {  /* retained.c: later SUBSCRIBEs due, the wait to the next */
            mqe_later_tick(e, now);
            wait = mqe_later_wait(e, mqe_now_ns(), wait);
        }
        mqe_handle_events(e, wait);
        if (now - e->last_misc_ns > MISC_INTERVAL_NS)
            mqe_misc(e, now);
        if (any_failed(e))
            return MQE_FAILED;
        if (e->need_drain)
            return MQE_DRAIN;
        if (e->woken) {
            e->woken = 0;
            return MQE_WOKEN;
        }
    }
}
