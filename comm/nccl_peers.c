/* Which ranks NCCL refuses to put in one communicator, decided as NCCL decides it.
 * Read from NCCL's sources (github.com/NVIDIA/nccl, v2.18 to v2.29.7, the toolkit's 2.28.9):
 * - src/init.cc, initTransportsRank, after the first allgather of peer infos: "if ((i !=
 *   rank) && (peerInfo[i].hostHash == peerInfo[rank].hostHash) && (peerInfo[i].busId ==
 *   peerInfo[rank].busId))" -> WARN "Duplicate GPU detected : rank %d and rank %d both on
 *   CUDA device %lx", ncclInvalidUsage. Only the ranks involved return; the others go on
 *   into the next bootstrap collective and wait for them, so the transport must not call
 *   ncclCommInitRank at all when any pair collides.
 * - src/misc/utils.cc, getHostHashOnce: the hash of getHostName(..., '\0') (the WHOLE
 *   hostname: the delimiter is '\0', not '.', so "n1.a" and "n1.b" are two hosts) followed
 *   by fscanf("%ms") of /proc/sys/kernel/random/boot_id; NCCL_HOSTID, when set, replaces
 *   the whole string (ncclGetEnv: the environment, then NCCL_CONF_FILE or ~/.nccl.conf,
 *   then /etc/nccl.conf, src/misc/param.cc). peerInfo.hostHash adds the communicator's
 *   hash, the same on every rank. busId is busIdToInt64 of cudaDeviceGetPCIBusId.
 * - NCCL 2.30 replaced the refusal by ncclCheckMultiRank (src/graph/topo.cc): the same
 *   pairs, refused unless NCCL_MULTI_RANK_GPU_ENABLE=1; starpipe keeps them on the host
 *   transport either way.
 * We compare the host strings themselves rather than NCCL's 64-bit hash of them. */
#include "comm/nccl_peers.h"

#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void sp_nccl_host_key(const char *hostname, const char *boot_id, const char *hostid, char *key,
                      size_t len)
{
    if (!len)
        return;
    if (hostid) {
        snprintf(key, len, "%s", hostid);
        return;
    }
    const char *b = boot_id ? boot_id : "";
    while (*b == ' ' || *b == '\t' || *b == '\n' || *b == '\r' || *b == '\v' || *b == '\f') b++;
    size_t w = strcspn(b, " \t\n\r\v\f"); /* fscanf's %ms: one word */
    /* a key cut short only makes two hosts look alike: NCCL stays off, never wrongly on */
    if (snprintf(key, len, "%s%.*s", hostname ? hostname : "", (int)w, b) >= (int)len)
        key[len - 1] = '\0';
}

int64_t sp_nccl_bus_number(const char *bus)
{
    char hex[17];
    int n = 0;
    for (const char *c = bus; c && *c && n < 16; c++) {
        if (*c == ':' || *c == '.')
            continue;
        if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f') || (*c >= 'A' && *c <= 'F')))
            break;
        hex[n++] = *c;
    }
    hex[n] = '\0';
    return (int64_t)strtoll(hex, NULL, 16);
}

int sp_nccl_duplicate(const sp_nccl_peer *peer, int n, int *a, int *b)
{
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (strcmp(peer[i].key, peer[j].key) == 0 &&
                sp_nccl_bus_number(peer[i].bus) == sp_nccl_bus_number(peer[j].bus)) {
                *a = i, *b = j;
                return 1;
            }
    return 0;
}

int sp_nccl_conf_value(const char *path, const char *name, char *out, size_t len)
{
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f)
        return 0;
    char *line = NULL;
    size_t cap = 0, k = strlen(name);
    ssize_t got;
    int found = 0;
    /* NCCL sets each line's variable without overwriting: the first line wins */
    while (!found && (got = getline(&line, &cap, f)) != -1) {
        if (line[0] == '#')
            continue;
        if (got && line[got - 1] == '\n')
            line[got - 1] = '\0';
        if (strncmp(line, name, k) == 0 && line[k] == '=') {
            snprintf(out, len, "%.1023s", line + k + 1);
            found = 1;
        }
    }
    free(line);
    fclose(f);
    return found;
}

/* NCCL_HOSTID where NCCL finds it: the environment wins over its files (setenv without
 * overwriting), the user's file over /etc/nccl.conf. NCCL_HOSTID and NCCL_CONF_FILE are
 * NCCL's own variables, read here as NCCL reads them (not STARPIPE_* options). */
static const char *host_id(char *buf, size_t len)
{
    const char *v = getenv("NCCL_HOSTID");
    if (v)
        return v;
    char path[1024];
    const char *user = getenv("NCCL_CONF_FILE");
    if (user && *user) {
        snprintf(path, sizeof path, "%s", user);
    } else {
        const struct passwd *pw = getpwuid(getuid());
        snprintf(path, sizeof path, "%s/.nccl.conf", pw ? pw->pw_dir : "");
        if (!pw)
            path[0] = '\0';
    }
    if (path[0] && sp_nccl_conf_value(path, "NCCL_HOSTID", buf, len))
        return buf;
    if (sp_nccl_conf_value("/etc/nccl.conf", "NCCL_HOSTID", buf, len))
        return buf;
    return NULL;
}

void sp_nccl_peer_local(const char *bus, sp_nccl_peer *out)
{
    memset(out, 0, sizeof *out);
    char name[SP_NCCL_HOST_KEY], boot[128] = "", idbuf[SP_NCCL_HOST_KEY];
    if (gethostname(name, sizeof name) != 0)
        snprintf(name, sizeof name, "unknown"); /* what NCCL falls back to */
    name[sizeof name - 1] = '\0';
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f))
            boot[0] = '\0';
        fclose(f);
    }
    const char *id = host_id(idbuf, sizeof idbuf);
    sp_nccl_host_key(name, boot, id, out->key, sizeof out->key);
    snprintf(out->host, sizeof out->host, "%.*s", (int)sizeof out->host - 1, id ? id : name);
    snprintf(out->bus, sizeof out->bus, "%s", bus ? bus : "");
}
