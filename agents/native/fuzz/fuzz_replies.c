/* libFuzzer target: whatever a broker may send, to a QoS 2 publisher and a QoS 2
 * subscriber of one engine (`make fuzz`). The first byte picks pulse mode and how the
 * rest is cut into reads; the rest goes half to each client. A crash, a leak or undefined
 * behaviour is a bug; a malformed reply must only fail the client, with its reason. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../src/engine.h"

static void feed_in_reads(mqe_engine *e, int client, const uint8_t *data, size_t size,
                          size_t read_bytes) {
    for (size_t at = 0; at < size; at += read_bytes) {
        size_t n = size - at < read_bytes ? size - at : read_bytes;
        if (mqe_feed(e, client, data + at, n) != 0)
            return;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    mqe_engine *e = mqe_create(1024, 0, data[0] & 1);
    if (e == NULL)
        return 0;
    int publisher = mqe_add_client(e, "pub-0", "127.0.0.1", 1, 0, "f/x", 2, 2, 0, 64, 1000.0,
                                   10, 1, 0, 0);
    int subscriber = mqe_add_client(e, "sub-0", "127.0.0.1", 1, 1, "f/x", 2, 3, 0, 0, 0.0,
                                    10, 1, 0, 0);
    mqe_subscribe(e, subscriber, "f/+", 2);
    size_t read_bytes = (size_t)(data[0] >> 1) + 1, half = (size - 1) / 2;
    feed_in_reads(e, publisher, data + 1, half, read_bytes);
    feed_in_reads(e, subscriber, data + 1 + half, size - 1 - half, read_bytes);
    mqe_destroy(e);
    return 0;
}
