/* What the engine does with each packet from the broker: CONNACK, SUBACK, PINGRESP,
 * deliveries (recorded, acknowledged: PUBACK, or PUBREC then PUBCOMP on PUBREL, a QoS 2
 * message delivered once) and the acknowledgements of its own publishes; in MQTT 5 also
 * their reason codes (a failure named) and the broker's DISCONNECT (its reason named). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

static void queue_ack(mqe_engine *e, mqe_client *c, int type, uint16_t packet_id) {
    if (mqe_out_reserve(e, c, 4) != 0)
        return;
    c->out_len += mqe_encode_ack(c->out + c->out_len, type, packet_id);
    c->stream_bytes += 4;
}


void mqe_record_subscribed(mqe_engine *e, mqe_client *c) {
    mqe_table *subs = &e->tables[MQE_T_SUBSCRIBE];
    if (subs->rows == subs->capacity) {
        mqe_client_fail(e, c, "event buffer full (%u subscriptions not drained)", subs->rows);
        return;
    }
    uint32_t row = subs->rows++;
    MQE_I32(subs, SUB_CLIENT)[row] = (int32_t)(c - e->clients);
    MQE_I32(subs, SUB_TOPIC)[row] = c->subscribing_topic;
    MQE_U8(subs, SUB_QOS)[row] = (uint8_t)c->subscribing_qos;
    MQE_I64(subs, SUB_T_SUBACK)[row] = c->t_suback_ns = mqe_now_ns();
    MQE_I64(subs, SUB_T_SENT)[row] = c->t_subscribe_sent_ns;          /* retained.c */
    MQE_I64(subs, SUB_T_INTENDED)[row] = c->t_subscribe_intended_ns;
}

static int64_t warmup_of(const mqe_client *c, uint32_t publisher) {
    for (size_t i = 0; i < c->n_ranges; i++)
        if (c->ranges[i].first <= publisher && publisher < c->ranges[i].end)
            return c->ranges[i].warmup;
    return c->warmup;
}

static int32_t topic_index(mqe_engine *e, mqe_client *c, const mqe_packet *p) {
    for (size_t i = 0; i < c->n_subs; i++)
        if (c->subs[i].len == p->topic_len && memcmp(c->subs[i].name, p->topic, p->topic_len) == 0)
            return c->subs[i].index;
    return (int32_t)mqe_intern(&e->topics, (const char *)p->topic, p->topic_len);
}

void mqe_delivered(mqe_engine *e, mqe_client *c, const mqe_packet *p, int64_t t_user,
                   int64_t t_kernel) {
    mqe_gpio_mark(e, c->gpio_pin, t_user);
    uint64_t seq;
    uint32_t publisher;
    int64_t t_pub, t_intended;
    if (mqe_decode_payload(p->payload, p->payload_len, &seq, &publisher, &t_pub, &t_intended))
        return;  /* not one of ours (e.g. a stray retained message) */
    int fresh = mqe_set_add(&c->received, ((uint64_t)publisher << 40) ^ seq);
    if (fresh < 0) {
        mqe_client_fail(e, c, "out of memory for the messages received");
        return;
    }
    c->last_delivery_ns = t_user;
    c->deliveries++;
    int32_t topic = topic_index(e, c, p);
    mqe_table *dlv = &e->tables[MQE_T_DELIVERY];
    if (topic < 0 || dlv->rows == dlv->capacity) {
        mqe_client_fail(e, c, "event buffer full (%u deliveries not drained)", dlv->rows);
        return;
    }
    uint32_t row = dlv->rows++;
    MQE_I32(dlv, DLV_CLIENT)[row] = (int32_t)(c - e->clients);
    MQE_I32(dlv, DLV_PUBLISHER)[row] = (int32_t)publisher;
    MQE_I64(dlv, DLV_SEQ)[row] = (int64_t)seq;
    MQE_I32(dlv, DLV_TOPIC)[row] = topic;
    MQE_I32(dlv, DLV_PAYLOAD_BYTES)[row] = (int32_t)p->payload_len;
    MQE_U8(dlv, DLV_QOS)[row] = (uint8_t)p->qos;
    MQE_U8(dlv, DLV_WARMUP)[row] = (int64_t)seq < warmup_of(c, publisher);
    MQE_I64(dlv, DLV_T_INTENDED)[row] = t_intended;
    MQE_I64(dlv, DLV_T_PUB)[row] = t_pub;
    MQE_I64(dlv, DLV_T_RECV)[row] = t_kernel == MQE_NO_TIME ? t_user : t_kernel;
    MQE_U8(dlv, DLV_KERNEL)[row] = t_kernel != MQE_NO_TIME;
    MQE_I64(dlv, DLV_T_RECV_USER)[row] = t_user;
    MQE_U8(dlv, DLV_RETAIN)[row] = (uint8_t)(p->type == MQE_PUBLISH && (p->flags & 1));
}

