/* The engine's preallocated storage: event tables (struct of arrays), interned topic
 * names, and a set of 64-bit keys (which messages a subscriber already holds). */
#ifndef MQE_TABLES_H
#define MQE_TABLES_H

#include <stddef.h>
#include <stdint.h>

#define MQE_MAX_COLUMNS 16

typedef struct {
    uint32_t rows, capacity, columns;
    uint8_t width[MQE_MAX_COLUMNS];
    void *column[MQE_MAX_COLUMNS];
} mqe_table;

int mqe_table_init(mqe_table *t, uint32_t capacity, const uint8_t *widths, uint32_t columns);
void mqe_table_free(mqe_table *t);
/* Pointers to the columns' typed arrays, by row. */
#define MQE_I64(t, c) ((int64_t *)(t)->column[c])
#define MQE_I32(t, c) ((int32_t *)(t)->column[c])
#define MQE_U8(t, c) ((uint8_t *)(t)->column[c])

typedef struct {
    char **names;
    uint32_t *lengths;
    uint32_t count, capacity;
    uint32_t *slots;          /* open addressing: index + 1, 0 empty */
    uint32_t slot_mask;
} mqe_topics_table;

int mqe_topics_init(mqe_topics_table *t);
void mqe_topics_free(mqe_topics_table *t);
/* The index of this name, added if new; -1 when out of memory. */
int64_t mqe_intern(mqe_topics_table *t, const char *name, size_t len);

typedef struct {
    uint64_t *slots;          /* key + 1, 0 empty */
    uint64_t count, mask;
} mqe_key_set;

/* 1 if the key was new, 0 if held already, -1 out of memory. */
int mqe_set_add(mqe_key_set *s, uint64_t key);
void mqe_set_free(mqe_key_set *s);

#endif
