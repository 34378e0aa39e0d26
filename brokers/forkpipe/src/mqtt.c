/* MQTT 3.1.1 wire format: framing, field readers, UTF-8 and topic rules. */
#include "mqtt.h"

#include <string.h>

const char *mqtt_packet_name(unsigned type) {
    static const char *names[16] = {"reserved type 0", "CONNECT", "CONNACK", "PUBLISH",
                                    "PUBACK", "PUBREC", "PUBREL", "PUBCOMP", "SUBSCRIBE",
                                    "SUBACK", "UNSUBSCRIBE", "UNSUBACK", "PINGREQ",
                                    "PINGRESP", "DISCONNECT", "reserved type 15"};
    return names[type & 15u];
}

enum mqtt_frame_status mqtt_frame(const uint8_t *buf, size_t len, size_t *header_len,
                                  size_t *remaining) {
    size_t value = 0;
    for (size_t i = 1; i < MQTT_MAX_FIXED_HEADER; i++) {
        if (i >= len)
            return MQTT_FRAME_INCOMPLETE;
        value |= (size_t)(buf[i] & 0x7Fu) << (7 * (i - 1));
        if ((buf[i] & 0x80u) == 0) {
            *header_len = i + 1;
            *remaining = value;
            return MQTT_FRAME_OK;
        }
    }
    /* A fifth length byte would be needed: not MQTT. */
    return MQTT_FRAME_MALFORMED;
}

size_t mqtt_fixed_header(uint8_t out[MQTT_MAX_FIXED_HEADER], uint8_t type_and_flags,
                         size_t remaining) {
    size_t n = 0;
    out[n++] = type_and_flags;
    do {
        uint8_t digit = remaining & 0x7Fu;
        remaining >>= 7;
        out[n++] = remaining ? (uint8_t)(digit | 0x80u) : digit;
    } while (remaining && n < MQTT_MAX_FIXED_HEADER);
    return n;
}

bool mqtt_read_u8(struct mqtt_cursor *c, uint8_t *out) {
    if (c->left < 1)
        return false;
    *out = c->at[0];
    c->at += 1;
    c->left -= 1;
    return true;
}

bool mqtt_read_u16(struct mqtt_cursor *c, uint16_t *out) {
    if (c->left < 2)
        return false;
    *out = (uint16_t)((c->at[0] << 8) | c->at[1]);
    c->at += 2;
    c->left -= 2;
    return true;
}

bool mqtt_read_prefixed(struct mqtt_cursor *c, const uint8_t **bytes, size_t *len) {
    uint16_t n;
    if (!mqtt_read_u16(c, &n) || c->left < n)
        return false;
    *bytes = c->at;
    *len = n;
    c->at += n;
    c->left -= n;
    return true;
}

bool mqtt_utf8_valid(const uint8_t *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        uint8_t b = s[i];
        uint32_t cp;
        size_t extra;
        if (b == 0)
            return false;
        if (b < 0x80) {
            i++;
            continue;
        } else if ((b & 0xE0) == 0xC0) {
            cp = b & 0x1Fu;
            extra = 1;
        } else if ((b & 0xF0) == 0xE0) {
            cp = b & 0x0Fu;
            extra = 2;
        } else if ((b & 0xF8) == 0xF0) {
            cp = b & 0x07u;
            extra = 3;
        } else {
            return false; /* continuation byte or 0xF8..0xFF where a lead byte belongs */
        }
        if (len - i <= extra)
            return false;
        for (size_t k = 1; k <= extra; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return false;
            cp = (cp << 6) | (s[i + k] & 0x3Fu);
        }
        static const uint32_t smallest[4] = {0, 0x80, 0x800, 0x10000};
        if (cp < smallest[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += extra + 1;
    }
    return true;
}

bool mqtt_topic_name_valid(const uint8_t *s, size_t len) {
    return len > 0 && mqtt_utf8_valid(s, len) && memchr(s, '+', len) == NULL &&
           memchr(s, '#', len) == NULL;
}

bool mqtt_topic_filter_valid(const uint8_t *s, size_t len) {
    if (len == 0 || !mqtt_utf8_valid(s, len))
        return false;
    for (size_t i = 0; i < len; i++) {
        bool level_start = i == 0 || s[i - 1] == '/';
        bool level_end = i + 1 == len || s[i + 1] == '/';
        if (s[i] == '+' && !(level_start && level_end))
            return false;
        if (s[i] == '#' && !(level_start && i + 1 == len))
            return false;
    }
    return true;
}

static size_t level_end(const uint8_t *s, size_t len, size_t from) {
    while (from < len && s[from] != '/')
        from++;
    return from;
}

bool mqtt_topic_matches(const uint8_t *filter, size_t filter_len, const uint8_t *topic,
                        size_t topic_len) {
    if (topic_len > 0 && topic[0] == '$' && filter_len > 0 &&
        (filter[0] == '+' || filter[0] == '#'))
        return false;
    size_t fi = 0, ti = 0;
    bool topic_exhausted = false;
    for (;;) {
        size_t fe = level_end(filter, filter_len, fi);
        /* '#' is always the last level; it also matches the parent ("a/#" matches "a"). */
        if (fe - fi == 1 && filter[fi] == '#')
            return true;
        if (topic_exhausted)
            return false;
        size_t te = level_end(topic, topic_len, ti);
        bool single_wildcard = fe - fi == 1 && filter[fi] == '+';
        if (!single_wildcard &&
            (fe - fi != te - ti || memcmp(filter + fi, topic + ti, fe - fi) != 0))
            return false;
        bool filter_last = fe == filter_len, topic_last = te == topic_len;
        if (filter_last)
            return topic_last;
        fi = fe + 1;
        if (topic_last)
            topic_exhausted = true;
        else
            ti = te + 1;
    }
}
