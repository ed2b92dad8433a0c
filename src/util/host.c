/*
 * host.c -- this process's host key (gvq_util.h): FNV-1a of the host name, mixed with the
 * network namespace's inode.
 */
#define _GNU_SOURCE
#include <sys/stat.h>
#include <unistd.h>

#include "gvq_util.h"

uint64_t gvq_host_key(void) {
    char name[256] = "";
    gethostname(name, sizeof name - 1);
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = name; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    struct stat sb;
    if (stat("/proc/self/ns/net", &sb) == 0)
        h = (h ^ (uint64_t)sb.st_ino) * 0x100000001b3ull, h ^= (uint64_t)sb.st_dev << 17;
    return h;
}
