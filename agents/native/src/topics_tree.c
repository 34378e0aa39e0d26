/* A publisher's topic per message over a tree of topics (workload.topic_tree).
 *
 * Message k of a publisher goes to the tree's topic (first + k) mod fanout^levels, named
 * {root}/{a}/{b}/... (decimal levels, the last fastest: campaigns.shapes.tree_topic). The
 * tree's names are interned once, when the first publisher of that tree is set up, and
 * shared by every publisher of the same (root, levels, fanout): a message's PUBLISH is
 * written straight into the client's output and its topic index is one array load, so
 * the per-message cost does not grow with the number of topics, and nothing is allocated
 * per message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

struct mqe_tree {
    char *name;                 /* root, then room for the levels: the name being built */
    size_t root_len, name_cap;
    uint32_t levels, fanout;
    uint64_t count;             /* fanout ** levels */
    int32_t *index;             /* tree topic -> the engine's topic table */
};

static size_t decimal_digits(uint32_t value) {
    size_t n = 1;
    while (value >= 10) {
        value /= 10;
        n++;
    }
    return n;
}

/* Topic i's name in tree->name; its length. */
static size_t tree_name(struct mqe_tree *t, uint64_t i) {
    char levels[8 * 11];        /* at most 8 levels of "/" and 10 digits */
    size_t at = sizeof levels;
    for (uint32_t l = 0; l < t->levels; l++) {
        uint32_t digit = (uint32_t)(i % t->fanout);
        i /= t->fanout;
        do {
            levels[--at] = (char)('0' + digit % 10);
            digit /= 10;
        } while (digit);
        levels[--at] = '/';
    }
    memcpy(t->name + t->root_len, levels + at, sizeof levels - at);
    return t->root_len + sizeof levels - at;
}

static void tree_free(struct mqe_tree *t) {
    if (t == NULL)
        return;
    free(t->name);
    free(t->index);
    free(t);
}

static struct mqe_tree *tree_make(mqe_engine *e, const char *root, size_t root_len,
                                  uint32_t levels, uint32_t fanout, uint64_t count) {
    struct mqe_tree *t = calloc(1, sizeof *t);
    if (t == NULL)
        return NULL;
    t->root_len = root_len;
    t->levels = levels;
    t->fanout = fanout;
    t->count = count;
    t->name_cap = root_len + levels * (1 + decimal_digits(fanout - 1));
    t->name = malloc(t->name_cap + 1);
    t->index = malloc(count * sizeof *t->index);
    if (t->name == NULL || t->index == NULL) {
        tree_free(t);
        return NULL;
    }
    memcpy(t->name, root, root_len);
    for (uint64_t i = 0; i < count; i++) {
        int64_t interned = mqe_intern(&e->topics, t->name, tree_name(t, i));
        if (interned < 0) {
            tree_free(t);
            return NULL;
        }
        t->index[i] = (int32_t)interned;
    }
    return t;
}

int mqe_set_topic_tree(mqe_engine *e, int client, uint32_t levels, uint32_t fanout,
                       uint64_t first) {
    if (client < 0 || (size_t)client >= e->n_clients) {
        snprintf(e->error, sizeof e->error, "no client %d", client);
        return -1;
    }
    mqe_client *c = &e->clients[client];
    if (c->role != 0 || c->sn || c->fd >= 0) {
        snprintf(e->error, sizeof e->error, "client %s: a topic tree is for an mqtt-tcp or "
                 "mqtt-udp publisher, before it connects", c->client_id);
        return -1;
    }
    uint64_t count = 1;
    for (uint32_t l = 0; l < levels && count <= MQE_TREE_MAX_TOPICS; l++)
        count *= fanout;
    if (levels < 1 || levels > 8 || fanout < 1 || count > MQE_TREE_MAX_TOPICS) {
        snprintf(e->error, sizeof e->error, "client %s: a tree of %u levels of fanout %u "
                 "is not 1..8 levels of 1..%d topics at most", c->client_id, levels, fanout,
                 MQE_TREE_MAX_TOPICS);
        return -1;
    }
    struct mqe_tree *tree = NULL;
    for (size_t i = 0; i < e->n_trees && tree == NULL; i++) {
        struct mqe_tree *t = e->trees[i];
        if (t->levels == levels && t->fanout == fanout && t->root_len == c->topic_len
            && memcmp(t->name, c->topic, c->topic_len) == 0)
            tree = t;
    }
    if (tree == NULL) {
        struct mqe_tree **trees = realloc(e->trees, (e->n_trees + 1) * sizeof *trees);
        if (trees == NULL) {
            snprintf(e->error, sizeof e->error, "out of memory for a topic tree");
            return -1;
        }
        e->trees = trees;
        tree = tree_make(e, c->topic, c->topic_len, levels, fanout, count);
        if (tree == NULL) {
            snprintf(e->error, sizeof e->error, "out of memory for a tree of %llu topics",
                     (unsigned long long)count);
            return -1;
        }
        e->trees[e->n_trees++] = tree;
    }
    c->tree = tree;
    c->tree_first = first % count;
    return 0;
}

size_t mqe_tree_prefix_max(const mqe_client *c) {
    /* fixed header, remaining length, topic length, the longest name, packet id, MQTT 5's
     * property length */
    return 1 + 4 + 2 + c->tree->name_cap + 2 + 1;
}

size_t mqe_tree_prefix(mqe_client *c, int64_t k, uint8_t *to, size_t *packet_id_at,
                       int32_t *topic_index) {
    struct mqe_tree *t = c->tree;
    uint64_t i = (c->tree_first + (uint64_t)k) % t->count;
    size_t payload = c->payload_bytes > MQE_PAYLOAD_MIN ? (size_t)c->payload_bytes
                                                         : MQE_PAYLOAD_MIN;
    *topic_index = t->index[i];
    return mqe_publish_prefix(to, t->name, tree_name(t, i), c->qos, payload, mqe_level(c),
                              packet_id_at);
}

void mqe_trees_free(mqe_engine *e) {
    for (size_t i = 0; i < e->n_trees; i++)
        tree_free(e->trees[i]);
    free(e->trees);
    e->trees = NULL;
    e->n_trees = 0;
}
