/* The engine's preallocated storage (see tables.h). */
#include "tables.h"

#include <stdlib.h>
#include <string.h>

int mqe_table_init(mqe_table *t, uint32_t capacity, const uint8_t *widths, uint32_t columns) {
    memset(t, 0, sizeof *t);
    t->capacity = capacity;
    t->columns = columns;
    for (uint32_t c = 0; c < columns; c++) {
        t->width[c] = widths[c];
        t->column[c] = calloc(capacity, widths[c]);
        if (t->column[c] == NULL)
            return -1;
    }
    return 0;
}

void mqe_table_free(mqe_table *t) {
    for (uint32_t c = 0; c < t->columns; c++)
        free(t->column[c]);
    memset(t, 0, sizeof *t);
}

static uint32_t fnv1a(const char *data, size_t len) {
    uint32_t hash = 2166136261u;
    for (size_t i = 0; i < len; i++)
        hash = (hash ^ (uint8_t)data[i]) * 16777619u;
    return hash;
}

int mqe_topics_init(mqe_topics_table *t) {
    memset(t, 0, sizeof *t);
    t->slot_mask = 255;
    t->slots = calloc(t->slot_mask + 1, sizeof *t->slots);
    return t->slots ? 0 : -1;
}

void mqe_topics_free(mqe_topics_table *t) {
    for (uint32_t i = 0; i < t->count; i++)
        free(t->names[i]);
    free(t->names);
    free(t->lengths);
    free(t->slots);
    memset(t, 0, sizeof *t);
}

static int topics_grow_slots(mqe_topics_table *t) {
    uint32_t mask = t->slot_mask * 2 + 1;
    uint32_t *slots = calloc((size_t)mask + 1, sizeof *slots);
    if (slots == NULL)
        return -1;
    for (uint32_t i = 0; i < t->count; i++) {
        uint32_t at = fnv1a(t->names[i], t->lengths[i]) & mask;
        while (slots[at])
            at = (at + 1) & mask;
        slots[at] = i + 1;
    }
    free(t->slots);
    t->slots = slots;
    t->slot_mask = mask;
    return 0;
}

int64_t mqe_intern(mqe_topics_table *t, const char *name, size_t len) {
    uint32_t at = fnv1a(name, len) & t->slot_mask;
    for (; t->slots[at]; at = (at + 1) & t->slot_mask) {
        uint32_t i = t->slots[at] - 1;
        if (t->lengths[i] == len && memcmp(t->names[i], name, len) == 0)
            return i;
    }
    if (t->count == t->capacity) {
        uint32_t capacity = t->capacity ? t->capacity * 2 : 64;
        char **names = realloc(t->names, capacity * sizeof *names);
        if (names == NULL)
            return -1;
        t->names = names;
        uint32_t *lengths = realloc(t->lengths, capacity * sizeof *lengths);
        if (lengths == NULL)
            return -1;
        t->lengths = lengths;
        t->capacity = capacity;
    }
    char *copy = malloc(len + 1);
    if (copy == NULL)
        return -1;
    memcpy(copy, name, len);
    copy[len] = '\0';
    uint32_t index = t->count++;
    t->names[index] = copy;
    t->lengths[index] = (uint32_t)len;
    t->slots[at] = index + 1;
    if (t->count * 2 > t->slot_mask && topics_grow_slots(t) != 0)
        return -1;
    return index;
}

static uint64_t mix(uint64_t key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return key;
}

static int set_grow(mqe_key_set *s) {
    uint64_t mask = s->mask ? s->mask * 2 + 1 : 1023;
    uint64_t *slots = calloc(mask + 1, sizeof *slots);
    if (slots == NULL)
        return -1;
    for (uint64_t i = 0; s->slots && i <= s->mask; i++) {
        if (!s->slots[i])
            continue;
        uint64_t at = mix(s->slots[i] - 1) & mask;
        while (slots[at])
            at = (at + 1) & mask;
        slots[at] = s->slots[i];
    }
    free(s->slots);
    s->slots = slots;
    s->mask = mask;
    return 0;
}

int mqe_set_add(mqe_key_set *s, uint64_t key) {
    if ((s->count + 1) * 2 > s->mask + 1 && set_grow(s) != 0)
        return -1;
    uint64_t at = mix(key) & s->mask;
    for (; s->slots[at]; at = (at + 1) & s->mask)
        if (s->slots[at] == key + 1)
            return 0;
    s->slots[at] = key + 1;
    s->count++;
    return 1;
}

void mqe_set_free(mqe_key_set *s) {
    free(s->slots);
    memset(s, 0, sizeof *s);
}