static int bit(const uint8_t *bits, uint16_t i) { return (bits[i >> 3] >> (i & 7)) & 1; }

static void publish_received(mqe_engine *e, mqe_client *c, const mqe_packet *p,
                             int64_t t_user, int64_t t_kernel) {
    if (p->qos == 1) {
        queue_ack(e, c, MQE_PUBACK, p->packet_id);
    } else if (p->qos == 2) {
        queue_ack(e, c, MQE_PUBREC, p->packet_id);
        if (c->awaiting_pubrel == NULL && (c->awaiting_pubrel = calloc(8192, 1)) == NULL) {
            mqe_client_fail(e, c, "out of memory for QoS 2 deliveries");
            return;
        }
        if (bit(c->awaiting_pubrel, p->packet_id))
            return;  /* a DUP of a message already delivered */
        c->awaiting_pubrel[p->packet_id >> 3] |= (uint8_t)(1u << (p->packet_id & 7));
    }
    mqe_delivered(e, c, p, t_user, t_kernel);
}

void mqe_acknowledged(mqe_engine *e, mqe_client *c, int type, uint16_t packet_id) {
    if (type == MQE_PUBREL) {
        if (c->awaiting_pubrel)
            c->awaiting_pubrel[packet_id >> 3] &= (uint8_t)~(1u << (packet_id & 7));
        queue_ack(e, c, MQE_PUBCOMP, packet_id);
        return;
    }
    int awaited = c->inflight ? c->inflight[packet_id] : 0;
    if (awaited != type) {
        mqe_client_fail(e, c, "malformed packet from the broker: %s for packet id %u, which "
                        "awaits %s", mqe_type_name(type), packet_id,
                        awaited ? mqe_type_name(awaited) : "nothing");
        return;
    }
    if (type == MQE_PUBREC) {
        c->inflight[packet_id] = MQE_PUBCOMP;
        queue_ack(e, c, MQE_PUBREL, packet_id);
        return;
    }
    c->inflight[packet_id] = 0;
    c->acked++;
    if (c->closed_loop && e->running && c->sent < c->messages) {
        /* the next message is due now, or at its place in the schedule if that is later */
        int64_t due = mqe_due_ns(e, c, c->sent), now = mqe_now_ns();
        mqe_heap_push(e, due > now ? due : now, (int32_t)(c - e->clients), c->sent);
    }
}

/* MQTT 5: an acknowledgement of a failure (reason code 0x80 or more) fails the client,
 * naming it; 1 if it did. */
static int ack_refused(mqe_engine *e, mqe_client *c, const mqe_packet *p) {
    if (p->return_code < 0x80)
        return 0;
    char said[MQE_ERROR_CHARS];
    mqe_reason_string(p, said, sizeof said);
    mqe_client_fail(e, c, "%s refused packet id %u: reason code 0x%02X %s%s",
                    mqe_type_name(p->type), (unsigned)p->packet_id, p->return_code,
                    mqe_reason_name(p->return_code, p->type), said);
    return 1;
}

