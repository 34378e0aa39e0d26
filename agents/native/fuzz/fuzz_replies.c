/* libFuzzer target: whatever a broker may send, to a QoS 2 publisher and a QoS 2
 * subscriber of one engine (`make fuzz`), as WebSocket frames to the same pair over
 * WebSocket (the frame decoder: fuzz/seeds/ws-* hold frames that carry MQTT), the same
 * bytes to the same pair speaking MQTT 5 (properties, reason codes, the broker's
 * DISCONNECT: fuzz/seeds/mqtt5-* hold replies in MQTT 5's form), and whatever
 * an MQTT-SN gateway may send, as datagrams, to a QoS 1 publisher and a QoS 1 wildcard
 * subscriber of the same engine. The first byte picks pulse mode and how the rest is cut;
 * the rest goes half to the publishers, half to the subscribers (fuzz/replies.h). A
 * crash, a leak or undefined behaviour is a bug; a malformed reply or frame must only fail
 * the client, with its reason, and be dropped and counted by the MQTT-SN one. */
#include <stddef.h>
#include <stdint.h>

#include "replies.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    mqe_reply_clients clients;
    mqe_engine *e = mqe_replies_engine(data[0] & 1, &clients);
    if (e == NULL)
        return 0;
    mqe_feed_input(e, &clients, data, size);
    mqe_destroy(e);
    return 0;
}
