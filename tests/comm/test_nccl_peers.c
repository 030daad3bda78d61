/* NCCL's refusal of two ranks on one GPU, decided as NCCL decides it (comm/nccl_peers.c):
 * the same host string and the same bus id refuse, two hosts with identical bus ids (every
 * multi-node job of identical nodes) do not; NCCL_HOSTID replaces the host string; the
 * whole hostname counts, not its part before the first '.'; bus ids compare as NCCL's
 * numbers. Then this process's own identity and NCCL's configuration files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/nccl_peers.h"
#include "tests/check.h"

static const char *BOOT_A = "5b1c2f0e-8a7d-4e9b-9c3a-0d4e5f6a7b8c\n";
static const char *BOOT_B = "0f9e8d7c-6b5a-4948-8776-655443322110\n";

static sp_nccl_peer peer(const char *hostname, const char *boot, const char *hostid,
                         const char *bus)
{
    sp_nccl_peer p;
    memset(&p, 0, sizeof p);
    sp_nccl_host_key(hostname, boot, hostid, p.key, sizeof p.key);
    snprintf(p.host, sizeof p.host, "%s", hostid ? hostid : hostname);
    snprintf(p.bus, sizeof p.bus, "%s", bus);
    return p;
}

static int collide(const sp_nccl_peer *p, int n, int *a, int *b)
{
    *a = *b = -1;
    return sp_nccl_duplicate(p, n, a, b);
}

static void host_keys(void)
{
    char k[SP_NCCL_HOST_KEY];
    sp_nccl_host_key("node1", BOOT_A, NULL, k, sizeof k);
    CHECK(!strcmp(k, "node15b1c2f0e-8a7d-4e9b-9c3a-0d4e5f6a7b8c"), "hostname + boot_id: '%s'", k);
    sp_nccl_host_key("node1.cluster.example", "  " "abc def\n", NULL, k, sizeof k);
    CHECK(!strcmp(k, "node1.cluster.exampleabc"), "the whole name, boot_id's first word: '%s'",
          k);
    sp_nccl_host_key("node1", NULL, NULL, k, sizeof k);
    CHECK(!strcmp(k, "node1"), "no boot_id: the hostname alone: '%s'", k);
    sp_nccl_host_key("node1", BOOT_A, "hostA", k, sizeof k);
    CHECK(!strcmp(k, "hostA"), "NCCL_HOSTID replaces it all: '%s'", k);
    sp_nccl_host_key("node1", BOOT_A, "", k, sizeof k);
    CHECK(!strcmp(k, ""), "an empty NCCL_HOSTID is still set: '%s'", k);
    char small[6];
    sp_nccl_host_key("node1", BOOT_A, NULL, small, sizeof small);
    CHECK(!strcmp(small, "node1"), "cut to its buffer: '%s'", small);
}

static void bus_numbers(void)
{
    CHECK(sp_nccl_bus_number("0000:fa:01.0") == 0xfa010, "0000:fa:01.0");
    CHECK(sp_nccl_bus_number("00000000:FA:01.0") == sp_nccl_bus_number("0000:fa:01.0"),
          "domain width and case do not matter");
    CHECK(sp_nccl_bus_number("0000:3b:00.0") != sp_nccl_bus_number("0000:3c:00.0"),
          "two GPUs of a node differ");
    CHECK(sp_nccl_bus_number("00fa:01:00.0") == 0xfa01000, "the fake device's bus id");
}

static void decisions(void)
{
    int a, b;
    /* one node, one GPU, two ranks: refused, and named */
    sp_nccl_peer one[] = { peer("node1", BOOT_A, NULL, "0000:fa:01.0"),
                           peer("node1", BOOT_A, NULL, "0000:FA:01.0") };
    CHECK(collide(one, 2, &a, &b) == 1 && a == 0 && b == 1, "same host, same GPU accepted");

    /* two identical nodes, 8 GPUs each, bus ids the same on both: accepted */
    const char *buses[] = { "0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
                            "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0" };
    sp_nccl_peer nodes[16];
    for (int r = 0; r < 16; r++)
        nodes[r] = peer(r < 8 ? "dgx01" : "dgx02", r < 8 ? BOOT_A : BOOT_B, NULL, buses[r % 8]);
    CHECK(collide(nodes, 16, &a, &b) == 0, "two nodes with the same bus ids refused: %d %d", a,
          b);
    /* the same, one rank of node 2 on its neighbour's GPU: that pair */
    nodes[13] = peer("dgx02", BOOT_B, NULL, buses[4]);
    CHECK(collide(nodes, 16, &a, &b) == 1 && a == 12 && b == 13, "ranks %d and %d", a, b);

    /* one host name, two boots (a container image cloned onto two machines with the same
     * hostname): NCCL's boot_id tells them apart */
    sp_nccl_peer clones[] = { peer("worker", BOOT_A, NULL, "0000:fa:01.0"),
                              peer("worker", BOOT_B, NULL, "0000:fa:01.0") };
    CHECK(collide(clones, 2, &a, &b) == 0, "two boots of one hostname refused");

    /* NCCL uses the whole hostname: names that differ only after the first '.' are two
     * hosts to NCCL (getHostName(..., '\0')), so it accepts them */
    sp_nccl_peer dotted[] = { peer("node1.rack1", BOOT_A, NULL, "0000:fa:01.0"),
                              peer("node1.rack2", BOOT_A, NULL, "0000:fa:01.0") };
    CHECK(collide(dotted, 2, &a, &b) == 0, "hostnames differing after the '.' refused");

    /* NCCL_HOSTID overrides: two processes of one machine as two hosts (the fake-GPU test),
     * or two machines declared one host */
    sp_nccl_peer two[] = { peer("node1", BOOT_A, "hostA", "00fa:01:00.0"),
                           peer("node1", BOOT_A, "hostB", "00fa:01:00.0") };
    CHECK(collide(two, 2, &a, &b) == 0, "NCCL_HOSTID=hostA and hostB refused");
    sp_nccl_peer same[] = { peer("node1", BOOT_A, "rack", "0000:fa:01.0"),
                            peer("node2", BOOT_B, "rack", "0000:fa:01.0") };
    CHECK(collide(same, 2, &a, &b) == 1 && a == 0 && b == 1, "one NCCL_HOSTID on two machines");
    /* NCCL_HOSTID on one rank only: its string is the id, the other's name + boot */
    sp_nccl_peer half[] = { peer("node1", BOOT_A, NULL, "0000:fa:01.0"),
                            peer("node1", BOOT_A, "node1", "0000:fa:01.0") };
    CHECK(collide(half, 2, &a, &b) == 0, "an id equal to the hostname is not name + boot");

    CHECK(collide(one, 1, &a, &b) == 0 && collide(one, 0, &a, &b) == 0, "one rank refused");
    /* the first pair in rank order, as every rank reports the same one */
    sp_nccl_peer three[] = { peer("n", BOOT_A, NULL, "0000:01:00.0"),
                             peer("n", BOOT_A, NULL, "0000:02:00.0"),
                             peer("n", BOOT_A, NULL, "0000:02:00.0"),
                             peer("n", BOOT_A, NULL, "0000:01:00.0") };
    CHECK(collide(three, 4, &a, &b) == 1 && a == 0 && b == 3, "first pair: %d %d", a, b);
}

