/* MQTT 3.1.1 wire format: framing, field readers, UTF-8 and topic rules.
 *
 * Pure functions over byte buffers, no I/O, so every process of the broker shares them
 * and the tests reach them through real packets.
 */
#ifndef MQTTBED_FORKPIPE_MQTT_H
#define MQTTBED_FORKPIPE_MQTT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum mqtt_packet_type {
    MQTT_CONNECT = 1,
    MQTT_CONNACK = 2,
    MQTT_PUBLISH = 3,
    MQTT_PUBACK = 4,
    MQTT_PUBREC = 5,
    MQTT_PUBREL = 6,
    MQTT_PUBCOMP = 7,
    MQTT_SUBSCRIBE = 8,
    MQTT_SUBACK = 9,
    MQTT_UNSUBSCRIBE = 10,
    MQTT_UNSUBACK = 11,
    MQTT_PINGREQ = 12,
    MQTT_PINGRESP = 13,
    MQTT_DISCONNECT = 14,
};

/* The largest remaining length four length bytes can say (spec 2.2.3). */
#define MQTT_MAX_REMAINING 268435455u
/* Fixed header: one type/flags byte and up to four remaining-length bytes. */
#define MQTT_MAX_FIXED_HEADER 5u

#define MQTT_SUBACK_FAILURE 0x80u

enum mqtt_frame_status { MQTT_FRAME_INCOMPLETE, MQTT_FRAME_OK, MQTT_FRAME_MALFORMED };

/* The name of a packet type ("SUBSCRIBE"), for log lines. */
const char *mqtt_packet_name(unsigned type);

/* Reads the fixed header at buf[0..len): on MQTT_FRAME_OK sets the header's length and
 * the remaining length (the packet is header_len + remaining bytes, maybe not all here
 * yet). MALFORMED when the remaining length runs past four bytes. */
enum mqtt_frame_status mqtt_frame(const uint8_t *buf, size_t len, size_t *header_len,
                                  size_t *remaining);

/* Writes the fixed header for (type_and_flags, remaining) to out; returns its length. */
size_t mqtt_fixed_header(uint8_t out[MQTT_MAX_FIXED_HEADER], uint8_t type_and_flags,
                         size_t remaining);

/* A read position inside one packet's body; every reader fails instead of overrunning. */
struct mqtt_cursor {
    const uint8_t *at;
    size_t left;
};

bool mqtt_read_u8(struct mqtt_cursor *c, uint8_t *out);
bool mqtt_read_u16(struct mqtt_cursor *c, uint16_t *out);
/* A two-byte length followed by that many bytes (strings and binary data alike). */
bool mqtt_read_prefixed(struct mqtt_cursor *c, const uint8_t **bytes, size_t *len);

/* Well-formed UTF-8 without U+0000, surrogates or overlong forms (spec 1.5.3). */
bool mqtt_utf8_valid(const uint8_t *s, size_t len);
/* A PUBLISH topic: non-empty, valid UTF-8, no wildcard characters. */
bool mqtt_topic_name_valid(const uint8_t *s, size_t len);
/* A SUBSCRIBE/UNSUBSCRIBE filter: non-empty, valid UTF-8, '+' only as a whole level,
 * '#' only as the whole last level. */
bool mqtt_topic_filter_valid(const uint8_t *s, size_t len);
/* Does topic name `topic` match the valid filter `filter` (spec 4.7)? Topics starting
 * with '$' are not matched by a filter starting with a wildcard. */
bool mqtt_topic_matches(const uint8_t *filter, size_t filter_len, const uint8_t *topic,
                        size_t topic_len);

#endif
