/* test_hash.h -- a deterministic test value in [-1, 1] from three integers (a hash, so that the
 * data of a test does not depend on the code under test). */
#ifndef GVQ_TEST_HASH_H_
#define GVQ_TEST_HASH_H_

#include <stdint.h>

static inline float test_hash_value(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t h = a * 2654435761u ^ (b + 0x9e3779b9u) * 40503u ^ (c + 7u) * 2246822519u;
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    return (float)(h % 2001u) / 1000.0f - 1.0f;
}

#endif /* GVQ_TEST_HASH_H_ */