static void conf_files(void)
{
    char path[] = "/tmp/starpipe-nccl-conf.XXXXXX", v[SP_NCCL_HOST_KEY];
    int fd = mkstemp(path);
    REQUIRE(fd >= 0, "mkstemp");
    FILE *f = fdopen(fd, "w");
    fputs("# NCCL_HOSTID=commented\nNCCL_HOSTID_X=no\nNCCL_DEBUG=WARN\nNCCL_HOSTID=rack 7\n"
          "NCCL_HOSTID=second\n", f);
    fclose(f);
    CHECK(sp_nccl_conf_value(path, "NCCL_HOSTID", v, sizeof v) == 1 && !strcmp(v, "rack 7"),
          "the first uncommented line, its value as written: '%s'", v);
    CHECK(sp_nccl_conf_value(path, "NCCL_IB_HCA", v, sizeof v) == 0, "an absent name found");
    CHECK(sp_nccl_conf_value("/nonexistent/nccl.conf", "NCCL_HOSTID", v, sizeof v) == 0,
          "no file");

    /* this process: the environment first, then NCCL_CONF_FILE */
    sp_nccl_peer p;
    setenv("NCCL_CONF_FILE", path, 1);
    unsetenv("NCCL_HOSTID");
    sp_nccl_peer_local("0000:fa:01.0", &p);
    CHECK(!strcmp(p.key, "rack 7") && !strcmp(p.host, "rack 7") && !strcmp(p.bus, "0000:fa:01.0"),
          "NCCL_CONF_FILE's NCCL_HOSTID: '%s' '%s'", p.key, p.host);
    setenv("NCCL_HOSTID", "hostA", 1);
    sp_nccl_peer_local("0000:fa:01.0", &p);
    CHECK(!strcmp(p.key, "hostA") && !strcmp(p.host, "hostA"), "NCCL_HOSTID: '%s'", p.key);
    unsetenv("NCCL_HOSTID");
    setenv("NCCL_CONF_FILE", "/nonexistent/nccl.conf", 1);
    sp_nccl_peer_local("0000:fa:01.0", &p);
    char name[256] = "";
    gethostname(name, sizeof name);
    CHECK(!strncmp(p.key, name, strlen(name)) && !strcmp(p.host, name),
          "hostname first: '%s' for '%s'", p.key, name);
    FILE *b = fopen("/proc/sys/kernel/random/boot_id", "r");
    char boot[128] = "";
    if (b && fgets(boot, sizeof boot, b)) {
        boot[strcspn(boot, "\n")] = '\0';
        CHECK(!strcmp(p.key + strlen(name), boot), "then boot_id: '%s'", p.key);
    }
    if (b)
        fclose(b);
    unsetenv("NCCL_CONF_FILE");
    remove(path);
}

int main(void)
{
    host_keys();
    bus_numbers();
    decisions();
    conf_files();
    return check_summary("test_nccl_peers");
}
