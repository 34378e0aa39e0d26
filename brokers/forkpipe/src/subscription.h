/* One process per subscription: it reads its named pipe and forwards to the client. */
#ifndef MQTTBED_FORKPIPE_SUBSCRIPTION_H
#define MQTTBED_FORKPIPE_SUBSCRIPTION_H

#include <stdint.h>
#include <sys/types.h>

enum subscription_result { SUBSCRIPTION_STARTED, SUBSCRIPTION_EXISTED, SUBSCRIPTION_FAILED };

/* Creates the pipe `pipe_name` in the client directory `dir_path` and forks the process
 * that serves it, forwarding what arrives to `sock`; *pid gets its pid when STARTED.
 * A pipe that already exists means the client already holds this subscription. The pipe
 * has a reader before this returns, so a PUBLISH right after the SUBACK reaches it. */
enum subscription_result subscription_start(int sock, const char *dir_path,
                                            const char *pipe_name, pid_t *pid);

#endif