static void suback_received(mqe_engine *e, mqe_client *c, const mqe_packet *p) {
    if (c->udp) {  /* only the pending SUBSCRIBE's first answer counts */
        if (c->subscribed || p->packet_id != c->next_packet_id)
            return;
        c->resend_len = 0;
    }
    for (size_t i = 0; i < p->payload_len; i++) {
        uint8_t code = p->payload[i];
        if (code < 0x80)
            continue;
        const char *topic = mqe_topic(e, (uint32_t)c->subscribing_topic);
        if (c->mqtt5) {
            char said[MQE_ERROR_CHARS];
            mqe_reason_string(p, said, sizeof said);
            mqe_client_fail(e, c, "SUBACK refused '%s': reason code 0x%02X %s%s", topic, code,
                            mqe_reason_name(code, MQE_SUBACK), said);
        } else {
            mqe_client_fail(e, c, "SUBACK refused '%s': return code 0x%02X", topic, code);
        }
        return;
    }
    c->subscribed = 1;
    if (c->rc && mqe_reconnect_suback(e, c))
        return;  /* a subscribe again after a reconnect: the reconnect's record has it */
    mqe_record_subscribed(e, c);
}

void mqe_handle_packet(mqe_engine *e, mqe_client *c, mqe_packet *p, int64_t t_user,
                       int64_t t_kernel) {
    char error[MQE_ERROR_CHARS];
    mqe_connack_grants grants;
    if (c->mqtt5 && p->type == MQE_CONNACK && p->body_len == 2 && p->body[1] != 0) {
        /* a broker that does not speak MQTT 5 refuses in 3.1.1's form (MQTT 5 section 3.1.4) */
        mqe_client_fail(e, c, "CONNACK refused: return code %u %s, in MQTT 3.1.1's form: broker "
                        "%s:%d does not take MQTT 5 (workload.protocol)", p->body[1],
                        mqe_return_code_name(p->body[1]), c->host, c->port);
        return;
    }
    /* the hot path: a 3.1.1 PUBLISH was read whole by mqe_parse, an MQTT 5 one without
     * properties is read here; the rest is checked by its version's decoder */
    int read_whole = p->type == MQE_PUBLISH && (!c->mqtt5 || mqe_publish5_plain(p));
    if (!read_whole && mqe_decode(p, mqe_level(c), &grants, error) != 0) {
        mqe_client_fail(e, c, "malformed packet from the broker: %s", error);
        return;
    }
    switch (p->type) {
    case MQE_PUBLISH:
        publish_received(e, c, p, t_user, t_kernel);
        break;
    case MQE_CONNACK:
        if (c->udp) {  /* the answer to a CONNECT sent again: once is enough */
            if (c->connected)
                break;
            c->resend_len = 0;
        }
        mqe_session_connack(e, c, p, &grants);
        if (c->connected)  /* the acknowledge flags: bit 0, session present (3.2.2.2) */
            c->session_present = p->body_len ? p->body[0] & 1 : 0;
        if (c->rc)
            mqe_reconnect_connack(e, c, t_user);
        break;
    case MQE_SUBACK:
        suback_received(e, c, p);
        break;
    case MQE_PINGRESP:
        c->ping_sent_ns = 0;
        break;
    case MQE_DISCONNECT: {  /* MQTT 5 only (3.1.1's decoding refuses it) */
        mqe_reason_string(p, error, sizeof error);
        mqe_client_fail(e, c, "broker %s:%d ended the session (DISCONNECT): reason code "
                        "0x%02X %s%s", c->host, c->port, p->return_code,
                        mqe_reason_name(p->return_code, MQE_DISCONNECT), error);
        break;
    }
    default:
        if (!ack_refused(e, c, p))
            mqe_acknowledged(e, c, p->type, p->packet_id);
    }
}
