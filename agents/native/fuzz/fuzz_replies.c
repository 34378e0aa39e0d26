/* libFuzzer target: whatever a broker may send, to a QoS 2 publisher and a QoS 2
 * subscriber of one engine (`make fuzz`). The first byte picks pulse mode and how the
 * rest is cut into reads; the rest goes half to each client (fuzz/replies.h). A crash, a
 * leak or undefined behaviour is a bug; a malformed reply must only fail the client, with
 * its reason. */
#include <stddef.h>
#include <stdint.h>

#include "replies.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    int publisher, subscriber;
    mqe_engine *e = mqe_replies_engine(data[0] & 1, &publisher, &subscriber);
    if (e == NULL)
        return 0;
    mqe_feed_input(e, publisher, subscriber, data, size);
    mqe_destroy(e);
    return 0;
}
