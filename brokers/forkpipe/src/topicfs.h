/* The broker's state as a file tree, as in the seed design:
 *
 *     <base>/<client pid>/            one directory per connected client
 *     <base>/<client pid>/<filter>    one named pipe per subscription of that client
 *
 * A topic filter becomes one file name by percent-encoding: bytes A-Z a-z 0-9 '_' '-'
 * stay, every other byte becomes %XX. So "a/+/c" is the pipe "a%2F%2B%2Fc": levels,
 * wildcards, dots and spaces all survive, and no name can be "." or "..". A filter
 * whose encoded name would be longer than NAME_MAX (255) cannot be stored. */
#ifndef MQTTBED_FORKPIPE_TOPICFS_H
#define MQTTBED_FORKPIPE_TOPICFS_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Encodes `filter` into out (NUL-terminated); false if longer than NAME_MAX. */
bool topicfs_encode(const uint8_t *filter, size_t len, char out[NAME_MAX + 1]);
/* Decodes a pipe name back into its filter; false if `name` is not one we made. */
bool topicfs_decode(const char *name, uint8_t out[NAME_MAX], size_t *len);

/* Writes "<base>/<pid>" into out; false if it does not fit. */
bool topicfs_client_dir(pid_t pid, char out[PATH_MAX]);

/* Creates this client's directory. */
bool topicfs_create_client_dir(pid_t pid);
/* Deletes a client's pipes and its directory (its subscription processes notice and
 * stop). Missing entries are fine: it may run twice. */
void topicfs_remove_client_dir(pid_t pid);

/* Writes `packet` (one complete PUBLISH) into every pipe, of every client, whose filter
 * matches `topic`; returns how many pipes took it. Each write holds an exclusive
 * flock() on the pipe, so packets of concurrent publishers never interleave even when
 * larger than PIPE_BUF. A pipe without a reader (its subscription process is gone) is
 * skipped. */
int topicfs_publish(const uint8_t *topic, size_t topic_len, const uint8_t *packet,
                    size_t packet_len);

#endif
